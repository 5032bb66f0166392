//! One simulated run: replicas running tenure's real `LeaderElector` (one lease) or
//! `ShardedElector` (a sharded group) against the simulated store, a chaos phase of seeded
//! faults, then a quiet phase that checks liveness, balance and the moves of a graceful join,
//! a graceful leave and a kill.
//!
//! Everything runs on one `current_thread` tokio runtime with a paused clock and a seeded
//! generator (`select!`, `watch`), each replica with its own `Locker` (its own renewal
//! scheduler) and link, and tenure's retry jitter seeded on this thread — so a seed and the
//! parameters decide the whole history.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tenure::backend::memory::MemoryBackend;
use tenure::election::{HandoffCause, HealthPolicy};
use tenure::shard::{ShardedElector, lease_name};
use tenure::{ElectionConfig, LeaderElector, Locker, Term};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::sleep;

use crate::link::{Bounds, Latency, Link, SLOWEST_COVERED_RATE};
use crate::world::{Excuse, Finding, HealthBounds, Kind, Mirror, World};

mod chaos;
mod nemesis;
mod quiet;
mod stuck;

pub use nemesis::NAMES as NEMESES;

/// What a run simulates; with the seed, all that decides its history.
#[derive(Clone, Debug)]
pub struct Params {
    pub seed: u64,
    pub replicas: usize,
    /// 0: one lease (`LeaderElector`); otherwise a sharded group of this many shards.
    pub shards: u32,
    /// Virtual seconds of faults before the quiet phase.
    pub chaos_secs: u64,
    pub faults: bool,
    /// Let replica clocks run slower than the drift allowance covers.
    pub drift_beyond: bool,
    /// Keep the history's lines (for replay and trimming), not only its hash.
    pub keep_lines: bool,
    /// The share of terms whose workload ignores cancellation.
    pub stubborn: f64,
    /// Targeted faults beside the random ones (`nemesis.rs`).
    pub nemeses: bool,
}

impl Params {
    /// The replay command of this run.
    pub fn replay(&self) -> String {
        let mut cmd = format!(
            "scripts/sim.sh --seed {} --replicas {} --shards {} --chaos-secs {}",
            self.seed, self.replicas, self.shards, self.chaos_secs
        );
        if !self.faults {
            cmd.push_str(" --no-faults");
        }
        if self.drift_beyond {
            cmd.push_str(" --drift-beyond");
        }
        if !self.nemeses {
            cmd.push_str(" --no-nemeses");
        }
        if (self.stubborn - 0.5).abs() > f64::EPSILON {
            cmd.push_str(&format!(" --stubborn {}", self.stubborn));
        }
        cmd.push_str(" --trace");
        cmd
    }
}

/// Figures of a sharded run's quiet phase (virtual time).
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub balanced_after_join: Option<f64>,
    pub balanced_after_leave: Option<f64>,
    pub balanced_after_kill: Option<f64>,
    pub moves_join: usize,
    pub moves_leave: usize,
    pub moves_kill: usize,
    /// A rolling update to another shard count: from its first new replica to the new count
    /// balanced.
    pub resized_after: Option<f64>,
    /// Store calls per virtual second with the group settled.
    pub store_calls_per_sec: f64,
}

pub struct Outcome {
    pub params: Params,
    pub findings: Vec<Finding>,
    pub fingerprint: (u64, u64),
    pub lines: Vec<String>,
    pub faults: u64,
    pub terms: u64,
    /// Tasks the terms spawned with `Term::spawn`.
    pub term_tasks: u64,
    /// Tasks handed a term outside it; elector runs dropped; the releases those owed.
    pub escaped_tasks: u64,
    pub runs_dropped: (u64, u64),
    pub writes: (u64, u64, u64, u64),
    pub figures: Figures,
    /// Every nemesis that fired: virtual ms, name, lease.
    pub nemeses: Vec<(u64, &'static str, String)>,
    pub lease_ms: u64,
    /// Step-downs for health (one lease's runs).
    pub health_moves: u64,
}

/// The election timings of a run, drawn from the seed among valid configurations.
struct Timing {
    lease: Duration,
    retry: Duration,
    /// How long a campaign attempt or renewal may take before the lock runtime stops waiting
    /// for its answer.
    request_timeout: Duration,
    renew_deadline: Duration,
    grace: Duration,
    config: ElectionConfig,
    /// One lease's electors follow their workloads' health (`health-*` nemeses).
    health: HealthBounds,
}

fn timing(world: &World) -> Timing {
    let lease_ms = world.rng(|r| [4_500u64, 9_000, 15_000][r.below(3) as usize]);
    let lease = Duration::from_millis(lease_ms);
    let retry = lease * 2 / 15;
    let renew_deadline = lease * 2 / 3;
    // The default stop margin (1 s) hides every error in the validity arithmetic smaller
    // than itself: two runs in three use none or a few milliseconds, so the workload is
    // dropped at the boundary the arithmetic computes. Likewise the grace of a stop.
    let stop_margin = world.rng(|r| {
        [
            Duration::from_secs(1),
            Duration::ZERO,
            Duration::from_millis(5),
        ][r.below(3) as usize]
    });
    let grace = world.rng(|r| [Duration::from_secs(5), lease / 3][r.below(2) as usize]);
    let config = ElectionConfig::new()
        .lease_duration(lease)
        .renew_deadline(renew_deadline)
        .retry_period(retry)
        .stop_margin(stop_margin)
        .grace(grace)
        .rejoin(true);
    world.event(format_args!(
        "timing stop margin {stop_margin:?} grace {grace:?}"
    ));
    // Derived, not drawn: a draw here would change every sharded run's history too.
    let health = HealthBounds {
        unhealthy_after: lease / 3,
        recovery: lease * 2,
        // The announcement's ttl (one lease), plus the longest a request can be held on its
        // way: a cut or freeze (≤ 2.5 leases), a spike on top (≤ 1.2 leases + 2 s).
        stale_for: lease * 5 + Duration::from_secs(2),
    };
    Timing {
        lease,
        retry,
        health,
        // `ElectionConfig`'s default bound on campaign attempts and renewals (no request
        // timeout set): the renew deadline (#42; it was half the retry period).
        request_timeout: renew_deadline,
        renew_deadline,
        grace,
        config,
    }
}

struct Replica {
    identity: String,
    link: Link,
    /// One lease's elector (its workload's health is reported to it); `None` in a group.
    elector: Option<LeaderElector>,
    /// A group member's shard count and the assignment it publishes; `None` for one lease.
    assignment: Option<(u32, tokio::sync::watch::Receiver<tenure::shard::Assignment>)>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

struct Sim {
    p: Params,
    world: Arc<World>,
    store: MemoryBackend,
    t: Timing,
    latency: Latency,
    replicas: BTreeMap<usize, Replica>,
    /// Crashed or stopped replicas waiting to come back.
    down: Vec<usize>,
    /// Replicas stopping gracefully; killed if they are still at it when they restart.
    leaving: BTreeMap<usize, Replica>,
    incarnations: BTreeMap<usize, u32>,
    next_id: usize,
    write_every: (f64, f64),
    stubborn: f64,
    /// Every fault healed: no new faults, no latency spikes.
    quiet: bool,
    /// Replicas started for a while only (`resize-late`): retired, never restarted.
    transient: std::collections::BTreeSet<usize>,
    /// When the chaos phase ends (the heal of every fault).
    chaos_end: tokio::time::Instant,
}

/// Runs one seed on a fresh runtime.
pub fn run(p: &Params) -> Outcome {
    let watch = stuck::Watch::new();
    let polled = watch.clone();
    // Seeds tokio's `select!` and `watch` choices: needs `--cfg tokio_unstable`.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .rng_seed(tokio::runtime::RngSeed::from_bytes(&p.seed.to_le_bytes()))
        .on_after_task_poll(move |_| polled.polled())
        .build()
        .expect("a current-thread runtime builds");
    tenure::lock::seed_jitter(Some(p.seed.wrapping_mul(0x2545_F491_4F6C_DD1D)));
    let outcome = rt.block_on(async {
        // Made on the runtime: its origin is the paused clock's.
        let world = Arc::new(World::new(p.seed, p.keep_lines));
        // Biased: no draw from the seeded generator, so the history is the same as without.
        tokio::select! {
            biased;
            () = watch.notify.notified() => {
                world.find(
                    "-",
                    Kind::Stuck,
                    None,
                    format!(
                        "virtual time stood still for {} task polls: a task that never waits \
                         (a busy loop); the seed ends here",
                        watch.polls_still.load(Ordering::Relaxed)
                    ),
                );
                outcome(p.clone(), &world, Figures::default())
            }
            ended = simulate(p.clone(), world.clone()) => ended,
        }
    });
    tenure::lock::seed_jitter(None);
    // Dropping the runtime drops every task left (replicas' leftovers, dead links' calls).
    drop(rt);
    outcome
}

async fn simulate(p: Params, world: Arc<World>) -> Outcome {
    let t = timing(&world);
    world.lease_ms.store(
        u64::try_from(t.lease.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    let latency = world.rng(|r| Latency {
        base_ms: r.between(0.2, 2.0),
        mean_ms: r.between(0.5, 8.0),
        spike_chance: if p.faults { r.between(0.0, 0.01) } else { 0.0 },
        spike_ms: r.between(100.0, 2_000.0),
        conflict_chance: if p.faults { r.between(0.0, 0.03) } else { 0.0 },
    });
    world.event(format_args!(
        "run seed={} replicas={} shards={} lease={:?} retry={:?} latency={latency:?}",
        p.seed, p.replicas, p.shards, t.lease, t.retry
    ));
    // Few shards: every term writes several times a second; many: every few seconds.
    let write_every = if p.shards > 256 {
        (2.0, 8.0)
    } else {
        (0.05, 0.4)
    };
    let mut sim = Sim {
        p: p.clone(),
        world: world.clone(),
        store: MemoryBackend::with_own_tokens(),
        t,
        latency,
        replicas: BTreeMap::new(),
        down: Vec::new(),
        leaving: BTreeMap::new(),
        incarnations: BTreeMap::new(),
        next_id: 0,
        write_every,
        stubborn: p.stubborn,
        quiet: false,
        transient: Default::default(),
        chaos_end: tokio::time::Instant::now(),
    };
    for _ in 0..p.replicas {
        let id = sim.next_id;
        sim.next_id += 1;
        sim.start(id);
    }
    if p.faults {
        sim.chaos(Duration::from_secs(p.chaos_secs)).await;
    } else {
        sleep(Duration::from_secs(p.chaos_secs)).await;
    }
    sim.heal_all();
    let figures = sim.quiet().await;
    for r in sim.replicas.values_mut() {
        if let Some(stop) = r.stop.take() {
            let _ = stop.send(());
        }
    }
    outcome(p, &world, figures)
}

/// What the world recorded of a run, ended or cut short.
fn outcome(p: Params, world: &World, figures: Figures) -> Outcome {
    let c = &world.counters;
    Outcome {
        params: p,
        findings: world.findings(),
        fingerprint: world.fingerprint(),
        lines: world.lines(),
        faults: c.faults.load(Ordering::Relaxed),
        terms: c.terms.load(Ordering::Relaxed),
        term_tasks: c.term_tasks.load(Ordering::Relaxed),
        escaped_tasks: c.escaped_tasks.load(Ordering::Relaxed),
        runs_dropped: (
            c.runs_dropped.load(Ordering::Relaxed),
            c.releases_owed.load(Ordering::Relaxed),
        ),
        writes: (
            c.writes_issued.load(Ordering::Relaxed),
            c.writes_accepted.load(Ordering::Relaxed),
            c.writes_fenced_off.load(Ordering::Relaxed),
            c.late_writes_stopped.load(Ordering::Relaxed),
        ),
        figures,
        nemeses: world.nemeses(),
        lease_ms: world.lease_ms.load(Ordering::Relaxed),
        health_moves: world.health_moves.load(Ordering::Relaxed),
    }
}

/// A term's workload: writes with the term's token while the term is valid, as a user's
/// fenced workload does; records the term's start and end for the checker.
async fn workload(
    world: Arc<World>,
    link: Link,
    lease: String,
    term: Term,
    every: (f64, f64),
    stubborn_share: f64,
    count: Option<u32>,
) {
    let label = link.label().to_owned();
    world.term_started(&lease, &label, &term, link.beyond_bound());
    if let Some(count) = count {
        world.count_started(&lease, count);
    }
    struct Ended(Arc<World>, Link, String, Term, Option<u32>);
    impl Drop for Ended {
        fn drop(&mut self) {
            self.0.term_ended(&self.2, self.1.label(), &self.3);
            if let Some(count) = self.4 {
                self.0.count_ended(count);
            }
        }
    }
    let _ended = Ended(
        world.clone(),
        link.clone(),
        lease.clone(),
        term.clone(),
        count,
    );
    let token = term.fencing_token().get();
    // Every term mirrors its validity through a renewal listener, as `tenure run`'s watchdog
    // does; each cooperative write judges the mirror against the term (`write`).
    let mirror = Arc::new(std::sync::Mutex::new(Mirror::default()));
    {
        let mirror = mirror.clone();
        term.on_renewal(move |valid_until| crate::world::lock(&mirror).told(valid_until));
    }
    // Some terms (half by default) run a stubborn workload: it ignores cancellation and writes without
    // checking its term, as code stuck in a long call does. The elector must drop it in time.
    let mut stubborn = world.rng(|r| r.chance(stubborn_share));
    // Half the terms do part of their writing from a task of the term (`Term::spawn`), as a
    // controller's term spawns one task per reconcile; stubborn as often as workloads are.
    // The elector must abort and await it before the release (checker `ReleaseBeforeTasks`),
    // and its writes are judged as the workload's own (`InvalidWrite`, `Overlap`).
    let (with_task, task_stubborn) = world.rng(|r| (r.chance(0.5), r.chance(stubborn_share)));
    // A quarter of the terms also hand their term to a task outside it (`tokio::spawn`, not
    // `Term::spawn`), which outlives the term and writes only while `Term::is_valid`: the
    // term must say it is over the moment its lease is released or lost.
    if world.rng(|r| r.chance(0.25)) {
        drop(tokio::spawn(escaped(
            world.clone(),
            link.clone(),
            lease.clone(),
            term.clone(),
            every,
        )));
    }
    if with_task {
        let task = term_task(
            world.clone(),
            link.clone(),
            lease.clone(),
            term.clone(),
            every,
            task_stubborn,
        );
        // Detached: the term's end aborts it; its handle is not needed.
        drop(term.spawn(task));
    }
    loop {
        let pause = Duration::from_secs_f64(world.rng(|r| r.between(every.0, every.1)));
        if stubborn {
            sleep(pause).await;
        } else {
            tokio::select! {
                () = sleep(pause) => {}
                () = term.cancellation().cancelled() => {
                    // The `stubborn-stop` nemesis: this process's workloads ignore it.
                    if !world.forced_stubborn(&label) {
                        return;
                    }
                    stubborn = true;
                }
            }
        }
        if let Some(stall) = world.take_stall(&lease, token) {
            nemesis::stall_runtime(&world, &link, &lease, &term, &stall);
        }
        write(&world, &link, &lease, &term, stubborn, Some(&mirror));
    }
}

/// One write of a term's workload or task: a stubborn one writes without looking at its
/// term; a cooperative one only while `Term::is_valid`, judged by what the validity rests on
/// (not by the term's own answer). A workload's `mirror` (its renewal listener) is judged
/// beside: a term valid now was valid when the listener was registered, so the listener
/// must hold its validity. Only here, where `is_valid` has just read the term: reading it
/// anywhere else would settle its state at other instants and change the history.
fn write(
    world: &World,
    link: &Link,
    lease: &str,
    term: &Term,
    stubborn: bool,
    mirror: Option<&std::sync::Mutex<Mirror>>,
) {
    let token = term.fencing_token().get();
    if stubborn {
        link.write(lease.to_owned(), token);
    } else if term.is_valid() {
        if let Some(mirror) = mirror {
            world.judge_listener(lease, link.label(), term, &crate::world::lock(mirror));
        }
        world.judge_write(
            lease,
            token,
            link.label(),
            link.renew_deadline(lease),
            link.store_record(lease).as_ref(),
            link.beyond_bound().load(Ordering::Relaxed),
        );
        link.write(lease.to_owned(), token);
    }
}

/// A task that escaped its term (spawned on the runtime, not with `Term::spawn`): nobody
/// stops it, so it looks at the term before each write and ends once the term says it is
/// over, or with its process. Its writes are judged like a cooperative workload's
/// (`InvalidWrite`).
async fn escaped(world: Arc<World>, link: Link, lease: String, term: Term, every: (f64, f64)) {
    world.counters.escaped_tasks.fetch_add(1, Ordering::Relaxed);
    world.event(format_args!(
        "escaped task {lease} #{} {} starts",
        term.fencing_token(),
        link.label()
    ));
    let died = link.died();
    tokio::pin!(died);
    loop {
        let pause = Duration::from_secs_f64(world.rng(|r| r.between(every.0, every.1)));
        tokio::select! {
            biased;
            () = &mut died => return,
            () = sleep(pause) => {}
        }
        if !term.is_valid() {
            return;
        }
        write(&world, &link, &lease, &term, false, None);
    }
}

/// A task of a term (`Term::spawn`): writes with the term's token like the workload, until
/// its term's cancellation (a cooperative task) or until the elector aborts it (a stubborn
/// one, or any task of a process under `stubborn-stop`: it ignores the cancellation, as a
/// task in a long call does); it dies with its process. Its life counts as its term's for
/// the checker (`Overlap`), and it must be gone before the term's release.
async fn term_task(
    world: Arc<World>,
    link: Link,
    lease: String,
    term: Term,
    every: (f64, f64),
    mut stubborn: bool,
) {
    let label = link.label().to_owned();
    world.task_started(&lease, &label, &term, link.beyond_bound(), stubborn);
    struct Ended(Arc<World>, String, String, Term);
    impl Drop for Ended {
        fn drop(&mut self) {
            self.0.task_ended(&self.1, &self.2, &self.3);
        }
    }
    let _ended = Ended(world.clone(), lease.clone(), label.clone(), term.clone());
    let died = link.died();
    tokio::pin!(died);
    loop {
        let pause = Duration::from_secs_f64(world.rng(|r| r.between(every.0, every.1)));
        tokio::select! {
            biased;
            () = &mut died => return,
            () = sleep(pause) => {}
            () = term.cancellation().cancelled(), if !stubborn => {
                if !world.forced_stubborn(&label) {
                    return;
                }
                stubborn = true;
                continue;
            }
        }
        write(&world, &link, &lease, &term, stubborn, None);
    }
}

impl Sim {
    fn group(&self) -> &'static str {
        "workers"
    }

    /// Starts replica `id` (a new process: a new link, locker and elector).
    fn start(&mut self, id: usize) {
        self.start_with(id, self.p.shards);
    }

    /// Starts replica `id` running a sharded group of `shards` shards (or one lease: 0).
    fn start_with(&mut self, id: usize, shards: u32) {
        // One process per identity at a time, as a restarted container after the old one.
        // A restart can be due for an identity already back: with every replica down, the
        // chaos loop brings one back before its own restart (or exit) heal falls due. That
        // heal is stale: starting again would orphan the running process, which no fault,
        // stop or kill could reach again.
        if let Some(r) = self.replicas.get(&id) {
            self.world.event(format_args!(
                "start r{id} skipped: {} already runs",
                r.link.label()
            ));
            return;
        }
        if let Some(old) = self.leaving.remove(&id)
            && !old.task.is_finished()
        {
            self.world.event(format_args!(
                "fault kill {} (still stopping)",
                old.link.label()
            ));
            old.link.change(|s| s.dead = true);
            old.task.abort();
        }
        let inc = self.incarnations.entry(id).or_insert(0);
        *inc += 1;
        let identity = format!("r{id}");
        let label = format!("r{id}#{inc}");
        let link = Link::new(
            self.store.clone(),
            self.world.clone(),
            label.clone(),
            self.latency,
            Bounds {
                renew_deadline: self.t.renew_deadline,
                request_timeout: self.t.request_timeout,
            },
        );
        // Every process's clock drifts a little, within the allowance (±1%).
        let rate = self.world.rng(|r| r.between(SLOWEST_COVERED_RATE, 1.01));
        let spikes = !self.quiet;
        link.change(|s| {
            s.rate = rate;
            s.spikes = spikes;
        });
        self.world
            .event(format_args!("start {label} clock rate {rate:.4}"));
        let locker = Locker::with_identity(link.clone(), &identity).expect("a valid identity");
        let (stop, stopped) = oneshot::channel::<()>();
        let (world, every, stubborn) = (self.world.clone(), self.write_every, self.stubborn);
        self.world.process_started(&label, &identity);
        let mut one = None;
        let mut published = None;
        let task = if shards == 0 {
            let policy = HealthPolicy::new()
                .unhealthy_after(self.t.health.unhealthy_after)
                .recovery(self.t.health.recovery);
            self.world.set_health_bounds(self.t.health);
            let config = self.t.config.clone().health(policy);
            let elector = LeaderElector::new(locker, "job", config).expect("valid config");
            one = Some(elector.clone());
            // Every step-down for health goes to the checker as the elector reports it.
            let mut handoffs = elector.last_handoff();
            let (w, l) = (world.clone(), label.clone());
            tokio::spawn(async move {
                while handoffs.changed().await.is_ok() {
                    let last = handoffs.borrow_and_update().clone();
                    if let Some(h) = last
                        && h.cause == HandoffCause::Unhealthy
                    {
                        w.health_step_down("job", &l, h.fencing.get(), h.to.as_deref());
                    }
                }
            });
            let link2 = link.clone();
            let retry = self.t.retry;
            tokio::spawn(async move {
                let mut stopped = std::pin::pin!(stopped);
                loop {
                    let out = elector
                        .run_until(
                            async {
                                let _ = (&mut stopped).await;
                            },
                            |term| {
                                workload(
                                    world.clone(),
                                    link2.clone(),
                                    "job".into(),
                                    term,
                                    every,
                                    stubborn,
                                    None,
                                )
                            },
                        )
                        .await;
                    match out {
                        Ok(_) => return,
                        Err(e) => {
                            world.find(
                                "-",
                                Kind::RunEnded,
                                None,
                                format!("{} run ended: {e}", link2.label()),
                            );
                            sleep(retry).await;
                        }
                    }
                }
            })
        } else {
            let elector = ShardedElector::new(locker, self.group(), shards, self.t.config.clone())
                .expect("valid sharded config");
            published = Some((shards, elector.assignment()));
            if shards <= 256 {
                // Each assignment this replica computes, in the history (small groups only;
                // whether lines are kept must not change what runs, so not on `keep_lines`).
                let mut assignment = elector.assignment();
                let (world, label, me) = (self.world.clone(), label.clone(), identity.clone());
                tokio::spawn(async move {
                    while assignment.changed().await.is_ok() {
                        let a = assignment.borrow_and_update().clone();
                        let mine: Vec<usize> = a
                            .owners
                            .iter()
                            .enumerate()
                            .filter(|(_, o)| o.as_deref() == Some(me.as_str()))
                            .map(|(s, _)| s)
                            .collect();
                        let members: Vec<&str> =
                            a.members.iter().map(|m| m.identity.as_str()).collect();
                        world.event(format_args!(
                            "assign {label} mine {mine:?} members {members:?}"
                        ));
                    }
                });
            }
            let link2 = link.clone();
            let retry = self.t.retry;
            let group = self.group();
            let count = shards;
            tokio::spawn(async move {
                let mut stopped = std::pin::pin!(stopped);
                loop {
                    let (w, l) = (world.clone(), link2.clone());
                    let out = elector
                        .run_until(
                            async {
                                let _ = (&mut stopped).await;
                            },
                            move |shard, term| {
                                workload(
                                    w.clone(),
                                    l.clone(),
                                    lease_name(group, shard),
                                    term,
                                    every,
                                    stubborn,
                                    Some(count),
                                )
                            },
                        )
                        .await;
                    match out {
                        Ok(()) => return,
                        Err(e) => {
                            world.find(
                                "-",
                                Kind::RunEnded,
                                None,
                                format!("{} run ended: {e}", link2.label()),
                            );
                            sleep(retry).await;
                        }
                    }
                }
            })
        };
        self.replicas.insert(
            id,
            Replica {
                identity,
                link,
                elector: one,
                assignment: published,
                stop: Some(stop),
                task,
            },
        );
    }

    /// Kills replica `id` like `kill -9`: its link dies (nothing it sent after this reaches
    /// anything; writes already on the wire still land) and its tasks are dropped.
    fn kill(&mut self, id: usize) {
        if let Some(r) = self.replicas.remove(&id) {
            self.world
                .event(format_args!("fault kill {}", r.link.label()));
            self.world.process_ended(r.link.label());
            r.link.change(|s| s.dead = true);
            r.task.abort();
            self.down.push(id);
        }
    }

    /// Drops replica `id`'s elector run at once, as a user's `select!` or timeout around
    /// `run` does, while the process lives on (until `Heal::Exit`): each lease it held must
    /// be released in the background (checker `NotReleased`), and a task that escaped its
    /// term must see it end.
    fn abandon(&mut self, id: usize) -> Option<Link> {
        let r = self.replicas.remove(&id)?;
        self.world
            .event(format_args!("fault abandon {}", r.link.label()));
        self.world.process_ended(r.link.label());
        // Before the abort: the terms it drops still run.
        self.world.run_dropped(r.link.label());
        r.task.abort();
        self.down.push(id);
        Some(r.link)
    }

    /// Stops replica `id` gracefully (SIGTERM): it leaves the group and releases.
    fn leave(&mut self, id: usize) {
        if let Some(mut r) = self.replicas.remove(&id) {
            self.world.event(format_args!("leave {}", r.link.label()));
            self.world.process_ended(r.link.label());
            if let Some(stop) = r.stop.take() {
                let _ = stop.send(());
            }
            self.leaving.insert(id, r);
            self.down.push(id);
        }
    }

    /// Replica process `label`'s workload reports its health (if it still runs).
    fn report_health(&self, label: &str, healthy: bool) {
        let Some(r) = self.replicas.values().find(|r| r.link.label() == label) else {
            return;
        };
        if let Some(elector) = &r.elector {
            self.world.report_health(label, healthy);
            elector.report_health(healthy);
        }
    }

    fn live_ids(&self) -> Vec<usize> {
        self.replicas.keys().copied().collect()
    }

    fn pick(&self) -> Option<usize> {
        let ids = self.live_ids();
        if ids.is_empty() {
            return None;
        }
        Some(ids[self.world.rng(|r| r.below(ids.len() as u64)) as usize])
    }
}

/// Whether a finding breaks a promise (not excused by the run's own faults).
pub fn is_violation(f: &Finding) -> bool {
    f.excuse.is_none()
}

/// A short name of an excuse, for the summary.
pub fn excuse_name(e: Excuse) -> &'static str {
    match e {
        Excuse::DataLoss => "after data loss",
        Excuse::BeyondDriftBound => "beyond the drift bound",
    }
}
