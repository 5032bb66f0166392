//! The core conformance suite, unchanged, against the local backend: real files in a private
//! temporary directory per check, on real time with a multi-thread runtime.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tenure::backend::local::LocalBackend;
use tenure::conformance::Suite;

/// The suite's time scale. Every wait is a multiple of it; one second leaves room for a busy
/// machine (two cores shared with other builds) and for disk syncs on grants.
const TTL: Duration = Duration::from_secs(1);

/// A private state directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "tenure-local-conformance-{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn setup() -> (TempDir, Suite) {
    let dir = TempDir::new("check");
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
    let dir = TempDir::new("whole");
    let backend = LocalBackend::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    Suite::new(backend).ttl(TTL).run_all().await;
}
