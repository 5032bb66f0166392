//! The Kubernetes backend against a real kube-apiserver: the record as client-go writes it,
//! races, deletion, foreign timestamps, the watch, and request counts.

mod kube_support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kube_support::{shared, unique};
use tenure::backend::kube::{
    FENCING_ANNOTATION, HOLDER_IDENTITY_ANNOTATION, HOLDER_TOKEN_ANNOTATION, KubeBackend,
    KubeOptions, RELEASED_TOKEN_ANNOTATION,
};
use tenure::backend::{
    AcquireRequest, Acquired, Backend, BackendErrorKind, HolderChange, HolderToken, Released,
    Renewed,
};
use tenure::{LeaseEnd, LockError, LockOptions, Locker, LostReason};
use tokio::time::Instant;

const NS: &str = "default";

fn spec(lease: &Lease) -> k8s_openapi::api::coordination::v1::LeaseSpec {
    lease
        .spec
        .clone()
        .expect("a Lease written by tenure has a spec")
}

fn annotation(lease: &Lease, key: &str) -> Option<String> {
    lease.metadata.annotations.as_ref()?.get(key).cloned()
}

fn rv(lease: &Lease) -> u64 {
    lease
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("integer resourceVersion")
}

/// Options for calls whose point is not timing: each request may take most of the ttl
/// instead of the default third of it, so a slow answer from an API server on a loaded machine
/// is waited for rather than failing the call as a timeout (#42). An answer is as good late as
/// early: validity counts from when the request was sent.
fn patient(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).request_timeout(ttl * 3 / 4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_is_written_as_client_go_writes_it() {
    let server = shared();
    let name = unique("record");
    let locker = Locker::with_identity(server.backend(NS).await, "alpha").expect("identity");
    let opts = patient(Duration::from_millis(1500));
    let lease = locker.try_acquire(&name, &opts).await.expect("free lock");

    let raw = server.lease(NS, &name).await.expect("created");
    let s = spec(&raw);
    assert_eq!(s.holder_identity.as_deref(), Some("alpha"));
    assert_eq!(
        s.lease_duration_seconds,
        Some(2),
        "ttl rounded up to whole seconds"
    );
    assert_eq!(s.lease_transitions, Some(0));
    assert!(s.acquire_time.is_some());
    // The grant was followed at once by the stamp: the token (the acquiring write's rv) is in
    // the record before `acquire` returned, and the record moved on by exactly that write.
    assert!(
        lease.fencing_token().get() < rv(&raw),
        "token = rv of the acquiring write, before the stamp's"
    );
    assert_eq!(
        annotation(&raw, FENCING_ANNOTATION),
        Some(lease.fencing_token().to_string()),
        "the grant stamps the term's fencing token before it returns"
    );
    assert_eq!(
        annotation(&raw, "tenure.dev/fencing-floor"),
        Some(lease.fencing_token().to_string()),
        "the stamp makes the floor exact"
    );
    assert_eq!(
        annotation(&raw, HOLDER_IDENTITY_ANNOTATION).as_deref(),
        Some("alpha")
    );
    assert_eq!(
        annotation(&raw, HOLDER_TOKEN_ANNOTATION).map(|t| t.len()),
        Some(32)
    );

    lease.refresh().await.expect("renew");
    let renewed = server.lease(NS, &name).await.expect("still there");
    let r = spec(&renewed);
    assert_eq!(r.acquire_time, s.acquire_time, "renewal keeps acquireTime");
    assert!(r.renew_time > s.renew_time, "renewal moves renewTime");
    assert_eq!(r.lease_transitions, Some(0));
    assert_eq!(
        annotation(&renewed, FENCING_ANNOTATION),
        Some(lease.fencing_token().to_string()),
        "renewals keep the term's fencing token"
    );
    let token = annotation(&renewed, HOLDER_TOKEN_ANNOTATION);

    lease.release().await.expect("release");
    let released = server.lease(NS, &name).await.expect("kept on release");
    let r = spec(&released);
    assert_eq!(
        r.holder_identity.as_deref(),
        Some(""),
        "release clears the holder"
    );
    assert_eq!(
        r.lease_duration_seconds,
        Some(1),
        "release sets leaseDurationSeconds=1"
    );
    assert_eq!(r.lease_transitions, Some(0));
    assert_eq!(annotation(&released, RELEASED_TOKEN_ANNOTATION), token);
    assert_eq!(annotation(&released, HOLDER_TOKEN_ANNOTATION), None);

    let beta = Locker::with_identity(server.backend(NS).await, "beta").expect("identity");
    let next = beta.try_acquire(&name, &opts).await.expect("released lock");
    let raw = server.lease(NS, &name).await.expect("there");
    assert_eq!(
        spec(&raw).lease_transitions,
        Some(1),
        "a new holder counts a transition"
    );
    assert!(next.fencing_token() > lease.fencing_token());
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_return_the_original_token_from_any_instance() {
    let server = shared();
    let name = unique("replay");
    let b = server.backend(NS).await;
    let req = AcquireRequest {
        name: name.as_str().into(),
        holder: HolderToken::random(),
        identity: "replayer".into(),
        ttl: Duration::from_secs(5),
    };
    let Ok(Acquired::Granted { fencing }) = b.try_acquire(&req).await else {
        panic!("free lock not granted")
    };
    assert_eq!(
        b.renew(&name, &req.holder, req.ttl).await.ok(),
        Some(Renewed::Held)
    );
    // The renewal moved the resourceVersion; the replay must still return the original.
    assert_eq!(
        b.try_acquire(&req).await.ok(),
        Some(Acquired::Granted { fencing })
    );
    // Another instance (another process, say, after a lost answer) knows nothing locally.
    let other = server.backend(NS).await;
    assert_eq!(
        other.try_acquire(&req).await.ok(),
        Some(Acquired::Granted { fencing })
    );
    assert_eq!(
        other.release(&name, &req.holder).await.ok(),
        Some(Released::Released)
    );
    assert_eq!(
        b.release(&name, &req.holder).await.ok(),
        Some(Released::Released),
        "a replayed release (from another instance) reports success"
    );
}

/// Ten candidates, each with its own backend (as separate processes would have), wait for a
/// lease whose holder stops renewing. Each winner acts until its validity ends, then stops
/// renewing too, so every term starts with ten candidates racing for an expired lease. Tokens
/// must rise term by term, and no winner may hold its grant before the previous term's
/// validity ended. The grant is timed when `acquire` returns, after the take landed; the
/// previous term's end is its `valid_until`, what the lock runtime itself acts on. Not a
/// "two inside at once" referee: that one also counts how late a loaded scheduler woke the
/// previous holder to leave (22 ms of drift allowance separate the two on a 2 s lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_candidates_race_for_an_expired_lease() {
    const TERMS: u64 = 4;
    let server = shared();
    let name = unique("race");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .retry_interval(Duration::from_millis(500))
        .request_timeout(Duration::from_millis(1000));
    let first = Locker::with_identity(server.backend(NS).await, "crashed")
        .expect("identity")
        .try_acquire(&name, &opts)
        .await
        .expect("free lock");
    let mut previous = (first.fencing_token(), first.valid_until());
    first.orphan();

    let terms = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let locker = Locker::with_identity(server.backend(NS).await, &format!("candidate-{i}"))
            .expect("identity");
        let (name, opts, terms, grants) = (
            name.clone(),
            opts.clone().wait(Duration::from_secs(30)),
            terms.clone(),
            grants.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while terms.load(Ordering::SeqCst) < TERMS {
                let lease = match locker.acquire(&name, &opts).await {
                    Ok(l) => l,
                    Err(LockError::NotAcquired { .. }) => continue,
                    Err(e) => panic!("candidate-{i}: {e}"),
                };
                let granted_at = Instant::now();
                grants.lock().expect("grants").push((
                    lease.fencing_token(),
                    granted_at,
                    lease.valid_until(),
                ));
                // Act for as long as the lease is valid, then stop renewing: the next term
                // starts with an expired lease.
                tokio::time::sleep_until(lease.valid_until()).await;
                lease.orphan();
                terms.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while terms.load(Ordering::SeqCst) < TERMS && !tasks.iter().any(|t| t.is_finished()) {
        assert!(Instant::now() < deadline, "only {terms:?} terms in 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for t in tasks {
        if t.is_finished() {
            // A candidate stopped early only by panicking (an error).
            t.await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        } else {
            t.abort();
        }
    }
    // In the order the grants were recorded: each winner records before its term can end.
    let grants = grants.lock().expect("grants").clone();
    assert!(grants.len() as u64 >= TERMS, "{grants:?}");
    for &(token, granted_at, valid_until) in &grants {
        let (prev_token, prev_valid_until) = previous;
        assert!(
            token > prev_token,
            "tokens must rise term by term: {grants:?}"
        );
        assert!(
            granted_at >= prev_valid_until,
            "token {token} was granted {:?} before token {prev_token}'s validity ended",
            prev_valid_until - granted_at
        );
        previous = (token, valid_until);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_lease_ends_the_term_with_not_held() {
    let server = shared();
    let name = unique("deleted");
    let locker = Locker::with_identity(server.backend(NS).await, "holder").expect("identity");
    // 4 s: each renewal gets about two attempts before its deadline, so the term ends by the
    // deletion (NotHeld) rather than by a loaded API server's slow answers (RenewDeadline).
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(4))
        .auto_renew(true);
    let lease = locker.try_acquire(&name, &opts).await.expect("free lock");
    let before = lease.fencing_token();
    server.delete_lease(NS, &name).await;
    let end = tokio::time::timeout(Duration::from_secs(10), lease.lost())
        .await
        .expect("the holder must notice the deletion at its next renewal");
    assert!(
        matches!(end, LeaseEnd::Lost(LostReason::NotHeld)),
        "ended with {end:?}"
    );
    let next = Locker::with_identity(server.backend(NS).await, "next")
        .expect("identity")
        .try_acquire(&name, &opts)
        .await
        .expect("a deleted lease is free");
    assert!(
        next.fencing_token() > before,
        "tokens rise across delete and re-create"
    );
    next.release().await.expect("release");
}

/// Writes a foreign (client-go style) record held by "ghost" with `renew_time`.
async fn foreign(name: &str, duration: i32, renew_time: k8s_openapi::jiff::Timestamp) {
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "holderIdentity": "ghost",
            "leaseDurationSeconds": duration,
            "acquireTime": renew_time.to_string(),
            "renewTime": renew_time.to_string(),
            "leaseTransitions": 3,
        }
    }))
    .expect("lease json");
    let api: Api<Lease> = Api::namespaced(shared().admin().await, NS);
    api.create(&PostParams::default(), &lease)
        .await
        .expect("create foreign lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_renew_time_never_changes_the_wait() {
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    let server = shared();
    const DURATION: u64 = 3;
    for (label, renew) in [
        ("future", Timestamp::now() + SignedDuration::from_hours(1)),
        ("past", Timestamp::now() - SignedDuration::from_hours(24)),
    ] {
        let name = unique(&format!("skew-{label}"));
        foreign(&name, DURATION as i32, renew).await;
        let locker = Locker::with_identity(server.backend(NS).await, "patient").expect("identity");
        let started = Instant::now();
        let lease = locker
            .acquire(
                &name,
                &patient(Duration::from_secs(2))
                    .retry_interval(Duration::from_millis(200))
                    .wait(Duration::from_secs(20)),
            )
            .await
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(DURATION),
            "{label}: took over after {waited:?}, before leaseDurationSeconds on its own clock"
        );
        // Below two durations (a wait counted twice), with a second and more beyond the
        // duration for the takeover's writes to a loaded API server.
        assert!(
            waited < Duration::from_secs(2 * DURATION),
            "{label}: waited {waited:?}: the record's renewTime must not lengthen the wait"
        );
        let raw = server.lease(NS, &name).await.expect("there");
        assert_eq!(
            spec(&raw).lease_transitions,
            Some(4),
            "ghost → patient is a transition"
        );
        lease.release().await.expect("release");
    }
}

/// Counts the requests a client sends, by method and path.
#[derive(Clone, Default)]
struct Requests(Arc<Mutex<Vec<String>>>);

impl Requests {
    fn list(&self) -> Vec<String> {
        self.0.lock().expect("requests").clone()
    }
}

async fn counting_backend(requests: &Requests) -> KubeBackend {
    let path = shared().admin_kubeconfig();
    let kc = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let log = requests.0.clone();
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        let watch = req.uri().query().is_some_and(|q| q.contains("watch=true"));
        let what = format!(
            "{} {}{}{}",
            req.method(),
            req.uri().path(),
            req.uri()
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default(),
            if watch { " (watch)" } else { "" }
        );
        log.lock().expect("requests").push(what);
        req
    });
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("builder")
        .with_layer(&layer)
        .build();
    KubeBackend::from_client(client, KubeOptions::new().namespace(NS)).expect("backend")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_follower_sits_on_the_watch_without_polling() {
    let server = shared();
    let name = unique("follower");
    // A 4 s lease: the follower would write (an expired lease is taken) only if it heard no
    // renewal for 4 s, which a loaded API server's slow renewals do not come near.
    const TTL: Duration = Duration::from_secs(4);
    let leader = Locker::with_identity(server.backend(NS).await, "leader").expect("identity");
    let held = leader
        .try_acquire(&name, &patient(TTL).auto_renew(true))
        .await
        .expect("free lock");

    let requests = Requests::default();
    let follower =
        Locker::with_identity(counting_backend(&requests).await, "follower").expect("identity");
    let waited = follower
        .acquire(
            &name,
            &LockOptions::new()
                .ttl(TTL)
                .retry_interval(Duration::from_millis(100))
                .wait(TTL * 3),
        )
        .await;
    assert!(
        matches!(waited, Err(LockError::NotAcquired { ref holder, .. }) if holder.as_deref() == Some("leader")),
        "{waited:?}"
    );
    let sent = requests.list();
    // One read before subscribing, then the watch's list and watch: ~120 retries answered
    // from the watched view while the leader renewed ~9 times.
    assert!(sent.len() <= 4, "the follower polled: {sent:#?}");
    assert!(
        sent.iter().all(|r| r.starts_with("GET ")),
        "a follower of a live lease must not write: {sent:#?}"
    );
    assert!(
        sent.iter().any(|r| r.ends_with("(watch)")),
        "no watch: {sent:#?}"
    );
    assert!(leader.stats().renewals() >= 6, "{:?}", leader.stats());
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_hear_grants_and_releases_but_not_renewals() {
    let server = shared();
    let name = unique("observe");
    let observer = server.backend(NS).await;
    let mut changes = observer.observe(&name);
    let first = tokio::time::timeout(Duration::from_secs(5), changes.next())
        .await
        .expect("the first item is the state at subscription");
    assert_eq!(first.and_then(Result::ok), Some(HolderChange::free()));

    // 3 s: renewals every second, each with the time to land on a loaded API server.
    const TTL: Duration = Duration::from_secs(3);
    let locker = Locker::with_identity(server.backend(NS).await, "observed").expect("identity");
    let lease = locker
        .try_acquire(&name, &patient(TTL).auto_renew(true))
        .await
        .expect("free lock");
    let granted = tokio::time::timeout(Duration::from_secs(5), changes.next())
        .await
        .expect("grant reported")
        .and_then(Result::ok)
        .expect("grant");
    assert_eq!(granted.holder.as_deref(), Some("observed"));
    assert_eq!(granted.fencing, Some(lease.fencing_token()));

    // Four renewals (one a second), after the fencing stamp: no item while they land.
    let renewed = async {
        while locker.stats().renewals() < 4 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        item = changes.next() => panic!("a renewal was reported: {item:?}"),
        () = tokio::time::sleep(TTL * 10) => panic!("no 4 renewals: {:?}", locker.stats()),
        () = renewed => {}
    }
    assert!(lease.is_valid(), "{:?}", lease.end());

    lease.release().await.expect("release");
    let released_at = Instant::now();
    let freed = tokio::time::timeout(TTL, changes.next())
        .await
        .expect("release reported within a ttl of its write: heard, not waited out")
        .and_then(Result::ok);
    assert_eq!(freed, Some(HolderChange::free()));
    println!(
        "release heard {:?} after it was written",
        released_at.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_dns_subdomains_and_errors_are_typed() {
    let server = shared();
    let locker = Locker::new(server.backend(NS).await);
    for bad in ["Upper", "under_score", "-dash", &"x".repeat(254)] {
        match locker.try_acquire(bad, &LockOptions::new()).await {
            Err(LockError::InvalidName(e)) => assert!(!e.rule.is_empty()),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    // A namespace that does not exist is a configuration error, not "busy".
    let nowhere = server.backend("no-such-namespace").await;
    let req = AcquireRequest {
        name: "x".into(),
        holder: HolderToken::random(),
        identity: "me".into(),
        ttl: Duration::from_secs(1),
    };
    let e = nowhere.try_acquire(&req).await.expect_err("no namespace");
    assert_eq!(e.kind(), BackendErrorKind::Config, "{e}");
    // Nothing listens here: unavailable, and quickly.
    let kc = std::fs::read_to_string(server.admin_kubeconfig()).expect("kubeconfig");
    let dead = kube_support::fresh_dir("dead");
    let port = kube_support::free_port();
    let url = server.url();
    std::fs::write(
        dead.join("kubeconfig"),
        kc.replace(&url, &format!("https://127.0.0.1:{port}")),
    )
    .expect("write kubeconfig");
    let unreachable = KubeBackend::from_kubeconfig(dead.join("kubeconfig"), KubeOptions::new())
        .await
        .expect("config");
    let e = unreachable
        .try_acquire(&req)
        .await
        .expect_err("nothing listens");
    assert!(
        matches!(
            e.kind(),
            BackendErrorKind::Unavailable | BackendErrorKind::Timeout
        ),
        "{e}"
    );
    assert!(e.is_transient());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_events_are_recorded_on_the_lease_as_client_go_does() {
    use tenure::backend::LeadershipEvent;
    let server = shared();
    let name = unique("events");
    let backend = server.backend(NS).await;
    let lease = Locker::with_identity(backend.clone(), "announcer")
        .expect("identity")
        .try_acquire(&name, &patient(Duration::from_secs(5)))
        .await
        .expect("free lock");
    let fencing = lease.fencing_token();
    backend
        .record_event(
            &name,
            &LeadershipEvent::BecameLeader {
                identity: "announcer".into(),
                fencing,
            },
        )
        .await;
    backend
        .record_event(
            &name,
            &LeadershipEvent::StoppedLeading {
                identity: "announcer".into(),
                fencing,
                reason: "released".into(),
            },
        )
        .await;
    assert_eq!(
        leadership_event_messages(server, &name).await,
        ["announcer became leader", "announcer stopped leading"]
    );
    lease.release().await.expect("release");
}

/// The messages of the Events on Lease `name`, sorted; each Event is asserted to be a
/// `LeaderElection` one naming the Lease, as client-go records them.
async fn leadership_event_messages(server: &kube_support::Server, name: &str) -> Vec<String> {
    use k8s_openapi::api::core::v1::Event;
    let events: Api<Event> = Api::namespaced(server.admin().await, NS);
    let list = events
        .list(&kube::api::ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .expect("list events");
    let mut messages: Vec<_> = list
        .items
        .iter()
        .map(|e| {
            assert_eq!(e.reason.as_deref(), Some("LeaderElection"));
            assert_eq!(e.type_.as_deref(), Some("Normal"));
            assert_eq!(e.involved_object.kind.as_deref(), Some("Lease"));
            assert_eq!(
                e.involved_object.api_version.as_deref(),
                Some("coordination.k8s.io/v1")
            );
            assert!(
                e.involved_object.uid.is_some(),
                "the Event names the Lease's uid"
            );
            e.message.clone().unwrap_or_default()
        })
        .collect();
    messages.sort();
    messages
}

/// An election sends those Events itself: "became leader" when its term starts, "stopped
/// leading" when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elections_term_is_recorded_as_events_on_its_lease() {
    use tenure::election::{ElectionConfig, LeaderElector};
    let server = shared();
    let name = unique("term-events");
    let locker = Locker::with_identity(server.backend(NS).await, "elected").expect("identity");
    LeaderElector::new(locker, &name, ElectionConfig::default())
        .expect("valid config")
        .run(|term| async move { term.fencing_token() })
        .await
        .expect("a term");
    assert_eq!(
        leadership_event_messages(server, &name).await,
        ["elected became leader", "elected stopped leading"],
        "the term's Events on its Lease"
    );
}

/// Asserts that `lease` still has the coordinated-election fields the admin wrote.
fn assert_coordinated(lease: &Lease, after: &str) {
    let s = spec(lease);
    assert_eq!(
        s.strategy.as_deref(),
        Some("OldestEmulationVersion"),
        "{after} keeps spec.strategy"
    );
    assert_eq!(
        s.preferred_holder.as_deref(),
        Some("go-2"),
        "{after} keeps spec.preferredHolder"
    );
    assert_eq!(
        lease
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("owner"))
            .map(String::as_str),
        Some("admin"),
        "{after} keeps the labels"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_tenure_does_not_own_survive_every_write() {
    let server = kube_support::coordinated();
    let name = unique("coordinated");
    // An admin's Lease as coordinated leader election leaves it: a strategy, a preferred
    // holder other than the (expired) holder.
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NS, "labels": {"owner": "admin"}},
        "spec": {
            "holderIdentity": "go-1",
            "leaseDurationSeconds": 1,
            "renewTime": "2020-01-01T00:00:00.000000Z",
            "leaseTransitions": 2,
            "strategy": "OldestEmulationVersion",
            "preferredHolder": "go-2",
        }
    }))
    .expect("lease json");
    let api: Api<Lease> = Api::namespaced(server.admin().await, NS);
    let created = api
        .create(&PostParams::default(), &lease)
        .await
        .expect("create the coordinated Lease");
    assert_coordinated(&created, "the admin's create (is the feature gate on?)");

    // Takeover of go-1's expired term (tenure waits out its duration on its own clock).
    let alpha = Locker::with_identity(server.backend(NS).await, "alpha").expect("identity");
    let opts = patient(Duration::from_secs(5));
    let held = alpha
        .acquire(&name, &opts.clone().wait(Duration::from_secs(20)))
        .await
        .expect("go-1's term expires");
    let raw = server.lease(NS, &name).await.expect("there");
    assert_eq!(spec(&raw).holder_identity.as_deref(), Some("alpha"));
    assert_eq!(spec(&raw).lease_transitions, Some(3));
    assert_eq!(
        annotation(&raw, FENCING_ANNOTATION),
        Some(held.fencing_token().to_string()),
        "the grant and its stamp both wrote"
    );
    assert_coordinated(&raw, "the takeover and the stamp");

    // preferredHolder names someone else: tenure ignores it and keeps renewing.
    held.refresh()
        .await
        .expect("a tenure holder does not step down");
    let renewed = server.lease(NS, &name).await.expect("there");
    assert!(rv(&renewed) > rv(&raw), "the renewal wrote");
    assert_eq!(spec(&renewed).holder_identity.as_deref(), Some("alpha"));
    assert_coordinated(&renewed, "the renewal");

    held.release().await.expect("release");
    let released = server.lease(NS, &name).await.expect("kept on release");
    assert_eq!(spec(&released).holder_identity.as_deref(), Some(""));
    assert_coordinated(&released, "the release");

    // An acquire of the released Lease (no wait: it is free).
    let beta = Locker::with_identity(server.backend(NS).await, "beta").expect("identity");
    let next = beta.try_acquire(&name, &opts).await.expect("released lock");
    let raw = server.lease(NS, &name).await.expect("there");
    assert_eq!(spec(&raw).holder_identity.as_deref(), Some("beta"));
    assert_coordinated(&raw, "an acquire of a released Lease");
    next.release().await.expect("release");
}

/// The shard Leases of group `group`, as the sharded elector names them.
fn shard_leases(group: &str, shards: u32) -> Vec<String> {
    (0..shards).map(|s| format!("{group}-{s}")).collect()
}

/// Issue #26: a replica follows every shard Lease of its group with one watch, however many
/// shards it observes, and hears grants through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_follows_all_its_shard_leases_with_one_watch() {
    let server = shared();
    let group = unique("joint");
    let leases = shard_leases(&group, 24);
    let requests = Requests::default();
    let follower = counting_backend(&requests).await;
    let joint = follower.follow_shard_leases(&group, &leases);
    assert!(joint.is_joint());
    let mut streams = Vec::new();
    for name in &leases {
        let mut changes = follower.observe(name);
        let first = tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .unwrap_or_else(|_| panic!("{name}: no state at subscription"));
        assert_eq!(first.and_then(Result::ok), Some(HolderChange::free()));
        streams.push(changes);
    }

    // Another replica of the group takes shard 3: its Lease carries the group's label, and
    // the follower hears the grant through the joint watch.
    let other = Arc::new(server.backend(NS).await);
    let _other_joint = other.follow_shard_leases(&group, &leases);
    let locker = Locker::with_identity(other.clone(), "other").expect("identity");
    let held = locker
        .try_acquire(&leases[3], &patient(Duration::from_secs(5)))
        .await
        .expect("free lock");
    let raw = server.lease(NS, &leases[3]).await.expect("created");
    assert_eq!(
        raw.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(tenure::backend::kube::SHARD_GROUP_LABEL))
            .map(String::as_str),
        Some(group.as_str()),
        "a shard Lease written under a joint watch carries the group's label"
    );
    let granted = tokio::time::timeout(Duration::from_secs(5), streams[3].next())
        .await
        .expect("grant reported")
        .and_then(Result::ok)
        .expect("grant");
    assert_eq!(granted.holder.as_deref(), Some("other"));
    assert_eq!(granted.fencing, Some(held.fencing_token()));
    held.release().await.expect("release");
    let freed = tokio::time::timeout(Duration::from_secs(5), streams[3].next())
        .await
        .expect("release reported")
        .and_then(Result::ok);
    assert_eq!(freed, Some(HolderChange::free()));

    let sent = requests.list();
    let watches = sent.iter().filter(|r| r.ends_with("(watch)")).count();
    assert_eq!(
        watches, 1,
        "24 observed shard Leases must share one watch: {sent:#?}"
    );
    let selector = format!("labelSelector=tenure.dev%2Fshard-group%3D{group}");
    assert!(
        sent.iter().all(|r| r.contains(&selector)),
        "the list and the watch select the group's label: {sent:#?}"
    );
    assert!(
        sent.len() <= 3,
        "one list and one watch, no reads per Lease: {sent:#?}"
    );
}

/// Issue #26 finding 7: a shard whose holder died is free one lease after the holder's last
/// renewal, for a replica that followed the group before it was assigned the shard — not
/// one lease after that replica first looked at it. And not a moment before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_shard_is_free_one_lease_after_its_last_renewal() {
    let server = shared();
    let group = unique("failover");
    let leases = shard_leases(&group, 4);
    // 6 s: the follower's first look comes half a lease after the last renewal, so a clock
    // started there would free the shard 3 s later than the right one; the take-over gets
    // 2 s of that for the watch's lag and its writes on a loaded API server.
    const TTL: Duration = Duration::from_secs(6);
    let opts = patient(TTL);

    let next = Arc::new(server.backend(NS).await);
    let _joint = next.follow_shard_leases(&group, &leases);
    // Synced once any shard Lease's state is known (the joint watch lists them all); shard
    // 0 itself is never looked at before its holder dies.
    let mut changes = next.observe(&leases[1]);
    tokio::time::timeout(Duration::from_secs(5), changes.next())
        .await
        .expect("synced");

    let dead_backend = Arc::new(server.backend(NS).await);
    let _dead_joint = dead_backend.follow_shard_leases(&group, &leases);
    let dead = Locker::with_identity(dead_backend, "dead").expect("identity");
    let held = dead
        .try_acquire(&leases[0], &opts)
        .await
        .expect("free lock");
    let last_renewal = Instant::now();
    let dead_token = held.fencing_token();
    held.orphan();

    let locker = Locker::with_identity(next, "next").expect("identity");
    tokio::time::sleep_until(last_renewal + TTL / 2).await;
    let early = locker.try_acquire(&leases[0], &opts).await;
    assert!(
        matches!(early, Err(LockError::NotAcquired { ref holder, .. }) if holder.as_deref() == Some("dead")),
        "taken while the dead holder's lease still ran: {early:?}"
    );
    // Waiting until a third of a lease past the last renewal; a clock started at the first
    // look would keep the shard until half a lease past it.
    let give_up = last_renewal + TTL + TTL / 3;
    let taken = locker
        .acquire(
            &leases[0],
            &opts
                .clone()
                .wait(give_up.saturating_duration_since(Instant::now())),
        )
        .await
        .expect("the dead holder's lease runs out one lease after its last renewal by the follower's clock");
    println!("taken {:?} after the last renewal", last_renewal.elapsed());
    assert!(taken.fencing_token() > dead_token);
    taken.release().await.expect("release");
}

/// A shard Lease written without the group's label (by an older tenure, or a plain election
/// of the same name) is not in the joint watch: it is noticed late, never taken early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlabelled_shard_lease_held_by_a_live_holder_is_never_taken() {
    let server = shared();
    let group = unique("unlabelled");
    let leases = shard_leases(&group, 2);
    // 3 s: renewals every second, each with the time to land on a loaded API server (every
    // attempt below reads the Lease, which is not in the joint watch).
    const TTL: Duration = Duration::from_secs(3);
    let holder = Locker::with_identity(server.backend(NS).await, "plain").expect("identity");
    let held = holder
        .try_acquire(&leases[1], &patient(TTL).auto_renew(true))
        .await
        .expect("free lock");

    let next = Arc::new(server.backend(NS).await);
    let _joint = next.follow_shard_leases(&group, &leases);
    let locker = Locker::with_identity(next, "next").expect("identity");
    // At least 20 attempts over at least three leases: a follower that judged the Lease by
    // its first look, or missed the renewals, would take it within that time.
    let until = Instant::now() + TTL * 3;
    let mut attempts = 0;
    while attempts < 20 || Instant::now() < until {
        let tried = locker.try_acquire(&leases[1], &patient(TTL)).await;
        assert!(
            matches!(tried, Err(LockError::NotAcquired { .. })),
            "a live holder's lease was taken: {tried:?}"
        );
        attempts += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        held.is_valid() && holder.stats().renewals() >= 6,
        "the holder was not live all along: {:?}, {:?}",
        held.end(),
        holder.stats()
    );
    held.release().await.expect("release");
}

/// Issue #26 finding 4: a plain election named like a group's shard Lease (`<group>-<n>`) is
/// refused by name once the group has labelled the Lease, instead of silently sharing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_election_cannot_take_a_groups_shard_lease() {
    let server = shared();
    let group = unique("collide");
    let leases = shard_leases(&group, 2);
    let member = Arc::new(server.backend(NS).await);
    let _joint = member.follow_shard_leases(&group, &leases);
    let opts = patient(Duration::from_secs(2));
    let shard = Locker::with_identity(member.clone(), "member")
        .expect("identity")
        .try_acquire(&leases[1], &opts)
        .await
        .expect("free lock");
    shard.release().await.expect("release");

    let plain = Locker::with_identity(server.backend(NS).await, "plain").expect("identity");
    let refused = plain.try_acquire(&leases[1], &opts).await;
    match refused {
        Err(LockError::Backend(e)) => {
            assert_eq!(e.kind(), BackendErrorKind::Config, "{e}");
            let message = e.to_string();
            assert!(
                message.contains(&leases[1]) && message.contains("shard lease"),
                "{message}"
            );
        }
        other => panic!("a plain election took a shard lease: {other:?}"),
    }
    // The group's own members still take it.
    let again = Locker::with_identity(member, "member")
        .expect("identity")
        .try_acquire(&leases[1], &opts)
        .await
        .expect("the group's member");
    again.release().await.expect("release");
}

/// Two sharded electors of one group in one process share the shard Leases: when one stops
/// following them, the other still takes them; when the last stops, each Lease is followed
/// on its own again and its observers hear of changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_joint_watch_to_stop_hands_the_leases_back() {
    let server = shared();
    let group = unique("handback");
    let leases = shard_leases(&group, 2);
    let backend = Arc::new(server.backend(NS).await);
    let first = backend.follow_shard_leases(&group, &leases);
    let second = backend.follow_shard_leases(&group, &leases);
    let opts = patient(Duration::from_secs(2));
    let locker = Locker::with_identity(backend.clone(), "member").expect("identity");
    locker
        .try_acquire(&leases[0], &opts)
        .await
        .expect("free lock")
        .release()
        .await
        .expect("release");
    let mut joint_fed = backend.observe(&leases[0]);
    tokio::time::timeout(Duration::from_secs(5), joint_fed.next())
        .await
        .expect("synced");
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Still a member through `second`: the labelled Lease is ours to take.
    locker
        .try_acquire(&leases[0], &opts)
        .await
        .expect("a member of the group while one joint watch remains")
        .release()
        .await
        .expect("release");
    drop(second);
    // The joint watch's observers are told it ended.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match joint_fed.next().await {
                Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the joint watch's observers were not told");
    // A new observer gets a watch of the Lease alone, which hears another's grant.
    let mut alone = backend.observe(&leases[1]);
    let first_item = tokio::time::timeout(Duration::from_secs(5), alone.next())
        .await
        .expect("state at subscription");
    assert_eq!(first_item.and_then(Result::ok), Some(HolderChange::free()));
    let other = Arc::new(server.backend(NS).await);
    let _other_joint = other.follow_shard_leases(&group, &leases);
    let held = Locker::with_identity(other, "other")
        .expect("identity")
        .try_acquire(&leases[1], &opts)
        .await
        .expect("free lock");
    let granted = tokio::time::timeout(Duration::from_secs(5), alone.next())
        .await
        .expect("grant reported")
        .and_then(Result::ok)
        .expect("grant");
    assert_eq!(granted.holder.as_deref(), Some("other"));
    held.release().await.expect("release");
}
