//! Leader election: run a workload only while this replica holds a lease.
//!
//! [`LeaderElector::run`] campaigns for the lease, calls the workload with a [`Term`] for each
//! term it wins, and stops the workload in time when the term ends. It is built on the lock
//! runtime ([`crate::lock`]) and works with every backend; electors built from clones of one
//! [`Locker`](crate::Locker) share its single renewal scheduler.
//!
//! # The timeline of a term
//!
//! ```text
//!  acquire ──renew──renew──renew── … ──✗──✗── renew deadline ──────── valid_until − margin ── valid_until
//!     │      (every lease/3;          (failures retried      │                    │
//!     │       failures retried         every retry period)   cancellation fires   workload future dropped
//!     │       every retry period)                            (the term is over)   if still running
//!  workload starts                                                                │
//!                                                                      release, then campaign again or return
//! ```
//!
//! The workload future never runs past `valid_until − stop_margin`, the instant before which
//! no other candidate can have been granted the lease; when the store says outright that the
//! lease is no longer ours it is dropped at once. The lease is released only after the
//! workload has stopped.

// The files: `config.rs` (`ElectionConfig` and its rules), `elector.rs` (the `LeaderElector`
// handle, its shared state, what it reports), `run.rs` (campaigning and serving terms),
// `leader.rs` (`Leader`, the leader watch), `health.rs` (`Health`, the store's answers),
// `prefer.rs` (`Preference`: which follower a leader hands to), `restart.rs`
// (`RestartLock`: the proof that this replica's previous process is gone),
// `term.rs`, `testing.rs`, `error.rs`, `metrics.rs`. The probe server that reports on
// electors lives above this module and `shard`, in `crate::probe` (feature `healthz`).

mod config;
mod elector;
mod error;
mod handover;
mod health;
mod intent;
mod leader;
#[cfg(feature = "metrics")]
mod metrics;
mod prefer;
mod restart;
mod run;
mod term;
mod testing;

pub use config::ElectionConfig;
pub use elector::LeaderElector;
pub use error::ElectionError;
pub use health::Health;
pub use intent::{HandedOff, HandoffCause, HealthPolicy, health_group};
pub use leader::Leader;
#[cfg(feature = "metrics")]
pub use metrics::ElectionMetrics;
pub use prefer::Preference;
pub(crate) use restart::end_recorded_terms;
pub use restart::{RestartLock, RestartLockError};
pub use term::Term;
pub use testing::TestTerm;
