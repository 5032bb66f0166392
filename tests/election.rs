//! The elector's bounds on tokio's paused clock and the memory backend: cancellation at the
//! renew deadline, dropping a workload that ignores it, release only after the workload
//! stopped, panics, shutdown hand-over, rejoining, observation, and many electors at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tenure::backend::Backend;
use tenure::backend::faulty::{Fault, FaultyBackend};
use tenure::backend::memory::MemoryBackend;
use tenure::election::{ElectionConfig, ElectionError, LeaderElector, RestartLock};
use tenure::{Locker, LostReason};
use tokio::time::Instant;

fn elector(backend: impl Backend, identity: &str, config: ElectionConfig) -> LeaderElector {
    let locker = Locker::with_identity(backend, identity).expect("valid identity");
    LeaderElector::new(locker, "controller", config).expect("valid config")
}

/// Records the instant it is dropped: the moment the workload future stopped running.
struct DropClock(Arc<Mutex<Option<Instant>>>);

impl Drop for DropClock {
    fn drop(&mut self) {
        *self.0.lock().expect("not poisoned") = Some(Instant::now());
    }
}

/// The lease's record in `store`.
fn record(store: &MemoryBackend) -> Option<tenure::backend::LeaseRecord> {
    store
        .inspect("controller")
        .now_or_never()
        .expect("memory answers at once")
        .expect("memory never fails")
}

fn holder(store: &MemoryBackend) -> Option<String> {
    record(store).map(|r| r.identity)
}

#[tokio::test(start_paused = true)]
async fn cancellation_fires_at_the_renew_deadline() {
    let store = MemoryBackend::new();
    let faulty = FaultyBackend::new(store.clone());
    let e = elector(faulty.clone(), "a", ElectionConfig::new());
    let cancelled_after = Arc::new(Mutex::new(None));
    let seen = cancelled_after.clone();
    let result = e
        .run(|term| {
            let faulty = faulty.clone();
            let seen = seen.clone();
            async move {
                faulty.set(Fault::Stall); // the store stops answering from now on
                term.cancellation().cancelled().await;
                *seen.lock().expect("not poisoned") = Some(term.started_at().elapsed());
            }
        })
        .await;
    let after = cancelled_after
        .lock()
        .expect("not poisoned")
        .expect("cancelled");
    assert!(
        after >= Duration::from_secs(10) && after <= Duration::from_millis(10_005),
        "cancelled {after:?} after the term began; the renew deadline is 10 s"
    );
    assert!(
        matches!(
            result,
            Err(ElectionError::Lost {
                reason: LostReason::RenewDeadline,
                ..
            })
        ),
        "{result:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_workload_ignoring_cancellation_is_dropped_before_another_could_lead() {
    let store = MemoryBackend::new();
    let faulty = FaultyBackend::new(store.clone());
    let e = elector(faulty.clone(), "a", ElectionConfig::new());
    let dropped = Arc::new(Mutex::new(None));
    let (d, started) = (dropped.clone(), Instant::now());
    let valid_until = Arc::new(Mutex::new(None));
    let v = valid_until.clone();
    let result = e
        .run(|term| {
            let (faulty, d, v) = (faulty.clone(), d.clone(), v.clone());
            async move {
                let _clock = DropClock(d);
                faulty.set(Fault::Stall);
                loop {
                    // Ignores term.cancellation() entirely.
                    *v.lock().expect("not poisoned") = Some(term.valid_until());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        })
        .await;
    assert!(
        matches!(result, Err(ElectionError::Lost { .. })),
        "{result:?}"
    );
    let dropped_at = dropped.lock().expect("not poisoned").expect("dropped");
    let valid_until = valid_until.lock().expect("not poisoned").expect("seen");
    assert!(
        dropped_at <= valid_until - Duration::from_secs(1),
        "dropped at +{:?}, valid until +{:?}: it must stop a stop_margin before",
        dropped_at - started,
        valid_until - started
    );
    assert!(
        dropped_at - started >= Duration::from_secs(10),
        "not before the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn the_lease_is_released_only_after_the_workload_stopped() {
    let store = MemoryBackend::new();
    let e = elector(store.clone(), "a", ElectionConfig::new());
    let s = store.clone();
    let out = e
        .run(|term| {
            let s = s.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(30)).await;
                // Still ours at the workload's very last step...
                assert_eq!(holder(&s).as_deref(), Some("a"));
                term.fencing_token()
            }
        })
        .await
        .expect("the workload returned");
    // ...and released once run returns, well before the 15 s ttl would have run out.
    assert_eq!(holder(&store), None);
    assert!(out.get() > 0);
}

/// A term task stuck in blocking code (abort cannot end it) holds the release only until a
/// stop margin before the term's validity ends; then the lease is given back anyway (an error
/// names the stuck task), so the successor is handed it by the release instead of waiting for
/// the store's expiry. Found by a mutant the other tests missed (#42): the tasks' deadline
/// `valid_until − stop_margin` turned into `+` released after the validity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_task_stuck_in_blocking_code_holds_the_release_only_until_the_validity() {
    let store = MemoryBackend::new();
    let e = elector(store.clone(), "a", stuck_task_config());
    let valid_until = e
        .run(|term| async move {
            block_a_worker(&term).await;
            term.valid_until()
        })
        .await
        .expect("the workload returned");
    let released = Instant::now();
    assert_eq!(holder(&store), None, "the lease was not released");
    assert_released_within_validity(released, valid_until);
}

/// The timings of the stuck-task tests: a 6 s lease whose term is stopped 1 s before its
/// validity ends.
fn stuck_task_config() -> ElectionConfig {
    ElectionConfig::new()
        .lease_duration(Duration::from_secs(6))
        .renew_deadline(Duration::from_secs(4))
        .retry_period(Duration::from_secs(1))
        .stop_margin(Duration::from_secs(1))
}

/// Spawns a task of `term` that blocks its worker thread past the lease and the margin after
/// it, and returns once it runs (a task aborted before its first poll just ends).
async fn block_a_worker(term: &tenure::Term) {
    let (running, started) = tokio::sync::oneshot::channel();
    term.spawn(async move {
        let _ = running.send(());
        std::thread::sleep(Duration::from_secs(9));
    });
    let _ = started.await;
}

/// Released at `valid_until − stop_margin`; a loaded machine may be late by up to the
/// margin, never past the validity.
fn assert_released_within_validity(released: Instant, valid_until: Instant) {
    assert!(
        released < valid_until,
        "released {:?} after the term's validity ended",
        released - valid_until
    );
}

/// The same bound when the run is dropped mid-term: the background release waits for a
/// task stuck in blocking code only until `valid_until − stop_margin`. Found by a mutant of
/// `HeldTerm`'s deadline (#42: `−` → `+` released after the validity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_runs_stuck_task_holds_the_background_release_only_until_the_validity() {
    let store = MemoryBackend::new();
    let e = elector(store.clone(), "a", stuck_task_config());
    let (tell, told) = tokio::sync::oneshot::channel();
    let tell = Mutex::new(Some(tell));
    let run = e.run(|term| {
        let tell = tell.lock().expect("not poisoned").take();
        async move {
            block_a_worker(&term).await;
            if let Some(tell) = tell {
                let _ = tell.send(term.valid_until());
            }
            std::future::pending::<()>().await;
        }
    });
    // The run is dropped as soon as its term's task blocks.
    let valid_until = tokio::select! {
        out = run => panic!("the run ended: {out:?}"),
        told = told => told.expect("the workload told its validity"),
    };
    let give_up = Instant::now() + Duration::from_secs(20);
    while holder(&store).is_some() {
        assert!(Instant::now() < give_up, "never released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_released_within_validity(Instant::now(), valid_until);
}

#[tokio::test(start_paused = true)]
async fn a_panic_surfaces_from_run_and_the_lease_is_released() {
    let store = MemoryBackend::new();
    let e = elector(store.clone(), "a", ElectionConfig::new());
    let result: Result<(), _> = e.run(|_| async { panic!("reconcile exploded") }).await;
    assert!(
        matches!(&result, Err(ElectionError::WorkloadPanicked { message }) if message == "reconcile exploded"),
        "{result:?}"
    );
    assert_eq!(holder(&store), None);
    assert!(!e.is_leader());
}

#[tokio::test(start_paused = true)]
async fn a_store_saying_not_held_drops_the_workload_at_once() {
    let store = MemoryBackend::new();
    let e = elector(store.clone(), "a", ElectionConfig::new());
    let dropped = Arc::new(Mutex::new(None));
    let d = dropped.clone();
    let s = store.clone();
    let started = Instant::now();
    let result = e
        .run(|_| {
            let (d, s) = (d.clone(), s.clone());
            async move {
                let _clock = DropClock(d);
                s.wipe(); // the store forgets the lease; the next renewal learns it
                std::future::pending::<()>().await;
            }
        })
        .await;
    assert!(
        matches!(
            result,
            Err(ElectionError::Lost {
                reason: LostReason::NotHeld,
                ..
            })
        ),
        "{result:?}"
    );
    let dropped_at = dropped.lock().expect("not poisoned").expect("dropped");
    // The first renewal is at lease / 3 = 5 s; "not held" drops the workload at that instant.
    assert!(
        dropped_at - started <= Duration::from_millis(5_010),
        "{:?}",
        dropped_at - started
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_hands_over_at_once_through_the_release_notification() {
    let store = MemoryBackend::new();
    let a = elector(store.clone(), "a", ElectionConfig::new());
    let b = elector(store.clone(), "b", ElectionConfig::new());
    let (stop_a, stopped) = tokio::sync::oneshot::channel::<()>();
    let a_run = tokio::spawn({
        let a = a.clone();
        async move {
            a.run_until(stopped.map(|_| ()), |term| async move {
                term.cancellation().cancelled().await;
                // The lease is still ours until the release, but the term is over.
                assert!(!term.is_valid(), "a cancelled term is not valid");
                "a stopped"
            })
            .await
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(a.is_leader());
    let b_started = Arc::new(Mutex::new(None));
    let bs = b_started.clone();
    let b_run = tokio::spawn({
        let b = b.clone();
        async move {
            b.run(|term| {
                let bs = bs.clone();
                async move {
                    *bs.lock().expect("not poisoned") =
                        Some((Instant::now(), term.fencing_token()));
                }
            })
            .await
        }
    });
    // B follows A meanwhile.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let seen = b.leader().borrow().clone();
    assert_eq!(seen.map(|l| l.identity).as_deref(), Some("a"));
    assert!(
        b_started.lock().expect("not poisoned").is_none(),
        "b must not lead while a does"
    );

    let shutdown_at = Instant::now();
    stop_a.send(()).expect("a is running");
    let a_out = a_run.await.expect("a's task");
    assert_eq!(a_out.ok().flatten(), Some("a stopped"));
    b_run.await.expect("b's task").expect("b led and returned");
    let (b_at, _) = b_started.lock().expect("not poisoned").expect("b led");
    assert!(
        b_at - shutdown_at < Duration::from_millis(100),
        "b took over {:?} after a's shutdown; without the notification it would wait ~15 s",
        b_at - shutdown_at
    );
}

#[tokio::test(start_paused = true)]
async fn rejoin_campaigns_again_after_a_lost_term_with_a_higher_token() {
    let store = MemoryBackend::new();
    let e = elector(store.clone(), "a", ElectionConfig::new().rejoin(true));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let (t, s) = (tokens.clone(), store.clone());
    let result = e
        .run(|term| {
            let (t, s) = (t.clone(), s.clone());
            async move {
                let terms = {
                    let mut seen = t.lock().expect("not poisoned");
                    seen.push(term.fencing_token());
                    seen.len()
                };
                if terms == 1 {
                    s.wipe();
                    term.cancellation().cancelled().await;
                    return None;
                }
                Some(term.fencing_token())
            }
        })
        .await;
    let tokens = tokens.lock().expect("not poisoned").clone();
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    assert!(tokens[1] > tokens[0]);
    assert_eq!(result.ok().flatten(), Some(tokens[1]));
}

#[tokio::test(start_paused = true)]
async fn health_reports_the_leader_and_its_last_renewal() {
    let store = MemoryBackend::new();
    let e = elector(store, "a", ElectionConfig::new());
    assert!(!e.health(Duration::ZERO).leading);
    let watcher = e.clone();
    e.run(|_| {
        let watcher = watcher.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(7)).await;
            let h = watcher.health(Duration::ZERO);
            assert!(h.leading && h.healthy, "{h:?}");
            // Renewed at 5 s, so 2 s ago.
            assert_eq!(h.since_last_renewal, Some(Duration::from_secs(2)));
            assert!(watcher.is_leader());
        }
    })
    .await
    .expect("ran");
}

#[tokio::test(start_paused = true)]
async fn a_thousand_electors_share_one_scheduler_and_all_lead() {
    let locker = Locker::with_identity(MemoryBackend::new(), "shard-host").expect("valid");
    let stop = tokio_util::sync::CancellationToken::new();
    let mut runs = Vec::new();
    let mut electors = Vec::new();
    for shard in 0..1000 {
        let e = LeaderElector::new(
            locker.clone(),
            &format!("shard-{shard}"),
            ElectionConfig::new(),
        )
        .expect("valid");
        electors.push(e.clone());
        let stop = stop.clone();
        runs.push(tokio::spawn(async move {
            e.run_until(stop.cancelled_owned(), |term| async move {
                term.cancellation().cancelled().await;
            })
            .await
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(electors.iter().all(LeaderElector::is_leader));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        electors.iter().all(LeaderElector::is_leader),
        "a term ended: renewals were late"
    );
    let stats = locker.stats();
    assert_eq!(stats.scheduler_tasks(), 1);
    assert_eq!(stats.active_leases(), 1000);
    assert!(stats.renewals() >= 12 * 1000, "{stats:?}");
    stop.cancel();
    for r in runs {
        // The workloads return when cancelled, so their output comes back.
        assert!(matches!(r.await.expect("task"), Ok(Some(()))));
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(locker.stats().active_leases(), 0);
}

#[test]
fn invalid_durations_name_the_rule() {
    let rule = |c: ElectionConfig| match LeaderElector::new(
        Locker::with_identity(MemoryBackend::new(), "a").expect("valid"),
        "x",
        c,
    ) {
        Err(ElectionError::InvalidConfig { rule }) => rule,
        other => panic!("expected InvalidConfig, got {other:?}"),
    };
    let s = Duration::from_secs;
    assert!(
        rule(ElectionConfig::new().lease_duration(s(10)))
            .contains("lease_duration must be greater than renew_deadline")
    );
    assert!(rule(ElectionConfig::new().retry_period(s(9))).contains("1.2 × retry_period"));
    assert!(rule(ElectionConfig::new().request_timeout(s(2))).contains("request_timeout"));
    assert!(rule(ElectionConfig::new().stop_margin(s(5))).contains("stop_margin"));
    // 365 days is the longest duration taken; a nanosecond more is refused.
    let year = s(365 * 24 * 3600);
    let elector = |c: ElectionConfig| {
        LeaderElector::new(
            Locker::with_identity(MemoryBackend::new(), "a").expect("valid"),
            "x",
            c,
        )
    };
    assert!(elector(ElectionConfig::new().store_unreachable_after(year)).is_ok());
    assert!(
        rule(ElectionConfig::new().store_unreachable_after(year + Duration::from_nanos(1)))
            .contains("store_unreachable_after must be at most 365 days")
    );
    assert!(matches!(
        LeaderElector::new(
            Locker::with_identity(MemoryBackend::new(), "a").expect("valid"),
            "",
            ElectionConfig::new()
        ),
        Err(ElectionError::Lock(tenure::LockError::InvalidName(_)))
    ));
}

#[cfg(feature = "healthz")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_ok_for_a_healthy_elector_and_404_elsewhere() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let e = elector(MemoryBackend::new(), "a", ElectionConfig::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(
        tenure::probe::ProbeServer::new(e.clone())
            .tolerance(Duration::ZERO)
            .serve(listener),
    );
    let get = |path: &'static str| async move {
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        c.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("send");
        let mut out = String::new();
        c.read_to_string(&mut out).await.expect("read");
        out
    };
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200 OK"));
    assert!(get("/other").await.starts_with("HTTP/1.1 404"));
    server.abort();
}

#[cfg(feature = "metrics")]
#[tokio::test(start_paused = true)]
async fn metrics_report_leadership_renewals_and_transitions() {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;
    let mut registry = Registry::default();
    let metrics = tenure::election::ElectionMetrics::register(&mut registry);
    let e = elector(MemoryBackend::new(), "a", ElectionConfig::new()).with_metrics(metrics);
    let registry = Arc::new(registry);
    let mut before = String::new();
    encode(&mut before, &registry).expect("encode");
    assert!(
        before.contains("leader_election_master_status{name=\"controller\"} 0"),
        "a follower reports 0 before any term, as client-go does: {before}"
    );
    let during = e
        .run(|_| {
            let registry = registry.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(12)).await;
                let mut text = String::new();
                encode(&mut text, &registry).expect("encode");
                text
            }
        })
        .await
        .expect("ran");
    assert!(
        during.contains("leader_election_master_status{name=\"controller\"} 1"),
        "{during}"
    );
    assert!(
        during.contains("tenure_leader_transitions_total{name=\"controller\"} 1"),
        "{during}"
    );
    // Renewals at 5 s and 10 s; samples every 5 s may see one or both (same-instant order).
    let renew_count: u64 = during
        .lines()
        .find_map(|l| l.strip_prefix("tenure_renew_latency_seconds_count{name=\"controller\"} "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(renew_count >= 1, "{during}");
    assert!(
        during.contains("tenure_acquire_latency_seconds_count{name=\"controller\"} 1"),
        "{during}"
    );
    let mut after = String::new();
    encode(&mut after, &registry).expect("encode");
    assert!(
        after.contains("leader_election_master_status{name=\"controller\"} 0"),
        "{after}"
    );
}

/// Runs `e` in a task whose workload never returns, once its term has begun.
async fn lead_forever(e: &LeaderElector) -> tokio::task::JoinHandle<Result<(), ElectionError>> {
    let (started, mut leading) = tokio::sync::mpsc::channel::<()>(1);
    let e = e.clone();
    let running = tokio::spawn(async move {
        e.run(|_| {
            let started = started.clone();
            async move {
                let _ = started.send(()).await;
                std::future::pending::<()>().await;
            }
        })
        .await
    });
    leading.recv().await.expect("the run leads");
    running
}

#[tokio::test(start_paused = true)]
async fn a_second_run_of_one_elector_is_refused_with_its_own_error() {
    let store = MemoryBackend::new();
    let e = elector(store, "a", ElectionConfig::new());
    let first = lead_forever(&e).await;
    let second = e.run(|_| async {}).await;
    assert!(
        matches!(second, Err(ElectionError::AlreadyRunning)),
        "{second:?}"
    );
    first.abort();
}

#[tokio::test(start_paused = true)]
async fn leader_stops_naming_this_replica_once_its_term_is_over() {
    let store = MemoryBackend::new();
    let e = elector(store.clone(), "a", ElectionConfig::new());
    let seen_while_leading = e
        .run(|_| {
            let e = e.clone();
            async move { e.leader().borrow().clone() }
        })
        .await
        .expect("the workload returned");
    assert_eq!(seen_while_leading.map(|l| l.identity).as_deref(), Some("a"));
    // The workload returned, the lease is released: "a" leads no more.
    assert_eq!(*e.leader().borrow(), None);

    // Also when run_until is dropped in the middle of a term.
    let running = lead_forever(&e).await;
    assert_eq!(
        e.leader()
            .borrow()
            .as_ref()
            .map(|l| l.identity.clone())
            .as_deref(),
        Some("a")
    );
    running.abort();
    let _ = running.await;
    assert_eq!(*e.leader().borrow(), None);
}

/// A side task spawned on the term: every 100 ms it checks that the store still names "a"
/// as the holder, counting the ticks and the ticks that found otherwise.
fn watchful_task(
    term: &tenure::Term,
    store: &MemoryBackend,
    ticks: &Arc<Mutex<(u32, u32)>>,
) -> tokio::task::JoinHandle<()> {
    let (store, ticks) = (store.clone(), ticks.clone());
    term.spawn(async move {
        loop {
            let ours = holder(&store).as_deref() == Some("a");
            {
                let mut t = ticks.lock().expect("not poisoned");
                t.0 += 1;
                if !ours {
                    t.1 += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

#[tokio::test(start_paused = true)]
async fn tasks_of_a_term_end_before_its_lease_is_released() {
    let store = MemoryBackend::new();
    let e = elector(store.clone(), "a", ElectionConfig::new());
    let ticks = Arc::new(Mutex::new((0, 0)));
    let (t, s) = (ticks.clone(), store.clone());
    let term = e
        .run(|term| {
            let (t, s) = (t.clone(), s.clone());
            async move {
                // Two tasks: the second spawn must not forget the first, still running.
                drop(watchful_task(&term, &s, &t));
                drop(watchful_task(&term, &s, &t));
                tokio::time::sleep(Duration::from_secs(1)).await;
                term
            }
        })
        .await
        .expect("the workload returned");
    assert_eq!(holder(&store), None, "released after the term");
    let at_end = *ticks.lock().expect("not poisoned");
    assert_eq!(at_end.1, 0, "a task ran while the lease was not ours");
    assert!(at_end.0 >= 10, "the task ran during the term: {at_end:?}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        *ticks.lock().expect("not poisoned"),
        at_end,
        "the task outlived its term"
    );
    // A task spawned once the term is over never runs.
    let late = term.spawn(async { "ran" });
    let joined = late.await;
    assert!(
        joined
            .as_ref()
            .is_err_and(tokio::task::JoinError::is_cancelled),
        "{joined:?}"
    );
}

/// A shutdown that lands while a campaign's request is out, its grant applied by the store
/// but not yet answered: the campaign is dropped and its possible grant released in the
/// background, and `run_until` returns only once that release is done, so a process that
/// exits when its run returns leaves no lease behind. Found by a loaded run: `tenure run
/// --shards`' graceful leave left a shard's Lease held until its ttl (`helm_chart`, #42).
#[tokio::test(start_paused = true)]
async fn a_shutdown_during_a_campaign_releases_its_grant_before_the_run_returns() {
    let store = MemoryBackend::new();
    let faulty = FaultyBackend::new(store.clone());
    faulty.set(Fault::DelayAnswers(Duration::from_secs(1)));
    let e = elector(faulty.clone(), "a", ElectionConfig::new());
    let shutdown = tokio::time::sleep(Duration::from_millis(500));
    let out = e.run_until(shutdown, |_term| async {}).await;
    assert!(matches!(out, Ok(None)), "a term ran: {out:?}");
    assert_eq!(
        faulty.counts().acquire,
        1,
        "the campaign's request went out"
    );
    assert_eq!(holder(&store), None, "the campaign's grant was left held");
}

/// Dropping the run mid-term (a caller's `select!` or timeout around it) ends the term the
/// way its end does: the term's tasks, even one that ignores cancellation, are aborted and
/// gone before the lease is released in the background, and that release comes at once, not
/// after the ttl. Found by the simulation's `abandon` fault: the tasks outlived the run.
#[tokio::test(start_paused = true)]
async fn a_dropped_run_ends_its_terms_tasks_before_the_background_release() {
    let store = MemoryBackend::new();
    let e = elector(store.clone(), "a", ElectionConfig::new());
    let ticks = Arc::new(Mutex::new((0, 0)));
    let (t, s) = (ticks.clone(), store.clone());
    let run = e.run(|term| {
        let (t, s) = (t.clone(), s.clone());
        async move {
            drop(watchful_task(&term, &s, &t));
            std::future::pending::<()>().await;
        }
    });
    let dropped = tokio::time::timeout(Duration::from_secs(2), run).await;
    assert!(dropped.is_err(), "the run ended by itself: {dropped:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(holder(&store), None, "not released in the background");
    let at_release = *ticks.lock().expect("not poisoned");
    assert_eq!(at_release.1, 0, "a task ran while the lease was not ours");
    assert!(
        at_release.0 >= 15,
        "the task ran during the term: {at_release:?}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        *ticks.lock().expect("not poisoned"),
        at_release,
        "the task outlived its dropped run"
    );
}

#[tokio::test(start_paused = true)]
async fn tasks_of_a_stolen_term_are_aborted_and_the_term_reports_the_theft() {
    let store = MemoryBackend::new();
    let e = elector(store.clone(), "a", ElectionConfig::new());
    let ticks = Arc::new(Mutex::new((0, 0)));
    let (t, s) = (ticks.clone(), store.clone());
    let task = Arc::new(Mutex::new(None));
    let kept = task.clone();
    let result = e
        .run(|term| {
            let (t, s, kept) = (t.clone(), s.clone(), kept.clone());
            async move {
                *kept.lock().expect("not poisoned") = Some(watchful_task(&term, &s, &t));
                tokio::time::sleep(Duration::from_secs(1)).await;
                let stolen = s.steal("controller", "b", Duration::from_secs(15));
                assert!(stolen > term.fencing_token());
                term.cancellation().cancelled().await;
                assert!(!term.is_valid());
                std::future::pending::<()>().await;
            }
        })
        .await;
    assert!(
        matches!(
            result,
            Err(ElectionError::Lost {
                reason: LostReason::NotHeld,
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(holder(&store).as_deref(), Some("b"), "the thief holds it");
    let handle = task.lock().expect("not poisoned").take().expect("spawned");
    assert!(
        handle.is_finished(),
        "the task was awaited before run returned"
    );
    let joined = handle.await;
    assert!(
        joined
            .as_ref()
            .is_err_and(tokio::task::JoinError::is_cancelled),
        "{joined:?}"
    );
    // The theft is seen at the first renewal (5 s in): the task saw "b" for about 4 s,
    // which a fence would refuse; it saw nothing after the term ended.
    let at_end = *ticks.lock().expect("not poisoned");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(*ticks.lock().expect("not poisoned"), at_end);
}

#[tokio::test(start_paused = true)]
async fn one_watch_serves_every_campaign_and_term_of_a_run() {
    let store = MemoryBackend::new();
    let faulty = FaultyBackend::new(store.clone());
    let e = elector(faulty.clone(), "a", ElectionConfig::new().rejoin(true));
    let terms = Arc::new(Mutex::new(0));
    let (n, s) = (terms.clone(), store.clone());
    let stop = async {
        while *terms.lock().expect("not poisoned") < 3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    e.run_until(stop, |term| {
        let (n, s) = (n.clone(), s.clone());
        async move {
            *n.lock().expect("not poisoned") += 1;
            // Each term is lost to a thief whose lease then runs out: campaign, lead, lose.
            s.steal("controller", "b", Duration::from_secs(1));
            term.cancellation().cancelled().await;
        }
    })
    .await
    .expect("ran");
    assert_eq!(*terms.lock().expect("not poisoned"), 3);
    assert_eq!(
        faulty.counts().observe,
        1,
        "three terms and their campaigns followed the store through one watch"
    );
}

#[tokio::test(start_paused = true)]
async fn a_follower_cut_off_from_the_store_reports_it_and_recovers() {
    let store = MemoryBackend::new();
    let config = || ElectionConfig::new();
    let a = elector(store.clone(), "a", config());
    let leading = lead_forever(&a).await;
    let faulty = FaultyBackend::new(store.clone());
    let b = elector(faulty.clone(), "b", config());
    assert_eq!(b.health(Duration::ZERO).store_silence, None, "not running");
    let following = tokio::spawn({
        let b = b.clone();
        async move { b.run(|_| async {}).await }
    });
    tokio::time::sleep(Duration::from_secs(20)).await;
    let h = b.health(Duration::ZERO);
    assert!(h.store_reachable && h.healthy && !h.leading, "{h:?}");
    assert!(
        h.store_silence
            .is_some_and(|s| s <= Duration::from_secs(16)),
        "a follower hears from the store once a lease: {h:?}"
    );
    assert!(a.health(Duration::ZERO).store_reachable);

    faulty.set(Fault::Fail);
    // 2 × lease + retry = 32 s of silence at most before it says so.
    tokio::time::sleep(Duration::from_secs(33)).await;
    let h = b.health(Duration::ZERO);
    assert!(!h.store_reachable, "{h:?}");
    assert!(
        h.healthy,
        "a follower's liveness does not depend on the store"
    );
    assert!(
        h.store_silence.is_some_and(|s| s > Duration::from_secs(32)),
        "{h:?}"
    );

    faulty.set(Fault::Healthy);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let h = b.health(Duration::ZERO);
    assert!(h.store_reachable, "heard from the store again: {h:?}");
    following.abort();
    leading.abort();
}

#[test]
fn a_zero_store_silence_limit_is_refused() {
    let locker = Locker::with_identity(MemoryBackend::new(), "a").expect("identity");
    let refused = LeaderElector::new(
        locker,
        "controller",
        ElectionConfig::new().store_unreachable_after(Duration::ZERO),
    );
    assert!(
        matches!(&refused, Err(ElectionError::InvalidConfig { rule }) if rule.contains("store_unreachable_after")),
        "{refused:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_test_term_is_a_real_term_that_ends_on_request() {
    use tenure::election::TestTerm;
    let test = TestTerm::begin("controller", "a").await.expect("a term");
    let term = test.term();
    assert!(term.is_valid());
    assert_eq!((term.lease_name(), term.identity()), ("controller", "a"));
    assert_eq!(holder(test.store()).as_deref(), Some("a"));
    // It renews like any term: still valid well past one lease duration.
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert!(term.is_valid());
    let store = test.store().clone();
    test.end().await.expect("ended without a loss");
    assert!(term.cancellation().is_cancelled() && !term.is_valid());
    assert_eq!(holder(&store), None, "released");

    let refused = TestTerm::begin("controller", &"x".repeat(300)).await;
    assert!(
        matches!(refused, Err(ElectionError::Lock(_))),
        "{refused:?}"
    );
}

/// The memory backend without its group records (`Backend::group_record`'s default: "keeps
/// no group membership", a permanent error), and with `refuse_acquire` refusing every
/// acquire for good (a missing permission).
struct NoGroups {
    store: MemoryBackend,
    refuse_acquire: bool,
}

impl Backend for NoGroups {
    fn validate_name(&self, name: &str) -> Result<(), tenure::backend::InvalidName> {
        self.store.validate_name(name)
    }
    fn try_acquire<'a>(
        &'a self,
        request: &'a tenure::backend::AcquireRequest,
    ) -> futures::future::BoxFuture<
        'a,
        Result<tenure::backend::Acquired, tenure::backend::BackendError>,
    > {
        if !self.refuse_acquire {
            return self.store.try_acquire(request);
        }
        Box::pin(std::future::ready(Err(tenure::backend::BackendError::new(
            tenure::backend::BackendErrorKind::PermissionDenied,
            "may not update leases",
        ))))
    }
    fn renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a tenure::backend::HolderToken,
        ttl: Duration,
    ) -> futures::future::BoxFuture<
        'a,
        Result<tenure::backend::Renewed, tenure::backend::BackendError>,
    > {
        self.store.renew(name, holder, ttl)
    }
    fn release<'a>(
        &'a self,
        name: &'a str,
        holder: &'a tenure::backend::HolderToken,
    ) -> futures::future::BoxFuture<
        'a,
        Result<tenure::backend::Released, tenure::backend::BackendError>,
    > {
        self.store.release(name, holder)
    }
    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> futures::future::BoxFuture<
        'a,
        Result<Option<tenure::backend::LeaseRecord>, tenure::backend::BackendError>,
    > {
        self.store.inspect(name)
    }
    fn observe(
        &self,
        name: &str,
    ) -> futures::stream::BoxStream<
        'static,
        Result<tenure::backend::HolderChange, tenure::backend::BackendError>,
    > {
        self.store.observe(name)
    }
}

#[tokio::test(start_paused = true)]
async fn a_permanent_store_refusal_ends_the_campaign_instead_of_retrying() {
    let refusing = NoGroups {
        store: MemoryBackend::new(),
        refuse_acquire: true,
    };
    let e = elector(refusing, "a", ElectionConfig::new());
    let result = tokio::time::timeout(Duration::from_secs(60), e.run(|_| async {}))
        .await
        .expect("a permanent refusal ends run, it is not retried forever");
    assert!(
        matches!(&result, Err(ElectionError::Lock(tenure::LockError::Backend(b)))
            if b.kind() == tenure::backend::BackendErrorKind::PermissionDenied),
        "{result:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewals_fail_stays_healthy_within_its_renew_deadline() {
    let faulty = FaultyBackend::new(MemoryBackend::new());
    let e = elector(faulty.clone(), "a", ElectionConfig::new());
    let watcher = e.clone();
    e.run(|term| {
        let (watcher, faulty) = (watcher.clone(), faulty.clone());
        async move {
            // Renewed at 5 s; the store fails from 6 s on; the renew deadline is 15 s.
            tokio::time::sleep(Duration::from_secs(6)).await;
            faulty.set(Fault::Fail);
            tokio::time::sleep(Duration::from_secs(8)).await;
            let h = watcher.health(Duration::from_secs(4));
            assert!(h.leading && term.is_valid(), "{h:?}");
            assert_eq!(h.since_last_renewal, Some(Duration::from_secs(9)));
            // 9 s since the last renewal, within the 10 s renew deadline + 4 s tolerance.
            assert!(h.healthy, "{h:?}");
        }
    })
    .await
    .expect("ran");
}

#[tokio::test(start_paused = true)]
async fn a_store_failing_for_a_while_delays_the_campaign_and_it_then_leads() {
    let faulty = FaultyBackend::new(MemoryBackend::new());
    faulty.set(Fault::Fail);
    let e = elector(faulty.clone(), "a", ElectionConfig::new());
    let healer = faulty.clone();
    tokio::spawn(async move {
        // Longer than the campaign's acquire window (4 × lease = 60 s): the locker gives the
        // transient error up to the campaign, which must retry it.
        tokio::time::sleep(Duration::from_secs(70)).await;
        healer.set(Fault::Healthy);
    });
    let started = Instant::now();
    let led_at = e
        .run(|term| async move { term.started_at() })
        .await
        .expect("a transient failure is retried, not returned");
    assert!(
        led_at - started >= Duration::from_secs(70),
        "led at {:?}, while the store was failing",
        led_at - started
    );
}

/// A memory store holding the record of sharded group `web`, 4 shards.
async fn with_group_web() -> MemoryBackend {
    let store = MemoryBackend::new();
    assert!(
        store
            .swap_group_record("web", None, &tenure::backend::GroupRecord::first(4))
            .await
            .expect("memory answers")
    );
    store
}

/// A plain election named like shard N of a sharded group that exists is refused before it
/// campaigns (the group's lease stays free); names off the scheme, and shards of a group
/// that does not exist, run.
#[tokio::test(start_paused = true)]
async fn a_plain_election_named_like_a_groups_shard_is_refused() {
    let store = with_group_web().await;
    let locker = Locker::with_identity(store.clone(), "plain").expect("valid identity");
    let refused = LeaderElector::new(locker.clone(), "web-2", ElectionConfig::default())
        .expect("valid config")
        .run(|_| async {})
        .await;
    match refused {
        Err(ElectionError::ShardLease { name, group, shard }) => {
            assert_eq!((name.as_str(), group.as_str(), shard), ("web-2", "web", 2));
        }
        other => panic!("expected ShardLease, got {other:?}"),
    }
    assert_eq!(store.inspect("web-2").await.expect("memory answers"), None);

    for runs in ["web-02", "web-x", "api-2"] {
        let elector =
            LeaderElector::new(locker.clone(), runs, ElectionConfig::default()).expect("valid");
        let token = elector
            .run(|term| async move { term.fencing_token() })
            .await;
        assert!(token.is_ok(), "{runs}: {token:?}");
    }
}

/// Whether a lease named like a shard is a group's is read before the campaign: a transient
/// failure of that read is retried (so the group, once read, refuses the run), and a store
/// that cannot tell (it keeps no groups) lets the run go on.
#[tokio::test(start_paused = true)]
async fn the_shard_name_check_retries_a_transient_failure_and_goes_on_when_the_store_cannot_tell() {
    let store = with_group_web().await;
    let faulty = FaultyBackend::new(store.clone());
    faulty.set(Fault::Fail);
    let heal = {
        let faulty = faulty.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            faulty.heal();
        })
    };
    let locker = Locker::with_identity(faulty, "plain").expect("valid identity");
    let refused = LeaderElector::new(locker, "web-2", ElectionConfig::default())
        .expect("valid config")
        .run(|_| async {})
        .await;
    assert!(
        matches!(&refused, Err(ElectionError::ShardLease { shard: 2, .. })),
        "a transient failure of the group read let a group's shard run as a plain election: {refused:?}"
    );
    heal.await.expect("the healer ran");
    assert_eq!(store.inspect("web-2").await.expect("memory answers"), None);

    let cannot_tell = NoGroups {
        store: MemoryBackend::new(),
        refuse_acquire: false,
    };
    let locker = Locker::with_identity(cannot_tell, "plain").expect("valid identity");
    let elector = LeaderElector::new(locker, "web-2", ElectionConfig::default()).expect("valid");
    let led = tokio::time::timeout(
        Duration::from_secs(60),
        elector.run(|term| async move { term.fencing_token() }),
    )
    .await
    .expect("a store that keeps no groups kept the run from leading");
    assert!(led.is_ok(), "{led:?}");
}

/// A fresh directory for restart locks.
fn restart_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tenure-election-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The fencing token of the lease's current holder.
fn token(store: &MemoryBackend) -> u64 {
    record(store).map(|r| r.fencing.get()).expect("held")
}

/// The first process of replica `pod-a`: it took the restart lock in `dir` and leads through
/// `faulty` (set it to stall to cut the process off from `store`). Returns its elector, its
/// run and its term's token.
async fn first_process_with_restart_lock(
    dir: &std::path::Path,
    store: &MemoryBackend,
    faulty: &FaultyBackend,
) -> (
    LeaderElector,
    tokio::task::JoinHandle<Result<(), ElectionError>>,
    u64,
) {
    let lock = RestartLock::take(dir, "controller", Duration::ZERO)
        .await
        .expect("takes")
        .expect("free");
    let e = elector(faulty.clone(), "pod-a", ElectionConfig::new()).with_restart_lock(lock);
    let task = lead_forever(&e).await;
    (e, task, token(store))
}

/// The previous process of this replica (same identity, same directory) died holding the
/// lease: it can no longer reach the store, and its elector — its restart lock with it — is
/// gone. The restart takes the free lock, ends the recorded term and leads at once, with a
/// higher token; without the lock it would wait the whole lease (15 s).
#[tokio::test(start_paused = true)]
async fn a_restart_of_a_replica_whose_process_is_gone_leads_at_once() {
    let dir = restart_dir("gone");
    let store = MemoryBackend::new();
    let faulty = FaultyBackend::new(store.clone());
    let (e, task, first) = first_process_with_restart_lock(&dir, &store, &faulty).await;
    faulty.set(Fault::Stall);
    task.abort();
    let _ = task.await;
    drop(e);
    assert_eq!(
        holder(&store).as_deref(),
        Some("pod-a"),
        "its lease outlives it"
    );

    let lock = RestartLock::take(&dir, "controller", Duration::from_secs(1))
        .await
        .expect("takes")
        .expect("free: the previous process is gone");
    let restarted = elector(store.clone(), "pod-a", ElectionConfig::new()).with_restart_lock(lock);
    let started = Instant::now();
    let (token, after) = restarted
        .run(|term| async move { (term.fencing_token().get(), started.elapsed()) })
        .await
        .expect("leads");
    assert!(token > first, "a new term: {token} after {first}");
    assert!(after < Duration::from_secs(1), "led after {after:?}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// The previous process is alive but cut off from the store (or frozen): it keeps its restart
/// lock, so the restart gets none, ends nothing, and leads only once the lease has expired.
#[tokio::test(start_paused = true)]
async fn a_restart_while_the_previous_process_lives_waits_for_the_lease() {
    let dir = restart_dir("alive");
    let store = MemoryBackend::new();
    let faulty = FaultyBackend::new(store.clone());
    let (_alive, task, first) = first_process_with_restart_lock(&dir, &store, &faulty).await;
    let cut_off = Instant::now();
    faulty.set(Fault::Stall);
    assert!(
        RestartLock::take(&dir, "controller", Duration::from_millis(100))
            .await
            .expect("no error")
            .is_none(),
        "held by the live process"
    );
    let restarted = elector(store.clone(), "pod-a", ElectionConfig::new());
    let (token, at) = restarted
        .run(|term| async move { (term.fencing_token().get(), cut_off.elapsed()) })
        .await
        .expect("leads");
    assert!(token > first);
    assert!(
        at >= Duration::from_secs(10),
        "led {at:?} after the first was cut off"
    );
    task.abort();
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// A restart record is a file: a holder token copied into it from another replica's lease
/// (anyone who can read the store can read one) under this replica's identity must not end
/// that replica's term. The restart releases only what the store says this identity holds
/// with that token, so replica b keeps its lease and a leads only once b's lease is gone.
#[tokio::test(start_paused = true)]
async fn a_restart_record_naming_another_replicas_token_ends_nothing() {
    let dir = restart_dir("forged");
    let store = MemoryBackend::new();
    // Replica b holds the lease with holder token `b_holder` (the forger read it).
    let b_holder = tenure::backend::HolderToken::random();
    let granted = store
        .try_acquire(&tenure::backend::AcquireRequest {
            name: "controller".into(),
            holder: b_holder,
            identity: "pod-b".into(),
            ttl: Duration::from_secs(15),
        })
        .await
        .expect("memory answers");
    assert!(matches!(granted, tenure::backend::Acquired::Granted { .. }));
    let b_token = token(&store);
    // a's restart record, forged: b's token under a's identity.
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("controller.restart"),
        format!(
            "tenure-restart v2\nholder {} 10 controller pod-a\n",
            b_holder.to_hex()
        ),
    )
    .expect("write");
    let lock = RestartLock::take(&dir, "controller", Duration::ZERO)
        .await
        .expect("takes")
        .expect("free");
    let a = elector(store.clone(), "pod-a", ElectionConfig::new()).with_restart_lock(lock);
    let started = Instant::now();
    let led = a
        .run(|term| async move { (term.fencing_token().get(), started.elapsed()) })
        .await
        .expect("leads");
    assert!(
        led.1 >= Duration::from_secs(14),
        "a led {:?} after its restart: the forged record ended b's term",
        led.1
    );
    assert!(led.0 > b_token);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// #42: with no request timeout set, a campaign attempt and a renewal may take until the renew
/// deadline. A store that applies each request at once but answers 400 ms late (an API server
/// under CPU load) had every one cut at half the retry period (250 ms): the grant landed, its
/// replay was cut too, and no term ever began. Now the term begins and is renewed, each
/// validity counted from its request's send, not from the late answer.
#[tokio::test(start_paused = true)]
async fn a_store_answering_late_still_grants_and_renews_a_term() {
    let store = MemoryBackend::new();
    let faulty = FaultyBackend::new(store.clone());
    faulty.set(Fault::DelayAnswers(Duration::from_millis(400)));
    let lease = Duration::from_secs(3);
    let config = ElectionConfig::new()
        .lease_duration(lease)
        .renew_deadline(Duration::from_secs(2))
        .retry_period(Duration::from_millis(500))
        .stop_margin(Duration::from_millis(300));
    let e = elector(faulty.clone(), "a", config);
    let notices = Arc::new(Mutex::new(Vec::new()));
    let seen = notices.clone();
    let run = e.run(|term| {
        let seen = seen.clone();
        async move {
            term.on_renewal(move |valid_until| {
                // Counted from the send, a validity ends at least the answer's delay sooner
                // than a lease after the answer (now, or later at registration).
                seen.lock()
                    .expect("not poisoned")
                    .push(valid_until + Duration::from_millis(400) <= Instant::now() + lease);
            });
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(9)) => "held",
                () = term.cancellation().cancelled() => "lost",
            }
        }
    });
    let outcome = tokio::time::timeout(Duration::from_secs(30), run).await;
    assert!(
        matches!(outcome, Ok(Ok("held"))),
        "{outcome:?} after {} acquire request(s)",
        faulty.counts().acquire
    );
    let notices = notices.lock().expect("not poisoned");
    assert!(notices.len() >= 6, "renewed {} time(s)", notices.len());
    assert!(
        notices.iter().all(|ok| *ok),
        "a validity past a lease: {notices:?}"
    );
}
