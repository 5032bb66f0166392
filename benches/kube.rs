//! Leader election on a real kube-apiserver, side by side: tenure's `LeaderElector`, client-go's
//! `leaderelection` (the `clientgo-candidate` of `e2e/`) and the `kube-lease-manager` crate,
//! each at its default settings, against the same server.
//!
//! For each implementation: a leader and two followers, each its own process (this binary
//! re-executes itself for the Rust ones) with its own User-Agent; the API server's audit log
//! attributes every Lease request to its sender. Measured:
//!
//! - API requests per minute in steady state, by the leader (and its writes) and by each
//!   follower;
//! - graceful hand-off: from SIGTERM to the leader until the next leader's workload starts
//!   (five times, a fresh follower replacing the old leader each time);
//! - crash failover: from SIGKILL of the leader until the next leader's workload starts
//!   (three times, 6–11 s into the leader's term so the kill falls anywhere in its renewal
//!   cycle).
//!
//! Prints a table and writes `target/bench/kube.json`. Run with
//! `cargo bench --bench kube --features kube`. `TENURE_BENCH_WINDOW_SECS` sets the
//! steady-state window (default 60).
//!
//! The tenure candidate is `LeaderElector::run_until` with controller-runtime's durations (lease 15 s,
//! renew deadline 10 s, retry 2 s); SIGTERM is its shutdown signal, so a graceful hand-off is
//! the elector's own shutdown, which releases the Lease.

#[path = "../tests/kube_support/mod.rs"]
mod kube_support;

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use kube_support::{Launch, Server, candidate, fresh_dir, unique};

const NS: &str = "default";
/// The elector defaults (client-go's): lease duration, renew deadline, retry period.
const LEASE: Duration = Duration::from_secs(15);
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const RETRY: Duration = Duration::from_secs(2);

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn emit(event: &str, identity: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{event} {identity} {}", now_ns());
    let _ = out.flush();
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--role") {
        let rest = &args[i + 1..];
        let [role, kubeconfig, lease, identity, ..] = rest else {
            eprintln!("usage: --role tenure|klm KUBECONFIG LEASE IDENTITY");
            return ExitCode::from(2);
        };
        let rt = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
        let run = match role.as_str() {
            "tenure" => rt.block_on(tenure_candidate(kubeconfig, lease, identity)),
            "klm" => rt.block_on(klm_candidate(kubeconfig, lease, identity)),
            other => Err(format!("unknown role {other}")),
        };
        return match run {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{role} candidate {identity}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    orchestrate();
    ExitCode::SUCCESS
}

/// A kube config from `kubeconfig` whose requests carry `user_agent`.
async fn config(kubeconfig: &str, user_agent: &str) -> Result<kube::Config, String> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(user_agent).map_err(|e| e.to_string())?,
    ));
    Ok(config)
}

/// tenure: a `LeaderElector` whose workload lasts its term; SIGTERM shuts it down (releasing).
async fn tenure_candidate(kubeconfig: &str, lease: &str, identity: &str) -> Result<(), String> {
    use tenure::Locker;
    use tenure::backend::kube::{KubeBackend, KubeOptions};
    use tenure::election::{ElectionConfig, LeaderElector};
    use tokio::signal::unix::{SignalKind, signal};

    let backend = KubeBackend::from_config(
        config(kubeconfig, identity).await?,
        KubeOptions::new().namespace(NS),
    )
    .map_err(|e| e.to_string())?;
    let locker = Locker::with_identity(backend, identity).map_err(|e| e.to_string())?;
    let config = ElectionConfig::new()
        .lease_duration(LEASE)
        .renew_deadline(RENEW_DEADLINE)
        .retry_period(RETRY);
    let elector = LeaderElector::new(locker, lease, config).map_err(|e| e.to_string())?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let shutdown = async move {
        sigterm.recv().await;
    };
    elector
        .run_until(shutdown, |term| async move {
            emit("STARTED", identity);
            term.cancellation().cancelled().await;
            emit("ENDED", identity);
        })
        .await
        .map(|_returned_or_stopped| ())
        .map_err(|e| e.to_string())
}

/// kube-lease-manager 0.13 at its defaults (30 s duration, 5 s grace), in its watch mode.
async fn klm_candidate(kubeconfig: &str, lease: &str, identity: &str) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};

    // kube's default client, as kube-lease-manager users build it.
    let client =
        kube::Client::try_from(config(kubeconfig, identity).await?).map_err(|e| e.to_string())?;
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client, lease)
        .with_namespace(NS)
        .with_identity(identity)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let (mut leading, task) = manager.watch().await;
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    loop {
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() {
                    return Err("the lease manager stopped".into());
                }
                let now = *leading.borrow_and_update();
                emit(if now { "STARTED" } else { "ENDED" }, identity);
            }
            _ = term.recv() => {
                if *leading.borrow() {
                    emit("ENDED", identity);
                }
                // Dropping the receiver makes the manager release the lease.
                drop(leading);
                let _ = task.await;
                return Ok(());
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Tenure,
    ClientGo,
    LeaseManager,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Tenure => "tenure LeaderElector",
            Kind::ClientGo => "client-go leaderelection",
            Kind::LeaseManager => "kube-lease-manager 0.13",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Kind::Tenure => "tenure",
            Kind::ClientGo => "client-go",
            Kind::LeaseManager => "kube-lease-manager",
        }
    }
}

/// One candidate process and its events.
struct Candidate {
    identity: String,
    child: Child,
    events: mpsc::Receiver<(String, String, SystemTime)>,
}

impl Candidate {
    fn spawn(kind: Kind, server: &Server, lease: &str, identity: &str) -> Self {
        let kubeconfig = server.admin_kubeconfig();
        let mut cmd = match kind {
            Kind::ClientGo => {
                let mut c = Command::new(candidate());
                c.arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(["--namespace", NS, "--lease", lease, "--identity", identity])
                    .args(["--timestamps", "--user-agent", identity]);
                c
            }
            Kind::Tenure | Kind::LeaseManager => {
                let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
                let mut c = Command::new(exe);
                c.arg("--role")
                    .arg(if kind == Kind::Tenure {
                        "tenure"
                    } else {
                        "klm"
                    })
                    .arg(&kubeconfig)
                    .args([lease, identity]);
                c
            }
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {identity}: {e}"));
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("stdout"));
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut w: Vec<&str> = line.split_whitespace().collect();
                let Some(ns) = w.pop().and_then(|n| n.parse::<u64>().ok()) else {
                    continue;
                };
                let kind = w.first().map(|s| (*s).to_owned()).unwrap_or_default();
                let who = w.get(1..).map(|s| s.join(" ")).unwrap_or_default();
                let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(ns);
                if tx.send((kind, who, at)).is_err() {
                    break;
                }
            }
        });
        Self {
            identity: identity.to_owned(),
            child,
            events,
        }
    }

    fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status();
    }

    fn wait_exit(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits up to `within` for the first STARTED among `who`; returns its index and time.
fn first_started(who: &[&Candidate], within: Duration) -> Option<(usize, SystemTime)> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        for (i, c) in who.iter().enumerate() {
            while let Ok((kind, _, at)) = c.events.try_recv() {
                if kind == "STARTED" {
                    return Some((i, at));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Counts Lease requests of `lease` in the audit log, by User-Agent and verb, received in
/// `[from, to)`.
fn count_requests(
    audit: &Path,
    lease: &str,
    from: SystemTime,
    to: SystemTime,
) -> BTreeMap<String, BTreeMap<String, u64>> {
    let text = std::fs::read_to_string(audit).unwrap_or_default();
    let mut seen = HashSet::new();
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for line in text.lines() {
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let obj = &ev["objectRef"];
        if obj["resource"] != "leases" {
            continue;
        }
        // Requests about this Lease by name, and the name-selected lists and watches.
        let uri = ev["requestURI"].as_str().unwrap_or_default();
        let about = obj["name"].as_str() == Some(lease)
            || uri.contains(&format!("metadata.name%3D{lease}"));
        if !about {
            continue;
        }
        let id = ev["auditID"].as_str().unwrap_or_default().to_owned();
        let Some(at) = ev["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(SystemTime::from)
        else {
            continue;
        };
        if at < from || at >= to || !seen.insert(id) {
            continue;
        }
        let ua = ev["userAgent"].as_str().unwrap_or_default().to_owned();
        let verb = ev["verb"].as_str().unwrap_or_default().to_owned();
        *out.entry(ua).or_default().entry(verb).or_default() += 1;
    }
    out
}

#[derive(Debug, Default)]
struct Figures {
    leader_requests_per_min: f64,
    leader_writes_per_min: f64,
    follower_requests_per_min: Vec<f64>,
    graceful_handoffs: Vec<Duration>,
    crash_failovers: Vec<Duration>,
    verbs: BTreeMap<String, BTreeMap<String, u64>>,
}

/// Graceful hand-offs and crash failovers measured per implementation.
const HANDOFFS: usize = 5;
const CRASHES: usize = 3;

/// A pseudo-random pause in `[lo, hi)`, so crashes fall at different points of the renewal
/// cycle.
fn pause_between(lo: Duration, hi: Duration) -> Duration {
    let r = tenure::backend::HolderToken::random().as_bytes()[0];
    lo + (hi - lo).mul_f64(f64::from(r) / 256.0)
}

fn measure(kind: Kind, server: &Server, audit: &Path, window: Duration) -> Figures {
    let lease = unique(&format!("bench-{}", kind.key()));
    let id = |n: usize| format!("{}-{}", kind.key(), (b'a' + n as u8) as char);
    eprintln!("== {}: lease {lease}", kind.label());
    let leader = Candidate::spawn(kind, server, &lease, &id(0));
    first_started(&[&leader], Duration::from_secs(60))
        .unwrap_or_else(|| panic!("{}: the first candidate never led", kind.label()));
    let mut cands = vec![
        leader,
        Candidate::spawn(kind, server, &lease, &id(1)),
        Candidate::spawn(kind, server, &lease, &id(2)),
    ];
    // Let the followers settle (first reads, watches) before the window opens.
    std::thread::sleep(Duration::from_secs(5));
    let from = SystemTime::now();
    std::thread::sleep(window);
    let to = SystemTime::now();
    let counts = count_requests(audit, &lease, from, to);
    let minutes = window.as_secs_f64() / 60.0;
    let per_min = |ua: &str, write_only: bool| {
        counts.get(ua).map_or(0.0, |verbs| {
            verbs
                .iter()
                .filter(|(v, _)| !write_only || matches!(v.as_str(), "update" | "patch" | "create"))
                .map(|(_, n)| *n as f64)
                .sum::<f64>()
                / minutes
        })
    };
    let mut figures = Figures {
        leader_requests_per_min: per_min(&cands[0].identity, false),
        leader_writes_per_min: per_min(&cands[0].identity, true),
        follower_requests_per_min: vec![
            per_min(&cands[1].identity, false),
            per_min(&cands[2].identity, false),
        ],
        verbs: counts.clone(),
        ..Figures::default()
    };

    // The leader is cands[0]; every trial ends it, and a fresh follower replaces it.
    for (trial, next_id) in (0..HANDOFFS + CRASHES).zip(3..) {
        let crash = trial >= HANDOFFS;
        if crash {
            // The leader has led, and renewed, for a while before it dies.
            std::thread::sleep(pause_between(
                Duration::from_secs(6),
                Duration::from_secs(11),
            ));
        } else {
            std::thread::sleep(Duration::from_secs(3));
        }
        let mut old = cands.remove(0);
        let stop = SystemTime::now();
        old.signal(if crash { "-KILL" } else { "-TERM" });
        let others: Vec<&Candidate> = cands.iter().collect();
        let next = first_started(&others, LEASE * 4);
        old.wait_exit();
        let Some((i, at)) = next else {
            eprintln!("{}: no follower took over (trial {trial})", kind.label());
            return figures;
        };
        let took = at.duration_since(stop).unwrap_or_default();
        eprintln!(
            "   {} {}: {:?}",
            if crash {
                "crash failover"
            } else {
                "graceful hand-off"
            },
            cands[i].identity,
            took
        );
        if crash {
            figures.crash_failovers.push(took);
        } else {
            figures.graceful_handoffs.push(took);
        }
        let new_leader = cands.remove(i);
        cands.insert(0, new_leader);
        cands.push(Candidate::spawn(kind, server, &lease, &id(next_id)));
    }
    for c in &mut cands {
        c.signal("-TERM");
        c.wait_exit();
    }
    figures
}

fn median(v: &[Duration]) -> Option<Duration> {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied()
}

fn target_dir() -> PathBuf {
    // target/<profile>/deps/<bench binary>
    std::env::current_exe()
        .ok()
        .and_then(|p| p.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("target"))
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "—".to_owned(),
        |d| format!("{:.0} ms", d.as_secs_f64() * 1000.0),
    )
}

/// "median (min–max)" of a set of durations.
fn spread(v: &[Duration]) -> String {
    match (median(v), v.iter().min(), v.iter().max()) {
        (Some(m), Some(lo), Some(hi)) => format!(
            "{} ({:.0}–{:.0})",
            ms(Some(m)),
            lo.as_secs_f64() * 1000.0,
            hi.as_secs_f64() * 1000.0
        ),
        _ => "—".to_owned(),
    }
}

fn orchestrate() {
    let window = std::env::var("TENURE_BENCH_WINDOW_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(60), Duration::from_secs);
    let audit_dir = fresh_dir("audit");
    let policy = audit_dir.join("policy.yaml");
    let audit = audit_dir.join("audit.log");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n\
         - level: Metadata\n  resources:\n  - group: coordination.k8s.io\n    resources: [\"leases\"]\n\
         - level: None\n",
    )
    .unwrap_or_else(|e| panic!("audit policy: {e}"));
    let started = Instant::now();
    let server = Server::start(Launch {
        extra: vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit.display()),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
        ],
        ..Launch::default()
    });
    eprintln!("kube-apiserver ready in {:?}", started.elapsed());

    let kinds = [Kind::Tenure, Kind::ClientGo, Kind::LeaseManager];
    let results: Vec<(Kind, Figures)> = kinds
        .iter()
        .map(|&k| (k, measure(k, &server, &audit, window)))
        .collect();

    println!();
    println!(
        "Leader election on kube-apiserver v1.36.3 (127.0.0.1), steady-state window {:?}, lease 15 s / renew deadline 10 s / retry 2 s (kube-lease-manager: its defaults, 30 s / grace 5 s)",
        window
    );
    println!();
    println!(
        "| implementation | leader req/min | leader writes/min | follower 1 req/min | follower 2 req/min | graceful hand-off, median (min–max ms) of {HANDOFFS} | crash failover (kill -9), median (min–max ms) of {CRASHES} |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (k, f) in &results {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} |",
            k.label(),
            f.leader_requests_per_min,
            f.leader_writes_per_min,
            f.follower_requests_per_min.first().copied().unwrap_or(0.0),
            f.follower_requests_per_min.get(1).copied().unwrap_or(0.0),
            spread(&f.graceful_handoffs),
            spread(&f.crash_failovers),
        );
    }
    let base = results
        .iter()
        .find(|(k, _)| *k == Kind::ClientGo)
        .map(|(_, f)| f);
    let ten = results
        .iter()
        .find(|(k, _)| *k == Kind::Tenure)
        .map(|(_, f)| f);
    if let (Some(b), Some(t)) = (base, ten) {
        println!();
        println!(
            "tenure vs client-go: leader writes {:.0}% (target ≤ 40%), followers {:.1} vs {:.1} req/min, graceful hand-off {}x faster by median (target ≥ 10x), crash failover at most {} (target ≤ lease + retry = 17 s)",
            100.0 * t.leader_writes_per_min / b.leader_writes_per_min.max(f64::MIN_POSITIVE),
            t.follower_requests_per_min.iter().sum::<f64>() / 2.0,
            b.follower_requests_per_min.iter().sum::<f64>() / 2.0,
            match (median(&t.graceful_handoffs), median(&b.graceful_handoffs)) {
                (Some(t), Some(b)) => format!("{:.0}", b.as_secs_f64() / t.as_secs_f64().max(1e-6)),
                _ => "?".into(),
            },
            ms(t.crash_failovers.iter().max().copied()),
        );
    }
    println!();
    println!("Requests in the window by User-Agent and verb:");
    for (k, f) in &results {
        for (ua, verbs) in &f.verbs {
            println!("  {:<26} {ua:<22} {verbs:?}", k.key());
        }
    }

    let json = serde_json::json!({
        "server": "kube-apiserver v1.36.3 + etcd v3.6.8 (kube-testenv), 127.0.0.1",
        "window_secs": window.as_secs(),
        "results": results.iter().map(|(k, f)| serde_json::json!({
            "implementation": k.key(),
            "leader_requests_per_min": f.leader_requests_per_min,
            "leader_writes_per_min": f.leader_writes_per_min,
            "follower_requests_per_min": f.follower_requests_per_min,
            "graceful_handoff_ms": f.graceful_handoffs.iter().map(|d| d.as_secs_f64() * 1000.0).collect::<Vec<_>>(),
            "crash_failover_ms": f.crash_failovers.iter().map(|d| d.as_secs_f64() * 1000.0).collect::<Vec<_>>(),
            "requests_by_user_agent_and_verb": f.verbs,
        })).collect::<Vec<_>>(),
    });
    let dir = target_dir().join("bench");
    let path = dir.join("kube.json");
    match std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&json).unwrap_or_default(),
        )
    }) {
        Ok(()) => println!("\nwrote {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
    drop(server);
}
