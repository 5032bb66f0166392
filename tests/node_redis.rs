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

use node_support::redis::{
    Diagnose, RedisServer, RedisWatch, Report, accepted_stale, password_secret, pods, ready_pods,
    restricted_namespace, secs, sets, writer_command, writers,
};
use node_support::{Node, Register, command_pids, run, skip, tenure_pid, wait_for};

/// The same timings as `tests/node_chart.rs`: short, so failovers are quick.
const LEASE: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);
/// Room above lease + retry for a loaded 2-core machine (the same as node_chart's).
const SLACK: Duration = Duration::from_millis(2500);

const NS: &str = "redis";
const RELEASE: &str = "tenure";
/// The lock's name (the chart's default: the release's full name).
const LOCK: &str = "tenure";
const USER: &str = "tenure";
const PASSWORD: &str = "node-redis-pw-93c7";

fn install_args(register: &Register, redis: &RedisServer) -> Vec<String> {
    let mut args = vec![
        "install".to_owned(),
        RELEASE.into(),
        node_support::chart().display().to_string(),
        "-n".into(),
        NS.into(),
    ];
    args.extend(sets(&[
        ("backend.type", "redis".into()),
        ("backend.redis.url", redis.url()),
        ("backend.redis.username", USER.into()),
        ("backend.redis.passwordSecret.name", "redis-password".into()),
        ("election.leaseDuration", format!("{}s", LEASE.as_secs())),
        ("election.renewDeadline", format!("{}s", RENEW.as_secs())),
        ("election.retryPeriod", format!("{}s", RETRY.as_secs())),
        ("election.grace", "1s".into()),
        // The Election resource works with any backend: `kubectl get elections` must agree.
        ("election.publishStatus", "true".into()),
        ("readinessProbe.periodSeconds", "2".into()),
    ]));
    args.extend([
        "--set-json".into(),
        format!("command={}", writer_command(register)),
    ]);
    args
}

/// Exactly one pod writes, and it is the key's holder with the key's token; `tenure status`
/// and the Election say the same.
fn assert_one_leader(node: &Node, register: &Register, redis: &RedisServer) -> String {
    std::thread::sleep(Duration::from_secs(2));
    let key = redis.holder(LOCK);
    let w = writers(register, Duration::from_millis(1500));
    assert_eq!(
        w,
        vec![key.holder.clone()],
        "one writer, the Redis key's holder"
    );
    let last = register
        .last_from(&key.holder)
        .unwrap_or_else(|| panic!("no write"));
    assert_eq!(
        last.token, key.token,
        "the command's TENURE_FENCING_TOKEN is the key's"
    );
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

/// A takeover: when the key named the successor, the old leader's last write, the
/// successor's first.
struct Takeover {
    granted: Instant,
    old_last: Option<Instant>,
    new_first: Instant,
    new_leader: String,
}

fn takeover(
    register: &Register,
    watch: &RedisWatch,
    since: Instant,
    old: &str,
    within: Duration,
) -> Takeover {
    let new = wait_for(within, "a write from a new leader", || {
        register.first_from_other(since, old)
    });
    let granted = wait_for(Duration::from_secs(5), "the grant in the Redis key", || {
        watch.granted_after(since, old)
    });
    Takeover {
        granted: granted.at,
        old_last: register.last_from(old).map(|w| w.at),
        new_first: new.at,
        new_leader: new.pod,
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid we looked up.
    let rc = unsafe { libc::kill(pid as i32, sig) };
    assert_eq!(rc, 0, "kill {pid}: {}", std::io::Error::last_os_error());
}

#[test]
fn chart_pods_on_a_real_node_with_redis() {
    if skip("chart_pods_on_a_real_node_with_redis") {
        return;
    }
    let mut report = Report::new("node_redis");
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
    let _diagnose = Diagnose {
        node: &node,
        ns: NS,
        redis: Some(&redis),
    };
    password_secret(&node, NS, "redis-password", PASSWORD);
    let watch = RedisWatch::start(&redis, LOCK);
    let installed = Instant::now();
    run(node.helm().args(install_args(&register, &redis)), None).expect_ok();
    let first = wait_for(Duration::from_secs(90), "the first leader's write", || {
        register.first_from_other(installed, "")
    });
    report.add(
        "helm install -> first leading command's write (Redis)",
        secs(first.at - installed),
    );
    let p = ready_pods(&node, NS, RELEASE, 2, Duration::from_secs(90));
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
    let t0 = Instant::now();
    run(
        node.kubectl()
            .args(["delete", "pod", "-n", NS, &leader, "--wait=false"]),
        None,
    )
    .expect_ok();
    let t = takeover(
        &register,
        &watch,
        t0,
        &leader,
        bound + Duration::from_secs(5),
    );
    report.add(
        "failover, leader pod deleted (delete -> successor's first write)",
        secs(t.new_first - t0),
    );
    assert!(t.new_first - t0 <= bound, "failover within lease + retry");
    assert!(
        t.old_last.is_none_or(|l| l < t.granted),
        "the old command wrote after the successor's grant"
    );
    let _ = ready_pods(&node, NS, RELEASE, 2, Duration::from_secs(60));
    let leader = assert_one_leader(&node, &register, &redis);
    assert_eq!(
        leader, t.new_leader,
        "the replacement pod joined as a follower"
    );

    // ---- 3. freeze tenure in the leader's container ---------------------------------------
    let tpid = tenure_pid(&leader).unwrap_or_else(|| panic!("no tenure in {leader}"));
    assert!(
        !command_pids(&leader).is_empty(),
        "the leader's command runs before the freeze"
    );
    let t0 = Instant::now();
    signal(tpid, libc::SIGSTOP);
    let t = takeover(
        &register,
        &watch,
        t0,
        &leader,
        bound + Duration::from_secs(5),
    );
    let killed = command_pids(&leader).is_empty();
    signal(tpid, libc::SIGCONT);
    report.add(
        "failover, tenure frozen (SIGSTOP -> successor's first write)",
        secs(t.new_first - t0),
    );
    let old_last = t.old_last.unwrap_or(t0);
    report.add(
        "  frozen leader's last write before the successor's grant by",
        secs(t.granted.saturating_duration_since(old_last)),
    );
    assert!(t.new_first - t0 <= bound, "failover within lease + retry");
    assert!(
        old_last < t.granted,
        "the frozen leader's command wrote after the successor's grant"
    );
    assert!(
        killed,
        "the frozen tenure's command still runs after the successor leads"
    );
    let _ = ready_pods(&node, NS, RELEASE, 2, Duration::from_secs(60));
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
    let nft = |args: &[&str], input: Option<&str>| {
        run(
            std::process::Command::new("nsenter")
                .args(["-t", &tpid.to_string(), "-n", "--", "nft"])
                .args(args),
            input,
        )
        .expect_ok()
    };
    let t0 = Instant::now();
    nft(&["-f", "-"], Some(&rules));
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
    nft(&["delete", "table", "inet", "partition"], None);
    std::thread::sleep(LEASE);
    let healed = assert_one_leader(&node, &register, &redis);
    assert_eq!(
        healed, t.new_leader,
        "after healing the successor still leads alone"
    );
    let _ = ready_pods(&node, NS, RELEASE, 2, Duration::from_secs(60));

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
        pods(&node, NS)
            .iter()
            .all(|p| p.instance != RELEASE)
            .then_some(())
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
