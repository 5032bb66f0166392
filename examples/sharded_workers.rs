//! Sharded workers: 16 shards of work spread over the live replicas, each shard a fenced term.
//!
//! Three replicas (here: three tasks on one in-process store; in production, pods sharing a
//! Kubernetes namespace or a Redis) join the group `reports`. Each runs a worker per shard it
//! holds; a worker handles the keys whose shard (`tenure::shard::shard_of`, a documented hash
//! any language can compute) is its own, stamping each write with its term's fencing token.
//! After a while one replica leaves gracefully: its shards move to the others, and the
//! assignment stays balanced to ±1.
//!
//! Run it: `cargo run --example sharded_workers`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::Locker;
use tenure::backend::memory::MemoryBackend;
use tenure::election::ElectionConfig;
use tenure::shard::{ShardedElector, shard_of};

const SHARDS: u32 = 16;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let store = MemoryBackend::new();
    // Short durations so the example finishes in seconds.
    let config = ElectionConfig::new()
        .lease_duration(Duration::from_secs(3))
        .renew_deadline(Duration::from_secs(2))
        .retry_period(Duration::from_millis(500))
        .stop_margin(Duration::from_millis(300));
    // Which replica, with which token, last handled each key.
    let handled: Arc<Mutex<BTreeMap<String, (String, u64)>>> = Arc::default();
    let keys: Vec<String> = (0..40).map(|i| format!("customer-{i}")).collect();

    let mut replicas = Vec::new();
    for name in ["pod-a", "pod-b", "pod-c"] {
        let elector = ShardedElector::new(
            Locker::with_identity(store.clone(), name)?,
            "reports",
            SHARDS,
            config.clone(),
        )?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (handled, keys) = (handled.clone(), keys.clone());
        let run = tokio::spawn({
            let elector = elector.clone();
            async move {
                elector
                    .run_until(
                        async {
                            let _ = stopped.await;
                        },
                        move |shard, term| {
                            let (handled, keys) = (handled.clone(), keys.clone());
                            async move {
                                // This shard's keys, handled with this term's token until
                                // the term ends.
                                let mine: Vec<&String> = keys
                                    .iter()
                                    .filter(|k| shard_of(k, SHARDS) == shard)
                                    .collect();
                                while term.is_valid() {
                                    for key in &mine {
                                        handled.lock().expect("not poisoned").insert(
                                            (*key).clone(),
                                            (
                                                term.identity().to_owned(),
                                                term.fencing_token().get(),
                                            ),
                                        );
                                    }
                                    tokio::select! {
                                        () = term.cancellation().cancelled() => break,
                                        () = tokio::time::sleep(Duration::from_millis(200)) => {}
                                    }
                                }
                            }
                        },
                    )
                    .await
            }
        });
        replicas.push((name, elector, stop, run));
    }

    let report = |what: &str, replicas: &[(&str, ShardedElector, _, _)]| {
        let owned: Vec<String> = replicas
            .iter()
            .map(|(name, e, _, _)| format!("{name}: {:?}", *e.owned().borrow()))
            .collect();
        println!("{what}:\n  {}", owned.join("\n  "));
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    report("three replicas", &replicas);
    let loads: Vec<usize> = replicas
        .iter()
        .map(|(_, e, _, _)| e.owned().borrow().len())
        .collect();
    check_balanced(&loads)?;

    // pod-b leaves gracefully: its workers stop, its leases are released, the others take
    // its shards over on the release notification.
    let (_, _, stop, run) = replicas.remove(1);
    let _ = stop.send(());
    run.await??;
    tokio::time::sleep(Duration::from_secs(1)).await;
    report("after pod-b left", &replicas);
    let loads: Vec<usize> = replicas
        .iter()
        .map(|(_, e, _, _)| e.owned().borrow().len())
        .collect();
    check_balanced(&loads)?;
    if loads.iter().sum::<usize>() != SHARDS as usize {
        return Err(format!("not every shard is held: {loads:?}").into());
    }
    let by_b = handled
        .lock()
        .map_err(|e| e.to_string())?
        .values()
        .filter(|(who, _)| who == "pod-b")
        .count();
    println!(
        "{} keys handled, {by_b} of them last by pod-b (expected 0)",
        keys.len()
    );
    if by_b != 0 {
        return Err("keys of pod-b's shards were not taken over".into());
    }
    for (_, _, stop, run) in replicas {
        let _ = stop.send(());
        run.await??;
    }
    Ok(())
}

fn check_balanced(loads: &[usize]) -> Result<(), String> {
    let (min, max) = (
        loads.iter().min().copied().unwrap_or(0),
        loads.iter().max().copied().unwrap_or(0),
    );
    if max - min > 1 {
        return Err(format!("unbalanced: {loads:?}"));
    }
    Ok(())
}
