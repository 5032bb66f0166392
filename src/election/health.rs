//! [`Health`]: whether a candidate is live (a leader that still renews) and whether the store
//! answers it, and the record of the store's answers that tells.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The result of [`LeaderElector::health`](super::LeaderElector::health).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Whether this process believes it leads.
    pub leading: bool,
    /// Time since the last successful renewal was sent, when leading.
    pub since_last_renewal: Option<Duration>,
    /// False when leading without a renewal for longer than the renew deadline plus the
    /// tolerance: the process is stuck and should be restarted (client-go's healthz adaptor).
    /// Followers are healthy whatever the store does: restarting them would not bring it back.
    pub healthy: bool,
    /// Time since the store last answered this candidate (an acquire attempt, a change of
    /// holder it reported, a renewal), or since [`run`](super::LeaderElector::run) began if it
    /// never has; `None` while the elector is not running.
    pub store_silence: Option<Duration>,
    /// False when [`store_silence`](Self::store_silence) exceeds
    /// [`ElectionConfig::store_unreachable_after`](super::ElectionConfig::store_unreachable_after):
    /// this candidate cannot tell who leads, and could not take over if the leader died. A
    /// readiness signal, not a liveness one.
    pub store_reachable: bool,
}

/// When this candidate's run began (`None` while not running) and when the store last
/// reported a holder change to it. Acquire answers are the locker's; renewals the lease's.
#[derive(Default)]
pub(super) struct StoreContact(Mutex<Contact>);

#[derive(Default)]
struct Contact {
    run_started: Option<Instant>,
    answered: Option<Instant>,
}

impl StoreContact {
    fn lock(&self) -> MutexGuard<'_, Contact> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A run begins now.
    pub(super) fn run_started(&self) {
        self.lock().run_started = Some(Instant::now());
    }

    /// The run is over: no silence to measure until the next one.
    pub(super) fn run_ended(&self) {
        self.lock().run_started = None;
    }

    /// The store reported a holder change just now.
    pub(super) fn answered(&self) {
        self.lock().answered = Some(Instant::now());
    }

    /// How long the store has been silent towards this candidate: since its latest answer —
    /// a holder change, the locker's latest acquire answer (`acquire_answer`) or, leading,
    /// the latest renewal (sent `since_last_renewal` ago) — or since the run began if none.
    /// `None` while not running.
    pub(super) fn silence(
        &self,
        acquire_answer: Option<Instant>,
        since_last_renewal: Option<Duration>,
    ) -> Option<Duration> {
        let contact = self.lock();
        let began = contact.run_started?;
        let now = Instant::now();
        let latest = [
            Some(began),
            contact.answered,
            acquire_answer,
            since_last_renewal.and_then(|since| now.checked_sub(since)),
        ]
        .into_iter()
        .flatten()
        .max()?;
        Some(now.saturating_duration_since(latest))
    }
}
