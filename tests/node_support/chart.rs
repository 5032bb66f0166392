//! The Helm chart's releases on the node and their pods, for every node test: namespaces
//! (Pod Security "restricted"), Secrets and documents applied with kubectl, the releases'
//! values (short timings, a writer to the [`Register`] as the command), helm install, the
//! pods and their containers' states and logs, the one-leader check against the Lease, the
//! failovers every backend goes through (leader pod deleted, its tenure frozen), diagnostics
//! on failure, and HTTP to a pod through `kubectl port-forward`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::redis::RedisServer;
use super::{
    NODE_IP, Node, Register, Report, Takeover, Terms, command_pids, lease, run, secs, signal,
    takeover, tenure_pid, wait_for,
};

/// The timings of the tests' releases: short, so failovers are quick; the chart's checks hold.
pub const LEASE: Duration = Duration::from_secs(4);
pub const RENEW: Duration = Duration::from_secs(3);
pub const RETRY: Duration = Duration::from_secs(1);
/// Room above lease + retry for a loaded 2-core machine (watch and HTTP latencies, a
/// command's 100 ms write period).
pub const SLACK: Duration = Duration::from_millis(2500);

/// `kubectl apply -f -` of a JSON document.
pub fn apply(node: &Node, doc: &Value) {
    run(
        node.kubectl().args(["apply", "-f", "-"]),
        Some(&doc.to_string()),
    )
    .expect_ok();
}

/// A namespace enforcing Pod Security "restricted".
pub fn restricted_namespace(node: &Node, name: &str) {
    apply(
        node,
        &json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            }}
        }),
    );
}

/// A Secret `name` with `password` under key `password`, created or replaced.
pub fn password_secret(node: &Node, ns: &str, name: &str, password: &str) {
    apply(
        node,
        &json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": ns},
            "type": "Opaque",
            "stringData": {"password": password},
        }),
    );
}

/// The workload: send this term's token to the register every 100 ms (busybox `nc`: the
/// `wget` of Debian's busybox-static crashes).
pub fn writer_command(register: &Register) -> String {
    json!([
        "sh",
        "-c",
        format!(
            "while true; do printf 'GET /w?pod=%s&token=%s HTTP/1.0\\r\\n\\r\\n' \"$TENURE_IDENTITY\" \"$TENURE_FENCING_TOKEN\" | nc -w 2 {} {} >/dev/null; sleep 0.1; done",
            NODE_IP, register.port
        )
    ])
    .to_string()
}

/// The workload of a sharded release: as [`writer_command`], the writer named
/// `<shard count>x<shard>-<pod>` so the register tells shard counts apart.
pub fn shard_writer_command(register: &Register) -> String {
    json!([
        "sh",
        "-c",
        format!(
            "while true; do printf 'GET /w?pod=%sx%s-%s&token=%s HTTP/1.0\\r\\n\\r\\n' \"$TENURE_SHARDS\" \"$TENURE_SHARD\" \"$TENURE_IDENTITY\" \"$TENURE_FENCING_TOKEN\" | nc -w 2 {} {} >/dev/null; sleep 0.1; done",
            NODE_IP, register.port
        )
    ])
    .to_string()
}

/// `--set` pairs as helm arguments.
pub fn sets(pairs: &[(&str, String)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(k, v)| ["--set".to_owned(), format!("{k}={v}")])
        .collect()
}

/// A release's values as helm arguments: the tests' timings, `extra`, and the writer to
/// `register` as the command.
pub fn values(register: &Register, extra: &[(&str, String)]) -> Vec<String> {
    let mut args = sets(&[
        ("election.leaseDuration", format!("{}s", LEASE.as_secs())),
        ("election.renewDeadline", format!("{}s", RENEW.as_secs())),
        ("election.retryPeriod", format!("{}s", RETRY.as_secs())),
        ("election.grace", "1s".into()),
        ("readinessProbe.periodSeconds", "2".into()),
    ]);
    args.extend(sets(extra));
    args.extend([
        "--set-json".into(),
        format!("command={}", writer_command(register)),
    ]);
    args
}

/// `helm install RELEASE CHART -n NS` and the release's [`values`].
pub fn install_args(
    release: &str,
    ns: &str,
    register: &Register,
    extra: &[(&str, String)],
) -> Vec<String> {
    let mut args = vec![
        "install".to_owned(),
        release.into(),
        super::chart().display().to_string(),
        "-n".into(),
        ns.into(),
    ];
    args.extend(values(register, extra));
    args
}

/// Installs release `release` of the chart into `ns` (see [`install_args`]).
pub fn install(
    node: &Node,
    release: &str,
    ns: &str,
    register: &Register,
    extra: &[(&str, String)],
) {
    run(
        node.helm().args(install_args(release, ns, register, extra)),
        None,
    )
    .expect_ok();
}

// ---- pods and their containers ----------------------------------------------------------

/// The state of one container of a pod.
#[derive(Debug, Clone, Default)]
pub struct ContainerInfo {
    pub name: String,
    pub ready: bool,
    pub restarts: u64,
    /// `state.waiting.reason` (ErrImagePull, ImagePullBackOff, CrashLoopBackOff, ...).
    pub waiting: Option<String>,
    pub waiting_message: String,
    pub running: bool,
    /// (exit code, reason) of `state.terminated`.
    pub terminated: Option<(i64, String)>,
    /// (exit code, reason) of `lastState.terminated`.
    pub last_terminated: Option<(i64, String)>,
}

#[derive(Debug, Clone)]
pub struct PodInfo {
    pub name: String,
    pub uid: String,
    pub phase: String,
    pub ready: bool,
    /// The restarts of its (main) containers.
    pub restarts: u64,
    pub deleting: bool,
    /// Its `app.kubernetes.io/instance` label: the chart's release.
    pub instance: String,
    pub init: Vec<ContainerInfo>,
    pub containers: Vec<ContainerInfo>,
}

impl PodInfo {
    pub fn container(&self, name: &str) -> Option<&ContainerInfo> {
        self.containers.iter().find(|c| c.name == name)
    }
}

fn terminated(v: &Value) -> Option<(i64, String)> {
    v.is_object().then(|| {
        (
            v["exitCode"].as_i64().unwrap_or(-1),
            v["reason"].as_str().unwrap_or_default().to_owned(),
        )
    })
}

fn containers(v: &Value) -> Vec<ContainerInfo> {
    v.as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| ContainerInfo {
            name: s["name"].as_str().unwrap_or_default().into(),
            ready: s["ready"].as_bool().unwrap_or(false),
            restarts: s["restartCount"].as_u64().unwrap_or(0),
            waiting: s["state"]["waiting"]["reason"].as_str().map(str::to_owned),
            waiting_message: s["state"]["waiting"]["message"]
                .as_str()
                .unwrap_or_default()
                .into(),
            running: s["state"]["running"].is_object(),
            terminated: terminated(&s["state"]["terminated"]),
            last_terminated: terminated(&s["lastState"]["terminated"]),
        })
        .collect()
}

/// The label selector of release `release`'s pods.
pub fn instance(release: &str) -> String {
    format!("app.kubernetes.io/instance={release}")
}

/// The pods of `ns` matching label selector `selector` (all with ""), being deleted or not.
pub fn pods(node: &Node, ns: &str, selector: &str) -> Vec<PodInfo> {
    let mut cmd = node.kubectl();
    cmd.args(["get", "pods", "-n", ns, "-o", "json"]);
    if !selector.is_empty() {
        cmd.args(["-l", selector]);
    }
    let list = run(&mut cmd, None).json();
    list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let main = containers(&p["status"]["containerStatuses"]);
            PodInfo {
                name: p["metadata"]["name"].as_str().unwrap_or_default().into(),
                uid: p["metadata"]["uid"].as_str().unwrap_or_default().into(),
                phase: p["status"]["phase"].as_str().unwrap_or_default().into(),
                ready: p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                }),
                restarts: main.iter().map(|c| c.restarts).sum(),
                deleting: !p["metadata"]["deletionTimestamp"].is_null(),
                instance: p["metadata"]["labels"]["app.kubernetes.io/instance"]
                    .as_str()
                    .unwrap_or_default()
                    .into(),
                init: containers(&p["status"]["initContainerStatuses"]),
                containers: main,
            }
        })
        .collect()
}

/// The pods of release `release` in `ns`, none being deleted.
pub fn release_pods(node: &Node, ns: &str, release: &str) -> Vec<PodInfo> {
    pods(node, ns, &instance(release))
        .into_iter()
        .filter(|p| !p.deleting)
        .collect()
}

/// Waits until exactly `n` pods of `ns` match `selector` (all with ""), none being deleted,
/// and all are Running and Ready; returns them.
pub fn ready_pods(
    node: &Node,
    ns: &str,
    selector: &str,
    n: usize,
    timeout: Duration,
) -> Vec<PodInfo> {
    wait_for(
        timeout,
        &format!("{n} Ready pods in {ns} (selector {selector:?}), none being deleted"),
        || {
            let p = pods(node, ns, selector);
            (p.len() == n
                && p.iter()
                    .all(|p| !p.deleting && p.phase == "Running" && p.ready))
            .then_some(p)
        },
    )
}

/// The log of container `container` of `pod`: of its previous run with `previous`.
pub fn logs(node: &Node, ns: &str, pod: &str, container: &str, previous: bool) -> String {
    let mut cmd = node.kubectl();
    cmd.args(["logs", "-n", ns, pod, "-c", container]);
    if previous {
        cmd.arg("--previous");
    }
    run(&mut cmd, None).expect_ok()
}

/// After 2 s, exactly one pod writes, and it is the Lease's holder; with `fenced`, its last
/// write carries the Lease's token. Returns the holder.
pub fn assert_one_leader(
    node: &Node,
    ns: &str,
    lease_name: &str,
    register: &Register,
    fenced: bool,
) -> String {
    std::thread::sleep(Duration::from_secs(2));
    let (holder, token) = lease(node, ns, lease_name);
    register.assert_sole_writer(&holder, fenced.then_some(token), "the Lease's");
    holder
}

// ---- failovers of a release's leader -----------------------------------------------------

/// Deletes the leader's pod (`--wait=false`) and waits for the takeover, reported: the
/// successor's first write within `bound` of the delete, the old command's last one before
/// the successor's grant (on `terms`, the watch of the lock).
pub fn delete_leader(
    node: &Node,
    ns: &str,
    leader: &str,
    register: &Register,
    terms: &Terms,
    bound: Duration,
    report: &mut Report,
) -> Takeover {
    let t0 = Instant::now();
    run(
        node.kubectl()
            .args(["delete", "pod", "-n", ns, leader, "--wait=false"]),
        None,
    )
    .expect_ok();
    let t = takeover(register, terms, t0, leader, bound + Duration::from_secs(5));
    report.add(
        "failover, leader pod deleted (delete -> successor's first write)",
        secs(t.new_first - t0),
    );
    assert!(t.new_first - t0 <= bound, "failover within lease + retry");
    assert!(
        t.old_last.is_none_or(|l| l < t.granted),
        "the old command wrote after the successor's grant"
    );
    t
}

/// Freezes tenure in the leader's container (SIGSTOP; SIGCONT once a successor wrote) and
/// returns when it was frozen and the takeover, reported: the leader's command ran before, its
/// last write came before the successor's grant, and it was killed by then.
pub fn freeze_tenure(
    leader: &str,
    register: &Register,
    terms: &Terms,
    bound: Duration,
    report: &mut Report,
) -> (Instant, Takeover) {
    let tpid = tenure_pid(leader).unwrap_or_else(|| panic!("no tenure in {leader}"));
    assert!(
        !command_pids(leader).is_empty(),
        "the leader's command runs before the freeze"
    );
    let t0 = Instant::now();
    signal(tpid, libc::SIGSTOP);
    let t = takeover(register, terms, t0, leader, bound + Duration::from_secs(5));
    let killed = command_pids(leader).is_empty();
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
    (t0, t)
}

/// On a panic, what the namespaces look like (pods, events, the logs of the pods matching
/// `selector`) and, with `redis`, the Redis log.
pub struct Diagnose<'a> {
    pub node: &'a Node,
    pub namespaces: Vec<String>,
    pub selector: &'a str,
    pub redis: Option<&'a RedisServer>,
}

impl<'a> Diagnose<'a> {
    /// For the chart's releases in `ns`.
    pub fn chart(node: &'a Node, ns: &str) -> Self {
        Diagnose {
            node,
            namespaces: vec![ns.to_owned()],
            selector: "app.kubernetes.io/name=tenure",
            redis: None,
        }
    }

    pub fn with_redis(mut self, redis: &'a RedisServer) -> Self {
        self.redis = Some(redis);
        self
    }
}

impl Drop for Diagnose<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for ns in &self.namespaces {
            for args in [
                &["get", "pods", "-o", "wide"][..],
                &["get", "events", "--sort-by=.lastTimestamp"][..],
                &[
                    "logs",
                    "-l",
                    self.selector,
                    "--all-containers",
                    "--prefix",
                    "--tail=40",
                ][..],
            ] {
                let out = run(self.node.kubectl().args(args).args(["-n", ns]), None);
                eprintln!(
                    "--- kubectl {} -n {ns}:\n{}{}",
                    args.join(" "),
                    out.stdout,
                    out.stderr
                );
            }
        }
        if let Some(r) = self.redis {
            eprintln!("--- redis-server log:\n{}", r.log());
        }
    }
}

// ---- HTTP to a pod ------------------------------------------------------------------------

/// GET http://127.0.0.1:PORT/PATH; reads by Content-Length (through a port-forward the
/// server's close does not always reach this end).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
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
pub fn through_port_forward(node: &Node, ns: &str, pod: &str, path: &str) -> (u16, String) {
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
