//! Scratch directories.

use std::path::PathBuf;

/// A directory removed on drop (and emptied first, should an earlier run have left it).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(path: PathBuf) -> Self {
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Self(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
