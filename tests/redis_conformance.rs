//! The core conformance suite, unchanged, against a real `redis-server` (started per test), on
//! real time with a multi-thread runtime.

mod support;

use std::time::Duration;

use support::RedisServer;
use tenure::conformance::Suite;

/// The suite's time scale. Every wait is a multiple of it; one second leaves room for a busy
/// machine (two cores shared with other builds).
const TTL: Duration = Duration::from_secs(1);

async fn setup() -> (RedisServer, Suite) {
    let server = RedisServer::start();
    let suite = Suite::new(support::backend(&server).await).ttl(TTL);
    (server, suite)
}

tenure::conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    setup()
);

/// The whole suite on one server with coalescing off: one script call per lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_suite_without_coalescing() {
    use tenure::backend::redis::{RedisBackend, RedisConfig};
    let server = RedisServer::start();
    let config = RedisConfig::new(&server.url())
        .unwrap_or_else(|e| panic!("{e}"))
        .coalesce(false);
    let backend = RedisBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    Suite::new(backend).ttl(TTL).run_all().await;
}
