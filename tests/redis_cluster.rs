//! The Redis backend against a real Redis Cluster (three `redis-server` masters joined by
//! `redis-cli --cluster create`, on loopback): the core conformance suite unchanged, one script
//! call per lock, locks spread over the nodes, and release notifications crossing nodes.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use support::{RedisCluster, granted, req};
use tenure::backend::redis::{RedisBackend, RedisConfig};
use tenure::backend::{
    AcquireRequest, Acquired, Backend, BackendErrorKind, Released, RenewRequest, Renewed,
};
use tenure::conformance::Suite;
use tenure::{LockOptions, Locker};

async fn connect(cluster: &RedisCluster) -> RedisBackend {
    let config = RedisConfig::new(&cluster.url())
        .unwrap_or_else(|e| panic!("{e}"))
        .cluster();
    RedisBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connect to the cluster: {e}"))
}

/// The port of the node serving `key`'s slot.
fn owner(cluster: &RedisCluster, key: &str) -> u16 {
    let slot = match cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]) {
        redis::Value::Int(s) => s,
        other => panic!("CLUSTER KEYSLOT answered {other:?}"),
    };
    let redis::Value::Array(ranges) = cluster.nodes[0].cmd(&["CLUSTER", "SLOTS"]) else {
        panic!("CLUSTER SLOTS is not an array");
    };
    for range in ranges {
        let redis::Value::Array(parts) = range else {
            continue;
        };
        let (redis::Value::Int(lo), redis::Value::Int(hi), redis::Value::Array(master)) =
            (&parts[0], &parts[1], &parts[2])
        else {
            continue;
        };
        if (*lo..=*hi).contains(&slot)
            && let Some(redis::Value::Int(port)) = master.get(1)
        {
            return u16::try_from(*port).unwrap_or(0);
        }
    }
    panic!("no node serves slot {slot}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    Suite::new(connect(&cluster).await)
        .ttl(Duration::from_secs(1))
        .run_all()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_carries_one_lock_and_locks_spread_over_the_nodes() {
    let cluster = RedisCluster::start(3);
    let b = connect(&cluster).await;
    let names: Vec<String> = (0..48).map(|i| format!("spread-{i}")).collect();
    let owners: BTreeSet<u16> = names
        .iter()
        .map(|n| owner(&cluster, &b.lock_key(n)))
        .collect();
    assert_eq!(owners.len(), 3, "48 locks land on all three nodes");
    let before = cluster.command_calls("evalsha");
    let reqs: Vec<AcquireRequest> = names
        .iter()
        .map(|n| req(n, "me", Duration::from_secs(10)))
        .collect();
    // Concurrent acquires: on a single server they would share script calls.
    let answers = futures::future::join_all(reqs.iter().map(|r| b.try_acquire(r))).await;
    for a in &answers {
        assert!(matches!(a, Ok(Acquired::Granted { .. })), "{a:?}");
    }
    let renewals: Vec<RenewRequest> = reqs
        .iter()
        .map(|r| RenewRequest {
            name: r.name.clone(),
            holder: r.holder,
            ttl: r.ttl,
        })
        .collect();
    for answer in b.renew_many(&renewals).await {
        assert_eq!(answer.ok(), Some(Renewed::Held));
    }
    let released =
        futures::future::join_all(reqs.iter().map(|r| b.release(&r.name, &r.holder))).await;
    for r in released {
        assert_eq!(r.ok(), Some(Released::Released));
    }
    assert_eq!(
        cluster.command_calls("evalsha") - before,
        3 * 48,
        "one script call per lock and operation"
    );
    // Tokens still come from each lock's own counter, on its own node.
    let again = req("spread-0", "me", Duration::from_secs(10));
    let first = match answers[0] {
        Ok(Acquired::Granted { fencing }) => fencing,
        ref other => panic!("{other:?}"),
    };
    assert_eq!(granted(&b, &again).await.get(), first.get() + 1);
    // A node that forgot the scripts gets them again, on the node that answered NOSCRIPT.
    for node in &cluster.nodes {
        node.cmd(&["SCRIPT", "FLUSH"]);
    }
    assert_eq!(
        b.release(&again.name, &again.holder).await.ok(),
        Some(Released::Released)
    );
    assert_eq!(b.stats().script_reloads, 1);
}

/// The subscriber connection goes to the seed node; the lock's slot lives on another node. A
/// cluster forwards every PUBLISH to every node, so the waiter still wakes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_wakes_on_a_release_published_on_another_node() {
    let cluster = RedisCluster::start(3);
    let b = connect(&cluster).await;
    let seed = cluster.nodes[0].port();
    let name = (0..100)
        .map(|i| format!("far-{i}"))
        .find(|n| owner(&cluster, &b.lock_key(n)) != seed)
        .unwrap_or_else(|| panic!("every name hashed to the seed node"));
    let locker = Locker::new(b.clone());
    // A long ttl: without the notification the waiter would sleep until the expiry.
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(20));
    let held = locker
        .try_acquire(&name, &opts)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let waiter = {
        let locker = locker.clone();
        let name = name.clone();
        let opts = opts.clone();
        tokio::spawn(async move {
            let lease = locker.acquire(&name, &opts).await;
            (Instant::now(), lease)
        })
    };
    // Let the waiter be told "busy" and subscribe.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    held.release().await.unwrap_or_else(|e| panic!("{e}"));
    let (granted_at, lease) = waiter.await.unwrap_or_else(|e| panic!("{e}"));
    let lease = lease.unwrap_or_else(|e| panic!("{e}"));
    assert!(lease.fencing_token() > held.fencing_token());
    let waited = granted_at - released_at;
    assert!(
        waited < Duration::from_secs(2),
        "the waiter was woken by the notification, not its 30 s timer ({waited:?})"
    );
}

/// `CLUSTER KEYSLOT key`, asked of the first node.
fn keyslot(cluster: &RedisCluster, key: &str) -> i64 {
    match cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]) {
        redis::Value::Int(s) => s,
        other => panic!("CLUSTER KEYSLOT answered {other:?}"),
    }
}

fn text(v: &redis::Value) -> String {
    match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Okay => "OK".to_owned(),
        other => panic!("not a string: {other:?}"),
    }
}

/// A slot moved from one master to another while a lock in it is held, the way
/// `redis-cli --cluster reshard` moves it: while its keys are on the new node and the slot is
/// still migrating, the old node answers `ASK`; once the move is final, `MOVED`. The holder's
/// renewals follow both, the lock stays held with the same token, and after the `MOVED` the
/// calls go to the new node directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_follows_its_slot_to_another_node() {
    let cluster = RedisCluster::start(3);
    let b = connect(&cluster).await;
    let r = req("moving", "me", Duration::from_secs(30));
    let token = granted(&b, &r).await;
    let key = b.lock_key(&r.name);
    let slot = keyslot(&cluster, &key).to_string();
    let from = owner(&cluster, &key);
    let src = cluster
        .nodes
        .iter()
        .find(|n| n.port() == from)
        .expect("owner");
    let dst = cluster
        .nodes
        .iter()
        .find(|n| n.port() != from)
        .expect("another");
    let id = |n: &support::RedisServer| text(&n.cmd(&["CLUSTER", "MYID"]));
    let (src_id, dst_id) = (id(src), id(dst));
    let renew = || async {
        b.renew(&r.name, &r.holder, r.ttl)
            .await
            .unwrap_or_else(|e| panic!("renew while the slot moves: {e}"))
    };
    assert_eq!(renew().await, Renewed::Held);

    // Migrating: every key of the slot goes to the new node; the old node answers ASK.
    dst.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id]);
    src.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id]);
    let redis::Value::Array(keys) = src.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"]) else {
        panic!("GETKEYSINSLOT is not an array");
    };
    let keys: Vec<String> = keys.iter().map(text).collect();
    assert!(keys.contains(&key), "{keys:?} holds the lock's key");
    let port = dst.port().to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
    migrate.extend(keys.iter().map(String::as_str));
    assert_eq!(text(&src.cmd(&migrate)), "OK");
    // A redirected call counts as rejected on the node that redirected it.
    let rejected = |n: &support::RedisServer| n.command_stat("evalsha", "rejected_calls");
    let (src_rejected, dst_calls) = (rejected(src), dst.command_calls("evalsha"));
    assert_eq!(renew().await, Renewed::Held, "followed ASK");
    assert_eq!(rejected(src) - src_rejected, 1, "the old node redirected");
    assert_eq!(
        dst.command_calls("evalsha") - dst_calls,
        1,
        "the new one ran it"
    );
    assert_eq!(dst.command_calls("asking"), 1, "after ASKING");

    // Moved: every node learns the new owner; the old node answers MOVED to the eight
    // renewals in flight, which follow it.
    for node in &cluster.nodes {
        node.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]);
    }
    let src_rejected = rejected(src);
    let batch = || futures::future::join_all((0..8).map(|_| renew()));
    for answer in batch().await {
        assert_eq!(answer, Renewed::Held, "followed MOVED");
    }
    assert_eq!(
        rejected(src) - src_rejected,
        8,
        "the old node redirected each"
    );
    // The map is stale now: eight callers at once read it once, and go to the new node.
    let map_reads = || cluster.command_calls("cluster|slots");
    let (reads, dst_calls) = (map_reads(), dst.command_calls("evalsha"));
    for answer in batch().await {
        assert_eq!(answer, Renewed::Held);
    }
    assert_eq!(
        map_reads() - reads,
        1,
        "one read of the map for eight callers"
    );
    assert_eq!(rejected(src) - src_rejected, 8, "the map was read again");
    assert_eq!(dst.command_calls("evalsha") - dst_calls, 8);
    assert_eq!(dst.command_calls("asking"), 1, "no ASKING once moved");
    // Still the same term, and the next one's token comes from the moved counter.
    let seen = b.inspect(&r.name).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        seen.map(|s| s.fencing),
        Some(token),
        "same holder, same token"
    );
    assert_eq!(
        b.release(&r.name, &r.holder).await.ok(),
        Some(Released::Released)
    );
    let next = req("moving", "you", Duration::from_secs(30));
    assert_eq!(granted(&b, &next).await.get(), token.get() + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_configs_that_cannot_work_are_refused() {
    for url in ["redis://127.0.0.1:7000/3", "redis+unix:///tmp/redis.sock"] {
        let config = RedisConfig::new(url)
            .unwrap_or_else(|e| panic!("{e}"))
            .cluster();
        let e = RedisBackend::connect(config)
            .await
            .expect_err("refused before connecting");
        assert_eq!(e.kind(), BackendErrorKind::Config, "{e}");
    }
}

/// The ACL the module docs give, plus `+cluster|slots +asking` for the topology: enough on a cluster
/// (locks and group membership); without it the backend refuses to start, saying why, without
/// the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_needs_cluster_slots_on_a_cluster() {
    const PW: &str = "cluster-Pw-41c7";
    let rules = support::DOCUMENTED_ACL_RULES;
    let cluster = RedisCluster::start_with(
        3,
        &support::Options::default()
            .acl_user(&format!("tenure on >{PW} {rules} +cluster|slots +asking"))
            .acl_user(&format!("noslots on >{PW} {rules}")),
    );
    let as_user = |user: &str| {
        RedisConfig::new(&cluster.nodes[0].url_as(user, PW))
            .unwrap_or_else(|e| panic!("{e}"))
            .cluster()
    };
    let b = RedisBackend::connect(as_user("tenure"))
        .await
        .unwrap_or_else(|e| panic!("the documented ACL must be enough: {e}"));
    for i in 0..12 {
        let r = req(&format!("acl-{i}"), "me", Duration::from_secs(5));
        granted(&b, &r).await;
        assert_eq!(
            b.release(&r.name, &r.holder).await.ok(),
            Some(Released::Released)
        );
    }
    // Group membership and the group record too: a group's keys share its slot, its channel
    // crosses the nodes.
    let suite = Suite::new(b.clone()).ttl(Duration::from_secs(1));
    suite.check_membership().await;
    suite.check_group_record().await;
    let e = RedisBackend::connect(as_user("noslots"))
        .await
        .expect_err("no topology without CLUSTER SLOTS");
    let text = e.to_string();
    assert!(!text.contains(PW), "{text}");
    assert_eq!(e.kind(), BackendErrorKind::PermissionDenied, "{text}");
    assert!(
        text.contains("cluster|slots"),
        "names the missing command: {text}"
    );
}
