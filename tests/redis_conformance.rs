//! The core conformance suite, unchanged, against a real `redis-server` (started per test), on
//! real time with a multi-thread runtime.

mod support;

use std::time::Duration;

use support::RedisServer;
use tenure::conformance::Suite;

/// The suite's time scale. Every wait is a multiple of it; one second leaves room for a busy
/// machine (two cores shared with other builds).
const TTL: Duration = Duration::from_secs(1);

macro_rules! checks {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let server = RedisServer::start();
            Suite::new(support::backend(&server).await).ttl(TTL).$name().await;
        }
    )*};
}

checks!(
    check_mutual_exclusion,
    check_fencing_rises,
    check_ownership,
    check_expiry,
    check_replays_are_idempotent,
    check_lease_release_is_memoized,
    check_orphan,
    check_drop_releases,
    check_with_lock_panic_releases,
    check_wait_window_exhaustion,
    check_release_wakes_waiters,
    check_auto_renew_outlives_ttl,
    check_renew_deadline_ends_stalled_lease,
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
