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

/// The same suite on real time: the runtime must not depend on the paused clock's perfect
/// punctuality. 1 s, not shorter: the suite bounds requests at a quarter of its ttl, and on a
/// machine with one busy loop per core (the README's bar, #42) a 300 ms ttl's 75 ms is within
/// what a stalled worker thread waits for a core, though the backend answers in microseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_suite_on_real_time() {
    Suite::new(MemoryBackend::new())
        .ttl(Duration::from_secs(1))
        .run_all()
        .await;
}
