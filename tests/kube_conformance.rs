//! The core conformance suite, unchanged, against a real kube-apiserver (one per test binary,
//! see `kube_support`), on real time.

mod kube_support;

use std::time::Duration;

use tenure::conformance::Suite;

/// The suite's time scale. Leases count in whole seconds; two leave room for a busy machine
/// (two cores shared with other builds): request timeouts are a quarter of it.
const TTL: Duration = Duration::from_secs(2);

async fn setup() -> ((), Suite) {
    let backend = kube_support::shared().backend("default").await;
    ((), Suite::new(backend).ttl(TTL))
}

tenure::conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    setup()
);
