//! Leader election and fenced leases.
//!
//! tenure lets exactly one of many replicas do something — run a controller's reconcile loop,
//! a cron job, a migration — and hands it a **fencing token** that rises with every term, so
//! that the resources it writes can refuse a stale holder's late writes.
//!
//! # Layers
//!
//! - [`backend`]: the storage contract, a few atomic primitives ([`Backend`]). The
//!   [`memory`](backend::memory) backend is always available; the local (files on one host),
//!   Redis and Kubernetes backends come behind the `local`, `redis` and `kube` features.
//! - [`lock`]: the lock runtime. A [`Locker`] acquires [`Lease`]s, renews them from one shared
//!   scheduler task, and runs closures under them with [`Locker::with_lock`].
//! - [`election`]: [`LeaderElector`] runs a workload only while this replica holds a lease,
//!   with controller-runtime's durations; Prometheus metrics behind the `metrics` feature.
//! - [`fence`]: how to make stale writers harmless with the fencing token.
//! - `crd` (feature `crd`): the `Election` custom resource and a publisher that shows who
//!   leads in `kubectl get elections`, for any backend.
//! - `probe` (feature `healthz`): the `/healthz`, `/readyz` and `/metrics` endpoints of an
//!   elector or a sharded replica (`ProbeServer`), above election and sharding alike.
//!
//! The `tenure` command (feature `cli`) wraps any process: `tenure run --lease NAME -- CMD`
//! runs CMD only while it holds the lease.
//!
//! # Guides
//!
//! One per job, in the repository's `docs/` folder (their Rust examples are compiled and run
//! as this crate's doc tests):
//!
//! - `docs/singleton.md` — run a command as a singleton: `tenure run` and the Helm chart;
//! - `docs/operator.md` — write an operator: [`Locker`], [`LeaderElector`], `Controller`;
//! - `docs/fencing.md` and `docs/fencing-kubernetes.md` — fence writes: SQL, Redis, the
//!   Kubernetes API server;
//! - `docs/sharding.md` — split work: sharded leadership.
//!
//! Reference pages there: `guarantees.md`, `options.md`, `errors.md`, `metrics.md`,
//! `backends.md`, `measured.md`.
//!
//! # Quick start
//!
//! ```
//! use std::time::Duration;
//! use tenure::backend::memory::MemoryBackend;
//! use tenure::{LockOptions, Locker};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let locker = Locker::new(MemoryBackend::new());
//! let opts = LockOptions::new().ttl(Duration::from_secs(15)).wait(Duration::from_secs(5));
//! let written = locker
//!     .with_lock("nightly-report", &opts, |guard| async move {
//!         // Only one replica runs this at a time. Pass the token to what you write, e.g.
//!         // UPDATE reports SET ..., fencing_token = $t WHERE ... AND fencing_token <= $t
//!         // (equal tokens pass: a leader writes many times per term; see `fence`)
//!         format!("report written under token {}", guard.fencing_token())
//!     })
//!     .await;
//! assert!(written.is_ok());
//! # }
//! ```
//!
//! # Guarantees
//!
//! - **Ownership.** Every acquisition gets a fresh 128-bit holder token from the OS CSPRNG;
//!   only that token can renew or release the lease.
//! - **Fencing.** A grant's [`FencingToken`] is greater than every token issued before for the
//!   same lock name. Renewal keeps it; every new term gets a new one.
//! - **Time.** A holder trusts only its own monotonic clock: its lease is valid until
//!   `sent + ttl − drift`, where `sent` is when it *sent* the last successful request and
//!   `drift = ttl × drift_factor + 2 ms`. Wall-clock jumps change nothing.
//! - **Cancellation.** Cancelling a task never ends a held lease by itself; only a release,
//!   an orphan, a drop or a loss does. Releases run to completion in their own task.
//!
//! # Caveats
//!
//! A lease is not an absolute lock. A holder that is frozen (a long GC pause, SIGSTOP, a VM
//! migration) past its validity can wake up and act before it notices the lease is gone. The
//! fencing token is what keeps you safe then: check it where you write.

#![deny(rustdoc::broken_intra_doc_links)]
#![warn(missing_docs, missing_debug_implementations)]
// docs.rs builds with `--cfg docsrs` on nightly: every feature-gated item then carries a badge
// naming its feature. Each also says so in its own documentation, for other builds.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
#[cfg(feature = "kube")]
pub mod controller;
#[cfg(feature = "crd")]
pub mod crd;
pub mod election;
pub mod fence;
pub mod lock;
#[cfg(any(feature = "healthz", feature = "kube"))]
mod net;
#[cfg(feature = "healthz")]
pub mod probe;
pub mod shard;
mod util;

pub use backend::{Backend, FencingToken};
pub use election::{ElectionConfig, ElectionError, LeaderElector, Term};
pub use lock::{
    Lease, LeaseEnd, LockContext, LockError, LockOptions, Locker, LockerStats, LostReason,
    WithLockError,
};
pub use util::default_identity;

/// The README's and the guides' examples, compiled and run as doc tests (they use every
/// backend). `tests/docs.rs` checks the pages' links and runs their one-host shell snippets.
#[cfg(all(doctest, feature = "redis", feature = "kube", feature = "metrics"))]
mod doc_pages {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/singleton.md")]
    struct Singleton;
    #[doc = include_str!("../docs/operator.md")]
    struct Operator;
    #[doc = include_str!("../docs/fencing.md")]
    struct Fencing;
    #[doc = include_str!("../docs/fencing-kubernetes.md")]
    struct FencingKubernetes;
    #[doc = include_str!("../docs/sharding.md")]
    struct Sharding;
    #[doc = include_str!("../docs/backends.md")]
    struct Backends;
    #[doc = include_str!("../docs/guarantees.md")]
    struct Guarantees;
    #[doc = include_str!("../docs/options.md")]
    struct Options;
    #[doc = include_str!("../docs/errors.md")]
    struct Errors;
    #[doc = include_str!("../docs/metrics.md")]
    struct Metrics;
    #[doc = include_str!("../docs/measured.md")]
    struct Measured;
}
