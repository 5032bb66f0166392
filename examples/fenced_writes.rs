//! A leader freezes mid-term, a new leader takes over, and the old one wakes up and tries to
//! write: the fence in the database refuses it.
//!
//! Two replicas, each with its own tokio runtime on its own thread, share one lease store (the
//! in-process memory backend) and one SQLite table guarded by the fencing pattern:
//! `UPDATE … WHERE fencing_token <= $t`. Replica A's whole runtime is frozen (a blocking sleep
//! stands in for SIGSTOP, a GC pause or a VM migration) past its lease; B wins the next term
//! and writes; A wakes, and the write it had in hand goes out before A can notice anything.
//!
//! Run: `cargo run --example fenced_writes`

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, params};
use tenure::backend::memory::MemoryBackend;
use tenure::election::{ElectionConfig, LeaderElector};
use tenure::{FencingToken, Locker};

type Db = Arc<Mutex<Connection>>;

/// The fenced write: it lands only if no newer term has written.
fn write(
    db: &Db,
    who: &str,
    token: FencingToken,
) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    let db = db.lock().map_err(|e| e.to_string())?;
    let rows = db.execute(
        "UPDATE report SET body = ?1, fencing_token = ?2 WHERE id = 1 AND fencing_token <= ?2",
        params![
            format!("written by {who} in term {token}"),
            token.get() as i64
        ],
    )?;
    Ok(rows == 1)
}

fn config() -> ElectionConfig {
    ElectionConfig::new()
        .lease_duration(Duration::from_millis(1500))
        .renew_deadline(Duration::from_millis(1000))
        .retry_period(Duration::from_millis(200))
        .stop_margin(Duration::from_millis(200))
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let db: Db = Arc::new(Mutex::new(Connection::open_in_memory()?));
    db.lock().map_err(|e| e.to_string())?.execute_batch(
        "CREATE TABLE report (id INTEGER PRIMARY KEY, body TEXT, fencing_token INTEGER NOT NULL);
         INSERT INTO report VALUES (1, 'nothing yet', 0);",
    )?;
    let store = MemoryBackend::new();

    // Replica A: leads, writes once, then its whole runtime freezes for 3 s with a write in hand.
    let (a_db, a_store) = (db.clone(), store.clone());
    let a = std::thread::spawn(
        move || -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
            let elector = LeaderElector::new(Locker::with_identity(a_store, "replica-a")?, "report", config())?;
            let outcome = elector
                .run(|term| {
                    let db = a_db.clone();
                    async move {
                        let token = term.fencing_token();
                        println!("replica-a leads, term {token}: write accepted = {}", write(&db, "a", token)?);
                        println!("replica-a freezes (SIGSTOP, GC pause, VM migration...)");
                        std::thread::sleep(Duration::from_secs(3)); // blocks A's entire runtime
                        let accepted = write(&db, "a", token)?;
                        println!("replica-a wakes and writes at once with term {token}: accepted = {accepted}");
                        Ok::<bool, Box<dyn std::error::Error + Send + Sync>>(accepted)
                    }
                })
                .await;
            Ok(match outcome {
                Ok(Ok(true)) => "the stale write was ACCEPTED".to_owned(),
                Ok(Ok(false)) | Err(_) => "the stale write was refused".to_owned(),
                Ok(Err(e)) => return Err(e),
            })
        })
        },
    );

    // Replica B: starts a moment later, waits, wins the term A lost, and writes.
    std::thread::sleep(Duration::from_millis(300));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let elector = LeaderElector::new(
            Locker::with_identity(store, "replica-b")?,
            "report",
            config(),
        )?;
        elector
            .run(|term| {
                let db = db.clone();
                async move {
                    let token = term.fencing_token();
                    println!(
                        "replica-b leads, term {token}: write accepted = {}",
                        write(&db, "b", token)?
                    );
                    // Stay leader until A has woken and tried its write.
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
                }
            })
            .await??;
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    let verdict = a.join().map_err(|_| "replica-a panicked")??;
    let body: String = db.lock().map_err(|e| e.to_string())?.query_row(
        "SELECT body FROM report WHERE id = 1",
        [],
        |r| r.get(0),
    )?;
    println!("{verdict}; the table says: {body:?}");
    if verdict.contains("ACCEPTED") {
        return Err("the fence failed".into());
    }
    Ok(())
}
