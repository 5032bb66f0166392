//! The conformance suite on the memory backend, on tokio's paused clock.

use std::time::Duration;

use tenure::backend::memory::MemoryBackend;
use tenure::conformance::Suite;

async fn setup() -> ((), Suite) {
    (
        (),
        Suite::new(MemoryBackend::new()).ttl(Duration::from_secs(1)),
    )
}

tenure::conformance_tests!(
    #[tokio::test(start_paused = true)]
    setup()
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
