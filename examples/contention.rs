//! Three workers contend for one lease on the in-process memory backend.
//!
//! Each worker, while it holds the lease, writes to a shared "database" that remembers the
//! highest fencing token it has accepted and refuses lower ones. Worker 1 crashes mid-term
//! (its lease is neither released nor renewed), so the next worker takes over once the ttl
//! runs out; the others hand over at once by releasing. Finally a frozen ex-leader wakes up
//! and tries a late write with its old token: the fence refuses it.
//!
//! Run: `cargo run --example contention`

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::backend::memory::MemoryBackend;
use tenure::{FencingToken, LockOptions, Locker};
use tokio::time::Instant;

/// A resource that accepts a write only with a token at least as high as any seen.
#[derive(Default)]
struct FencedDb {
    highest: Mutex<Option<FencingToken>>,
}

impl FencedDb {
    fn write(&self, token: FencingToken, what: &str) -> Result<(), String> {
        let mut highest = self.highest.lock().map_err(|e| e.to_string())?;
        if let Some(h) = *highest
            && token < h
        {
            return Err(format!("refused {what:?}: token {token} is older than {h}"));
        }
        *highest = Some(token);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let log = move |who: &str, what: String| {
        println!("{:>6} ms  {who:<9} {what}", start.elapsed().as_millis());
    };
    let store = MemoryBackend::new();
    let db = Arc::new(FencedDb::default());
    let opts = LockOptions::new()
        .ttl(Duration::from_millis(600))
        .wait(Duration::from_secs(10))
        .auto_renew(true);

    let mut workers = Vec::new();
    for id in 1..=3 {
        let locker = Locker::with_identity(store.clone(), &format!("worker-{id}"))?;
        let (db, opts) = (db.clone(), opts.clone());
        workers.push(tokio::spawn(async move {
            let me = format!("worker-{id}");
            let lease = locker.acquire("report", &opts).await?;
            let token = lease.fencing_token();
            log(&me, format!("leads with fencing token {token}"));
            for step in 1..=3 {
                db.write(token, &format!("{me} step {step}"))?;
                tokio::time::sleep(Duration::from_millis(150)).await;
                if id == 1 && step == 2 {
                    log(&me, "crashes mid-term without releasing".into());
                    lease.orphan(); // as if the process died: nobody renews, nobody releases
                    return Ok::<_, Box<dyn std::error::Error + Send + Sync>>(token);
                }
            }
            lease.release().await?;
            log(&me, "done, released".into());
            Ok(token)
        }));
        // Start them in order so the story reads the same every run.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut tokens = Vec::new();
    for w in workers {
        tokens.push(w.await?.map_err(|e| e.to_string())?);
    }
    log("main", format!("tokens by worker: {tokens:?}"));

    // The crashed worker-1 was in fact only frozen; it wakes and tries a late write.
    match db.write(tokens[0], "worker-1 late write") {
        Err(refusal) => log("worker-1", format!("woke up late: {refusal}")),
        Ok(()) => return Err("the fence accepted a stale write".into()),
    }
    Ok(())
}
