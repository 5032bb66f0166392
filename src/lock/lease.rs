//! The handles of a held lease ([`Lease`], [`LockContext`]): its fencing token, its validity, how it
//! ends, and the RAII release.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::state::LeaseShared;
use super::{LeaseEnd, LockError, Locker, LostReason};
use crate::backend::{FencingToken, Released, Renewed};

/// A lease we hold: the right to act as the only holder of a lock until it ends.
///
/// Obtained from [`Locker::try_acquire`] or [`Locker::acquire`]. With auto-renew on, the
/// locker's renewal scheduler keeps it alive; otherwise it is valid until
/// [`valid_until`](Self::valid_until) unless [`refresh`](Self::refresh)ed.
///
/// # Guarantees
///
/// - [`fencing_token`](Self::fencing_token) is greater than every token issued before for
///   this lock name; pass it to what you write.
/// - While [`is_valid`](Self::is_valid) is true, no other holder can have been granted the
///   lock, assuming the store's clock runs at most `drift_factor` slower than ours.
/// - Cancelling the task that holds the `Lease` does not end it; only
///   [`release`](Self::release), [`orphan`](Self::orphan), dropping it, or losing it does.
///
/// # Caveats
///
/// A lease is not an absolute lock. A process frozen (GC pause, SIGSTOP, VM migration) past
/// its validity can wake up and act before it notices; only the fencing token, checked by the
/// resource you write to, protects against that.
///
/// # Drop
///
/// Dropping a lease that was neither released nor orphaned releases it in the background (on
/// the current tokio runtime), best effort. Prefer [`release`](Self::release), which reports
/// whether exclusivity held to the end.
pub struct Lease {
    shared: Arc<LeaseShared>,
    locker: Locker,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.shared.name)
            .field("fencing", &self.shared.fencing)
            .field("holder", &self.shared.holder)
            .field("end", &self.shared.end_cause())
            .finish()
    }
}

impl Lease {
    pub(crate) fn new(shared: Arc<LeaseShared>, locker: Locker) -> Self {
        Self { shared, locker }
    }

    pub(crate) fn shared(&self) -> &Arc<LeaseShared> {
        &self.shared
    }

    /// The lock's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The fencing token of this term.
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.shared.fencing
    }

    /// Until when, on this process's monotonic clock, the lease is surely ours: the send
    /// instant of the last successful acquire or renewal plus `ttl − drift`.
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// Whether the lease has not ended and its validity has not run out.
    #[must_use]
    pub fn is_valid(&self) -> bool {
        self.shared.is_valid()
    }

    /// Calls `listener` with [`valid_until`](Self::valid_until) at once, and again each time a
    /// renewal moves it later, until the lease ends. For a mirror of the validity that
    /// something outside this process must read the moment it changes — `tenure run`'s
    /// watchdog process reads one from shared memory.
    ///
    /// The listener runs on the renewal scheduler's task while the lease's state is locked,
    /// so no reader of the lease can see a validity the listener has not been given. It must
    /// therefore be quick, must not block, and must not call into this lease (that would
    /// deadlock). A listener that panics is logged; the lease and other listeners go on.
    /// Registered after the lease ended, it is never called.
    pub fn on_renewal(&self, listener: impl Fn(Instant) + Send + Sync + 'static) {
        self.shared.on_renewal(Box::new(listener));
    }

    /// How the lease ended, if it has.
    #[must_use]
    pub fn end(&self) -> Option<LeaseEnd> {
        self.shared.end_cause()
    }

    /// Resolves when the lease ends, with the cause: [`LeaseEnd::Released`],
    /// [`LeaseEnd::Lost`] or [`LeaseEnd::Orphaned`].
    ///
    /// Loss is detected by the renewal scheduler: with auto-renew on when a renewal answers
    /// "not held" or the renew deadline passes; with it off when the validity runs out.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future changes nothing; call again to keep waiting.
    pub async fn lost(&self) -> LeaseEnd {
        self.shared.wait_end().await
    }

    /// Renews the lease now, restarting its ttl.
    ///
    /// # Errors
    ///
    /// [`LockError::NotHeld`] if the store says it is no longer ours (the lease then ends);
    /// [`LockError::Lost`] if it had already ended; [`LockError::Backend`] if the store did not
    /// answer within the request timeout (the lease stays as it was).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a renewal whose answer is dropped only leaves the validity as it was.
    pub async fn refresh(&self) -> Result<(), LockError> {
        let s = &self.shared;
        if let Some(end) = s.end_cause() {
            return Err(ended_error(&s.name, end));
        }
        let sent = Instant::now();
        let backend = &self.locker.inner.backend;
        let answer = tokio::time::timeout(
            s.plan.request_timeout,
            backend.renew(&s.name, &s.holder, s.plan.ttl),
        )
        .await
        .map_err(|_| crate::backend::BackendError::timeout("renewal", s.plan.request_timeout))??;
        match answer {
            Renewed::Held => {
                s.renewed(sent, Instant::now());
                self.locker.inner.scheduler.renewed(s.key, sent);
                Ok(())
            }
            Renewed::NotHeld => {
                s.end(LeaseEnd::Lost(LostReason::NotHeld));
                self.locker.inner.scheduler.remove(s);
                Err(LockError::NotHeld {
                    name: s.name.to_string(),
                })
            }
        }
    }

    /// Gives the lease up: stops renewing, deletes it from the store, and wakes waiters.
    ///
    /// Idempotent: later calls return the first call's result without contacting the store
    /// again. The release runs in its own task, bounded by the release timeout, and completes
    /// even if the caller is cancelled.
    ///
    /// # Errors
    ///
    /// - [`LockError::NotHeld`]: the store says it was no longer ours — whatever ran under it
    ///   may not have been exclusive.
    /// - [`LockError::Lost`]: the lease had been lost before the release (the store entry, if
    ///   any is left, is still deleted).
    /// - [`LockError::Backend`]: the store did not answer; the lease will expire by its ttl.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the release goes on in the background; call again for its result.
    pub async fn release(&self) -> Result<(), LockError> {
        self.release_with(None).await
    }

    /// Gives the lease up like [`release`](Self::release) and names `to` as the preferred
    /// next holder: for `window`, measured by the store, only `to` may take the lease (it is
    /// woken by the release like every waiter); after it, anyone may, so a target that died
    /// leaves an ordinary release behind. The target's term is a new one, with a higher
    /// fencing token. A store that cannot keep a preference
    /// ([`Backend::release_to`](crate::Backend::release_to)) releases plainly.
    ///
    /// Idempotent with [`release`](Self::release): whichever is called first decides.
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release).
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tenure::backend::memory::MemoryBackend;
    /// use tenure::{LockOptions, Locker};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tenure::LockError> {
    /// let store = MemoryBackend::new();
    /// let a = Locker::with_identity(store.clone(), "pod-a")?;
    /// let b = Locker::with_identity(store.clone(), "pod-b")?;
    /// let c = Locker::with_identity(store, "pod-c")?;
    /// let lease = a.try_acquire("report", &LockOptions::new()).await?;
    /// let first = lease.fencing_token();
    /// lease.release_to("pod-b", Duration::from_secs(5)).await?;
    /// // Only pod-b may take it while the window runs.
    /// assert!(c.try_acquire("report", &LockOptions::new()).await.is_err());
    /// let next = b.try_acquire("report", &LockOptions::new()).await?;
    /// assert!(next.fencing_token() > first);
    /// # Ok(()) }
    /// ```
    pub async fn release_to(&self, to: &str, window: Duration) -> Result<(), LockError> {
        self.release_with(Some((Arc::from(to), window))).await
    }

    async fn release_with(&self, to: Option<(Arc<str>, Duration)>) -> Result<(), LockError> {
        if !self.shared.start_release() {
            return self.shared.release_outcome().await;
        }
        // The release runs on the caller's task (no task spawned per release); if the caller
        // stops waiting, `Detach` spawns the rest. Later calls wait for the outcome. Not a
        // `futures::future::Shared`: it wakes the task polling it when the future completes,
        // which costs every release a needless reschedule (a cross-thread wake-up on a
        // multi-threaded runtime; measured with `benches/redis.rs`).
        let work = std::panic::AssertUnwindSafe(release_task(
            self.locker.clone(),
            self.shared.clone(),
            to,
        ))
        .catch_unwind()
        .map(|done| {
            done.unwrap_or_else(|_| {
                Err(LockError::Backend(crate::backend::BackendError::new(
                    crate::backend::BackendErrorKind::Unavailable,
                    "the release panicked",
                )))
            })
        })
        .boxed();
        let mut detach = Detach {
            work: Some(work),
            shared: &self.shared,
            background: &self.locker.inner.background,
        };
        let out = match detach.work.as_mut() {
            Some(work) => work.await,
            // Not reached: set just above. Were it empty, the outcome would still be set.
            None => return self.shared.release_outcome().await,
        };
        detach.work = None;
        self.shared.finish_release(out.clone());
        out
    }

    /// This lease's locker's background work (`Locker::background_settled`), for work that
    /// ends with this lease's drop: the elector's end of a term whose run was dropped.
    pub(crate) fn background(&self) -> Arc<super::background::Pending> {
        self.locker.inner.background.clone()
    }

    /// Stops renewing and leaves the lease to expire by its ttl, without contacting the
    /// store: a hand-off that lets the next holder in after at most one ttl while this
    /// process may still finish in-flight work it has fenced. Dropping an orphaned lease
    /// does not release it.
    pub fn orphan(&self) {
        if self.shared.end(LeaseEnd::Orphaned).is_none() {
            self.locker.inner.scheduler.remove(&self.shared);
        }
    }
}

/// Finishes a release in the background when the future running it is dropped.
struct Detach<'a> {
    work: Option<BoxFuture<'static, Result<(), LockError>>>,
    shared: &'a Arc<LeaseShared>,
    background: &'a Arc<super::background::Pending>,
}

impl Drop for Detach<'_> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        let background = Background {
            work: Some(work),
            shared: self.shared.clone(),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => self.background.spawn(&rt, background.run()),
            // `Background`'s drop gives the waiters an answer.
            Err(_) => drop(background),
        }
    }
}

/// The rest of a detached release. If it is dropped unfinished (its runtime shut down), the
/// waiters get an error rather than wait forever; the lease then expires by its ttl.
struct Background {
    work: Option<BoxFuture<'static, Result<(), LockError>>>,
    shared: Arc<LeaseShared>,
}

impl Background {
    async fn run(mut self) {
        if let Some(work) = self.work.as_mut() {
            let out = work.await;
            self.work = None;
            self.shared.finish_release(out);
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.work.is_some() {
            self.shared
                .finish_release(Err(LockError::Backend(crate::backend::BackendError::new(
                    crate::backend::BackendErrorKind::Unavailable,
                    "the release was abandoned: its runtime shut down before it finished",
                ))));
        }
    }
}

fn ended_error(name: &str, end: LeaseEnd) -> LockError {
    match end {
        LeaseEnd::Lost(reason) => LockError::Lost {
            name: name.to_owned(),
            reason,
        },
        LeaseEnd::Released | LeaseEnd::Orphaned => LockError::NotHeld {
            name: name.to_owned(),
        },
    }
}

/// The release itself: end the lease, stop renewing, delete it from the store.
/// With `to`, the release names the preferred next holder (`Backend::release_to`).
async fn release_task(
    locker: Locker,
    shared: Arc<LeaseShared>,
    to: Option<(Arc<str>, Duration)>,
) -> Result<(), LockError> {
    let earlier = shared.end(LeaseEnd::Released);
    if earlier.is_none() {
        locker.inner.scheduler.remove(&shared);
    }
    if let Some(LeaseEnd::Lost(LostReason::NotHeld)) = earlier {
        // The store already told us it is not ours; there is nothing to delete.
        return Err(ended_error(
            &shared.name,
            LeaseEnd::Lost(LostReason::NotHeld),
        ));
    }
    let timeout = shared.plan.release_timeout;
    let backend = &locker.inner.backend;
    let call = match &to {
        Some((to, window)) => backend.release_to(&shared.name, &shared.holder, to, *window),
        None => backend.release(&shared.name, &shared.holder),
    };
    let answer = super::within(backend.as_ref(), "release", timeout, call).await;
    if let Some(LeaseEnd::Lost(reason)) = earlier {
        return Err(LockError::Lost {
            name: shared.name.to_string(),
            reason,
        });
    }
    match answer {
        Ok(Released::Released) => Ok(()),
        Ok(Released::NotHeld) => Err(LockError::NotHeld {
            name: shared.name.to_string(),
        }),
        Err(e) => Err(LockError::Backend(e)),
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.shared.release_started() {
            return;
        }
        match self.shared.end_cause() {
            Some(LeaseEnd::Orphaned | LeaseEnd::Released | LeaseEnd::Lost(LostReason::NotHeld)) => {
            }
            _ => match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let release = release_task(self.locker.clone(), self.shared.clone(), None);
                    self.locker.inner.background.spawn(&rt, async move {
                        let _ = release.await;
                    });
                }
                Err(_) => {
                    self.shared.end(LeaseEnd::Orphaned);
                    self.locker.inner.scheduler.remove(&self.shared);
                    tracing::warn!(lock = %self.shared.name, "lease dropped outside a tokio runtime: left to expire by its ttl");
                }
            },
        }
    }
}

/// What the closure of [`Locker::with_lock`] gets: the fencing token, and a cancellation
/// token that fires the moment the lease is lost.
///
/// It releases nothing (hence not a guard): `with_lock` releases the lease once the closure's
/// future ends. Cheap to clone; clones observe the same lease.
#[derive(Clone)]
pub struct LockContext {
    shared: Arc<LeaseShared>,
    cancel: CancellationToken,
}

impl std::fmt::Debug for LockContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockContext")
            .field("name", &self.shared.name)
            .field("fencing", &self.shared.fencing)
            .field("cancelled", &self.cancel.is_cancelled())
            .finish()
    }
}

impl LockContext {
    pub(crate) fn new(shared: Arc<LeaseShared>, cancel: CancellationToken) -> Self {
        Self { shared, cancel }
    }

    /// The lock's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The fencing token of this term.
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.shared.fencing
    }

    /// Cancelled as soon as the lease is lost. Select on it in long work.
    #[must_use]
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Whether the lease is still ours right now (see [`Lease::is_valid`]).
    #[must_use]
    pub fn is_valid(&self) -> bool {
        self.shared.is_valid()
    }

    /// See [`Lease::valid_until`].
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }
}
