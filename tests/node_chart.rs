//! The Helm chart's pods on a real node (issue #13): `charts/tenure` installed with helm into
//! a single-node Kubernetes (`e2e/node`) whose containerd runs the repository's own image
//! (built from the Dockerfile with buildah, offline) and busybox as the workload. Every
//! leader's command writes its fencing token to a fenced register outside the pods (an HTTP
//! endpoint of this process on the node's network); the scenarios count the writes the
//! register accepted although the Lease already named a later term (goal: none) and measure
//! each failover against the lease + retry bound.
//!
//! Skipped (with the reason printed) unless `TENURE_NODE_TENURE_BIN` names the static musl
//! tenure and the process runs as root; `scripts/test.sh` sets it up.

mod node_support;

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use node_support::{
    LeaseWatch, Node, Register, accepted_stale, command_pids, pod_processes, rss_kib, run, skip,
    tenure_pid, wait_for,
};
use serde_json::Value;

/// Timings of the tests' releases: short, so failovers are quick; the chart's checks hold.
const LEASE: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);
/// Room above lease + retry for a loaded 2-core machine (watch and HTTP latencies, a
/// command's 100 ms write period).
const SLACK: Duration = Duration::from_millis(2500);

/// One node at a time in this process.
static NODE_LOCK: Mutex<()> = Mutex::new(());

/// The measurements, printed as a table at the end.
#[derive(Default)]
struct Report {
    rows: Vec<(String, String)>,
}

impl Report {
    fn add(&mut self, what: &str, value: String) {
        println!("MEASURED {what}: {value}");
        self.rows.push((what.to_owned(), value));
    }

    fn print(&self) {
        let width = self.rows.iter().map(|(w, _)| w.len()).max().unwrap_or(0);
        let mut s = String::from("\n== node_chart measurements\n");
        for (w, v) in &self.rows {
            let _ = writeln!(s, "| {w:<width$} | {v} |");
        }
        println!("{s}");
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// A namespace enforcing Pod Security "restricted".
fn restricted_namespace(node: &Node, name: &str) {
    let ns = serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }}
    });
    run(
        node.kubectl().args(["apply", "-f", "-"]),
        Some(&ns.to_string()),
    )
    .expect_ok();
}

/// The workload: send this term's token to the register every 100 ms (busybox `nc`: the
/// `wget` of Debian's busybox-static crashes).
fn writer_command(register: &Register) -> String {
    serde_json::json!([
        "sh",
        "-c",
        format!(
            "while true; do printf 'GET /w?pod=%s&token=%s HTTP/1.0\\r\\n\\r\\n' \"$TENURE_IDENTITY\" \"$TENURE_FENCING_TOKEN\" | nc -w 2 {} {} >/dev/null; sleep 0.1; done",
            node_support::NODE_IP,
            register.port
        )
    ])
    .to_string()
}

/// On a panic, what the namespace looks like (pods, events, logs).
struct Diagnose<'a> {
    node: &'a Node,
    ns: &'a str,
}

impl Drop for Diagnose<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for args in [
            &["get", "pods", "-o", "wide"][..],
            &["get", "events", "--sort-by=.lastTimestamp"][..],
            &[
                "logs",
                "-l",
                "app.kubernetes.io/name=tenure",
                "--all-containers",
                "--prefix",
                "--tail=30",
            ][..],
        ] {
            let out = run(self.node.kubectl().args(args).args(["-n", self.ns]), None);
            eprintln!(
                "--- kubectl {}:\n{}{}",
                args.join(" "),
                out.stdout,
                out.stderr
            );
        }
    }
}

/// `helm install` (or upgrade) args shared by the scenarios.
fn values(register: &Register) -> Vec<String> {
    vec![
        "--set".into(),
        format!("election.leaseDuration={}s", LEASE.as_secs()),
        "--set".into(),
        format!("election.renewDeadline={}s", RENEW.as_secs()),
        "--set".into(),
        format!("election.retryPeriod={}s", RETRY.as_secs()),
        "--set".into(),
        "election.grace=1s".into(),
        "--set".into(),
        "election.publishStatus=true".into(),
        "--set".into(),
        "readinessProbe.periodSeconds=2".into(),
        "--set-json".into(),
        format!("command={}", writer_command(register)),
    ]
}

#[derive(Debug, Clone)]
struct PodInfo {
    name: String,
    uid: String,
    phase: String,
    ready: bool,
    restarts: u64,
    deleting: bool,
}

fn pods(node: &Node, ns: &str) -> Vec<PodInfo> {
    let list = run(
        node.kubectl().args(["get", "pods", "-n", ns, "-o", "json"]),
        None,
    )
    .json();
    list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let statuses = p["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            PodInfo {
                name: p["metadata"]["name"].as_str().unwrap_or_default().into(),
                uid: p["metadata"]["uid"].as_str().unwrap_or_default().into(),
                phase: p["status"]["phase"].as_str().unwrap_or_default().into(),
                ready: p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                }),
                restarts: statuses
                    .iter()
                    .map(|s| s["restartCount"].as_u64().unwrap_or(0))
                    .sum(),
                deleting: !p["metadata"]["deletionTimestamp"].is_null(),
            }
        })
        .collect()
}

/// (holder, fencing token) of the Lease.
fn lease(node: &Node, ns: &str, name: &str) -> (String, u64) {
    let out = run(
        node.kubectl()
            .args(["get", "lease", name, "-n", ns, "-o", "json"]),
        None,
    );
    if !out.ok {
        return (String::new(), 0);
    }
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_default();
    (
        v["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .into(),
        v["metadata"]["annotations"]["tenure.dev/fencing"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0),
    )
}

/// Waits until `n` pods are Running and Ready (none being deleted) and returns them.
fn ready_pods(node: &Node, ns: &str, n: usize, timeout: Duration) -> Vec<PodInfo> {
    wait_for(timeout, &format!("{n} Ready pods in {ns}"), || {
        let p: Vec<PodInfo> = pods(node, ns).into_iter().filter(|p| !p.deleting).collect();
        (p.len() == n && p.iter().all(|p| p.phase == "Running" && p.ready)).then_some(p)
    })
}

/// The pods whose writes the register accepted in the last `window`.
fn writers(register: &Register, window: Duration) -> Vec<String> {
    let mut w: Vec<String> = register
        .since(Instant::now() - window)
        .into_iter()
        .filter(|w| w.accepted)
        .map(|w| w.pod)
        .collect();
    w.sort();
    w.dedup();
    w
}

/// Exactly one pod writes, and it is the Lease's holder with the Lease's token.
fn assert_one_leader(node: &Node, ns: &str, lease_name: &str, register: &Register) -> String {
    std::thread::sleep(Duration::from_secs(2));
    let (holder, token) = lease(node, ns, lease_name);
    let w = writers(register, Duration::from_millis(1500));
    assert_eq!(w, vec![holder.clone()], "one writer, the Lease's holder");
    let last = register
        .last_from(&holder)
        .unwrap_or_else(|| panic!("no write"));
    assert_eq!(
        last.token, token,
        "the command's TENURE_FENCING_TOKEN is the Lease's"
    );
    holder
}

/// GET http://127.0.0.1:PORT/PATH; reads by Content-Length (through a port-forward the
/// server's close does not always reach this end).
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{BufRead, Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut r = std::io::BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).ok()?;
    let code = status.split_whitespace().nth(1)?.parse().ok()?;
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        if h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some((code, String::from_utf8_lossy(&body).into_owned()))
}

/// `kubectl port-forward pod/POD :9090` and GET PATH through it.
fn through_port_forward(node: &Node, ns: &str, pod: &str, path: &str) -> (u16, String) {
    let mut child = node
        .kubectl()
        .args(["port-forward", "-n", ns, &format!("pod/{pod}"), ":9090"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("port-forward: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("stdout"));
    let mut reader = std::io::BufReader::new(stdout);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut reader, &mut line)
        .unwrap_or_else(|e| panic!("port-forward: {e}"));
    // Keep reading what it prints ("Handling connection for ..."): a closed pipe would kill it.
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    // "Forwarding from 127.0.0.1:PORT -> 9090"
    let port: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("port-forward said {line:?}"));
    let got = http_get(port, path);
    let _ = child.kill();
    let _ = child.wait();
    got.unwrap_or_else(|| panic!("no answer through port-forward on {port}"))
}

/// The pod's cgroup directory in the freezer hierarchy.
fn freezer_dir(node: &Node, uid: &str) -> std::path::PathBuf {
    let root = std::path::PathBuf::from("/sys/fs/cgroup/freezer").join(node.cgroup_root());
    let want = format!("pod{uid}");
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                if e.file_name().to_string_lossy() == want {
                    return e.path();
                }
                stack.push(e.path());
            }
        }
    }
    panic!("no freezer cgroup for pod {uid}")
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid we looked up.
    let rc = unsafe { libc::kill(pid as i32, sig) };
    assert_eq!(rc, 0, "kill {pid}: {}", std::io::Error::last_os_error());
}

/// A takeover: when the successor was granted (the Lease watch), the old leader's last
/// write, the successor's first.
struct Takeover {
    granted: Instant,
    old_last: Option<Instant>,
    new_first: Instant,
    new_leader: String,
}

fn takeover(
    register: &Register,
    watch: &LeaseWatch,
    since: Instant,
    old: &str,
    within: Duration,
) -> Takeover {
    let new = wait_for(within, "a write from a new leader", || {
        register.first_from_other(since, old)
    });
    let granted = wait_for(
        Duration::from_secs(5),
        "the grant on the Lease watch",
        || watch.granted_after(since, old),
    );
    Takeover {
        granted: granted.at,
        old_last: register.last_from(old).map(|w| w.at),
        new_first: new.at,
        new_leader: new.pod,
    }
}

#[test]
fn chart_pods_on_a_real_node() {
    if skip("chart_pods_on_a_real_node") {
        return;
    }
    let _one = NODE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut report = Report::default();
    let node = Node::start();
    report.add(
        "node start (launcher to Ready node)",
        format!("{:.1} s", node.start_secs),
    );
    let image = std::fs::metadata(&node_support::images()[0])
        .map(|m| m.len())
        .unwrap_or(0);
    report.add(
        "tenure image (docker-archive)",
        format!("{:.1} MiB", image as f64 / 1048576.0),
    );
    let register = Register::start(&node);
    let bound = LEASE + RETRY + SLACK;

    // ---- 1. install into a restricted namespace ------------------------------------------
    let ns = "chart";
    let release = "tenure";
    restricted_namespace(&node, ns);
    let _diagnose = Diagnose { node: &node, ns };
    let installed = Instant::now();
    let mut args = vec![
        "install".to_owned(),
        release.into(),
        node_support::chart().display().to_string(),
        "-n".into(),
        ns.into(),
    ];
    args.extend(values(&register));
    run(node.helm().args(&args), None).expect_ok();
    let watch = LeaseWatch::start(&node, ns, release);
    let first = wait_for(Duration::from_secs(90), "the first leader's write", || {
        register.first_from_other(installed, "")
    });
    report.add(
        "helm install -> first leading command's write",
        secs(first.at - installed),
    );
    let p = ready_pods(&node, ns, 2, Duration::from_secs(90));
    report.add("helm install -> both pods Ready", secs(installed.elapsed()));
    assert!(p.iter().all(|p| p.restarts == 0), "no restarts: {p:?}");
    let leader = assert_one_leader(&node, ns, release, &register);
    assert!(p.iter().any(|p| p.name == leader));
    // kubectl get elections agrees.
    let election = run(
        node.kubectl()
            .args(["get", "election", release, "-n", ns, "-o", "json"]),
        None,
    )
    .json();
    assert_eq!(election["status"]["leader"], leader.as_str(), "{election}");
    // Probes and metrics through port-forward.
    let (code, body) = through_port_forward(&node, ns, &leader, "/metrics");
    assert_eq!(code, 200);
    assert!(
        body.lines()
            .any(|l| l.starts_with("leader_election_master_status") && l.ends_with(" 1")),
        "the leader's metrics say it leads:\n{body}"
    );
    let follower = p
        .iter()
        .find(|p| p.name != leader)
        .map(|p| p.name.clone())
        .unwrap_or_default();
    let (code, body) = through_port_forward(&node, ns, &follower, "/readyz");
    assert_eq!(code, 200, "the follower is ready: {body}");
    let (_, body) = through_port_forward(&node, ns, &follower, "/metrics");
    assert!(
        body.lines()
            .any(|l| l.starts_with("leader_election_master_status") && l.ends_with(" 0")),
        "the follower's metrics say it follows:\n{body}"
    );
    // RSS of tenure and of the workload in the leader's pod.
    let tpid = tenure_pid(&leader).unwrap_or_else(|| panic!("no tenure process in {leader}"));
    let workload: u64 = command_pids(&leader).iter().map(|p| rss_kib(*p)).sum();
    report.add(
        "RSS per pod: tenure (leader) / workload",
        format!("{} KiB / {} KiB", rss_kib(tpid), workload),
    );

    // ---- 2. delete the leader pod ---------------------------------------------------------
    let t0 = Instant::now();
    run(
        node.kubectl()
            .args(["delete", "pod", "-n", ns, &leader, "--wait=false"]),
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
    let _ = ready_pods(&node, ns, 2, Duration::from_secs(60));
    let leader = assert_one_leader(&node, ns, release, &register);
    assert_eq!(
        leader, t.new_leader,
        "the replacement pod joined as a follower"
    );

    // ---- 3a. freeze tenure in the leader's container --------------------------------------
    let tpid = tenure_pid(&leader).unwrap_or_else(|| panic!("no tenure in {leader}"));
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
    assert!(
        old_last < t.granted,
        "the frozen leader's command wrote after the successor's grant"
    );
    assert!(
        killed,
        "the frozen tenure's command still runs after the successor leads"
    );
    let _ = ready_pods(&node, ns, 2, Duration::from_secs(60));
    let leader = assert_one_leader(&node, ns, release, &register);
    assert_eq!(leader, t.new_leader);

    // ---- 3b. freeze the whole leader pod (freezer cgroup) ---------------------------------
    let uid = pods(&node, ns)
        .into_iter()
        .find(|p| p.name == leader)
        .map(|p| p.uid)
        .unwrap_or_default();
    let freezer = freezer_dir(&node, &uid).join("freezer.state");
    let t0 = Instant::now();
    std::fs::write(&freezer, "FROZEN").unwrap_or_else(|e| panic!("freeze: {e}"));
    let t = takeover(
        &register,
        &watch,
        t0,
        &leader,
        bound + Duration::from_secs(5),
    );
    report.add(
        "failover, leader pod frozen (freeze -> successor's first write)",
        secs(t.new_first - t0),
    );
    let thawed = Instant::now();
    std::fs::write(&freezer, "THAWED").unwrap_or_else(|e| panic!("thaw: {e}"));
    std::thread::sleep(Duration::from_secs(3));
    let late: Vec<_> = register
        .since(thawed)
        .into_iter()
        .filter(|w| w.pod == leader)
        .collect();
    report.add(
        "  thawed pod's writes after the thaw (all refused by the register)",
        late.len().to_string(),
    );
    assert!(
        late.iter().all(|w| !w.accepted),
        "a thawed stale write was accepted: {late:?}"
    );
    let after_a_second: Vec<_> = late
        .iter()
        .filter(|w| w.at > thawed + Duration::from_secs(1))
        .collect();
    assert!(
        after_a_second.is_empty(),
        "the thawed pod's stale command still wrote a second after the thaw: {after_a_second:?}"
    );
    let _ = ready_pods(&node, ns, 2, Duration::from_secs(90));
    let leader = assert_one_leader(&node, ns, release, &register);

    // ---- 4. partition the leader pod from the API server ----------------------------------
    let tpid = tenure_pid(&leader).unwrap_or_else(|| panic!("no tenure in {leader}"));
    let rules = format!(
        "table inet partition {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n    \
         ip daddr 198.18.2.1 tcp dport 443 drop\n    ip daddr {} tcp dport 6443 drop\n  }}\n}}\n",
        node_support::NODE_IP
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
        "failover, leader partitioned (partition -> successor's first write)",
        secs(t.new_first - t0),
    );
    let old_last = t.old_last.unwrap_or(t0);
    assert!(
        old_last < t.granted,
        "the partitioned leader's command wrote after the successor's grant"
    );
    nft(&["delete", "table", "inet", "partition"], None);
    std::thread::sleep(LEASE);
    let leader = assert_one_leader(&node, ns, release, &register);
    assert_eq!(
        leader, t.new_leader,
        "after healing the successor still leads alone"
    );

    // ---- 5. helm upgrade (rolling, new image tag), then uninstall -------------------------
    let t0 = Instant::now();
    let mut args = vec![
        "upgrade".to_owned(),
        release.into(),
        node_support::chart().display().to_string(),
        "-n".into(),
        ns.into(),
        "--set".into(),
        "tenure.image.tag=0.1.0-next".into(),
        "--wait".into(),
        "--timeout".into(),
        "180s".into(),
    ];
    args.extend(values(&register));
    run(node.helm().args(&args), None).expect_ok();
    let _ = ready_pods(&node, ns, 2, Duration::from_secs(60));
    let during: Vec<_> = register
        .since(t0)
        .into_iter()
        .filter(|w| w.accepted)
        .collect();
    let max_gap = during
        .windows(2)
        .map(|w| w[1].at - w[0].at)
        .max()
        .unwrap_or_default();
    report.add(
        "helm upgrade: longest gap between accepted writes",
        secs(max_gap),
    );
    assert!(max_gap <= bound, "hand-off on upgrade within lease + retry");
    let leader = assert_one_leader(&node, ns, release, &register);
    let p = pods(&node, ns);
    for pod in p.iter().filter(|p| !p.deleting) {
        let spec = run(
            node.kubectl()
                .args(["get", "pod", "-n", ns, &pod.name, "-o", "json"]),
            None,
        )
        .json();
        assert_eq!(
            spec["spec"]["initContainers"][0]["image"],
            "tenure:0.1.0-next"
        );
    }
    let stale = accepted_stale(&register, &watch);
    report.add(
        "accepted stale writes (all scenarios)",
        stale.len().to_string(),
    );
    assert!(stale.is_empty(), "stale writes accepted: {stale:?}");
    // A plain `helm uninstall`: its pre-delete hook (`tenure drain`) stops the pods while
    // their Role and ServiceAccount still exist, so the leader's release on SIGTERM is
    // allowed. Without the hook Helm deletes those first and the Lease keeps naming the
    // leader until it expires (an expired Lease still shows its holder).
    let t0 = Instant::now();
    run(
        node.helm().args([
            "uninstall",
            release,
            "-n",
            ns,
            "--wait",
            "--timeout",
            "120s",
        ]),
        None,
    )
    .expect_ok();
    report.add(
        "helm uninstall (pre-delete hook included)",
        secs(t0.elapsed()),
    );
    let replicas = run(
        node.kubectl().args([
            "get",
            "pods",
            "-n",
            ns,
            "-l",
            "app.kubernetes.io/name=tenure",
            "-o",
            "name",
        ]),
        None,
    )
    .expect_ok();
    assert!(
        replicas.trim().is_empty(),
        "the hook returned before the pods stopped: {replicas}"
    );
    let (holder, _) = lease(&node, ns, release);
    assert_eq!(
        holder, "",
        "{leader} still holds the Lease after helm uninstall: not released"
    );
    // The hook's Job, Role, RoleBinding and ServiceAccount went with it (hook-succeeded).
    let left = run(
        node.kubectl().args([
            "get",
            "jobs,roles,rolebindings,serviceaccounts",
            "-n",
            ns,
            "-o",
            "name",
        ]),
        None,
    )
    .expect_ok();
    assert!(
        !left.contains("tenure"),
        "objects left after helm uninstall:\n{left}"
    );
    report.add(
        "refused (stale) write attempts, all scenarios",
        register.refused().to_string(),
    );
    drop(watch);
    report.print();
    let _ = pod_processes;
}

/// What the host looks like where a node could leave something behind.
#[derive(Debug, PartialEq)]
struct HostState {
    cgroups: Vec<String>,
    links: Vec<String>,
    mounts: Vec<String>,
    sysctls: Vec<(String, String)>,
    paths: Vec<(String, bool)>,
}

fn host_state() -> HostState {
    let mut cgroups: Vec<String> = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|h| std::fs::read_dir(h.path()).into_iter().flatten().flatten())
        .map(|e| e.path().display().to_string())
        .filter(|p| p.contains("tenure-node-") || p.contains("kubepods"))
        .collect();
    cgroups.sort();
    let links: Vec<String> = run(std::process::Command::new("ip").args(["-o", "link"]), None)
        .expect_ok()
        .lines()
        .filter_map(|l| l.split(':').nth(1).map(|n| n.trim().to_owned()))
        .collect();
    let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            [
                "kubelet",
                "containerd",
                "/var/lib/cni",
                "/run/netns",
                "/var/log/pods",
                "overlay",
            ]
            .iter()
            .any(|k| l.contains(k))
        })
        .map(str::to_owned)
        .collect();
    let sysctls = [
        "vm/overcommit_memory",
        "vm/panic_on_oom",
        "kernel/panic",
        "kernel/panic_on_oops",
        "kernel/keys/root_maxkeys",
        "kernel/keys/root_maxbytes",
        "net/ipv4/ip_forward",
    ]
    .iter()
    .map(|k| {
        let v = std::fs::read_to_string(format!("/proc/sys/{k}")).unwrap_or_default();
        ((*k).to_owned(), v.trim().to_owned())
    })
    .collect();
    let paths = [
        "/var/lib/kubelet",
        "/var/lib/containerd",
        "/var/lib/cni",
        "/var/lib/etcd",
        "/var/log/pods",
        "/var/log/containers",
        "/run/containerd",
        "/etc/cni/net.d",
    ]
    .iter()
    .map(|p| ((*p).to_owned(), std::path::Path::new(p).exists()))
    .collect();
    HostState {
        cgroups,
        links,
        mounts,
        sysctls,
        paths,
    }
}

#[test]
fn a_node_leaves_nothing_on_the_host_and_the_next_one_starts_clean() {
    if skip("a_node_leaves_nothing_on_the_host_and_the_next_one_starts_clean") {
        return;
    }
    let _one = NODE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let before = host_state();
    assert!(
        before.cgroups.is_empty(),
        "a node's cgroups are on the host before the test: {:?}",
        before.cgroups
    );

    // A node with a running pod, stopped the normal way.
    let node = Node::start();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sleeper", "namespace": "default"},
        "spec": {"containers": [{
            "name": "sleep", "image": "busybox:1.37", "imagePullPolicy": "Never",
            "command": ["sleep", "3600"],
        }]}
    });
    run(
        node.kubectl().args(["apply", "-f", "-"]),
        Some(&pod.to_string()),
    )
    .expect_ok();
    wait_for(Duration::from_secs(60), "the pod Running", || {
        pods(&node, "default")
            .iter()
            .any(|p| p.phase == "Running")
            .then_some(())
    });
    let during = host_state();
    assert!(
        !during.cgroups.is_empty(),
        "the pod's cgroups are on the host while it runs (the check can see them)"
    );
    assert_eq!(during.links, before.links, "no interface on the host");
    assert_eq!(during.mounts, before.mounts, "no mount on the host");
    assert_eq!(
        during.sysctls, before.sysctls,
        "no sysctl written on the host"
    );
    assert_eq!(
        during.paths, before.paths,
        "nothing written to /var/lib, /var/log, /run"
    );
    node.stop();
    assert_eq!(
        host_state(),
        before,
        "the stopped node left something on the host"
    );

    // A node whose launcher is killed (SIGKILL: no clean-up of its own). Its namespaces die
    // with it; the cgroups it made are left until the next node starts, which removes them.
    let killed = Node::start();
    let root = killed.cgroup_root();
    let launcher = killed.launcher_pid();
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(launcher as i32, libc::SIGKILL) };
    let inner = killed.inner_pid;
    wait_for(Duration::from_secs(30), "the node's processes gone", || {
        (!std::path::Path::new(&format!("/proc/{inner}")).exists()).then_some(())
    });
    let next = Node::start();
    let left: Vec<String> = host_state()
        .cgroups
        .into_iter()
        .filter(|c| c.contains(&root))
        .collect();
    assert!(left.is_empty(), "the next node did not remove {left:?}");
    assert!(
        pods(&next, "default").is_empty(),
        "a new node is a new cluster"
    );
    next.stop();
    drop(killed);
    assert_eq!(host_state(), before, "the nodes left something on the host");
}
