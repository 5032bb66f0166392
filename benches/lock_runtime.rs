//! Lock runtime benchmarks on the memory backend, printed as a table and written as JSON to
//! `target/bench/lock_runtime.json`.
//!
//! 1. acquire→release cycles per second through the `Locker`, against the raw backend calls;
//! 2. N auto-renewed leases held in one process: heap bytes per lease beyond the backend's own
//!    record, scheduler tasks, and the time to process N renewals that fall due together —
//!    side by side with the "one task per lease" design of most lock libraries.
//!
//! Run: `cargo bench --bench lock_runtime` (`-- --leases 100000 --cycles 200000` to change N).

#[path = "support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tenure::backend::memory::MemoryBackend;
use tenure::backend::{AcquireRequest, Backend, HolderToken};
use tenure::{Lease, LockOptions, Locker};

use support::out::{Say, save};
use support::table;

/// Counts live heap bytes so per-lease memory can be measured exactly.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the same arguments and only adds bookkeeping
// on an atomic counter; the layout contract is passed through unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's arguments.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

struct Args {
    leases: usize,
    cycles: usize,
}

fn args() -> Args {
    let mut a = Args {
        leases: 100_000,
        cycles: 200_000,
    };
    let argv: Vec<String> = std::env::args().collect();
    for w in argv.windows(2) {
        match w[0].as_str() {
            "--leases" => a.leases = w[1].parse().unwrap_or(a.leases),
            "--cycles" => a.cycles = w[1].parse().unwrap_or(a.cycles),
            _ => {}
        }
    }
    a
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

/// acquire→release cycles/s: through the `Locker`, and as two raw backend calls.
fn cycles(n: usize) -> (f64, f64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let backend = MemoryBackend::new();
        let locker = Locker::with_identity(backend.clone(), "bench").expect("identity");
        let opts = LockOptions::new();
        let start = Instant::now();
        for i in 0..n {
            let lease = locker.try_acquire("cycle", &opts).await.expect("free");
            lease.release().await.expect("released");
            // The memory backend answers without ever yielding: a loop of it alone would
            // starve every other task on this thread (here the renewal scheduler, whose queue
            // would then grow by two entries a cycle), which no caller of a real store does.
            if i % 64 == 63 {
                tokio::task::yield_now().await;
            }
        }
        let tenure = n as f64 / start.elapsed().as_secs_f64();

        let start = Instant::now();
        for i in 0..n {
            let req = AcquireRequest {
                name: "raw".into(),
                holder: HolderToken::random(),
                identity: "bench".into(),
                ttl: Duration::from_secs(30),
            };
            backend.try_acquire(&req).await.expect("free");
            backend
                .release(&req.name, &req.holder)
                .await
                .expect("released");
            if i % 64 == 63 {
                tokio::task::yield_now().await;
            }
        }
        let raw = n as f64 / start.elapsed().as_secs_f64();
        (tenure, raw)
    })
}

struct Held {
    bytes_per_lease: f64,
    tasks_alive: usize,
    scheduler_tasks: usize,
    renew_all: Duration,
    renew_round_trips: u64,
}

/// Heap bytes of the backend's own records for `n` held locks.
fn backend_record_bytes(n: usize) -> f64 {
    let rt = paused_runtime();
    rt.block_on(async {
        let backend = MemoryBackend::new();
        let mut reqs = Vec::with_capacity(n);
        for i in 0..n {
            reqs.push(AcquireRequest {
                name: format!("lease-{i}").into(),
                holder: HolderToken::random(),
                identity: "bench".into(),
                ttl: Duration::from_secs(30),
            });
        }
        let with_reqs = live();
        for r in &reqs {
            backend.try_acquire(r).await.expect("free");
        }
        let bytes = live() - with_reqs;
        drop(reqs);
        drop(backend);
        bytes as f64 / n as f64
    })
}

/// `n` leases through tenure's single scheduler.
fn tenure_held(n: usize, backend_bytes: f64) -> Held {
    let rt = paused_runtime();
    rt.block_on(async {
        let backend = MemoryBackend::new();
        let locker = Locker::with_identity(backend, "bench").expect("identity");
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .auto_renew(true);
        let names: Vec<String> = (0..n).map(|i| format!("lease-{i}")).collect();
        let mut leases: Vec<Lease> = Vec::with_capacity(n);
        let before = live();
        for name in &names {
            leases.push(locker.try_acquire(name, &opts).await.expect("free"));
        }
        // Let the scheduler take in every lease before measuring.
        while locker.stats().scheduler_internals().tracked_leases < n {
            tokio::task::yield_now().await;
        }
        let total = (live() - before) as f64 / n as f64;
        let tasks_alive = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        let scheduler_tasks = locker.stats().scheduler_tasks();

        // Every lease was acquired at the same (paused) instant, so all fall due together.
        tokio::time::advance(Duration::from_secs(10)).await;
        let start = Instant::now();
        while locker.stats().renewals() < n as u64 {
            tokio::task::yield_now().await;
        }
        let renew_all = start.elapsed();
        let renew_round_trips = locker.stats().renew_batches();
        drop(leases);
        Held {
            bytes_per_lease: total - backend_bytes,
            tasks_alive,
            scheduler_tasks,
            renew_all,
            renew_round_trips,
        }
    })
}

/// The common design elsewhere: one task per held lease, sleeping until its renewal.
fn task_per_lease_held(n: usize, backend_bytes: f64) -> Held {
    let rt = paused_runtime();
    rt.block_on(async {
        let backend = Arc::new(MemoryBackend::new());
        let renewed = Arc::new(AtomicU64::new(0));
        let round_trips = Arc::new(AtomicU64::new(0));
        let started = Arc::new(AtomicU64::new(0));
        let names: Vec<String> = (0..n).map(|i| format!("lease-{i}")).collect();
        let before = live();
        let mut handles = Vec::with_capacity(n);
        for name in &names {
            let req = AcquireRequest {
                name: name.as_str().into(),
                holder: HolderToken::random(),
                identity: "bench".into(),
                ttl: Duration::from_secs(30),
            };
            backend.try_acquire(&req).await.expect("free");
            let (backend, renewed, round_trips, started) = (
                backend.clone(),
                renewed.clone(),
                round_trips.clone(),
                started.clone(),
            );
            handles.push(tokio::spawn(async move {
                started.fetch_add(1, Ordering::Relaxed);
                loop {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    round_trips.fetch_add(1, Ordering::Relaxed);
                    if backend.renew(&req.name, &req.holder, req.ttl).await.is_ok() {
                        renewed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        // Let every task start its first sleep at this same (paused) instant.
        while started.load(Ordering::Relaxed) < n as u64 {
            tokio::task::yield_now().await;
        }
        let total = (live() - before) as f64 / n as f64;
        let tasks_alive = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        tokio::time::advance(Duration::from_secs(10)).await;
        let start = Instant::now();
        while renewed.load(Ordering::Relaxed) < n as u64 {
            tokio::task::yield_now().await;
        }
        let renew_all = start.elapsed();
        for h in handles {
            h.abort();
        }
        Held {
            bytes_per_lease: total - backend_bytes,
            tasks_alive,
            scheduler_tasks: n,
            renew_all,
            renew_round_trips: round_trips.load(Ordering::Relaxed),
        }
    })
}

fn main() {
    let a = args();
    let (tenure_cps, raw_cps) = cycles(a.cycles);
    let backend_bytes = backend_record_bytes(a.leases);
    let t = tenure_held(a.leases, backend_bytes);
    let p = task_per_lease_held(a.leases, backend_bytes);

    println!(
        "## lock runtime on the memory backend ({} cycles, {} leases)\n",
        a.cycles, a.leases
    );
    println!(
        "{}",
        table::header(&["measure", "tenure", "peer", "ratio"], 0)
    );
    println!(
        "| acquire→release cycles/s (peer: raw backend calls) | {tenure_cps:.0} | {raw_cps:.0} | {:.2} |",
        tenure_cps / raw_cps
    );
    println!(
        "| backend record bytes/lease (both) | {backend_bytes:.0} | {backend_bytes:.0} | 1.00 |"
    );
    println!(
        "| runtime heap bytes/lease beyond the record (peer: task per lease) | {:.0} | {:.0} | {:.2} |",
        t.bytes_per_lease,
        p.bytes_per_lease,
        t.bytes_per_lease / p.bytes_per_lease
    );
    println!(
        "| tasks alive while holding (runtime metrics) | {} | {} | |",
        t.tasks_alive, p.tasks_alive
    );
    println!(
        "| renewal scheduler tasks | {} | {} | |",
        t.scheduler_tasks, p.scheduler_tasks
    );
    println!(
        "| time to process {} renewals due together (ms) | {:.1} | {:.1} | {:.2} |",
        a.leases,
        t.renew_all.as_secs_f64() * 1e3,
        p.renew_all.as_secs_f64() * 1e3,
        t.renew_all.as_secs_f64() / p.renew_all.as_secs_f64()
    );
    println!(
        "| backend round trips for those renewals | {} | {} | |",
        t.renew_round_trips, p.renew_round_trips
    );

    let json = format!(
        concat!(
            "{{\"cycles\":{},\"leases\":{},\"tenure_cycles_per_s\":{:.0},\"raw_cycles_per_s\":{:.0},",
            "\"backend_record_bytes\":{:.1},\"tenure_bytes_per_lease\":{:.1},\"task_per_lease_bytes\":{:.1},",
            "\"tenure_tasks_alive\":{},\"task_per_lease_tasks_alive\":{},\"tenure_scheduler_tasks\":{},",
            "\"tenure_renew_all_ms\":{:.2},\"task_per_lease_renew_all_ms\":{:.2},",
            "\"tenure_renew_round_trips\":{},\"task_per_lease_renew_round_trips\":{}}}\n"
        ),
        a.cycles,
        a.leases,
        tenure_cps,
        raw_cps,
        backend_bytes,
        t.bytes_per_lease,
        p.bytes_per_lease,
        t.tasks_alive,
        p.tasks_alive,
        t.scheduler_tasks,
        t.renew_all.as_secs_f64() * 1e3,
        p.renew_all.as_secs_f64() * 1e3,
        t.renew_round_trips,
        p.renew_round_trips
    );
    save("lock_runtime.json", &json, Say::Quiet);
}
