//! What the benches share: env knobs, percentiles, the figures' formatting and Markdown tables,
//! the files under `target/bench`, child processes (spawning, signals, `/proc`), the
//! `--role` side of a bench that re-executes itself, and, with the `kube` feature, the
//! audited kube-apiserver and its audit log.
//!
//! Each bench includes it with `#[path = "support/mod.rs"] mod support;` (a subfolder, so that
//! cargo does not take it for a bench target of its own). It also brings in the tests'
//! harnesses, so that a bench names them in one place: `support::redis_harness`
//! (`tests/support`, redis-server) and `support::kube_harness` (`tests/kube_support`,
//! kube-apiserver from `e2e/kube-testenv`).

#![allow(dead_code)] // Each bench uses a different part.

pub mod env;
pub mod out;
pub mod proc;
pub mod role;
pub mod scratch;
pub mod stats;
pub mod table;

#[cfg(feature = "kube")]
pub mod apiserver;

#[cfg(feature = "kube")]
#[path = "../../tests/kube_support/mod.rs"]
pub mod kube_harness;

#[cfg(feature = "redis")]
#[path = "../../tests/support/mod.rs"]
pub mod redis_harness;
