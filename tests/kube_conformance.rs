//! The core conformance suite, unchanged, against a real kube-apiserver (one per test binary,
//! see `kube_support`), on real time.

mod kube_support;

use std::time::Duration;

use tenure::conformance::Suite;

/// The suite's time scale. Leases count in whole seconds; two leave room for a busy machine
/// (two cores shared with other builds): request timeouts are a quarter of it.
const TTL: Duration = Duration::from_secs(2);

macro_rules! checks {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let backend = kube_support::shared().backend("default").await;
            Suite::new(backend).ttl(TTL).$name().await;
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
