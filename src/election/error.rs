//! Errors of the elector.

use crate::backend::FencingToken;
use crate::{LockError, LostReason};

/// Why [`LeaderElector::run`](super::LeaderElector::run) stopped without the workload's output.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ElectionError {
    /// A duration or combination of durations breaks a rule.
    #[error("invalid election config: {rule}")]
    InvalidConfig {
        /// The rule that was broken.
        rule: String,
    },
    /// The term ended because the lease was lost; the workload was cancelled and has stopped.
    /// Returned when the elector is not told to campaign again after a loss.
    #[error("leadership of {name:?} lost in the term with token {fencing}: {reason}")]
    Lost {
        /// The lease's name.
        name: String,
        /// The fencing token of the lost term.
        fencing: FencingToken,
        /// Why it was lost.
        #[source]
        reason: LostReason,
    },
    /// The workload panicked. The lease was released after it stopped.
    #[error("the workload panicked: {message}")]
    WorkloadPanicked {
        /// The panic's message, when it was a string.
        message: String,
    },
    /// `run` or `run_until` was called while this elector (or a clone of it) is already
    /// running: one run at a time, so that `is_leader` and `health` describe one term.
    #[error("this elector is already running; clone it to observe it")]
    AlreadyRunning,
    /// The election's lease is named like shard `shard` of the sharded group `group`
    /// (`GROUP-SHARD`), and that group exists in the store: a plain election would contend
    /// with the group's members for the same lease. Choose another election name.
    #[error(
        "the lease {name:?} is shard {shard} of the sharded group {group:?} (its group record \
         exists in the store); a plain election cannot share it: choose another name"
    )]
    ShardLease {
        /// The election's lease name.
        name: String,
        /// The sharded group whose shard the name is.
        group: String,
        /// The shard number in the name.
        shard: u32,
    },
    /// A state tenure believes impossible; please report it.
    #[error("internal error: {message}")]
    Internal {
        /// What happened.
        message: String,
    },
    /// Campaigning failed with an error that retrying cannot fix (credentials, permissions,
    /// a bad lease name).
    #[error(transparent)]
    Lock(#[from] LockError),
}
