//! The figures' files: `target/bench/NAME` under the package (not under `CARGO_TARGET_DIR`).

use std::path::{Path, PathBuf};

/// Where the benches write their figures.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench")
}

/// Where, and whether, a bench says it wrote its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Say {
    /// `\nwrote PATH` on stdout, after the table; a failure on stderr.
    Stdout,
    /// `wrote PATH` on stderr; a failure too.
    Stderr,
    /// Nothing, even on failure.
    Quiet,
}

/// Writes `text` to `target/bench/NAME`.
pub fn save(name: &str, text: &str, say: Say) {
    let dir = dir();
    let path = dir.join(name);
    let written = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, text));
    match (written, say) {
        (_, Say::Quiet) => {}
        (Ok(()), Say::Stdout) => println!("\nwrote {}", path.display()),
        (Ok(()), Say::Stderr) => eprintln!("wrote {}", path.display()),
        (Err(e), _) => eprintln!("cannot write {}: {e}", path.display()),
    }
}

/// Writes `json`, pretty, to `target/bench/NAME`.
#[cfg(feature = "kube")]
pub fn save_json(name: &str, json: &serde_json::Value, say: Say) {
    save(
        name,
        &(serde_json::to_string_pretty(json).unwrap_or_default() + "\n"),
        say,
    );
}
