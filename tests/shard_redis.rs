//! Sharded leadership end to end on a real Redis, with separate processes (the scenario is in
//! `shard_e2e`): 32 shards over 3 → 5 → 2 → 3 replicas and a kill -9, 0 stale writes
//! accepted, rebalance times printed.

mod safety;
mod shard_e2e;
mod support;

use std::path::PathBuf;

use support::RedisServer;

const CHILD_URL: &str = "TENURE_SHARD_REDIS_URL";
const CHILD_DIR: &str = "TENURE_SHARD_DIR";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_shards_over_three_five_two_three_replicas_and_a_kill() {
    if let (Ok(url), Ok(dir), Ok(identity)) = (
        std::env::var(CHILD_URL),
        std::env::var(CHILD_DIR),
        std::env::var("TENURE_SAFETY_IDENTITY"),
    ) {
        // This binary, re-run as one replica by the scenario below.
        use tenure::backend::redis::{RedisBackend, RedisConfig};
        let config = RedisConfig::new(&url).expect("url");
        let backend = RedisBackend::connect(config).await.expect("connect");
        shard_e2e::candidate(backend, &identity, &PathBuf::from(dir)).await;
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
