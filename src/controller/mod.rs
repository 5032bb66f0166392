//! kube-runtime controllers under leadership (feature `kube`): [`Controller`], kube-runtime's
//! builder with the same methods, reconciler and error policy, which reconciles only during
//! this replica's terms, with every watched kind kept warm on followers; and [`Replica`] for
//! always-on parts beside it.
//!
//! An operator built on [`LeaderElector::run`](crate::LeaderElector::run) alone builds a new
//! kube-runtime `Controller` every term: the new leader lists and watches everything before
//! its first reconcile, so a takeover grows with the number of objects, and cutting the
//! controller off at the term's end aborts reconciles in flight. [`Controller`] fixes both:
//!
//! - its watches — the primary kind's store, and the owned and watched kinds' triggers — run
//!   on every replica from the start of [`Controller::run`], and a follower keeps the next
//!   term's controller ready with every object's key collected for the grant: a new leader reconciles
//!   at once, without a list request. [`CacheMode::Cold`] starts the primary watch per term
//!   instead, for memory-tight deployments;
//! - when the term ends, no new reconcile starts and the ones in flight finish (kube-runtime's
//!   graceful shutdown) before the elector releases the lease; the elector's stop deadline
//!   still bounds a reconcile that hangs;
//! - each term's reconciles can get a context made for the term ([`per_term`]): its fenced
//!   clients ([`crate::fence::kube::FencedApi`]), its fencing token;
//! - [`Controller::run_sharded`] does the same under sharded leadership ([`crate::shard`]):
//!   one applier per replica, fed the objects of the shards held here, each reconcile a task
//!   of its shard's term; when a shard moves here its objects are reconciled at once from the
//!   warm store;
//! - [`Controller::runner`] starts it for an election loop of your own, and [`Replica`] runs
//!   always-on parts (webhooks, metrics, a status reader) on every replica beside the
//!   leader-only part, with one shutdown: leadership is handed over first, then the always-on
//!   parts stop.
//!
//! # Porting a kube-rs controller
//!
//! Change the `Controller` import to `tenure::controller::Controller`, make a
//! [`LeaderElector`](crate::LeaderElector), and pass it to `run`; see `docs/operator.md` and
//! `examples/configmapgen.rs` (kube-rs's `configmapgen_controller`, ported).
//!
//! # What a warm cache costs a follower
//!
//! One watch connection per watched kind and the primary store's objects in memory — the
//! same as the leader holds — plus the standby's keys (one per object, for the grant's first
//! pass). `benches/kube_controller.rs` measures it against cold mode.

mod builder;
mod cache;
mod context;
mod feed;
mod pass;
mod reconcile;
mod replica;
mod sharded;
mod standby;
mod triggers;

pub use builder::{Controller, RunItem, Runner, Status};
pub use cache::CacheMode;
pub use context::{PerTerm, TermContext, per_term};
pub use feed::CacheState;
pub use replica::{PartError, Replica};
pub use sharded::object_key;

use crate::election::ElectionError;
use crate::shard::ShardError;

/// Why a term's controller could not run, or the run ended: [`Controller::run`]'s queue error
/// (where kube-runtime's `run` has its watch error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// The API server refused the cache's list or watch (RBAC, or an unknown resource): the
    /// store is not current and will not become so until that changes.
    #[error("the API server refused the watch: {error}")]
    Refused {
        /// The refusal, as the watch reported it.
        error: String,
    },
    /// The cache had not listed its objects by the end of the term's validity, and its watch
    /// was failing then (a first list still going without error is waited for as long as
    /// the term lasts).
    #[error("the cache did not list its objects in time{}", last.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default())]
    NotWarm {
        /// The watch's latest error.
        last: Option<String>,
    },
    /// The cache's watch stopped (its last handle was dropped).
    #[error("the cache's watch stopped")]
    WatchStopped,
    /// The election ended ([`Controller::run`]): a lost term without `rejoin`, a store that
    /// refuses it for good, or a reconcile's panic; the run ends with it.
    #[error("the election ended: {0}")]
    Election(#[source] ElectionError),
    /// The sharded election ended ([`Controller::run_sharded`]).
    #[error("the sharded election ended: {0}")]
    Sharded(#[source] ShardError),
}

/// Why [`Replica::run_until`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// The election failed (see [`ElectionError`]).
    #[error(transparent)]
    Election(#[from] ElectionError),
    /// An always-on part failed or panicked; the replica shut down.
    #[error("always-on part {name:?} failed: {source}")]
    Part {
        /// The name the part was given.
        name: String,
        /// Its error.
        source: PartError,
    },
}
