//! `tenure run --fence` on a real kube-apiserver: what a term's loopback endpoint
//! (`FenceProxy`) costs a command's writes, how soon the next term's command writes after a
//! hand-over, and that a frozen command's writes never land after the next term's.
//!
//! 1. **Per-write latency, through the endpoint vs direct.** One term of an election, held
//!    by a `LeaderElector` in this process, its fence proven first; the same merge patch of
//!    one annotation of a ConfigMap (one ConfigMap per mode), sent (a) direct, by a kube
//!    client from `Fencer::client(&term)` (the token as an impersonation user extra, as a
//!    Rust workload sends it) and (b) through a `FenceProxy` of the same term (and the same
//!    `Fencer`, so the same proof and rechecks) by a plain kube client built from the
//!    proxy's kubeconfig; interleaved in a new random order each round, after a warm-up.
//!    p50 / p99 and the ratio proxy / direct. The endpoint runs in this process, on its
//!    runtime, as it runs in `tenure`'s. Then, for context, (c) kubectl through the same
//!    endpoint and (d) kubectl straight to the API server as admin (not governed by the
//!    policy), interleaved: a process per write, so kubectl's start-up (and discovery
//!    cache read) is in every figure.
//! 2. **SIGTERM of the leading `tenure` → the next term's command's first admitted write.**
//!    Two real `tenure run --backend kube --fence` processes (lease 3 s, renew deadline 2 s,
//!    retry 500 ms) whose command is Python: it stamps its start (`time.time_ns()`, before
//!    its imports) and the end of its imports (json, urllib), merge-patches an annotation
//!    through `$TENURE_KUBE_SERVER` with urllib, stamps the answer, then sleeps. Each hand-over: SIGTERM to the leader (its command
//!    exits, it releases the Lease, it exits); the follower is granted, proves its fence,
//!    starts the endpoint and the command; a fresh follower replaces the old leader. The
//!    follower's `tenure` log times (tracing's wall clock, µs) split the total: SIGTERM →
//!    `became leader` → `fence proven` → `leading: started the command` → Python's start →
//!    its imports done → the write's answer; the old leader's log gives its command's exit and
//!    its release (`stopped leading`).
//! 3. **Stale writes after freeze-and-thaw takeovers**, per client (kubectl in a shell loop,
//!    and Python's urllib writing as fast as it can): two `tenure run --fence --rejoin`
//!    replicas whose commands write `w=<token>-<i>` to one ConfigMap nonstop; each round the
//!    leader (the higher token in the commands' logs) is frozen — `tenure` and its command's
//!    process group, as a paused pod — until the other replica's command has written, then
//!    thawed. A watch of the object sees every version in the API server's order: a version
//!    whose token is below one seen before is a stale write accepted (goal: 0). Counted too:
//!    what each thawed command logged for its ended term after the thaw (a write it sent at
//!    all, and whether it was admitted), what the old commands heard (the endpoint's "term ended" refusal, a "stale … < current"
//!    refusal from the policy or the proof's gate, the endpoint gone), and the time from the
//!    freeze to the other command's first admitted write.
//!
//! 4. **Per-write latency beside a crowd of idle strangers** (issue #40). One term's
//!    `FenceProxy` as in part 1; in each round, in a new random order, the same writes
//!    (merge patch of one annotation) quiet and crowded: with twice the endpoint's connection
//!    cap ([`FenceProxy::connection_cap`], from this process's `RLIMIT_NOFILE`) of silent
//!    TCP connections held open to it by a client without the secret, opened before the
//!    writes (and waited on until the endpoint has closed all but a cap of them). Two clients
//!    write in random order: the plain kube client of part 1 (its connection kept alive),
//!    and a new connection per write (raw HTTP/1.1 with `Connection: close`, as urllib or a
//!    kubectl process connects). p50 / p99 quiet and crowded, and how many strangers the
//!    endpoint had closed.
//!
//! Prints one table per part and writes `target/bench/kube_fence_workers.json`. Run with
//! `cargo bench --all-features --bench kube_fence_workers` (about 6 minutes on 2 cores);
//! `TENURE_BENCH_ONLY=latency,handover,takeovers,crowd` runs only those parts (the others'
//! tables are then empty).
//! `TENURE_BENCH_WRITES` sets the writes per mode of part 1 (default 1000),
//! `TENURE_BENCH_KUBECTL_WRITES` kubectl's (default 40 per mode), `TENURE_BENCH_HANDOVERS` the
//! hand-overs of part 2 (default 24), `TENURE_BENCH_FREEZES` the takeovers per client of part 3
//! (default 22), `TENURE_BENCH_CROWD_ROUNDS` the rounds of part 4 (default 40, each 25 writes
//! per client quiet and as many crowded). The `tenure` binary is `support::proc::tenure_bin`'s. Python
//! is `python3` resolved once to its real interpreter (a pyenv shim would add a shell's
//! start-up to every command).

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::env::{knob, selected};
use support::kube_harness::fencing::{apply, cm, elect, install, participant};
use support::kube_harness::{child_process_groups, fresh_dir, kubectl, shared, unique};
use support::out::{Say, save_json};
use support::proc::{FAST, Process, tenure_bin};
use support::role::now_ns;
use support::stats::{Stats, ms, p50_p99, round2, round3};
use support::table;
use tenure::fence::kube::{FenceProxy, FenceState, Fencer, FencingPolicy};

/// Untimed writes per mode before the measured ones: connections, caches.
const WARMUP: usize = 20;
/// Untimed kubectl writes per mode (its discovery cache is filled by the first).
const KUBECTL_WARMUP: usize = 3;

fn main() -> ExitCode {
    let Some(rt) = support::role::runtime(2) else {
        return ExitCode::FAILURE;
    };
    rt.block_on(run());
    ExitCode::SUCCESS
}

/// `python3`'s real interpreter (not a shim).
fn python() -> PathBuf {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap_or_else(|e| panic!("python3: {e}"));
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(path.is_file(), "python3 names no interpreter: {out:?}");
    path
}

/// A namespace with the participant ServiceAccount `worker` and the fencing policy of `lease`
/// enforced (its Lease made first, as `tenure policy` and the chart do), and a ConfigMap for
/// each of `objects`; the worker's client and kubeconfig.
async fn fenced_namespace(
    prefix: &str,
    lease: &str,
    objects: &[&str],
) -> (String, kube::Client, PathBuf) {
    let server = shared();
    let ns = unique(prefix);
    server.namespace(&ns).await;
    let (client, kubeconfig) = participant(&ns, "worker").await;
    let policy = FencingPolicy::new(&ns, lease)
        .and_then(|p| p.service_account(&ns, "worker"))
        .unwrap_or_else(|e| panic!("{e}"));
    let admin = server.admin().await;
    apply(
        &Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin.clone(), &ns),
        lease,
        &policy.lease(),
    )
    .await;
    install(&policy, &Api::namespaced(client.clone(), &ns)).await;
    let cms: Api<ConfigMap> = Api::namespaced(admin, &ns);
    for name in objects {
        cms.create(&PostParams::default(), &cm(name, "0"))
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
    }
    (ns, client, kubeconfig)
}

/// ConfigMaps of `ns` through `proxy`, by a plain kube client from its kubeconfig (written to
/// `kubeconfig`, as a command reads it).
async fn proxy_client(proxy: &FenceProxy, kubeconfig: &Path, ns: &str) -> Api<ConfigMap> {
    std::fs::write(kubeconfig, proxy.kubeconfig(ns)).unwrap_or_else(|e| panic!("{e}"));
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|e| panic!("the proxy's kubeconfig: {e}"));
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap_or_else(|e| panic!("the proxy's kubeconfig: {e}"));
    Api::namespaced(
        kube::Client::try_from(config).unwrap_or_else(|e| panic!("{e}")),
        ns,
    )
}

/// The merge patch every mode of parts 1 and 4 sends: one annotation.
fn annotation(value: &str) -> Value {
    json!({"metadata": {"annotations": {"w": value}}})
}

/// A 64-bit xorshift step (a fixed seed: the same orders every run).
fn next(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

/// Polls `done` every 10 ms for up to `limit`; whether it came true.
async fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Part 1: per-write latency.

struct Latency {
    /// direct, proxy, kubectl via proxy, kubectl as admin.
    samples: [Vec<Duration>; 4],
    errors: [Vec<String>; 4],
    fence: String,
}

const MODES: [&str; 4] = [
    "(a) direct: kube client from Fencer::client(&term)",
    "(b) FenceProxy: plain kube client, proxy's kubeconfig",
    "(c) kubectl via FenceProxy (process start-up included)",
    "(d) kubectl direct as admin, not governed (start-up incl.)",
];
const OBJECTS: [&str; 4] = ["lat-direct", "lat-proxy", "lat-kubectl", "lat-admin"];

/// A term held by an elector of this process in a [`fenced_namespace`], its fencer and what
/// its proof found; `end` ends the term.
struct FencedTerm {
    ns: String,
    term: tenure::Term,
    fencer: Fencer,
    fence: String,
    end_term: tokio::sync::oneshot::Sender<()>,
    election: tokio::task::JoinHandle<()>,
}

impl FencedTerm {
    async fn begin(prefix: &str, lease: &str, objects: &[&str]) -> Self {
        let (ns, client, _) = fenced_namespace(prefix, lease, objects).await;
        let (term, end_term, election) = elect(&client, &ns, lease).await;
        let fencer = Fencer::new(client.clone())
            .await
            .unwrap_or_else(|e| panic!("fencer: {e}"))
            .lease_namespace(&ns);
        let fence = match fencer.prove(&term).await {
            FenceState::Enforced => "proven".to_owned(),
            other => format!("NOT PROVEN: {other:?}"),
        };
        Self {
            ns,
            term,
            fencer,
            fence,
            end_term,
            election,
        }
    }

    async fn end(self) {
        let _ = self.end_term.send(());
        let _ = self.election.await;
    }
}

async fn latency(dir: &Path, writes: usize, kubectl_writes: usize) -> Latency {
    let held = FencedTerm::begin("bench-fw-lat", "latency", &OBJECTS).await;
    let (ns, term, fencer) = (held.ns.clone(), held.term.clone(), held.fencer.clone());
    let direct: Api<ConfigMap> = Api::namespaced(fencer.client(&term), &ns);
    let proxy = FenceProxy::start(&fencer, &term, None)
        .await
        .unwrap_or_else(|e| panic!("proxy: {e}"));
    let proxy_kubeconfig = dir.join("proxy.kubeconfig");
    let proxied = proxy_client(&proxy, &proxy_kubeconfig, &ns).await;

    let mut samples: [Vec<Duration>; 4] = Default::default();
    let mut errors: [Vec<String>; 4] = Default::default();
    let pp = PatchParams::default();
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..writes + WARMUP {
        let order = if next(&mut rng) & 1 == 0 {
            [0, 1]
        } else {
            [1, 0]
        };
        for mode in order {
            let api = if mode == 0 { &direct } else { &proxied };
            let patch = Patch::Merge(annotation(&i.to_string()));
            let start = Instant::now();
            let r = api.patch(OBJECTS[mode], &pp, &patch).await;
            let took = start.elapsed();
            match r {
                Ok(_) if i >= WARMUP => samples[mode].push(took),
                Ok(_) => {}
                Err(e) => errors[mode].push(e.to_string()),
            }
        }
    }

    // kubectl, a process per write: through the endpoint, and as admin straight to the server.
    let home = dir.join("kubectl-home");
    std::fs::create_dir_all(&home).unwrap_or_else(|e| panic!("{e}"));
    let admin_kubeconfig = shared().admin_kubeconfig();
    for i in 0..kubectl_writes + KUBECTL_WARMUP {
        let order = if next(&mut rng) & 1 == 0 {
            [2, 3]
        } else {
            [3, 2]
        };
        for mode in order {
            let kubeconfig = if mode == 2 {
                &proxy_kubeconfig
            } else {
                &admin_kubeconfig
            };
            let start = Instant::now();
            let out = tokio::process::Command::new(kubectl())
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args([
                    "-n",
                    &ns,
                    "patch",
                    "configmap",
                    OBJECTS[mode],
                    "--type",
                    "merge",
                ])
                .arg("-p")
                .arg(annotation(&format!("k{i}")).to_string())
                .env("HOME", &home)
                .stdin(Stdio::null())
                .output()
                .await
                .unwrap_or_else(|e| panic!("kubectl: {e}"));
            let took = start.elapsed();
            if !out.status.success() {
                errors[mode].push(format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            } else if i >= KUBECTL_WARMUP {
                samples[mode].push(took);
            }
        }
    }
    drop(proxy);
    drop((direct, proxied, fencer));
    let fence = held.fence.clone();
    held.end().await;
    Latency {
        samples,
        errors,
        fence,
    }
}

// ---------------------------------------------------------------------------------------------
// Part 2: hand-over.

/// A term's command for part 2: stamps its start before its imports and again after them,
/// writes once through the endpoint (retrying what is refused, counted), appends `TOKEN START
/// IMPORTED WRITTEN REFUSED` to its log, then sleeps until SIGTERM.
const HANDOVER_PY: &str = r#"import time
started = time.time_ns()
import json, os, sys, urllib.request, urllib.error
imported = time.time_ns()
server, token = os.environ["TENURE_KUBE_SERVER"], os.environ["TENURE_FENCING_TOKEN"]
ns, log = sys.argv[1], sys.argv[2]
body = json.dumps({"metadata": {"annotations": {"w": token}}}).encode()
url = server + "/api/v1/namespaces/" + ns + "/configmaps/handover"
refused = 0
while True:
    req = urllib.request.Request(url, data=body, method="PATCH",
                                 headers={"Content-Type": "application/merge-patch+json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            r.read()
        break
    except Exception as e:
        refused += 1
        if refused > 500:
            raise
        time.sleep(0.01)
written = time.time_ns()
with open(log, "a") as f:
    f.write(f"{token} {started} {imported} {written} {refused}\n")
while True:
    time.sleep(3600)
"#;

/// One hand-over, nanoseconds after the SIGTERM.
struct Handover {
    token: u64,
    old_command_exited: Option<f64>,
    released: Option<f64>,
    granted: Option<f64>,
    proven: Option<f64>,
    command: Option<f64>,
    python: f64,
    imported: f64,
    written: f64,
    refused: u64,
    old_exit_ms: Option<f64>,
}

/// `tenure run --lease LEASE --backend kube --namespace NS FAST --identity ID --fence EXTRA --
/// COMMAND`, as the participant, its stderr to `err`.
fn start_tenure(
    lease: &str,
    ns: &str,
    kubeconfig: &Path,
    identity: &str,
    extra: &[&str],
    command: &[String],
    err: &Path,
) -> Process {
    let stderr = std::fs::File::create(err).unwrap_or_else(|e| panic!("{}: {e}", err.display()));
    let child = Command::new(tenure_bin())
        .args([
            "run",
            "--lease",
            lease,
            "--backend",
            "kube",
            "--namespace",
            ns,
        ])
        .args(FAST)
        .args(["--identity", identity, "--fence"])
        .args(extra)
        .arg("--")
        .args(command)
        .env("KUBECONFIG", kubeconfig)
        .env("TENURE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("tenure: {e}"));
    Process::new(identity, child)
}

/// The wall-clock nanoseconds of the first line of a `tenure` log holding `needle` (tracing's
/// RFC 3339 time stamp, the line's first word).
fn log_time(log: &str, needle: &str) -> Option<i128> {
    let line = log.lines().find(|l| l.contains(needle))?;
    let ts: k8s_openapi::jiff::Timestamp = line.split_whitespace().next()?.parse().ok()?;
    Some(ts.as_nanosecond())
}

/// One line of part 2's log: `TOKEN START IMPORTED WRITTEN REFUSED`.
struct Written {
    token: u64,
    started: i128,
    imported: i128,
    written: i128,
    refused: u64,
}

fn handover_lines(log: &Path) -> Vec<Written> {
    read(log)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some(Written {
                token: w.first()?.parse().ok()?,
                started: w.get(1)?.parse().ok()?,
                imported: w.get(2)?.parse().ok()?,
                written: w.get(3)?.parse().ok()?,
                refused: w.get(4)?.parse().ok()?,
            })
        })
        .collect()
}

async fn handovers(dir: &Path, python: &Path, rounds: usize) -> (Vec<Handover>, Vec<String>) {
    let lease = "handover";
    let (ns, _, kubeconfig) = fenced_namespace("bench-fw-handover", lease, &["handover"]).await;
    let script = dir.join("handover.py");
    std::fs::write(&script, HANDOVER_PY).unwrap_or_else(|e| panic!("{e}"));
    let log = dir.join("handover.log");
    let command = vec![
        python.display().to_string(),
        script.display().to_string(),
        ns.clone(),
        log.display().to_string(),
    ];
    let mut problems = Vec::new();
    let mut n = 0usize;
    let spawn = |n: &mut usize| {
        let identity = format!("h{n}");
        let err = dir.join(format!("{identity}.err"));
        *n += 1;
        let p = start_tenure(lease, &ns, &kubeconfig, &identity, &[], &command, &err);
        (p, err)
    };
    let (mut leader, mut leader_err) = spawn(&mut n);
    if !wait_for(Duration::from_secs(60), || !handover_lines(&log).is_empty()).await {
        panic!(
            "the first command never wrote: {}\n{}",
            read(&leader_err),
            read(&log)
        );
    }
    let (mut follower, mut follower_err) = spawn(&mut n);
    let mut rows = Vec::new();
    for round in 0..rounds {
        // The follower campaigns, its watch of the Lease established.
        let ready = wait_for(Duration::from_secs(30), || {
            read(&follower_err).contains("campaigning")
        })
        .await;
        if !ready {
            problems.push(format!(
                "hand-over {round}: the follower never campaigned: {}",
                read(&follower_err)
            ));
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let before = handover_lines(&log).len();
        let sigterm = i128::try_from(now_ns()).unwrap_or(0);
        let sent = Instant::now();
        leader.terminate();
        // The new command's write and the old tenure's exit, whichever comes first.
        let mut old_exit_ms = None;
        let mut wrote = false;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && !(wrote && old_exit_ms.is_some()) {
            if old_exit_ms.is_none() && matches!(leader.child.try_wait(), Ok(Some(_))) {
                old_exit_ms = Some(ms(sent.elapsed()));
            }
            wrote = wrote || handover_lines(&log).len() > before;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if !wrote {
            problems.push(format!(
                "hand-over {round}: no write within 30 s; old: {}\nnew: {}",
                read(&leader_err),
                read(&follower_err)
            ));
            break;
        }
        let Some(w) = handover_lines(&log).into_iter().nth(before) else {
            problems.push(format!("hand-over {round}: the log's line does not parse"));
            break;
        };
        let (old_log, new_log) = (read(&leader_err), read(&follower_err));
        let after = |t: i128| (t - sigterm) as f64 / 1e6;
        rows.push(Handover {
            token: w.token,
            old_command_exited: log_time(&old_log, "the command exited").map(after),
            released: log_time(&old_log, "stopped leading").map(after),
            granted: log_time(&new_log, "became leader").map(after),
            proven: log_time(&new_log, "fence proven").map(after),
            command: log_time(&new_log, "leading: started the command").map(after),
            python: after(w.started),
            imported: after(w.imported),
            written: after(w.written),
            refused: w.refused,
            old_exit_ms,
        });
        // The follower leads now; a fresh follower replaces the old leader.
        let (next_follower, next_err) = spawn(&mut n);
        leader = std::mem::replace(&mut follower, next_follower);
        leader_err = std::mem::replace(&mut follower_err, next_err);
    }
    leader.terminate();
    follower.terminate();
    let _ = leader.wait_exit(Duration::from_secs(10));
    let _ = follower.wait_exit(Duration::from_secs(10));
    (rows, problems)
}

// ---------------------------------------------------------------------------------------------
// Part 3: freeze-and-thaw takeovers.

/// A Python command for part 3: writes `w=<token>-<i>` to `target` as fast as it can, one
/// request at a time, and logs each outcome (`ok`, `refused CODE MESSAGE`, `unreachable`).
const LOOP_PY: &str = r#"import json, os, sys, time, urllib.request, urllib.error
server, token = os.environ["TENURE_KUBE_SERVER"], os.environ["TENURE_FENCING_TOKEN"]
ns, log = sys.argv[1], sys.argv[2]
url = server + "/api/v1/namespaces/" + ns + "/configmaps/target"
out = open(log, "a", buffering=1)
i = 0
while True:
    i += 1
    body = json.dumps({"metadata": {"annotations": {"w": f"{token}-{i}"}}}).encode()
    req = urllib.request.Request(url, data=body, method="PATCH",
                                 headers={"Content-Type": "application/merge-patch+json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            r.read()
        out.write(f"ok {token} {i}\n")
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace").replace("\n", " ")
        out.write(f"refused {token} {i} {e.code} {text}\n")
    except Exception as e:
        out.write(f"unreachable {token} {i} {e!r}\n".replace("\n", " ") + "\n")
        time.sleep(0.05)
"#;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Client {
    Kubectl,
    Python,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::Kubectl => "kubectl",
            Client::Python => "python",
        }
    }
}

/// A replica's command and its log.
fn loop_command(client: Client, dir: &Path, id: &str, ns: &str, python: &Path) -> Vec<String> {
    let log = dir.join(format!("{}-{id}.log", client.name()));
    match client {
        Client::Kubectl => {
            support::kube_harness::kubectl_writer_loop(&dir.join(format!("{id}-home")), &log)
        }
        Client::Python => vec![
            python.display().to_string(),
            dir.join("loop.py").display().to_string(),
            ns.to_owned(),
            log.display().to_string(),
        ],
    }
}

/// What a replica's command logged.
#[derive(Default)]
struct Heard {
    /// The highest token of an admitted write, and the admitted writes.
    newest_ok: u64,
    ok: usize,
    /// The endpoint's own refusal after the term ("term ended").
    ended: usize,
    /// "stale: token … < current …": the policy's, or the proof's gate.
    stale: usize,
    /// Other refusals (printed).
    other: Vec<String>,
    /// The endpoint gone (connection refused: the term's proxy stopped).
    unreachable: usize,
    /// Refusals whose text does not name tenure and the writer's token.
    unnamed: usize,
}

fn heard(log: &Path) -> Heard {
    let mut h = Heard::default();
    for line in read(log).lines() {
        let mut w = line.splitn(4, ' ');
        let (kind, token, _i, rest) = (
            w.next().unwrap_or_default(),
            w.next().unwrap_or_default(),
            w.next().unwrap_or_default(),
            w.next().unwrap_or_default(),
        );
        match kind {
            "ok" => {
                h.ok += 1;
                h.newest_ok = h.newest_ok.max(token.parse().unwrap_or(0));
            }
            "unreachable" => h.unreachable += 1,
            "refused" if rest.contains("connection refused") => h.unreachable += 1,
            "refused" => {
                if rest.contains("term ended") {
                    h.ended += 1;
                } else if rest.contains("stale: token") {
                    h.stale += 1;
                } else if h.other.len() < 5 {
                    h.other.push(line.chars().take(300).collect());
                } else {
                    h.other.push(String::new());
                }
                if !(rest.contains("tenure") && rest.contains(token)) {
                    h.unnamed += 1;
                }
            }
            _ => {}
        }
    }
    h
}

fn signal_groups(groups: &[i32], sig: libc::c_int) {
    for g in groups {
        // SAFETY: signalling a process group our child `tenure` created for its command.
        unsafe { libc::kill(-g, sig) };
    }
}

struct Takeovers {
    client: Client,
    freezes: usize,
    versions: usize,
    terms: usize,
    stale_accepted: Vec<(u64, u64, u64)>,
    heard: Heard,
    /// Outcomes the thawed commands logged for their ended terms (all, admitted).
    late: (usize, usize),
    /// From the freeze to the other command's first admitted write.
    takeover: Vec<Duration>,
    problems: Vec<String>,
}

async fn takeovers(client: Client, dir: &Path, python: &Path, freezes: usize) -> Takeovers {
    let lease = format!("loop-{}", client.name());
    let (ns, _, kubeconfig) =
        fenced_namespace(&format!("bench-fw-{}", client.name()), &lease, &["target"]).await;
    let admin = shared().admin().await;
    let cms: Api<ConfigMap> = Api::namespaced(admin, &ns);

    // Every version of the object, in the API server's order: (token, i) of its writer.
    let history: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let seen = history.clone();
    let watch = tokio::spawn(async move {
        let mut stream = kube::runtime::watcher(
            cms,
            kube::runtime::watcher::Config::default().fields("metadata.name=target"),
        )
        .boxed();
        while let Some(event) = stream.next().await {
            if let Ok(
                kube::runtime::watcher::Event::Apply(cm)
                | kube::runtime::watcher::Event::InitApply(cm),
            ) = event
                && let Some(w) = cm.metadata.annotations.and_then(|mut a| a.remove("w"))
                && let Some((t, i)) = w.split_once('-')
                && let (Ok(t), Ok(i)) = (t.parse(), i.parse())
            {
                seen.lock().unwrap_or_else(|e| e.into_inner()).push((t, i));
            }
        }
    });

    let logs = [
        dir.join(format!("{}-a.log", client.name())),
        dir.join(format!("{}-b.log", client.name())),
    ];
    let start = |id: &str| {
        let command = loop_command(client, dir, id, &ns, python);
        start_tenure(
            &lease,
            &ns,
            &kubeconfig,
            id,
            &["--rejoin"],
            &command,
            &dir.join(format!("{}-{id}.err", client.name())),
        )
    };
    let mut problems = Vec::new();
    let a = start("a");
    if !wait_for(Duration::from_secs(60), || heard(&logs[0]).ok > 0).await {
        panic!(
            "{}: a's first write never came: {}",
            client.name(),
            read(&dir.join(format!("{}-a.err", client.name())))
        );
    }
    let b = start("b");
    let replicas = [&a, &b];
    let mut takeover = Vec::new();
    let mut frozen = 0;
    // (replica, its term's token, its log's length) at each thaw.
    let mut thawed = Vec::new();
    for round in 0..freezes {
        tokio::time::sleep(Duration::from_millis(700)).await;
        // Whoever wrote with the higher token leads.
        let newest = [heard(&logs[0]).newest_ok, heard(&logs[1]).newest_ok];
        let leader = usize::from(newest[1] > newest[0]);
        let other = 1 - leader;
        let groups = child_process_groups(replicas[leader].pid());
        let at = Instant::now();
        replicas[leader].signal(libc::SIGSTOP);
        signal_groups(&groups, libc::SIGSTOP);
        let taken = wait_for(Duration::from_secs(30), || {
            heard(&logs[other]).newest_ok > newest[leader]
        })
        .await;
        let took = at.elapsed();
        thawed.push((leader, newest[leader], read(&logs[leader]).lines().count()));
        signal_groups(&groups, libc::SIGCONT);
        replicas[leader].signal(libc::SIGCONT);
        if taken {
            takeover.push(took);
            frozen += 1;
        } else {
            problems.push(format!(
                "{} round {round}: the other replica did not write within 30 s of the freeze",
                client.name()
            ));
        }
    }
    // The last thawed command's late writes, then the end.
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(a);
    drop(b);
    tokio::time::sleep(Duration::from_millis(500)).await;
    watch.abort();

    let history = history.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let stale_accepted = support::kube_harness::landed_after_newer(&history);
    let terms: BTreeSet<u64> = history.iter().map(|h| h.0).collect();
    // What each thawed command did in its ended term: any outcome it logged after the thaw.
    let mut late = (0, 0);
    for (replica, token, len) in thawed {
        let text = read(&logs[replica]);
        for line in text.lines().skip(len) {
            let mut w = line.split(' ');
            let kind = w.next().unwrap_or_default();
            if w.next().and_then(|t| t.parse::<u64>().ok()) == Some(token) {
                late.0 += 1;
                late.1 += usize::from(kind == "ok");
            }
        }
    }
    let mut all = heard(&logs[0]);
    let hb = heard(&logs[1]);
    all.ok += hb.ok;
    all.ended += hb.ended;
    all.stale += hb.stale;
    all.unreachable += hb.unreachable;
    all.unnamed += hb.unnamed;
    all.other.extend(hb.other);
    Takeovers {
        client,
        freezes: frozen,
        versions: history.len(),
        terms: terms.len(),
        stale_accepted,
        heard: all,
        late,
        takeover,
        problems,
    }
}

// ---------------------------------------------------------------------------------------------
// The run and the report.

// ---------------------------------------------------------------------------------------------
// Part 4: per-write latency beside a crowd of idle strangers.

/// Writes per client in each quiet and each crowded round of part 4.
const CROWD_WRITES: usize = 25;

struct Crowd {
    /// The endpoint's connection cap, and the strangers held open in a crowded round.
    cap: usize,
    strangers: usize,
    /// By client (kept-alive kube client, new connection per write), then quiet / crowded.
    samples: [[Vec<Duration>; 2]; 2],
    errors: [[Vec<String>; 2]; 2],
    /// In each crowded round: strangers the endpoint had closed before the writes, and when
    /// they were done.
    closed_before: Vec<usize>,
    closed_after: Vec<usize>,
}

const CROWD_CLIENTS: [&str; 2] = [
    "plain kube client, connection kept alive",
    "new connection per write (raw HTTP/1.1)",
];
const CROWD_OBJECTS: [&str; 2] = ["crowd-kept", "crowd-fresh"];

/// Silent connections to `addr`, as a local process without the secret holds them.
async fn strangers(addr: std::net::SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(
            tokio::net::TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| panic!("a stranger's connect: {e}")),
        );
    }
    held
}

/// How many of `held` the endpoint has closed (end of stream, or reset).
fn closed(held: &[tokio::net::TcpStream]) -> usize {
    let mut buf = [0u8; 1];
    held.iter()
        .filter(|s| match s.try_read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        })
        .count()
}

/// One merge patch of `name` through `proxy` on a connection of its own: Ok when admitted.
async fn patch_on_new_connection(
    proxy: &FenceProxy,
    ns: &str,
    name: &str,
    value: &str,
) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let url = proxy.url();
    let prefix = &url[url.find("/term/").unwrap_or(0)..];
    let body = annotation(value).to_string();
    let request = format!(
        "PATCH {prefix}/api/v1/namespaces/{ns}/configmaps/{name} HTTP/1.1\r\nHost: x\r\nContent-Type: application/merge-patch+json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(proxy.local_addr())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer within 20 s".to_owned())?
        .map_err(|e| format!("read: {e}"))?;
    let answer = String::from_utf8_lossy(&answer);
    if answer.starts_with("HTTP/1.1 200 ") {
        Ok(())
    } else {
        Err(answer.chars().take(300).collect())
    }
}

async fn crowd(dir: &Path, rounds: usize) -> Crowd {
    let held = FencedTerm::begin("bench-fw-crowd", "crowd", &CROWD_OBJECTS).await;
    assert_eq!(held.fence, "proven", "part 4's term");
    let ns = held.ns.clone();
    let proxy = FenceProxy::start(&held.fencer, &held.term, None)
        .await
        .unwrap_or_else(|e| panic!("proxy: {e}"));
    let kept = proxy_client(&proxy, &dir.join("crowd.kubeconfig"), &ns).await;
    let cap = FenceProxy::connection_cap();
    let n_strangers = 2 * cap;
    let mut out = Crowd {
        cap,
        strangers: n_strangers,
        samples: Default::default(),
        errors: Default::default(),
        closed_before: Vec::new(),
        closed_after: Vec::new(),
    };
    let pp = PatchParams::default();
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut i = 0usize;
    // Round 0 warms up (connections, caches) and is not counted.
    for round in 0..=rounds {
        let modes = if next(&mut rng) & 1 == 0 {
            [0, 1]
        } else {
            [1, 0]
        };
        for crowded in modes {
            let held = if crowded == 1 {
                let held = strangers(proxy.local_addr(), n_strangers).await;
                // Steady state: the endpoint has closed all but a cap of them.
                wait_for(Duration::from_secs(30), || {
                    closed(&held) >= n_strangers - cap
                })
                .await;
                out.closed_before.push(closed(&held));
                held
            } else {
                Vec::new()
            };
            for _ in 0..CROWD_WRITES {
                let order = if next(&mut rng) & 1 == 0 {
                    [0, 1]
                } else {
                    [1, 0]
                };
                for client in order {
                    i += 1;
                    let value = format!("c{i}");
                    let start = Instant::now();
                    let r = if client == 0 {
                        kept.patch(CROWD_OBJECTS[0], &pp, &Patch::Merge(annotation(&value)))
                            .await
                            .map(drop)
                            .map_err(|e| e.to_string())
                    } else {
                        patch_on_new_connection(&proxy, &ns, CROWD_OBJECTS[1], &value).await
                    };
                    let took = start.elapsed();
                    match r {
                        Ok(()) if round > 0 => out.samples[client][crowded].push(took),
                        Ok(()) => {}
                        Err(e) => out.errors[client][crowded].push(e),
                    }
                }
            }
            if crowded == 1 {
                out.closed_after.push(closed(&held));
            }
        }
    }
    drop((proxy, kept));
    held.end().await;
    out
}

fn fmt(v: f64) -> String {
    table::fmt_ms(v, 1, 2)
}

fn stats_json(s: Option<Stats>) -> Value {
    s.map_or(Value::Null, |s| {
        json!({"n": s.n, "p50": round3(s.p50), "p90": round3(s.p90), "min": round3(s.min), "max": round3(s.max)})
    })
}

fn p50_p99_ms(v: &[f64]) -> (f64, f64) {
    let (p50, p99) = p50_p99(v.iter().map(|m| Duration::from_secs_f64(m / 1e3)).collect());
    (ms(p50), ms(p99))
}

#[allow(clippy::too_many_lines)]
async fn run() {
    let writes = knob("TENURE_BENCH_WRITES", 1000);
    let kubectl_writes = knob("TENURE_BENCH_KUBECTL_WRITES", 40);
    let rounds = knob("TENURE_BENCH_HANDOVERS", 24);
    let freezes = knob("TENURE_BENCH_FREEZES", 22);
    let crowd_rounds = knob("TENURE_BENCH_CROWD_ROUNDS", 40);
    // For trying things out: TENURE_BENCH_ONLY=latency,handover,takeovers,crowd (default all).
    let want = |part: &str| selected("TENURE_BENCH_ONLY", part);
    let t_run = Instant::now();
    let dir = fresh_dir("bench-fence-workers");
    std::fs::write(dir.join("loop.py"), LOOP_PY).unwrap_or_else(|e| panic!("{e}"));
    let python = python();
    eprintln!(
        "tenure: {}; python: {}; kubectl: {}",
        tenure_bin().display(),
        python.display(),
        kubectl().display()
    );

    let t1 = Instant::now();
    let lat = if want("latency") {
        latency(&dir, writes, kubectl_writes).await
    } else {
        Latency {
            samples: Default::default(),
            errors: Default::default(),
            fence: "not run".into(),
        }
    };
    let secs1 = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    let (hand, hand_problems) = if want("handover") {
        handovers(&dir, &python, rounds).await
    } else {
        Default::default()
    };
    let secs2 = t2.elapsed().as_secs_f64();
    let t3 = Instant::now();
    let mut loops = Vec::new();
    for client in [Client::Kubectl, Client::Python] {
        if want("takeovers") {
            loops.push(takeovers(client, &dir, &python, freezes).await);
        }
    }
    let secs3 = t3.elapsed().as_secs_f64();
    let t4 = Instant::now();
    let crowded = if want("crowd") {
        Some(crowd(&dir, crowd_rounds).await)
    } else {
        None
    };
    let secs4 = t4.elapsed().as_secs_f64();

    // ---- 1 ----
    println!(
        "\n== tenure run --fence on a real kube-apiserver ({:.0} s: {secs1:.0} + {secs2:.0} + {secs3:.0} + {secs4:.0}) ==",
        t_run.elapsed().as_secs_f64()
    );
    println!(
        "\n1. per-write latency: merge patch of one ConfigMap annotation, a term's fence {} (a, b interleaved; then c, d interleaved)\n",
        lat.fence
    );
    println!(
        "{}",
        table::header(&["mode", "n", "p50", "p99", "max", "errors"], 5)
    );
    let stats: Vec<(Duration, Duration)> = lat.samples.iter().cloned().map(p50_p99).collect();
    for (i, name) in MODES.iter().enumerate() {
        let max = lat.samples[i].iter().max().copied().unwrap_or_default();
        println!(
            "{}",
            table::row(&[
                (*name).to_owned(),
                lat.samples[i].len().to_string(),
                fmt(ms(stats[i].0)),
                fmt(ms(stats[i].1)),
                fmt(ms(max)),
                lat.errors[i].len().to_string(),
            ])
        );
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-12);
    let (p50_ratio, p99_ratio) = (ratio(stats[1].0, stats[0].0), ratio(stats[1].1, stats[0].1));
    println!(
        "\nproxy / direct: p50 {p50_ratio:.2}×, p99 {p99_ratio:.2}× (+{:.2} ms at p50); kubectl via proxy / kubectl as admin: p50 {:.2}×",
        ms(stats[1].0) - ms(stats[0].0),
        ratio(stats[2].0, stats[3].0)
    );
    for (i, errs) in lat.errors.iter().enumerate() {
        if let Some(first) = errs.first() {
            println!("errors of {}: {} (first: {first})", MODES[i], errs.len());
        }
    }

    // ---- 2 ----
    println!(
        "\n2. SIGTERM of the leading tenure → the next term's command's first admitted write ({} hand-overs; lease 3 s / renew deadline 2 s / retry 500 ms; ms after the SIGTERM, wall clock)\n",
        hand.len()
    );
    println!("{}", table::header(&["step", "n", "p50", "p99", "max"], 4));
    type Step = (&'static str, fn(&Handover) -> Option<f64>);
    let steps: [Step; 11] = [
        ("old tenure: its command exited", |h| h.old_command_exited),
        ("old tenure: released (stopped leading)", |h| h.released),
        ("old tenure exited (polled every 5 ms)", |h| h.old_exit_ms),
        ("new tenure: became leader (grant)", |h| h.granted),
        ("new tenure: fence proven", |h| h.proven),
        ("new tenure: started the command", |h| h.command),
        ("command (python) started", |h| Some(h.python)),
        ("command: json + urllib imported", |h| Some(h.imported)),
        ("**first write admitted** (total)", |h| Some(h.written)),
        ("grant → first write admitted", |h| {
            h.granted.map(|g| h.written - g)
        }),
        ("the write alone (imported → admitted)", |h| {
            Some(h.written - h.imported)
        }),
    ];
    let mut steps_json = serde_json::Map::new();
    for (name, f) in steps {
        let v: Vec<f64> = hand.iter().filter_map(f).collect();
        let (p50, p99) = p50_p99_ms(&v);
        let max = v.iter().copied().fold(f64::NAN, f64::max);
        println!(
            "{}",
            table::row(&[
                name.to_owned(),
                v.len().to_string(),
                fmt(p50),
                fmt(p99),
                fmt(max)
            ])
        );
        steps_json.insert(
            name.replace('*', ""),
            json!({"n": v.len(), "p50_ms": round2(p50), "p99_ms": round2(p99), "max_ms": round2(max)}),
        );
    }
    let refused_first: u64 = hand.iter().map(|h| h.refused).sum();
    println!("\nfirst writes retried after a refusal or error: {refused_first}");
    for p in &hand_problems {
        println!("problem: {p}");
    }

    // ---- 3 ----
    println!(
        "\n3. stale writes over freeze-and-thaw takeovers (the leader's tenure and command frozen until the other's command writes; a watch of the object is the judge)\n"
    );
    println!(
        "{}",
        table::header(
            &[
                "client",
                "takeovers",
                "terms seen",
                "versions written",
                "stale accepted",
                "old cmd's writes after thaw (admitted)",
                "refusals heard: term ended",
                "stale < current",
                "other",
                "endpoint gone",
                "refusals not naming tenure+token",
                "freeze → other's write p50",
                "p99",
            ],
            12
        )
    );
    for l in &loops {
        let (p50, p99) = p50_p99(l.takeover.clone());
        println!(
            "{}",
            table::row(&[
                l.client.name().to_owned(),
                l.freezes.to_string(),
                l.terms.to_string(),
                l.versions.to_string(),
                l.stale_accepted.len().to_string(),
                format!("{} ({})", l.late.0, l.late.1),
                l.heard.ended.to_string(),
                l.heard.stale.to_string(),
                l.heard.other.len().to_string(),
                l.heard.unreachable.to_string(),
                l.heard.unnamed.to_string(),
                fmt(ms(p50)),
                fmt(ms(p99)),
            ])
        );
    }
    let stale_total: usize = loops.iter().map(|l| l.stale_accepted.len()).sum();
    println!(
        "\nstale writes accepted: {stale_total} (goal 0: {})",
        if stale_total == 0 { "met" } else { "MISSED" }
    );
    for l in &loops {
        if !l.stale_accepted.is_empty() {
            println!(
                "{} stale (token, i, newer token seen): {:?}",
                l.client.name(),
                &l.stale_accepted[..l.stale_accepted.len().min(10)]
            );
        }
        for o in l.heard.other.iter().filter(|o| !o.is_empty()) {
            println!("{} other refusal: {o}", l.client.name());
        }
        for p in &l.problems {
            println!("problem: {p}");
        }
    }

    // ---- 4 ----
    let crowd_json = crowded.as_ref().map_or(Value::Null, report_crowd);

    let json = json!({
        "crowd": crowd_json,
        "latency_ms": {
            "direct": stats_json(Stats::of_ms(&lat.samples[0])),
            "proxy": stats_json(Stats::of_ms(&lat.samples[1])),
            "kubectl_proxy": stats_json(Stats::of_ms(&lat.samples[2])),
            "kubectl_admin_direct": stats_json(Stats::of_ms(&lat.samples[3])),
            "p99": {
                "direct": round3(ms(stats[0].1)),
                "proxy": round3(ms(stats[1].1)),
                "kubectl_proxy": round3(ms(stats[2].1)),
                "kubectl_admin_direct": round3(ms(stats[3].1)),
            },
            "errors": lat.errors.iter().map(Vec::len).collect::<Vec<_>>(),
            "fence": lat.fence,
        },
        "proxy_over_direct": {"p50": round3(p50_ratio), "p99": round3(p99_ratio)},
        "handover_ms_after_sigterm": Value::Object(steps_json),
        "handovers": hand.iter().map(|h| json!({
            "token": h.token,
            "old_command_exited": h.old_command_exited.map(round2),
            "released": h.released.map(round2),
            "granted": h.granted.map(round2),
            "proven": h.proven.map(round2),
            "command": h.command.map(round2),
            "python": round2(h.python),
            "imported": round2(h.imported),
            "written": round2(h.written),
            "refused": h.refused,
        })).collect::<Vec<_>>(),
        "handover_problems": hand_problems,
        "takeovers": loops.iter().map(|l| json!({
            "client": l.client.name(),
            "takeovers": l.freezes,
            "terms_seen": l.terms,
            "versions": l.versions,
            "stale_accepted": l.stale_accepted.len(),
            "old_command_writes_after_thaw": l.late.0,
            "old_command_writes_after_thaw_admitted": l.late.1,
            "admitted_writes_logged": l.heard.ok,
            "refused_term_ended": l.heard.ended,
            "refused_stale_current": l.heard.stale,
            "refused_other": l.heard.other.len(),
            "endpoint_gone": l.heard.unreachable,
            "refusals_not_naming_tenure_and_token": l.heard.unnamed,
            "freeze_to_other_write_ms": stats_json(Stats::of_ms(&l.takeover)),
            "problems": l.problems,
        })).collect::<Vec<_>>(),
        "stale_accepted": stale_total,
        "seconds": round2(t_run.elapsed().as_secs_f64()),
    });
    save_json("kube_fence_workers.json", &json, Say::Stdout);
}

/// Part 4's table; its JSON.
fn report_crowd(c: &Crowd) -> Value {
    println!(
        "\n4. per-write latency through the endpoint, quiet vs beside {} idle strangers (2 × its connection cap of {}), rounds interleaved; merge patch of one annotation\n",
        c.strangers, c.cap
    );
    println!(
        "{}",
        table::header(&["client", "mode", "n", "p50", "p99", "max", "errors"], 5)
    );
    let mut json = serde_json::Map::new();
    for (client, name) in CROWD_CLIENTS.iter().enumerate() {
        let mut p99s = [0.0; 2];
        for (crowded, mode) in ["quiet", "crowded"].iter().enumerate() {
            let samples = &c.samples[client][crowded];
            let (p50, p99) = p50_p99(samples.clone());
            p99s[crowded] = ms(p99);
            let max = samples.iter().max().copied().unwrap_or_default();
            println!(
                "{}",
                table::row(&[
                    (*name).to_owned(),
                    (*mode).to_owned(),
                    samples.len().to_string(),
                    fmt(ms(p50)),
                    fmt(ms(p99)),
                    fmt(ms(max)),
                    c.errors[client][crowded].len().to_string(),
                ])
            );
            json.insert(
                format!("{}_{mode}", CROWD_OBJECTS[client]),
                json!({
                    "stats_ms": stats_json(Stats::of_ms(samples)),
                    "p99_ms": round3(ms(p99)),
                    "errors": c.errors[client][crowded].len(),
                }),
            );
        }
        println!(
            "{name}: p99 crowded / quiet {:.2}×",
            p99s[1] / p99s[0].max(1e-9)
        );
        for (crowded, errs) in c.errors[client].iter().enumerate() {
            if let Some(first) = errs.first() {
                println!(
                    "errors ({name}, crowded={crowded}): {} (first: {first})",
                    errs.len()
                );
            }
        }
    }
    let median = |v: &[usize]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    println!(
        "strangers closed by the endpoint per crowded round (median): {} of {} before the writes, {} after",
        median(&c.closed_before),
        c.strangers,
        median(&c.closed_after)
    );
    json.insert("cap".into(), json!(c.cap));
    json.insert("strangers".into(), json!(c.strangers));
    json.insert(
        "closed_before_median".into(),
        json!(median(&c.closed_before)),
    );
    json.insert("closed_after_median".into(), json!(median(&c.closed_after)));
    Value::Object(json)
}
