//! The probes of a replica of sharded leadership: liveness catches a runtime that no longer
//! ends its shards' terms, readiness follows membership of the group.

use std::time::Duration;

use hyper::StatusCode;

use super::{Answer, TEXT};
use crate::shard::{GroupStatus, ShardedElector};

/// `/readyz` of a sharded replica: ready once it is a member of its group's assignment,
/// also while it waits for the group to change to its shard count (a rolling update that
/// changes the count completes only if the new replicas are ready while the old ones run);
/// not ready while the group record cannot be parsed.
pub(super) fn readiness(sharded: &ShardedElector) -> Answer {
    let status = sharded.group().borrow().clone();
    if let GroupStatus::Damaged { reason } = status {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            format!("the group record cannot be parsed ({reason}): no shard runs\n"),
        );
    }
    let identity = sharded.identity();
    let member = sharded
        .assignment()
        .borrow()
        .members
        .iter()
        .any(|m| m.identity == identity);
    if member {
        let held = sharded.owned().borrow().len();
        let waiting = match status {
            GroupStatus::Waiting { record } => {
                format!("; waiting: the group record says {record}")
            }
            _ => String::new(),
        };
        (
            StatusCode::OK,
            TEXT,
            format!(
                "member of {}, holding {held} shards{waiting}\n",
                sharded.name().escape_debug()
            ),
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "not a member of the group yet\n".to_owned(),
        )
    }
}

/// `/healthz` of a sharded replica: fails while a held shard's term, not ended, is past its
/// lease by more than `tolerance`. A term's elector ends it at the renew deadline, before the
/// lease runs out, so such a term means the runtime is not running the electors.
pub(super) fn liveness(sharded: &ShardedElector, tolerance: Duration) -> Answer {
    let now = tokio::time::Instant::now();
    let owned = sharded.owned().borrow().clone();
    let stuck = owned.into_iter().find_map(|shard| {
        let term = sharded.term(shard)?;
        let late = now.checked_duration_since(term.valid_until())?;
        (late > tolerance && !term.cancellation().is_cancelled()).then_some((shard, late))
    });
    match stuck {
        None => (StatusCode::OK, TEXT, "ok\n".to_owned()),
        Some((shard, late)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            format!(
                "shard {shard}'s term outlived its lease by {late:?} without ending (lease + tolerance exceeded)\n"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hyper::{Method, StatusCode};

    use super::super::ProbeServer;
    use super::super::tests::request;
    use crate::Locker;
    use crate::backend::memory::MemoryBackend;
    use crate::election::ElectionConfig;
    use crate::shard::ShardedElector;

    #[tokio::test(start_paused = true)]
    async fn a_sharded_replica_is_ready_once_a_member_of_its_group() {
        let locker = Locker::with_identity(MemoryBackend::new(), "me").expect("valid identity");
        let sharded =
            ShardedElector::new(locker, "workers", 4, ElectionConfig::new()).expect("valid config");
        let probes = ProbeServer::sharded(sharded.clone());
        let ready = probes.respond(&request(Method::GET, "/readyz"));
        assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            probes.respond(&request(Method::GET, "/healthz")).status(),
            StatusCode::OK
        );
        let run = tokio::spawn({
            let sharded = sharded.clone();
            async move {
                sharded
                    .run_until(std::future::pending(), |_, term| async move {
                        term.cancellation().cancelled().await;
                    })
                    .await
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let ready = probes.respond(&request(Method::GET, "/readyz"));
        assert_eq!(ready.status(), StatusCode::OK);
        assert_eq!(ready.body(), "member of workers, holding 4 shards\n");
        assert_eq!(
            probes.respond(&request(Method::GET, "/nope")).status(),
            StatusCode::NOT_FOUND
        );
        run.abort();
    }

    /// A sharded replica whose runtime is stuck (here: a workload blocking the only thread):
    /// its held terms outlive their leases without being ended, and `/healthz` says so, while a
    /// healthy replica's answer stays `200`. The probe is answered from another thread, as a
    /// server on a runtime of its own would.
    #[test]
    fn a_sharded_replica_whose_runtime_is_stuck_fails_healthz() {
        let locker = Locker::with_identity(MemoryBackend::new(), "me").expect("valid identity");
        let config = ElectionConfig::new()
            .lease_duration(Duration::from_millis(1000))
            .renew_deadline(Duration::from_millis(700))
            .retry_period(Duration::from_millis(100))
            .stop_margin(Duration::from_millis(100));
        let sharded = ShardedElector::new(locker, "workers", 2, config).expect("valid config");
        let probes = ProbeServer::sharded(sharded.clone()).tolerance(Duration::from_millis(200));
        let block = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let runner = std::thread::spawn({
            let (sharded, block) = (sharded.clone(), block.clone());
            move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let stop = tokio::time::sleep(Duration::from_secs(6));
                    sharded
                        .run_until(stop, move |_, term| {
                            let block = block.clone();
                            async move {
                                loop {
                                    if block.load(std::sync::atomic::Ordering::SeqCst) {
                                        // Stuck: the thread is gone for 2.5 leases.
                                        std::thread::sleep(Duration::from_millis(2500));
                                        block.store(false, std::sync::atomic::Ordering::SeqCst);
                                    }
                                    tokio::select! {
                                        () = term.cancellation().cancelled() => return,
                                        () = tokio::time::sleep(Duration::from_millis(20)) => {}
                                    }
                                }
                            }
                        })
                        .await
                })
            }
        });
        let healthz = || probes.respond(&request(Method::GET, "/healthz"));
        let held = std::time::Instant::now();
        while sharded.owned().borrow().len() < 2 {
            assert!(
                held.elapsed() < Duration::from_secs(3),
                "never held both shards"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Leading and renewing: healthy through several leases' worth of renewals.
        for _ in 0..15 {
            assert_eq!(healthz().status(), StatusCode::OK, "{:?}", healthz().body());
            std::thread::sleep(Duration::from_millis(100));
        }
        block.store(true, std::sync::atomic::Ordering::SeqCst);
        // The lease (1 s) and the tolerance (0.2 s) pass while the thread is blocked.
        std::thread::sleep(Duration::from_millis(1800));
        let stuck = healthz();
        // The same moment with a tolerance longer than the stall: still live.
        let lenient = ProbeServer::sharded(sharded.clone()).tolerance(Duration::from_secs(10));
        let patient = lenient.respond(&request(Method::GET, "/healthz"));
        assert_eq!(patient.status(), StatusCode::OK, "{:?}", patient.body());
        assert_eq!(stuck.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            stuck.body().contains("outlived its lease"),
            "{:?}",
            stuck.body()
        );
        let _ = runner.join().expect("the runner ends");
    }
}
