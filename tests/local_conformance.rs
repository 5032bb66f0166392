//! The core conformance suite, unchanged, against the local backend: real files in a private
//! temporary directory per check, on real time with a multi-thread runtime.

#[path = "support/tempdir.rs"]
mod tempdir;

use std::time::Duration;

use tempdir::TempDir;
use tenure::backend::local::LocalBackend;
use tenure::conformance::Suite;

/// The suite's time scale. Every wait is a multiple of it; one second leaves room for a busy
/// machine (two cores shared with other builds) and for disk syncs on grants.
const TTL: Duration = Duration::from_secs(1);

async fn setup() -> (TempDir, Suite) {
    let dir = TempDir::reserve("local-conformance-check");
    let backend = LocalBackend::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    (dir, Suite::new(backend).ttl(TTL))
}

tenure::conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    setup()
);

/// The whole suite in one directory, one check after another, each finding the files the
/// earlier ones left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_suite_on_one_directory() {
    let dir = TempDir::reserve("local-conformance-whole");
    let backend = LocalBackend::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    Suite::new(backend).ttl(TTL).run_all().await;
}
