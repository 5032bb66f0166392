//! Terms for tests of a workload: a real term of a real election, on a private in-memory
//! store, without writing the election around it.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{ElectionConfig, ElectionError, LeaderElector, Term};
use crate::Locker;
use crate::backend::memory::MemoryBackend;

/// A term won on a private [`MemoryBackend`], for unit tests of code that takes a [`Term`].
///
/// It is a real term, served by a [`LeaderElector`] in a background task: renewals, the
/// cancellation, [`Term::spawn`]'s tasks and the release behave as in production. Steal the
/// lease through [`store`](Self::store) ([`MemoryBackend::steal`]) to test a split brain:
/// the term learns it at its next renewal (a third of the lease duration on), cancels, and
/// [`end`](Self::end) then reports [`ElectionError::Lost`]. With tokio's paused clock
/// (`#[tokio::test(start_paused = true)]`) those seconds pass at once.
///
/// Dropping it ends the term too, releasing the lease in the background.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tenure::election::{TestTerm, Term};
///
/// /// The code under test: writes until its term ends, stamping the token.
/// async fn report(term: Term, out: tokio::sync::mpsc::UnboundedSender<u64>) {
///     while term.is_valid() {
///         let _ = out.send(term.fencing_token().get());
///         tokio::select! {
///             () = term.cancellation().cancelled() => break,
///             () = tokio::time::sleep(Duration::from_secs(2)) => {}
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), tenure::election::ElectionError> {
/// let test = TestTerm::begin("reports", "pod-a").await?;
/// let (out, mut written) = tokio::sync::mpsc::unbounded_channel();
/// let work = tokio::spawn(report(test.term(), out));
/// tokio::time::sleep(Duration::from_millis(2500)).await;
/// // Another replica takes the lease behind this one's back.
/// test.store().steal("reports", "pod-b", Duration::from_secs(15));
/// work.await.expect("the workload stops once its renewal finds the lease gone");
/// assert!(matches!(test.end().await, Err(tenure::election::ElectionError::Lost { .. })));
/// let mut writes = 0;
/// while written.try_recv().is_ok() {
///     writes += 1;
/// }
/// assert_eq!(writes, 3, "at 0, 2 and 4 s: the renewal at 5 s found the lease gone");
/// # Ok(()) }
/// ```
pub struct TestTerm {
    term: Term,
    store: MemoryBackend,
    end: Option<oneshot::Sender<()>>,
    run: JoinHandle<Result<Option<()>, ElectionError>>,
}

impl std::fmt::Debug for TestTerm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestTerm")
            .field("term", &self.term)
            .finish_non_exhaustive()
    }
}

impl TestTerm {
    /// Wins a term of the lease `name` as `identity`, with the default durations
    /// ([`ElectionConfig::new`]).
    ///
    /// # Errors
    ///
    /// [`ElectionError::Lock`] for an invalid name or identity.
    pub async fn begin(name: &str, identity: &str) -> Result<Self, ElectionError> {
        Self::begin_with(name, identity, ElectionConfig::new()).await
    }

    /// Wins a term of the lease `name` as `identity`, with `config`'s durations (its
    /// `rejoin` is ignored: the test term is one term).
    ///
    /// # Errors
    ///
    /// [`ElectionError::Lock`] for an invalid name or identity,
    /// [`ElectionError::InvalidConfig`] for durations that break a rule.
    pub async fn begin_with(
        name: &str,
        identity: &str,
        config: ElectionConfig,
    ) -> Result<Self, ElectionError> {
        let store = MemoryBackend::new();
        let locker = Locker::with_identity(store.clone(), identity)?;
        let elector = LeaderElector::new(locker, name, config.rejoin(false))?;
        let (begun, term) = oneshot::channel();
        let (end, ended) = oneshot::channel::<()>();
        let run = tokio::spawn(async move {
            let mut begun = Some(begun);
            elector
                .run_until(
                    async {
                        let _ = ended.await;
                    },
                    move |term| {
                        if let Some(begun) = begun.take() {
                            let _ = begun.send(term.clone());
                        }
                        async move { term.cancellation().cancelled().await }
                    },
                )
                .await
        });
        let term = match tokio::time::timeout(Duration::from_secs(60), term).await {
            Ok(Ok(term)) => term,
            // The run ended before its first term: its error says why.
            _ => {
                run.abort();
                return Err(match run.await {
                    Ok(Err(e)) => e,
                    _ => ElectionError::Internal {
                        message: "the test term's election ended without a term".into(),
                    },
                });
            }
        };
        Ok(Self {
            term,
            store,
            end: Some(end),
            run,
        })
    }

    /// The term, to hand to the code under test (clones share it).
    #[must_use]
    pub fn term(&self) -> Term {
        self.term.clone()
    }

    /// The private store the term's lease lives in: [`steal`](MemoryBackend::steal) from it,
    /// or [`inspect`](crate::Backend::inspect) the lease.
    #[must_use]
    pub fn store(&self) -> &MemoryBackend {
        &self.store
    }

    /// Ends the term as a shutdown would: the cancellation fires, the term's tasks are
    /// aborted and awaited, the lease is released.
    ///
    /// # Errors
    ///
    /// [`ElectionError::Lost`] if the term had been lost before (the lease stolen, say).
    pub async fn end(mut self) -> Result<(), ElectionError> {
        if let Some(end) = self.end.take() {
            let _ = end.send(());
        }
        match (&mut self.run).await {
            Ok(result) => result.map(|_| ()),
            Err(e) => Err(ElectionError::Internal {
                message: format!("the test term's election task failed: {e}"),
            }),
        }
    }
}

impl Drop for TestTerm {
    fn drop(&mut self) {
        // After `end` the run is over already; otherwise dropping `run_until` releases the
        // lease in the background.
        self.run.abort();
    }
}
