//! Sharded leadership, side by side with "grab what you can", on a real Redis and on the real
//! kube-apiserver: N = 256 shards over M = 10 replicas, each replica its own process (this
//! binary re-executes itself with `--role`), with its own connection or client and, on
//! Kubernetes, its own User-Agent.
//!
//! - **tenure**: each replica runs `ShardedElector::run_until` over the 256 shards.
//! - **baseline** ("grab what you can", as Knative's bucket leader election does it): each
//!   replica runs 256 `LeaderElector`s, one per shard lease (`NAME-SHARD`), all at once, on one
//!   `Locker` (one connection, one renewal task), re-run whenever a term ends.
//!
//! Both run with the same durations (`REDIS_TIMINGS` or `KUBE_TIMINGS`, stop margin
//! `STOP_MARGIN`, `rejoin`), and each workload prints `S shard time` when its term starts and
//! `E shard time` when it ends; the orchestrator keeps who holds what from those lines.
//!
//! For each store and implementation, one after the other (not at the same time, so the two
//! do not share the machine's two cores):
//!
//! 1. Start-up: the ten replicas start campaigning at one agreed instant; time until every
//!    shard runs exactly once (and, for tenure, spread within ±1).
//! 2. Steady state over `TENURE_BENCH_WINDOW_SECS` (default 30): balance (max/min shards per
//!    replica), store requests per minute per replica (Redis: the backend's own round-trip
//!    and script counters, printed by each replica every second, cross-checked against the
//!    server's `INFO commandstats`; Kubernetes: the API server's audit log by User-Agent,
//!    every verb on leases), watches or subscriptions per replica (Redis: the channels the
//!    replica's subscriber connection serves; Kubernetes: the watches open at the window's
//!    end in the audit log), RSS and CPU per replica from `/proc`.
//! 3. `TENURE_BENCH_ROUNDS` rounds (default 4) of: a join (a new replica; timed from its
//!    `R` line, printed right before it starts campaigning), a graceful leave (SIGTERM to the
//!    oldest replica), a join, a crash (SIGKILL to the oldest replica). Each is timed from the
//!    event to the start of the stable state (held for 500 ms) in which every shard runs
//!    exactly once on a live replica (all held) and, for tenure, the spread is ≤ 1 (balanced).
//!    The baseline never rebalances: its figure is "all held", with the spread it ends with.
//!
//! Prints a table with the ratios tenure / baseline and writes `target/bench/shard.json`.
//! Run with `cargo bench --all-features --bench shard` (about 8 minutes).
//! `TENURE_BENCH_SHARDS=N` changes the group's shard count (256 by default), for the
//! scale table in the README.

#[path = "support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use support::apiserver::{self, LEASE_AUDIT_POLICY};
use support::env::{knob, knob_secs, selected};
use support::kube_harness::{fresh_dir, unique};
use support::out::{Say, save_json};
use support::proc::{Process, read_events};
use support::redis_harness::RedisServer;
use support::role::emit;
use support::stats::{percentile, round2};

/// The group's shard count: `TENURE_BENCH_SHARDS` (the replicas inherit it), default 256.
fn shards() -> u32 {
    knob("TENURE_BENCH_SHARDS", 256)
}
const REPLICAS: usize = 10;
const NS: &str = "default";
/// Redis: lease duration, renew deadline, retry period.
const REDIS_TIMINGS: Timings = Timings {
    lease: Duration::from_secs(2),
    renew_deadline: Duration::from_millis(1300),
    retry: Duration::from_millis(500),
};
/// Kubernetes: longer. In trial runs on a 2-core machine (API server, etcd and the replicas
/// sharing it), 2 s / 1.3 s / 0.5 s put ~400 renewals a second on the API server; one latency
/// spike past the 250 ms request timeout (retry / 2) lost leases and tenure's group collapsed
/// for good (every shard unheld, gets, lists and watches re-sent every retry). At 6 s / 4 s /
/// 1 s tenure ran cleanly but the baseline's 2,560 electors never all got a lease within 36 s:
/// their requests were cancelled at the 500 ms request timeout, each cancellation dropping its
/// HTTP/1.1 connection and the retry paying a new TLS handshake. With a 2 s retry (1 s request
/// timeout) the baseline starts.
const KUBE_TIMINGS: Timings = Timings {
    lease: Duration::from_secs(8),
    renew_deadline: Duration::from_secs(5),
    retry: Duration::from_secs(2),
};
const STOP_MARGIN: Duration = Duration::from_millis(300);
/// A state counts once it has held this long.
const STABLE: Duration = Duration::from_millis(500);
/// Pause after each event's state is reached, before the next event.
const SETTLE: Duration = Duration::from_millis(1500);
/// Longest wait for the start-up state (2,560 electors campaigning at once on the API server
/// take a while).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest wait for one event's state, at least.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The election durations of one store, the same for tenure and the baseline.
#[derive(Clone, Copy, Debug)]
struct Timings {
    lease: Duration,
    renew_deadline: Duration,
    retry: Duration,
}

impl Timings {
    /// The store's durations; `TENURE_BENCH_<STORE>_TIMINGS=LEASE_MS,RENEW_MS,RETRY_MS`
    /// overrides them (the replicas inherit it).
    fn of(store: &str) -> Self {
        let default = if store == "kube" {
            KUBE_TIMINGS
        } else {
            REDIS_TIMINGS
        };
        let key = format!("TENURE_BENCH_{}_TIMINGS", store.to_uppercase());
        let Ok(v) = std::env::var(key) else {
            return default;
        };
        let ms: Vec<u64> = v.split(',').filter_map(|p| p.trim().parse().ok()).collect();
        match ms[..] {
            [lease, renew, retry] => Self {
                lease: Duration::from_millis(lease),
                renew_deadline: Duration::from_millis(renew),
                retry: Duration::from_millis(retry),
            },
            _ => default,
        }
    }

    /// Longest wait for one event's state.
    fn event_timeout(self) -> Duration {
        EVENT_TIMEOUT.max(self.lease * 6)
    }

    /// The goal for one replica: each owned shard renewed every lease/3, plus one membership
    /// heartbeat every lease/3, per minute.
    fn goal_per_min(self, owned: usize) -> f64 {
        (owned as f64 + 1.0) * 60.0 / (self.lease.as_secs_f64() / 3.0)
    }
}

fn election_config(t: Timings) -> tenure::election::ElectionConfig {
    tenure::election::ElectionConfig::new()
        .lease_duration(t.lease)
        .renew_deadline(t.renew_deadline)
        .retry_period(t.retry)
        .stop_margin(STOP_MARGIN)
        .rejoin(true)
}

fn main() -> ExitCode {
    if let Some(args) = support::role::args() {
        let [imp, store, endpoint, group, identity, start_at, ..] = &args[..] else {
            eprintln!("usage: --role tenure|baseline redis|kube ENDPOINT GROUP IDENTITY START_NS");
            return ExitCode::from(2);
        };
        let start_at = start_at.parse::<u64>().unwrap_or(0);
        return support::role::run(1, &format!("replica {identity} ({imp} on {store})"), || {
            replica(imp, store, endpoint, group, identity, start_at)
        });
    }
    orchestrate();
    ExitCode::SUCCESS
}

// ---------------------------------------------------------------------------------------------
// A replica (child process)

/// One replica: connects, waits for `start_at` (unix ns; 0 = at once), prints `R`, then runs
/// tenure's sharded elector or the baseline's 256 electors until SIGTERM.
async fn replica(
    imp: &str,
    store: &str,
    endpoint: &str,
    group: &str,
    identity: &str,
    start_at: u64,
) -> Result<(), String> {
    use tenure::Locker;
    use tokio::signal::unix::{SignalKind, signal};
    use tokio_util::sync::CancellationToken;

    let locker = match store {
        "redis" => {
            use tenure::backend::redis::{RedisBackend, RedisConfig};
            let config = RedisConfig::new(endpoint).map_err(|e| e.to_string())?;
            let backend = RedisBackend::connect(config)
                .await
                .map_err(|e| e.to_string())?;
            // The backend's counters, every second: round trips, script calls, operations,
            // subscribed channels, observers.
            let b = backend.clone();
            tokio::spawn(async move {
                loop {
                    let s = b.stats();
                    emit(format_args!(
                        "T {} {} {} {} {}",
                        s.round_trips,
                        s.script_calls,
                        s.operations,
                        s.subscribed_channels,
                        s.observers
                    ));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            });
            Locker::with_identity(backend, identity).map_err(|e| e.to_string())?
        }
        "kube" => apiserver::locker(
            apiserver::config_as(endpoint, identity).await?,
            NS,
            identity,
        )?,
        other => return Err(format!("unknown store {other}")),
    };
    let timings = Timings::of(store);
    let stop = CancellationToken::new();
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let on_term = stop.clone();
    tokio::spawn(async move {
        sigterm.recv().await;
        on_term.cancel();
    });
    let wait = Duration::from_nanos(start_at).saturating_sub(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    tokio::time::sleep(if start_at == 0 { Duration::ZERO } else { wait }).await;
    emit(format_args!("R"));
    match imp {
        "tenure" => {
            let elector = tenure::shard::ShardedElector::new(
                locker,
                group,
                shards(),
                election_config(timings),
            )
            .map_err(|e| e.to_string())?;
            elector
                .run_until(stop.cancelled_owned(), |shard, term| async move {
                    emit(format_args!("S {shard}"));
                    term.cancellation().cancelled().await;
                    emit(format_args!("E {shard}"));
                })
                .await
                .map_err(|e| e.to_string())
        }
        "baseline" => {
            use tenure::election::LeaderElector;
            let mut tasks = tokio::task::JoinSet::new();
            for shard in 0..shards() {
                let elector = LeaderElector::new(
                    locker.clone(),
                    &tenure::shard::lease_name(group, shard),
                    election_config(timings),
                )
                .map_err(|e| e.to_string())?;
                let stop = stop.clone();
                tasks.spawn(async move {
                    // Campaign again whenever a term ends, until shutdown.
                    while !stop.is_cancelled() {
                        let ran = elector
                            .run_until(stop.clone().cancelled_owned(), |term| async move {
                                emit(format_args!("S {shard}"));
                                term.cancellation().cancelled().await;
                                emit(format_args!("E {shard}"));
                            })
                            .await;
                        if let Err(e) = ran {
                            eprintln!("shard {shard}: {e}");
                            tokio::time::sleep(timings.retry).await;
                        }
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
            Ok(())
        }
        other => Err(format!("unknown implementation {other}")),
    }
}

// ---------------------------------------------------------------------------------------------
// The orchestrator

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Store {
    Redis,
    Kube,
}

impl Store {
    fn key(self) -> &'static str {
        match self {
            Store::Redis => "redis",
            Store::Kube => "kube",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Imp {
    Tenure,
    Baseline,
}

impl Imp {
    fn key(self) -> &'static str {
        match self {
            Imp::Tenure => "tenure",
            Imp::Baseline => "baseline",
        }
    }
}

/// A line from a replica.
#[derive(Debug)]
enum Event {
    Ready,
    Start(u32),
    End(u32),
    /// The Redis backend's counters: round trips, script calls, operations, channels,
    /// observers.
    Stats([u64; 5]),
    /// Its stdout closed: the process is gone.
    Exit,
}

struct Line {
    who: String,
    at: SystemTime,
    event: Event,
}

/// A replica process.
type Replica = Process;

/// What one event (start-up, join, leave, crash) took.
#[derive(Clone, Debug, Default)]
struct Sample {
    /// From the event until every shard runs exactly once on a live replica (stably).
    all_held: Option<Duration>,
    /// Until that, and the spread is at most 1.
    balanced: Option<Duration>,
    /// (min, max) shards per live replica once settled.
    loads: (usize, usize),
}

/// Steady-state figures of one replica over the window.
#[derive(Clone, Debug, Default)]
struct Steady {
    identity: String,
    owned: usize,
    requests_per_min: f64,
    /// Redis: lock operations (EVALSHA entries) per minute; Kubernetes: writes per minute.
    operations_per_min: f64,
    watches: u64,
    rss_kib: u64,
    cpu_percent: f64,
    verbs: BTreeMap<String, u64>,
}

#[derive(Debug, Default)]
struct Run {
    store: &'static str,
    imp: &'static str,
    startup: Sample,
    /// (min, max) at the window's start and end.
    balance: Vec<(usize, usize)>,
    steady: Vec<Steady>,
    /// Redis: every command the server counted in the window, all replicas, per minute.
    server_commands_per_min: Option<f64>,
    joins: Vec<Sample>,
    leaves: Vec<Sample>,
    crashes: Vec<Sample>,
    /// Terms that started or ended on their own in the steady window (lost leases).
    churn_in_window: usize,
    /// Per-shard hand-offs (a term's end to the next term's start of that shard), by phase.
    moves: Vec<(&'static str, Duration)>,
    window: (Option<SystemTime>, Option<SystemTime>),
    broken: Option<String>,
    secs: f64,
}

struct Fleet {
    store: Store,
    imp: Imp,
    endpoint: String,
    group: String,
    replicas: Vec<Replica>,
    spawned: usize,
    tx: mpsc::Sender<Line>,
    rx: mpsc::Receiver<Line>,
    /// Shards each replica runs now (killed or exited ones removed).
    held: HashMap<String, BTreeSet<u32>>,
    /// Replicas counted in the balance: started, not told to leave, not killed.
    live: BTreeSet<String>,
    gone: HashSet<String>,
    ready: HashMap<String, SystemTime>,
    stats: HashMap<String, Vec<(SystemTime, [u64; 5])>>,
    /// Start/end lines seen (for churn).
    transitions: usize,
    /// What the fleet is going through now ("start-up", "steady", "join", "leave", "crash").
    phase: &'static str,
    /// When each shard's last term ended (its `E` line), until another term starts it.
    released: HashMap<u32, SystemTime>,
    /// Per-shard hand-offs: from a term's end to the next term's start, by phase.
    moves: Vec<(&'static str, Duration)>,
}

impl Fleet {
    fn new(store: Store, imp: Imp, endpoint: String) -> Self {
        let (tx, rx) = mpsc::channel();
        Self {
            store,
            imp,
            endpoint,
            group: unique(&format!("sh-{}", imp.key())),
            replicas: Vec::new(),
            spawned: 0,
            tx,
            rx,
            held: HashMap::new(),
            live: BTreeSet::new(),
            gone: HashSet::new(),
            ready: HashMap::new(),
            stats: HashMap::new(),
            transitions: 0,
            phase: "start-up",
            released: HashMap::new(),
            moves: Vec::new(),
        }
    }

    fn spawn(&mut self, start_at: u128) -> String {
        let identity = format!(
            "{}-{}-r{:02}",
            self.store.key(),
            self.imp.key(),
            self.spawned
        );
        self.spawned += 1;
        let mut cmd = support::role::command(self.imp.key());
        cmd.args([self.store.key(), &self.endpoint, &self.group])
            .arg(&identity)
            .arg(start_at.to_string());
        let (replica, stdout) = Process::spawn(&mut cmd, &identity, Stdio::inherit());
        let who = identity.clone();
        let gone = identity.clone();
        read_events(
            stdout,
            self.tx.clone(),
            move |w, at| {
                let num = |i: usize| w.get(i).and_then(|s| s.parse::<u64>().ok());
                let event = match w.first().copied() {
                    Some("R") => Event::Ready,
                    Some("S") => Event::Start(num(1).unwrap_or(0) as u32),
                    Some("E") => Event::End(num(1).unwrap_or(0) as u32),
                    Some("T") => Event::Stats([
                        num(1).unwrap_or(0),
                        num(2).unwrap_or(0),
                        num(3).unwrap_or(0),
                        num(4).unwrap_or(0),
                        num(5).unwrap_or(0),
                    ]),
                    _ => return None,
                };
                Some(Line {
                    who: who.clone(),
                    at,
                    event,
                })
            },
            move || {
                Some(Line {
                    who: gone,
                    at: SystemTime::now(),
                    event: Event::Exit,
                })
            },
        );
        self.replicas.push(replica);
        self.live.insert(identity.clone());
        self.held.insert(identity.clone(), BTreeSet::new());
        identity
    }

    fn apply(&mut self, line: Line) {
        if self.gone.contains(&line.who) {
            return;
        }
        match line.event {
            Event::Ready => {
                self.ready.insert(line.who, line.at);
            }
            Event::Start(s) => {
                self.transitions += 1;
                if let Some(ended) = self.released.remove(&s) {
                    let took = line.at.duration_since(ended).unwrap_or_default();
                    self.moves.push((self.phase, took));
                }
                self.held.entry(line.who).or_default().insert(s);
            }
            Event::End(s) => {
                self.transitions += 1;
                self.released.insert(s, line.at);
                self.held.entry(line.who).or_default().remove(&s);
            }
            Event::Stats(v) => self.stats.entry(line.who).or_default().push((line.at, v)),
            Event::Exit => {
                self.held.remove(&line.who);
                self.live.remove(&line.who);
                self.gone.insert(line.who);
            }
        }
    }

    /// Lines that arrived within `wait`, sorted by their time.
    fn drain(&self, wait: Duration) -> Vec<Line> {
        let mut batch = Vec::new();
        if let Ok(l) = self.rx.recv_timeout(wait) {
            batch.push(l);
        }
        while let Ok(l) = self.rx.try_recv() {
            batch.push(l);
        }
        batch.sort_by_key(|l| l.at);
        batch
    }

    /// Applies whatever arrives for `d`.
    fn pump(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            for l in self.drain(Duration::from_millis(20)) {
                self.apply(l);
            }
        }
    }

    /// Shards per live replica.
    fn loads(&self) -> Vec<(String, usize)> {
        self.live
            .iter()
            .map(|id| (id.clone(), self.held.get(id).map_or(0, BTreeSet::len)))
            .collect()
    }

    fn min_max(&self) -> (usize, usize) {
        let l = self.loads();
        (
            l.iter().map(|(_, n)| *n).min().unwrap_or(0),
            l.iter().map(|(_, n)| *n).max().unwrap_or(0),
        )
    }

    /// (every shard runs exactly once, on a live replica; and the spread is ≤ 1).
    fn state(&self) -> (bool, bool) {
        let mut count = vec![0u32; shards() as usize];
        let mut on_live = vec![false; shards() as usize];
        for (who, shards) in &self.held {
            for &s in shards {
                count[s as usize] += 1;
                on_live[s as usize] |= self.live.contains(who);
            }
        }
        let all = count.iter().zip(&on_live).all(|(&c, &l)| c == 1 && l);
        let (min, max) = self.min_max();
        (all, all && max - min <= 1)
    }

    /// Waits from `t0` until the target state (balanced for tenure, all held for the
    /// baseline) has held for [`STABLE`]; the start of that stable state for both
    /// conditions.
    fn wait(&mut self, t0: SystemTime, timeout: Duration) -> Sample {
        let (all, bal) = self.state();
        let mut held_since = all.then_some(t0);
        let mut bal_since = bal.then_some(t0);
        let deadline = Instant::now() + timeout;
        loop {
            for l in self.drain(Duration::from_millis(20)) {
                let at = l.at.max(t0);
                self.apply(l);
                let (all, bal) = self.state();
                held_since = if all { held_since.or(Some(at)) } else { None };
                bal_since = if bal { bal_since.or(Some(at)) } else { None };
            }
            let target = match self.imp {
                Imp::Tenure => bal_since,
                Imp::Baseline => held_since,
            };
            if let Some(since) = target
                && SystemTime::now().duration_since(since).unwrap_or_default() >= STABLE
            {
                let since =
                    |s: Option<SystemTime>| s.map(|s| s.duration_since(t0).unwrap_or_default());
                return Sample {
                    all_held: since(held_since),
                    balanced: since(bal_since),
                    loads: self.min_max(),
                };
            }
            if Instant::now() > deadline {
                eprintln!(
                    "   {} {}: not reached after {timeout:?}; loads {:?}; all held {}",
                    self.store.key(),
                    self.imp.key(),
                    self.loads(),
                    self.state().0
                );
                return Sample {
                    all_held: None,
                    balanced: None,
                    loads: self.min_max(),
                };
            }
        }
    }

    /// The oldest live replica.
    fn oldest(&self) -> Option<usize> {
        self.replicas
            .iter()
            .position(|r| self.live.contains(&r.identity))
    }

    fn join(&mut self) -> Sample {
        let id = self.spawn(0);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.ready.contains_key(&id) && Instant::now() < deadline {
            for l in self.drain(Duration::from_millis(20)) {
                self.apply(l);
            }
        }
        let t0 = self.ready.get(&id).copied().unwrap_or_else(SystemTime::now);
        self.wait(t0, Timings::of(self.store.key()).event_timeout())
    }

    fn leave(&mut self, crash: bool) -> Sample {
        let Some(i) = self.oldest() else {
            return Sample::default();
        };
        let mut r = self.replicas.remove(i);
        let t0 = SystemTime::now();
        if crash {
            r.signal(libc::SIGKILL);
            // Its terms end with it (its leases stay until they run out).
            self.held.remove(&r.identity);
            self.gone.insert(r.identity.clone());
        } else {
            r.signal(libc::SIGTERM);
        }
        self.live.remove(&r.identity);
        let sample = self.wait(t0, Timings::of(self.store.key()).event_timeout());
        if !r.wait_exit(Duration::from_secs(20)) {
            eprintln!("   {} did not exit in 20 s", r.identity);
        }
        sample
    }

    fn stop(&mut self) {
        for r in &self.replicas {
            r.signal(libc::SIGTERM);
        }
        for r in &mut self.replicas {
            if !r.wait_exit(Duration::from_secs(30)) {
                eprintln!("   {} did not exit in 30 s after SIGTERM", r.identity);
            }
        }
        self.replicas.clear();
    }

    /// A replica's counters at the last report at or before `t`.
    fn stats_at(&self, who: &str, t: SystemTime) -> Option<(SystemTime, [u64; 5])> {
        self.stats
            .get(who)?
            .iter()
            .rev()
            .find(|(at, _)| *at <= t)
            .copied()
    }
}

fn fmt_d(d: Option<Duration>) -> String {
    d.map_or_else(
        || "—".into(),
        |d| support::table::fmt_ms(support::stats::ms(d), 0, 0),
    )
}

/// The sample at index round(p·(n−1)) of the sorted samples; none unless every event has one.
fn pct(samples: &[Option<Duration>], p: f64) -> Option<Duration> {
    let mut s: Vec<Duration> = samples.iter().copied().collect::<Option<Vec<_>>>()?;
    s.sort();
    (!s.is_empty()).then(|| percentile(&s, p))
}

fn ms(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| {
        json!((d.as_secs_f64() * 1e6).round() / 1e3)
    })
}

/// A kube audit line's parts that matter here.
struct Audit {
    id: String,
    ua: String,
    verb: String,
    stage: String,
    received: SystemTime,
    stage_at: SystemTime,
}

fn audit_lines(audit: &Path) -> Vec<Audit> {
    let ts = apiserver::timestamp;
    apiserver::audit_events(audit)
        .filter_map(|ev| {
            if ev["objectRef"]["resource"] != "leases" {
                return None;
            }
            Some(Audit {
                id: ev["auditID"].as_str()?.to_owned(),
                ua: ev["userAgent"].as_str().unwrap_or_default().to_owned(),
                verb: ev["verb"].as_str().unwrap_or_default().to_owned(),
                stage: ev["stage"].as_str().unwrap_or_default().to_owned(),
                received: ts(&ev["requestReceivedTimestamp"])?,
                stage_at: ts(&ev["stageTimestamp"])?,
            })
        })
        .collect()
}

/// Requests by User-Agent and verb received in `[from, to)`, and the watches open at `to`
/// by User-Agent.
fn audit_counts(
    lines: &[Audit],
    from: SystemTime,
    to: SystemTime,
) -> (
    BTreeMap<String, BTreeMap<String, u64>>,
    BTreeMap<String, u64>,
) {
    let mut seen = HashSet::new();
    let mut counts: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut watch_started: HashMap<&str, &str> = HashMap::new();
    let mut watch_ended = HashSet::new();
    for a in lines {
        if a.verb == "watch" {
            if a.stage == "ResponseStarted" && a.stage_at < to {
                watch_started.insert(&a.id, &a.ua);
            }
            if a.stage == "ResponseComplete" && a.stage_at < to {
                watch_ended.insert(a.id.as_str());
            }
        }
        if a.received >= from && a.received < to && seen.insert(a.id.as_str()) {
            *counts
                .entry(a.ua.clone())
                .or_default()
                .entry(a.verb.clone())
                .or_default() += 1;
        }
    }
    let mut open: BTreeMap<String, u64> = BTreeMap::new();
    for (id, ua) in watch_started {
        if !watch_ended.contains(id) {
            *open.entry(ua.to_owned()).or_default() += 1;
        }
    }
    (counts, open)
}

fn run(
    store: Store,
    imp: Imp,
    endpoint: String,
    redis: Option<&RedisServer>,
    window: Duration,
    rounds: usize,
) -> Run {
    let began = Instant::now();
    let mut fleet = Fleet::new(store, imp, endpoint);
    let mut out = Run {
        store: store.key(),
        imp: imp.key(),
        ..Run::default()
    };
    eprintln!("== {} {}: group {}", store.key(), imp.key(), fleet.group);
    // Everyone starts campaigning at one instant, once every process is up.
    let start_at = SystemTime::now() + Duration::from_secs(3);
    let start_ns = start_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    for _ in 0..REPLICAS {
        fleet.spawn(start_ns);
    }
    fleet.pump(
        start_at
            .duration_since(SystemTime::now())
            .unwrap_or_default(),
    );
    out.startup = fleet.wait(start_at, STARTUP_TIMEOUT);
    eprintln!(
        "   start-up: all held {}, balanced {}, loads {:?}",
        fmt_d(out.startup.all_held),
        fmt_d(out.startup.balanced),
        out.startup.loads
    );
    if out.startup.all_held.is_none() {
        out.broken = Some("start-up never reached every shard held".into());
    }
    fleet.pump(Duration::from_secs(5));

    // Steady state.
    let before_cmds = redis.map(|r| r.top_level_calls().values().sum::<u64>());
    let cpu0: HashMap<String, Duration> = fleet
        .replicas
        .iter()
        .filter_map(|r| Some((r.identity.clone(), r.cpu()?)))
        .collect();
    let transitions0 = fleet.transitions;
    fleet.phase = "steady";
    let from = SystemTime::now();
    out.balance.push(fleet.min_max());
    fleet.pump(window);
    let to = SystemTime::now();
    out.balance.push(fleet.min_max());
    out.churn_in_window = fleet.transitions - transitions0;
    let cmds = redis.map(|r| r.top_level_calls().values().sum::<u64>());
    let minutes = to.duration_since(from).unwrap_or_default().as_secs_f64() / 60.0;
    if let (Some(a), Some(b)) = (before_cmds, cmds) {
        out.server_commands_per_min = Some(b.saturating_sub(a) as f64 / minutes);
    }
    // Let the last counters in.
    fleet.pump(Duration::from_millis(1200));
    for r in &fleet.replicas {
        let cpu = match (cpu0.get(&r.identity), r.cpu()) {
            (Some(a), Some(b)) => {
                100.0 * b.saturating_sub(*a).as_secs_f64()
                    / (to.duration_since(from).unwrap_or_default().as_secs_f64() + 1.2)
            }
            _ => 0.0,
        };
        let mut s = Steady {
            identity: r.identity.clone(),
            owned: fleet.held.get(&r.identity).map_or(0, BTreeSet::len),
            rss_kib: r.rss_kib().unwrap_or(0),
            cpu_percent: cpu,
            ..Steady::default()
        };
        if store == Store::Redis
            && let (Some((t0, a)), Some((t1, b))) = (
                fleet.stats_at(&r.identity, from),
                fleet.stats_at(&r.identity, to),
            )
        {
            let m = t1.duration_since(t0).unwrap_or_default().as_secs_f64() / 60.0;
            s.requests_per_min = b[0].saturating_sub(a[0]) as f64 / m.max(1e-9);
            s.operations_per_min = b[2].saturating_sub(a[2]) as f64 / m.max(1e-9);
            s.watches = b[3];
            s.verbs
                .insert("round_trips".into(), b[0].saturating_sub(a[0]));
            s.verbs
                .insert("script_calls".into(), b[1].saturating_sub(a[1]));
            s.verbs
                .insert("operations".into(), b[2].saturating_sub(a[2]));
            s.verbs.insert("observers".into(), b[4]);
        }
        out.steady.push(s);
    }
    out.window = (Some(from), Some(to));
    eprintln!(
        "   steady state: balance {:?}, churn {} term starts/ends in the window",
        out.balance, out.churn_in_window
    );

    for round in 0..rounds {
        if out.broken.is_some() {
            break;
        }
        for (what, n) in [("join", 0), ("leave", 1), ("join", 2), ("crash", 3)] {
            fleet.phase = what;
            let s = match what {
                "join" => fleet.join(),
                _ => fleet.leave(what == "crash"),
            };
            fleet.pump(SETTLE);
            let s = Sample {
                loads: fleet.min_max(),
                ..s
            };
            eprintln!(
                "   round {} {what:<5}: all held {:>8}, balanced {:>8}, loads {:?} over {} replicas",
                round + 1,
                fmt_d(s.all_held),
                fmt_d(s.balanced),
                s.loads,
                fleet.live.len()
            );
            let failed = s.all_held.is_none();
            match n {
                0 | 2 => out.joins.push(s),
                1 => out.leaves.push(s),
                _ => out.crashes.push(s),
            }
            if failed {
                out.broken = Some(format!("round {}: the {what} never settled", round + 1));
                break;
            }
        }
    }
    fleet.phase = "stop";
    out.moves = std::mem::take(&mut fleet.moves);
    fleet.stop();
    out.secs = began.elapsed().as_secs_f64();
    out
}

/// Fills the Kubernetes figures of `r` from the audit log.
fn kube_figures(r: &mut Run, lines: &[Audit]) {
    let (Some(from), Some(to)) = r.window else {
        return;
    };
    let (counts, open) = audit_counts(lines, from, to);
    let minutes = to.duration_since(from).unwrap_or_default().as_secs_f64() / 60.0;
    for s in &mut r.steady {
        let verbs = counts.get(&s.identity).cloned().unwrap_or_default();
        let all: u64 = verbs.values().sum();
        let writes: u64 = verbs
            .iter()
            .filter(|(v, _)| matches!(v.as_str(), "update" | "patch" | "create" | "delete"))
            .map(|(_, n)| *n)
            .sum();
        s.requests_per_min = all as f64 / minutes;
        s.operations_per_min = writes as f64 / minutes;
        s.watches = open.get(&s.identity).copied().unwrap_or(0);
        s.verbs = verbs;
    }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = v.collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn maxf(v: impl Iterator<Item = f64>) -> f64 {
    v.fold(0.0, f64::max)
}

/// Figures of one run, for the table and the JSON.
struct Summary {
    startup: Option<Duration>,
    balance: (usize, usize),
    join: Option<Duration>,
    leave: Option<Duration>,
    crash: Option<Duration>,
    req_mean: f64,
    req_max: f64,
    /// Worst replica's requests / its goal.
    goal_ratio: f64,
    watches_mean: f64,
    watches_max: f64,
    rss_mib: f64,
    cpu: f64,
}

impl Summary {
    fn of(r: &Run) -> Self {
        let pick = |s: &Sample| match r.imp {
            "tenure" => s.balanced,
            _ => s.all_held,
        };
        let p50 = |v: &[Sample]| pct(&v.iter().map(pick).collect::<Vec<_>>(), 0.5);
        Self {
            startup: pick(&r.startup),
            balance: r.balance.last().copied().unwrap_or_default(),
            join: p50(&r.joins),
            leave: p50(&r.leaves),
            crash: p50(&r.crashes),
            req_mean: mean(r.steady.iter().map(|s| s.requests_per_min)),
            req_max: maxf(r.steady.iter().map(|s| s.requests_per_min)),
            goal_ratio: maxf(
                r.steady
                    .iter()
                    .map(|s| s.requests_per_min / Timings::of(r.store).goal_per_min(s.owned)),
            ),
            watches_mean: mean(r.steady.iter().map(|s| s.watches as f64)),
            watches_max: maxf(r.steady.iter().map(|s| s.watches as f64)),
            rss_mib: mean(r.steady.iter().map(|s| s.rss_kib as f64 / 1024.0)),
            cpu: mean(r.steady.iter().map(|s| s.cpu_percent)),
        }
    }
}

fn sample_json(v: &[Sample]) -> Value {
    let all: Vec<Option<Duration>> = v.iter().map(|s| s.all_held).collect();
    let bal: Vec<Option<Duration>> = v.iter().map(|s| s.balanced).collect();
    json!({
        "n": v.len(),
        "all_held_ms": {"p50": ms(pct(&all, 0.5)), "max": ms(pct(&all, 1.0)),
                        "samples": all.iter().map(|d| ms(*d)).collect::<Vec<_>>()},
        "balanced_ms": {"p50": ms(pct(&bal, 0.5)), "max": ms(pct(&bal, 1.0)),
                        "samples": bal.iter().map(|d| ms(*d)).collect::<Vec<_>>()},
        "loads_min_max_after": v.iter().map(|s| [s.loads.0, s.loads.1]).collect::<Vec<_>>(),
    })
}

fn run_json(r: &Run) -> Value {
    json!({
        "store": r.store,
        "implementation": r.imp,
        "bench_secs": round2(r.secs),
        "broken": r.broken,
        "startup": {
            "all_held_ms": ms(r.startup.all_held),
            "balanced_ms": ms(r.startup.balanced),
            "loads_min_max": [r.startup.loads.0, r.startup.loads.1],
        },
        "steady_balance_min_max": r.balance.iter().map(|(a, b)| [*a, *b]).collect::<Vec<_>>(),
        "churn_in_window": r.churn_in_window,
        "server_commands_per_min_all_replicas": r.server_commands_per_min.map(round2),
        "replicas": r.steady.iter().map(|s| json!({
            "identity": s.identity,
            "owned": s.owned,
            "requests_per_min": round2(s.requests_per_min),
            "goal_per_min": round2(Timings::of(r.store).goal_per_min(s.owned)),
            "operations_per_min": round2(s.operations_per_min),
            "watches": s.watches,
            "rss_kib": s.rss_kib,
            "cpu_percent": round2(s.cpu_percent),
            "counts_in_window": s.verbs,
        })).collect::<Vec<_>>(),
        "join": sample_json(&r.joins),
        "graceful_leave": sample_json(&r.leaves),
        "crash": sample_json(&r.crashes),
        "shard_handoffs": handoffs_json(r),
    })
}

fn handoffs_json(r: &Run) -> Value {
    let phases = ["join", "leave"].map(|phase| {
        let m = moves_of(r, phase);
        json!({
            "phase": phase,
            "n": m.len(),
            "p50_ms": ms((!m.is_empty()).then(|| percentile(&m, 0.5))),
            "p99_ms": ms((!m.is_empty()).then(|| percentile(&m, 0.99))),
            "max_ms": ms(m.last().copied()),
        })
    });
    Value::Array(phases.to_vec())
}

/// The per-shard hand-offs of `r` in `phase`, sorted.
fn moves_of(r: &Run, phase: &str) -> Vec<Duration> {
    let mut m: Vec<Duration> = r
        .moves
        .iter()
        .filter(|(p, _)| *p == phase)
        .map(|(_, d)| *d)
        .collect();
    m.sort();
    m
}

fn ratio(t: f64, b: f64) -> String {
    if b <= 0.0 {
        return "—".into();
    }
    format!("{:.3}", t / b)
}

fn dratio(t: Option<Duration>, b: Option<Duration>) -> String {
    match (t, b) {
        (Some(t), Some(b)) if !b.is_zero() => ratio(t.as_secs_f64(), b.as_secs_f64()),
        (Some(_), Some(_)) => "— (baseline 0)".into(),
        _ => "—".into(),
    }
}

fn balance_cell(b: (usize, usize)) -> String {
    let r = if b.0 == 0 {
        "∞".to_owned()
    } else {
        format!("{:.2}", b.1 as f64 / b.0 as f64)
    };
    format!("{}/{} = {r} (spread {})", b.1, b.0, b.1 - b.0)
}

fn orchestrate() {
    let window = knob_secs("TENURE_BENCH_WINDOW_SECS", Duration::from_secs(30));
    let rounds: usize = knob("TENURE_BENCH_ROUNDS", 4);
    let began = Instant::now();
    let redis = RedisServer::start();
    let (server, audit) = apiserver::start_audited(&fresh_dir("shard-audit"), LEASE_AUDIT_POLICY);
    eprintln!(
        "redis-server and kube-apiserver ready in {:?}",
        began.elapsed()
    );
    let kubeconfig = server.admin_kubeconfig().display().to_string();

    // `TENURE_BENCH_ONLY=kube-baseline,redis-tenure` runs only those (for trying things out).
    let mut runs = Vec::new();
    for (store, imp) in [
        (Store::Redis, Imp::Tenure),
        (Store::Redis, Imp::Baseline),
        (Store::Kube, Imp::Tenure),
        (Store::Kube, Imp::Baseline),
    ] {
        let name = format!("{}-{}", store.key(), imp.key());
        if !selected("TENURE_BENCH_ONLY", &name) {
            runs.push(Run {
                store: store.key(),
                imp: imp.key(),
                broken: Some("not run (TENURE_BENCH_ONLY)".into()),
                ..Run::default()
            });
            continue;
        }
        let (endpoint, server) = match store {
            Store::Redis => (redis.url(), Some(&redis)),
            Store::Kube => (kubeconfig.clone(), None),
        };
        runs.push(run(store, imp, endpoint, server, window, rounds));
    }
    let lines = audit_lines(&audit);
    for r in &mut runs {
        if r.store == "kube" {
            kube_figures(r, &lines);
        }
    }
    let elapsed = began.elapsed();
    print_results(&runs, window, elapsed);
    drop(server);
    drop(redis);
}

fn print_results(runs: &[Run], window: Duration, elapsed: Duration) {
    let sums: Vec<Summary> = runs.iter().map(Summary::of).collect();
    let fmt_t = |t: Timings| {
        format!(
            "lease {:?} / renew deadline {:?} / retry {:?}",
            t.lease, t.renew_deadline, t.retry
        )
    };
    let durations = format!(
        "durations the same for tenure and the baseline: Redis {}, kube {}; stop margin {STOP_MARGIN:?}, rejoin on",
        fmt_t(Timings::of("redis")),
        fmt_t(Timings::of("kube"))
    );
    println!();
    println!(
        "Sharded leadership: N = {} shards, M = {REPLICAS} replicas (separate processes), {durations}; \
         steady window {window:?}; Redis 7 and kube-apiserver v1.36 on 127.0.0.1; bench took {:.0} s",
        shards(),
        elapsed.as_secs_f64()
    );
    println!(
        "tenure: ShardedElector; baseline: {} LeaderElectors per replica on one Locker, all started at once. \
         Times: p50 from the event to every shard held once on a live replica and (tenure) spread ≤ 1; \
         baseline: to every shard held (it never rebalances).",
        shards()
    );
    println!();
    let columns = [
        "metric",
        "Redis tenure",
        "Redis baseline",
        "ratio t/b",
        "kube tenure",
        "kube baseline",
        "ratio t/b",
    ];
    println!("{}", support::table::header(&columns, 0));
    let (rt, rb, kt, kb) = (&sums[0], &sums[1], &sums[2], &sums[3]);
    let n = |r: &Run, which: &str| match which {
        "join" => r.joins.len(),
        "leave" => r.leaves.len(),
        _ => r.crashes.len(),
    };
    let row =
        |name: &str, f: &dyn Fn(&Summary) -> String, rat: &dyn Fn(&Summary, &Summary) -> String| {
            println!(
                "| {name} | {} | {} | {} | {} | {} | {} |",
                f(rt),
                f(rb),
                rat(rt, rb),
                f(kt),
                f(kb),
                rat(kt, kb)
            );
        };
    row(
        "balance max/min at steady state",
        &|s| balance_cell(s.balance),
        &|t, b| {
            format!(
                "spread {} vs {}",
                t.balance.1 - t.balance.0,
                b.balance.1 - b.balance.0
            )
        },
    );
    row(
        "start-up: to all held (tenure: and balanced)",
        &|s| fmt_d(s.startup),
        &|t, b| dratio(t.startup, b.startup),
    );
    for (label, which) in [
        ("join, p50", "join"),
        ("graceful leave (SIGTERM), p50", "leave"),
        ("kill -9, p50", "crash"),
    ] {
        let get = |s: &Summary| match which {
            "join" => s.join,
            "leave" => s.leave,
            _ => s.crash,
        };
        let ns = [&runs[0], &runs[1], &runs[2], &runs[3]].map(|r| n(r, which));
        println!(
            "| {label} (n = {}/{}/{}/{}) | {} | {} | {} | {} | {} | {} |",
            ns[0],
            ns[1],
            ns[2],
            ns[3],
            fmt_d(get(rt)),
            fmt_d(get(rb)),
            dratio(get(rt), get(rb)),
            fmt_d(get(kt)),
            fmt_d(get(kb)),
            dratio(get(kt), get(kb)),
        );
    }
    // One shard's hand-off: from the old term's end (its `E` line) to the next term's start.
    for (label, phase) in [
        ("shard hand-off in a join, p50 / p99 / max (n)", "join"),
        (
            "shard hand-off in a graceful leave, p50 / p99 / max (n)",
            "leave",
        ),
    ] {
        let cell = |r: &Run| {
            let m = moves_of(r, phase);
            if m.is_empty() {
                return "—".to_string();
            }
            format!(
                "{} / {} / {} ({})",
                fmt_d(Some(percentile(&m, 0.5))),
                fmt_d(Some(percentile(&m, 0.99))),
                fmt_d(m.last().copied()),
                m.len()
            )
        };
        println!(
            "| {label} | {} | {} | | {} | {} | |",
            cell(&runs[0]),
            cell(&runs[1]),
            cell(&runs[2]),
            cell(&runs[3])
        );
    }
    // The rows whose ratio is of one figure: (row, cell, figure).
    type Figure = (&'static str, fn(&Summary) -> String, fn(&Summary) -> f64);
    let figures: [Figure; 5] = [
        (
            "store requests/min per replica, mean (max)",
            |s| format!("{:.0} ({:.0})", s.req_mean, s.req_max),
            |s| s.req_mean,
        ),
        (
            "worst replica's requests / its goal",
            |s| format!("{:.2}", s.goal_ratio),
            |s| s.goal_ratio,
        ),
        (
            "watches (kube) / subscribed channels (Redis) per replica, mean (max)",
            |s| format!("{:.1} ({:.0})", s.watches_mean, s.watches_max),
            |s| s.watches_mean,
        ),
        (
            "RSS per replica, mean",
            |s| format!("{:.1} MiB", s.rss_mib),
            |s| s.rss_mib,
        ),
        (
            "CPU per replica, mean (% of a core)",
            |s| format!("{:.1} %", s.cpu),
            |s| s.cpu,
        ),
    ];
    for (name, cell, figure) in figures {
        row(name, &cell, &|t, b| ratio(figure(t), figure(b)));
    }
    println!();
    println!(
        "Goal per replica: (owned + 1) × 60 s / (lease/3) = (owned + 1) × {:.0} (Redis) or × {:.0} (kube) requests/min (each owned shard renewed every lease/3, one membership heartbeat every lease/3). \
         Redis requests are round trips (a renewal batch is one); kube requests are every audited lease request by the replica's User-Agent.",
        Timings::of("redis").goal_per_min(0),
        Timings::of("kube").goal_per_min(0)
    );
    for r in runs {
        if let Some(c) = r.server_commands_per_min {
            let client: f64 = r
                .steady
                .iter()
                .map(|s| s.verbs.get("script_calls").copied().unwrap_or(0) as f64)
                .sum::<f64>()
                / (window.as_secs_f64() / 60.0);
            println!(
                "{} {}: server-side INFO commandstats, all replicas: {:.0} commands/min ({:.0} per replica); client-side script calls: {:.0}/min",
                r.store,
                r.imp,
                c,
                c / REPLICAS as f64,
                client
            );
        }
        if r.churn_in_window > 0 {
            println!(
                "{} {}: {} term starts/ends during the steady window (leases lost and retaken)",
                r.store, r.imp, r.churn_in_window
            );
        }
        if let Some(b) = &r.broken {
            println!("{} {}: stopped early: {b}", r.store, r.imp);
        }
    }
    println!();
    println!(
        "Per replica at steady state (owned, requests/min, goal, watches, RSS MiB, CPU %, counts):"
    );
    for r in runs {
        for s in &r.steady {
            println!(
                "  {:<6} {:<8} {:<22} owned {:>3}  req/min {:>7.1}  goal {:>6.0}  watches {:>3}  rss {:>5.1}  cpu {:>5.1}  {:?}",
                r.store,
                r.imp,
                s.identity,
                s.owned,
                s.requests_per_min,
                Timings::of(r.store).goal_per_min(s.owned),
                s.watches,
                s.rss_kib as f64 / 1024.0,
                s.cpu_percent,
                s.verbs
            );
        }
    }

    let ratios: Vec<Value> = ["redis", "kube"]
        .iter()
        .map(|store| {
            let t = runs
                .iter()
                .position(|r| r.store == *store && r.imp == "tenure");
            let b = runs
                .iter()
                .position(|r| r.store == *store && r.imp == "baseline");
            let (Some(t), Some(b)) = (t, b) else {
                return json!(null);
            };
            let (t, b) = (&sums[t], &sums[b]);
            let f = |a: f64, c: f64| {
                if c > 0.0 {
                    json!((a / c * 1000.0).round() / 1000.0)
                } else {
                    json!(null)
                }
            };
            let d = |a: Option<Duration>, c: Option<Duration>| match (a, c) {
                (Some(a), Some(c)) if !c.is_zero() => {
                    json!((a.as_secs_f64() / c.as_secs_f64() * 1000.0).round() / 1000.0)
                }
                _ => json!(null),
            };
            json!({
                "store": store,
                "spread": [t.balance.1 - t.balance.0, b.balance.1 - b.balance.0],
                "join_p50": d(t.join, b.join),
                "graceful_leave_p50": d(t.leave, b.leave),
                "crash_p50": d(t.crash, b.crash),
                "requests_per_min_mean": f(t.req_mean, b.req_mean),
                "watches_mean": f(t.watches_mean, b.watches_mean),
                "rss_mean": f(t.rss_mib, b.rss_mib),
                "cpu_mean": f(t.cpu, b.cpu),
            })
        })
        .collect::<Vec<_>>();
    let durations_json: Vec<Value> = ["redis", "kube"]
        .map(|store| {
            let t = Timings::of(store);
            json!({
                "store": store,
                "lease_ms": t.lease.as_millis() as u64,
                "renew_deadline_ms": t.renew_deadline.as_millis() as u64,
                "retry_ms": t.retry.as_millis() as u64,
                "stop_margin_ms": STOP_MARGIN.as_millis() as u64,
            })
        })
        .to_vec();
    let json = json!({
        "shards": shards(),
        "replicas": REPLICAS,
        "processes": true,
        "durations": durations_json,
        "window_secs": window.as_secs(),
        "percentiles": "the sample at index round(p*(n-1)) of the sorted samples",
        "timing": "from the event (join: the new replica's R line right before it campaigns; leave/kill: the signal) to the start of the state, held 500 ms, where every shard runs once on a live replica (all_held) and the spread is <= 1 (balanced)",
        "bench_secs": round2(elapsed.as_secs_f64()),
        "runs": runs.iter().map(run_json).collect::<Vec<_>>(),
        "tenure_over_baseline": ratios,
    });
    save_json("shard.json", &json, Say::Stdout);
}
