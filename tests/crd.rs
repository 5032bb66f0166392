//! The `Election` CRD and the status publisher against a real kube-apiserver: the committed
//! YAML is the generator's output, the API server accepts and enforces the schema, status
//! follows the leader on the Kubernetes and memory backends, writes stay bounded however
//! often the lease renews, a publisher without permission never disturbs its elector, and
//! the printer columns show leader and token.

#[path = "support/captured.rs"]
mod captured;
mod kube_support;

use std::path::PathBuf;
use std::time::Duration;

use captured::Captured;
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube_support::{shared, unique};
use tenure::FencingToken;
use tenure::backend::Handoff;
use tenure::backend::faulty::FaultyBackend;
use tenure::backend::memory::MemoryBackend;
use tenure::crd::{
    BackendKind, Election, ElectionBackend, ElectionSpec, ElectionStatus, HandoffReason,
    LEADER_ELECTED, PublishError, PublisherStats, StatusPublisher,
};
use tenure::election::{ElectionConfig, HealthPolicy, LeaderElector};
use tenure::{Backend, Locker};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const BLESS_HINT: &str =
    "regenerate with `TENURE_BLESS=1 cargo test --features crd,conformance --test crd`";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The committed copies of the generated YAML: the crate's and the Helm chart's.
fn yaml_copies() -> [PathBuf; 2] {
    [
        repo().join("crds/election.yaml"),
        repo().join("charts/tenure/crds/election.yaml"),
    ]
}

#[test]
fn committed_yaml_is_the_generators_output() {
    let generated = tenure::crd::crd_yaml();
    let [crate_copy, chart_copy] = yaml_copies();
    if std::env::var_os("TENURE_BLESS").is_some_and(|v| v == "1") {
        for path in [&crate_copy, &chart_copy] {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            }
            std::fs::write(path, &generated).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
    let committed = std::fs::read_to_string(&crate_copy)
        .unwrap_or_else(|e| panic!("{}: {e}; {BLESS_HINT}", crate_copy.display()));
    assert!(
        committed == generated,
        "{} differs from tenure::crd::crd_yaml(); {BLESS_HINT}",
        crate_copy.display()
    );
    // The chart is written separately; when it carries the CRD, it must be the same file.
    if chart_copy.exists() {
        let chart = std::fs::read_to_string(&chart_copy)
            .unwrap_or_else(|e| panic!("{}: {e}", chart_copy.display()));
        assert!(
            chart == generated,
            "{} differs from tenure::crd::crd_yaml(); {BLESS_HINT}",
            chart_copy.display()
        );
    }
    // It parses back into the same CRD.
    let parsed: CustomResourceDefinition =
        serde_saphyr::from_str(&committed).unwrap_or_else(|e| panic!("parse: {e}"));
    assert_eq!(parsed, tenure::crd::crd());
}

/// A fresh namespace with the CRD installed, and an admin client.
async fn setup(prefix: &str) -> (kube::Client, String) {
    let server = shared();
    let client = server.admin().await;
    kube_support::install_crd(&client).await;
    let ns = unique(prefix);
    server.namespace(&ns).await;
    (client, ns)
}

async fn create_election(client: &kube::Client, ns: &str, name: &str, spec: ElectionSpec) {
    let api: Api<Election> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &Election::new(name, spec))
        .await
        .unwrap_or_else(|e| panic!("create election {ns}/{name}: {e}"));
}

async fn status(client: &kube::Client, ns: &str, name: &str) -> Option<ElectionStatus> {
    let api: Api<Election> = Api::namespaced(client.clone(), ns);
    api.get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get election: {e}"))
        .and_then(|e| e.status)
}

/// Polls the Election until `check` holds on its status; panics with the last status seen.
async fn until_status(
    client: &kube::Client,
    ns: &str,
    name: &str,
    what: &str,
    mut check: impl FnMut(&ElectionStatus) -> bool,
) -> ElectionStatus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let seen = status(client, ns, name).await;
        if let Some(s) = &seen
            && check(s)
        {
            return s.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}; status: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Durations a real API server copes with (Lease durations are whole seconds), also on a
/// loaded machine: a renewal every 2 s, due within 2 s more, and no request bound of our own
/// (a renewal may take until its deadline). An 800 ms bound on a 3 s lease gave each renewal
/// one attempt, and a slow one lost the term the test counted on (#42).
fn kube_config() -> ElectionConfig {
    ElectionConfig::new()
        .lease_duration(Duration::from_secs(6))
        .renew_deadline(Duration::from_secs(4))
        .retry_period(Duration::from_secs(1))
        .stop_margin(Duration::from_millis(500))
}

/// Short durations for the memory backend: a renewal every 667 ms, due within 833 ms more.
/// The store answers at once, so only this process's own scheduling can delay a renewal, and
/// it did: a lease of 300 ms (a renewal every 100 ms, due 100 ms after it) lost terms beside
/// one busy loop per core at load 14–20 (#42: 2 of 3 runs of the four tests using it failed),
/// and so did one of 900 ms (due 300 ms after it: both electors of
/// `status_writes_do_not_scale_with_renewals` in 1 of 2 such runs).
const FAST_LEASE: Duration = Duration::from_secs(2);

fn fast_config() -> ElectionConfig {
    ElectionConfig::new()
        .lease_duration(FAST_LEASE)
        .renew_deadline(Duration::from_millis(1500))
        .retry_period(Duration::from_millis(150))
        .stop_margin(Duration::from_millis(150))
}

/// A replica: an elector running until `stop`, reporting each term's token, with a
/// publisher beside it.
struct Replica {
    elector: LeaderElector,
    stop: CancellationToken,
    terms: mpsc::UnboundedReceiver<FencingToken>,
    stats: PublisherStats,
    run: JoinHandle<()>,
    publishing: JoinHandle<()>,
}

impl Replica {
    fn start(elector: LeaderElector, publisher: StatusPublisher) -> Self {
        let stop = CancellationToken::new();
        let (tx, terms) = mpsc::unbounded_channel();
        let stats = publisher.stats();
        let publishing =
            tokio::spawn(publisher.run(elector.clone(), stop.clone().cancelled_owned()));
        let run = {
            let (elector, stop) = (elector.clone(), stop.clone());
            tokio::spawn(async move {
                let result = elector
                    .run_until(stop.cancelled(), |term| {
                        let tx = tx.clone();
                        async move {
                            let _ = tx.send(term.fencing_token());
                            term.cancellation().cancelled().await;
                        }
                    })
                    .await;
                assert!(
                    result.is_ok(),
                    "the elector ended otherwise than by shutdown: {result:?}"
                );
            })
        };
        Self {
            elector,
            stop,
            terms,
            stats,
            run,
            publishing,
        }
    }

    async fn term(&mut self) -> FencingToken {
        tokio::time::timeout(Duration::from_secs(30), self.terms.recv())
            .await
            .unwrap_or_else(|_| panic!("{} never led", self.elector.identity()))
            .unwrap_or_else(|| panic!("{} stopped", self.elector.identity()))
    }

    /// Shuts the elector and the publisher down and waits for both.
    async fn shutdown(self) -> PublisherStats {
        self.stop.cancel();
        self.run
            .await
            .unwrap_or_else(|e| panic!("elector task: {e}"));
        self.publishing
            .await
            .unwrap_or_else(|e| panic!("publisher task: {e}"));
        self.stats
    }
}

fn elector(
    backend: impl Backend,
    identity: &str,
    lease: &str,
    config: ElectionConfig,
) -> LeaderElector {
    let locker = Locker::with_identity(backend, identity).unwrap_or_else(|e| panic!("{e}"));
    LeaderElector::new(locker, lease, config).unwrap_or_else(|e| panic!("{e}"))
}

fn candidates(s: &ElectionStatus) -> Vec<&str> {
    s.candidates.iter().map(|c| c.identity.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_accepts_and_enforces_the_schema() {
    let (client, ns) = setup("el-schema").await;
    let api: Api<Election> = Api::namespaced(client.clone(), &ns);
    let mut spec = ElectionSpec::new("my-lock", ElectionBackend::redis().key_prefix("app:"));
    spec.lease_duration = Some(Duration::from_millis(1500).into());
    spec.renew_deadline = Some(Duration::from_secs(1).into());
    spec.retry_period = Some(Duration::from_millis(200).into());
    let created = api
        .create(
            &PostParams::default(),
            &Election::new("typed", spec.clone()),
        )
        .await
        .unwrap_or_else(|e| panic!("create: {e}"));
    assert_eq!(
        created.spec, spec,
        "the spec round-trips, sub-second durations included"
    );
    let raw: serde_json::Value = serde_json::to_value(&created).unwrap_or_default();
    assert_eq!(raw["spec"]["leaseDuration"], "1.5s");
    assert_eq!(raw["spec"]["retryPeriod"], "200ms");
    assert_eq!(raw["spec"]["backend"]["type"], "Redis");

    // Invalid objects are refused by the API server, not discovered by a publisher later.
    let base = |name: &str, spec: serde_json::Value| {
        serde_json::json!({
            "apiVersion": "tenure.dev/v1alpha1", "kind": "Election",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        })
    };
    let dyn_api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::api::ApiResource::erase::<Election>(&()),
    );
    for (name, spec, why) in [
        (
            "bad-duration",
            serde_json::json!({"lease": "x", "backend": {"type": "Kubernetes"}, "leaseDuration": "15 seconds"}),
            "a duration that is not Go syntax",
        ),
        (
            "bad-backend",
            serde_json::json!({"lease": "x", "backend": {"type": "Consul"}}),
            "an unknown backend",
        ),
        (
            "no-lease",
            serde_json::json!({"lease": "", "backend": {"type": "Kubernetes"}}),
            "an empty lease name",
        ),
    ] {
        // Raw JSON: the typed spec cannot even express these.
        let object: kube::api::DynamicObject =
            serde_json::from_value(base(name, spec)).unwrap_or_else(|e| panic!("{e}"));
        match dyn_api.create(&PostParams::default(), &object).await {
            Err(kube::Error::Api(s)) if s.code == 422 => {}
            other => panic!("{why} was not refused with 422: {other:?}"),
        }
    }

    // The token field holds any int64 and refuses larger values (the reason the schema
    // says int64 rather than schemars' default uint64).
    for (token, accepted) in [(i64::MAX as u64, true), (u64::MAX, false)] {
        let mut object = dyn_api.get("typed").await.unwrap_or_else(|e| panic!("{e}"));
        object.data["status"] = serde_json::json!({ "fencingToken": token });
        let result = dyn_api
            .replace_status("typed", &PostParams::default(), &object)
            .await;
        assert_eq!(result.is_ok(), accepted, "token {token}: {result:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_follows_the_leader_on_the_kubernetes_backend() {
    let server = shared();
    let (client, ns) = setup("el-kube").await;
    let lease = unique("lease");
    let a = elector(server.backend(&ns).await, "alpha", &lease, kube_config());
    let b = elector(server.backend(&ns).await, "beta", &lease, kube_config());
    create_election(
        &client,
        &ns,
        "ctl",
        ElectionSpec::for_elector(&a, ElectionBackend::kubernetes()),
    )
    .await;
    let publisher = || {
        StatusPublisher::new(client.clone(), &ns, "ctl").min_interval(Duration::from_millis(100))
    };
    let mut alpha = Replica::start(a, publisher());
    let first = alpha.term().await;
    let mut beta = Replica::start(b, publisher());

    let s = until_status(
        &client,
        &ns,
        "ctl",
        "alpha is published with its token and both candidates are listed",
        |s| s.leader.as_deref() == Some("alpha") && s.candidates.len() == 2,
    )
    .await;
    assert_eq!(s.fencing_token, Some(first.get()));
    assert_eq!(s.transitions, Some(0), "the first published term");
    assert!(s.last_transition_time.is_some());
    assert_eq!(candidates(&s), ["alpha", "beta"]);
    let cond = s
        .leader_elected()
        .unwrap_or_else(|| panic!("no condition: {s:#?}"));
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("True", "Elected")
    );
    assert!(cond.message.contains("alpha"), "{}", cond.message);

    // The leader shuts down: beta takes over and publishes a higher token.
    let alpha_stats = alpha.shutdown().await;
    let second = beta.term().await;
    assert!(second > first);
    let s = until_status(&client, &ns, "ctl", "beta is published", |s| {
        s.leader.as_deref() == Some("beta")
    })
    .await;
    assert_eq!(s.fencing_token, Some(second.get()));
    assert_eq!(s.transitions, Some(1), "one new term published");
    assert_eq!(
        candidates(&s),
        ["beta"],
        "alpha left the candidates on shutdown"
    );
    let cond = s
        .leader_elected()
        .unwrap_or_else(|| panic!("no condition: {s:#?}"));
    assert_eq!(cond.status, "True");
    assert!(cond.message.contains("beta"), "{}", cond.message);

    // Beta shuts down with nobody to take over: the leader is cleared, the token kept.
    let beta_stats = beta.shutdown().await;
    let s = status(&client, &ns, "ctl").await.unwrap_or_default();
    assert_eq!(s.leader, None, "{s:#?}");
    assert_eq!(s.fencing_token, Some(second.get()));
    assert_eq!(s.transitions, Some(1));
    assert!(s.candidates.is_empty(), "{s:#?}");
    let cond = s
        .leader_elected()
        .unwrap_or_else(|| panic!("no condition: {s:#?}"));
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "SteppedDown")
    );
    for stats in [alpha_stats, beta_stats] {
        assert_eq!(stats.failures(), 0, "{stats:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_follows_the_leader_on_the_memory_backend_and_creates_the_election() {
    let (client, ns) = setup("el-mem").await;
    let store = MemoryBackend::new();
    let a = elector(store.clone(), "mem-a", "jobs", fast_config());
    let b = elector(store.clone(), "mem-b", "jobs", fast_config());

    // Without `create_if_missing`, a missing Election is reported, and the elector leads.
    let lonely =
        StatusPublisher::new(client.clone(), &ns, "jobs").min_interval(Duration::from_millis(100));
    let mut probe = Replica::start(
        elector(MemoryBackend::new(), "probe", "jobs", fast_config()),
        lonely,
    );
    probe.term().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while probe.stats.last_error().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "no error reported");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        matches!(
            probe.stats.last_error(),
            Some(PublishError::NotFound { .. })
        ),
        "{:?}",
        probe.stats
    );
    assert!(probe.elector.is_leader());
    let stats = probe.shutdown().await;
    assert_eq!(stats.writes(), 0);
    assert!(status(&client, &ns, "jobs").await.is_none());

    let publisher = |e: &LeaderElector| {
        StatusPublisher::new(client.clone(), &ns, "jobs")
            .min_interval(Duration::from_millis(100))
            .create_if_missing(ElectionSpec::for_elector(e, ElectionBackend::memory()))
    };
    let (pa, pb) = (publisher(&a), publisher(&b));
    let mut first = Replica::start(a, pa);
    let token = first.term().await;
    let mut second = Replica::start(b, pb);
    let s = until_status(&client, &ns, "jobs", "mem-a is published", |s| {
        s.leader.as_deref() == Some("mem-a") && s.candidates.len() == 2
    })
    .await;
    assert_eq!(s.fencing_token, Some(token.get()));
    let api: Api<Election> = Api::namespaced(client.clone(), &ns);
    let created = api.get("jobs").await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(created.spec.lease, "jobs");
    assert_eq!(created.spec.backend.kind, BackendKind::Memory);
    assert_eq!(
        created.spec.lease_duration.map(Duration::from),
        Some(FAST_LEASE)
    );

    first.shutdown().await;
    let next = second.term().await;
    assert!(next > token);
    let s = until_status(&client, &ns, "jobs", "mem-b is published", |s| {
        s.leader.as_deref() == Some("mem-b")
    })
    .await;
    assert_eq!(s.fencing_token, Some(next.get()));
    assert_eq!(s.transitions, Some(1));
    second.shutdown().await;
}

/// Counts the Election's writes from a watch: one per new resourceVersion.
fn count_writes(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> (JoinHandle<u64>, CancellationToken) {
    let api: Api<Election> = Api::namespaced(client.clone(), ns);
    let stop = CancellationToken::new();
    let name = name.to_owned();
    let done = stop.clone();
    let task = tokio::spawn(async move {
        let current = api.get(&name).await.unwrap_or_else(|e| panic!("{e}"));
        let mut version = current.metadata.resource_version.unwrap_or_default();
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        let mut writes = 0;
        let mut events = api
            .watch(&params, &version)
            .await
            .unwrap_or_else(|e| panic!("watch: {e}"))
            .boxed();
        loop {
            tokio::select! {
                () = done.cancelled() => return writes,
                event = events.next() => match event {
                    Some(Ok(WatchEvent::Modified(e))) => {
                        let rv = e.metadata.resource_version.unwrap_or_default();
                        if rv != version {
                            writes += 1;
                            version = rv;
                        }
                    }
                    Some(Ok(WatchEvent::Bookmark(_) | WatchEvent::Added(_))) => {}
                    other => panic!("unexpected watch event: {other:?}"),
                }
            }
        }
    });
    (task, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_do_not_scale_with_renewals() {
    // Long enough for ~30 renewals (one every 667 ms) against at most 18 status writes.
    const RUN: Duration = Duration::from_secs(20);
    const HEARTBEAT: Duration = Duration::from_secs(4);
    let (client, ns) = setup("el-bound").await;
    create_election(
        &client,
        &ns,
        "busy",
        ElectionSpec::new("busy", ElectionBackend::memory()),
    )
    .await;
    let (watch, stop_watch) = count_writes(&client, &ns, "busy");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let store = FaultyBackend::new(MemoryBackend::new());
    let publisher = || {
        StatusPublisher::new(client.clone(), &ns, "busy")
            .min_interval(Duration::from_millis(100))
            .heartbeat(HEARTBEAT)
    };
    let mut leader = Replica::start(
        elector(store.clone(), "busy-a", "busy", fast_config()),
        publisher(),
    );
    leader.term().await;
    let follower = Replica::start(
        elector(store.clone(), "busy-b", "busy", fast_config()),
        publisher(),
    );
    tokio::time::sleep(RUN).await;
    let renewals = store.counts().renewals;
    let leader_stats = leader.shutdown().await;
    let follower_stats = follower.shutdown().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_watch.cancel();
    let watched = watch.await.unwrap_or_else(|e| panic!("{e}"));

    // Per candidate: its first entry, one refresh per (jittered, ≥ 0.9 ×) heartbeat, and the
    // leave on shutdown; plus one write per term: the leader's, and the follower's, which
    // takes over while the leader shuts down.
    let per_candidate = 2 + (RUN.as_secs_f64() / (0.9 * HEARTBEAT.as_secs_f64())).ceil() as u64;
    let bound = 2 * per_candidate + 2;
    let published = leader_stats.writes() + follower_stats.writes();
    // A write the publisher cannot confirm may still have landed: one in flight when
    // shutdown cut it off (counted as a failure), or a PUT kube's client retried after a 504
    // the server had applied, whose retry conflicts and whose re-read finds nothing left to
    // write (counted as a conflict). Those bound the difference.
    let unconfirmed = leader_stats.conflicts()
        + follower_stats.conflicts()
        + leader_stats.failures()
        + follower_stats.failures();
    println!(
        "renewals: {renewals}, status writes seen by the watch: {watched}, counted by the \
         publishers: {published} (leader {}, follower {}), unconfirmed: {unconfirmed}, \
         bound: {bound}",
        leader_stats.writes(),
        follower_stats.writes()
    );
    // Most of the renewals due (RUN / a third of the lease), whatever a loaded machine
    // delays: comfortably more than the bound on writes.
    let due = RUN.as_secs_f64() / (FAST_LEASE.as_secs_f64() / 3.0);
    assert!(
        renewals as f64 >= due * 0.8,
        "the lease renewed only {renewals} times of {due} due"
    );
    assert!(renewals > bound, "{renewals} renewals, bound {bound}");
    assert!(
        (published..=published + unconfirmed).contains(&watched),
        "every write the publishers count is one the watch saw, and the watch saw no write \
         the publishers did not attempt: watched {watched}, published {published}, \
         unconfirmed {unconfirmed}"
    );
    assert!(
        watched <= bound,
        "{watched} status writes for {renewals} renewals (bound {bound})"
    );
    assert!(watched >= 4, "the heartbeats did write: {watched}");
    for stats in [&leader_stats, &follower_stats] {
        assert!(
            stats.last_error().is_none(),
            "a publisher failed: {:?}",
            stats.last_error()
        );
    }
}

/// The `tester` user has no permission on elections: the publisher logs (once, at warn),
/// keeps retrying quietly, and the elector — on the Kubernetes backend, as admin — leads on.
#[test]
fn a_publisher_without_permission_logs_and_the_elector_keeps_leading() {
    let log = Captured::default();
    let subscriber = log.subscriber(tracing::Level::DEBUG);
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(async {
        let server = shared();
        let (client, ns) = setup("el-rbac").await;
        let lease = unique("lease");
        let leader = elector(
            server.backend(&ns).await,
            "unprivileged",
            &lease,
            kube_config(),
        );
        create_election(
            &client,
            &ns,
            "denied",
            ElectionSpec::for_elector(&leader, ElectionBackend::kubernetes()),
        )
        .await;
        let tester = server.client_from(&server.tester_kubeconfig()).await;
        let publisher = StatusPublisher::new(tester, &ns, "denied")
            .create_if_missing(ElectionSpec::new(&lease, ElectionBackend::kubernetes()));
        let mut replica = Replica::start(leader, publisher);
        replica.term().await;
        // Several renewals and several failed attempts (1 s, 2 s, ...).
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert!(replica.elector.is_leader(), "the elector stopped leading");
        assert!(
            replica.terms.try_recv().is_err(),
            "the term was interrupted"
        );
        let stats = replica.stats.clone();
        assert!(stats.failures() >= 2, "{stats:?}");
        assert_eq!(stats.writes(), 0);
        match stats.last_error() {
            Some(PublishError::Forbidden { op, message }) => {
                assert!(op.contains("elections/status"), "{op}");
                assert!(message.contains("forbidden"), "{message}");
            }
            other => panic!("expected Forbidden, got {other:?}"),
        }
        let lease_record = server
            .lease(&ns, &lease)
            .await
            .unwrap_or_else(|| panic!("no lease"));
        assert_eq!(
            lease_record.spec.and_then(|s| s.holder_identity).as_deref(),
            Some("unprivileged")
        );
        replica.shutdown().await;
        let s = status(&client, &ns, "denied").await;
        assert!(
            s.is_none_or(|s| s.leader.is_none()),
            "nothing was published"
        );
    });
    let text = log.text();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("cannot publish the election's status"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning for repeated failures of one kind:\n{text}"
    );
    assert!(warnings[0].contains("forbidden"), "{}", warnings[0]);
    assert!(
        text.lines()
            .any(|l| l.contains("DEBUG") && l.contains("cannot publish")),
        "repeats are logged at debug:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printer_columns_show_leader_and_token() {
    let (client, ns) = setup("el-table").await;
    let store = MemoryBackend::new();
    let leader = elector(store, "pod-7", "table-lease", fast_config());
    let publisher = StatusPublisher::new(client.clone(), &ns, "shown")
        .min_interval(Duration::from_millis(100))
        .create_if_missing(ElectionSpec::for_elector(&leader, ElectionBackend::redis()));
    let mut replica = Replica::start(leader, publisher);
    let token = replica.term().await;
    until_status(&client, &ns, "shown", "pod-7 is published", |s| {
        s.leader.as_deref() == Some("pod-7")
    })
    .await;

    // What `kubectl get elections` asks for.
    let request = http::Request::get(format!(
        "/apis/tenure.dev/v1alpha1/namespaces/{ns}/elections"
    ))
    .header(
        "Accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .body(Vec::new())
    .unwrap_or_else(|e| panic!("{e}"));
    let text = client
        .request_text(request)
        .await
        .unwrap_or_else(|e| panic!("table request: {e}"));
    let table: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(table["kind"], "Table", "{text}");
    let columns: Vec<(String, i64)> = table["columnDefinitions"]
        .as_array()
        .unwrap_or_else(|| panic!("no columns: {text}"))
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_uppercase(),
                c["priority"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    let shown: Vec<&str> = columns
        .iter()
        .filter(|(_, p)| *p == 0)
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        shown,
        ["NAME", "LEADER", "TOKEN", "SHARDS", "HELD", "AGE"],
        "{text}"
    );
    let wide: Vec<&str> = columns
        .iter()
        .filter(|(_, p)| *p > 0)
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        wide,
        ["TRANSITIONS", "HANDOFF", "LEASE", "BACKEND"],
        "{text}"
    );
    let rows = table["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("no rows: {text}"));
    assert_eq!(rows.len(), 1, "{text}");
    let cells = rows[0]["cells"]
        .as_array()
        .unwrap_or_else(|| panic!("no cells: {text}"));
    let cell = |name: &str| {
        let i = columns
            .iter()
            .position(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no column {name}"));
        cells[i].clone()
    };
    assert_eq!(cell("NAME"), "shown");
    assert_eq!(cell("LEADER"), "pod-7");
    assert_eq!(cell("TOKEN").as_u64(), Some(token.get()), "{text}");
    assert_eq!(cell("TRANSITIONS").as_u64(), Some(0));
    assert_eq!(cell("LEASE"), "table-lease");
    assert_eq!(cell("BACKEND"), "Redis");
    // A plain election has no shard columns' values.
    assert!(cell("SHARDS").is_null() && cell("HELD").is_null(), "{text}");
    replica.shutdown().await;
    let s = status(&client, &ns, "shown").await.unwrap_or_default();
    assert_eq!(s.leader, None);
    assert!(
        s.leader_elected()
            .is_some_and(|c| c.type_ == LEADER_ELECTED && c.status == "False")
    );
}

/// A leader whose term ends without a shutdown (its workload returned) while its publisher
/// keeps running: once nobody has published a newer term for 2 × the lease duration, the
/// publisher clears the leader itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_stepped_down_is_cleared_when_nobody_takes_over() {
    let (client, ns) = setup("el-step").await;
    let leader = elector(MemoryBackend::new(), "short-job", "once", fast_config());
    let publisher = StatusPublisher::new(client.clone(), &ns, "once")
        .min_interval(Duration::from_millis(100))
        .create_if_missing(ElectionSpec::for_elector(
            &leader,
            ElectionBackend::memory(),
        ));
    let stats = publisher.stats();
    let stop = CancellationToken::new();
    let publishing = tokio::spawn(publisher.run(leader.clone(), stop.clone().cancelled_owned()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let finish = CancellationToken::new();
    let run = tokio::spawn({
        let (leader, finish) = (leader.clone(), finish.clone());
        async move {
            leader
                .run(|term| {
                    let (tx, finish) = (tx.clone(), finish.clone());
                    async move {
                        let _ = tx.send(term.fencing_token());
                        finish.cancelled().await;
                    }
                })
                .await
        }
    });
    let token = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("never led"));
    until_status(&client, &ns, "once", "the leader is published", |s| {
        s.leader.as_deref() == Some("short-job")
    })
    .await;
    finish.cancel();
    run.await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("the workload's term: {e}"));
    assert!(!leader.is_leader());
    let s = until_status(&client, &ns, "once", "the leader is cleared", |s| {
        s.leader.is_none()
    })
    .await;
    assert_eq!(s.fencing_token, Some(token.get()), "the token is kept");
    assert_eq!(s.transitions, Some(0));
    assert_eq!(
        candidates(&s),
        ["short-job"],
        "still a candidate: its publisher runs"
    );
    let cond = s
        .leader_elected()
        .unwrap_or_else(|| panic!("no condition: {s:#?}"));
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "SteppedDown")
    );
    stop.cancel();
    publishing.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(stats.failures(), 0, "{stats:?}");
}

/// The hand-off `s` shows: reason, from, to and the ended term's token.
fn handoff(s: &ElectionStatus) -> Option<(HandoffReason, &str, Option<&str>, u64)> {
    s.last_handoff
        .as_ref()
        .map(|h| (h.reason, h.from.as_str(), h.to.as_deref(), h.fencing_token))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_shows_why_leadership_was_handed_over() {
    let server = shared();
    let (client, ns) = setup("el-handoff").await;
    let lease = unique("lease");
    let a = elector(server.backend(&ns).await, "alpha", &lease, kube_config());
    let store = server.backend(&ns).await;
    let b = elector(store.clone(), "beta", &lease, kube_config());
    create_election(
        &client,
        &ns,
        "moved",
        ElectionSpec::for_elector(&a, ElectionBackend::kubernetes()),
    )
    .await;
    let publisher = || {
        StatusPublisher::new(client.clone(), &ns, "moved").min_interval(Duration::from_millis(100))
    };
    let mut alpha = Replica::start(a, publisher());
    let first = alpha.term().await;
    let mut beta = Replica::start(b, publisher());
    until_status(&client, &ns, "moved", "both candidates are listed", |s| {
        candidates(s) == ["alpha", "beta"]
    })
    .await;
    assert_eq!(
        status(&client, &ns, "moved")
            .await
            .and_then(|s| s.last_handoff),
        None,
        "no hand-off yet"
    );

    // The library call.
    assert!(
        alpha
            .elector
            .hand_over(Handoff::To("beta".into()), "maintenance")
    );
    let second = beta.term().await;
    assert!(second > first);
    let s = until_status(&client, &ns, "moved", "alpha's hand-over is shown", |s| {
        s.last_handoff.is_some()
    })
    .await;
    assert_eq!(
        handoff(&s),
        Some((HandoffReason::Requested, "alpha", Some("beta"), first.get())),
        "{s:#?}"
    );
    let shown = s.last_handoff.as_ref().and_then(|h| h.message.as_deref());
    assert_eq!(shown, Some("maintenance"));

    // An operator's request through the store (what `tenure handoff --to alpha` writes).
    store
        .request_handoff(
            &lease,
            &Handoff::To("alpha".into()),
            Duration::from_secs(10),
        )
        .await
        .unwrap_or_else(|e| panic!("request_handoff: {e}"));
    let third = alpha.term().await;
    assert!(third > second);
    let s = until_status(&client, &ns, "moved", "beta's hand-over is shown", |s| {
        s.last_handoff.as_ref().is_some_and(|h| h.from == "beta")
    })
    .await;
    assert_eq!(
        handoff(&s),
        Some((
            HandoffReason::Requested,
            "beta",
            Some("alpha"),
            second.get()
        )),
        "{s:#?}"
    );

    // A graceful shutdown of the leader.
    let alpha_stats = alpha.shutdown().await;
    let what = format!(
        "alpha's shutdown is shown (alpha's publisher: {} writes, {} conflicts, {} failures, last error {:?})",
        alpha_stats.writes(),
        alpha_stats.conflicts(),
        alpha_stats.failures(),
        alpha_stats.last_error()
    );
    let s = until_status(&client, &ns, "moved", &what, |s| {
        s.last_handoff.as_ref().is_some_and(|h| h.from == "alpha")
    })
    .await;
    assert_eq!(
        handoff(&s),
        Some((HandoffReason::GracefulShutdown, "alpha", None, third.get())),
        "{s:#?}"
    );
    beta.term().await;
    beta.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_shows_a_health_step_down() {
    let server = shared();
    let (client, ns) = setup("el-health").await;
    let lease = unique("lease");
    let config = kube_config().health(
        HealthPolicy::new()
            .unhealthy_after(Duration::from_secs(1))
            .recovery(Duration::from_secs(60)),
    );
    let a = elector(server.backend(&ns).await, "alpha", &lease, config.clone());
    let b = elector(server.backend(&ns).await, "beta", &lease, config);
    create_election(
        &client,
        &ns,
        "healthy",
        ElectionSpec::for_elector(&a, ElectionBackend::kubernetes()),
    )
    .await;
    let publisher = || {
        StatusPublisher::new(client.clone(), &ns, "healthy")
            .min_interval(Duration::from_millis(100))
    };
    let mut alpha = Replica::start(a, publisher());
    let first = alpha.term().await;
    let mut beta = Replica::start(b, publisher());
    until_status(&client, &ns, "healthy", "both candidates are listed", |s| {
        candidates(s) == ["alpha", "beta"]
    })
    .await;
    alpha.elector.report_health(false);
    let second = beta.term().await;
    assert!(second > first);
    let s = until_status(
        &client,
        &ns,
        "healthy",
        "the step-down and the new leader are shown",
        |s| s.last_handoff.is_some() && s.fencing_token == Some(second.get()),
    )
    .await;
    assert_eq!(
        handoff(&s),
        Some((
            HandoffReason::HealthStepDown,
            "alpha",
            Some("beta"),
            first.get()
        )),
        "{s:#?}"
    );
    assert_eq!(
        s.leader.as_deref(),
        Some("beta"),
        "the new leader is published beside the hand-off: {s:#?}"
    );
    alpha.shutdown().await;
    beta.shutdown().await;
}
