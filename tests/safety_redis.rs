//! The end-to-end safety run on a real Redis: five candidate processes, the leader repeatedly
//! killed (SIGKILL) or frozen (SIGSTOP) past its lease and resumed (see `safety/mod.rs`).

mod safety;
mod support;

use std::path::PathBuf;
use std::time::Duration;

use support::RedisServer;

const CHILD_URL: &str = "TENURE_SAFETY_REDIS_URL";
const CHILD_DIR: &str = "TENURE_SAFETY_DIR";

/// After a kill a new leader's workload starts within this: liveness, not speed (the summary
/// prints the failovers measured). Redis expires the dead leader's key on its own clock one
/// lease after the last renewal, and waiters retry by then (a pause is at most the holder's
/// remaining ttl); a retry period covers the jittered pause, another the acquire and the
/// workload's start, and a second is room for a loaded two-core machine to schedule the
/// candidate processes.
fn failover_bound() -> Duration {
    safety::LEASE + safety::RETRY * 2 + Duration::from_secs(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_killed_and_frozen_never_overlap() {
    if let (Ok(url), Ok(dir), Ok(identity)) = (
        std::env::var(CHILD_URL),
        std::env::var(CHILD_DIR),
        std::env::var("TENURE_SAFETY_IDENTITY"),
    ) {
        // This binary, re-run as one candidate process by the parent below.
        use tenure::backend::redis::{RedisBackend, RedisConfig};
        let config = RedisConfig::new(&url).unwrap_or_else(|e| panic!("{e}"));
        let backend = RedisBackend::connect(config)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        safety::candidate(backend, &identity, &PathBuf::from(dir)).await;
        return;
    }
    let server = RedisServer::start();
    let dir = support::TempDir::new("safety");
    let env = vec![
        (CHILD_URL, server.url()),
        (CHILD_DIR, dir.path().display().to_string()),
    ];
    let summary = safety::run_parent(
        "five_candidates_killed_and_frozen_never_overlap",
        env,
        dir.path().to_owned(),
        8,
        failover_bound(),
    )
    .await;
    println!("redis safety: {summary}");
}

#[test]
fn redis_cron_example_runs_each_tick_exactly_once() {
    let server = RedisServer::start();
    let out = std::process::Command::new(safety::example("redis_cron"))
        .env("REDIS_URL", server.url())
        .output()
        .unwrap_or_else(|e| panic!("cannot run the example: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ran exactly once"),
        "redis_cron failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
