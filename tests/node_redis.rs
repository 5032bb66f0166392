//! The Helm chart's pods on a real node with the Redis backend (issue #13): a `redis-server`
//! started by the test inside the node's network namespace (on the node's address, an ACL
//! user with the README's rules and a password), `charts/tenure` installed with
//! `backend.type=redis` and the password in a Secret, in a namespace enforcing Pod Security
//! "restricted". As in `tests/node_chart.rs`, every leader's command writes its fencing token
//! to a fenced register outside the pods; the lock's Redis key is watched (polled every
//! 10 ms) for every grant, the scenarios count the writes the register accepted although the
//! key already named a later term (goal: none) and measure each failover against the
//! lease + retry bound.
//!
//! Skipped (with the reason printed) unless `TENURE_NODE_TENURE_BIN` names the static musl
//! tenure and the process runs as root; `scripts/test.sh` sets it up.

mod node_support;

use std::time::{Duration, Instant};

use node_support::chart::{
    Diagnose, LEASE, RENEW, RETRY, SLACK, delete_leader, freeze_tenure, install, instance,
    password_secret, pods, ready_pods, restricted_namespace,
};
use node_support::redis::{RedisServer, RedisWatch};
use node_support::{
    Node, Register, Report, accepted_stale, command_pids, nft, run, secs, skip, takeover,
    tenure_pid, wait_for,
};

const NS: &str = "redis";
const RELEASE: &str = "tenure";
/// The lock's name (the chart's default: the release's full name).
const LOCK: &str = "tenure";
const USER: &str = "tenure";
const PASSWORD: &str = "node-redis-pw-93c7";

/// The release's values besides the tests' timings and writer.
fn extra(redis: &RedisServer) -> Vec<(&'static str, String)> {
    vec![
        ("backend.type", "redis".into()),
        ("backend.redis.url", redis.url()),
        ("backend.redis.username", USER.into()),
        ("backend.redis.passwordSecret.name", "redis-password".into()),
        // The Election resource works with any backend: `kubectl get elections` must agree.
        ("election.publishStatus", "true".into()),
    ]
}

/// Exactly one pod writes, and it is the key's holder with the key's token; `tenure status`
/// and the Election say the same.
fn assert_one_leader(node: &Node, register: &Register, redis: &RedisServer) -> String {
    std::thread::sleep(Duration::from_secs(2));
    let key = redis.holder(LOCK);
    register.assert_sole_writer(&key.holder, Some(key.token), "the Redis key's");
    let status = redis.tenure_status(LOCK);
    assert_eq!(
        status["holder"],
        key.holder.as_str(),
        "tenure status: {status}"
    );
    assert_eq!(status["fencingToken"], key.token, "tenure status: {status}");
    let election = wait_for(
        Duration::from_secs(10),
        "the Election naming the key's holder",
        || {
            let e = run(
                node.kubectl()
                    .args(["get", "election", LOCK, "-n", NS, "-o", "json"]),
                None,
            )
            .json();
            (e["status"]["leader"] == key.holder.as_str()).then_some(e)
        },
    );
    let _ = election;
    key.holder
}

#[test]
fn chart_pods_on_a_real_node_with_redis() {
    if skip("chart_pods_on_a_real_node_with_redis") {
        return;
    }
    let mut report = Report::new("node_redis measurements");
    let node = Node::start();
    report.add(
        "node start (launcher to Ready node)",
        format!("{:.1} s", node.start_secs),
    );
    let register = Register::start(&node);
    let redis = RedisServer::start(&node, USER, PASSWORD);
    let bound = LEASE + RETRY + SLACK;

    // ---- 1. install with the Redis backend into a restricted namespace ---------------------
    restricted_namespace(&node, NS);
    let _diagnose = Diagnose::chart(&node, NS).with_redis(&redis);
    password_secret(&node, NS, "redis-password", PASSWORD);
    let watch = RedisWatch::start(&redis, LOCK);
    let installed = Instant::now();
    install(&node, RELEASE, NS, &register, &extra(&redis));
    let first = wait_for(Duration::from_secs(90), "the first leader's write", || {
        register.first_from_other(installed, "")
    });
    report.add(
        "helm install -> first leading command's write (Redis)",
        secs(first.at - installed),
    );
    let p = ready_pods(&node, NS, &instance(RELEASE), 2, Duration::from_secs(90));
    report.add(
        "helm install -> both pods Ready (Redis)",
        secs(installed.elapsed()),
    );
    assert!(p.iter().all(|p| p.restarts == 0), "no restarts: {p:?}");
    let leader = assert_one_leader(&node, &register, &redis);
    assert!(
        p.iter().any(|p| p.name == leader),
        "the key's holder {leader} is one of the pods: {p:?}"
    );
    // The password reaches tenure only: the pods' command never saw it, and no pod mounts a
    // ServiceAccount token the Redis backend does not need (publishStatus does need one).
    let tpid = tenure_pid(&leader).unwrap_or_else(|| panic!("no tenure process in {leader}"));
    let env = std::fs::read(format!("/proc/{tpid}/environ")).unwrap_or_default();
    assert!(
        env.split(|b| *b == 0)
            .any(|v| v == format!("TENURE_REDIS_PASSWORD={PASSWORD}").as_bytes()),
        "tenure in the pod got the password from the Secret"
    );
    for pid in command_pids(&leader) {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&env).contains(PASSWORD),
            "the command (pid {pid}) has the Redis password in its environment"
        );
    }

    // ---- 2. delete the leader pod ---------------------------------------------------------
    let t = delete_leader(&node, NS, &leader, &register, &watch, bound, &mut report);
    let _ = ready_pods(&node, NS, &instance(RELEASE), 2, Duration::from_secs(60));
    let leader = assert_one_leader(&node, &register, &redis);
    assert_eq!(
        leader, t.new_leader,
        "the replacement pod joined as a follower"
    );

    // ---- 3. freeze tenure in the leader's container ---------------------------------------
    let (t0, t) = freeze_tenure(&leader, &register, &watch, bound, &mut report);
    assert!(t.new_first - t0 <= bound, "failover within lease + retry");
    let _ = ready_pods(&node, NS, &instance(RELEASE), 2, Duration::from_secs(60));
    let leader = assert_one_leader(&node, &register, &redis);
    assert_eq!(leader, t.new_leader);

    // ---- 4. partition the leader pod from Redis -------------------------------------------
    // nftables in the pod's network namespace drops what it sends to Redis's port (the
    // register, on another port of the same address, stays reachable: the command's writes
    // show when it stops).
    let tpid = tenure_pid(&leader).unwrap_or_else(|| panic!("no tenure in {leader}"));
    let rules = format!(
        "table inet partition {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n    \
         ip daddr {} tcp dport {} drop\n  }}\n}}\n",
        node_support::NODE_IP,
        redis.port
    );
    let t0 = Instant::now();
    nft(tpid, &["-f", "-"], Some(&rules));
    let t = takeover(
        &register,
        &watch,
        t0,
        &leader,
        bound + RENEW + Duration::from_secs(5),
    );
    report.add(
        "failover, leader partitioned from Redis (partition -> successor's first write)",
        secs(t.new_first - t0),
    );
    let old_last = t.old_last.unwrap_or(t0);
    report.add(
        "  partitioned leader's last write after the partition",
        secs(old_last.saturating_duration_since(t0)),
    );
    assert!(
        t.new_first - t0 <= bound,
        "the successor leads within lease + retry of the partition"
    );
    // Its last renewal was at most a renew period before the partition: the renew deadline
    // falls at most RENEW after it, and the command stops then.
    assert!(
        old_last <= t0 + RENEW + Duration::from_millis(1000),
        "the partitioned leader's command wrote {:?} after the partition (renew deadline {RENEW:?})",
        old_last - t0
    );
    assert!(
        old_last < t.granted,
        "the partitioned leader's command wrote after the successor's grant"
    );
    nft(tpid, &["delete", "table", "inet", "partition"], None);
    std::thread::sleep(LEASE);
    let healed = assert_one_leader(&node, &register, &redis);
    assert_eq!(
        healed, t.new_leader,
        "after healing the successor still leads alone"
    );
    let _ = ready_pods(&node, NS, &instance(RELEASE), 2, Duration::from_secs(60));

    let stale = accepted_stale(&register, &watch);
    report.add(
        "accepted stale writes (all scenarios, Redis)",
        stale.len().to_string(),
    );
    assert!(stale.is_empty(), "stale writes accepted: {stale:?}");
    report.add(
        "refused (stale) write attempts, all scenarios (Redis)",
        register.refused().to_string(),
    );

    // ---- 5. the pods stop: the lock is released, nobody holds it ---------------------------
    run(
        node.kubectl()
            .args(["scale", "deployment", RELEASE, "-n", NS, "--replicas=0"]),
        None,
    )
    .expect_ok();
    // Gone, not only being deleted: the leader releases the lock as it stops.
    wait_for(Duration::from_secs(60), "the pods gone", || {
        pods(&node, NS, &instance(RELEASE)).is_empty().then_some(())
    });
    let key = redis.holder(LOCK);
    assert_eq!(
        key.holder, "",
        "{healed} still holds the Redis lock after its pod stopped"
    );
    run(
        node.helm().args([
            "uninstall",
            RELEASE,
            "-n",
            NS,
            "--wait",
            "--timeout",
            "120s",
        ]),
        None,
    )
    .expect_ok();
    drop(watch);
    report.print();
}
