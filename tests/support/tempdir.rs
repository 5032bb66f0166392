//! Private temporary directories for tests, removed on drop. Shared by the test harnesses
//! (`#[path]`-included by test files that do not use the Redis harness).

#![allow(dead_code)] // Each test binary uses a different constructor.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// A temporary directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new, empty directory.
    pub fn new(label: &str) -> Self {
        let dir = Self::reserve(label);
        std::fs::create_dir_all(&dir.0)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.0.display()));
        dir
    }

    /// A fresh path that does not exist yet (for code that must create the directory
    /// itself, with its own permissions); removed on drop if it was created.
    pub fn reserve(label: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "tenure-{label}-{}-{}-{nanos}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
