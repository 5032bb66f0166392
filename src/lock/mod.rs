//! The lock runtime: acquiring leases, holding them, renewing them, and giving them up.
//!
//! [`Locker`] is the entry point: [`try_acquire`](Locker::try_acquire) makes one attempt,
//! [`acquire`](Locker::acquire) waits up to a window, and [`with_lock`](Locker::with_lock) runs
//! a closure under an auto-renewed lease and always releases it. A held [`Lease`] carries the
//! fencing token and reports how it ended. One renewal scheduler per locker keeps every lease
//! alive. Nothing here knows which backend it talks to.

mod background;
mod error;
mod lease;
mod options;
mod scheduler;
mod state;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::{FutureExt, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use error::{LeaseEnd, LockError, LostReason, WithLockError};
pub use lease::{Lease, LockContext};
pub use options::{DRIFT_FLOOR, LockOptions, MAX_DURATION, MIN_AUTO_RENEW_TTL};

// The identity bound belongs to the backend contract (every store must keep that much);
// `Locker::with_identity` enforces it.
pub use crate::backend::types::MAX_IDENTITY_LEN;

/// Makes the retry and campaign jitter of every locker used on this thread a fixed sequence
/// drawn from `seed`; `None` returns to the operating system's randomness (the default).
///
/// For deterministic simulation and reproducible tests on one thread (a `current_thread`
/// runtime): with the same seed, the same calls get the same pauses. Jitter only spreads
/// retries; nothing secret comes from it (holder tokens always come from the OS's CSPRNG).
///
/// ```
/// tenure::lock::seed_jitter(Some(7));
/// // ... run lockers on this thread ...
/// tenure::lock::seed_jitter(None);
/// ```
pub fn seed_jitter(seed: Option<u64>) {
    crate::util::seed_jitter(seed);
}

use crate::backend::{AcquireRequest, Acquired, Backend, BackendError, HolderToken};
use scheduler::Scheduler;
pub(crate) use state::LeaseShared;

/// Acquires and holds leases on one backend.
///
/// Cheap to clone: clones share the backend and the renewal scheduler. The scheduler is one
/// task for all of the locker's leases, started with the first lease and stopped after the
/// last one ends.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tenure::backend::memory::MemoryBackend;
/// use tenure::{LockOptions, Locker};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let locker = Locker::new(MemoryBackend::new());
/// let opts = LockOptions::new().ttl(Duration::from_secs(10));
/// let total = locker
///     .with_lock("migrations", &opts, |guard| async move {
///         // Exclusive section: stamp guard.fencing_token() on what you write.
///         guard.fencing_token().get()
///     })
///     .await
///     .expect("no one else holds it");
/// assert!(total > 0);
/// # }
/// ```
#[derive(Clone)]
pub struct Locker {
    inner: Arc<LockerInner>,
}

struct LockerInner {
    backend: Arc<dyn Backend>,
    identity: Arc<str>,
    scheduler: Scheduler,
    /// When the store last answered an acquire attempt (granted or busy), as nanoseconds
    /// after `created` plus one (0: never): a follower's evidence that the store is
    /// reachable, for the elector's health. An atomic, not a lock: every attempt writes it.
    answered: std::sync::atomic::AtomicU64,
    created: Instant,
    /// The releases left to the background (`background.rs`).
    background: Arc<background::Pending>,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("identity", &self.inner.identity)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// A snapshot of a locker's bookkeeping, from [`Locker::stats`].
///
/// Read through methods: the renewal scheduler's own bookkeeping is not part of the API, so
/// that the scheduler can change without breaking callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockerStats {
    active_leases: usize,
    scheduler_tasks: usize,
    renewals: u64,
    renew_batches: u64,
    internals: SchedulerInternals,
}

impl LockerStats {
    /// Leases held: acquired and not yet released, orphaned or lost. Exact at every instant.
    #[must_use]
    pub fn active_leases(&self) -> usize {
        self.active_leases
    }

    /// Renewal scheduler tasks running: 1 while any lease is held (and for a second after the
    /// last one ended), 0 otherwise, however many leases the locker holds.
    #[must_use]
    pub fn scheduler_tasks(&self) -> usize {
        self.scheduler_tasks
    }

    /// Successful background renewals so far.
    #[must_use]
    pub fn renewals(&self) -> u64 {
        self.renewals
    }

    /// Renewal batches sent so far (each one `renew_many` round trip): with
    /// [`renewals`](Self::renewals), how well renewals are batched.
    #[must_use]
    pub fn renew_batches(&self) -> u64 {
        self.renew_batches
    }

    /// The renewal scheduler's own bookkeeping, for tenure's tests and benchmarks. Not part of
    /// the stable API: it changes whenever the scheduler does.
    #[doc(hidden)]
    #[must_use]
    pub fn scheduler_internals(&self) -> SchedulerInternals {
        self.internals
    }
}

/// The renewal scheduler's bookkeeping ([`LockerStats::scheduler_internals`]); not part of
/// the stable API.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerInternals {
    /// Leases the scheduler task has taken in. It takes new leases in from a queue when it
    /// next wakes — at the latest when the earliest of them falls due, or once 1,024 changes
    /// are queued — so this can trail `active_leases` until then.
    pub tracked_leases: usize,
    /// Times the scheduler task woke up so far: for a locker taking many short leases, about
    /// one per 500 lock cycles, plus one per renewal batch and per lease that falls due.
    pub wakeups: u64,
    /// Timers the scheduler task held when it last went to sleep, including those left by
    /// released leases: bounded by twice the tracked leases plus 4,096.
    pub timers: usize,
}

impl Locker {
    /// A locker on `backend` whose leases carry this process's default identity
    /// ([`default_identity`](crate::default_identity)).
    pub fn new(backend: impl Backend) -> Self {
        Self::build(Arc::new(backend), crate::default_identity().into())
    }

    /// A locker whose leases carry `identity` (pod name, host name): what observers see.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if the identity is empty, longer than
    /// [`MAX_IDENTITY_LEN`] bytes, or contains control characters.
    pub fn with_identity(backend: impl Backend, identity: &str) -> Result<Self, LockError> {
        if identity.trim().is_empty() {
            return Err(LockError::InvalidConfig {
                rule: "identity must not be empty".into(),
            });
        }
        if identity.len() > MAX_IDENTITY_LEN {
            return Err(LockError::InvalidConfig {
                rule: format!(
                    "identity must be at most {MAX_IDENTITY_LEN} bytes long, not {}",
                    identity.len()
                ),
            });
        }
        if identity.chars().any(char::is_control) {
            return Err(LockError::InvalidConfig {
                rule: "identity must not contain control characters".into(),
            });
        }
        Ok(Self::build(Arc::new(backend), identity.into()))
    }

    fn build(backend: Arc<dyn Backend>, identity: Arc<str>) -> Self {
        Self {
            inner: Arc::new(LockerInner {
                scheduler: Scheduler::new(backend.clone()),
                backend,
                identity,
                answered: std::sync::atomic::AtomicU64::new(0),
                created: Instant::now(),
                background: Arc::default(),
            }),
        }
    }

    /// The identity stored beside every lease this locker takes.
    #[must_use]
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// The backend this locker uses.
    #[must_use]
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Waits until the releases this locker left to the background have finished, or until
    /// `deadline`; whether they all have. A run about to return calls it, so that a process
    /// exiting when the run returns does not drop them with its runtime.
    pub(crate) async fn background_settled(&self, deadline: Instant) -> bool {
        self.inner.background.settled(deadline).await
    }

    /// Counts of held leases, scheduler tasks and renewals.
    #[must_use]
    pub fn stats(&self) -> LockerStats {
        let s = self.inner.scheduler.stats();
        LockerStats {
            active_leases: s.active.load(Ordering::Relaxed),
            scheduler_tasks: s.tasks.load(Ordering::Relaxed),
            renewals: s.renewals.load(Ordering::Relaxed),
            renew_batches: s.batches.load(Ordering::Relaxed),
            internals: SchedulerInternals {
                tracked_leases: s.tracked.load(Ordering::Relaxed),
                wakeups: s.wakeups.load(Ordering::Relaxed),
                timers: s.timers.load(Ordering::Relaxed),
            },
        }
    }

    /// One attempt to take the lock `name`.
    ///
    /// # Errors
    ///
    /// [`LockError::NotAcquired`] if someone else holds it; [`LockError::InvalidConfig`],
    /// [`LockError::TtlTooShort`] or [`LockError::InvalidName`] for bad input;
    /// [`LockError::Backend`] if the store did not answer (fail closed).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the request was sent releases, in the background, whatever
    /// the request may have been granted: no lock is left behind beyond that best effort.
    pub async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease, LockError> {
        self.acquire_with(name, opts, false, None, HolderToken::random())
            .await
    }

    /// Takes the lock `name`, waiting up to the options' [`wait`](LockOptions::wait) window.
    ///
    /// Between attempts it waits for the backend's release notification, or at most
    /// `min(retry_interval ± jitter, the holder's remaining ttl)`, whichever comes first: a
    /// release wakes it at once, and nothing polls tightly. All attempts of one call share one
    /// holder token, so an attempt whose answer was lost is recognised as ours when retried.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire); [`LockError::NotAcquired`] once the window is
    /// exhausted. Transient store failures are retried within the window; if the window ends
    /// on one, it is returned.
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease, LockError> {
        self.acquire_as(name, opts, HolderToken::random()).await
    }

    /// [`acquire`](Self::acquire) with the holder token `holder`, chosen (and recorded) by the
    /// caller before the first request goes out.
    pub(crate) async fn acquire_as(
        &self,
        name: &str,
        opts: &LockOptions,
        holder: HolderToken,
    ) -> Result<Lease, LockError> {
        self.acquire_with(name, opts, false, Some(opts.get_wait()), holder)
            .await
    }

    async fn acquire_with(
        &self,
        name: &str,
        opts: &LockOptions,
        auto_renew_default: bool,
        wait: Option<std::time::Duration>,
        holder: HolderToken,
    ) -> Result<Lease, LockError> {
        let plan = opts.plan(auto_renew_default)?;
        self.inner.backend.validate_name(name)?;
        let req = AcquireRequest {
            name: name.into(),
            holder,
            identity: self.inner.identity.clone(),
            ttl: plan.ttl,
        };
        let mut attempt = Attempt::new(&self.inner.backend, &self.inner.background, &req);
        // From the first attempt's send instant: no clock read of its own.
        let mut give_up_at = None;
        let mut changes = None;
        loop {
            let sent = Instant::now();
            let give_up_at = *give_up_at.get_or_insert(sent + wait.unwrap_or_default());
            let answer = attempt.send(plan.request_timeout).await;
            if answer.is_ok() {
                self.record_answer(sent);
            }
            let failure = match answer {
                Ok(Acquired::Granted { fencing }) => {
                    attempt.disarm();
                    let shared = self.inner.scheduler.add(&plan, sent, |key| {
                        LeaseShared::new(key, req.name.clone(), req.holder, fencing, plan, sent)
                    });
                    tracing::debug!(lock = name, %fencing, "lease acquired");
                    return Ok(Lease::new(shared, self.clone()));
                }
                Ok(Acquired::Busy { holder, remaining }) => (
                    LockError::NotAcquired {
                        name: name.to_owned(),
                        holder,
                        remaining,
                    },
                    remaining,
                ),
                Err(e) if e.is_transient() => (LockError::Backend(e), None),
                Err(e) => return Err(LockError::Backend(e)),
            };
            let now = Instant::now();
            if now >= give_up_at {
                return Err(failure.0);
            }
            let pause = plan.busy_pause(failure.1).min(give_up_at - now);
            // Subscribing after the first busy answer, then retrying at once if the stream's
            // first item (the state at subscription) says the lock is free, closes the window
            // in which a release between our attempt and the subscription would go unnoticed.
            let stream = changes.get_or_insert_with(|| self.inner.backend.observe(name));
            wait_for_change(stream, pause).await;
        }
    }

    /// Records that the store answered the attempt sent at `sent` (the send instant: one clock
    /// read less per attempt, and an answer is never taken for fresher than it is).
    ///
    /// Kept to the millisecond: an answer less than 1 ms newer than the recorded one is not
    /// written, so that tasks acquiring at a high rate read the shared word instead of
    /// bouncing it between cores with a write per attempt.
    fn record_answer(&self, sent: Instant) {
        let since = sent.saturating_duration_since(self.inner.created);
        let nanos = u64::try_from(since.as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        let answered = &self.inner.answered;
        let recorded = answered.load(Ordering::Relaxed);
        if recorded == 0 || nanos > recorded.saturating_add(1_000_000) {
            answered.fetch_max(nanos, Ordering::Relaxed);
        }
    }

    /// When the store last answered one of this locker's acquire attempts, granted or busy
    /// (the instant the answered request was sent, or up to a millisecond before it).
    pub(crate) fn last_answer(&self) -> Option<Instant> {
        match self
            .inner
            .answered
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => None,
            n => Some(self.inner.created + std::time::Duration::from_nanos(n - 1)),
        }
    }

    /// Runs `f` while holding the lock `name`, then releases it.
    ///
    /// The lease is auto-renewed unless the options turn that off. The closure gets a
    /// [`LockContext`] with the fencing token and a cancellation token that fires the moment the
    /// lease is lost. Afterwards the lease is always released — also when the closure panics,
    /// in which case the panic propagates after the release — and the release runs to
    /// completion even if this future is dropped.
    ///
    /// # Errors
    ///
    /// - [`WithLockError::NotRun`] if the lock was not acquired (see
    ///   [`acquire`](Self::acquire)); the closure did not run.
    /// - [`WithLockError::Unconfirmed`] with the closure's output if the lease was lost while it
    ///   ran, or the release found it no longer ours: even a successful closure then ran
    ///   without confirmed exclusivity.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the closure's future and releases the lease in the
    /// background.
    pub async fn with_lock<F, Fut, T>(
        &self,
        name: &str,
        opts: &LockOptions,
        f: F,
    ) -> Result<T, WithLockError<T>>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = self
            .acquire_with(
                name,
                opts,
                true,
                Some(opts.get_wait()),
                HolderToken::random(),
            )
            .await
            .map_err(WithLockError::NotRun)?;
        let cancel = CancellationToken::new();
        let guard = LockContext::new(lease.shared().clone(), cancel.clone());
        let work = AssertUnwindSafe(f(guard)).catch_unwind();
        tokio::pin!(work);
        let outcome = {
            let lost = lease.shared().wait_end();
            tokio::pin!(lost);
            let mut cancelled = false;
            loop {
                tokio::select! {
                    out = &mut work => break out,
                    _ = &mut lost, if !cancelled => {
                        cancel.cancel();
                        cancelled = true;
                    }
                }
            }
        };
        let released = lease.release().await;
        match outcome {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(output) => match released {
                Ok(()) => Ok(output),
                Err(error) => Err(WithLockError::Unconfirmed { output, error }),
            },
        }
    }
}

/// Waits until `pause` has passed or the lock's holder changed, whichever comes first.
async fn wait_for_change(
    changes: &mut futures::stream::BoxStream<
        'static,
        Result<crate::backend::HolderChange, BackendError>,
    >,
    pause: std::time::Duration,
) {
    let sleep = tokio::time::sleep(pause);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return,
            item = changes.next() => match item {
                // The lock became free: try now.
                Some(Ok(change)) if change.is_free() => return,
                // Someone else was granted it (or the state at subscription shows a holder):
                // trying now would only be answered "busy".
                Some(Ok(_)) => {}
                // A hiccup of the notification channel, or its end: rely on the timer alone
                // for this pause rather than retrying (or spinning) on a broken stream.
                Some(Err(_)) | None => {
                    sleep.await;
                    return;
                }
            },
        }
    }
}

/// One acquisition's requests, with a guard that releases what may have been granted if the
/// acquisition is abandoned after a request was sent.
/// `call` bounded by `timeout`, unless the backend bounds its calls by at most that itself
/// ([`Backend::request_bound`]): a deadline costs a timer registration and removal, which was
/// a measurable part of a short lock cycle's client CPU.
pub(crate) async fn within<T>(
    backend: &dyn Backend,
    what: &str,
    timeout: std::time::Duration,
    call: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    if backend
        .request_bound()
        .is_some_and(|bound| bound <= timeout)
    {
        return call.await;
    }
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| BackendError::timeout(what, timeout))
        .and_then(|r| r)
}

struct Attempt<'a> {
    // Borrowed: the locker's backend handle is shared by every task using the locker, and a
    // clone per acquisition would bounce its reference count between cores.
    backend: &'a Arc<dyn Backend>,
    background: &'a Arc<background::Pending>,
    req: &'a AcquireRequest,
    /// A request was sent and no answer has settled that nothing was granted.
    maybe_granted: bool,
}

impl<'a> Attempt<'a> {
    fn new(
        backend: &'a Arc<dyn Backend>,
        background: &'a Arc<background::Pending>,
        req: &'a AcquireRequest,
    ) -> Self {
        Self {
            backend,
            background,
            req,
            maybe_granted: false,
        }
    }

    async fn send(&mut self, timeout: std::time::Duration) -> Result<Acquired, BackendError> {
        self.maybe_granted = true;
        let answer = within(
            self.backend.as_ref(),
            "acquire",
            timeout,
            self.backend.try_acquire(self.req),
        )
        .await;
        // A definite "busy" settles that this attempt took nothing; an earlier uncertain
        // attempt would have been answered as a replay (granted), so it took nothing either.
        // An error leaves the outcome unknown.
        if let Ok(Acquired::Busy { .. }) = answer {
            self.maybe_granted = false;
        }
        answer
    }

    fn disarm(&mut self) {
        self.maybe_granted = false;
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.maybe_granted {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let name = self.req.name.clone();
        let holder = self.req.holder;
        self.background.spawn(&rt, async move {
            // Best effort: the lease expires by its ttl if this fails too.
            let _ = backend.release(&name, &holder).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::memory::MemoryBackend;

    /// The elector's health counts the store's latest answer to an acquire attempt, kept to
    /// the millisecond: the first answer is recorded however soon after the locker's creation,
    /// later ones once they are a millisecond newer.
    #[tokio::test(start_paused = true)]
    async fn the_latest_answer_is_recorded_to_the_millisecond() {
        let locker = Locker::with_identity(MemoryBackend::new(), "test").expect("identity");
        assert_eq!(locker.last_answer(), None);
        let first = Instant::now();
        let _held = locker
            .try_acquire("a", &LockOptions::new())
            .await
            .expect("free");
        assert_eq!(locker.last_answer(), Some(first));

        tokio::time::advance(Duration::from_micros(500)).await;
        let busy = locker.try_acquire("a", &LockOptions::new()).await;
        assert!(matches!(busy, Err(LockError::NotAcquired { .. })));
        assert_eq!(locker.last_answer(), Some(first), "within the millisecond");

        tokio::time::advance(Duration::from_millis(2)).await;
        let later = Instant::now();
        let busy = locker.try_acquire("a", &LockOptions::new()).await;
        assert!(matches!(busy, Err(LockError::NotAcquired { .. })));
        assert_eq!(locker.last_answer(), Some(later));
    }
}
