//! One replica of an operator: parts that run on every replica (webhooks, metrics, status
//! readers) beside the part that runs only while leading, with one shutdown for all.

use std::future::Future;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::ReplicaError;
use crate::election::{LeaderElector, Term};

/// What an always-on part returns when it fails.
pub type PartError = Box<dyn std::error::Error + Send + Sync + 'static>;

type Part = (String, BoxFuture<'static, Result<(), PartError>>);

/// The always-on parts and the leader-only part of one replica, sharing one shutdown.
///
/// [`always`](Self::always) parts start when [`run_until`](Self::run_until) does, on every
/// replica, leader or not, and keep running across hand-offs. The leader-only part is the
/// elector's workload. On shutdown, leadership goes first — the term is cancelled, its
/// workload stops, the lease is released so a follower takes over — and only then are the
/// always-on parts told to stop (their token fires), so they keep serving through the
/// hand-off. If an always-on part fails, the replica shuts down the same way and reports it.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tenure::backend::memory::MemoryBackend;
/// use tenure::controller::Replica;
/// use tenure::election::{ElectionConfig, LeaderElector};
/// use tenure::Locker;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let elector = LeaderElector::new(
///     Locker::with_identity(MemoryBackend::new(), "pod-a")?,
///     "my-operator",
///     ElectionConfig::new(),
/// )?;
/// let served = Replica::new(elector)
///     .always("webhooks", |stop| async move {
///         // Serve admission webhooks on every replica until told to stop.
///         stop.cancelled().await;
///         Ok(())
///     })
///     .run_until(tokio::time::sleep(Duration::from_secs(30)), |term| async move {
///         // Reconcile while leading, until the term ends.
///         term.cancellation().cancelled().await;
///     })
///     .await?;
/// // The shutdown cancelled the term; the workload returned its output while stopping.
/// assert_eq!(served, Some(()));
/// # Ok(()) }
/// ```
pub struct Replica {
    elector: LeaderElector,
    parts: Vec<Part>,
    /// Fires once leadership has shut down: the always-on parts' signal to stop.
    stop: CancellationToken,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("elector", &self.elector)
            .field(
                "always",
                &self.parts.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Replica {
    /// A replica that leads with `elector`.
    #[must_use]
    pub fn new(elector: LeaderElector) -> Self {
        Self {
            elector,
            parts: Vec::new(),
            stop: CancellationToken::new(),
        }
    }

    /// Adds a part that runs on every replica for as long as the replica runs. It gets a
    /// token that fires once leadership has shut down; it should return soon after. A part
    /// that returns `Ok` early has simply finished; one that returns `Err` shuts the replica
    /// down and [`run_until`](Self::run_until) reports [`ReplicaError::Part`] with `name`.
    #[must_use]
    pub fn always<F, Fut>(mut self, name: &str, part: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<(), PartError>> + Send + 'static,
    {
        let fut = part(self.stop.clone());
        self.parts.push((name.to_owned(), Box::pin(fut)));
        self
    }

    /// Starts the always-on parts, then campaigns and runs `leading` for each term won (as
    /// [`LeaderElector::run_until`]) until `shutdown` completes, the workload returns, or an
    /// always-on part fails; then stops the parts and waits for them.
    ///
    /// Returns the workload's output if it returned, `None` after a shutdown.
    ///
    /// # Errors
    ///
    /// [`ReplicaError::Election`] as [`LeaderElector::run_until`];
    /// [`ReplicaError::Part`] for the first always-on part that failed (or panicked).
    pub async fn run_until<S, F, Fut, T>(
        self,
        shutdown: S,
        leading: F,
    ) -> Result<Option<T>, ReplicaError>
    where
        S: Future<Output = ()>,
        F: FnMut(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        let failed = CancellationToken::new();
        let mut parts = JoinSet::new();
        let mut names = std::collections::HashMap::new();
        for (name, part) in self.parts {
            let failed = failed.clone();
            let id = parts
                .spawn(async move {
                    let outcome = match std::panic::AssertUnwindSafe(part).catch_unwind().await {
                        Ok(outcome) => outcome,
                        Err(_) => Err("the part panicked".into()),
                    };
                    if outcome.is_err() {
                        failed.cancel();
                    }
                    outcome
                })
                .id();
            names.insert(id, name);
        }
        let led = self
            .elector
            .run_until(
                async {
                    tokio::select! {
                        () = shutdown => {}
                        () = failed.cancelled() => {}
                    }
                },
                leading,
            )
            .await;
        self.stop.cancel();
        let mut first_failure = None;
        while let Some(joined) = parts.join_next_with_id().await {
            let failure = match joined {
                Ok((_, Ok(()))) => None,
                Ok((id, Err(source))) => Some(ReplicaError::Part {
                    name: names.remove(&id).unwrap_or_default(),
                    source,
                }),
                Err(e) => Some(ReplicaError::Part {
                    name: names.remove(&e.id()).unwrap_or_default(),
                    source: format!("panicked: {e}").into(),
                }),
            };
            if first_failure.is_none() {
                first_failure = failure;
            }
        }
        match (led, first_failure) {
            (_, Some(failure)) => Err(failure),
            (Ok(out), None) => Ok(out),
            (Err(e), None) => Err(ReplicaError::Election(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use futures::FutureExt;

    use super::*;
    use crate::Locker;
    use crate::backend::Backend;
    use crate::backend::memory::MemoryBackend;
    use crate::election::ElectionConfig;

    fn replica(store: &MemoryBackend) -> Replica {
        let locker = Locker::with_identity(store.clone(), "a").expect("identity");
        Replica::new(LeaderElector::new(locker, "op", ElectionConfig::new()).expect("config"))
    }

    fn holder(store: &MemoryBackend) -> Option<String> {
        store
            .inspect("op")
            .now_or_never()
            .expect("memory answers at once")
            .expect("memory never fails")
            .map(|r| r.identity)
    }

    #[tokio::test(start_paused = true)]
    async fn always_on_parts_stop_only_after_the_lease_is_released() {
        let store = MemoryBackend::new();
        let seen_at_stop = Arc::new(Mutex::new(None));
        let (seen, s) = (seen_at_stop.clone(), store.clone());
        let out = replica(&store)
            .always("status", move |stop| async move {
                stop.cancelled().await;
                *seen.lock().expect("not poisoned") = Some(holder(&s));
                Ok(())
            })
            .run_until(
                tokio::time::sleep(Duration::from_secs(10)),
                |term| async move {
                    term.cancellation().cancelled().await;
                    "stopped"
                },
            )
            .await
            .expect("ran");
        assert_eq!(out, Some("stopped"));
        assert_eq!(
            *seen_at_stop.lock().expect("not poisoned"),
            Some(None),
            "the part was told to stop once the lease was free"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_or_panicking_part_shuts_the_replica_down_and_is_named() {
        for panics in [false, true] {
            let store = MemoryBackend::new();
            let started = tokio::time::Instant::now();
            let result = replica(&store)
                .always("fine", |stop| async move {
                    stop.cancelled().await;
                    Ok(())
                })
                .always("webhooks", move |_| async move {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    if panics {
                        panic!("webhook bug");
                    }
                    Err("port in use".into())
                })
                .run_until(std::future::pending(), |term| async move {
                    term.cancellation().cancelled().await;
                })
                .await;
            match result {
                Err(ReplicaError::Part { name, source }) => {
                    assert_eq!(name, "webhooks");
                    let expected = if panics { "panicked" } else { "port in use" };
                    assert!(source.to_string().contains(expected), "{source}");
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(holder(&store), None, "leadership was released");
            assert!(started.elapsed() < Duration::from_secs(4), "promptly");
        }
    }
}
