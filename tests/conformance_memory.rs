//! The conformance suite on the memory backend, on tokio's paused clock.

use std::time::Duration;

use tenure::backend::memory::MemoryBackend;
use tenure::conformance::Suite;

fn suite() -> Suite {
    Suite::new(MemoryBackend::new()).ttl(Duration::from_secs(1))
}

macro_rules! checks {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(start_paused = true)]
        async fn $name() {
            suite().$name().await;
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

/// The same suite on real time, with a short ttl: the runtime must not depend on the paused
/// clock's perfect punctuality.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_suite_on_real_time() {
    Suite::new(MemoryBackend::new())
        .ttl(Duration::from_millis(300))
        .run_all()
        .await;
}
