//! The core conformance suite, unchanged, against a real kube-apiserver (one per test binary,
//! see `kube_support`), on real time.

mod kube_support;

use std::time::Duration;

use tenure::conformance::Suite;

/// The suite's time scale. Leases count in whole seconds; three leave room for a busy machine
/// (two cores shared with other builds and busy loops, #42): a renewal a second, due within
/// two more.
const TTL: Duration = Duration::from_secs(3);

/// The bound on each lock request: not the suite's quarter of the ttl (750 ms), which an API
/// server on a loaded machine exceeds now and then, and a single-shot acquire or a renewal
/// cut short fails its check. A renewal gets one attempt of up to two seconds before its
/// deadline instead of two of 750 ms.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

async fn setup() -> ((), Suite) {
    let backend = kube_support::shared().backend("default").await;
    (
        (),
        Suite::new(backend)
            .ttl(TTL)
            .request_timeout(REQUEST_TIMEOUT),
    )
}

tenure::conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    setup()
);

/// A member that stopped announcing before an observer started is not live to it: the
/// observer dates a record it sees first by its `renewTime`, not by when it saw it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_observer_does_not_count_a_long_dead_member_as_live() {
    use futures::StreamExt;
    use tenure::Backend;
    use tenure::backend::Member;
    let writer = kube_support::shared().backend("default").await;
    let group = format!("dead-{}", std::process::id());
    let member = Member {
        identity: "gone".into(),
        shards: 4,
        joined_ms: 1,
        holds: vec![0, 1],
    };
    writer
        .announce_member(&group, &member, TTL)
        .await
        .expect("announce");
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    let reader = kube_support::shared().backend("default").await;
    let first = tokio::time::timeout(Duration::from_secs(20), reader.members(&group).next())
        .await
        .expect("the stream answers")
        .expect("an item")
        .expect("no error");
    assert_eq!(
        first,
        Vec::new(),
        "a member silent for longer than its ttl is gone"
    );
}
