//! The probes of one [`LeaderElector`]: liveness follows the leader's renewals (and the store
//! only when asked), readiness follows the store and knowing who leads.

use std::time::Duration;

use hyper::StatusCode;

use super::{Answer, TEXT};
use crate::election::{Health, LeaderElector};

/// `/healthz`: fails when this process leads without a renewal for longer than the renew
/// deadline + `tolerance` (a stuck process) and, with `store_liveness`, while the store has
/// been silent towards it for too long.
pub(super) fn liveness(
    elector: &LeaderElector,
    tolerance: Duration,
    store_liveness: bool,
) -> Answer {
    let h = elector.health(tolerance);
    if store_liveness && !h.store_reachable {
        store_unreachable(&h)
    } else if h.healthy {
        (StatusCode::OK, TEXT, "ok\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            format!(
                "leader without a renewal for {:?} (renew deadline + tolerance exceeded)\n",
                h.since_last_renewal.unwrap_or_default()
            ),
        )
    }
}

/// `/readyz`: ready while leading, or while following a known leader and hearing from the
/// store.
pub(super) fn readiness(elector: &LeaderElector, tolerance: Duration) -> Answer {
    let h = elector.health(tolerance);
    if elector.is_leader() {
        (StatusCode::OK, TEXT, "leading\n".to_owned())
    } else if !h.store_reachable {
        store_unreachable(&h)
    } else if let Some(leader) = elector.leader().borrow().as_ref() {
        (
            StatusCode::OK,
            TEXT,
            format!("following {}\n", leader.identity.escape_debug()),
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "no leader known yet\n".to_owned(),
        )
    }
}

/// The answer of a probe that fails because the store has been silent for too long.
fn store_unreachable(h: &Health) -> Answer {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        TEXT,
        format!(
            "store unreachable: no answer for {:?}\n",
            h.store_silence.unwrap_or_default()
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hyper::{Method, StatusCode};

    use super::super::ProbeServer;
    use super::super::tests::request;
    use crate::Locker;
    use crate::backend::Backend;
    use crate::backend::memory::MemoryBackend;
    use crate::election::{ElectionConfig, LeaderElector};

    #[tokio::test]
    async fn readyz_escapes_control_characters_in_the_leader_identity() {
        let store = MemoryBackend::new();
        let evil = "pod\u{1b}[2J\r\nfollowing forged\\\u{7}";
        let req = crate::backend::AcquireRequest {
            name: "probe".into(),
            holder: crate::backend::HolderToken::random(),
            identity: evil.into(),
            ttl: Duration::from_secs(3600),
        };
        store.try_acquire(&req).await.expect("memory never fails");
        let locker = Locker::with_identity(store, "me").expect("valid identity");
        let elector =
            LeaderElector::new(locker, "probe", ElectionConfig::new()).expect("valid config");
        let mut leader = elector.leader();
        let campaign = {
            let elector = elector.clone();
            tokio::spawn(async move { elector.run(|_term| std::future::pending::<()>()).await })
        };
        tokio::time::timeout(
            Duration::from_secs(30),
            leader.wait_for(|l| l.as_ref().is_some_and(|l| l.identity == evil)),
        )
        .await
        .expect("the campaign sees the holder")
        .expect("the elector lives");
        let r = ProbeServer::new(elector).respond(&request(Method::GET, "/readyz"));
        campaign.abort();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.body(),
            "following pod\\u{1b}[2J\\r\\nfollowing forged\\\\\\u{7}\n"
        );
        assert!(
            !r.body()
                .trim_end_matches('\n')
                .chars()
                .any(char::is_control)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_cut_off_from_the_store_is_unready_and_live_unless_asked() {
        use crate::backend::faulty::{Fault, FaultyBackend};
        let store = MemoryBackend::new();
        let req = crate::backend::AcquireRequest {
            name: "probe".into(),
            holder: crate::backend::HolderToken::random(),
            identity: "leader".into(),
            ttl: Duration::from_secs(3600),
        };
        store.try_acquire(&req).await.expect("memory never fails");
        let faulty = FaultyBackend::new(store);
        let locker = Locker::with_identity(faulty.clone(), "me").expect("valid identity");
        let elector =
            LeaderElector::new(locker, "probe", ElectionConfig::new()).expect("valid config");
        let campaign = {
            let elector = elector.clone();
            tokio::spawn(async move { elector.run(|_term| std::future::pending::<()>()).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let probes = ProbeServer::new(elector.clone());
        let strict = ProbeServer::new(elector).store_liveness(true);
        let ready = probes.respond(&request(Method::GET, "/readyz"));
        assert_eq!(ready.status(), StatusCode::OK, "{}", ready.body());
        assert_eq!(ready.body(), "following leader\n");

        faulty.set(Fault::Fail);
        tokio::time::sleep(Duration::from_secs(40)).await;
        let ready = probes.respond(&request(Method::GET, "/readyz"));
        assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            ready
                .body()
                .starts_with("store unreachable: no answer for "),
            "{}",
            ready.body()
        );
        let live = probes.respond(&request(Method::GET, "/healthz"));
        assert_eq!(live.status(), StatusCode::OK, "liveness ignores the store");
        let live = strict.respond(&request(Method::GET, "/healthz"));
        assert_eq!(
            live.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "unless asked"
        );
        campaign.abort();
    }
}
