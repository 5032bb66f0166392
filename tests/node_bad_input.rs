//! Bad input to the Helm chart's pods on a real node (issue #13, "Bad input"): a missing
//! image, a wrong Redis password in the Secret, a Role without `update` on leases. For each,
//! what the user sees is checked where they would look — the pod's status (`kubectl get
//! pods`, `kubectl describe`: waiting reason, last state, exit code) and its log (`kubectl
//! logs [--previous]`: tenure's one-line error) — and, with a fenced register outside the
//! pods, that the replica which can still lead keeps leading: the same pod's writes go on,
//! nobody else's are accepted, the store names no other holder.
//!
//! Skipped (with the reason printed) unless `TENURE_NODE_TENURE_BIN` names the static musl
//! tenure and the process runs as root; `scripts/test.sh` sets it up.

mod node_support;

use std::time::{Duration, Instant};

use node_support::chart::{
    Diagnose, LEASE, PodInfo, RETRY, SLACK, install, instance, logs, password_secret, pods,
    ready_pods, release_pods, restricted_namespace,
};
use node_support::redis::{RedisServer, RedisWatch};
use node_support::{LeaseWatch, Node, Register, Report, accepted_stale, run, secs, skip, wait_for};

const USER: &str = "tenure";
const PASSWORD: &str = "node-bad-input-pw-41af";
const WRONG_PASSWORD: &str = "not-the-pw-7be2";

/// tenure's exit code when the backend cannot be used: unreachable, credentials,
/// permissions (README "Run any command as a singleton", `tenure run --help`).
const EXIT_BACKEND: i64 = 4;

/// The exit code, reason and log of the worker container's first terminated run in `pod`,
/// once the kubelet has restarted it (`lastState.terminated`, `kubectl logs --previous`: the
/// current run's state and log would race with the restart).
fn last_failure(node: &Node, ns: &str, pod: &str) -> Option<(i64, String, String)> {
    let p = pods(node, ns, "").into_iter().find(|p| p.name == pod)?;
    let c = p.container("worker")?;
    let (code, reason) = c.last_terminated.clone()?;
    let log = logs(node, ns, pod, "worker", true);
    println!("{pod}: worker {c:?}; kubectl logs --previous:\n{log}");
    Some((code, reason, log))
}

/// tenure's error in a container log: exactly one line `tenure: ...`, the last one, no panic,
/// none of `secrets`; every one of `names` in it. Returns the line.
fn one_line_error<'a>(log: &'a str, names: &[&str], secrets: &[&str]) -> &'a str {
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("tenure: ")).collect();
    assert_eq!(
        errors.len(),
        1,
        "one `tenure: ` error line in the log:\n{log}"
    );
    let last = log.lines().rev().find(|l| !l.trim().is_empty());
    assert_eq!(
        last,
        Some(errors[0]),
        "the error is the log's last line:\n{log}"
    );
    assert!(
        !log.contains("panicked") && !log.contains("RUST_BACKTRACE"),
        "a panic in the log:\n{log}"
    );
    for s in secrets {
        assert!(!log.contains(s), "the log shows a password:\n{log}");
    }
    assert!(
        !errors[0].contains("Status {"),
        "a struct dumped in the error: {}",
        errors[0]
    );
    for n in names {
        assert!(
            errors[0].to_lowercase().contains(&n.to_lowercase()),
            "the error does not name {n:?}: {}",
            errors[0]
        );
    }
    errors[0]
}

/// Waits for the pod's worker to be in CrashLoopBackOff after a run that ended with `code`.
fn crash_loop(node: &Node, ns: &str, pod: &str, code: i64, timeout: Duration) -> PodInfo {
    wait_for(
        timeout,
        &format!("{pod} in CrashLoopBackOff after exit code {code}"),
        || {
            let p = pods(node, ns, "").into_iter().find(|p| p.name == pod)?;
            let c = p.container("worker")?;
            (c.waiting.as_deref() == Some("CrashLoopBackOff")
                && c.last_terminated.as_ref().is_some_and(|(c, _)| *c == code))
            .then_some(p)
        },
    )
}

/// The Redis leader and what shows it keeps leading through a fault.
struct Kept<'a> {
    register: &'a Register,
    watch: &'a RedisWatch,
    redis: &'a RedisServer,
    lock: &'a str,
    leader: &'a str,
}

impl Kept<'_> {
    /// Since `t`: only the leader wrote, every write accepted; the key named no other holder
    /// and still names the leader; its writes never paused for a lease. `what` labels the
    /// report's row, `when` the failures.
    fn check(&self, t: Instant, what: &str, when: &str, report: &mut Report) {
        let during = self.register.since(t);
        assert!(
            during.iter().all(|w| w.pod == self.leader && w.accepted),
            "writes from another pod, or refused ones, {when}: {during:?}"
        );
        assert_eq!(
            self.watch.holders_since(t),
            Vec::<String>::new(),
            "the key named another holder {when}"
        );
        assert_eq!(
            self.redis.holder(self.lock).holder,
            self.leader,
            "the leader changed"
        );
        let gap = self.register.longest_gap(t, Instant::now());
        report.add(
            &format!("{what}: longest gap between the leader's writes"),
            secs(gap),
        );
        assert!(gap < LEASE, "the leader's writes paused for {gap:?}");
    }
}

#[test]
fn bad_input_on_a_real_node() {
    if skip("bad_input_on_a_real_node") {
        return;
    }
    let mut report = Report::new("node_bad_input measurements");
    let node = Node::start();
    report.add(
        "node start (launcher to Ready node)",
        format!("{:.1} s", node.start_secs),
    );
    redis_bad_input(&node, &mut report);
    rbac_without_update(&node, &mut report);
    report.print();
}

/// (a) a missing image on `helm upgrade`, (b) a wrong Redis password in the Secret, both on
/// a running Redis release whose leader must keep leading.
fn redis_bad_input(node: &Node, report: &mut Report) {
    let ns = "bad-redis";
    let release = "rd";
    let lock = "rd";
    let register = Register::start(node);
    let redis = RedisServer::start(node, USER, PASSWORD);
    restricted_namespace(node, ns);
    let _diagnose = Diagnose::chart(node, ns).with_redis(&redis);
    password_secret(node, ns, "rd-password", PASSWORD);
    let watch = RedisWatch::start(&redis, lock);
    install(
        node,
        release,
        ns,
        &register,
        &[
            ("backend.type", "redis".into()),
            ("backend.redis.url", redis.url()),
            ("backend.redis.username", USER.into()),
            ("backend.redis.passwordSecret.name", "rd-password".into()),
            ("election.lease", lock.into()),
        ],
    );
    let original = ready_pods(node, ns, &instance(release), 2, Duration::from_secs(120));
    std::thread::sleep(Duration::from_secs(2));
    let leader = redis.holder(lock).holder;
    register.assert_sole_writer(&leader, None, "the Redis key's");

    // ---- (a) a missing image -------------------------------------------------------------
    // `helm upgrade` to a tenure image tag that is not on the node. The chart's pullPolicy is
    // IfNotPresent, so the kubelet tries to pull it (this node has no way out): the new pod's
    // init container waits in ErrImagePull / ImagePullBackOff, naming the image. The rolling
    // update (25 % surge and unavailability of 2 replicas: one more pod, none taken away)
    // keeps both old pods, and the leader keeps leading.
    // What a user sees: `kubectl get pods` shows the new pod `Init:ImagePullBackOff` (or
    // `Init:ErrImagePull`), `kubectl describe pod` the pull error for tenure:0.0.0-missing;
    // the old pods stay Running and the lock's holder does not change.
    let t_a = Instant::now();
    run(
        node.helm().args([
            "upgrade",
            release,
            &node_support::chart().display().to_string(),
            "-n",
            ns,
            "--reuse-values",
            "--set",
            "tenure.image.tag=0.0.0-missing",
        ]),
        None,
    )
    .expect_ok();
    let (stuck, reason, message) = wait_for(
        Duration::from_secs(120),
        "a new pod waiting for its missing image",
        || {
            release_pods(node, ns, release)
                .into_iter()
                .filter(|p| !original.iter().any(|o| o.name == p.name))
                .find_map(|p| {
                    let c = p.init.iter().find(|c| c.name == "tenure-install")?.clone();
                    let reason = c.waiting.clone()?;
                    ["ErrImagePull", "ImagePullBackOff"]
                        .contains(&reason.as_str())
                        .then(|| (p, reason, c.waiting_message.clone()))
                })
        },
    );
    report.add(
        "missing image: the new pod's init container waits with",
        reason.clone(),
    );
    assert!(
        message.contains("tenure:0.0.0-missing"),
        "the pod's status names the missing image: {message}"
    );
    assert!(!stuck.ready && stuck.phase == "Pending", "{stuck:?}");
    // Some more seconds of the stuck rollout.
    std::thread::sleep(LEASE);
    let now = release_pods(node, ns, release);
    for o in &original {
        assert!(
            now.iter().any(|p| p.name == o.name && p.ready),
            "the rollout took away {} although the new pod cannot start: {now:?}",
            o.name
        );
    }
    let kept = Kept {
        register: &register,
        watch: &watch,
        redis: &redis,
        lock,
        leader: &leader,
    };
    kept.check(t_a, "missing image", "while the image was missing", report);
    // Back to the first revision: the stuck pod goes, the old ones stay.
    run(node.helm().args(["rollback", release, "1", "-n", ns]), None).expect_ok();
    wait_for(
        Duration::from_secs(60),
        "the stuck pod gone after the rollback",
        || {
            let p = release_pods(node, ns, release);
            (p.len() == 2 && p.iter().all(|p| original.iter().any(|o| o.name == p.name)))
                .then_some(())
        },
    );

    // ---- (b) a wrong Redis password in the Secret ----------------------------------------
    // The Secret is changed to a wrong password and the follower's pod is replaced (as a
    // password rotation gone wrong, or a node drain, would do). The new pod's tenure is
    // refused by Redis before it campaigns: one line on stderr, exit code 4; the kubelet
    // restarts it into CrashLoopBackOff. The leader, authenticated before, keeps leading.
    // What a user sees: `kubectl get pods` shows the new pod `CrashLoopBackOff` (or `Error`),
    // `kubectl describe pod`: Last State Terminated, Reason Error, Exit Code 4, and
    // `kubectl logs --previous` one line: `tenure: ... authentication failed ...`, without
    // the password.
    let follower = original
        .iter()
        .find(|p| p.name != leader)
        .map(|p| p.name.clone())
        .unwrap_or_else(|| panic!("no follower among {original:?}"));
    password_secret(node, ns, "rd-password", WRONG_PASSWORD);
    let t_b = Instant::now();
    run(
        node.kubectl()
            .args(["delete", "pod", "-n", ns, &follower, "--wait=false"]),
        None,
    )
    .expect_ok();
    let replacement = wait_for(
        Duration::from_secs(60),
        "the follower's replacement",
        || {
            release_pods(node, ns, release)
                .into_iter()
                .find(|p| p.name != leader && p.name != follower)
        },
    );
    let (code, reason, log) = wait_for(
        Duration::from_secs(90),
        "the replacement's tenure to exit",
        || last_failure(node, ns, &replacement.name),
    );
    report.add(
        "wrong Redis password: exit code, reason",
        format!("{code}, {reason}"),
    );
    let line = one_line_error(&log, &["auth"], &[WRONG_PASSWORD, PASSWORD]);
    println!("wrong Redis password, the pod's log: {line}");
    assert_eq!(code, EXIT_BACKEND, "exit code of a refused password");
    assert_eq!(reason, "Error");
    assert_eq!(
        log.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "nothing but the error in the log:\n{log}"
    );
    let looping = crash_loop(
        node,
        ns,
        &replacement.name,
        EXIT_BACKEND,
        Duration::from_secs(90),
    );
    assert!(!looping.ready, "{looping:?}");
    kept.check(
        t_b,
        "wrong Redis password",
        "after the wrong password",
        report,
    );
    // With the right password back, the next pod joins as a follower: the password was all
    // that was wrong.
    password_secret(node, ns, "rd-password", PASSWORD);
    run(
        node.kubectl()
            .args(["delete", "pod", "-n", ns, &replacement.name, "--wait=false"]),
        None,
    )
    .expect_ok();
    let _ = ready_pods(node, ns, &instance(release), 2, Duration::from_secs(90));
    std::thread::sleep(Duration::from_secs(2));
    register.assert_sole_writer(&leader, None, "the Redis key's");
    let stale = accepted_stale(&register, &watch);
    report.add(
        "accepted stale writes (Redis bad input)",
        stale.len().to_string(),
    );
    assert!(stale.is_empty(), "stale writes accepted: {stale:?}");
    run(node.helm().args(["uninstall", release, "-n", ns]), None).expect_ok();
}

/// (c) a Role without `update` on leases (Kubernetes backend).
///
/// Two releases campaign for one Lease `shared`: `keeper` with the chart's Role, and
/// `readonly` whose ServiceAccount has every permission tenure needs but `update` on leases
/// (`rbac.create=false` and a Role of the test's). What a user sees:
/// - at once, before any campaign: tenure asks the API server what it may do with the Lease
///   (SelfSubjectAccessReview) and refuses to start without `update`. `kubectl logs
///   --previous` shows one line, `tenure: kube namespace ...: this user may not update lease
///   "shared" ...`, `kubectl describe pod` Last State Terminated, Reason Error, Exit Code 4,
///   and the pod goes into CrashLoopBackOff — instead of following quietly until the day it
///   has to take over;
/// - the replica with the permission keeps leading through those restarts, and the Lease never
///   names the crash-looping candidate, not even while it is free;
/// - when the leader's own Role loses `update`, its next renewal is refused: it stops its
///   command at once (well before its lease would run out) and exits 4 naming the verb.
fn rbac_without_update(node: &Node, report: &mut Report) {
    let ns = "bad-rbac";
    let lease = "shared";
    let register = Register::start(node);
    restricted_namespace(node, ns);
    let _diagnose = Diagnose::chart(node, ns);
    let role = serde_json::json!({
        "apiVersion": "v1", "kind": "List", "items": [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "readonly-leases", "namespace": ns},
                "rules": [
                    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                     "resourceNames": [lease], "verbs": ["get", "list", "watch"]},
                    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                     "verbs": ["create"]},
                    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "readonly-leases", "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                            "name": "readonly-leases"},
                "subjects": [{"kind": "ServiceAccount", "name": "readonly", "namespace": ns}],
            },
        ]
    });
    run(
        node.kubectl().args(["apply", "-f", "-"]),
        Some(&role.to_string()),
    )
    .expect_ok();

    // keeper leads.
    install(
        node,
        "keeper",
        ns,
        &register,
        &[
            ("replicaCount", "1".into()),
            ("election.lease", lease.into()),
        ],
    );
    let watch = LeaseWatch::start(node, ns, lease);
    let keeper = ready_pods(node, ns, &instance("keeper"), 1, Duration::from_secs(120))
        .remove(0)
        .name;
    wait_for(Duration::from_secs(30), "keeper's first write", || {
        register.last_from(&keeper)
    });

    // readonly is refused at start, naming the permission, and crash-loops.
    let t_c = Instant::now();
    install(
        node,
        "readonly",
        ns,
        &register,
        &[
            ("replicaCount", "1".into()),
            ("election.lease", lease.into()),
            ("rbac.create", "false".into()),
            ("serviceAccount.name", "readonly".into()),
        ],
    );
    let readonly = wait_for(Duration::from_secs(120), "readonly's pod", || {
        release_pods(node, ns, "readonly").into_iter().next()
    });
    let (code, reason, log) =
        wait_for(Duration::from_secs(60), "readonly's tenure to exit", || {
            last_failure(node, ns, &readonly.name)
        });
    report.add(
        "Role without update: exit code, reason (at start, while another leads)",
        format!("{code}, {reason} after {}", secs(t_c.elapsed())),
    );
    let line = one_line_error(
        &log,
        &[
            &format!("may not update lease \"{lease}\""),
            "grant them with a Role",
        ],
        &[],
    );
    println!("Role without update, the pod's log: {line}");
    assert_eq!(code, EXIT_BACKEND, "exit code of a missing permission");
    assert_eq!(reason, "Error");
    let _ = crash_loop(
        node,
        ns,
        &readonly.name,
        EXIT_BACKEND,
        Duration::from_secs(90),
    );
    register.assert_sole_writer(&keeper, None, "the Lease's");
    let gap = register.longest_gap(t_c, Instant::now());
    report.add(
        "Role without update: longest gap between keeper's writes during readonly's restarts",
        secs(gap),
    );
    assert!(gap < LEASE, "keeper's writes paused for {gap:?}");

    // The Lease becomes free (keeper's only pod stops and releases it): readonly, restarting,
    // never takes it.
    run(
        node.kubectl().args([
            "scale",
            "deployment",
            "keeper-tenure",
            "-n",
            ns,
            "--replicas=0",
        ]),
        None,
    )
    .expect_ok();
    wait_for(Duration::from_secs(60), "keeper's pod gone", || {
        release_pods(node, ns, "keeper").is_empty().then_some(())
    });
    std::thread::sleep(LEASE + RETRY);
    assert!(
        watch.snapshot().iter().all(|e| e.holder != readonly.name),
        "the Lease named the candidate without update: {:?}",
        watch.snapshot()
    );
    assert!(
        register.last_from(&readonly.name).is_none(),
        "the candidate without update ran its command"
    );

    // keeper comes back and takes the Lease.
    let t_d = Instant::now();
    run(
        node.kubectl().args([
            "scale",
            "deployment",
            "keeper-tenure",
            "-n",
            ns,
            "--replicas=1",
        ]),
        None,
    )
    .expect_ok();
    let first = wait_for(
        Duration::from_secs(90),
        "the new keeper's first write",
        || register.first_from_other(t_d, ""),
    );
    let keeper = first.pod.clone();
    assert!(keeper.starts_with("keeper-"), "{keeper} leads");
    report.add(
        "Role without update: keeper scaled up -> its first write",
        secs(first.at - t_d),
    );
    std::thread::sleep(Duration::from_secs(3));
    let since = register.since(first.at);
    assert!(
        since.iter().all(|w| w.pod == keeper && w.accepted),
        "another writer, or a refused write, while keeper led: {since:?}"
    );

    // keeper's own Role loses update: the leader's next renewal is refused.
    let t_e = Instant::now();
    run(
        node.kubectl().args([
            "patch",
            "role",
            "keeper-tenure",
            "-n",
            ns,
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/rules/0/verbs","value":["get","list","watch"]}]"#,
        ]),
        None,
    )
    .expect_ok();
    let (code, reason, log) = wait_for(Duration::from_secs(60), "keeper's tenure to exit", || {
        last_failure(node, ns, &keeper)
    });
    let last_write = register.last_from(&keeper).map(|w| w.at).unwrap_or(t_e);
    report.add(
        "leader's Role lost update: its command's last write after the patch",
        secs(last_write.saturating_duration_since(t_e)),
    );
    report.add(
        "leader's Role lost update: exit code, reason",
        format!("{code}, {reason} after {}", secs(t_e.elapsed())),
    );
    // The refused renewal's line (or, if the kubelet restarted the container before this
    // look, the start check's): one line naming the verb.
    let line = one_line_error(&log, &["update", "lease"], &[]);
    println!("leader's Role lost update, the pod's log: {line}");
    assert!(
        line.matches("cannot update resource").count() == 1
            || line.contains("may not update lease"),
        "the API server's message once, or the start check's: {line}"
    );
    assert_eq!(code, EXIT_BACKEND);
    // The first refused renewal comes a renew period (a third of the lease) after the last
    // good one at most; the command stops then, not at the renew deadline or later.
    assert!(
        last_write <= t_e + LEASE / 3 + SLACK,
        "the leader's command wrote {:?} after its Role lost update",
        last_write - t_e
    );
    let after = register.since(last_write + Duration::from_millis(1));
    assert!(
        after.iter().all(|w| !w.accepted),
        "a write accepted after the leader stopped: {after:?}"
    );
    let stale = accepted_stale(&register, &watch);
    report.add(
        "accepted stale writes (Role without update)",
        stale.len().to_string(),
    );
    assert!(stale.is_empty(), "stale writes accepted: {stale:?}");
    for r in ["keeper", "readonly"] {
        run(node.helm().args(["uninstall", r, "-n", ns]), None).expect_ok();
    }
    drop(watch);
}
