//! Sharded leadership on the memory backend and tokio's paused clock, under random joins,
//! graceful leaves, kills (a replica whose store calls stall forever, then dropped), store
//! pauses and store failures. Invariants: never two valid terms of one shard; tokens rise per
//! shard; once the membership is stable for a while, every shard is held and the loads of the
//! live replicas differ by at most one; one graceful join or leave moves at most ⌈N/M⌉ + 1
//! shards. A change of the shard count (a rolling update, a replica with a lagging clock, a
//! planted member) never runs workloads of two counts at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::backend::faulty::{Fault, FaultyBackend};
use tenure::backend::memory::MemoryBackend;
use tenure::backend::{Backend, Member};
use tenure::election::{ElectionConfig, Term};
use tenure::shard::{GroupStatus, ShardError, ShardedElector};
use tenure::{FencingToken, Locker};

const SHARDS: u32 = 24;
const LEASE: Duration = Duration::from_secs(15);
/// How long a workload takes to stop once its term is cancelled.
const STOPPING: Duration = Duration::from_millis(1500);

/// Every term running anywhere, and every token each shard was granted, in order.
#[derive(Default)]
struct World {
    live: Mutex<HashMap<(u32, String, FencingToken), Term>>,
    /// The shard count of every workload running now, from its first line to its return.
    counts: Mutex<Vec<u32>>,
    granted: Mutex<BTreeMap<u32, Vec<FencingToken>>>,
    violations: Mutex<Vec<String>>,
}

impl World {
    /// Checks that no shard has two valid terms now.
    fn check_exclusion(&self) {
        let live = self.live.lock().expect("not poisoned");
        let mut valid: BTreeMap<u32, Vec<&String>> = BTreeMap::new();
        for ((shard, who, _), term) in live.iter() {
            if term.is_valid() {
                valid.entry(*shard).or_default().push(who);
            }
        }
        for (shard, who) in valid {
            if who.len() > 1 {
                self.violations
                    .lock()
                    .expect("not poisoned")
                    .push(format!("shard {shard} has two valid holders: {who:?}"));
            }
        }
    }

    /// The replica holding each shard with a valid term.
    fn owners(&self) -> BTreeMap<u32, String> {
        let live = self.live.lock().expect("not poisoned");
        live.iter()
            .filter(|(_, t)| t.is_valid())
            .map(|((s, who, _), _)| (*s, who.clone()))
            .collect()
    }
}

/// One running workload of a count, in `World::counts` until dropped.
struct Counted(Arc<World>, u32);

impl Drop for Counted {
    fn drop(&mut self) {
        let mut counts = self.0.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = counts.iter().position(|c| *c == self.1) {
            counts.swap_remove(i);
        }
    }
}

struct Replica {
    faulty: FaultyBackend,
    elector: ShardedElector,
    stop: tokio::sync::oneshot::Sender<()>,
    run: tokio::task::JoinHandle<Result<(), ShardError>>,
}

fn start(store: &MemoryBackend, world: &Arc<World>, identity: &str) -> Replica {
    start_with(store, world, identity, SHARDS)
}

fn start_with(store: &MemoryBackend, world: &Arc<World>, identity: &str, shards: u32) -> Replica {
    let faulty = FaultyBackend::new(store.clone());
    let locker = Locker::with_identity(faulty.clone(), identity).expect("identity");
    let elector =
        ShardedElector::new(locker, "workers", shards, ElectionConfig::new()).expect("elector");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let world = world.clone();
    let who = identity.to_owned();
    let e = elector.clone();
    let run = tokio::spawn(async move {
        e.run_until(
            async {
                let _ = stopped.await;
            },
            move |shard, term| {
                let (world, who) = (world.clone(), who.clone());
                async move {
                    {
                        // Keys map to shards by count: workloads of two counts at once
                        // would both own some key.
                        let mut counts = world.counts.lock().expect("not poisoned");
                        if counts.iter().any(|c| *c != shards) {
                            world.violations.lock().expect("not poisoned").push(format!(
                                "a workload of {shards} shards started while workloads of {counts:?} run"
                            ));
                        }
                        counts.push(shards);
                    }
                    // Counted out however the workload ends, a kill (dropped future) included.
                    let _counted = Counted(world.clone(), shards);
                    let key = (shard, who, term.fencing_token());
                    {
                        let mut granted = world.granted.lock().expect("not poisoned");
                        let tokens = granted.entry(shard).or_default();
                        if tokens.last().is_some_and(|t| *t >= term.fencing_token()) {
                            world.violations.lock().expect("not poisoned").push(format!(
                                "shard {shard}: token {} after {tokens:?}",
                                term.fencing_token()
                            ));
                        }
                        tokens.push(term.fencing_token());
                    }
                    world
                        .live
                        .lock()
                        .expect("not poisoned")
                        .insert(key.clone(), term.clone());
                    term.cancellation().cancelled().await;
                    // A graceful stop takes a while: the lease is released only after it.
                    tokio::time::sleep(STOPPING).await;
                    world.live.lock().expect("not poisoned").remove(&key);
                }
            },
        )
        .await
    });
    Replica {
        faulty,
        elector,
        stop,
        run,
    }
}

/// A small deterministic generator, so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A live replica's identity, at random.
fn pick(rng: &mut Rng, live: &BTreeMap<String, Replica>) -> String {
    live.keys()
        .nth(rng.below(live.len()))
        .cloned()
        .unwrap_or_default()
}

/// Lets the group settle, sampling exclusion every 100 ms meanwhile.
async fn settle(world: &World, for_: Duration) {
    let steps = for_.as_millis() / 100;
    for _ in 0..steps {
        tokio::time::sleep(Duration::from_millis(100)).await;
        world.check_exclusion();
    }
}

fn assert_balanced(world: &World, live: &BTreeMap<String, Replica>, what: &str) {
    let owners = world.owners();
    assert_eq!(
        owners.len(),
        SHARDS as usize,
        "{what}: not every shard is held: {owners:?}"
    );
    let mut loads: BTreeMap<&str, usize> = live.keys().map(|k| (k.as_str(), 0)).collect();
    for who in owners.values() {
        *loads.entry(who.as_str()).or_default() += 1;
    }
    let (min, max) = (
        loads.values().min().copied().unwrap_or(0),
        loads.values().max().copied().unwrap_or(0),
    );
    assert!(max - min <= 1, "{what}: loads {loads:?}");
    for (who, r) in live {
        assert_eq!(
            r.elector.owned().borrow().len(),
            loads[who.as_str()],
            "{what}: {who}'s owned set"
        );
        // Every replica publishes the assignment it acts on: the owners the group settled on.
        let assignment = r.elector.assignment().borrow().clone();
        let published: BTreeMap<u32, String> = (0..SHARDS)
            .filter_map(|s| Some((s, assignment.owners.get(s as usize)?.clone()?)))
            .collect();
        assert_eq!(published, owners, "{what}: {who}'s published assignment");
    }
}

async fn scenario(seed: u64) {
    let store = MemoryBackend::new();
    let world = Arc::new(World::default());
    let mut rng = Rng(seed | 1);
    let mut live: BTreeMap<String, Replica> = BTreeMap::new();
    let mut next = 0;
    for _ in 0..3 {
        let id = format!("r{next}");
        next += 1;
        live.insert(id.clone(), start(&store, &world, &id));
    }
    // Membership stable for well over lease + retry before every check.
    let stable = LEASE * 3;
    settle(&world, stable).await;
    assert_balanced(&world, &live, &format!("seed {seed}: start"));
    for step in 0..10 {
        let before = world.owners();
        let m_before = live.len();
        let op = if live.len() <= 2 { 0 } else { rng.below(5) };
        let what = format!("seed {seed} step {step} op {op}");
        let graceful = match op {
            0 => {
                let id = format!("r{next}");
                next += 1;
                live.insert(id.clone(), start(&store, &world, &id));
                true
            }
            1 => {
                let id = pick(&mut rng, &live);
                if let Some(r) = live.remove(&id) {
                    let _ = r.stop.send(());
                    r.run.await.expect("joined").expect("a graceful leave");
                }
                true
            }
            2 => {
                // kill -9: the replica's store calls stall forever, and it is dropped.
                let id = pick(&mut rng, &live);
                if let Some(r) = live.remove(&id) {
                    r.faulty.set(Fault::Stall);
                    r.run.abort();
                    // Its terms' futures went with it; they hold nothing any more.
                    world
                        .live
                        .lock()
                        .expect("not poisoned")
                        .retain(|(_, who, _), _| *who != id);
                }
                false
            }
            _ => {
                // A pause longer than the lease (its terms lapse, others take over, it
                // rejoins), or the store failing this replica's calls for a few seconds.
                let (fault, lasting) = if op == 3 {
                    (Fault::Stall, LEASE * 2)
                } else {
                    (Fault::Fail, Duration::from_secs(4))
                };
                if let Some(r) = live.get(&pick(&mut rng, &live)) {
                    r.faulty.set(fault);
                    settle(&world, lasting).await;
                    r.faulty.set(Fault::Healthy);
                }
                false
            }
        };
        settle(&world, stable).await;
        assert_balanced(&world, &live, &what);
        if graceful {
            let after = world.owners();
            let moved = (0..SHARDS)
                .filter(|s| before.get(s) != after.get(s))
                .count();
            let m = m_before.min(live.len()).max(1);
            let bound = (SHARDS as usize).div_ceil(m) + 1;
            assert!(
                moved <= bound,
                "{what}: {moved} shards moved, bound {bound}"
            );
        }
    }
    let violations = world.violations.lock().expect("not poisoned").clone();
    assert!(violations.is_empty(), "seed {seed}: {violations:?}");
    for (_, r) in live {
        let _ = r.stop.send(());
        let _ = r.run.await;
    }
}

#[tokio::test(start_paused = true)]
async fn random_joins_leaves_kills_pauses_and_faults_keep_shards_exclusive_and_balanced() {
    for seed in [1, 7, 42, 1234, 99_991] {
        scenario(seed).await;
    }
}

#[tokio::test(start_paused = true)]
async fn bad_shard_counts_are_refused_and_a_replica_with_another_count_waits() {
    let store = MemoryBackend::new();
    let locker = || Locker::with_identity(store.clone(), "x").expect("identity");
    for bad in [0, tenure::shard::MAX_SHARDS + 1] {
        let refused = ShardedElector::new(locker(), "workers", bad, ElectionConfig::new());
        assert!(
            matches!(refused, Err(ShardError::InvalidShardCount { shards }) if shards == bad),
            "{refused:?}"
        );
    }
    let world = Arc::new(World::default());
    let first = start(&store, &world, "first");
    settle(&world, Duration::from_secs(1)).await;
    // A stranger's record with another count that claims to have joined before anyone (a
    // lagging clock, or planted): it decides nothing.
    let ghost = Member {
        identity: "ghost".to_owned(),
        shards: 5,
        joined_ms: 0,
        holds: Vec::new(),
    };
    store
        .announce_member("workers", &ghost, LEASE * 100)
        .await
        .expect("planted");
    let odd = start_with(&store, &world, "odd", SHARDS + 1);
    settle(&world, LEASE * 4).await;
    assert!(!odd.run.is_finished(), "a replica with another count waits");
    assert!(odd.elector.owned().borrow().is_empty());
    assert!(
        matches!(&*odd.elector.group().borrow(), GroupStatus::Waiting { record } if record.shards == SHARDS),
        "{:?}",
        odd.elector.group().borrow()
    );
    assert_eq!(
        *first.elector.group().borrow(),
        GroupStatus::Running { generation: 1 }
    );
    // The group keeps running with its own count, undisturbed.
    assert_eq!(world.owners().len(), SHARDS as usize);
    assert_eq!(first.elector.owned().borrow().len(), SHARDS as usize);
    // Once nobody runs the group's count, the waiting replica changes it to its own.
    let _ = first.stop.send(());
    first.run.await.expect("joined").expect("ran");
    settle(&world, LEASE * 2).await;
    assert_eq!(
        *odd.elector.group().borrow(),
        GroupStatus::Running { generation: 2 }
    );
    assert_eq!(odd.elector.owned().borrow().len(), SHARDS as usize + 1);
    assert_eq!(
        world.violations.lock().expect("not poisoned").clone(),
        Vec::<String>::new()
    );
    let _ = odd.stop.send(());
    odd.run.await.expect("joined").expect("ran");
}

/// A rolling update from 4 to `to` shards: each new replica starts, then an old one leaves.
/// The first is cut off from the store (its workloads run until its renew deadline) and
/// heals once the new count runs; the others leave gracefully, the last of them taking a
/// while to stop its workloads after it withdrew. A replica restarted with the old count
/// afterwards waits instead of reverting the group.
async fn rolling_resize(to: u32) {
    let store = MemoryBackend::new();
    let world = Arc::new(World::default());
    let mut old: Vec<Replica> = (0..3)
        .map(|i| start_with(&store, &world, &format!("old-{i}"), 4))
        .collect();
    settle(&world, LEASE).await;
    assert_eq!(world.owners().len(), 4);
    let mut new = Vec::new();
    let mut cut_off = None;
    for i in 0..3 {
        new.push(start_with(&store, &world, &format!("new-{i}"), to));
        settle(&world, Duration::from_secs(5)).await;
        let r = old.remove(0);
        if i == 0 {
            r.faulty.set(Fault::Stall);
            cut_off = Some(r);
            // Until its membership and leases ran out: the old count runs on the others.
            settle(&world, LEASE * 2).await;
        } else {
            // The last graceful leave withdraws, then stops its workloads: the group changes
            // count at the withdrawal, and the new count must wait for those to stop.
            let _ = r.stop.send(());
            r.run.await.expect("joined").expect("a graceful leave");
        }
        settle(&world, Duration::from_secs(5)).await;
        assert!(
            new.iter().all(|n| n.elector.owned().borrow().is_empty()) || i == 2,
            "a new replica ran a shard while old ones live"
        );
    }
    settle(&world, LEASE * 3).await;
    if let Some(r) = &cut_off {
        r.faulty.set(Fault::Healthy);
    }
    settle(&world, LEASE * 2).await;
    if let Some(r) = cut_off {
        assert!(r.elector.owned().borrow().is_empty());
        let _ = r.stop.send(());
        r.run.await.expect("joined").expect("ran");
    }
    let owners = world.owners();
    let status: Vec<_> = new
        .iter()
        .map(|n| n.elector.group().borrow().clone())
        .collect();
    assert_eq!(owners.len(), to as usize, "{owners:?} {status:?}");
    assert!(owners.values().all(|o| o.starts_with("new-")), "{owners:?}");
    for n in &new {
        assert_eq!(
            *n.elector.group().borrow(),
            GroupStatus::Running { generation: 2 }
        );
        assert_eq!(n.elector.owned().borrow().len(), to as usize / 3);
    }
    let again = start_with(&store, &world, "old-again", 4);
    settle(&world, LEASE * 2).await;
    assert!(again.elector.owned().borrow().is_empty());
    assert!(
        matches!(&*again.elector.group().borrow(), GroupStatus::Waiting { record } if record.shards == to)
    );
    assert_eq!(world.owners().len(), to as usize);
    assert_eq!(
        world.violations.lock().expect("not poisoned").clone(),
        Vec::<String>::new()
    );
    for r in new.into_iter().chain([again]) {
        let _ = r.stop.send(());
        r.run.await.expect("joined").expect("ran");
    }
}

#[tokio::test(start_paused = true)]
async fn a_rolling_resize_up_completes_and_never_runs_two_counts_at_once() {
    rolling_resize(6).await;
}

#[tokio::test(start_paused = true)]
async fn a_rolling_resize_down_completes_and_never_runs_two_counts_at_once() {
    rolling_resize(3).await;
}

/// Terms lost to the store are counted (and, three within two leases, warned about); terms
/// given up — shards handed to a joiner, a graceful leave — are not.
#[tokio::test(start_paused = true)]
async fn only_terms_lost_to_the_store_count_as_lost() {
    let store = MemoryBackend::new();
    let world = Arc::new(World::default());
    let a = start(&store, &world, "a");
    settle(&world, LEASE).await;
    assert_eq!(a.elector.owned().borrow().len(), SHARDS as usize);
    let b = start(&store, &world, "b");
    settle(&world, LEASE * 2).await;
    assert_eq!(
        a.elector.owned().borrow().len(),
        SHARDS as usize / 2,
        "half handed to the joiner"
    );
    assert_eq!(
        a.elector.lost_terms(),
        0,
        "handing shards over loses nothing"
    );

    // b is cut off from the store past its renew deadline: every term it ran is lost.
    let held_by_b = b.elector.owned().borrow().len() as u64;
    b.faulty.set(Fault::Fail);
    settle(&world, LEASE * 2).await;
    assert!(b.elector.owned().borrow().is_empty());
    assert_eq!(b.elector.lost_terms(), held_by_b);
    assert_eq!(a.elector.lost_terms(), 0);
    b.faulty.heal();
    settle(&world, LEASE * 3).await;

    let lost_before = b.elector.lost_terms();
    let _ = b.stop.send(());
    b.run.await.expect("joined").expect("ran");
    let _ = a.stop.send(());
    a.run.await.expect("joined").expect("ran");
    assert_eq!(
        b.elector.lost_terms(),
        lost_before,
        "a graceful leave loses nothing"
    );
    assert_eq!(a.elector.lost_terms(), 0);
    assert_eq!(
        world.violations.lock().expect("not poisoned").clone(),
        Vec::<String>::new()
    );
}

/// A burst of membership changes (a deployment: members announcing one after another) is
/// assigned from the latest list at most once per 20 ms, not once per announcement: at a
/// thousand replicas, computing the whole assignment for every announcement of every other
/// member was most of a group's CPU. A change after a quiet spell is acted on at once.
#[tokio::test(start_paused = true)]
async fn a_burst_of_membership_changes_is_assigned_a_few_times() {
    let store = MemoryBackend::new();
    let world = Arc::new(World::default());
    let replica = start(&store, &world, "r0");
    settle(&world, LEASE).await;
    let mut assignment = replica.elector.assignment();
    assignment.mark_unchanged();
    let counted = tokio::spawn(async move {
        let mut n = 0;
        while assignment.changed().await.is_ok() {
            n += 1;
        }
        n
    });
    // 40 members join, one every millisecond.
    for i in 0..40 {
        let member = Member {
            identity: format!("m{i:02}"),
            shards: SHARDS,
            joined_ms: 0,
            holds: Vec::new(),
        };
        store
            .announce_member("workers", &member, LEASE * 10)
            .await
            .expect("announced");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    settle(&world, Duration::from_millis(200)).await;
    let latest = replica.elector.assignment().borrow().members.len();
    assert_eq!(latest, 41, "the last list was assigned");
    // One at once, then one per 20 ms of the 40 ms burst, and the last one after it.
    tokio::time::sleep(Duration::from_millis(1)).await;
    drop(replica);
    let computed = tokio::time::timeout(Duration::from_secs(60), counted)
        .await
        .map_or(0, |n| n.unwrap_or(0));
    assert!(
        (1..=5).contains(&computed),
        "40 announcements were assigned {computed} times"
    );
}

/// A sharded replica's process dies holding every shard (cut off from the store, its tasks and
/// its restart lock gone with it), and another replica joins. The restart with the same
/// identity takes the free lock and ends every shard term the dead process recorded — those
/// now assigned to the other replica too — so the four shards run again at once, each with a
/// higher token; without the lock they would wait for the leases (15 s).
#[tokio::test(start_paused = true)]
async fn a_sharded_replica_restarted_after_its_process_is_gone_frees_its_shards_at_once() {
    use tenure::election::RestartLock;
    const SHARDS: u32 = 4;
    let dir = std::env::temp_dir().join(format!("tenure-shard-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = MemoryBackend::new();
    let faulty = FaultyBackend::new(store.clone());
    let tokens: Arc<Mutex<BTreeMap<u32, u64>>> = Arc::default();
    let process = |backend: FaultyBackend, identity: &str, lock: Option<RestartLock>| {
        let mut elector = ShardedElector::new(
            Locker::with_identity(backend, identity).expect("identity"),
            "jobs",
            SHARDS,
            ElectionConfig::new(),
        )
        .expect("elector");
        if let Some(lock) = lock {
            elector = elector.with_restart_lock(lock);
        }
        let tokens = tokens.clone();
        let run = {
            let elector = elector.clone();
            tokio::spawn(async move {
                elector
                    .run_until(std::future::pending(), move |shard, term: Term| {
                        tokens
                            .lock()
                            .expect("not poisoned")
                            .insert(shard, term.fencing_token().get());
                        async move { term.cancellation().cancelled().await }
                    })
                    .await
            })
        };
        (elector, run)
    };
    let lock = |wait| {
        let dir = dir.clone();
        async move {
            RestartLock::take(&dir, "jobs", wait)
                .await
                .expect("no error")
        }
    };
    let owned = |e: &ShardedElector| e.owned().borrow().len();

    let (first, run) = process(faulty.clone(), "pod-a", lock(Duration::ZERO).await);
    let mut all = first.owned();
    tokio::time::timeout(
        Duration::from_secs(60),
        all.wait_for(|o| o.len() == SHARDS as usize),
    )
    .await
    .expect("every shard runs")
    .expect("alive");
    let before = tokens.lock().expect("not poisoned").clone();
    faulty.set(Fault::Stall);
    run.abort();
    let _ = run.await;
    drop((first, all));
    for shard in 0..SHARDS {
        let held = store
            .inspect(&format!("jobs-{shard}"))
            .await
            .expect("reads");
        assert_eq!(
            held.map(|r| r.identity).as_deref(),
            Some("pod-a"),
            "shard {shard}'s lease outlives the process"
        );
    }

    let (other, _other_run) = process(FaultyBackend::new(store.clone()), "pod-b", None);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = tokio::time::Instant::now();
    let lock = lock(Duration::from_secs(1))
        .await
        .expect("free: the previous process is gone");
    let (restarted, _run) = process(FaultyBackend::new(store.clone()), "pod-a", Some(lock));
    while owned(&restarted) + owned(&other) < SHARDS as usize {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} + {} shards run {:?} after the restart",
            owned(&restarted),
            owned(&other),
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(owned(&other) > 0, "the other replica runs some shards");
    let now = tokens.lock().expect("not poisoned").clone();
    for shard in 0..SHARDS {
        assert!(
            now[&shard] > before[&shard],
            "shard {shard}: a new term ({} after {})",
            now[&shard],
            before[&shard]
        );
    }
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// What a replica answers about its shards is what runs there: `owns(key)` is true and
/// `term(shard)` gives the running term's token only for a shard whose workload runs on this
/// replica, and neither answers once the replica stopped. A caller that gates a write on
/// `owns` or takes its token from `term` acts under its own term only. The simulation never
/// asks either (its workloads are handed their term), so their mutants went unjudged (#42).
#[tokio::test(start_paused = true)]
async fn owns_and_term_answer_for_the_shards_running_here_only() {
    let store = MemoryBackend::new();
    let world = Arc::new(World::default());
    let a = start(&store, &world, "a");
    let b = start(&store, &world, "b");
    settle(&world, LEASE * 2).await;
    // One key of each shard.
    let keys: Vec<String> = (0..SHARDS)
        .map(|shard| {
            (0u32..)
                .map(|i| format!("key-{i}"))
                .find(|k| tenure::shard::shard_of(k, SHARDS) == shard)
                .expect("some key of every shard")
        })
        .collect();
    let running: BTreeMap<u32, (String, FencingToken)> = world
        .live
        .lock()
        .expect("not poisoned")
        .iter()
        .filter(|(_, t)| t.is_valid())
        .map(|((s, who, token), _)| (*s, (who.clone(), *token)))
        .collect();
    assert_eq!(running.len(), SHARDS as usize, "{running:?}");
    for (name, r) in [("a", &a), ("b", &b)] {
        for (shard, (who, token)) in &running {
            let here = who == name;
            let key = &keys[*shard as usize];
            assert_eq!(
                r.elector.owns(key),
                here,
                "{name}: owns({key}), shard {shard} runs on {who}"
            );
            assert_eq!(
                r.elector.term(*shard).map(|t| t.fencing_token()),
                here.then_some(*token),
                "{name}: term({shard}), running on {who}"
            );
        }
    }
    assert!(
        running.values().any(|(who, _)| who == "a") && running.values().any(|(who, _)| who == "b")
    );
    let _ = a.stop.send(());
    a.run.await.expect("joined").expect("ran");
    for (shard, key) in keys.iter().enumerate() {
        assert!(!a.elector.owns(key), "a stopped, still owns {key}");
        assert!(
            a.elector.term(shard as u32).is_none(),
            "a stopped, still has a term of {shard}"
        );
    }
    assert_eq!(
        world.violations.lock().expect("not poisoned").clone(),
        Vec::<String>::new()
    );
    let _ = b.stop.send(());
    b.run.await.expect("joined").expect("ran");
}

/// One elector runs once at a time, and again after a run ended: a second `run_until` while
/// one runs is refused, one after it returned runs (a supervisor that restarts the run after
/// an error reuses the elector). The simulation builds a new elector for every run, so a flag
/// never cleared went unjudged (#42).
#[tokio::test(start_paused = true)]
async fn an_elector_runs_again_after_its_run_ended_but_never_twice_at_once() {
    let store = MemoryBackend::new();
    let world = Arc::new(World::default());
    let a = start(&store, &world, "a");
    settle(&world, LEASE).await;
    let again = a
        .elector
        .run_until(std::future::ready(()), |_, _| async {})
        .await;
    assert!(
        matches!(again, Err(ShardError::AlreadyRunning)),
        "{again:?}"
    );
    let _ = a.stop.send(());
    a.run.await.expect("joined").expect("ran");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let elector = a.elector.clone();
    let rerun = tokio::spawn(async move {
        elector
            .run_until(
                async {
                    let _ = stopped.await;
                },
                |_, term| async move { term.cancellation().cancelled().await },
            )
            .await
    });
    settle(&world, LEASE * 2).await;
    assert!(
        !rerun.is_finished(),
        "the second run ended: {:?}",
        rerun.await
    );
    assert_eq!(a.elector.owned().borrow().len(), SHARDS as usize);
    let _ = stop.send(());
    rerun.await.expect("joined").expect("ran again");
}

/// A graceful stop is a leave, not a crash: when `run_until` returns, every workload has seen
/// its cancellation and returned (none dropped mid-flight), and every shard lease is free for
/// the next holder at once, not after its ttl. With the stop skipped, the shards' tasks were
/// aborted as the run returned: each workload's future dropped, each lease left to run out —
/// which nothing in the simulation tells from a kill (#42, `Shards::stop_all`).
#[tokio::test(start_paused = true)]
async fn a_graceful_stop_ends_every_workload_and_frees_every_lease_before_the_run_returns() {
    let store = MemoryBackend::new();
    let world = Arc::new(World::default());
    let a = start(&store, &world, "a");
    settle(&world, LEASE * 2).await;
    assert_eq!(world.owners().len(), SHARDS as usize, "a holds every shard");
    let _ = a.stop.send(());
    a.run.await.expect("joined").expect("ran");
    assert_ended_cleanly(&world, &store).await;
}

/// After a run returned: no workload still runs, every shard lease can be taken at once by
/// another locker (each was released, not left to run out), and no shard had two valid terms.
async fn assert_ended_cleanly(world: &World, store: &MemoryBackend) {
    let still: Vec<u32> = world
        .live
        .lock()
        .expect("not poisoned")
        .keys()
        .map(|(shard, _, _)| *shard)
        .collect();
    assert!(
        still.is_empty(),
        "the run returned while these workloads had not returned: {still:?}"
    );
    let next = Locker::with_identity(store.clone(), "next").expect("identity");
    for shard in 0..SHARDS {
        let name = tenure::shard::lease_name("workers", shard);
        if let Err(e) = next
            .try_acquire(&name, &tenure::LockOptions::new().ttl(LEASE))
            .await
        {
            panic!("shard {shard}'s lease is not free after the run returned: {e}");
        }
    }
    assert_eq!(
        world.violations.lock().expect("not poisoned").clone(),
        Vec::<String>::new()
    );
}

/// A store that fails every member announcement with the kind set, and on request the group
/// record's first read after a chosen lease's grant (once); it forwards every other call (each
/// method forwarded, so no default bypasses the memory store's own).
mod refusing {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use futures::future::BoxFuture;
    use futures::stream::BoxStream;
    use tenure::backend::memory::MemoryBackend;
    use tenure::backend::{
        AcquireRequest, Acquired, Backend, BackendError, BackendErrorKind, Completion,
        CompletionCheck, EndedTerm, FencingToken, GroupRead, GroupRecord, GroupVersion, Handoff,
        HolderChange, HolderToken, InvalidName, LeadershipEvent, LeaseRecord, Member, Released,
        RenewRequest, Renewed, ShardLeaseWatch,
    };

    pub struct Refusing {
        pub inner: MemoryBackend,
        pub refuse: Arc<Mutex<Option<BackendErrorKind>>>,
        /// A lease whose next grant makes the group record's next read fail, once: the read
        /// a shard's term makes to confirm its generation before its workload starts.
        pub fail_read_after_grant_of: Arc<Mutex<Option<String>>>,
        /// How many group record reads were failed on purpose.
        pub failed_reads: Arc<Mutex<u32>>,
        fail_next_read: Arc<Mutex<bool>>,
    }

    impl Refusing {
        pub fn new(inner: MemoryBackend, refuse: Option<BackendErrorKind>) -> Self {
            Self {
                inner,
                refuse: Arc::new(Mutex::new(refuse)),
                fail_read_after_grant_of: Arc::default(),
                failed_reads: Arc::default(),
                fail_next_read: Arc::default(),
            }
        }
    }

    #[deny(clippy::missing_trait_methods)]
    impl Backend for Refusing {
        fn validate_name(&self, name: &str) -> Result<(), InvalidName> {
            self.inner.validate_name(name)
        }
        fn try_acquire<'a>(
            &'a self,
            req: &'a AcquireRequest,
        ) -> BoxFuture<'a, Result<Acquired, BackendError>> {
            Box::pin(async move {
                let acquired = self.inner.try_acquire(req).await;
                if let Ok(Acquired::Granted { .. }) = &acquired {
                    let mut armed = self.fail_read_after_grant_of.lock().expect("not poisoned");
                    if armed.as_deref() == Some(&*req.name) {
                        *armed = None;
                        *self.fail_next_read.lock().expect("not poisoned") = true;
                    }
                }
                acquired
            })
        }
        fn renew<'a>(
            &'a self,
            name: &'a str,
            holder: &'a HolderToken,
            ttl: Duration,
        ) -> BoxFuture<'a, Result<Renewed, BackendError>> {
            self.inner.renew(name, holder, ttl)
        }
        fn renew_many<'a>(
            &'a self,
            batch: &'a [RenewRequest],
        ) -> BoxFuture<'a, Vec<Result<Renewed, BackendError>>> {
            self.inner.renew_many(batch)
        }
        fn release<'a>(
            &'a self,
            name: &'a str,
            holder: &'a HolderToken,
        ) -> BoxFuture<'a, Result<Released, BackendError>> {
            self.inner.release(name, holder)
        }
        fn release_as<'a>(
            &'a self,
            name: &'a str,
            holder: &'a HolderToken,
            identity: &'a str,
        ) -> BoxFuture<'a, Result<Released, BackendError>> {
            self.inner.release_as(name, holder, identity)
        }
        fn release_to<'a>(
            &'a self,
            name: &'a str,
            holder: &'a HolderToken,
            to: &'a str,
            window: Duration,
        ) -> BoxFuture<'a, Result<Released, BackendError>> {
            self.inner.release_to(name, holder, to, window)
        }
        fn request_handoff<'a>(
            &'a self,
            name: &'a str,
            handoff: &'a Handoff,
            window: Duration,
        ) -> BoxFuture<'a, Result<bool, BackendError>> {
            self.inner.request_handoff(name, handoff, window)
        }
        fn inspect<'a>(
            &'a self,
            name: &'a str,
        ) -> BoxFuture<'a, Result<Option<LeaseRecord>, BackendError>> {
            self.inner.inspect(name)
        }
        fn last_term<'a>(
            &'a self,
            name: &'a str,
        ) -> BoxFuture<'a, Result<Option<EndedTerm>, BackendError>> {
            self.inner.last_term(name)
        }
        fn record_event<'a>(
            &'a self,
            name: &'a str,
            event: &'a LeadershipEvent,
        ) -> BoxFuture<'a, ()> {
            self.inner.record_event(name, event)
        }
        fn announce_member<'a>(
            &'a self,
            group: &'a str,
            member: &'a Member,
            ttl: Duration,
        ) -> BoxFuture<'a, Result<(), BackendError>> {
            if let Some(kind) = *self.refuse.lock().expect("not poisoned") {
                return Box::pin(std::future::ready(Err(BackendError::new(
                    kind,
                    "announcement refused by the test",
                ))));
            }
            self.inner.announce_member(group, member, ttl)
        }
        fn withdraw_member<'a>(
            &'a self,
            group: &'a str,
            identity: &'a str,
        ) -> BoxFuture<'a, Result<(), BackendError>> {
            self.inner.withdraw_member(group, identity)
        }
        fn members(&self, group: &str) -> BoxStream<'static, Result<Vec<Member>, BackendError>> {
            self.inner.members(group)
        }
        fn group_record<'a>(
            &'a self,
            group: &'a str,
        ) -> BoxFuture<'a, Result<GroupRead, BackendError>> {
            if std::mem::take(&mut *self.fail_next_read.lock().expect("not poisoned")) {
                *self.failed_reads.lock().expect("not poisoned") += 1;
                return Box::pin(std::future::ready(Err(BackendError::new(
                    BackendErrorKind::Unavailable,
                    "group record read failed by the test",
                ))));
            }
            self.inner.group_record(group)
        }
        fn swap_group_record<'a>(
            &'a self,
            group: &'a str,
            expected: Option<&'a GroupVersion>,
            record: &'a GroupRecord,
        ) -> BoxFuture<'a, Result<bool, BackendError>> {
            self.inner.swap_group_record(group, expected, record)
        }
        fn check_completion<'a>(
            &'a self,
            name: &'a str,
            token: FencingToken,
        ) -> BoxFuture<'a, Result<CompletionCheck, BackendError>> {
            self.inner.check_completion(name, token)
        }
        fn record_completion<'a>(
            &'a self,
            name: &'a str,
            record: &'a Completion,
        ) -> BoxFuture<'a, Result<bool, BackendError>> {
            self.inner.record_completion(name, record)
        }
        fn follow_shard_leases(&self, group: &str, leases: &[String]) -> ShardLeaseWatch {
            self.inner.follow_shard_leases(group, leases)
        }
        fn request_bound(&self) -> Option<Duration> {
            self.inner.request_bound()
        }
        fn observe(&self, name: &str) -> BoxStream<'static, Result<HolderChange, BackendError>> {
            self.inner.observe(name)
        }
    }
}

/// A store error on the member announcement: a transient one (the store unavailable) is
/// retried and counted, and the run goes on and takes its shards once the store answers;
/// a permanent one (permission denied) ends the run with `ShardError::Membership`, every
/// shard's workload stopped and its lease released. Every store error of the simulation is
/// transient, so the heartbeat's guard that tells the two apart went unjudged there (#42).
#[tokio::test(start_paused = true)]
async fn a_permanent_announcement_failure_ends_the_run_and_a_transient_one_does_not() {
    use tenure::backend::BackendErrorKind;
    let store = MemoryBackend::new();
    let world = Arc::new(World::default());
    let backend = refusing::Refusing::new(store.clone(), Some(BackendErrorKind::Unavailable));
    let refuse = backend.refuse.clone();
    let locker = Locker::with_identity(backend, "a").expect("identity");
    let elector =
        ShardedElector::new(locker, "workers", SHARDS, ElectionConfig::new()).expect("elector");
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let e = elector.clone();
    let w = world.clone();
    let mut run = tokio::spawn(async move {
        e.run_until(
            async {
                let _ = stopped.await;
            },
            move |shard, term| {
                let w = w.clone();
                async move {
                    let key = (shard, "a".to_owned(), term.fencing_token());
                    w.live
                        .lock()
                        .expect("not poisoned")
                        .insert(key.clone(), term.clone());
                    term.cancellation().cancelled().await;
                    w.live.lock().expect("not poisoned").remove(&key);
                }
            },
        )
        .await
    });
    settle(&world, LEASE * 2).await;
    assert!(
        !run.is_finished(),
        "a transient announcement failure ended the run: {:?}",
        run.await
    );
    assert!(elector.missed_heartbeats() > 0, "the failures are counted");
    *refuse.lock().expect("not poisoned") = None;
    settle(&world, LEASE * 3).await;
    assert_eq!(
        elector.owned().borrow().len(),
        SHARDS as usize,
        "the run took every shard once the store answered"
    );
    *refuse.lock().expect("not poisoned") = Some(BackendErrorKind::PermissionDenied);
    match tokio::time::timeout(LEASE * 2, &mut run).await {
        Ok(Ok(Err(ShardError::Membership { source, .. }))) => {
            assert_eq!(source.kind(), BackendErrorKind::PermissionDenied);
        }
        Ok(other) => panic!("the run ended otherwise: {other:?}"),
        Err(_) => panic!("a permanent announcement failure did not end the run"),
    }
    assert_ended_cleanly(&world, &store).await;
}

/// A shard term that ends before its workload starts — the read confirming its generation
/// failed once — is started again at once while the shard is still assigned here. Nothing
/// else would start it: the failed read changes neither the membership (the term held
/// nothing) nor the group's status (the keeper's own reads succeed), the two changes that
/// make the run rebalance (#42, mutant 757 `restart_if_ours → Ok(())`).
#[tokio::test(start_paused = true)]
async fn a_term_ended_by_one_failed_generation_read_is_started_again() {
    const ONE: u32 = 1;
    let store = MemoryBackend::new();
    let backend = refusing::Refusing::new(store.clone(), None);
    *backend
        .fail_read_after_grant_of
        .lock()
        .expect("not poisoned") = Some(tenure::shard::lease_name("workers", 0));
    let failed_reads = backend.failed_reads.clone();
    let locker = Locker::with_identity(backend, "a").expect("identity");
    let elector =
        ShardedElector::new(locker, "workers", ONE, ElectionConfig::new()).expect("elector");
    let started = Arc::new(Mutex::new(Vec::<FencingToken>::new()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (e, s) = (elector.clone(), started.clone());
    let run = tokio::spawn(async move {
        e.run_until(
            async {
                let _ = stopped.await;
            },
            move |_, term| {
                let s = s.clone();
                async move {
                    s.lock().expect("not poisoned").push(term.fencing_token());
                    term.cancellation().cancelled().await;
                }
            },
        )
        .await
    });
    tokio::time::sleep(LEASE * 3).await;
    assert_eq!(
        *failed_reads.lock().expect("not poisoned"),
        1,
        "the test failed the term's generation read once"
    );
    let tokens = started.lock().expect("not poisoned").clone();
    assert_eq!(
        tokens.len(),
        1,
        "shard 0 ran {} workload(s) in three leases after its first term ended unstarted",
        tokens.len()
    );
    let _ = stop.send(());
    run.await.expect("run task").expect("run ends cleanly");
}
