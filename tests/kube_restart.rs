//! The API server stops while a lease is held, and comes back.
//!
//! "Restart" here is honest: the launcher stops (kube-apiserver *and* its embedded etcd) and
//! starts again on the same port with the same etcd data directory and credentials, like a
//! control-plane node rebooting. The Lease and etcd's revision counter survive, so fencing
//! tokens keep rising; old clients keep working. (A launcher started from scratch would be a
//! different cluster, whose resourceVersions restart near zero: tenure refuses such a grant,
//! see `tenure::backend::kube`.)

mod kube_support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube_support::{Launch, Server, free_port, fresh_dir, unique};
use tenure::backend::{Backend, BackendErrorKind, HolderChange};
use tenure::conformance::FencedRegister;
use tenure::{LeaseEnd, LockError, LockOptions, Locker, LostReason};
use tokio::time::Instant;

const NS: &str = "default";
const TTL: Duration = Duration::from_secs(10);
const RENEW_DEADLINE: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_stopped_while_a_lease_is_held() {
    let server = Server::start(Launch {
        port: Some(free_port()),
        etcd_dir: Some(fresh_dir("etcd")),
        reuse_credentials: true,
        // Open watches (HTTP/1.1 streams) would otherwise hold the stop for the apiserver's
        // 60 s shutdown timeout; in this mode it waits 2 s for them.
        extra: vec!["--shutdown-send-retry-after=true".into()],
    });
    let name = unique("outage");
    // Requests to the stopped server fail at once (the port is closed), so no short bound is
    // needed to notice the outage; while the server is up, each request may take 2 s, which a
    // fresh server on a loaded machine needs now and then (a 400-500 ms bound failed the
    // first, single-shot acquire, #42). A renewal is cut at its deadline whatever the bound.
    let opts = LockOptions::new()
        .ttl(TTL)
        .renew_deadline(RENEW_DEADLINE)
        .retry_interval(Duration::from_millis(500))
        .request_timeout(Duration::from_secs(2));
    let register = std::sync::Arc::new(FencedRegister::default());

    let holder = Locker::with_identity(server.backend(NS).await, "holder").expect("identity");
    let lease = holder
        .try_acquire(&name, &opts.clone().auto_renew(true))
        .await
        .expect("free lock");
    let first = lease.fencing_token();
    register.enter(first);

    // A candidate in "another process" (its own backend, its own observations) waits.
    let candidate_backend = server.backend(NS).await;
    let candidate =
        Locker::with_identity(candidate_backend.clone(), "candidate").expect("identity");
    let (n, o, reg) = (
        name.clone(),
        opts.clone().wait(Duration::from_secs(90)),
        register.clone(),
    );
    let waiting = tokio::spawn(async move {
        let lease = candidate.acquire(&n, &o).await?;
        let at = Instant::now();
        reg.enter(lease.fencing_token());
        Ok::<_, tenure::LockError>((lease, at))
    });

    tokio::time::sleep(Duration::from_millis(1000)).await;
    let stopping = Instant::now();
    tokio::task::block_in_place(|| server.stop());
    let stopped = Instant::now();
    eprintln!("server stopped in {:?}", stopped - stopping);

    // While it is down, requests fail as transient "unavailable" errors.
    let e = candidate_backend
        .inspect(&name)
        .await
        .expect_err("the server is down");
    assert!(
        matches!(
            e.kind(),
            BackendErrorKind::Unavailable | BackendErrorKind::Timeout
        ),
        "{e}"
    );

    // The holder's term ends by its renew deadline, measured from its last successful renewal
    // (with a second for this test's wake-up on a loaded machine: the validity, which the
    // term would last without the deadline, is 6 s later).
    let end = tokio::time::timeout(TTL, lease.lost())
        .await
        .expect("the holder's term must end while the server is down");
    let lost_at = Instant::now();
    assert!(
        matches!(end, LeaseEnd::Lost(LostReason::RenewDeadline)),
        "ended with {end:?}"
    );
    let validity = TTL - (TTL.mul_f64(0.01) + Duration::from_millis(2));
    let last_success = lease.valid_until() - validity;
    assert!(
        lost_at <= last_success + RENEW_DEADLINE + Duration::from_secs(1),
        "lost {:?} after the last renewal; the renew deadline is {RENEW_DEADLINE:?}",
        lost_at - last_success
    );
    assert!(!lease.is_valid());
    register.leave(first);
    assert!(
        !waiting.is_finished(),
        "nobody can acquire while the server is down"
    );

    tokio::task::block_in_place(|| server.restart());
    let restarted = Instant::now();
    eprintln!("server back {:?} after the stop", restarted - stopped);

    let (next, acquired_at) = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the candidate must take over once the server is back")
        .expect("candidate task")
        .expect("candidate acquired");
    assert!(
        acquired_at >= lease.valid_until(),
        "the candidate acquired {:?} before the old holder's validity ended",
        lease.valid_until() - acquired_at
    );
    assert!(
        acquired_at >= last_success + TTL,
        "the candidate must wait the lease duration ({TTL:?}) on its own clock since it \
         last saw the record change (at or after {:?} before the outage)",
        stopping - last_success
    );
    assert!(
        next.fencing_token() > first,
        "the new term's token {} must exceed the old {first}",
        next.fencing_token()
    );
    register.leave(next.fencing_token());
    eprintln!(
        "old token {first}, new token {}, taken over {:?} after the holder's last renewal",
        next.fencing_token(),
        acquired_at - last_success
    );
    next.release().await.expect("release");
    // The old holder's release cannot touch the successor.
    assert!(lease.release().await.is_err());
    drop(server);
}

/// Issue #26: a sharded group's joint watch (one label-selected watch over every shard Lease)
/// breaks when the API server stops and comes back by itself: after the restart the follower
/// hears a member's grant through it, and its view of a dead holder's shard still frees the
/// shard one lease after the last renewal — not before, and not never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_joint_watch_comes_back_after_the_api_server_restarts() {
    let server = Server::start(Launch {
        port: Some(free_port()),
        etcd_dir: Some(fresh_dir("etcd")),
        reuse_credentials: true,
        extra: vec!["--shutdown-send-retry-after=true".into()],
    });
    let group = unique("joint-restart");
    let leases: Vec<String> = (0..4).map(|s| format!("{group}-{s}")).collect();
    // Each request may take 2 s of the 3 s lease: the single-shot acquire and release below
    // expect an answer from a fresh server on a possibly loaded machine (#42).
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .request_timeout(Duration::from_secs(2));

    let follower = Arc::new(server.backend(NS).await);
    let _joint = follower.follow_shard_leases(&group, &leases);
    let mut changes = follower.observe(&leases[2]);
    let first = tokio::time::timeout(Duration::from_secs(5), changes.next())
        .await
        .expect("state at subscription");
    assert_eq!(first.and_then(Result::ok), Some(HolderChange::free()));

    let member_backend = Arc::new(server.backend(NS).await);
    let _member_joint = member_backend.follow_shard_leases(&group, &leases);
    let member = Locker::with_identity(member_backend, "member").expect("identity");
    let held = member
        .try_acquire(&leases[2], &opts)
        .await
        .expect("free lock");
    let heard = next_holder(&mut changes, Duration::from_secs(5)).await;
    assert_eq!(heard.holder.as_deref(), Some("member"));
    held.release().await.expect("release");
    assert_eq!(
        next_holder(&mut changes, Duration::from_secs(5)).await,
        HolderChange::free()
    );

    tokio::task::block_in_place(|| server.stop());
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::task::block_in_place(|| server.restart());

    // The member takes the shard again once the server answers; the follower must hear it
    // through the joint watch, which re-listed and watches again.
    let again = loop {
        match member.try_acquire(&leases[2], &opts).await {
            Ok(lease) => break lease,
            Err(e) => {
                eprintln!("acquire after the restart: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let token = again.fencing_token();
    let heard = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let change = next_holder(&mut changes, Duration::from_secs(30)).await;
            if change.fencing == Some(token) {
                break change;
            }
        }
    })
    .await
    .expect("the grant after the restart must reach the follower through the joint watch");
    assert_eq!(heard.holder.as_deref(), Some("member"));

    // The member dies holding the shard: the follower's own clock, fed by the watch, frees it
    // one lease after that last renewal.
    again.orphan();
    let died = Instant::now();
    let taker = Locker::with_identity(follower, "follower").expect("identity");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let early = taker.try_acquire(&leases[2], &opts).await;
    assert!(
        matches!(early, Err(LockError::NotAcquired { ref holder, .. }) if holder.as_deref() == Some("member")),
        "taken while the dead member's lease still ran: {early:?}"
    );
    let taken = loop {
        match taker.try_acquire(&leases[2], &opts).await {
            Ok(lease) => break lease,
            Err(e) => {
                assert!(
                    died.elapsed() < Duration::from_secs(10),
                    "the dead member's shard is never freed for the follower: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    eprintln!("shard taken {:?} after its holder died", died.elapsed());
    assert!(taken.fencing_token() > token);
    taken.release().await.expect("release");
    drop(server);
}

/// The next holder change on `changes`, skipping the errors a stopped server gives.
async fn next_holder(
    changes: &mut (
             impl futures::Stream<Item = Result<HolderChange, tenure::backend::BackendError>> + Unpin
         ),
    within: Duration,
) -> HolderChange {
    tokio::time::timeout(within, async {
        loop {
            match changes.next().await {
                Some(Ok(change)) => break change,
                Some(Err(e)) => eprintln!("observe: {e}"),
                None => panic!("the observe stream ended"),
            }
        }
    })
    .await
    .expect("a holder change in time")
}
