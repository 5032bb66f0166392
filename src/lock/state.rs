//! The state of one held lease, shared by its handle ([`Lease`](super::Lease),
//! [`LockContext`](super::LockContext)) and the renewal scheduler: validity, the renew deadline,
//! how the lease ended, and the key the scheduler knows it by.
//!
//! Both sides read and write it, so neither file imports the other: the handle reaches the
//! scheduler only through its [`Locker`](super::Locker). The lease's view depends only on its
//! own clock: a lease past its deadline counts as lost the moment anyone looks, however late
//! the scheduler runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::options::Plan;
use super::{LeaseEnd, LockError, LostReason};
use crate::backend::{FencingToken, HolderToken};

/// Identifies a lease to the scheduler: a slot in its entry table, reused after the lease is
/// gone, and an id that is never reused, so a late command about an ended lease can never
/// touch the lease that took its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseKey {
    pub(super) slot: u32,
    pub(super) id: u64,
}

/// The state of one lease shared by its handle and the renewal scheduler.
pub(crate) struct LeaseShared {
    pub key: LeaseKey,
    pub name: Arc<str>,
    pub holder: HolderToken,
    pub fencing: FencingToken,
    pub plan: Plan,
    /// Whether the renewal scheduler still looks after this lease. Cleared exactly once, by
    /// whoever stops tracking it first: a remover under the scheduler's queue lock, or the
    /// scheduler task when it ends the lease (see the invariants on `scheduler::Queue`).
    tracked: AtomicBool,
    state: Mutex<LeaseState>,
    ended: Notify,
    release: ReleaseOutcome,
}

/// The outcome of the lease's release, shared by every call of `Lease::release` and by the
/// background task that finishes it if its first caller stops waiting. Part of the lease's
/// state rather than an allocation of its own (a short lock cycle's allocations were a
/// measurable part of its client CPU), and small, since every held lease carries it: an error
/// is boxed, and waiters share the lease's `ended` notification.
#[derive(Default)]
struct ReleaseOutcome {
    started: AtomicBool,
    result: OnceLock<Result<(), Box<LockError>>>,
}

struct LeaseState {
    /// `sent + validity` of the latest successful acquire or renewal. Only ever moves forward.
    valid_until: Instant,
    /// `sent + renew_deadline` of the same request (at most `valid_until`): the lease counts as
    /// lost from this instant on, whether or not the scheduler has run yet.
    deadline: Instant,
    /// Set once; the first cause wins.
    end: Option<LeaseEnd>,
    /// Successful renewals so far, and the round-trip time of the latest (for metrics).
    renewals: u32,
    last_renew_latency: std::time::Duration,
    /// Told each later `valid_until` while this lock is held, so that no reader of the state
    /// can see a validity its listeners have not been told of (`LeaseShared::on_renewal`).
    listeners: Vec<RenewalListener>,
}

/// A function told each later `valid_until` of a lease.
pub(crate) type RenewalListener = Box<dyn Fn(Instant) + Send + Sync>;

/// Tells each listener `valid_until`. A listener that panics is reported and the others are
/// still told: listeners run on the renewal scheduler's task, which looks after every lease.
fn tell(listeners: &[RenewalListener], valid_until: Instant) {
    for listener in listeners {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| listener(valid_until))).is_err()
        {
            tracing::error!("a renewal listener panicked");
        }
    }
}

impl LeaseState {
    /// Records the loss at the deadline if it has passed: the handle's view depends only on
    /// its own clock, never on how punctually the scheduler task runs.
    fn settle(&mut self, now: Instant, plan: &Plan) -> bool {
        if self.end.is_none() && now >= self.deadline {
            self.end = Some(LeaseEnd::Lost(if plan.auto_renew {
                LostReason::RenewDeadline
            } else {
                LostReason::Expired
            }));
            return true;
        }
        false
    }
}

impl LeaseShared {
    pub fn new(
        key: LeaseKey,
        name: Arc<str>,
        holder: HolderToken,
        fencing: FencingToken,
        plan: Plan,
        sent: Instant,
    ) -> Self {
        Self {
            key,
            name,
            holder,
            fencing,
            plan,
            tracked: AtomicBool::new(true),
            state: Mutex::new(LeaseState {
                valid_until: sent + plan.validity,
                deadline: sent + plan.renew_deadline,
                end: None,
                renewals: 0,
                last_renew_latency: std::time::Duration::ZERO,
                listeners: Vec::new(),
            }),
            ended: Notify::new(),
            release: ReleaseOutcome::default(),
        }
    }

    /// Marks the lease as no longer tracked by the scheduler; true for the one caller that
    /// did so.
    pub fn untrack(&self) -> bool {
        self.tracked.swap(false, Ordering::AcqRel)
    }

    pub fn is_tracked(&self) -> bool {
        self.tracked.load(Ordering::Acquire)
    }

    /// The state, settled at the current instant.
    fn state(&self) -> MutexGuard<'_, LeaseState> {
        self.state_at(Instant::now())
    }

    /// The state, settled at `now`.
    fn state_at(&self, now: Instant) -> MutexGuard<'_, LeaseState> {
        // Nothing panics while this lock is held; recover rather than propagate a poison.
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.settle(now, &self.plan) {
            tracing::warn!(lock = %self.name, fencing = %self.fencing, end = ?s.end, "lease lost");
            self.ended.notify_waiters();
        }
        s
    }

    pub fn valid_until(&self) -> Instant {
        self.state().valid_until
    }

    /// Records a successful renewal sent at `sent` whose answer came at `now`. Ignored once
    /// the lease has ended, and an answer that comes after the renew deadline ends it first:
    /// a late answer must not revive a lease the workload was (or, had it looked, would have
    /// been) told it lost. The lease's view depends only on its clock, never on whether
    /// anyone read the state between the deadline and the answer.
    pub fn renewed(&self, sent: Instant, now: Instant) {
        // Settled at `now`, not by `state()`: that reads the clock again, and the scheduler
        // calls this for every lease of a batch with the instant the batch's answer came.
        let mut s = self.state_at(now);
        if s.end.is_some() {
            return;
        }
        let before = s.valid_until;
        s.valid_until = s.valid_until.max(sent + self.plan.validity);
        s.deadline = s.deadline.max(sent + self.plan.renew_deadline);
        s.renewals = s.renewals.wrapping_add(1);
        s.last_renew_latency = now.saturating_duration_since(sent);
        if s.valid_until > before {
            tell(&s.listeners, s.valid_until);
        }
    }

    /// Calls `listener` with every later `valid_until` from now on, and once now with the
    /// current one. See `Term::on_renewal`, which documents the contract.
    pub fn on_renewal(&self, listener: RenewalListener) {
        let mut s = self.state();
        if s.end.is_none() {
            tell(std::slice::from_ref(&listener), s.valid_until);
            s.listeners.push(listener);
        }
    }

    /// How many renewals have succeeded, and how long the latest took from send to answer.
    pub fn renewal_stats(&self) -> (u32, std::time::Duration) {
        let s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (s.renewals, s.last_renew_latency)
    }

    /// Time since the last successful acquire or renewal was sent.
    pub fn since_last_renewal(&self) -> std::time::Duration {
        let last_ok = self.valid_until() - self.plan.validity;
        Instant::now().saturating_duration_since(last_ok)
    }

    /// Whether this process may act as the holder right now.
    pub fn is_valid(&self) -> bool {
        let s = self.state();
        s.end.is_none() && Instant::now() < s.valid_until
    }

    pub fn end_cause(&self) -> Option<LeaseEnd> {
        self.state().end.clone()
    }

    /// Ends the lease with `cause` unless it already ended; returns the earlier cause if so.
    pub fn end(&self, cause: LeaseEnd) -> Option<LeaseEnd> {
        let mut s = self.state();
        if let Some(prev) = &s.end {
            return Some(prev.clone());
        }
        match &cause {
            LeaseEnd::Lost(reason) => {
                tracing::warn!(lock = %self.name, fencing = %self.fencing, %reason, "lease lost");
            }
            other => {
                tracing::debug!(lock = %self.name, fencing = %self.fencing, end = ?other, "lease ended")
            }
        }
        s.end = Some(cause);
        drop(s);
        self.ended.notify_waiters();
        None
    }

    /// True for the one caller that starts the release (there is one release run per lease).
    pub fn start_release(&self) -> bool {
        !self.release.started.swap(true, Ordering::AcqRel)
    }

    pub fn release_started(&self) -> bool {
        self.release.started.load(Ordering::Acquire)
    }

    /// Records the release's outcome (the first one wins) and wakes those waiting for it.
    pub fn finish_release(&self, result: Result<(), LockError>) {
        let _ = self.release.result.set(result.map_err(Box::new));
        self.ended.notify_waiters();
    }

    /// The release's outcome, once `finish_release` has recorded it.
    pub async fn release_outcome(&self) -> Result<(), LockError> {
        loop {
            let notified = self.ended.notified();
            tokio::pin!(notified);
            // Registered before the check, so a `finish_release` between the two is not
            // missed. Other notifications of `ended` (the lease's end) only loop once more.
            notified.as_mut().enable();
            if let Some(result) = self.release.result.get() {
                return result.clone().map_err(|e| *e);
            }
            notified.await;
        }
    }

    /// Resolves when the lease ends, with the cause.
    pub async fn wait_end(&self) -> LeaseEnd {
        loop {
            let notified = self.ended.notified();
            let deadline = {
                let s = self.state();
                if let Some(end) = &s.end {
                    return end.clone();
                }
                s.deadline
            };
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;
    use crate::LockOptions;

    fn lease(sent: Instant) -> LeaseShared {
        let plan = LockOptions::new().plan(true).expect("valid");
        LeaseShared::new(
            LeaseKey { slot: 0, id: 0 },
            "state".into(),
            HolderToken::random(),
            FencingToken::new(1),
            plan,
            sent,
        )
    }

    fn recorder() -> (Arc<Mutex<Vec<Instant>>>, RenewalListener) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mirror = Arc::clone(&seen);
        let listener: RenewalListener =
            Box::new(move |at| mirror.lock().expect("unpoisoned").push(at));
        (seen, listener)
    }

    /// An answer that comes after the renew deadline ends the lease instead of moving its
    /// validity, whether or not anyone looked at the lease in between.
    #[tokio::test(start_paused = true)]
    async fn an_answer_after_the_renew_deadline_does_not_revive_the_lease() {
        let start = Instant::now();
        let l = lease(start);
        let (seen, listener) = recorder();
        l.on_renewal(listener);
        let before = l.state().valid_until;
        let sent = start + l.plan.renew_deadline - Duration::from_millis(1);
        l.renewed(
            sent,
            start + l.plan.renew_deadline + Duration::from_millis(1),
        );
        let s = l.state.lock().expect("unpoisoned");
        assert_eq!(s.valid_until, before, "a late answer moved the validity");
        assert!(
            matches!(s.end, Some(LeaseEnd::Lost(LostReason::RenewDeadline))),
            "{:?}",
            s.end
        );
        assert_eq!(
            seen.lock().expect("unpoisoned").len(),
            1,
            "listener told of a late answer"
        );
    }

    /// Listeners hear the validity at once and then each later one, never an unchanged or an
    /// earlier one, and nothing once the lease has ended; one that panics stops no other.
    #[tokio::test(start_paused = true)]
    async fn listeners_hear_each_later_validity_until_the_end() {
        let start = Instant::now();
        let l = lease(start);
        let panics = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&panics);
        l.on_renewal(Box::new(move |_| {
            count.fetch_add(1, Ordering::Relaxed);
            panic!("a listener's bug");
        }));
        let (seen, listener) = recorder();
        l.on_renewal(listener);
        let ms = Duration::from_millis;
        l.renewed(start + ms(100), start + ms(110));
        // An earlier send answered later (two requests in flight): no change, no call.
        l.renewed(start + ms(50), start + ms(120));
        l.renewed(start + ms(200), start + ms(210));
        let validity = l.plan.validity;
        assert_eq!(
            *seen.lock().expect("unpoisoned"),
            [
                start + validity,
                start + ms(100) + validity,
                start + ms(200) + validity
            ]
        );
        assert_eq!(
            panics.load(Ordering::Relaxed),
            3,
            "the panicking listener stays registered"
        );
        let _ = l.end(LeaseEnd::Released);
        l.renewed(start + ms(300), start + ms(310));
        let (late, listener) = recorder();
        l.on_renewal(listener);
        assert_eq!(
            seen.lock().expect("unpoisoned").len(),
            3,
            "told of a renewal after the end"
        );
        assert!(
            late.lock().expect("unpoisoned").is_empty(),
            "registered after the end"
        );
    }
}
