//! Sharded leadership end to end on a real Redis, with separate processes (the scenario is in
//! `shard_e2e`): 32 shards over 3 → 5 → 2 → 3 replicas and a kill -9, 0 stale writes
//! accepted, rebalance times printed; and a rolling update from 8 to 12 shards.

mod safety;
mod shard_e2e;
mod support;

use std::path::PathBuf;

use support::RedisServer;

const CHILD_URL: &str = "TENURE_SHARD_REDIS_URL";
const CHILD_DIR: &str = "TENURE_SHARD_DIR";

/// Runs this binary's replica when the scenario re-ran it as one; whether it did.
async fn as_replica() -> bool {
    let (Ok(url), Ok(dir), Ok(identity)) = (
        std::env::var(CHILD_URL),
        std::env::var(CHILD_DIR),
        std::env::var("TENURE_SAFETY_IDENTITY"),
    ) else {
        return false;
    };
    use tenure::backend::redis::{RedisBackend, RedisConfig};
    let config = RedisConfig::new(&url).expect("url");
    let backend = RedisBackend::connect(config).await.expect("connect");
    shard_e2e::candidate(backend, &identity, &PathBuf::from(dir), safety::config()).await;
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_shards_over_three_five_two_three_replicas_and_a_kill() {
    if as_replica().await {
        return;
    }
    let server = RedisServer::start();
    let dir = support::TempDir::new("shards");
    shard_e2e::registers(dir.path());
    let env = [
        (CHILD_URL, server.url()),
        (CHILD_DIR, dir.path().display().to_string()),
    ];
    let times = shard_e2e::scenario(
        "thirty_two_shards_over_three_five_two_three_replicas_and_a_kill",
        &env,
        dir.path(),
    );
    println!("sharded rebalance on Redis (32 shards, lease 2 s), 0 stale writes: {times:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_from_8_to_12_shards_never_runs_two_counts_at_once() {
    if as_replica().await {
        return;
    }
    let server = RedisServer::start();
    let dir = support::TempDir::new("resize");
    shard_e2e::registers(dir.path());
    let env = [
        (CHILD_URL, server.url()),
        (CHILD_DIR, dir.path().display().to_string()),
    ];
    let took = shard_e2e::resize_scenario(
        "a_rolling_update_from_8_to_12_shards_never_runs_two_counts_at_once",
        &env,
        dir.path(),
        8,
        12,
    );
    println!(
        "8 → 12 shards on Redis (lease 2 s): the new count ran {took:?} after the last old replica's SIGTERM"
    );
}
