//! The benches' knobs: `TENURE_BENCH_*` environment variables.

use std::str::FromStr;
use std::time::Duration;

/// `key` parsed, or `default` when it is unset or does not parse.
pub fn knob<T: FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `key` in whole seconds, or `default`.
pub fn knob_secs(key: &str, default: Duration) -> Duration {
    std::env::var(key)
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(default, Duration::from_secs)
}

/// `key` as a comma-separated list (the items that parse); `None` when it is unset or holds
/// none.
pub fn knob_list<T: FromStr>(key: &str) -> Option<Vec<T>> {
    std::env::var(key)
        .ok()
        .map(|s| s.split(',').filter_map(|c| c.trim().parse().ok()).collect())
        .filter(|v: &Vec<T>| !v.is_empty())
}

/// Whether `name` is selected by the comma-separated list in `key` (for trying things out,
/// e.g. `TENURE_BENCH_ONLY`): everything is when `key` is unset or empty.
pub fn selected(key: &str, name: &str) -> bool {
    let only = std::env::var(key).unwrap_or_default();
    only.is_empty() || only.split(',').any(|o| o == name)
}
