//! A job that must run once per tick across replicas, on Redis.
//!
//! Three replicas (here: three tasks, each with its own connection, as three pods would have)
//! wake up on every tick and race for a lease named after the tick. The winner runs the job
//! and *keeps* the lease until it expires instead of releasing it, so a replica that wakes up
//! late for the same tick still finds it taken: each tick runs exactly once.
//!
//! Run against a local server: `REDIS_URL=redis://127.0.0.1:6379 cargo run --features redis
//! --example redis_cron` (the e2e suite runs it against a server it starts).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::backend::redis::{RedisBackend, RedisConfig};
use tenure::{LockError, LockOptions, Locker};

const TICK: Duration = Duration::from_millis(500);
const TICKS: u64 = 6;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let runs: Arc<Mutex<BTreeMap<u64, Vec<String>>>> = Arc::default();
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64
        / TICK.as_millis() as u64;
    let mut replicas = Vec::new();
    for r in 0..3 {
        let backend = RedisBackend::connect(RedisConfig::new(&url)?).await?;
        let locker = Locker::with_identity(backend, &format!("replica-{r}"))?;
        let runs = runs.clone();
        replicas.push(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(TICK);
            for tick in epoch..epoch + TICKS {
                ticker.tick().await;
                // The lease outlives the tick, so late replicas find it taken.
                let opts = LockOptions::new().ttl(TICK * 4);
                match locker
                    .try_acquire(&format!("cron-report-{tick}"), &opts)
                    .await
                {
                    Ok(lease) => {
                        // The job itself; pass lease.fencing_token() to what it writes.
                        runs.lock()
                            .map_err(|e| e.to_string())?
                            .entry(tick)
                            .or_default()
                            .push(format!(
                                "{} (token {})",
                                locker.identity(),
                                lease.fencing_token()
                            ));
                        lease.orphan(); // keep it until it expires: once per tick
                    }
                    Err(LockError::NotAcquired { .. }) => {} // another replica has this tick
                    Err(e) => return Err(Box::new(e) as Box<dyn std::error::Error + Send + Sync>),
                }
            }
            Ok(())
        }));
    }
    for r in replicas {
        r.await??;
    }
    let runs = runs.lock().map_err(|e| e.to_string())?;
    for (tick, who) in runs.iter() {
        println!("tick {tick}: run by {}", who.join(", "));
    }
    if runs.len() as u64 != TICKS || runs.values().any(|w| w.len() != 1) {
        return Err(format!("expected each of {TICKS} ticks to run exactly once: {runs:?}").into());
    }
    println!("each of the {TICKS} ticks ran exactly once");
    Ok(())
}
