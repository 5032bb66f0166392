//! Sharded leadership on the memory backend and tokio's paused clock, under random joins,
//! graceful leaves, kills (a replica whose store calls stall forever, then dropped), store
//! pauses and store failures. Invariants: never two valid terms of one shard; tokens rise per
//! shard; once the membership is stable for a while, every shard is held and the loads of the
//! live replicas differ by at most one; one graceful join or leave moves at most ⌈N/M⌉ + 1
//! shards.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::backend::faulty::{Fault, FaultyBackend};
use tenure::backend::memory::MemoryBackend;
use tenure::election::{ElectionConfig, Term};
use tenure::shard::{ShardError, ShardedElector};
use tenure::{FencingToken, Locker};

const SHARDS: u32 = 24;
const LEASE: Duration = Duration::from_secs(15);

/// Every term running anywhere, and every token each shard was granted, in order.
#[derive(Default)]
struct World {
    live: Mutex<HashMap<(u32, String, FencingToken), Term>>,
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

struct Replica {
    faulty: FaultyBackend,
    elector: ShardedElector,
    stop: tokio::sync::oneshot::Sender<()>,
    run: tokio::task::JoinHandle<Result<(), ShardError>>,
}

fn start(store: &MemoryBackend, world: &Arc<World>, identity: &str) -> Replica {
    let faulty = FaultyBackend::new(store.clone());
    let locker = Locker::with_identity(faulty.clone(), identity).expect("identity");
    let elector =
        ShardedElector::new(locker, "workers", SHARDS, ElectionConfig::new()).expect("elector");
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
async fn bad_shard_counts_and_a_mismatched_replica_are_refused() {
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
    tokio::time::sleep(Duration::from_secs(1)).await;
    let odd = ShardedElector::new(
        Locker::with_identity(store.clone(), "odd").expect("identity"),
        "workers",
        SHARDS + 1,
        ElectionConfig::new(),
    )
    .expect("elector");
    let refused = tokio::time::timeout(
        Duration::from_secs(60),
        odd.run_until(std::future::pending(), |_, _| async {}),
    )
    .await
    .expect("refused promptly");
    assert!(
        matches!(&refused, Err(ShardError::ShardCountMismatch { ours, theirs, member, .. })
            if *ours == SHARDS + 1 && *theirs == SHARDS && member == "first"),
        "{refused:?}"
    );
    assert!(odd.owned().borrow().is_empty());
    // The group keeps running with its own count, undisturbed.
    settle(&world, LEASE * 2).await;
    assert_eq!(world.owners().len(), SHARDS as usize);
    let _ = first.stop.send(());
    first.run.await.expect("joined").expect("ran");
}
