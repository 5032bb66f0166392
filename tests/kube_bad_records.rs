//! Records another process wrote that tenure cannot parse, on the real kube-apiserver: a
//! planted member Lease whose `renewTime` is 9999-12-31 (valid to Go, beyond the timestamps
//! k8s-openapi parses) once made a sharded group unreadable, and the same on a plain election's
//! Lease made every candidate exit. Now the member record is skipped and the group runs on;
//! the plain Lease is held by the holder it names until that holder's lease runs out on the
//! candidate's clock, then taken.

mod kube_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::json;
use tenure::Locker;
use tenure::election::{ElectionConfig, LeaderElector};
use tenure::shard::ShardedElector;
use tokio_util::sync::CancellationToken;

/// Far beyond any lease, and past the range of the timestamps k8s-openapi parses.
const FAR: &str = "9999-12-31T23:59:59.000000Z";
const LIMIT: Duration = Duration::from_secs(60);

fn config() -> ElectionConfig {
    ElectionConfig::new()
        .lease_duration(Duration::from_secs(2))
        .renew_deadline(Duration::from_millis(1300))
        .retry_period(Duration::from_millis(300))
        .stop_margin(Duration::from_millis(300))
        .rejoin(true)
}

fn leases(client: kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"),
        "leases",
    );
    Api::namespaced_with(client, ns, &ar)
}

/// Starts one replica of group `g`; returns the elector and the task running it.
async fn replica(
    server: &kube_support::Server,
    ns: &str,
    identity: &str,
    stop: &CancellationToken,
) -> (
    ShardedElector,
    tokio::task::JoinHandle<Result<(), tenure::shard::ShardError>>,
) {
    let locker = Locker::with_identity(server.backend(ns).await, identity).expect("identity");
    let elector = ShardedElector::new(locker, "g", 4, config()).expect("elector");
    let run = elector.clone();
    let stop = stop.clone();
    let task = tokio::spawn(async move {
        run.run_until(stop.cancelled_owned(), |_, term| async move {
            term.cancellation().cancelled().await;
        })
        .await
    });
    (elector, task)
}

/// Waits until `electors` hold the 4 shards between them, each once.
async fn all_held(electors: &[&ShardedElector], what: &str) {
    let began = Instant::now();
    loop {
        let mut seen = Vec::new();
        for e in electors {
            seen.extend(e.owned().borrow().iter().copied());
        }
        let set: BTreeSet<u32> = seen.iter().copied().collect();
        if seen.len() == 4 && set.len() == 4 {
            return;
        }
        assert!(began.elapsed() < LIMIT, "{what}: shards held {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_lease_tenure_cannot_parse_is_skipped_and_the_group_runs_on() {
    let server = kube_support::shared();
    let ns = kube_support::unique("bad-member");
    server.namespace(&ns).await;
    let stop = CancellationToken::new();
    let (a, a_task) = replica(server, &ns, "a", &stop).await;
    let (b, b_task) = replica(server, &ns, "b", &stop).await;
    all_held(&[&a, &b], "before the planted record").await;

    // A copy of a real member record under another name, renewed "in 9999".
    let api = leases(server.admin().await, &ns);
    let members = api
        .list(&ListParams::default().labels("tenure.dev/group=g"))
        .await
        .expect("list members");
    let mut ghost = members.items.first().expect("a member Lease").clone();
    ghost.metadata = kube::core::ObjectMeta {
        name: Some("g-member-ghost".into()),
        labels: ghost.metadata.labels.clone(),
        annotations: ghost.metadata.annotations.clone(),
        ..Default::default()
    };
    ghost.data["spec"]["renewTime"] = json!(FAR);
    ghost.data["spec"]["acquireTime"] = json!(FAR);
    api.create(&PostParams::default(), &ghost)
        .await
        .expect("the API server takes the record");

    // A newcomer reads the group with the record in it; the others re-read it as it joins.
    let (c, c_task) = replica(server, &ns, "c", &stop).await;
    let began = Instant::now();
    loop {
        let members = c.assignment().borrow().members.len();
        if members == 3 {
            break;
        }
        assert!(
            began.elapsed() < LIMIT,
            "the newcomer sees {members} members"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    all_held(&[&a, &b, &c], "after the planted record").await;
    for (who, task) in [("a", &a_task), ("b", &b_task), ("c", &c_task)] {
        assert!(!task.is_finished(), "replica {who} stopped");
    }
    assert!(
        tenure::backend::kube::damaged_records() > 0,
        "the record was not counted"
    );
    stop.cancel();
    for task in [a_task, b_task, c_task] {
        task.await.expect("join").expect("a clean leave");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lease_tenure_cannot_parse_is_held_until_it_runs_out_then_taken() {
    let server = kube_support::shared();
    let ns = kube_support::unique("bad-lease");
    server.namespace(&ns).await;
    let api = leases(server.admin().await, &ns);
    let planted: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "plain"},
        "spec": {
            "holderIdentity": "ghost",
            "leaseDurationSeconds": 2,
            "acquireTime": FAR,
            "renewTime": FAR,
        },
    }))
    .expect("object");
    api.create(&PostParams::default(), &planted)
        .await
        .expect("the API server takes the Lease");

    let locker = Locker::with_identity(server.backend(&ns).await, "me").expect("identity");
    let elector = LeaderElector::new(locker, "plain", config()).expect("elector");
    let began = Instant::now();
    let led = tokio::time::timeout(
        LIMIT,
        elector.run(|term| async move { term.fencing_token() }),
    )
    .await
    .expect("a leader within the limit")
    .expect("the candidate did not fail on the Lease");
    let waited = began.elapsed();
    // The holder it names is honoured for its whole lease (2 s, on this clock) first.
    assert!(
        waited >= Duration::from_millis(1900),
        "taken after {waited:?}, before the planted holder's lease ran out"
    );
    assert!(led.get() > 0);
}

/// What lies under a group record's name that is not a record tenure wrote — a plain
/// election's Lease of that name, a record annotation with garbage in it — reads as damaged
/// (nothing is decided from it), never as an error, and the record cannot be created over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_record_tenure_cannot_read_is_damaged_not_an_error() {
    use tenure::Backend;
    use tenure::backend::{GroupRead, GroupRecord};
    let server = kube_support::shared();
    let ns = kube_support::unique("bad-group");
    server.namespace(&ns).await;
    let api = leases(server.admin().await, &ns);
    let backend = server.backend(&ns).await;
    let damaged = async |group: &str| match backend.group_record(group).await {
        Ok(GroupRead::Damaged { reason }) => reason,
        other => panic!("group {group}: {other:?}, not damaged"),
    };

    // A plain election that happens to be named like a group record.
    let plain: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "plain-group"},
        "spec": {"holderIdentity": "someone", "leaseDurationSeconds": 15},
    }))
    .expect("object");
    api.create(&PostParams::default(), &plain)
        .await
        .expect("the API server takes the Lease");
    let reason = damaged("plain").await;
    assert!(
        reason.contains("plain-group") && reason.contains("not a group record"),
        "{reason}"
    );

    // A record Lease whose annotation is garbage.
    let garbage: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "garbage-group",
            "annotations": {"tenure.dev/group-record": "g1:four:1:-"},
        },
    }))
    .expect("object");
    api.create(&PostParams::default(), &garbage)
        .await
        .expect("the API server takes the Lease");
    let reason = damaged("garbage").await;
    assert!(
        reason.contains("garbage-group") && reason.contains("bad shard count"),
        "{reason}"
    );
    assert!(
        !reason.contains("four"),
        "the reason echoes the stored text: {reason}"
    );

    // Neither is overwritten by a member that creates the first record.
    for group in ["plain", "garbage"] {
        let created = backend
            .swap_group_record(group, None, &GroupRecord::first(4))
            .await
            .unwrap_or_else(|e| panic!("group {group}: {e}"));
        assert!(
            !created,
            "group {group}: a record was created over the Lease"
        );
        damaged(group).await;
    }
    // And a group whose record Lease would not be a valid name is a configuration error.
    let e = backend
        .group_record("Not_Valid")
        .await
        .expect_err("an invalid name");
    assert_eq!(e.kind(), tenure::backend::BackendErrorKind::Config, "{e}");
}
