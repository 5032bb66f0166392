//! [`PublisherStats`]: the publisher's counters and latest error, shared with its owner.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::crd::PublishError;

/// Counters of a [`StatusPublisher`](super::StatusPublisher), shared with it: cheap to clone,
/// always current.
#[derive(Clone, Default)]
pub struct PublisherStats {
    inner: Arc<StatsInner>,
}

#[derive(Default)]
struct StatsInner {
    writes: AtomicU64,
    conflicts: AtomicU64,
    failures: AtomicU64,
    last_error: Mutex<Option<PublishError>>,
}

impl std::fmt::Debug for PublisherStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherStats")
            .field("writes", &self.writes())
            .field("conflicts", &self.conflicts())
            .field("failures", &self.failures())
            .field("last_error", &self.last_error())
            .finish()
    }
}

impl PublisherStats {
    /// Status writes that succeeded.
    #[must_use]
    pub fn writes(&self) -> u64 {
        self.inner.writes.load(Ordering::Relaxed)
    }

    /// Writes that lost a compare-and-swap race and were retried.
    #[must_use]
    pub fn conflicts(&self) -> u64 {
        self.inner.conflicts.load(Ordering::Relaxed)
    }

    /// Publishing attempts that failed or were cut off by shutdown (such a write may still
    /// have landed): each is retried later, except the leave on shutdown and the cut-off ones.
    #[must_use]
    pub fn failures(&self) -> u64 {
        self.inner.failures.load(Ordering::Relaxed)
    }

    /// The latest failure, kept after later successes.
    #[must_use]
    pub fn last_error(&self) -> Option<PublishError> {
        self.inner
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Counts a status write that succeeded.
    pub(super) fn count_write(&self) {
        self.inner.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a write that lost a compare-and-swap race.
    pub(super) fn count_conflict(&self) {
        self.inner.conflicts.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a publishing attempt that failed.
    pub(super) fn count_failure(&self) {
        self.inner.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps `error` as the latest failure.
    pub(super) fn set_last_error(&self, error: PublishError) {
        *self
            .inner
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error);
    }
}
