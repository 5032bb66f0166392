//! Errors of the lock runtime, and how a lease ended.

use std::time::Duration;

use crate::backend::{BackendError, InvalidName};

/// Why a lease is no longer ours.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LostReason {
    /// The store says we do not hold it (it expired there, was deleted, or was taken over).
    #[error("the store no longer has us as holder")]
    NotHeld,
    /// Renewals kept failing until the renew deadline passed.
    #[error("no successful renewal before the renew deadline")]
    RenewDeadline,
    /// Auto-renew was off and the validity ran out without a refresh.
    #[error("the lease's validity ran out without a renewal")]
    Expired,
    /// The store answered a renewal with a permanent error (permission, protocol).
    #[error("renewal failed permanently: {0}")]
    Backend(#[source] BackendError),
    /// The renewal scheduler stopped: it panicked (a bug: please report it), or the tokio
    /// runtime it ran on is shutting down.
    #[error("the renewal scheduler stopped{}", if *panicked { " after a panic" } else { "" })]
    RenewalStopped {
        /// Whether it stopped because of a panic.
        panicked: bool,
    },
}

/// How a held lease ended: what [`Lease::lost`](super::Lease::lost) resolves with.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum LeaseEnd {
    /// We released it.
    Released,
    /// It was lost; the workload must stop, mutual exclusion is no longer ours.
    Lost(LostReason),
    /// We stopped renewing it and left it to expire ([`Lease::orphan`](super::Lease::orphan)).
    Orphaned,
}

impl LeaseEnd {
    /// Whether the lease was lost rather than given up.
    #[must_use]
    pub const fn is_lost(&self) -> bool {
        matches!(self, Self::Lost(_))
    }
}

/// Errors of the lock runtime. Match on the variant; the messages are for humans.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Someone else holds the lock, and the wait window (if any) ran out.
    #[error("lock {name:?} is held by {}", holder.as_deref().unwrap_or("another holder"))]
    NotAcquired {
        /// The lock's name.
        name: String,
        /// The holder's identity, when the store keeps it.
        holder: Option<String>,
        /// How long until the holder's lease would run out without renewal, when known.
        remaining: Option<Duration>,
    },
    /// The store says the lease is no longer ours: mutual exclusion may have been broken
    /// while we thought we held it.
    #[error("lease on {name:?} is no longer held by us: mutual exclusion may have been broken")]
    NotHeld {
        /// The lock's name.
        name: String,
    },
    /// The lease had already been lost before this call.
    #[error("lease on {name:?} was lost: {reason}")]
    Lost {
        /// The lock's name.
        name: String,
        /// Why it was lost.
        #[source]
        reason: LostReason,
    },
    /// An option or combination of options breaks a rule.
    #[error("invalid lock options: {rule}")]
    InvalidConfig {
        /// The rule that was broken.
        rule: String,
    },
    /// The backend does not accept the lock name.
    #[error(transparent)]
    InvalidName(#[from] InvalidName),
    /// Auto-renew was asked for with a ttl below the minimum.
    #[error("ttl {ttl:?} is too short for auto-renew (minimum {min:?})")]
    TtlTooShort {
        /// The ttl asked for.
        ttl: Duration,
        /// The minimum, [`MIN_AUTO_RENEW_TTL`](super::MIN_AUTO_RENEW_TTL).
        min: Duration,
    },
    /// The store could not be asked or did not answer; nothing is assumed (fail closed).
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// What [`Locker::with_lock`](super::Locker::with_lock) returns when the closure's exclusive
/// section cannot be confirmed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WithLockError<T> {
    /// The lock was not acquired; the closure did not run.
    #[error("lock not acquired: {0}")]
    NotRun(#[source] LockError),
    /// The closure ran and returned `output`, but the lease was lost while it ran, or the
    /// release found it no longer ours: treat the exclusive section as untrustworthy.
    #[error("the closure ran but its exclusivity is unconfirmed: {error}")]
    Unconfirmed {
        /// What the closure returned.
        output: T,
        /// What the loss or the release reported.
        #[source]
        error: LockError,
    },
}
