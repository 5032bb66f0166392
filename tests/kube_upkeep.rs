//! Upkeep on the real kube-apiserver while a backend's ordinary traffic is stuck: renewals of
//! held leases, the member heartbeat and releases still go out and finish within the request
//! timeout, and a sharded replica loses no shard and no term. The stuck traffic is reads of
//! Leases named `stalled-*` that a client layer holds until the backend gives up on them, as
//! a server stuck on those requests would; everything else reaches the server. And a member
//! heartbeat whose answer came after its caller gave up (the server had applied it) costs
//! the next one no extra request, and one that changes nothing still renews the member
//! Lease (#42).

mod kube_support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use kube_support::{shared, unique};
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::backend::{AcquireRequest, Acquired, Backend, HolderToken, Member, Released, Renewed};
use tenure::shard::ShardedElector;
use tenure::{ElectionConfig, Locker};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const NS: &str = "default";

/// How many ordinary requests a backend has in flight at most: its bound of 32 less the 8
/// slots kept for upkeep. The stuck readers hold at least this many before upkeep is tried.
const ORDINARY_SHARE: usize = 24;

/// Readers of stalled Leases: twice the whole bound of 32, so that without slots of its own
/// upkeep would queue behind a full round of stuck requests whichever slot frees first.
const STALLERS: usize = 64;

/// Requests the layer holds now, and has held in all.
#[derive(Clone, Default)]
struct Stuck(Arc<AtomicUsize>, Arc<AtomicUsize>);

impl Stuck {
    fn now(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    fn total(&self) -> usize {
        self.1.load(Ordering::SeqCst)
    }
}

/// One stuck request, counted while the client waits for it.
struct Held(Stuck);

impl Held {
    fn new(stuck: &Stuck) -> Self {
        stuck.0.fetch_add(1, Ordering::SeqCst);
        stuck.1.fetch_add(1, Ordering::SeqCst);
        Self(stuck.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The client layer: requests naming a `stalled-*` Lease never get an answer.
#[derive(Clone)]
struct Stall<S> {
    inner: S,
    stuck: Stuck,
}

impl<S, B> tower::Service<http::Request<B>> for Stall<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path().contains("/leases/stalled-") {
            let held = Held::new(&self.stuck);
            return Box::pin(async move {
                let _held = held;
                std::future::pending().await
            });
        }
        Box::pin(self.inner.call(request))
    }
}

/// A backend in `NS` whose `stalled-*` reads never finish; requests time out after `timeout`.
async fn stalling_backend(stuck: &Stuck, timeout: Duration) -> KubeBackend {
    let path = shared().admin_kubeconfig();
    let kc = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let stuck = stuck.clone();
    let layer = tower::layer::layer_fn(move |inner| Stall {
        inner,
        stuck: stuck.clone(),
    });
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("builder")
        .with_layer(&layer)
        .build();
    KubeBackend::from_client(
        client,
        KubeOptions::new().namespace(NS).request_timeout(timeout),
    )
    .expect("backend")
}

/// [`STALLERS`] tasks reading stalled Leases through `backend`, each asking again as soon as
/// its read times out; returns once the stuck reads hold the whole ordinary share.
async fn stall(backend: &KubeBackend, stuck: &Stuck) -> Vec<JoinHandle<()>> {
    let tag = unique("stalled");
    let stallers = (0..STALLERS)
        .map(|i| {
            let backend = backend.clone();
            let name = format!("stalled-{tag}-{i}");
            tokio::spawn(async move {
                loop {
                    let _ = backend.inspect(&name).await;
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while stuck.now() < ORDINARY_SHARE {
        assert!(
            Instant::now() < deadline,
            "the stuck reads never filled the ordinary share: {}",
            stuck.now()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stallers
}

/// The defect: every request shared one first-come queue of 32, so a replica's stuck reads
/// held its renewals, heartbeat and releases past the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_heartbeats_and_releases_go_out_while_ordinary_traffic_is_stuck() {
    let stuck = Stuck::default();
    let backend = stalling_backend(&stuck, Duration::from_secs(3)).await;
    let held: Vec<AcquireRequest> = (0..4)
        .map(|i| AcquireRequest {
            name: unique(&format!("upkeep-{i}")).into(),
            holder: HolderToken::random(),
            identity: "keeper".into(),
            ttl: Duration::from_secs(30),
        })
        .collect();
    for req in &held {
        let granted = backend.try_acquire(req).await;
        assert!(
            matches!(granted, Ok(Acquired::Granted { .. })),
            "{}: {granted:?}",
            req.name
        );
    }
    let group = unique("upkeep");
    let me = Member {
        identity: "keeper".into(),
        shards: 4,
        joined_ms: 1,
        holds: vec![0, 1, 2, 3],
    };
    let stallers = stall(&backend, &stuck).await;
    // Three rounds, a full request timeout apart: the stuck reads time out and queue again
    // in between, so each round meets a fresh queue of them.
    for round in 0..3 {
        for req in &held {
            let renewed = backend.renew(&req.name, &req.holder, req.ttl).await;
            assert!(
                matches!(renewed, Ok(Renewed::Held)),
                "round {round}: renewing {}: {renewed:?}",
                req.name
            );
        }
        let announced = backend
            .announce_member(&group, &me, Duration::from_secs(30))
            .await;
        assert!(announced.is_ok(), "round {round}: heartbeat: {announced:?}");
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    // Stuck again after each timeout: at least three full waves.
    assert!(
        stuck.total() >= 3 * ORDINARY_SHARE,
        "the reads did not stay stuck: {} held in all",
        stuck.total()
    );
    for req in &held {
        let released = backend.release(&req.name, &req.holder).await;
        assert!(
            matches!(released, Ok(Released::Released)),
            "releasing {}: {released:?}",
            req.name
        );
    }
    let withdrawn = backend.withdraw_member(&group, "keeper").await;
    assert!(withdrawn.is_ok(), "withdrawing: {withdrawn:?}");
    for s in stallers {
        s.abort();
    }
}

/// What the defect cost: a sharded replica whose ordinary traffic is stuck keeps every shard
/// and every term (it dropped all of them when its heartbeat timed out behind that traffic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_ordinary_traffic_is_stuck_keeps_every_shard_and_term() {
    const SHARDS: u32 = 4;
    const LEASE: Duration = Duration::from_secs(6);
    const TIMEOUT: Duration = Duration::from_secs(2);
    let stuck = Stuck::default();
    let backend = stalling_backend(&stuck, TIMEOUT).await;
    let locker = Locker::with_identity(backend.clone(), "keeper").expect("identity");
    let config = ElectionConfig::new()
        .lease_duration(LEASE)
        .renew_deadline(Duration::from_secs(4))
        .retry_period(Duration::from_millis(2500))
        .request_timeout(TIMEOUT);
    let elector = ShardedElector::new(locker, &unique("keep"), SHARDS, config).expect("elector");
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let all: BTreeSet<u32> = (0..SHARDS).collect();
    let mut owned = elector.owned();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = {
        let terms = terms.clone();
        elector.run_until(
            async {
                let _ = stopped.await;
            },
            move |shard, term| {
                terms
                    .lock()
                    .expect("terms")
                    .push((shard, term.fencing_token().get()));
                async move { term.cancellation().cancelled().await }
            },
        )
    };
    let watched = async {
        tokio::time::timeout(Duration::from_secs(60), owned.wait_for(|o| *o == all))
            .await
            .expect("every shard held within a minute")
            .expect("the elector runs");
        // A shard counts as owned a moment before its workload is called.
        let deadline = Instant::now() + Duration::from_secs(20);
        while terms.lock().expect("terms").len() < SHARDS as usize {
            assert!(
                Instant::now() < deadline,
                "a held shard's workload never started"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let before = terms.lock().expect("terms").clone();
        let stallers = stall(&backend, &stuck).await;
        // Three leases: long enough for a heartbeat or renewal stuck behind the reads to
        // time out and the member, or a shard's lease, to expire.
        let until = Instant::now() + 3 * LEASE;
        let mut seen = vec![owned.borrow_and_update().clone()];
        while let Ok(changed) = tokio::time::timeout_at(until, owned.changed()).await {
            changed.expect("the elector runs");
            seen.push(owned.borrow_and_update().clone());
        }
        // Stuck again after each timeout: at least three full waves.
        assert!(
            stuck.total() >= 3 * ORDINARY_SHARE,
            "the reads did not stay stuck: {} held in all",
            stuck.total()
        );
        for s in stallers {
            s.abort();
        }
        let after = terms.lock().expect("terms").clone();
        let _ = stop.send(());
        (seen, before, after)
    };
    let (result, (seen, before, after)) = tokio::join!(started, watched);
    result.expect("the elector stopped cleanly");
    assert!(
        seen.iter().all(|o| *o == all),
        "shards were lost while ordinary traffic was stuck: {seen:?}"
    );
    assert_eq!(
        before.len(),
        SHARDS as usize,
        "one term per shard: {before:?}"
    );
    assert_eq!(after, before, "a term ended and another began");
}

/// The client layer of [`a_heartbeat_answered_too_late_costs_the_next_one_nothing`] and
/// [`an_elector_keeps_its_term_while_every_lease_request_is_answered_late`]: counts the
/// requests whose path contains `path`, notes when the latest write among them was sent, and
/// while `late` is set holds each one's answer for `by` after the server has applied it, as a
/// loaded API server answers late.
#[derive(Clone)]
struct Late<S> {
    inner: S,
    path: &'static str,
    by: Duration,
    late: Arc<std::sync::atomic::AtomicBool>,
    requests: Arc<AtomicUsize>,
    wrote: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl<S> Late<S> {
    fn layer(
        path: &'static str,
        by: Duration,
        late: &Arc<std::sync::atomic::AtomicBool>,
        requests: &Arc<AtomicUsize>,
        wrote: &Arc<std::sync::Mutex<Option<Instant>>>,
    ) -> impl tower::Layer<S, Service = Late<S>> + use<S> {
        let (late, requests, wrote) = (late.clone(), requests.clone(), wrote.clone());
        tower::layer::layer_fn(move |inner| Late {
            inner,
            path,
            by,
            late: late.clone(),
            requests: requests.clone(),
            wrote: wrote.clone(),
        })
    }
}

/// How late the held answers come.
const LATE_BY: Duration = Duration::from_millis(800);

impl<S, B> tower::Service<http::Request<B>> for Late<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
    S::Response: Send,
    S::Error: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let matching = request.uri().path().contains(self.path);
        if matching {
            self.requests.fetch_add(1, Ordering::SeqCst);
            if request.method() != http::Method::GET {
                *self
                    .wrote
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
            }
        }
        let late = matching && self.late.load(Ordering::SeqCst);
        let by = self.by;
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            if late {
                tokio::time::sleep(by).await;
            }
            answer
        })
    }
}

/// The defect (#42): the heartbeat was a `PUT` carrying the version of this process's last
/// write. A heartbeat whose caller gave up before the answer came — after the server had
/// applied it — left that version stale, so the next took four requests (update 409, create
/// 409, get, update), and under load missed its bound again, and again, until the replica
/// dropped out of its group. Now each heartbeat is one request, whatever became of the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_answered_too_late_costs_the_next_one_nothing() {
    let path = shared().admin_kubeconfig();
    let kc = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let late = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let member_requests = Arc::new(AtomicUsize::new(0));
    let layer = Late::layer(
        "-member-",
        LATE_BY,
        &late,
        &member_requests,
        &Arc::default(),
    );
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("builder")
        .with_layer(&layer)
        .build();
    let backend = KubeBackend::from_client(
        client,
        KubeOptions::new()
            .namespace(NS)
            .request_timeout(Duration::from_secs(5)),
    )
    .expect("backend");
    let group = unique("late-heartbeat");
    let mut me = Member {
        identity: "slow-replica".into(),
        shards: 4,
        joined_ms: 1,
        holds: vec![0],
    };
    let ttl = Duration::from_secs(30);
    for round in 0..3 {
        backend
            .announce_member(&group, &me, ttl)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the heartbeat before: {e}"));
        // Given up on before its answer came; the server has applied it by then.
        late.store(true, Ordering::SeqCst);
        me.holds.push(round + 1);
        let cut =
            tokio::time::timeout(LATE_BY / 2, backend.announce_member(&group, &me, ttl)).await;
        assert!(
            cut.is_err(),
            "round {round}: the late heartbeat answered in time: {cut:?}"
        );
        tokio::time::sleep(LATE_BY).await;
        late.store(false, Ordering::SeqCst);
        me.holds.push(round + 11);
        member_requests.store(0, Ordering::SeqCst);
        backend
            .announce_member(&group, &me, ttl)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the heartbeat after: {e}"));
        assert_eq!(
            member_requests.load(Ordering::SeqCst),
            1,
            "round {round}: the heartbeat after a late one took more than one request"
        );
    }
    // What the group sees is the last heartbeat's record.
    let mut members = backend.members(&group);
    let seen = tokio::time::timeout(
        Duration::from_secs(10),
        futures::StreamExt::next(&mut members),
    )
    .await
    .expect("the membership read answered")
    .expect("a membership item")
    .expect("the membership");
    assert_eq!(seen, vec![me.clone()], "the group's view");
    backend
        .withdraw_member(&group, &me.identity)
        .await
        .expect("withdraw");
}

/// The defect (#42): an elector cut each campaign attempt and renewal at its request timeout,
/// half a retry period by default, though an answer that comes later is still of use: the
/// lease's validity counts from the request's send. Against an API server that answers its
/// Lease requests late (after applying them, as one under CPU load does), no campaign attempt
/// was ever answered in time — each cut write had landed, and its replay was cut too — and
/// every renewal of a term would have been. Now, with no request timeout set, each may take
/// until the renew deadline: the elector wins a term and keeps it through two lease
/// durations, and every validity it reports still counts from a write's send, never from its
/// late answer. Answers 800 ms late: past the old cut (half the 1 s retry period).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elector_keeps_its_term_while_every_lease_request_is_answered_late() {
    keeps_its_term_while_answered_late(LateTimings {
        lease: Duration::from_secs(6),
        renew_deadline: Duration::from_secs(4),
        retry: Duration::from_secs(1),
        late_by: Duration::from_millis(800),
    })
    .await;
}

/// The same past the backend's own bound on each request (#42): `KubeOptions`' default was
/// 1.5 s, and it cut what the elector allows (until the renew deadline). Answers 2 s late:
/// with that default every renewal was cut after the API server applied it, and the first
/// term ended at its renew deadline (`Lost { reason: RenewDeadline }` after 7 s); the default
/// is now a dead-connection guard (10 s) that leaves the elector's bound to decide. The renew window (deadline 7 s less the renewal at a third of 9 s) is 4 s,
/// twice the delay, for a loaded API server's own latency on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_later_than_the_old_backend_bound_keep_the_term() {
    keeps_its_term_while_answered_late(LateTimings {
        lease: Duration::from_secs(9),
        renew_deadline: Duration::from_secs(7),
        retry: Duration::from_secs(1),
        late_by: Duration::from_secs(2),
    })
    .await;
}

/// An election's timings and how late each of its Lease requests is answered.
struct LateTimings {
    lease: Duration,
    renew_deadline: Duration,
    retry: Duration,
    late_by: Duration,
}

/// An elector on a backend with default `KubeOptions` (the namespace aside) whose every
/// request on its Lease is answered `late_by` after the server applied it, and no request
/// timeout set: it must win one term and hold it for two leases, renewed along the way, with
/// every validity counted from a write's send.
async fn keeps_its_term_while_answered_late(t: LateTimings) {
    let held_for = t.lease * 2;
    let path = shared().admin_kubeconfig();
    let kc = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let name = unique("late-lease");
    // The layer matches the Lease's own path (`.../leases/NAME`); it outlives the test.
    let lease_path: &'static str = Box::leak(format!("/leases/{name}").into_boxed_str());
    let late = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let requests = Arc::new(AtomicUsize::new(0));
    let wrote = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let layer = Late::layer(lease_path, t.late_by, &late, &requests, &wrote);
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("builder")
        .with_layer(&layer)
        .build();
    let backend =
        KubeBackend::from_client(client, KubeOptions::new().namespace(NS)).expect("backend");
    let locker = Locker::with_identity(backend, "slow-leader").expect("identity");
    let election = ElectionConfig::new()
        .lease_duration(t.lease)
        .renew_deadline(t.renew_deadline)
        .retry_period(t.retry)
        .stop_margin(Duration::from_millis(300));
    let elector = tenure::election::LeaderElector::new(locker, &name, election).expect("elector");
    let terms = Arc::new(AtomicUsize::new(0));
    let renewals = Arc::new(AtomicUsize::new(0));
    // Validities later than a lease after the latest write's send: counted from an answer.
    let too_late = Arc::new(std::sync::Mutex::new(Vec::<Duration>::new()));
    let lease = t.lease;
    let run = elector.run(|term| {
        let (terms, renewals, too_late, wrote) = (
            terms.clone(),
            renewals.clone(),
            too_late.clone(),
            wrote.clone(),
        );
        async move {
            terms.fetch_add(1, Ordering::SeqCst);
            term.on_renewal(move |valid_until| {
                renewals.fetch_add(1, Ordering::SeqCst);
                let sent = wrote
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .expect("a write was sent before any grant");
                if valid_until > sent + lease {
                    too_late
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(valid_until - (sent + lease));
                }
            });
            tokio::select! {
                () = tokio::time::sleep(held_for) => "held",
                () = term.cancellation().cancelled() => "lost",
            }
        }
    });
    let outcome = tokio::time::timeout(held_for * 3, run).await;
    let requests = requests.load(Ordering::SeqCst);
    assert!(
        matches!(outcome, Ok(Ok("held"))),
        "the term was not held for {held_for:?} with answers {:?} late: \
         {outcome:?} after {} term(s), {} renewal notice(s), {requests} request(s)",
        t.late_by,
        terms.load(Ordering::SeqCst),
        renewals.load(Ordering::SeqCst),
    );
    assert_eq!(terms.load(Ordering::SeqCst), 1, "one term");
    // Renewed every lease/3 (each answered late) over two leases: 6 renewals, plus the grant's
    // notice; a renewal the scheduler sends late still leaves 4.
    assert!(
        renewals.load(Ordering::SeqCst) >= 4,
        "the term was not renewed: {} notice(s)",
        renewals.load(Ordering::SeqCst)
    );
    assert_eq!(
        *too_late
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
        Vec::<Duration>::new(),
        "validity counted from a late answer, not from the write's send"
    );
}

/// A heartbeat that changes nothing in the record still renews the member Lease: its renew
/// time moves (so observers do not let the member run out) and so does its version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_heartbeat_still_renews_the_member_lease() {
    use k8s_openapi::api::coordination::v1::Lease;
    let backend = KubeBackend::from_kubeconfig(
        &shared().admin_kubeconfig(),
        KubeOptions::new().namespace(NS),
    )
    .await
    .expect("backend");
    let leases: kube::Api<Lease> = kube::Api::namespaced(shared().admin().await, NS);
    let group = unique("same-heartbeat");
    let me = Member {
        identity: "steady-replica".into(),
        shards: 2,
        joined_ms: 1,
        holds: vec![1],
    };
    let ttl = Duration::from_secs(30);
    let member_lease = || async {
        let mut mine = kube_support::leases_named_from(&leases, &format!("{group}-member-")).await;
        assert_eq!(mine.len(), 1, "one member Lease");
        let lease = mine.remove(0);
        (
            lease.metadata.resource_version.expect("a version"),
            lease
                .spec
                .and_then(|s| s.renew_time)
                .expect("a renew time")
                .0,
        )
    };
    backend
        .announce_member(&group, &me, ttl)
        .await
        .expect("the first heartbeat");
    let (version, renewed) = member_lease().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    backend
        .announce_member(&group, &me, ttl)
        .await
        .expect("the same heartbeat again");
    let (again, renewed_again) = member_lease().await;
    assert_ne!(version, again, "the unchanged heartbeat wrote nothing");
    assert!(
        renewed_again > renewed,
        "the renew time did not move: {renewed:?} then {renewed_again:?}"
    );
    backend
        .withdraw_member(&group, &me.identity)
        .await
        .expect("withdraw");
}
