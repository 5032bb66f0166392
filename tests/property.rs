//! Random schedules of acquire / refresh / release / drop / orphan / clock advance / backend
//! faults on the memory backend, on tokio's paused clock. At no instant may two handles both
//! believe they hold a valid lease of the same name, and tokens only rise.

use std::time::Duration;

use proptest::prelude::*;
use tenure::backend::faulty::{Fault, FaultyBackend};
use tenure::backend::memory::MemoryBackend;
use tenure::{FencingToken, Lease, LockOptions, Locker};

const CLIENTS: usize = 3;
const NAME: &str = "contended";
const TTL: Duration = Duration::from_millis(300);

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        who: usize,
        auto_renew: bool,
        wait_ms: u64,
    },
    Refresh {
        who: usize,
    },
    Release {
        who: usize,
    },
    Drop {
        who: usize,
    },
    Orphan {
        who: usize,
    },
    Advance {
        ms: u64,
    },
    Fault {
        who: usize,
        fault: Fault,
    },
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        3 => Just(Fault::Healthy),
        1 => Just(Fault::Stall),
        1 => Just(Fault::Fail),
        1 => Just(Fault::LoseAnswers),
        1 => (1u64..400).prop_map(|ms| Fault::Delay(Duration::from_millis(ms))),
        1 => (1u64..120).prop_map(|ms| Fault::DelayAnswers(Duration::from_millis(ms))),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let who = 0..CLIENTS;
    prop_oneof![
        4 => (who.clone(), any::<bool>(), prop_oneof![Just(0u64), 1u64..700])
            .prop_map(|(who, auto_renew, wait_ms)| Op::Acquire { who, auto_renew, wait_ms }),
        2 => who.clone().prop_map(|who| Op::Refresh { who }),
        2 => who.clone().prop_map(|who| Op::Release { who }),
        1 => who.clone().prop_map(|who| Op::Drop { who }),
        1 => who.clone().prop_map(|who| Op::Orphan { who }),
        4 => (1u64..800).prop_map(|ms| Op::Advance { ms }),
        2 => (who, fault()).prop_map(|(who, fault)| Op::Fault { who, fault }),
    ]
}

struct World {
    backends: Vec<FaultyBackend>,
    lockers: Vec<Locker>,
    held: Vec<Vec<Lease>>,
    tokens: Vec<FencingToken>,
}

impl World {
    fn new() -> Self {
        let store = MemoryBackend::new();
        let backends: Vec<_> = (0..CLIENTS)
            .map(|_| FaultyBackend::new(store.clone()))
            .collect();
        let lockers = backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                Locker::with_identity(b.clone(), &format!("client-{i}")).expect("valid identity")
            })
            .collect();
        Self {
            backends,
            lockers,
            held: (0..CLIENTS).map(|_| Vec::new()).collect(),
            tokens: Vec::new(),
        }
    }

    /// The invariant, checked at the current instant.
    fn check(&self) {
        let believers: Vec<_> = self
            .held
            .iter()
            .flatten()
            .filter(|l| l.is_valid())
            .map(|l| (l.fencing_token(), l.valid_until()))
            .collect();
        assert!(
            believers.len() <= 1,
            "two valid holders at once: {believers:?}"
        );
    }

    /// Runs `fut` to completion while checking the invariant every few virtual milliseconds.
    async fn checked<T>(&self, fut: impl Future<Output = T>) -> T {
        tokio::pin!(fut);
        loop {
            tokio::select! {
                out = &mut fut => { self.check(); return out; }
                () = tokio::time::sleep(Duration::from_millis(7)) => self.check(),
            }
        }
    }

    async fn apply(&mut self, op: Op) {
        match op {
            Op::Acquire {
                who,
                auto_renew,
                wait_ms,
            } => {
                let opts = LockOptions::new()
                    .ttl(TTL)
                    .auto_renew(auto_renew)
                    .retry_interval(Duration::from_millis(50))
                    .wait(Duration::from_millis(wait_ms));
                let locker = self.lockers[who].clone();
                if let Ok(lease) = self.checked(locker.acquire(NAME, &opts)).await {
                    let t = lease.fencing_token();
                    assert!(
                        self.tokens.last().is_none_or(|&last| t > last),
                        "token {t} after {:?}",
                        self.tokens
                    );
                    self.tokens.push(t);
                    self.held[who].push(lease);
                }
            }
            Op::Refresh { who } => {
                if let Some(lease) = self.held[who].last() {
                    let _ = self.checked(lease.refresh()).await;
                }
            }
            Op::Release { who } => {
                if let Some(lease) = self.held[who].pop() {
                    let _ = self.checked(lease.release()).await;
                }
            }
            Op::Drop { who } => {
                self.held[who].pop();
            }
            Op::Orphan { who } => {
                if let Some(lease) = self.held[who].last() {
                    lease.orphan();
                }
            }
            Op::Advance { ms } => {
                self.checked(tokio::time::sleep(Duration::from_millis(ms)))
                    .await;
            }
            Op::Fault { who, fault } => self.backends[who].set(fault),
        }
        self.check();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_two_valid_holders_and_tokens_only_rise(ops in proptest::collection::vec(op(), 1..60)) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut world = World::new();
            for op in ops {
                world.apply(op).await;
            }
            // Heal everything, drop every handle and let ttls run out: nothing may be left
            // behind that keeps the lock taken.
            for b in &world.backends { b.heal(); }
            for held in &mut world.held { held.clear(); }
            world.checked(tokio::time::sleep(TTL * 3)).await;
            let opts = LockOptions::new().ttl(TTL);
            let last = world.lockers[0].try_acquire(NAME, &opts).await;
            prop_assert!(last.is_ok(), "lock still taken after every holder is gone: {last:?}");
            Ok::<(), TestCaseError>(())
        })?;
    }
}
