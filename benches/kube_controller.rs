//! Controllers under leadership on a real kube-apiserver, side by side: how long a new leader
//! takes from its grant to its first reconcile, with 1,000, 10,000 and 100,000 watched
//! ConfigMaps, for
//!
//! - tenure warm: `tenure::controller::Controller` (`CacheMode::Warm`) + `LeaderElector`, the
//!   store kept current on the follower and its controller on standby (every object queued,
//!   each reconcile parked until the grant);
//! - tenure warm without standby: the same with `Controller::standby(false)`: the store is warm,
//!   the new leader queues every object after its grant;
//! - tenure cold: the same with `CacheMode::Cold`, the watch started per term;
//! - controller-runtime warm: a manager with Lease leader election and a controller
//!   `For(&corev1.ConfigMap{})` with `EnableWarmup` (`e2e/controller-runtime-peer`);
//! - controller-runtime cold: the same manager without warm-up.
//!
//! Each configuration runs a leader and one follower, each its own process (this binary
//! re-executes itself for tenure's), on its own Lease; the follower is running — and, when
//! warm, synced — before the leader gets SIGTERM, which both implementations answer by
//! stopping their controller and releasing the Lease. Every candidate prints when it was
//! granted the lease (tenure: its term's workload starts; controller-runtime: its acquiring
//! Lease write returns — its `Elected()` channel closes only after its controller has started,
//! so a warm queue's first reconcile can come before it), when its first reconcile started,
//! and when it had reconciled every object, in wall-clock nanoseconds on this one machine. Each replaced leader is
//! replaced by a fresh follower, so every sample is a follower that has never led.
//!
//! The ConfigMaps (labelled `bench=controller`, 256 bytes of data each, in one namespace) are
//! created once, 1,000 and then 9,000 more, with a bounded number of creates in flight; every
//! candidate's cache is restricted to that namespace and label. The trials are interleaved:
//! each round runs one hand-off per configuration in turn, one at a time, and waits until the
//! new leader has reconciled every object and the new follower is ready (warm: synced) before
//! the next, so nothing else is busy while a hand-off is measured.
//!
//! Also measured on each follower just before its hand-off: its resident memory (VmRSS from
//! `/proc/PID/status`), its open ConfigMap WATCH requests (from the API server's audit log,
//! by User-Agent: started and not completed) and its established TCP connections to the API
//! server (its socket inodes matched in `/proc/PID/net/tcp{,6}`; client-go multiplexes its
//! requests over one HTTP/2 connection, kube-rs opens one HTTP/1.1 connection per watch).
//!
//! Prints a table and the ratios, and writes `target/bench/kube_controller.json`. Run with
//! `cargo bench --features kube --bench kube_controller` (about 4 minutes after the build).
//! `TENURE_BENCH_HANDOFFS` sets the hand-offs per configuration (default 11; p50 is the sample
//! at index round(0.5·(n−1)) of the sorted samples), `TENURE_BENCH_COUNTS` the object counts
//! (default `1000,10000,100000`). All candidates run with the same short durations (lease 6 s, renew
//! deadline 4 s, retry 1 s), printed with the results.

#[path = "support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use support::apiserver::{self, config_as, go_peer};
use support::env::{knob, knob_list};
use support::kube_harness::{Server, fresh_dir};
use support::out::{Say, save_json};
use support::proc::{Process, read_events, rss_kib};
use support::role::{command, event};
use support::stats::{Stats, ms, round3};
use support::table;

/// The namespace of the ConfigMaps and of every configuration's Lease.
const NS: &str = "bench-controller";
/// The label every watched ConfigMap carries, and every candidate's selector.
const LABEL: (&str, &str) = ("bench", "controller");
const SELECTOR: &str = "bench=controller";
/// Bytes of data per ConfigMap.
const PAYLOAD: usize = 256;
/// Creates in flight at once while the ConfigMaps are made.
const IN_FLIGHT: usize = 32;
/// Every candidate's durations (tenure and controller-runtime alike).
const LEASE: Duration = Duration::from_secs(6);
const RENEW_DEADLINE: Duration = Duration::from_secs(4);
const RETRY: Duration = Duration::from_secs(1);
/// tenure's candidates run on this many tokio workers (Go's GOMAXPROCS is the core count, 2).
const WORKERS: usize = 2;
/// How long a cold follower is given, once running, to read the Lease and start campaigning.
const COLD_SETTLE: Duration = Duration::from_millis(1500);
/// How long a warm follower is given, once synced, to settle (its controller-runtime queue
/// filled, its allocator quiet).
const WARM_SETTLE: Duration = Duration::from_millis(500);

fn main() -> ExitCode {
    if let Some(args) = support::role::args() {
        let [mode, kubeconfig, lease, identity, expect, ..] = &args[..] else {
            eprintln!("usage: --role warm|queued|cold KUBECONFIG LEASE IDENTITY EXPECT");
            return ExitCode::from(2);
        };
        let expect = expect.parse().unwrap_or(0);
        return support::role::run(WORKERS, &format!("tenure candidate {identity}"), || {
            tenure_candidate(mode, kubeconfig, lease, identity, expect)
        });
    }
    orchestrate();
    ExitCode::SUCCESS
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// One term's reconcile context: prints the term's first reconcile, and when `expect`
/// distinct objects have been reconciled.
struct TermCtx {
    identity: String,
    expect: usize,
    first: AtomicBool,
    seen: Mutex<HashSet<String>>,
    all: AtomicBool,
}

async fn reconcile(
    cm: Arc<k8s_openapi::api::core::v1::ConfigMap>,
    ctx: Arc<TermCtx>,
) -> Result<kube::runtime::controller::Action, Never> {
    if !ctx.first.swap(true, Ordering::SeqCst) {
        event("FIRST", &ctx.identity);
    }
    if ctx.expect > 0 && !ctx.all.load(Ordering::SeqCst) {
        let done = {
            let mut seen = ctx.seen.lock().unwrap_or_else(|p| p.into_inner());
            seen.insert(cm.metadata.name.clone().unwrap_or_default());
            seen.len() >= ctx.expect
        };
        if done && !ctx.all.swap(true, Ordering::SeqCst) {
            event("ALL", &ctx.identity);
        }
    }
    // As the controller-runtime peer: nothing to do until the object changes.
    Ok(kube::runtime::controller::Action::await_change())
}

/// tenure: a `Controller` (warm or cold) run with a `LeaderElector` on the kube backend; each
/// term's context is made at its grant. SIGTERM shuts it down gracefully (the controller stops,
/// the Lease is released).
async fn tenure_candidate(
    mode: &str,
    kubeconfig: &str,
    lease: &str,
    identity: &str,
    expect: usize,
) -> Result<(), String> {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::controller::Action;
    use kube::runtime::watcher;
    use tenure::controller::{CacheMode, CacheState, Controller, per_term};
    use tokio::signal::unix::{SignalKind, signal};

    let config = config_as(kubeconfig, identity).await?;
    let client = kube::Client::try_from(config.clone()).map_err(|e| e.to_string())?;
    let elector = apiserver::elector(config, NS, lease, identity, (LEASE, RENEW_DEADLINE, RETRY))?;
    let (mode, standby) = match mode {
        "warm" => (CacheMode::Warm, true),
        "queued" => (CacheMode::Warm, false),
        "cold" => (CacheMode::Cold, false),
        other => return Err(format!("unknown mode {other}")),
    };
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let controller = Controller::new(
        kube::Api::<ConfigMap>::namespaced(client, NS),
        watcher::Config::default().labels(SELECTOR),
    )
    .cache_mode(mode)
    .standby(standby)
    .graceful_shutdown_on(async move {
        sigterm.recv().await;
    });
    event("READY", identity);
    if mode == CacheMode::Warm {
        let (status, identity) = (controller.status(), identity.to_owned());
        tokio::spawn(async move {
            // With a standby, ready once every object is parked for the grant.
            while status.state() != CacheState::Warm || (standby && !status.standby_ready()) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            event("WARM", &identity);
        });
    }
    let who = identity.to_owned();
    let context = per_term(move |_| {
        event("GRANT", &who);
        Arc::new(TermCtx {
            identity: who.clone(),
            expect,
            first: AtomicBool::new(false),
            seen: Mutex::new(HashSet::new()),
            all: AtomicBool::new(false),
        })
    });
    let mut failed = None;
    let mut results = std::pin::pin!(controller.run(
        &elector,
        reconcile,
        |_, _, _| Action::await_change(),
        context
    ));
    while let Some(r) = results.next().await {
        match r {
            Err(kube::runtime::controller::Error::QueueError(e)) => failed = Some(e.to_string()),
            Err(e) => eprintln!("controller: {e}"),
            Ok(_) => {}
        }
    }
    failed.map_or(Ok(()), Err)
}

/// The four configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    TenureWarm,
    TenureQueued,
    TenureCold,
    CrWarm,
    CrCold,
}

const KINDS: [Kind; 5] = [
    Kind::TenureWarm,
    Kind::TenureQueued,
    Kind::TenureCold,
    Kind::CrWarm,
    Kind::CrCold,
];

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::TenureWarm => "tenure Controller, warm (standby)",
            Kind::TenureQueued => "tenure Controller, warm, no standby",
            Kind::TenureCold => "tenure Controller, cold",
            Kind::CrWarm => "controller-runtime 0.24.1, EnableWarmup",
            Kind::CrCold => "controller-runtime 0.24.1, no warm-up",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Kind::TenureWarm => "tenure-warm",
            Kind::TenureQueued => "tenure-warm-nostandby",
            Kind::TenureCold => "tenure-cold",
            Kind::CrWarm => "cr-warm",
            Kind::CrCold => "cr-cold",
        }
    }
    fn warm(self) -> bool {
        matches!(self, Kind::TenureWarm | Kind::TenureQueued | Kind::CrWarm)
    }
}

/// The controller-runtime peer, built (or found in the cache) by `kube-testenv.sh
/// build-cr-peer`.
fn cr_peer() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/scripts/kube-testenv.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg("build-cr-peer")
            .stderr(Stdio::inherit())
            .output()
            .expect("run kube-testenv.sh build-cr-peer");
        assert!(
            out.status.success(),
            "`kube-testenv.sh build-cr-peer` failed ({}); it needs Go and the Go module proxy for the first build",
            out.status
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let path = PathBuf::from(text.trim().lines().last().unwrap_or_default());
        assert!(path.is_file(), "build-cr-peer printed no binary path");
        path
    })
}

/// One candidate process and the events it printed.
struct Candidate {
    process: Process,
    events: mpsc::Receiver<(String, SystemTime)>,
    seen: VecDeque<(String, SystemTime)>,
}

impl Candidate {
    fn spawn(
        kind: Kind,
        server: &Server,
        lease: &str,
        identity: &str,
        expect: usize,
        log: &Path,
    ) -> Self {
        let kubeconfig = server.admin_kubeconfig();
        let mut cmd = match kind {
            Kind::CrWarm | Kind::CrCold => {
                let durations = (LEASE, RENEW_DEADLINE, RETRY);
                let mut c = go_peer(cr_peer(), &kubeconfig, NS, lease, identity, durations);
                c.args(["--selector", SELECTOR])
                    .args(["--expect", &expect.to_string()]);
                if kind == Kind::CrWarm {
                    c.arg("--warmup");
                }
                c
            }
            Kind::TenureWarm | Kind::TenureQueued | Kind::TenureCold => {
                let mut c = command(match kind {
                    Kind::TenureWarm => "warm",
                    Kind::TenureQueued => "queued",
                    _ => "cold",
                });
                c.arg(&kubeconfig)
                    .args([lease, identity, &expect.to_string()]);
                c
            }
        };
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("the candidates' log");
        let (process, stdout) = Process::spawn(&mut cmd, identity, stderr);
        let (tx, events) = mpsc::channel();
        read_events(
            stdout,
            tx,
            |w, at| Some(((*w.first()?).to_owned(), at)),
            || None,
        );
        Self {
            process,
            events,
            seen: VecDeque::new(),
        }
    }

    /// Waits up to `within` for event `kind` (seen before or printed later); its time.
    fn wait(&mut self, kind: &str, within: Duration) -> Option<SystemTime> {
        let deadline = Instant::now() + within;
        loop {
            while let Ok(ev) = self.events.try_recv() {
                self.seen.push_back(ev);
            }
            if let Some(at) = self.seen.iter().find(|(k, _)| k == kind).map(|(_, at)| *at) {
                return Some(at);
            }
            if Instant::now() >= deadline {
                return None;
            }
            if let Ok(Some(status)) = self.process.child.try_wait() {
                eprintln!(
                    "{} exited ({status}) while waiting for {kind}",
                    self.process.identity
                );
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Whether it has printed `kind` so far.
    fn has(&mut self, kind: &str) -> bool {
        while let Ok(ev) = self.events.try_recv() {
            self.seen.push_back(ev);
        }
        self.seen.iter().any(|(k, _)| k == kind)
    }

    /// SIGTERM, sent directly (spawning kill(1) would add its start-up to the hand-off).
    fn terminate(&self) {
        self.process.terminate();
    }

    fn wait_exit(&mut self) {
        if !self.process.wait_exit(Duration::from_secs(40)) {
            eprintln!(
                "{} still running 40 s after SIGTERM: killed",
                self.process.identity
            );
        }
    }
}

/// A process's established TCP connections to `port` on the loopback (its socket inodes
/// matched in its network namespace's tables).
fn connections_to(pid: u32, port: u16) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    let inodes: HashSet<String> = fds
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .map(str::to_owned)
        })
        .collect();
    let want = format!("{port:04X}");
    let mut n = 0;
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let (Some(rem), Some(st), Some(inode)) = (f.get(2), f.get(3), f.get(9)) else {
                continue;
            };
            if *st == "01"
                && rem.rsplit(':').next() == Some(want.as_str())
                && inodes.contains(*inode)
            {
                n += 1;
            }
        }
    }
    n
}

/// ConfigMap WATCH requests of `user_agent` open now: started (ResponseStarted) and not
/// completed (ResponseComplete), in the audit log.
fn open_watches(audit: &Path, user_agent: &str) -> usize {
    let mut open = HashSet::new();
    for ev in apiserver::audit_events(audit) {
        if ev["userAgent"].as_str() != Some(user_agent)
            || ev["verb"] != "watch"
            || ev["objectRef"]["resource"] != "configmaps"
        {
            continue;
        }
        let id = ev["auditID"].as_str().unwrap_or_default().to_owned();
        match ev["stage"].as_str() {
            Some("ResponseStarted") => {
                open.insert(id);
            }
            Some("ResponseComplete" | "Panic") => {
                open.remove(&id);
            }
            _ => {}
        }
    }
    open.len()
}

/// Initial syncs of `user_agent`'s ConfigMap cache received at or after `since`: LIST requests,
/// and WATCH requests that stream the initial state (`sendInitialEvents=true`, client-go's
/// WatchList).
fn syncs_since(audit: &Path, user_agent: &str, since: SystemTime) -> usize {
    let mut ids = HashSet::new();
    for ev in apiserver::audit_events(audit) {
        if ev["userAgent"].as_str() != Some(user_agent)
            || ev["objectRef"]["resource"] != "configmaps"
        {
            continue;
        }
        let sync = ev["verb"] == "list"
            || (ev["verb"] == "watch"
                && ev["requestURI"]
                    .as_str()
                    .is_some_and(|u| u.contains("sendInitialEvents=true")));
        let at = apiserver::timestamp(&ev["requestReceivedTimestamp"]);
        if sync && at.is_some_and(|at| at >= since) {
            ids.insert(ev["auditID"].as_str().unwrap_or_default().to_owned());
        }
    }
    ids.len()
}

#[derive(Debug, Default)]
struct Figures {
    /// From the new leader's grant to its first reconcile's start.
    grant_to_first: Vec<Duration>,
    /// From the new leader's grant until it had reconciled every object.
    grant_to_all: Vec<Duration>,
    /// From SIGTERM to the old leader until the new leader's grant.
    stop_to_grant: Vec<Duration>,
    /// The follower, just before its hand-off.
    follower_rss_kib: Vec<u64>,
    follower_open_watches: Vec<usize>,
    follower_connections: Vec<usize>,
    /// From SIGTERM to the old leader until the new leader's first reconcile.
    stop_to_first: Vec<Duration>,
    /// Initial syncs (LIST or WatchList) of the new leader after its grant (warm: none).
    syncs_after_grant: Vec<usize>,
    failed: usize,
}

/// One configuration at one object count: `leader` leads, `follower` follows.
struct Group {
    kind: Kind,
    objects: usize,
    lease: String,
    leader: Candidate,
    follower: Candidate,
    figures: Figures,
}

struct Env<'a> {
    server: &'a Server,
    audit: PathBuf,
    log: PathBuf,
    port: u16,
}

/// How long a new leader may take to reconcile everything.
const ALL_WITHIN: Duration = Duration::from_secs(180);

impl Group {
    fn start(kind: Kind, objects: usize, env: &Env<'_>) -> Self {
        let lease = format!("{}-{objects}", kind.key());
        let mut leader = Self::spawn_one(kind, objects, &lease, env);
        leader.wait("GRANT", LEASE * 4).unwrap_or_else(|| {
            panic!(
                "{} ({objects}): the first candidate never led",
                kind.label()
            )
        });
        leader.wait("ALL", ALL_WITHIN).unwrap_or_else(|| {
            panic!(
                "{} ({objects}): the first leader never reconciled everything",
                kind.label()
            )
        });
        let follower = Self::follower(kind, objects, &lease, env);
        Self {
            kind,
            objects,
            lease,
            leader,
            follower,
            figures: Figures::default(),
        }
    }

    fn spawn_one(kind: Kind, objects: usize, lease: &str, env: &Env<'_>) -> Candidate {
        static SPAWNED: AtomicUsize = AtomicUsize::new(0);
        let id = format!(
            "{}-{objects}-{}",
            kind.key(),
            SPAWNED.fetch_add(1, Ordering::Relaxed)
        );
        Candidate::spawn(kind, env.server, lease, &id, objects, &env.log)
    }

    /// A new follower, running and (warm) synced.
    fn follower(kind: Kind, objects: usize, lease: &str, env: &Env<'_>) -> Candidate {
        let mut c = Self::spawn_one(kind, objects, lease, env);
        c.wait("READY", Duration::from_secs(60))
            .unwrap_or_else(|| panic!("{}: never ready", c.process.identity));
        if kind.warm() {
            c.wait("WARM", Duration::from_secs(120))
                .unwrap_or_else(|| panic!("{}: its cache never synced", c.process.identity));
            std::thread::sleep(WARM_SETTLE);
        } else {
            std::thread::sleep(COLD_SETTLE);
        }
        assert!(
            !c.has("GRANT"),
            "{}: a follower led before its hand-off",
            c.process.identity
        );
        c
    }

    /// One hand-off: SIGTERM to the leader; the follower's grant, first reconcile and last
    /// object; then the old leader is replaced by a fresh follower.
    fn trial(&mut self, env: &Env<'_>, round: usize, rounds: usize) {
        let f = &mut self.figures;
        let pid = self.follower.process.pid();
        f.follower_rss_kib.push(rss_kib(pid).unwrap_or(0));
        f.follower_open_watches
            .push(open_watches(&env.audit, &self.follower.process.identity));
        f.follower_connections.push(connections_to(pid, env.port));

        let stop = SystemTime::now();
        self.leader.terminate();
        let grant = self.follower.wait("GRANT", LEASE * 4);
        let first = grant.and_then(|_| self.follower.wait("FIRST", ALL_WITHIN));
        let all = first.and_then(|_| self.follower.wait("ALL", ALL_WITHIN));
        self.leader.wait_exit();
        let (Some(grant), Some(first), Some(all)) = (grant, first, all) else {
            eprintln!(
                "   {} ({}): hand-off {}/{rounds} failed (grant {grant:?}, first {first:?}, all {all:?}); see {}",
                self.kind.key(),
                self.objects,
                round + 1,
                env.log.display()
            );
            f.failed += 1;
            // Start over with a fresh pair, keeping the figures.
            let figures = std::mem::take(&mut self.figures);
            *self = Group::start(self.kind, self.objects, env);
            self.figures = figures;
            return;
        };
        let since = |a: SystemTime, b: SystemTime| a.duration_since(b).unwrap_or_default();
        f.grant_to_first.push(since(first, grant));
        f.grant_to_all.push(since(all, grant));
        f.stop_to_grant.push(since(grant, stop));
        f.stop_to_first.push(since(first, stop));
        f.syncs_after_grant.push(syncs_since(
            &env.audit,
            &self.follower.process.identity,
            grant,
        ));
        eprintln!(
            "   {:<12} {:>6} objects  hand-off {}/{rounds}: grant → first reconcile {}, → all {}; SIGTERM → grant {}",
            self.kind.key(),
            self.objects,
            round + 1,
            fmt_ms(ms(since(first, grant))),
            fmt_ms(ms(since(all, grant))),
            fmt_ms(ms(since(grant, stop))),
        );
        let next = Self::follower(self.kind, self.objects, &self.lease, env);
        let new_leader = std::mem::replace(&mut self.follower, next);
        drop(std::mem::replace(&mut self.leader, new_leader));
    }

    fn stop(&mut self) {
        self.leader.terminate();
        self.follower.terminate();
        self.leader.wait_exit();
        self.follower.wait_exit();
    }
}

/// p50 (the sample at index round(0.5·(n−1)) of the sorted samples), min, max, and the samples.
fn stats_json(s: Stats, samples: Vec<f64>) -> Value {
    json!({"n": s.n, "p50": round3(s.p50), "min": round3(s.min), "max": round3(s.max),
           "samples": samples.into_iter().map(round3).collect::<Vec<_>>()})
}

/// `2.1 ms` / `1.31 s`.
fn fmt_ms(v: f64) -> String {
    table::fmt_ms(v, 0, 1)
}

fn cell(s: Option<Stats>) -> String {
    s.map_or_else(
        || "—".to_owned(),
        |s| format!("{} ({}–{})", fmt_ms(s.p50), fmt_ms(s.min), fmt_ms(s.max)),
    )
}

/// Makes sure the namespace holds `count` labelled ConfigMaps `cm-0` … (creating the missing
/// ones, `IN_FLIGHT` at a time); returns how long the creates took.
fn fill(rt: &tokio::runtime::Runtime, server: &Server, from: usize, count: usize) -> Duration {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::PostParams;

    let started = Instant::now();
    rt.block_on(async {
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(server.admin().await, NS);
        let payload = "x".repeat(PAYLOAD);
        let made = futures::stream::iter(from..count)
            .map(|i| {
                let api = api.clone();
                let mut cm = ConfigMap::default();
                cm.metadata.name = Some(format!("cm-{i}"));
                cm.metadata.labels = Some([(LABEL.0.to_owned(), LABEL.1.to_owned())].into());
                cm.data = Some([("payload".to_owned(), payload.clone())].into());
                async move {
                    for attempt in 0.. {
                        match api.create(&PostParams::default(), &cm).await {
                            Ok(_) => return,
                            Err(kube::Error::Api(s)) if s.code == 409 => return,
                            Err(e) if attempt < 5 => {
                                eprintln!("create cm-{i}: {e}; retrying");
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                            Err(e) => panic!("create cm-{i}: {e}"),
                        }
                    }
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .count()
            .await;
        assert_eq!(made, count - from);
    });
    started.elapsed()
}

fn orchestrate() {
    let handoffs = knob("TENURE_BENCH_HANDOFFS", 11).max(1);
    let counts: Vec<usize> =
        knob_list("TENURE_BENCH_COUNTS").unwrap_or_else(|| vec![1000, 10_000, 100_000]);
    let mut counts = counts;
    counts.sort_unstable();
    let started = Instant::now();
    // Built before the server starts, so a cold Go build does not eat into anything.
    eprintln!("controller-runtime peer: {}", cr_peer().display());

    let dir = fresh_dir("ctrl-bench");
    let log = dir.join("candidates.log");
    let (server, audit) = apiserver::start_audited(
        &dir,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n\
         - level: Metadata\n  verbs: [\"list\", \"watch\"]\n  resources:\n  - group: \"\"\n    resources: [\"configmaps\"]\n\
         - level: None\n",
    );
    let port: u16 = server
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the server's port");
    eprintln!(
        "kube-apiserver ready in {:?} ({})",
        started.elapsed(),
        server.url()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(server.namespace(NS));
    let env = Env {
        server: &server,
        audit,
        log,
        port,
    };

    let mut created = BTreeMap::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut have = 0;
    for &count in &counts {
        let took = fill(&rt, &server, have, count);
        eprintln!(
            "== {count} ConfigMaps: created {} in {:.1} s ({:.0}/s, {IN_FLIGHT} in flight)",
            count - have,
            took.as_secs_f64(),
            (count - have) as f64 / took.as_secs_f64().max(1e-9)
        );
        created.insert(count, round3(took.as_secs_f64()));
        have = count;
        let mut these: Vec<Group> = KINDS
            .iter()
            .map(|&k| Group::start(k, count, &env))
            .collect();
        for round in 0..handoffs {
            for g in &mut these {
                g.trial(&env, round, handoffs);
            }
        }
        for g in &mut these {
            g.stop();
        }
        groups.extend(these);
    }
    let elapsed = started.elapsed();

    let durations = format!(
        "{}, for every candidate",
        table::durations(LEASE, RENEW_DEADLINE, RETRY)
    );
    println!();
    println!(
        "Controllers under leadership on kube-apiserver v1.36.3 (127.0.0.1): grant → first reconcile after a graceful hand-off (SIGTERM to the leader, follower running and, when warm, synced); {durations}; {handoffs} hand-offs per configuration, interleaved; {PAYLOAD}-byte ConfigMaps labelled {SELECTOR}; bench took {:.0} s",
        elapsed.as_secs_f64()
    );
    println!();
    let columns = [
        "configuration",
        "objects",
        "grant → first reconcile p50 (min–max)",
        "grant → all reconciled p50",
        "SIGTERM → grant p50",
        "SIGTERM → first reconcile p50",
        "LIST pages + WatchLists after grant",
        "follower RSS p50",
        "follower open ConfigMap watches",
        "follower TCP connections to the apiserver",
        "n",
    ];
    println!("{}", table::header(&columns, 0));
    for g in &groups {
        let f = &g.figures;
        let rss = Stats::of(f.follower_rss_kib.iter().map(|k| *k as f64 / 1024.0));
        let span = |v: &[usize]| {
            let (lo, hi) = (v.iter().min(), v.iter().max());
            match (lo, hi) {
                (Some(lo), Some(hi)) if lo == hi => format!("{lo}"),
                (Some(lo), Some(hi)) => format!("{lo}–{hi}"),
                _ => "—".into(),
            }
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}{} |",
            g.kind.label(),
            g.objects,
            cell(Stats::of_ms(&f.grant_to_first)),
            Stats::of_ms(&f.grant_to_all).map_or("—".into(), |s| fmt_ms(s.p50)),
            Stats::of_ms(&f.stop_to_grant).map_or("—".into(), |s| fmt_ms(s.p50)),
            Stats::of_ms(&f.stop_to_first).map_or("—".into(), |s| fmt_ms(s.p50)),
            span(&f.syncs_after_grant),
            rss.map_or("—".into(), |s| format!("{:.1} MiB", s.p50)),
            span(&f.follower_open_watches),
            span(&f.follower_connections),
            f.grant_to_first.len(),
            if f.failed > 0 {
                format!(" ({} failed)", f.failed)
            } else {
                String::new()
            },
        );
    }

    let find = |k: Kind, n: usize| groups.iter().find(|g| g.kind == k && g.objects == n);
    let p50 = |k: Kind, n: usize| find(k, n).and_then(|g| Stats::of_ms(&g.figures.grant_to_first));
    let rss = |k: Kind, n: usize| {
        find(k, n).and_then(|g| Stats::of(g.figures.follower_rss_kib.iter().map(|k| *k as f64)))
    };
    let mut ratios = json!({});
    let mut goals = json!({});
    println!();
    println!("Ratios of grant → first reconcile p50 (n = samples of each side):");
    for &n in &counts {
        let pairs = [
            (
                "tenure warm / controller-runtime cold",
                Kind::TenureWarm,
                Kind::CrCold,
                "tenure_warm_over_cr_cold",
            ),
            (
                "tenure warm / controller-runtime warm",
                Kind::TenureWarm,
                Kind::CrWarm,
                "tenure_warm_over_cr_warm",
            ),
            (
                "tenure cold / controller-runtime cold",
                Kind::TenureCold,
                Kind::CrCold,
                "tenure_cold_over_cr_cold",
            ),
            (
                "tenure warm / tenure warm without standby",
                Kind::TenureWarm,
                Kind::TenureQueued,
                "tenure_warm_over_tenure_nostandby",
            ),
            (
                "tenure warm / tenure cold",
                Kind::TenureWarm,
                Kind::TenureCold,
                "tenure_warm_over_tenure_cold",
            ),
        ];
        for (what, a, b, key) in pairs {
            let (Some(sa), Some(sb)) = (p50(a, n), p50(b, n)) else {
                continue;
            };
            let r = sa.p50 / sb.p50.max(1e-9);
            println!(
                "  {n:>6} objects  {what:<40} {} / {} = {r:.3} ({:.1}× {}) (n = {} / {})",
                fmt_ms(sa.p50),
                fmt_ms(sb.p50),
                if r < 1.0 { 1.0 / r.max(1e-9) } else { r },
                if r < 1.0 { "faster" } else { "slower" },
                sa.n,
                sb.n
            );
            ratios[n.to_string()][key] = json!({"ratio": round3(r), "n": [sa.n, sb.n]});
        }
    }
    if let (Some(&lo), Some(&hi)) = (counts.first(), counts.last())
        && lo != hi
    {
        println!();
        println!("Growth from {lo} to {hi} objects (p50 at {hi} / p50 at {lo}):");
        for k in KINDS {
            if let (Some(a), Some(b)) = (p50(k, lo), p50(k, hi)) {
                let r = b.p50 / a.p50.max(1e-9);
                println!(
                    "  {:<40} {} → {} = {r:.2}×",
                    k.label(),
                    fmt_ms(a.p50),
                    fmt_ms(b.p50)
                );
                ratios["growth"][k.key()] = json!(round3(r));
            }
        }
        println!();
        println!("Follower memory (RSS p50), warm / cold and standby / none:");
        for &n in &counts {
            for (what, w, c) in [
                ("tenure", Kind::TenureWarm, Kind::TenureCold),
                (
                    "tenure, standby / none",
                    Kind::TenureWarm,
                    Kind::TenureQueued,
                ),
                ("controller-runtime", Kind::CrWarm, Kind::CrCold),
            ] {
                if let (Some(w), Some(c)) = (rss(w, n), rss(c, n)) {
                    println!(
                        "  {n:>6} objects  {what:<24} {:.1} MiB / {:.1} MiB = {:.2}×",
                        w.p50 / 1024.0,
                        c.p50 / 1024.0,
                        w.p50 / c.p50.max(1e-9)
                    );
                }
            }
            if let (Some(t), Some(c)) = (rss(Kind::TenureWarm, n), rss(Kind::CrWarm, n)) {
                println!(
                    "  {n:>6} objects  warm tenure / warm controller-runtime {:.2}×",
                    t.p50 / c.p50.max(1e-9)
                );
                ratios[n.to_string()]["follower_rss_tenure_warm_over_cr_warm"] =
                    json!(round3(t.p50 / c.p50.max(1e-9)));
            }
        }

        // The goals.
        let ok = |b: bool| if b { "met" } else { "NOT met" };
        let mut lines = Vec::new();
        let fast = counts.iter().all(|&n| {
            matches!((p50(Kind::TenureWarm, n), p50(Kind::CrCold, n)), (Some(t), Some(c)) if c.p50 >= 10.0 * t.p50)
        });
        lines.push(format!(
            "tenure warm ≥ 10× faster than controller-runtime cold at every count: {}",
            ok(fast)
        ));
        let growth = match (p50(Kind::TenureWarm, lo), p50(Kind::TenureWarm, hi)) {
            (Some(a), Some(b)) => b.p50 / a.p50.max(1e-9),
            _ => f64::INFINITY,
        };
        // Flat: the 10× larger cache costs the first reconcile under 2× (or under 5 ms).
        let flat = match (p50(Kind::TenureWarm, lo), p50(Kind::TenureWarm, hi)) {
            (Some(a), Some(b)) => b.p50 <= 2.0 * a.p50 || b.p50 - a.p50 <= 5.0,
            _ => false,
        };
        lines.push(format!(
            "tenure warm flat in the object count ({growth:.2}× from {lo} to {hi}; flat = under 2× or under 5 ms more): {}",
            ok(flat)
        ));
        let equal = counts.iter().all(|&n| {
            matches!((p50(Kind::TenureWarm, n), p50(Kind::CrWarm, n)), (Some(t), Some(c)) if t.p50 <= c.p50)
        });
        lines.push(format!(
            "tenure warm at least equal to controller-runtime warm at every count: {}",
            ok(equal)
        ));
        println!();
        println!("Goals (issues #12, #28):");
        for l in &lines {
            println!("  {l}");
        }
        goals = json!({
            "tenure_warm_10x_faster_than_cr_cold": fast,
            "tenure_warm_flat_in_object_count": flat,
            "tenure_warm_growth": round3(growth),
            "tenure_warm_at_least_equal_to_cr_warm": equal,
        });
    }

    let json = json!({
        "server": "kube-apiserver v1.36.3 + etcd v3.6.8 (kube-testenv), 127.0.0.1",
        "peer": "sigs.k8s.io/controller-runtime v0.24.1 (e2e/controller-runtime-peer), client-go v0.36.3",
        "durations": {
            "lease_secs": LEASE.as_secs_f64(),
            "renew_deadline_secs": RENEW_DEADLINE.as_secs_f64(),
            "retry_period_secs": RETRY.as_secs_f64(),
        },
        "handoff": "graceful: SIGTERM to the leader, the follower running and, when warm, synced; grant = tenure's term workload starting / controller-runtime's acquiring Lease write returning (its Elected() closes only after its controller has started)",
        "objects": {"counts": counts, "payload_bytes": PAYLOAD, "label": SELECTOR, "in_flight_creates": IN_FLIGHT, "create_secs": created},
        "tenure_workers": WORKERS,
        "trials": "interleaved: each round one hand-off per configuration in turn, one at a time",
        "percentiles": "the sample at index round(p*(n-1)) of the sorted samples",
        "bench_secs": round3(elapsed.as_secs_f64()),
        "results": groups.iter().map(|g| {
            let f = &g.figures;
            let durs = |v: &[Duration]| Stats::of_ms(v).map_or(json!({"n": 0}), |s| stats_json(s, v.iter().map(|d| ms(*d)).collect()));
            let rss: Vec<f64> = f.follower_rss_kib.iter().map(|k| *k as f64 / 1024.0).collect();
            json!({
                "configuration": g.kind.key(),
                "objects": g.objects,
                "grant_to_first_reconcile_ms": durs(&f.grant_to_first),
                "grant_to_all_reconciled_ms": durs(&f.grant_to_all),
                "sigterm_to_grant_ms": durs(&f.stop_to_grant),
                "sigterm_to_first_reconcile_ms": durs(&f.stop_to_first),
                "initial_syncs_after_grant": f.syncs_after_grant,
                "follower_rss_mib": Stats::of(rss.iter().copied()).map_or(json!({"n": 0}), |s| stats_json(s, rss.clone())),
                "follower_open_configmap_watches": f.follower_open_watches,
                "follower_apiserver_tcp_connections": f.follower_connections,
                "failed_handoffs": f.failed,
            })
        }).collect::<Vec<_>>(),
        "ratios_of_p50": ratios,
        "goals": goals,
    });
    save_json("kube_controller.json", &json, Say::Stdout);
    drop(groups);
    drop(server);
}
