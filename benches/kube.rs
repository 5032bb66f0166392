//! Leader election on a real kube-apiserver, side by side: tenure's `LeaderElector`, client-go's
//! `leaderelection` (the `clientgo-candidate` of `e2e/`) and the `kube-lease-manager` crate,
//! against the same server.
//!
//! For each implementation: a leader and two followers, each its own process (this binary
//! re-executes itself for the Rust ones) with its own User-Agent; the API server's audit log
//! attributes every Lease request to its sender. The three groups run side by side, on three
//! Leases. Measured:
//!
//! - API requests per minute in steady state, by the leader (and its writes) and by each
//!   follower, over one window;
//! - graceful hand-off: from SIGTERM to the leader until the next leader's workload starts
//!   (21 per implementation by default, a fresh follower replacing the old leader each time);
//! - crash failover: from SIGKILL of the leader until the next leader's workload starts
//!   (7 per implementation by default; at least 6 s into the leader's term, then a random
//!   pause of up to lease/3, so the kill falls anywhere in its renewal cycle).
//!
//! The trials are interleaved: each round runs one trial per implementation in turn (tenure,
//! client-go, kube-lease-manager while it has trials left), so machine noise hits each alike.
//! Each hand-off figure is reported as p50 and p90 with its sample count (the sample at index
//! round(p·(n−1)) of the sorted samples); one median says little for client-go, whose
//! follower retries every retry period with jitter, so its hand-off lands anywhere in that
//! cycle.
//!
//! Prints a table and writes `target/bench/kube.json`. Run with
//! `cargo bench --features kube --bench kube` (about 8 minutes). `TENURE_BENCH_WINDOW_SECS` sets the
//! steady-state window (default 60), `TENURE_BENCH_HANDOFFS` and `TENURE_BENCH_CRASHES` the
//! trials of tenure and client-go (default 21 and 7; kube-lease-manager runs 5 and 3, or
//! fewer if those are fewer).
//!
//! tenure and client-go run with the same durations, controller-runtime's defaults (lease 15 s,
//! renew deadline 10 s, retry 2 s), passed to both; kube-lease-manager runs at its own defaults
//! (30 s, grace 5 s). The tenure candidate is `LeaderElector::run_until`; SIGTERM is its
//! shutdown signal, so a graceful hand-off is the elector's own shutdown, which releases the
//! Lease. The client-go candidate releases on SIGTERM too (`ReleaseOnCancel`).

#[path = "support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use support::apiserver::{self, LEASE_AUDIT_POLICY, config_as, go_peer};
use support::env::{knob, knob_secs};
use support::kube_harness::{Server, candidate, fresh_dir, unique};
use support::out::{Say, save_json};
use support::proc::{Process, read_events};
use support::role::{command, event};
use support::stats::{Stats, round3};
use support::table::{self, secs};

const NS: &str = "default";
/// The durations of tenure and client-go (controller-runtime's defaults, passed to both): lease
/// duration, renew deadline, retry period.
const LEASE: Duration = Duration::from_secs(15);
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const RETRY: Duration = Duration::from_secs(2);
/// kube-lease-manager's default lease duration (it runs at its defaults).
const KLM_LEASE: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    if let Some(args) = support::role::args() {
        let [role, kubeconfig, lease, identity, ..] = &args[..] else {
            eprintln!("usage: --role tenure|klm KUBECONFIG LEASE IDENTITY");
            return ExitCode::from(2);
        };
        return support::role::run(1, &format!("{role} candidate {identity}"), || async {
            match role.as_str() {
                "tenure" => tenure_candidate(kubeconfig, lease, identity).await,
                "klm" => klm_candidate(kubeconfig, lease, identity).await,
                other => Err(format!("unknown role {other}")),
            }
        });
    }
    orchestrate();
    ExitCode::SUCCESS
}

/// tenure: a `LeaderElector` whose workload lasts its term; SIGTERM shuts it down (releasing).
async fn tenure_candidate(kubeconfig: &str, lease: &str, identity: &str) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};

    let elector = apiserver::elector(
        config_as(kubeconfig, identity).await?,
        NS,
        lease,
        identity,
        (LEASE, RENEW_DEADLINE, RETRY),
    )?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let shutdown = async move {
        sigterm.recv().await;
    };
    elector
        .run_until(shutdown, |term| async move {
            event("STARTED", identity);
            term.cancellation().cancelled().await;
            event("ENDED", identity);
        })
        .await
        .map(|_returned_or_stopped| ())
        .map_err(|e| e.to_string())
}

/// kube-lease-manager 0.13 at its defaults (30 s duration, 5 s grace), in its watch mode.
async fn klm_candidate(kubeconfig: &str, lease: &str, identity: &str) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};

    // kube's default client, as kube-lease-manager users build it.
    let client = kube::Client::try_from(config_as(kubeconfig, identity).await?)
        .map_err(|e| e.to_string())?;
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
                event(if now { "STARTED" } else { "ENDED" }, identity);
            }
            _ = term.recv() => {
                if *leading.borrow() {
                    event("ENDED", identity);
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
    /// The lease duration it runs with.
    fn lease(self) -> Duration {
        match self {
            Kind::Tenure | Kind::ClientGo => LEASE,
            Kind::LeaseManager => KLM_LEASE,
        }
    }
}

/// One candidate process and its events.
struct Candidate {
    process: Process,
    events: mpsc::Receiver<(String, String, SystemTime)>,
}

impl Candidate {
    fn spawn(kind: Kind, server: &Server, lease: &str, identity: &str) -> Self {
        let kubeconfig = server.admin_kubeconfig();
        let mut cmd = match kind {
            Kind::ClientGo => {
                let durations = (LEASE, RENEW_DEADLINE, RETRY);
                let mut c = go_peer(candidate(), &kubeconfig, NS, lease, identity, durations);
                c.args(["--timestamps", "--user-agent", identity]);
                c
            }
            Kind::Tenure | Kind::LeaseManager => {
                let mut c = command(if kind == Kind::Tenure {
                    "tenure"
                } else {
                    "klm"
                });
                c.arg(&kubeconfig).args([lease, identity]);
                c
            }
        };
        let (process, stdout) = Process::spawn(&mut cmd, identity, Stdio::null());
        let (tx, events) = mpsc::channel();
        read_events(
            stdout,
            tx,
            |w, at| {
                let kind = w.first().map(|s| (*s).to_owned()).unwrap_or_default();
                let who = w.get(1..).map(|s| s.join(" ")).unwrap_or_default();
                Some((kind, who, at))
            },
            || None,
        );
        Self { process, events }
    }

    /// Empties its event queue; the time of the last STARTED in it, if any.
    fn drain_started(&self) -> Option<SystemTime> {
        let mut started = None;
        while let Ok((kind, _, at)) = self.events.try_recv() {
            if kind == "STARTED" {
                started = Some(at);
            }
        }
        started
    }

    fn wait_exit(&mut self) {
        self.process.wait_exit(Duration::from_secs(30));
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
    let mut seen = HashSet::new();
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for ev in apiserver::audit_events(audit) {
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
        let Some(at) = apiserver::timestamp(&ev["requestReceivedTimestamp"]) else {
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
    /// Followers that started leading between trials (the leader lost its lease): 0 in a
    /// clean run.
    unexpected_takeovers: usize,
    verbs: BTreeMap<String, BTreeMap<String, u64>>,
}

/// kube-lease-manager's graceful hand-offs and crash failovers (tenure's and client-go's are
/// `TENURE_BENCH_HANDOFFS` and `TENURE_BENCH_CRASHES`; these, if fewer).
const KLM_HANDOFFS: usize = 5;
const KLM_CRASHES: usize = 3;
/// Before a graceful hand-off: time for the newest follower to read the Lease (and watch it).
const SETTLE: Duration = Duration::from_secs(1);
/// Before a crash: the leader has led, and renewed, at least this long.
const MIN_TERM: Duration = Duration::from_secs(6);

/// A pseudo-random pause in `[lo, hi)`, so crashes fall at different points of the renewal
/// cycle.
fn pause_between(lo: Duration, hi: Duration) -> Duration {
    let r = tenure::backend::HolderToken::random().as_bytes()[0];
    lo + (hi - lo).mul_f64(f64::from(r) / 256.0)
}

/// One implementation's candidates on one Lease: `cands[0]` leads, the others follow.
struct Group {
    kind: Kind,
    lease: String,
    cands: Vec<Candidate>,
    /// When `cands[0]` started leading (its own clock reading).
    led_since: SystemTime,
    spawned: usize,
    /// No follower took over in a trial: no further trials.
    broken: bool,
    figures: Figures,
    handoffs: usize,
    crashes: usize,
}

impl Group {
    /// A leader (once it leads) and two followers.
    fn start(kind: Kind, server: &Server, handoffs: usize, crashes: usize) -> Self {
        let lease = unique(&format!("bench-{}", kind.key()));
        eprintln!("== {}: lease {lease}", kind.label());
        let mut group = Self {
            kind,
            lease,
            cands: Vec::new(),
            led_since: SystemTime::now(),
            spawned: 0,
            broken: false,
            figures: Figures::default(),
            handoffs,
            crashes,
        };
        group.spawn(server);
        let (_, at) = first_started(&[&group.cands[0]], Duration::from_secs(60))
            .unwrap_or_else(|| panic!("{}: the first candidate never led", kind.label()));
        group.led_since = at;
        group.spawn(server);
        group.spawn(server);
        group
    }

    fn spawn(&mut self, server: &Server) {
        let id = format!(
            "{}-{}",
            self.kind.key(),
            char::from(b'a' + (self.spawned % 26) as u8)
        );
        let id = if self.spawned >= 26 {
            format!("{id}{}", self.spawned / 26)
        } else {
            id
        };
        self.spawned += 1;
        self.cands
            .push(Candidate::spawn(self.kind, server, &self.lease, &id));
    }

    fn trials(&self, crash: bool) -> usize {
        if crash { self.crashes } else { self.handoffs }
    }

    /// Steady-state requests per minute in `[from, to)`, from the audit log.
    fn count(&mut self, audit: &Path, from: SystemTime, to: SystemTime) {
        let counts = count_requests(audit, &self.lease, from, to);
        let minutes = to.duration_since(from).unwrap_or_default().as_secs_f64() / 60.0;
        let per_min = |ua: &str, write_only: bool| {
            counts.get(ua).map_or(0.0, |verbs| {
                verbs
                    .iter()
                    .filter(|(v, _)| {
                        !write_only || matches!(v.as_str(), "update" | "patch" | "create")
                    })
                    .map(|(_, n)| *n as f64)
                    .sum::<f64>()
                    / minutes
            })
        };
        self.figures.leader_requests_per_min = per_min(&self.cands[0].process.identity, false);
        self.figures.leader_writes_per_min = per_min(&self.cands[0].process.identity, true);
        self.figures.follower_requests_per_min = self.cands[1..]
            .iter()
            .map(|c| per_min(&c.process.identity, false))
            .collect();
        self.figures.verbs = counts;
    }

    /// One graceful hand-off (SIGTERM) or crash failover (SIGKILL): the leader is stopped,
    /// the time until a follower's workload starts is recorded, and a fresh follower replaces
    /// the old leader.
    fn trial(&mut self, server: &Server, crash: bool) {
        if self.broken {
            return;
        }
        // A follower that started leading on its own since the last trial: the leader lost
        // its lease. Count it, and carry on with the new leader.
        let mut took_over = None;
        for (i, c) in self.cands.iter().enumerate() {
            if let Some(at) = c.drain_started()
                && i > 0
            {
                took_over = Some((i, at));
            }
        }
        if let Some((i, at)) = took_over {
            eprintln!(
                "   {}: {} started leading between trials",
                self.kind.key(),
                self.cands[i].process.identity
            );
            self.figures.unexpected_takeovers += 1;
            let c = self.cands.remove(i);
            self.cands.insert(0, c);
            self.led_since = at;
        }
        if crash {
            let led = SystemTime::now()
                .duration_since(self.led_since)
                .unwrap_or_default();
            std::thread::sleep(
                MIN_TERM.saturating_sub(led) + pause_between(Duration::ZERO, self.kind.lease() / 3),
            );
        } else {
            std::thread::sleep(SETTLE);
        }
        let mut old = self.cands.remove(0);
        let stop = SystemTime::now();
        if crash {
            old.process.signal(libc::SIGKILL);
        } else {
            old.process.terminate();
        }
        let followers: Vec<&Candidate> = self.cands.iter().collect();
        let next = first_started(&followers, self.kind.lease() * 4);
        old.wait_exit();
        let Some((i, at)) = next else {
            eprintln!(
                "{}: no follower took over (trial {} of the {})",
                self.kind.label(),
                if crash {
                    self.figures.crash_failovers.len() + 1
                } else {
                    self.figures.graceful_handoffs.len() + 1
                },
                if crash { "crashes" } else { "hand-offs" }
            );
            self.broken = true;
            return;
        };
        let took = at.duration_since(stop).unwrap_or_default();
        let samples = if crash {
            &mut self.figures.crash_failovers
        } else {
            &mut self.figures.graceful_handoffs
        };
        samples.push(took);
        let done = samples.len();
        eprintln!(
            "   {:<18} {} {}/{} → {}: {}",
            self.kind.key(),
            if crash {
                "crash failover   "
            } else {
                "graceful hand-off"
            },
            done,
            self.trials(crash),
            self.cands[i].process.identity,
            fmt_ms(took.as_secs_f64() * 1000.0)
        );
        self.led_since = at;
        let leader = self.cands.remove(i);
        self.cands.insert(0, leader);
        self.spawn(server);
    }

    fn stop(&mut self) {
        for c in &self.cands {
            c.process.terminate();
        }
        for c in &mut self.cands {
            c.wait_exit();
        }
    }
}

/// p50 / p90 (min–max), n: p50 and p90 are the samples at index round(p·(n−1)) of the sorted
/// samples, as the Redis bench takes its percentiles.
fn cell(s: Option<Stats>) -> String {
    s.map_or_else(
        || "—".to_owned(),
        |s| {
            format!(
                "{} / {} ({}–{}), n={}",
                fmt_ms(s.p50),
                fmt_ms(s.p90),
                fmt_ms(s.min),
                fmt_ms(s.max),
                s.n
            )
        },
    )
}

fn stats_json(samples: &[Duration]) -> Value {
    let ms: Vec<f64> = samples
        .iter()
        .map(|d| round3(support::stats::ms(*d)))
        .collect();
    match Stats::of_ms(samples) {
        Some(s) => json!({"n": s.n, "p50": round3(s.p50), "p90": round3(s.p90),
                          "min": round3(s.min), "max": round3(s.max), "samples": ms}),
        None => json!({"n": 0, "samples": ms}),
    }
}

/// `21.3 ms` / `2.31 s`.
fn fmt_ms(v: f64) -> String {
    table::fmt_ms(v, 1, 1)
}

/// `tenure / client-go` of one percentile, with how many times faster tenure is.
fn ratio(t: f64, b: f64) -> String {
    let r = t / b.max(1e-9);
    if r < 1.0 {
        format!(
            "{} / {} = {r:.3} ({:.1}× faster)",
            fmt_ms(t),
            fmt_ms(b),
            1.0 / r.max(1e-9)
        )
    } else {
        format!("{} / {} = {r:.3}", fmt_ms(t), fmt_ms(b))
    }
}

fn orchestrate() {
    let window = knob_secs("TENURE_BENCH_WINDOW_SECS", Duration::from_secs(60));
    let handoffs = knob("TENURE_BENCH_HANDOFFS", 21);
    let crashes = knob("TENURE_BENCH_CRASHES", 7);
    let started = Instant::now();
    let (server, audit) = apiserver::start_audited(&fresh_dir("audit"), LEASE_AUDIT_POLICY);
    eprintln!("kube-apiserver ready in {:?}", started.elapsed());

    // The three groups side by side, each on its own Lease.
    let mut groups = [
        Group::start(Kind::Tenure, &server, handoffs, crashes),
        Group::start(Kind::ClientGo, &server, handoffs, crashes),
        Group::start(
            Kind::LeaseManager,
            &server,
            KLM_HANDOFFS.min(handoffs),
            KLM_CRASHES.min(crashes),
        ),
    ];
    // Let the followers settle (first reads, watches) before the window opens.
    std::thread::sleep(Duration::from_secs(5));
    eprintln!("== steady state: {window:?}");
    let from = SystemTime::now();
    std::thread::sleep(window);
    let to = SystemTime::now();
    for g in &mut groups {
        g.count(&audit, from, to);
    }

    // Interleaved trials: each round one trial per implementation that has trials left.
    for crash in [false, true] {
        eprintln!(
            "== {}",
            if crash {
                "crash failovers (kill -9)"
            } else {
                "graceful hand-offs (SIGTERM)"
            }
        );
        let rounds = groups.iter().map(|g| g.trials(crash)).max().unwrap_or(0);
        for round in 0..rounds {
            for g in &mut groups {
                if round < g.trials(crash) {
                    g.trial(&server, crash);
                }
            }
        }
    }
    for g in &mut groups {
        g.stop();
    }
    let elapsed = started.elapsed();

    let durations = format!(
        "{} for tenure and client-go (kube-lease-manager: its defaults, {} / grace 5 s)",
        table::durations(LEASE, RENEW_DEADLINE, RETRY),
        secs(KLM_LEASE)
    );
    println!();
    println!(
        "Leader election on kube-apiserver v1.36.3 (127.0.0.1), steady-state window {window:?}, {durations}; trials interleaved (tenure, client-go, kube-lease-manager, tenure, …); bench took {:.0} s",
        elapsed.as_secs_f64()
    );
    println!();
    let columns = [
        "implementation",
        "leader req/min",
        "leader writes/min",
        "follower 1 req/min",
        "follower 2 req/min",
        "graceful hand-off p50 / p90 (min–max), n",
        "crash failover (kill -9) p50 / p90 (min–max), n",
    ];
    println!("{}", table::header(&columns, 0));
    for g in &groups {
        let f = &g.figures;
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} |",
            g.kind.label(),
            f.leader_requests_per_min,
            f.leader_writes_per_min,
            f.follower_requests_per_min.first().copied().unwrap_or(0.0),
            f.follower_requests_per_min.get(1).copied().unwrap_or(0.0),
            cell(Stats::of_ms(&f.graceful_handoffs)),
            cell(Stats::of_ms(&f.crash_failovers)),
        );
    }
    let unexpected: usize = groups.iter().map(|g| g.figures.unexpected_takeovers).sum();
    if unexpected > 0 {
        println!(
            "\nfollowers that took over between trials (a leader lost its lease): {unexpected}"
        );
    }

    let find = |k: Kind| groups.iter().find(|g| g.kind == k).map(|g| &g.figures);
    let mut ratios = json!({});
    if let (Some(t), Some(b)) = (find(Kind::Tenure), find(Kind::ClientGo)) {
        println!();
        println!("tenure / client-go, from the interleaved samples:");
        for (what, key, ts, bs) in [
            (
                "graceful hand-off",
                "graceful_handoff",
                &t.graceful_handoffs,
                &b.graceful_handoffs,
            ),
            (
                "crash failover",
                "crash_failover",
                &t.crash_failovers,
                &b.crash_failovers,
            ),
        ] {
            let (Some(ts), Some(bs)) = (Stats::of_ms(ts), Stats::of_ms(bs)) else {
                println!("  {what:<18} —");
                continue;
            };
            println!(
                "  {what:<18} p50 {}   p90 {}   (n = {} / {})",
                ratio(ts.p50, bs.p50),
                ratio(ts.p90, bs.p90),
                ts.n,
                bs.n
            );
            ratios[key] = json!({
                "p50": round3(ts.p50 / bs.p50.max(1e-9)),
                "p90": round3(ts.p90 / bs.p90.max(1e-9)),
                "n_tenure": ts.n,
                "n_client_go": bs.n,
            });
        }
        let writes = t.leader_writes_per_min / b.leader_writes_per_min.max(f64::MIN_POSITIVE);
        ratios["leader_writes_per_min"] = json!(round3(writes));
        let speedup = |q: fn(&Stats) -> f64| match (
            Stats::of_ms(&t.graceful_handoffs),
            Stats::of_ms(&b.graceful_handoffs),
        ) {
            (Some(t), Some(b)) => format!("{:.0}×", q(&b) / q(&t).max(1e-9)),
            _ => "?".into(),
        };
        println!();
        println!(
            "tenure vs client-go: leader writes {:.0}% (target ≤ 40%), followers {:.1} vs {:.1} req/min, graceful hand-off {} faster at p50 and {} at p90 (target ≥ 10×), crash failover at most {} (target ≤ lease + retry = {})",
            100.0 * writes,
            t.follower_requests_per_min.iter().sum::<f64>()
                / t.follower_requests_per_min.len().max(1) as f64,
            b.follower_requests_per_min.iter().sum::<f64>()
                / b.follower_requests_per_min.len().max(1) as f64,
            speedup(|s| s.p50),
            speedup(|s| s.p90),
            Stats::of_ms(&t.crash_failovers).map_or_else(|| "—".to_owned(), |s| fmt_ms(s.max)),
            secs(LEASE + RETRY),
        );
    }
    println!();
    println!("Requests in the window by User-Agent and verb:");
    for g in &groups {
        for (ua, verbs) in &g.figures.verbs {
            println!("  {:<26} {ua:<22} {verbs:?}", g.kind.key());
        }
    }

    let json = json!({
        "server": "kube-apiserver v1.36.3 + etcd v3.6.8 (kube-testenv), 127.0.0.1",
        "window_secs": window.as_secs(),
        "durations": {
            "tenure_and_client_go": {
                "lease_secs": LEASE.as_secs_f64(),
                "renew_deadline_secs": RENEW_DEADLINE.as_secs_f64(),
                "retry_period_secs": RETRY.as_secs_f64(),
            },
            "kube_lease_manager": {"lease_secs": KLM_LEASE.as_secs_f64(), "grace_secs": 5.0},
        },
        "trials": "interleaved: each round one trial per implementation (tenure, client-go, kube-lease-manager while it has trials left)",
        "percentiles": "the sample at index round(p*(n-1)) of the sorted samples",
        "bench_secs": round3(elapsed.as_secs_f64()),
        "results": groups.iter().map(|g| {
            let f = &g.figures;
            json!({
                "implementation": g.kind.key(),
                "leader_requests_per_min": round3(f.leader_requests_per_min),
                "leader_writes_per_min": round3(f.leader_writes_per_min),
                "follower_requests_per_min": f.follower_requests_per_min.iter().copied().map(round3).collect::<Vec<_>>(),
                "graceful_handoff_ms": stats_json(&f.graceful_handoffs),
                "crash_failover_ms": stats_json(&f.crash_failovers),
                "unexpected_takeovers": f.unexpected_takeovers,
                "requests_by_user_agent_and_verb": f.verbs,
            })
        }).collect::<Vec<_>>(),
        "tenure_over_client_go": ratios,
    });
    save_json("kube.json", &json, Say::Stdout);
    drop(groups);
    drop(server);
}
