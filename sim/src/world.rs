//! What every simulated replica shares, and the checker that judges a run: the virtual
//! clock's origin, the run's seeded generator, the history (every event in order, hashed),
//! the store's grants, the fenced register the workloads write to, and the findings.
//!
//! The checker works on effects and on the store's record, never on a replica's belief
//! about others: the life of each term's workload is compared with the grants the store made.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::Term;
use tokio::time::Instant;

use crate::rng::Rng;

/// The kinds of finding; each is a violation unless the run's faults excuse it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A term believed it led (its workload ran, its lease valid) after the store granted
    /// the lease to a newer term.
    Overlap,
    /// The fenced register accepted a write whose token another holder had already written.
    TokenReused,
    /// The store granted a token not above every earlier grant of the lease.
    TokenNotRising,
    /// A lease (or shard) had no leader for longer than lease + retry period while the store
    /// was reachable.
    Liveness,
    /// Shards were not all held, or loads differed by more than one, after settling.
    Unbalanced,
    /// A graceful join or leave moved more than ⌈N/M⌉ + 1 shards.
    TooManyMoves,
    /// Workloads of two shard counts ran at once (a resize let the new count start before
    /// the old one's last workload was gone).
    TwoCounts,
    /// A term whose lease the store still holds for it, with renewals answered, believed
    /// itself invalid for longer than a retry period (its workload could not act).
    Stalled,
    /// A leader stepped down for its health when it had not been unhealthy for the policy's
    /// bound, or handed over to a replica that was not healthy at any instant in the window
    /// its announcement can outlive (every replica unhealthy: stepping down helps nobody).
    NeedlessStepDown,
    /// A process that stepped down for its health led again before it had been healthy for
    /// the recovery window: leadership flapping between replicas.
    Flapping,
    /// A workload that looks at its term before each write (`Term::is_valid`) wrote when
    /// the term was no longer valid: at or after its renew deadline by the lock runtime's
    /// own rule (the send of the latest acquire or renewal answered, plus the renew
    /// deadline: the lease counts as lost from then on, however late its scheduler runs), or
    /// when the store no longer held the lease for the term (expired, or another term's).
    InvalidWrite,
    /// Two runs of one seed gave different histories.
    Nondeterministic,
    /// A term's release went out while a task the term spawned (`Term::spawn`) had not yet
    /// ended: the elector aborts the term's tasks and awaits them before it releases (a task
    /// mid-poll on another worker thread could otherwise act after the release). In the
    /// simulation an aborted task ends at its next turn, so any task still there at the
    /// release was not awaited.
    ReleaseBeforeTasks,
    /// A term's renewal listener (`Term::on_renewal`, what `tenure run`'s watchdog mirror
    /// uses) was not told the term's validity: registered while the term was valid, it must
    /// have been told it at once and then each later one, each later than the one before, so
    /// that it always holds what `Term::valid_until` says.
    ListenerNotTold,
    /// One process sent the release of one grant twice: a lease is released by one call
    /// (later `release` calls and the drop wait for or skip it), whatever ended it.
    ReleasedTwice,
    /// With the group settled for a lease, a replica's published assignment
    /// (`ShardedElector::assignment`) named another owner for a shard than the one whose
    /// term holds its lease: what a replica publishes must be what runs.
    WrongAssignment,
    /// An elector's run (`run_until`) returned an error. Every store error the simulation
    /// makes is transient (unavailable, a timeout, a conflict), and only a permanent one may
    /// end a run: the rest are retried.
    RunEnded,
    /// A process dropped its elector's run (`abandon`) while a term of it was valid, lived
    /// on, and never sent the term's release: dropping the run must release each lease it
    /// held in the background, not leave it to its ttl.
    NotReleased,
    /// Virtual time stood still while tasks kept being polled: a task of the code under test
    /// loops without waiting (a busy loop), and the seed would never end (`scenario/stuck.rs`).
    Stuck,
}

/// Why a finding is expected rather than a violation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Excuse {
    /// The store lost its data during the term: a lease cannot promise exclusion then
    /// (only the fence keeps the data safe).
    DataLoss,
    /// The term's replica ran a clock slower than the documented drift bound.
    BeyondDriftBound,
}

/// An armed `runtime-stall` nemesis: where the stall of the holder's runtime ends, as a
/// share `at` (in [0, 1)) of a window of its term — from its renew deadline to the end of its
/// validity, or (`past_validity`) from there to the store's expiry: the drift allowance.
#[derive(Clone, Debug)]
pub struct Stall {
    pub past_validity: bool,
    pub at: f64,
    /// Every lease of the run: the stall ends before the first of their expiries.
    pub leases: Vec<String>,
}

/// Where the nemeses aim the campaigns for a lease.
struct Aim {
    at: Instant,
    /// The one process whose campaign is aimed at `at`; the others' `others_after` later.
    first: Option<String>,
    others_after: Duration,
}

#[derive(Clone, Debug)]
pub struct Finding {
    pub at_ms: u64,
    pub lease: String,
    pub kind: Kind,
    pub excuse: Option<Excuse>,
    pub detail: String,
}

/// One grant the store made: the token, who got it, when (the store's instant).
#[derive(Clone, Debug)]
struct Grant {
    token: u64,
    holder: String,
    at: Instant,
}

/// A term whose workload runs now.
#[derive(Clone)]
struct Running {
    /// What runs: the term's `workload`, or a `task` of it.
    what: &'static str,
    holder: String,
    started: Instant,
    /// Whether the holder's clock ever ran slower than the drift allowance covers.
    beyond_bound: Arc<AtomicBool>,
    term: Term,
}

/// The tasks of one term running now: the term, and how many.
struct Tasks {
    term: Running,
    alive: usize,
}

/// What a term's renewal listener was told, as a watchdog mirror keeps it.
#[derive(Debug, Default)]
pub struct Mirror {
    /// The latest validity told.
    pub last: Option<Instant>,
    /// The first validity told that was not later than the one before it, with that one.
    pub not_later: Option<(Instant, Instant)>,
}

impl Mirror {
    /// The listener's body: keeps the validity told.
    pub fn told(&mut self, valid_until: Instant) {
        if let Some(before) = self.last
            && valid_until <= before
            && self.not_later.is_none()
        {
            self.not_later = Some((before, valid_until));
        }
        self.last = Some(valid_until);
    }
}

#[derive(Default)]
struct Register {
    max: u64,
    writer: String,
    /// When the term holding `max` first wrote.
    first_write: Option<Instant>,
}

#[derive(Default)]
pub struct Counters {
    pub faults: AtomicU64,
    pub store_calls: AtomicU64,
    pub grants: AtomicU64,
    pub terms: AtomicU64,
    /// Tasks the workloads spawned with `Term::spawn`.
    pub term_tasks: AtomicU64,
    /// Tasks the workloads handed their term to outside it (`tokio::spawn`).
    pub escaped_tasks: AtomicU64,
    /// Elector runs dropped mid-way (`abandon`), and the releases they owed (valid terms).
    pub runs_dropped: AtomicU64,
    pub releases_owed: AtomicU64,
    pub writes_issued: AtomicU64,
    pub writes_accepted: AtomicU64,
    /// Writes the fence refused because a newer term had written.
    pub writes_fenced_off: AtomicU64,
    /// Of those, the ones issued while their term was valid: a plain (unfenced) store would
    /// have taken them after the successor's first write.
    pub late_writes_stopped: AtomicU64,
}

pub struct World {
    pub origin: Instant,
    rng: Mutex<Rng>,
    keep_lines: bool,
    history: Mutex<(Vec<String>, u64, u64)>,
    grants: Mutex<BTreeMap<String, Vec<Grant>>>,
    register: Mutex<BTreeMap<String, Register>>,
    /// The terms whose workload runs now, by lease and token.
    running: Mutex<BTreeMap<String, BTreeMap<u64, Running>>>,
    /// The terms with tasks (`Term::spawn`) running now, by lease and token, with how many.
    tasks: Mutex<BTreeMap<String, BTreeMap<u64, Tasks>>>,
    /// How many workloads of each shard count run now.
    counts: Mutex<BTreeMap<u32, usize>>,
    /// Since when each count has had workloads running without a break.
    counts_since: Mutex<BTreeMap<u32, Instant>>,
    /// When the store lost its data.
    wipes: Mutex<Vec<Instant>>,
    pub store_down: AtomicBool,
    /// The store takes no request in while set (the `store-stall` nemesis).
    stall: tokio::sync::watch::Sender<bool>,
    /// Campaigns for a lease aimed at an instant (its expiry), by the nemeses.
    aims: Mutex<BTreeMap<String, Aim>>,
    /// Replicas whose workloads ignore cancellation from now on (the `stubborn-stop` nemesis).
    forced_stubborn: Mutex<std::collections::BTreeSet<String>>,
    /// Armed `runtime-stall` nemeses, by lease and the token of the term they wait for.
    stalls: Mutex<BTreeMap<(String, u64), Stall>>,
    /// Terms already found writing when invalid (one finding a term).
    invalid_writers: Mutex<std::collections::BTreeSet<(String, u64)>>,
    /// The releases owed by processes that dropped their elector's run with a term valid:
    /// by lease and token, the process.
    owed_releases: Mutex<BTreeMap<(String, u64), String>>,
    /// Terms already found with a renewal listener not told (one finding a term).
    untold_listeners: Mutex<std::collections::BTreeSet<(String, u64)>>,
    /// Every nemesis that fired: when, which, on which lease.
    nemeses: Mutex<Vec<(Instant, &'static str, String)>>,
    /// Each process's health as its workload reported it, by label.
    health: Mutex<BTreeMap<String, ProcessHealth>>,
    /// Health step-downs (hand-overs for health) seen.
    pub health_moves: AtomicU64,
    /// The run's lease duration in ms (for the nemesis window of a finding).
    pub lease_ms: AtomicU64,
    /// The health policy of the run's electors, when they have one.
    health_bounds: Mutex<Option<HealthBounds>>,
    findings: Mutex<Vec<Finding>>,
    pub counters: Counters,
}

impl World {
    pub fn new(seed: u64, keep_lines: bool) -> Self {
        Self {
            origin: Instant::now(),
            rng: Mutex::new(Rng::new(seed)),
            keep_lines,
            history: Mutex::new((Vec::new(), 0xcbf2_9ce4_8422_2325, 0)),
            grants: Mutex::default(),
            register: Mutex::default(),
            running: Mutex::default(),
            tasks: Mutex::default(),
            counts: Mutex::default(),
            counts_since: Mutex::default(),
            wipes: Mutex::default(),
            store_down: AtomicBool::new(false),
            stall: tokio::sync::watch::channel(false).0,
            aims: Mutex::default(),
            forced_stubborn: Mutex::default(),
            stalls: Mutex::default(),
            invalid_writers: Mutex::default(),
            untold_listeners: Mutex::default(),
            owed_releases: Mutex::default(),
            nemeses: Mutex::default(),
            health: Mutex::default(),
            health_moves: AtomicU64::new(0),
            lease_ms: AtomicU64::new(0),
            health_bounds: Mutex::default(),
            findings: Mutex::default(),
            counters: Counters::default(),
        }
    }

    /// Virtual milliseconds since the run began.
    pub fn now_ms(&self) -> u64 {
        self.ms(Instant::now())
    }

    /// A nemesis fired: named in the history and counted.
    pub fn nemesis(&self, name: &'static str, lease: &str, what: impl std::fmt::Display) {
        self.event(format_args!("nemesis {name} {what}"));
        lock(&self.nemeses).push((Instant::now(), name, lease.to_owned()));
    }

    /// Every nemesis that fired: virtual ms, name, lease.
    pub fn nemeses(&self) -> Vec<(u64, &'static str, String)> {
        lock(&self.nemeses)
            .iter()
            .map(|(at, n, l)| (self.ms(*at), *n, l.clone()))
            .collect()
    }

    /// Stalls the store (requests wait at its door) or lets it take them in again.
    pub fn stall_store(&self, on: bool) {
        self.stall.send_replace(on);
    }

    /// Waits while the store is stalled.
    pub async fn until_store_flows(&self) {
        let mut rx = self.stall.subscribe();
        let _ = rx.wait_for(|stalled| !*stalled).await;
    }

    /// Aims campaigns for `lease` at `at`.
    pub fn aim_at(&self, lease: &str, at: Instant) {
        lock(&self.aims).insert(
            lease.to_owned(),
            Aim {
                at,
                first: None,
                others_after: Duration::ZERO,
            },
        );
    }

    /// Aims the campaign of process `first` for `lease` at `at`, every other one
    /// `others_after` later (`health-relapse`: if its campaign still runs, it wins).
    pub fn aim_first(&self, lease: &str, at: Instant, first: &str, others_after: Duration) {
        lock(&self.aims).insert(
            lease.to_owned(),
            Aim {
                at,
                first: Some(first.to_owned()),
                others_after,
            },
        );
    }

    /// The instant the campaign of process `label` for `lease` is aimed at, if one is.
    pub fn aim(&self, lease: &str, label: &str) -> Option<Instant> {
        lock(&self.aims).get(lease).map(|aim| match &aim.first {
            Some(first) if first != label => aim.at + aim.others_after,
            _ => aim.at,
        })
    }

    /// Makes the workloads of `label` ignore cancellation from now on.
    pub fn force_stubborn(&self, label: &str) {
        lock(&self.forced_stubborn).insert(label.to_owned());
    }

    pub fn forced_stubborn(&self, label: &str) -> bool {
        lock(&self.forced_stubborn).contains(label)
    }

    /// Arms a `runtime-stall` for the workload of term `token` of `lease`.
    pub fn arm_stall(&self, lease: &str, token: u64, stall: Stall) {
        lock(&self.stalls).insert((lease.to_owned(), token), stall);
    }

    /// The `runtime-stall` armed for term `token` of `lease`, if any, disarmed.
    pub fn take_stall(&self, lease: &str, token: u64) -> Option<Stall> {
        let mut stalls = lock(&self.stalls);
        if stalls.is_empty() {
            return None;
        }
        stalls.remove(&(lease.to_owned(), token))
    }

    /// Judges a write that a workload issues now because its term said it was valid, by
    /// what the term's validity rests on rather than by the term's own answer: `deadline` is
    /// the holder's renew deadline by the lock runtime's rule (as the link saw its requests
    /// and answers), `record` the store's live record of the lease now.
    pub fn judge_write(
        &self,
        lease: &str,
        token: u64,
        holder: &str,
        deadline: Option<Instant>,
        record: Option<&tenure::backend::LeaseRecord>,
        beyond_bound: bool,
    ) {
        let now = Instant::now();
        let late = deadline.is_some_and(|d| now >= d);
        let ours = record.is_some_and(|r| r.fencing.get() == token);
        if (!late && ours) || !lock(&self.invalid_writers).insert((lease.to_owned(), token)) {
            return;
        }
        if let Some(deadline) = deadline
            && late
        {
            self.find(
                lease,
                Kind::InvalidWrite,
                None,
                format!(
                    "the workload of #{token} ({holder}) wrote believing its term valid {} ms after its renew deadline ({} ms): the lease had counted as lost since",
                    self.ms(now) - self.ms(deadline),
                    self.ms(deadline)
                ),
            );
            return;
        }
        // The store lost the term's grant, or the holder's clock ran slower than the drift
        // allowance covers: a lease cannot promise exclusion then, the fence does.
        let granted = lock(&self.grants)
            .get(lease)
            .and_then(|list| list.iter().find(|g| g.token == token).map(|g| g.at));
        let lost_data = granted.is_none_or(|at| lock(&self.wipes).iter().any(|w| *w >= at));
        let excuse = if lost_data {
            Some(Excuse::DataLoss)
        } else if beyond_bound {
            Some(Excuse::BeyondDriftBound)
        } else {
            None
        };
        self.find(
            lease,
            Kind::InvalidWrite,
            excuse,
            format!(
                "the workload of #{token} ({holder}) wrote believing its term valid while the store held the lease for {}",
                record.map_or_else(|| "nobody".to_owned(), |r| format!("#{} ({})", r.fencing, r.identity))
            ),
        );
    }

    /// Judges what a term's renewal listener was told (`mirror`) against what the term says
    /// of its validity now: the listener must hold exactly `Term::valid_until`, and have been
    /// told only later validities.
    pub fn judge_listener(&self, lease: &str, holder: &str, term: &Term, mirror: &Mirror) {
        let token = term.fencing_token().get();
        let valid_until = term.valid_until();
        let problem = if let Some((before, told)) = mirror.not_later {
            format!(
                "was told {} ms after {} ms: a validity not later than the one before",
                self.ms(told),
                self.ms(before)
            )
        } else if mirror.last != Some(valid_until) {
            format!(
                "holds {} while the term is valid until {} ms",
                mirror
                    .last
                    .map_or_else(|| "nothing".to_owned(), |t| format!("{} ms", self.ms(t))),
                self.ms(valid_until)
            )
        } else {
            return;
        };
        if lock(&self.untold_listeners).insert((lease.to_owned(), token)) {
            self.find(
                lease,
                Kind::ListenerNotTold,
                None,
                format!("the renewal listener of #{token} ({holder}) {problem}"),
            );
        }
    }

    /// Process `holder` sent a release for a grant of `lease` it had already released.
    pub fn released_twice(&self, lease: &str, holder: &str, token: u64) {
        self.find(
            lease,
            Kind::ReleasedTwice,
            None,
            format!("{holder} sent the release of #{token} a second time"),
        );
    }

    /// The running terms of `lease`: token, holder label, the term.
    pub fn running_terms(&self, lease: &str) -> Vec<(u64, String, Term)> {
        lock(&self.running)
            .get(lease)
            .map(|terms| {
                terms
                    .iter()
                    .map(|(t, r)| (*t, r.holder.clone(), r.term.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_millis()).unwrap_or(u64::MAX)
    }

    pub fn rng<T>(&self, f: impl FnOnce(&mut Rng) -> T) -> T {
        f(&mut lock(&self.rng))
    }

    /// Appends one event to the history (and its hash, which two runs of a seed compare).
    pub fn event(&self, what: impl std::fmt::Display) {
        let mut line = String::new();
        let _ = write!(line, "{:>9} {what}", self.now_ms());
        let mut h = lock(&self.history);
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            h.1 ^= u64::from(b);
            h.1 = h.1.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h.2 += 1;
        if self.keep_lines {
            h.0.push(line);
        }
    }

    /// The history's hash and length.
    pub fn fingerprint(&self) -> (u64, u64) {
        let h = lock(&self.history);
        (h.1, h.2)
    }

    pub fn lines(&self) -> Vec<String> {
        lock(&self.history).0.clone()
    }

    pub fn find(&self, lease: &str, kind: Kind, excuse: Option<Excuse>, detail: String) {
        self.event(format_args!(
            "FINDING {kind:?} {lease} {excuse:?}: {detail}"
        ));
        lock(&self.findings).push(Finding {
            at_ms: self.now_ms(),
            lease: lease.to_owned(),
            kind,
            excuse,
            detail,
        });
    }

    pub fn findings(&self) -> Vec<Finding> {
        lock(&self.findings).clone()
    }

    /// The store granted `lease` to `holder` with `token` (a new grant, not a replay). Any
    /// workload of an older term of the lease still running now overlaps it.
    pub fn granted(&self, lease: &str, token: u64, holder: &str) {
        self.counters.grants.fetch_add(1, Ordering::Relaxed);
        self.event(format_args!("grant {lease} #{token} {holder}"));
        let mut grants = lock(&self.grants);
        let list = grants.entry(lease.to_owned()).or_default();
        if list.iter().any(|g| g.token == token) {
            return;
        }
        let highest = list.iter().map(|g| g.token).max();
        list.push(Grant {
            token,
            holder: holder.to_owned(),
            at: Instant::now(),
        });
        drop(grants);
        if highest.is_some_and(|h| token <= h) {
            self.find(
                lease,
                Kind::TokenNotRising,
                None,
                format!("#{token} granted to {holder} after #{highest:?}"),
            );
        }
        // The workloads, then the tasks, of every older term still running.
        let mut older: Vec<(u64, Running)> = lock(&self.running)
            .get(lease)
            .map(|terms| terms.range(..token).map(|(t, r)| (*t, r.clone())).collect())
            .unwrap_or_default();
        older.extend(lock(&self.tasks).get(lease).into_iter().flat_map(|terms| {
            terms
                .range(..token)
                .map(|(t, tasks)| (*t, tasks.term.clone()))
        }));
        for (old, running) in older {
            self.overlap(lease, old, &running, token, holder, Instant::now());
        }
    }

    pub fn wiped(&self) {
        lock(&self.wipes).push(Instant::now());
    }

    /// Records an overlap: the workload (`what`: or a task) of term `old` ran while `newer`
    /// held the lease.
    fn overlap(
        &self,
        lease: &str,
        old: u64,
        running: &Running,
        newer: u64,
        newer_holder: &str,
        newer_at: Instant,
    ) {
        let granted = lock(&self.grants)
            .get(lease)
            .and_then(|list| list.iter().find(|g| g.token == old).map(|g| g.at))
            .unwrap_or(running.started);
        // Excused when the store lost the older grant (a wipe between the two grants), or
        // when the older term's clock ran slower than the drift allowance covers.
        let lost_data = lock(&self.wipes)
            .iter()
            .any(|w| *w >= granted && *w <= newer_at);
        let excuse = if lost_data {
            Some(Excuse::DataLoss)
        } else if running.beyond_bound.load(Ordering::Relaxed) {
            Some(Excuse::BeyondDriftBound)
        } else {
            None
        };
        self.find(
            lease,
            Kind::Overlap,
            excuse,
            format!(
                "the {} of #{old} ({}) still ran when #{newer} was granted to {newer_holder} at {} ms",
                running.what,
                running.holder,
                self.ms(newer_at)
            ),
        );
    }

    /// A term's workload started; a newer grant already made means it starts overlapping.
    pub fn term_started(
        &self,
        lease: &str,
        holder: &str,
        term: &Term,
        beyond_bound: Arc<AtomicBool>,
    ) {
        self.counters.terms.fetch_add(1, Ordering::Relaxed);
        let token = term.fencing_token().get();
        self.event(format_args!("term {lease} #{token} {holder} starts"));
        self.check_flapping(lease, holder);
        let running = Running {
            what: "workload",
            holder: holder.to_owned(),
            started: Instant::now(),
            beyond_bound,
            term: term.clone(),
        };
        self.check_not_superseded(lease, token, &running);
        lock(&self.running)
            .entry(lease.to_owned())
            .or_default()
            .insert(token, running);
    }

    /// What starts for term `token` of `lease` (a workload or a term task) after a newer term
    /// of it was granted overlaps that term.
    fn check_not_superseded(&self, lease: &str, token: u64, running: &Running) {
        let newer = lock(&self.grants).get(lease).and_then(|list| {
            list.iter()
                .filter(|g| g.token > token)
                .min_by_key(|g| g.at)
                .cloned()
        });
        if let Some(newer) = newer {
            self.overlap(lease, token, running, newer.token, &newer.holder, newer.at);
        }
    }

    /// A workload of a group running `count` shards started: no workload of another count
    /// may be running.
    pub fn count_started(&self, lease: &str, count: u32) {
        let others: Vec<(u32, usize)> = {
            let mut counts = lock(&self.counts);
            let n = counts.entry(count).or_default();
            if *n == 0 {
                lock(&self.counts_since).insert(count, Instant::now());
            }
            *n += 1;
            counts
                .iter()
                .filter(|(c, n)| **c != count && **n > 0)
                .map(|(c, n)| (*c, *n))
                .collect()
        };
        if !others.is_empty() {
            // The group record is in the store: when the store lost its data while the other
            // count ran, a member of another count found no record and created one (step 1 of
            // the group protocol). Expected, as an overlap after data loss is (seeds 104709,
            // 105127, 105301, 108439 of 10,000: a resize-late replica recreated the record).
            let since = {
                let since = lock(&self.counts_since);
                others
                    .iter()
                    .filter_map(|(c, _)| since.get(c).copied())
                    .min()
            };
            let lost_data = since.is_some_and(|from| lock(&self.wipes).iter().any(|w| *w >= from));
            self.find(
                lease,
                Kind::TwoCounts,
                lost_data.then_some(Excuse::DataLoss),
                format!("a workload of {count} shards started while these run (count, workloads): {others:?}"),
            );
        }
    }

    pub fn count_ended(&self, count: u32) {
        if let Some(n) = lock(&self.counts).get_mut(&count) {
            *n = n.saturating_sub(1);
        }
    }

    /// A term's workload ended (returned, or dropped by the elector or a crash).
    pub fn term_ended(&self, lease: &str, holder: &str, term: &Term) {
        let token = term.fencing_token().get();
        self.event(format_args!(
            "term {lease} #{token} {holder} ends (valid until {})",
            self.ms(term.valid_until())
        ));
        if let Some(terms) = lock(&self.running).get_mut(lease) {
            terms.remove(&token);
        }
        let _ = self.take_stall(lease, token);
    }

    /// A task of a term (`Term::spawn`) started; a newer grant already made means it starts
    /// overlapping, as a workload would.
    pub fn task_started(
        &self,
        lease: &str,
        holder: &str,
        term: &Term,
        beyond_bound: Arc<AtomicBool>,
        stubborn: bool,
    ) {
        self.counters.term_tasks.fetch_add(1, Ordering::Relaxed);
        let token = term.fencing_token().get();
        self.event(format_args!(
            "task {lease} #{token} {holder} starts{}",
            if stubborn {
                " (ignores cancellation)"
            } else {
                ""
            }
        ));
        let running = Running {
            what: "task",
            holder: holder.to_owned(),
            started: Instant::now(),
            beyond_bound,
            term: term.clone(),
        };
        self.check_not_superseded(lease, token, &running);
        lock(&self.tasks)
            .entry(lease.to_owned())
            .or_default()
            .entry(token)
            .or_insert(Tasks {
                term: running,
                alive: 0,
            })
            .alive += 1;
    }

    /// A task of a term ended (returned, aborted by the elector, or its process died).
    pub fn task_ended(&self, lease: &str, holder: &str, term: &Term) {
        let token = term.fencing_token().get();
        self.event(format_args!("task {lease} #{token} {holder} ends"));
        let mut tasks = lock(&self.tasks);
        if let Some(terms) = tasks.get_mut(lease)
            && let Some(tasks) = terms.get_mut(&token)
        {
            tasks.alive -= 1;
            if tasks.alive == 0 {
                terms.remove(&token);
            }
        }
    }

    /// Process `holder` dropped its elector's run: each of its terms whose workload ran and
    /// whose lease was valid then is owed a release (`releases_owed`).
    pub fn run_dropped(&self, holder: &str) {
        let owed: Vec<(String, u64)> = lock(&self.running)
            .iter()
            .flat_map(|(lease, terms)| {
                terms
                    .iter()
                    .filter(|(_, r)| r.holder == holder && r.term.is_valid())
                    .map(|(token, _)| (lease.clone(), *token))
            })
            .collect();
        self.counters.runs_dropped.fetch_add(1, Ordering::Relaxed);
        self.counters
            .releases_owed
            .fetch_add(owed.len() as u64, Ordering::Relaxed);
        let mut all = lock(&self.owed_releases);
        for key in owed {
            self.event(format_args!("owed release {} #{} {holder}", key.0, key.1));
            all.insert(key, holder.to_owned());
        }
    }

    /// Process `holder`, which dropped its elector's run, exits: each release it owed and
    /// never sent is a finding.
    pub fn releases_owed(&self, holder: &str) {
        let mut all = lock(&self.owed_releases);
        let unsent: Vec<(String, u64)> = all
            .iter()
            .filter(|(_, h)| h.as_str() == holder)
            .map(|(k, _)| k.clone())
            .collect();
        for (lease, token) in unsent {
            all.remove(&(lease.clone(), token));
            self.find(
                &lease,
                Kind::NotReleased,
                None,
                format!("{holder} dropped its run while #{token} was valid and never released it"),
            );
        }
    }

    /// Process `holder` sends the release of term `token` of `lease`: no task of the term
    /// may still run.
    pub fn release_sent(&self, lease: &str, holder: &str, token: u64) {
        lock(&self.owed_releases).remove(&(lease.to_owned(), token));
        let left = lock(&self.tasks)
            .get(lease)
            .and_then(|terms| terms.get(&token))
            .map(|tasks| tasks.alive);
        if let Some(n) = left {
            self.find(
                lease,
                Kind::ReleaseBeforeTasks,
                None,
                format!("{holder} released {lease} while {n} task(s) of #{token} had not ended"),
            );
        }
    }

    /// A workload issued a write with its term's token (its term valid).
    pub fn issued(&self) {
        self.counters.writes_issued.fetch_add(1, Ordering::Relaxed);
    }

    /// A write reaches the fenced register: taken if its token is the highest yet.
    pub fn deliver(&self, lease: &str, token: u64, holder: &str, issued: Instant) {
        let mut reg = lock(&self.register);
        let r = reg.entry(lease.to_owned()).or_default();
        if token < r.max {
            self.counters
                .writes_fenced_off
                .fetch_add(1, Ordering::Relaxed);
            let late = r.first_write.is_some_and(|first| issued <= first);
            if late {
                self.counters
                    .late_writes_stopped
                    .fetch_add(1, Ordering::Relaxed);
            }
            drop(reg);
            self.event(format_args!(
                "fence refuses {lease} #{token} {holder} (register at a newer term)"
            ));
            return;
        }
        if token == r.max && r.writer != holder {
            let other = r.writer.clone();
            drop(reg);
            self.find(
                lease,
                Kind::TokenReused,
                None,
                format!("#{token} written by {holder} after {other}"),
            );
            return;
        }
        if token > r.max {
            r.max = token;
            r.writer = holder.to_owned();
            r.first_write = Some(Instant::now());
            drop(reg);
            self.event(format_args!("first write {lease} #{token} {holder}"));
        }
        self.counters
            .writes_accepted
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// One process's health: its identity, each change (the first: healthy at its start), when
/// it ended, and when it last stepped down for its health.
struct ProcessHealth {
    identity: String,
    changes: Vec<(Instant, bool)>,
    ended: Option<Instant>,
    stepped_down: Option<Instant>,
}

impl ProcessHealth {
    /// Whether the process was alive and healthy at some instant of `[from, to]`.
    fn healthy_within(&self, from: Instant, to: Instant) -> bool {
        let to = self.ended.map_or(to, |e| e.min(to));
        self.changes.iter().enumerate().any(|(i, (at, healthy))| {
            let until = self.changes.get(i + 1).map_or(to, |(next, _)| *next);
            *healthy && *at <= to && until >= from
        })
    }

    /// Since when the process has been healthy without a break, if it is now.
    fn healthy_since(&self) -> Option<Instant> {
        match self.changes.last() {
            Some((at, true)) => Some(*at),
            _ => None,
        }
    }
}

/// The health policy the checker judges step-downs by.
#[derive(Clone, Copy, Debug)]
pub struct HealthBounds {
    pub unhealthy_after: std::time::Duration,
    pub recovery: std::time::Duration,
    /// How long a healthy announcement can outlive the health it announced: its ttl, plus
    /// the longest a request can be held on its way (a cut or freeze healed late, a spike).
    pub stale_for: std::time::Duration,
}

impl World {
    /// A process (a label) started: healthy, as every workload is at first.
    pub fn process_started(&self, label: &str, identity: &str) {
        lock(&self.health).insert(
            label.to_owned(),
            ProcessHealth {
                identity: identity.to_owned(),
                changes: vec![(Instant::now(), true)],
                ended: None,
                stepped_down: None,
            },
        );
    }

    /// A process ended (killed, or stopped).
    pub fn process_ended(&self, label: &str) {
        if let Some(h) = lock(&self.health).get_mut(label) {
            h.ended.get_or_insert_with(Instant::now);
        }
    }

    /// A process's workload reported its health.
    pub fn report_health(&self, label: &str, healthy: bool) {
        let mut all = lock(&self.health);
        let Some(h) = all.get_mut(label) else { return };
        if h.ended.is_some() || h.changes.last().is_some_and(|(_, was)| *was == healthy) {
            return;
        }
        h.changes.push((Instant::now(), healthy));
        drop(all);
        let what = if healthy { "healthy" } else { "unhealthy" };
        self.event(format_args!("health {label} {what}"));
    }

    /// Process `label` ended the term `token` of `lease` for its health, handing over to
    /// `to`. Judged: it had been unhealthy for the bound, and `to` was healthy at some instant
    /// its announcement can still have been read from.
    pub fn health_step_down(&self, lease: &str, label: &str, token: u64, to: Option<&str>) {
        let Some(bounds) = *lock(&self.health_bounds) else {
            return;
        };
        self.health_moves.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        self.event(format_args!(
            "health step-down {lease} #{token} {label} to {}",
            to.unwrap_or("anyone")
        ));
        let mut all = lock(&self.health);
        let mut problems = Vec::new();
        if let Some(me) = all.get_mut(label) {
            me.stepped_down = Some(now);
            // The decision came before the release (the workload's grace, the store's
            // answers): judge every unhealthy streak that reached the bound and ended (or
            // goes on) within the window the decision can lie in.
            let window_from = now.checked_sub(bounds.stale_for).unwrap_or(self.origin);
            let long_enough = me.changes.iter().enumerate().any(|(i, (from, healthy))| {
                let until = me.changes.get(i + 1).map_or(now, |(next, _)| *next);
                !*healthy
                    && until.duration_since(*from) >= bounds.unhealthy_after
                    && until >= window_from
            });
            if !long_enough {
                problems.push(format!(
                    "{label} had not been unhealthy for the bound {:?} (health changes {:?})",
                    bounds.unhealthy_after,
                    me.changes
                        .iter()
                        .map(|(at, h)| (self.ms(*at), *h))
                        .collect::<Vec<_>>()
                ));
            }
        }
        let Some(to) = to else {
            // A step-down for health always names the healthy follower it hands to; without
            // one it keeps the lease.
            drop(all);
            self.find(
                lease,
                Kind::NeedlessStepDown,
                None,
                format!("{label} stepped down for its health with no healthy follower named"),
            );
            return;
        };
        {
            let from = now.checked_sub(bounds.stale_for).unwrap_or(self.origin);
            let healthy = all
                .values()
                .filter(|h| h.identity == to)
                .any(|h| h.healthy_within(from, now));
            if !healthy {
                problems.push(format!(
                    "it handed over to {to}, which was not healthy at any instant of the last {:?}",
                    bounds.stale_for
                ));
            }
        }
        drop(all);
        for problem in problems {
            self.find(lease, Kind::NeedlessStepDown, None, problem);
        }
    }

    /// The run's electors have this health policy: judge their step-downs by it.
    pub fn set_health_bounds(&self, bounds: HealthBounds) {
        *lock(&self.health_bounds) = Some(bounds);
    }

    /// Whether process `label` may lead now: if it stepped down for its health, it must have
    /// been healthy for the recovery window since (and since that step-down).
    fn flapping(&self, label: &str) -> Option<String> {
        let recovery = lock(&self.health_bounds).as_ref()?.recovery;
        let all = lock(&self.health);
        let h = all.get(label)?;
        let stepped = h.stepped_down?;
        let now = Instant::now();
        match h.healthy_since() {
            None => Some(format!(
                "{label} leads again while unhealthy after its health step-down at {} ms",
                self.ms(stepped)
            )),
            Some(since) if now < since.max(stepped) + recovery => Some(format!(
                "{label} leads again {:?} after its health step-down at {} ms, healthy since {} ms (recovery {recovery:?})",
                now.duration_since(stepped),
                self.ms(stepped),
                self.ms(since)
            )),
            Some(_) => None,
        }
    }

    /// The live processes that stepped down for their health and are healthy now, by
    /// label, each with the instant it will have been healthy since for the recovery window
    /// and `margin` (its elector campaigns again by then).
    pub fn recovering(&self, margin: Duration) -> Vec<(String, Instant)> {
        let Some(recovery) = lock(&self.health_bounds).as_ref().map(|b| b.recovery) else {
            return Vec::new();
        };
        lock(&self.health)
            .iter()
            .filter(|(_, h)| h.ended.is_none())
            .filter_map(|(label, h)| {
                let since = h.healthy_since()?.max(h.stepped_down?);
                Some((label.clone(), since + recovery + margin))
            })
            .collect()
    }

    /// A term starts on process `label`: judged against its last health step-down.
    fn check_flapping(&self, lease: &str, label: &str) {
        if let Some(problem) = self.flapping(label) {
            self.find(lease, Kind::Flapping, None, problem);
        }
    }
}

/// Every lock here guards plain data and nothing panics while holding it.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A release of a term whose task has not ended is a finding; another term's release,
    /// or the release once the task has ended, is not. A task still running when a newer
    /// term is granted overlaps it, as a workload would.
    #[tokio::test(start_paused = true)]
    async fn a_release_before_the_terms_tasks_end_is_found() {
        let test = tenure::election::TestTerm::begin("job", "r0")
            .await
            .expect("a term");
        let term = test.term();
        let token = term.fencing_token().get();
        let world = World::new(1, true);
        world.task_started("job", "r0#1", &term, Arc::default(), true);
        world.release_sent("job", "r0#1", token + 1);
        assert!(world.findings().is_empty(), "another term's release");
        world.release_sent("job", "r0#1", token);
        let found = world.findings();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].kind, Kind::ReleaseBeforeTasks);
        world.granted("job", token + 1, "r1#1");
        let found = world.findings();
        assert_eq!(found.len(), 2);
        assert_eq!(found[1].kind, Kind::Overlap);
        assert!(
            found[1].detail.starts_with("the task of"),
            "{}",
            found[1].detail
        );
        world.task_ended("job", "r0#1", &term);
        world.release_sent("job", "r0#1", token);
        world.granted("job", token + 2, "r1#1");
        assert_eq!(world.findings().len(), 2, "the task had ended");
        assert!(
            world
                .lines()
                .iter()
                .any(|l| l.ends_with("starts (ignores cancellation)"))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_aim_with_a_first_process_holds_the_others_back() {
        let world = World::new(1, false);
        let at = Instant::now() + Duration::from_secs(5);
        let after = Duration::from_millis(300);
        world.aim_first("job", at, "r1#1", after);
        assert_eq!(world.aim("job", "r1#1"), Some(at));
        assert_eq!(world.aim("job", "r2#1"), Some(at + after));
        assert_eq!(world.aim("other", "r1#1"), None);
        // A plain aim (another nemesis) aims every campaign at one instant again.
        world.aim_at("job", at);
        assert_eq!(world.aim("job", "r2#1"), Some(at));
    }

    #[tokio::test(start_paused = true)]
    async fn a_process_recovers_from_its_health_step_down_after_the_window_since_its_relapse() {
        let world = World::new(1, false);
        let recovery = Duration::from_secs(18);
        world.set_health_bounds(HealthBounds {
            unhealthy_after: Duration::from_secs(3),
            recovery,
            stale_for: Duration::from_secs(47),
        });
        let margin = Duration::from_secs(1);
        for (label, identity) in [("r1#1", "r1"), ("r2#1", "r2")] {
            world.process_started(label, identity);
        }
        world.report_health("r1#1", false);
        tokio::time::advance(Duration::from_secs(4)).await;
        world.health_step_down("job", "r1#1", 1, Some("r2"));
        let stepped = Instant::now();
        assert!(
            world.recovering(margin).is_empty(),
            "unhealthy: not recovering"
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        world.report_health("r1#1", true);
        let healthy = Instant::now();
        // r2 never stepped down: nothing to recover from.
        assert_eq!(
            world.recovering(margin),
            vec![("r1#1".to_owned(), healthy + recovery + margin)]
        );
        assert!(healthy > stepped);
        // A relapse for an instant starts the window again.
        tokio::time::advance(Duration::from_secs(30)).await;
        world.report_health("r1#1", false);
        world.report_health("r1#1", true);
        assert_eq!(
            world.recovering(margin),
            vec![("r1#1".to_owned(), Instant::now() + recovery + margin)]
        );
        world.process_ended("r1#1");
        assert!(world.recovering(margin).is_empty(), "ended: not recovering");
    }
}
