//! The local backend side by side with its physical limit, a plain `flock(LOCK_EX)`:
//! acquire→release cycles per second on one task, and the release→grant hand-off latency
//! between two lockers (separate `LocalBackend` opens of one directory, as two processes
//! would have), printed as a table with ratios.
//!
//! Runs on a tmpfs directory (`/dev/shm`, like the default `$XDG_RUNTIME_DIR`) and on the
//! temporary directory (a disk here), where every grant pays two syncs.
//!
//! `cargo bench --features local --bench local`

#[path = "support/mod.rs"]
mod support;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::scratch::Scratch;
use support::stats::percentile;
use support::table;

use tenure::backend::local::LocalBackend;
use tenure::backend::{AcquireRequest, Acquired, Backend, HolderToken};
use tenure::{LockOptions, Locker};

/// How long each throughput loop runs.
const RUN: Duration = Duration::from_secs(2);
/// Hand-off samples per measurement.
const HANDOFFS: usize = 200;

fn dir_under(base: &Path, label: &str) -> Scratch {
    Scratch::new(base.join(format!("tenure-bench-local-{label}-{}", std::process::id())))
}

fn open(dir: &Path) -> LocalBackend {
    LocalBackend::open(dir).unwrap_or_else(|e| panic!("{e}"))
}

/// acquire→release cycles per second through a `Locker`.
async fn locker_cycles(dir: &Path) -> f64 {
    let locker = Locker::with_identity(open(dir), "bench").unwrap_or_else(|e| panic!("{e}"));
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < RUN {
        let lease = locker
            .try_acquire("cycle", &opts)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        lease.release().await.unwrap_or_else(|e| panic!("{e}"));
        n += 1;
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// acquire→release cycles per second on the bare backend (no lease handle, no scheduler).
async fn backend_cycles(dir: &Path) -> f64 {
    let backend = open(dir);
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < RUN {
        let req = AcquireRequest {
            name: "bare".into(),
            holder: HolderToken::random(),
            identity: "bench".into(),
            ttl: Duration::from_secs(10),
        };
        let granted = backend.try_acquire(&req).await;
        assert!(
            matches!(granted, Ok(Acquired::Granted { .. })),
            "{granted:?}"
        );
        let _ = backend.release(&req.name, &req.holder).await;
        n += 1;
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// lock→unlock cycles per second of `flock(LOCK_EX)` on one open file.
fn flock_cycles(dir: &Path) -> f64 {
    let file = flock_file(dir);
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < RUN {
        file.lock().unwrap_or_else(|e| panic!("{e}"));
        file.unlock().unwrap_or_else(|e| panic!("{e}"));
        n += 1;
    }
    n as f64 / started.elapsed().as_secs_f64()
}

fn flock_file(dir: &Path) -> File {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
    File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join("peer.flock"))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// release→grant latencies between two lockers on separate opens of `dir`; the waiter's
/// timed retry is 10 s away, so only the release notification hands the lock over fast.
async fn locker_handoffs(dir: &Path) -> Vec<Duration> {
    let a = Locker::with_identity(open(dir), "a").unwrap_or_else(|e| panic!("{e}"));
    let b = Locker::with_identity(open(dir), "b").unwrap_or_else(|e| panic!("{e}"));
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .retry_interval(Duration::from_secs(10))
        .wait(Duration::from_secs(60));
    let mut holder = a
        .try_acquire("handoff", &opts)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut waiter = b;
    let mut other = a;
    let mut samples = Vec::with_capacity(HANDOFFS);
    for _ in 0..HANDOFFS {
        let (w, o) = (waiter.clone(), opts.clone());
        let waiting = tokio::spawn(async move {
            let lease = w.acquire("handoff", &o).await;
            (lease, Instant::now())
        });
        // Let the waiter find the lock busy and subscribe.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let released_at = Instant::now();
        holder.release().await.unwrap_or_else(|e| panic!("{e}"));
        let (lease, granted_at) = waiting.await.unwrap_or_else(|e| panic!("{e}"));
        holder = lease.unwrap_or_else(|e| panic!("{e}"));
        samples.push(granted_at - released_at);
        std::mem::swap(&mut waiter, &mut other);
    }
    holder.release().await.unwrap_or_else(|e| panic!("{e}"));
    samples
}

/// unlock→lock latencies of `flock(LOCK_EX)` between two threads on separate opens.
fn flock_handoffs(dir: &Path) -> Vec<Duration> {
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let (got_tx, got_rx) = mpsc::channel::<Instant>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let waiter_dir = dir.to_owned();
    let waiter = std::thread::spawn(move || {
        let file = flock_file(&waiter_dir);
        while go_rx.recv().is_ok() {
            let _ = ready_tx.send(());
            file.lock().unwrap_or_else(|e| panic!("{e}"));
            let _ = got_tx.send(Instant::now());
            file.unlock().unwrap_or_else(|e| panic!("{e}"));
        }
    });
    let file = flock_file(dir);
    let mut samples = Vec::with_capacity(HANDOFFS);
    for _ in 0..HANDOFFS {
        file.lock().unwrap_or_else(|e| panic!("{e}"));
        go_tx.send(()).unwrap_or_else(|e| panic!("{e}"));
        ready_rx.recv().unwrap_or_else(|e| panic!("{e}"));
        // Let the waiter block in flock.
        std::thread::sleep(Duration::from_millis(5));
        let released_at = Instant::now();
        file.unlock().unwrap_or_else(|e| panic!("{e}"));
        let granted_at = got_rx.recv().unwrap_or_else(|e| panic!("{e}"));
        samples.push(granted_at - released_at);
    }
    drop(go_tx);
    let _ = waiter.join();
    samples
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut places = Vec::new();
    if Path::new("/dev/shm").is_dir() {
        places.push(("tmpfs", PathBuf::from("/dev/shm")));
    }
    places.push(("temp dir", std::env::temp_dir()));
    println!(
        "{}",
        table::header(
            &[
                "directory",
                "measure",
                "tenure local",
                "flock(LOCK_EX)",
                "ratio"
            ],
            3
        )
    );
    for (label, base) in places {
        let dir = dir_under(&base, "run");
        let place = format!("{label} ({})", base.display());
        let peer = flock_cycles(&dir.0);
        let locker = locker_cycles(&dir.0).await;
        let bare = backend_cycles(&dir.0).await;
        println!(
            "| {place} | acquire→release cycles/s, 1 task, Locker | {locker:.0} | {peer:.0} | {:.4} |",
            locker / peer
        );
        println!(
            "| {place} | acquire→release cycles/s, 1 task, bare backend | {bare:.0} | {peer:.0} | {:.4} |",
            bare / peer
        );
        let mut ours = locker_handoffs(&dir.0).await;
        let mut theirs = flock_handoffs(&dir.0);
        ours.sort();
        theirs.sort();
        for (name, p) in [("p50", 0.5), ("p99", 0.99)] {
            let (o, t) = (percentile(&ours, p), percentile(&theirs, p));
            println!(
                "| {place} | release→grant hand-off {name}, µs | {:.0} | {:.1} | {:.0}× |",
                micros(o),
                micros(t),
                micros(o) / micros(t)
            );
        }
    }
    println!(
        "\n(hand-off: two Lockers on separate opens of one directory, waiter's retry interval \
         10 s; peer: two threads blocking in flock on separate opens of one file; {HANDOFFS} \
         samples each)"
    );
}
