//! Fencing enforced by a real kube-apiserver: the generated ValidatingAdmissionPolicy with the
//! election's Lease as its parameter, and `tenure::fence::kube`'s fenced writes. Every stale
//! write is sent to the server (with a token handed over, so no local check stops it first)
//! and must be refused by it; the successor's writes, and everyone else's, must land. The
//! stale leader is frozen (SIGSTOP) or partitioned (nftables inside a network namespace the
//! test makes, its only way to the server a relay on loopback).

mod kube_support;
mod safety;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_support::fencing::{cm, install, obj, participant};
use kube_support::{shared, unique};
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::fence::kube::{Current, FenceError, FencedApi, Fencer, FencingPolicy};
use tenure::lock::LockOptions;
use tenure::{FencingToken, Locker};

fn deployment(name: &str) -> Deployment {
    obj(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "example.invalid/none"}]}
            }
        }
    }))
}

/// Asserts a refusal by the API server (the only kind that names the lease).
fn assert_stale<T: std::fmt::Debug>(what: &str, r: Result<T, FenceError>, ours: u64) -> Current {
    match r {
        Err(FenceError::Stale {
            ours: o,
            current,
            lease: Some(_),
        }) => {
            assert_eq!(o, ours, "{what}");
            current
        }
        other => panic!("{what}: expected a stale refusal from the API server, got {other:?}"),
    }
}

/// The election's Lease is taken by `locker` (a term), and its token returned.
async fn take(locker: &Locker, lease: &str) -> (tenure::lock::Lease, FencingToken) {
    let held = locker
        .acquire(
            lease,
            &LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(20))
                .auto_renew(true),
        )
        .await
        .unwrap_or_else(|e| panic!("acquire {lease}: {e}"));
    let token = held.fencing_token();
    (held, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_every_stale_write_and_admits_the_successor() {
    let server = shared();
    let ns = unique("fence");
    server.namespace(&ns).await;
    let lease = "controller";
    let (client, _) = participant(&ns, "controller").await;
    let policy = FencingPolicy::new(&ns, lease)
        .and_then(|p| p.service_account(&ns, "controller"))
        .and_then(|p| p.resource("configmaps"))
        .and_then(|p| p.resource("deployments.apps"))
        .expect("valid policy");
    let plain: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);

    // Term A: the Lease exists from the first grant.
    let backend = |c: kube::Client| {
        KubeBackend::from_client(c, KubeOptions::new().namespace(ns.clone())).expect("backend")
    };
    let a = Locker::with_identity(backend(client.clone()), "a").expect("identity");
    let (held_a, token_a) = take(&a, lease).await;
    install(&policy, &plain).await;

    let fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    let cms_a: FencedApi<ConfigMap> = fencer.namespaced_with_token(lease, token_a, &ns);
    let deps_a: FencedApi<Deployment> = fencer.namespaced_with_token(lease, token_a, &ns);
    let pp = PostParams::default();
    for name in ["touched", "untouched", "doomed"] {
        cms_a
            .create(&pp, &cm(name, "a"))
            .await
            .unwrap_or_else(|e| panic!("a creates {name}: {e}"));
    }
    let dep = deps_a
        .create(&pp, &deployment("app"))
        .await
        .expect("a creates a deployment");
    assert_eq!(
        dep.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("tenure.dev/fencing-token")),
        Some(&token_a.get().to_string()),
        "a fenced write stamps the token on the object"
    );
    // A participant's write without a token is refused.
    let unfenced = plain.create(&pp, &cm("unfenced", "x")).await;
    assert!(
        matches!(&unfenced, Err(kube::Error::Api(s)) if s.message.contains("missing token")),
        "{unfenced:?}"
    );

    // A's term ends without a release (frozen, partitioned): B takes over after the ttl.
    held_a.orphan();
    // Watch the Lease's every version across the takeover: the grant itself must already
    // refuse A (zero gap), not only the stamp that follows it.
    let leases: Api<Lease> = Api::namespaced(server.admin().await, &ns);
    let before = leases.get(lease).await.expect("lease");
    let from = before.metadata.resource_version.clone().unwrap_or_default();
    let mut versions = leases
        .watch(
            &kube::api::WatchParams::default().fields(&format!("metadata.name={lease}")),
            &from,
        )
        .await
        .expect("watch")
        .boxed();
    let b = Locker::with_identity(backend(client.clone()), "b").expect("identity");
    let (held_b, token_b) = take(&b, lease).await;
    assert!(token_b > token_a);
    let floor_at = |l: &Lease| -> u64 {
        l.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("tenure.dev/fencing-floor"))
            .and_then(|f| f.parse().ok())
            .unwrap_or(0)
    };
    let mut grant_floor = None;
    while grant_floor.is_none() {
        let event = tokio::time::timeout(Duration::from_secs(5), versions.next())
            .await
            .expect("the grant's version")
            .expect("a watch event")
            .expect("no watch error");
        if let kube::api::WatchEvent::Modified(l) = event
            && l.metadata.resource_version.as_deref() == Some(&token_b.get().to_string())
        {
            grant_floor = Some(floor_at(&l));
        }
    }
    let grant_floor = grant_floor.unwrap_or_default();
    assert!(
        grant_floor > token_a.get() && grant_floor <= token_b.get(),
        "the acquiring write's floor {grant_floor} must exclude a's token {token_a} and admit b's {token_b}"
    );
    let stamped = leases.get(lease).await.expect("lease");
    assert_eq!(
        floor_at(&stamped),
        token_b.get(),
        "the stamp makes the floor exact"
    );
    let cms_b: FencedApi<ConfigMap> = fencer.namespaced_with_token(lease, token_b, &ns);
    let touched = cms_b
        .patch(
            "touched",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"v": "b"}})),
        )
        .await
        .expect("b writes");

    // Every verb A can send now is refused, on objects B touched and on ones it did not.
    let a_ours = token_a.get();
    let mut refused = 0;
    let merge = Patch::Merge(serde_json::json!({"data": {"v": "stale"}}));
    for name in ["touched", "untouched"] {
        let current = assert_stale(
            "merge patch",
            cms_a.patch(name, &PatchParams::default(), &merge).await,
            a_ours,
        );
        assert!(
            matches!(current, Current::Term(t) if t >= token_b.get()),
            "{current:?}"
        );
        refused += 1;
        let strategic = Patch::Strategic(serde_json::json!({"data": {"v": "stale"}}));
        assert_stale(
            "strategic patch",
            cms_a.patch(name, &PatchParams::default(), &strategic).await,
            a_ours,
        );
        let apply = Patch::Apply(
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": "stale"}}),
        );
        assert_stale(
            "server-side apply",
            cms_a
                .patch(name, &PatchParams::apply("a").force(), &apply)
                .await,
            a_ours,
        );
        let mut current = cms_a.get(name).await.expect("read");
        current.data = Some([("v".to_owned(), "stale".to_owned())].into());
        let replaced = cms_a.replace(name, &pp, &current).await;
        if name == "touched" {
            // The object A re-read carries B's token: refused before sending.
            assert!(
                matches!(replaced, Err(FenceError::Stale { lease: None, current: Current::Object(t), .. }) if t == token_b.get()),
                "{replaced:?}"
            );
        } else {
            // It still carries A's own token: the replace reaches the server, which refuses.
            assert_stale("replace", replaced, a_ours);
            refused += 1;
        }
        refused += 3;
    }
    assert_stale(
        "create",
        cms_a.create(&pp, &cm("new-by-a", "stale")).await,
        a_ours,
    );
    assert_stale(
        "delete",
        cms_a.delete("doomed", &DeleteParams::default()).await,
        a_ours,
    );
    let mut status = deps_a.get("app").await.expect("read");
    status.status = Some(obj(
        serde_json::json!({"replicas": 7, "observedGeneration": 1}),
    ));
    assert_stale(
        "status replace",
        deps_a.replace_status("app", &pp, &status).await,
        a_ours,
    );
    assert_stale(
        "status patch",
        deps_a
            .patch_status(
                "app",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"replicas": 9}})),
            )
            .await,
        a_ours,
    );
    refused += 4;
    println!("stale writes refused by the API server: {refused}");

    // Nothing of A's landed: the objects are as B (or A's own term) left them.
    let admin_cms: Api<ConfigMap> = Api::namespaced(server.admin().await, &ns);
    assert_eq!(
        admin_cms.get("touched").await.expect("exists").data,
        touched.data
    );
    let untouched = admin_cms.get("untouched").await.expect("exists");
    assert_eq!(
        untouched.data.and_then(|d| d.get("v").cloned()).as_deref(),
        Some("a")
    );
    assert!(
        admin_cms.get_opt("doomed").await.expect("read").is_some(),
        "a's delete was refused"
    );
    assert!(admin_cms.get_opt("new-by-a").await.expect("read").is_none());

    // B's writes all land, on every verb; a non-participant (admin) is never affected.
    let deps_b: FencedApi<Deployment> = fencer.namespaced_with_token(lease, token_b, &ns);
    deps_b
        .patch_status(
            "app",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"replicas": 1}})),
        )
        .await
        .expect("b writes status");
    cms_b
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("b deletes");
    cms_b
        .create(&pp, &cm("new-by-b", "b"))
        .await
        .expect("b creates");
    admin_cms
        .patch(
            "untouched",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"v": "admin"}})),
        )
        .await
        .expect("a non-participant is not fenced");
    held_b.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_tokens_foreign_holders_and_a_missing_lease_fences_nothing_and_blocks_no_one() {
    let server = shared();
    let ns = unique("fence2");
    server.namespace(&ns).await;
    let lease = "ctl";
    let (client, _) = participant(&ns, "ctl").await;
    let policy = FencingPolicy::new(&ns, lease)
        .and_then(|p| p.service_account(&ns, "ctl"))
        .and_then(|p| p.resource("configmaps"))
        .expect("valid policy");
    let plain: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();

    // Installed as `tenure policy` prints it: the empty Lease first, then the policy.
    let admin = server.admin().await;
    Api::<Lease>::namespaced(admin.clone(), &ns)
        .create(&pp, &policy.lease())
        .await
        .expect("the empty Lease");
    install(&policy, &plain).await;
    let fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    admin_cms
        .create(&pp, &cm("by-admin", "x"))
        .await
        .expect("a non-participant is never fenced");
    // With the Lease gone, nothing is fenced and nobody is blocked (parameterNotFoundAction
    // Allow: Deny would refuse the admin's writes too).
    server.delete_lease(&ns, lease).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while let Err(e) = plain.create(&pp, &cm("while-no-lease", "x")).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "writes still refused without a Lease: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    admin_cms
        .create(&pp, &cm("by-admin-2", "x"))
        .await
        .expect("a non-participant is never fenced, Lease or not");

    let locker = Locker::with_identity(
        KubeBackend::from_client(client.clone(), KubeOptions::new().namespace(ns.clone()))
            .expect("backend"),
        "rust-1",
    )
    .expect("identity");
    let (held, token) = take(&locker, lease).await;
    let ours = fencer.namespaced_with_token::<ConfigMap>(lease, token, &ns);
    ours.create(&pp, &cm("obj", "1"))
        .await
        .expect("the leader writes");

    // An object token no term could have issued (above the floor, set by a non-participant)
    // locks no one out: the policy compares with the Lease's floor only.
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    admin_cms
        .patch("obj", &PatchParams::default(), &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"tenure.dev/fencing-token": (token.get() + 1_000_000).to_string()}}})))
        .await
        .expect("admin stamps a higher token");
    let landed = ours
        .patch(
            "obj",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"v": "2"}})),
        )
        .await
        .expect("a planted object token does not lock the current term out");
    assert_eq!(
        landed
            .metadata
            .annotations
            .and_then(|a| a.get("tenure.dev/fencing-token").cloned()),
        Some(token.get().to_string()),
        "the write stamps its own token over the planted one"
    );

    // The first grant recreated the Lease: a token-less write is refused again.
    let refused = plain.create(&pp, &cm("unfenced-again", "x")).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.message.contains("missing token")),
        "{refused:?}"
    );

    // A client-go replica takes the Lease over (it rewrites the spec and keeps the
    // annotations): token-less writes are admitted, every tokened write is stale.
    held.orphan();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns);
    let mut l = leases.get(lease).await.expect("lease");
    if let Some(spec) = l.spec.as_mut() {
        spec.holder_identity = Some("go-1".into());
    }
    leases
        .replace(lease, &pp, &l)
        .await
        .expect("foreign takeover");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        // The policy reads its parameter from an informer: wait until it sees go-1.
        if plain.create(&pp, &cm("by-go", "x")).await.is_ok() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "token-less writes refused under a foreign holder"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let current = assert_stale(
        "tokened write under a foreign holder",
        ours.create(&pp, &cm("by-rust", "x")).await,
        token.get(),
    );
    assert_eq!(current, Current::ForeignHolder("go-1".into()));
}

const CHILD_KUBECONFIG: &str = "TENURE_FENCE_KUBECONFIG";
const CHILD_NS: &str = "TENURE_FENCE_NS";
const CHILD_LOG: &str = "TENURE_FENCE_LOG";

/// In a candidate process (this binary re-run by a test below, told so by its environment):
/// runs the candidate and returns true.
async fn run_as_candidate() -> bool {
    let (Ok(kubeconfig), Ok(ns), Ok(log), Ok(identity)) = (
        std::env::var(CHILD_KUBECONFIG),
        std::env::var(CHILD_NS),
        std::env::var(CHILD_LOG),
        std::env::var("TENURE_SAFETY_IDENTITY"),
    ) else {
        return false;
    };
    fenced_candidate(&kubeconfig, &ns, &identity, &log).await;
    true
}

/// The election the candidate processes share: a namespace, the ServiceAccount `writer`,
/// the fencing policy of Lease `writers` over configmaps (installed with its empty Lease),
/// and the log every candidate appends to.
struct Writers {
    ns: String,
    kubeconfig: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl Writers {
    async fn new(tag: &str) -> Self {
        let server = shared();
        let ns = unique(tag);
        server.namespace(&ns).await;
        let (client, kubeconfig) = participant(&ns, "writer").await;
        let policy = FencingPolicy::new(&ns, "writers")
            .and_then(|p| p.service_account(&ns, "writer"))
            .and_then(|p| p.resource("configmaps"))
            .expect("policy");
        Api::<Lease>::namespaced(server.admin().await, &ns)
            .create(&PostParams::default(), &policy.lease())
            .await
            .expect("the empty Lease");
        install(&policy, &Api::namespaced(client, &ns)).await;
        let log = kube_support::fresh_dir("fencing").join(format!("{tag}.log"));
        Self {
            ns,
            kubeconfig,
            log,
        }
    }

    /// The environment that turns this binary into a candidate using `kubeconfig`.
    fn env(&self, kubeconfig: &std::path::Path) -> Vec<(&'static str, String)> {
        vec![
            (CHILD_KUBECONFIG, kubeconfig.display().to_string()),
            (CHILD_NS, self.ns.clone()),
            (CHILD_LOG, self.log.display().to_string()),
        ]
    }
}

/// A candidate process: leads with the elector, and from its first term on writes to two
/// ConfigMaps every 20 ms with the **last token it was given**, outside the term's workload
/// and without any local check — the writes a frozen or partitioned leader still has in
/// flight. Logs `GRANT token ns` and `WRITE token ns accepted|refused|error rv obj`.
async fn fenced_candidate(kubeconfig: &str, ns: &str, identity: &str, log: &str) {
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tenure::election::LeaderElector;

    let client = shared().client_from(std::path::Path::new(kubeconfig)).await;
    let backend = KubeBackend::from_kubeconfig(kubeconfig, KubeOptions::new().namespace(ns))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let file = Arc::new(std::sync::Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("{e}")),
    ));
    let note = move |line: String| {
        let mut f = file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = f.write_all(format!("{line}\n").as_bytes());
    };
    let token = Arc::new(AtomicU64::new(0));
    let fencer = Fencer::new(client)
        .await
        .expect("identity")
        .lease_namespace(ns);
    let writer = {
        let (token, note, ns, id) = (
            token.clone(),
            note.clone(),
            ns.to_owned(),
            identity.to_owned(),
        );
        tokio::spawn(async move {
            let mut n = 0u64;
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let t = token.load(Ordering::Acquire);
                if t == 0 {
                    continue;
                }
                n += 1;
                let name = if n.is_multiple_of(2) {
                    "touched".to_owned()
                } else {
                    format!("only-{id}")
                };
                let api: FencedApi<ConfigMap> =
                    fencer.namespaced_with_token("writers", FencingToken::new(t), &ns);
                let patch = Patch::Apply(serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name}, "data": {"by": id.clone(), "n": n.to_string()}
                }));
                let sent = safety::mono_ns();
                let outcome = match api
                    .patch(&name, &PatchParams::apply(&id).force(), &patch)
                    .await
                {
                    Ok(cm) => format!(
                        "accepted {}",
                        cm.metadata.resource_version.unwrap_or_default()
                    ),
                    Err(FenceError::Stale { lease: Some(_), .. }) => "refused 0".to_owned(),
                    Err(e) => format!("error 0 {}", e.to_string().replace(' ', "_")),
                };
                note(format!("WRITE {t} {sent} {outcome} {name}"));
            }
        })
    };
    let locker = Locker::with_identity(backend, identity).expect("identity");
    // A term that lasts until the test ends it: b's writes must all land while it leads.
    let elector = LeaderElector::new(locker, "writers", safety::kube_config()).expect("config");
    let result = elector
        .run(|term| {
            let (token, note) = (token.clone(), note.clone());
            async move {
                token.store(term.fencing_token().get(), Ordering::Release);
                note(format!(
                    "GRANT {} {}",
                    term.fencing_token().get(),
                    safety::mono_ns()
                ));
                term.cancellation().cancelled().await;
                note(format!(
                    "END {} {}",
                    term.fencing_token().get(),
                    safety::mono_ns()
                ));
            }
        })
        .await;
    writer.abort();
    panic!("the candidate's run ended: {result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_resumes_and_every_write_it_sends_is_refused() {
    if run_as_candidate().await {
        return;
    }
    let w = Writers::new("frozen").await;
    let test = "a_frozen_leader_resumes_and_every_write_it_sends_is_refused";
    let a = safety::Candidate::spawn(test, &w.env(&w.kubeconfig), "a");
    wait_grants(&w.log, 1, "a never led");
    let b = safety::Candidate::spawn(test, &w.env(&w.kubeconfig), "b");
    std::thread::sleep(Duration::from_millis(1500));
    a.signal("STOP");
    wait_grants(&w.log, 2, "b never took over from the frozen a");
    std::thread::sleep(Duration::from_millis(300));
    let resumed = safety::mono_ns();
    a.signal("CONT");
    let g = grants(&w.log);
    wait_writes(&w.log, "a", resumed, g[1].0);
    drop(a);
    drop(b);

    let g = grants(&w.log);
    let verdict = judge(&w.log, g[0], g[1], false);
    println!("frozen leader: {verdict:?}");
    verdict.assert_fenced();
}

/// What the writes of `a` (first term) and `b` (the next) came to.
#[derive(Debug)]
struct Verdict {
    /// `a`'s writes the API server refused as stale.
    stale_refused: usize,
    /// `a`'s writes that landed after `b`'s grant (etcd revision above `b`'s token).
    stale_accepted_after_grant: usize,
    /// From `b`'s grant to the first refused write `a` sent after it.
    first_refusal_after_grant: Option<Duration>,
    /// `b`'s writes sent while its term ran (all must have landed).
    b_writes: usize,
    /// `b`'s writes sent after its term ended (any outcome: a later term may fence them).
    b_after_term: usize,
}

impl Verdict {
    fn assert_fenced(&self) {
        assert_eq!(
            self.stale_accepted_after_grant, 0,
            "stale writes landed after the successor's grant: {self:?}"
        );
        assert!(
            self.stale_refused > 0,
            "a sent no stale write to prove anything: {self:?}"
        );
        assert!(
            self.b_writes > B_WRITES,
            "b wrote too little in its term: {self:?}"
        );
    }
}

/// How many writes of `b`'s term are enough to show the successor's writes land: more than
/// this many, each sent and answered in turn.
const B_WRITES: usize = 10;

/// Waits until the log is complete enough to judge (or a minute has passed; the verdict then
/// says what is missing): `who` (the stale leader) had the answer to a write it sent after
/// `after` (monotonic ns) — its writer sends one at a time, so every write it had in flight
/// before, held by the freeze or the partition, has been answered too — and the term with
/// `token_b` had more than [`B_WRITES`] writes. Not a fixed pause: on a loaded machine the
/// writes are answered late, and a partitioned connection's next TCP retransmission can come
/// many seconds after the heal.
fn wait_writes(log: &std::path::Path, who: &str, after: u64, token_b: u64) {
    let own = format!("only-{who}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let b_end = term_end(log, token_b).unwrap_or(u64::MAX);
        let (mut answered, mut b_writes) = (false, 0);
        for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
            let p: Vec<&str> = line.split(' ').collect();
            if p.first() != Some(&"WRITE") || p.len() < 6 {
                continue;
            }
            let (t, sent) = (
                p[1].parse::<u64>().unwrap_or(0),
                p[2].parse::<u64>().unwrap_or(0),
            );
            answered |= sent > after && p.last() == Some(&own.as_str());
            if t == token_b && sent <= b_end {
                b_writes += 1;
            }
        }
        if answered && b_writes > B_WRITES {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Judges the candidates' log: `a` led with `(token, granted_at)` first, `b` second.
/// `a`'s writes may fail otherwise (time out) only when `errors_allowed`. Every write `b` sent
/// while its term ran must have landed; those it sent after its term ended (its writer, like
/// `a`'s, goes on with the last token it was given) are counted apart, whatever came of them:
/// if `b` lost its term and `a` won the next, the server rightly refuses them.
fn judge(log: &std::path::Path, a: (u64, u64), b: (u64, u64), errors_allowed: bool) -> Verdict {
    let ((token_a, _), (token_b, granted_b)) = (a, b);
    assert!(token_b > token_a);
    let b_end = term_end(log, token_b).unwrap_or(u64::MAX);
    let mut v = Verdict {
        stale_refused: 0,
        stale_accepted_after_grant: 0,
        first_refusal_after_grant: None,
        b_writes: 0,
        b_after_term: 0,
    };
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let p: Vec<&str> = line.split(' ').collect();
        if p.first() != Some(&"WRITE") || p.len() < 6 {
            continue;
        }
        let (t, sent, outcome, rv) = (
            p[1].parse::<u64>().unwrap_or(0),
            p[2].parse::<u64>().unwrap_or(0),
            p[3],
            p[4].parse::<u64>().unwrap_or(0),
        );
        if t == token_a {
            match outcome {
                // etcd's order is the judge: an accepted stale write must have landed before
                // the successor's grant (revision below b's token).
                "accepted" if rv > token_b => v.stale_accepted_after_grant += 1,
                "refused" => {
                    v.stale_refused += 1;
                    if sent > granted_b && v.first_refusal_after_grant.is_none() {
                        v.first_refusal_after_grant = Some(Duration::from_nanos(sent - granted_b));
                    }
                }
                "error" if !errors_allowed => panic!("a's write failed otherwise: {line}"),
                _ => {}
            }
        } else if t == token_b && sent > b_end {
            v.b_after_term += 1;
        } else if t == token_b {
            assert_eq!(
                outcome, "accepted",
                "b's write in its term did not land: {line}"
            );
            v.b_writes += 1;
        }
    }
    v
}

/// When the term with `token` ended (its `END token at` line), if it has.
fn term_end(log: &std::path::Path, token: u64) -> Option<u64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let mut p = l.split(' ');
            if p.next() != Some("END") || p.next()?.parse::<u64>().ok()? != token {
                return None;
            }
            p.next()?.parse().ok()
        })
}

/// The `GRANT token at` lines of a candidates' log, in order.
fn grants(log: &std::path::Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut p = l.split(' ');
            (p.next() == Some("GRANT")).then(|| {
                (
                    p.next().and_then(|t| t.parse().ok()).unwrap_or(0),
                    p.next().and_then(|t| t.parse().ok()).unwrap_or(0),
                )
            })
        })
        .collect()
}

/// Waits until the log has `n` grants.
fn wait_grants(log: &std::path::Path, n: usize, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while grants(log).len() < n {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_policy_fenced_writes_fail_closed_unless_warn_only() {
    use tenure::fence::kube::PROOF_WINDOW;
    let server = shared();
    let ns = unique("nopolicy");
    server.namespace(&ns).await;
    // No policy governs this ServiceAccount: nothing ever refuses the token below ours.
    let (client, _) = participant(&ns, "lonely").await;
    let fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    let api: FencedApi<ConfigMap> =
        fencer.namespaced_with_token("lonely", FencingToken::new(1_000), &ns);
    let pp = PostParams::default();
    let started = std::time::Instant::now();
    let first = api.create(&pp, &cm("first", "1")).await;
    let waited = started.elapsed();
    match &first {
        Err(FenceError::Unenforced { lease, cause }) => {
            assert_eq!(lease, &format!("{ns}/lonely"));
            assert!(
                cause.contains("admitted a dry-run write with token 999"),
                "{cause}"
            );
            assert!(
                cause.contains("130887"),
                "names the upstream issue: {cause}"
            );
        }
        other => panic!("a write with no policy proven must fail closed: {other:?}"),
    }
    assert!(
        waited >= PROOF_WINDOW,
        "the proof gave up before its window: {waited:?}"
    );
    assert!(
        fencer
            .open_fence()
            .is_some_and(|m| m.contains("fence open on lease")),
        "{:?}",
        fencer.open_fence()
    );
    // The next write fails at once (the proof's verdict stands until a recheck).
    let started = std::time::Instant::now();
    assert!(matches!(
        api.create(&pp, &cm("second", "2")).await,
        Err(FenceError::Unenforced { .. })
    ));
    assert!(started.elapsed() < PROOF_WINDOW);
    // Warn-only lets writes go (opt-in), and the dry runs left nothing behind.
    let loud = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns)
        .warn_only(true);
    loud.namespaced_with_token::<ConfigMap>("lonely", FencingToken::new(1_000), &ns)
        .create(&pp, &cm("warned", "3"))
        .await
        .expect("warn-only writes go");
    let plain: Api<ConfigMap> = Api::namespaced(client, &ns);
    let names: Vec<String> = plain
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n != "kube-root-ca.crt")
        .collect();
    assert_eq!(names, ["warned"]);
    let leases: Api<Lease> = Api::namespaced(server.admin().await, &ns);
    assert!(
        leases
            .get_opt("tenure-fence-probe.lonely")
            .await
            .expect("read")
            .is_none(),
        "the probe is only ever dry-run"
    );
    // Without the policy mode there is no proof at all.
    let quick: FencedApi<ConfigMap> = Fencer::without_policy(plain.clone().into_client())
        .namespaced_with_token("lonely", FencingToken::new(1_000), &ns);
    let started = std::time::Instant::now();
    quick.create(&pp, &cm("third", "3")).await.expect("write");
    assert!(started.elapsed() < PROOF_WINDOW);
}

/// A network namespace made for one test, whose only way to the API server is a relay: a
/// socket listening on the namespace's own loopback, forwarded from the host's loopback to
/// the server. nftables inside the namespace cuts (black hole) and heals the relay's port.
/// Nothing leaves loopback; the namespace is deleted on drop.
struct Partitionable {
    name: String,
    port: u16,
}

fn run(program: &str, args: &[&str]) {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("{program}: {e} (the partition test needs iproute2 and nftables, as root)")
        });
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Partitionable {
    fn new(upstream: std::net::SocketAddr) -> Self {
        use std::os::fd::AsRawFd;
        let name = format!("tenure-fence-{}", std::process::id());
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &name])
            .output();
        run("ip", &["netns", "add", &name]);
        run("ip", &["-n", &name, "link", "set", "lo", "up"]);
        let path = format!("/var/run/netns/{name}");
        // A thread enters the namespace only to open the listener: a socket stays in the
        // namespace it was made in, so the host's threads accept on it and connect upstream.
        let listener = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: setns moves only this (short-lived) thread into the namespace.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            std::net::TcpListener::bind("127.0.0.1:0").expect("listen in the namespace")
        })
        .join()
        .expect("listener thread");
        let port = listener.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for inbound in listener.incoming().flatten() {
                let Ok(outbound) = std::net::TcpStream::connect(upstream) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (inbound.try_clone(), outbound.try_clone()),
                    (outbound.try_clone(), inbound.try_clone()),
                ]
                .into_iter()
                .filter_map(|(a, b)| Some((a.ok()?, b.ok()?)))
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Self { name, port }
    }

    /// Drops every packet to and from the relay inside the namespace (a black hole).
    fn cut(&self) {
        let nft = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &self.name, "nft"];
            all.extend(args);
            run("ip", &all);
        };
        let port = self.port.to_string();
        nft(&["add", "table", "inet", "tenure_chaos"]);
        nft(&[
            "add",
            "chain",
            "inet",
            "tenure_chaos",
            "out",
            "{ type filter hook output priority 0; }",
        ]);
        for dir in ["dport", "sport"] {
            nft(&[
                "add",
                "rule",
                "inet",
                "tenure_chaos",
                "out",
                "tcp",
                dir,
                &port,
                "drop",
            ]);
        }
    }

    fn heal(&self) {
        run(
            "ip",
            &["netns", "exec", &self.name, "nft", "flush", "ruleset"],
        );
    }
}

/// A child process killed (and reaped) when dropped, also when the test fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Partitionable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_heals_and_every_write_it_sends_is_refused() {
    if run_as_candidate().await {
        return;
    }
    let w = Writers::new("partition").await;
    let kubeconfig = &w.kubeconfig;

    // a reaches the API server only through the namespace's relay.
    let url = shared().url();
    let api_port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let net = Partitionable::new(std::net::SocketAddr::from(([127, 0, 0, 1], api_port)));
    let text = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
    let relayed = kubeconfig.with_extension("relayed");
    std::fs::write(
        &relayed,
        text.replace(
            &format!("127.0.0.1:{api_port}"),
            &format!("127.0.0.1:{}", net.port),
        ),
    )
    .expect("relayed kubeconfig");

    let test = "a_partitioned_leader_heals_and_every_write_it_sends_is_refused";
    let exe = std::env::current_exe().expect("exe");
    // nsenter execs the candidate itself (`ip netns exec` would fork and wait), so killing
    // the child kills the candidate.
    let a = KillOnDrop(
        std::process::Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{}", net.name))
            .arg("--")
            .arg(&exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .envs(w.env(&relayed))
            .env("TENURE_SAFETY_IDENTITY", "a")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn a in the namespace"),
    );
    wait_grants(&w.log, 1, "a never led");
    let b = safety::Candidate::spawn(test, &w.env(kubeconfig), "b");
    std::thread::sleep(Duration::from_millis(1500));
    net.cut();
    let cut_at = std::time::Instant::now();
    wait_grants(&w.log, 2, "b never took over from the partitioned a");
    let failover = cut_at.elapsed();
    std::thread::sleep(Duration::from_millis(1000));
    let healed = safety::mono_ns();
    net.heal();
    // a's writes held up by the partition reach the server now; a campaigns again.
    wait_writes(&w.log, "a", healed, grants(&w.log)[1].0);
    drop(a);
    drop(b);

    let g = grants(&w.log);
    // After healing, b leads on: a term after b's starts only once b's term has ended (on a
    // loaded machine b can miss its renew deadline and campaign again; that is not a's doing).
    if let Some(third) = g.get(2) {
        let b_ended = term_end(&w.log, g[1].0);
        assert!(
            b_ended.is_some_and(|at| at <= third.1),
            "a term began while b's was running after the heal: grants {g:?}, b's term ended at {b_ended:?}"
        );
    }
    let verdict = judge(&w.log, g[0], g[1], true);
    println!("partitioned leader: {verdict:?}; b led {failover:?} after the cut");
    verdict.assert_fenced();
    // Liveness, not speed: without a takeover, b never leads at all.
    let bound = safety::kube_takeover_bound(
        safety::KUBE_LEASE,
        safety::KUBE_RENEW_DEADLINE,
        safety::KUBE_RETRY,
    );
    assert!(
        failover < bound,
        "b took {failover:?} to lead; the bound is {bound:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_go_leader_tokenless_writes_pass_and_tenure_tokens_are_stale() {
    use tokio::io::AsyncBufReadExt;
    let server = shared();
    let ns = unique("mixed");
    server.namespace(&ns).await;
    let lease = "mixed";
    let (client, _) = participant(&ns, "ctl").await;
    let policy = FencingPolicy::new(&ns, lease)
        .and_then(|p| p.service_account(&ns, "ctl"))
        .and_then(|p| p.resource("configmaps"))
        .expect("policy");
    let plain: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    // A tenure term first, then it ends (released) and a real client-go candidate leads.
    let tenure_side = Locker::with_identity(
        KubeBackend::from_client(client.clone(), KubeOptions::new().namespace(ns.clone()))
            .expect("backend"),
        "rust-1",
    )
    .expect("identity");
    let (held, token) = take(&tenure_side, lease).await;
    install(&policy, &plain).await;
    let fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    let ours: FencedApi<ConfigMap> = fencer.namespaced_with_token(lease, token, &ns);
    ours.create(&pp, &cm("by-rust", "1"))
        .await
        .expect("tenure's term writes");
    held.release().await.expect("release");

    let mut go = tokio::process::Command::new(kube_support::candidate())
        .arg("--kubeconfig")
        .arg(server.admin_kubeconfig())
        .args(["--namespace", &ns, "--lease", lease, "--identity", "go-1"])
        .args([
            "--lease-duration=4s",
            "--renew-deadline=3s",
            "--retry-period=1s",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the client-go candidate");
    let mut lines = tokio::io::BufReader::new(go.stdout.take().expect("stdout")).lines();
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.starts_with("STARTED go-1") {
                return;
            }
        }
        panic!("the client-go candidate exited before leading");
    })
    .await
    .expect("client-go leads within 20 s");

    // client-go stamps no token: its (token-less) writes from a participant are admitted —
    // once the policy's view of the Lease has caught up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while plain.create(&pp, &cm("by-go", "x")).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "token-less writes refused while client-go leads"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every write with a tenure token is stale now: no tenure replica leads.
    let current = assert_stale(
        "a tenure token under client-go",
        ours.patch(
            "by-rust",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"v": "stale"}})),
        )
        .await,
        token.get(),
    );
    assert_eq!(current, Current::ForeignHolder("go-1".into()));

    // client-go releases on SIGTERM (ReleaseOnCancel); tenure takes over, and tokens rule
    // again: tenure's new term writes, a token-less write is refused.
    let pid = go.id().expect("running").to_string();
    run("kill", &["-TERM", &pid]);
    let _ = tokio::time::timeout(Duration::from_secs(10), go.wait()).await;
    let (held, token2) = take(&tenure_side, lease).await;
    assert!(token2 > token);
    fencer
        .namespaced_with_token::<ConfigMap>(lease, token2, &ns)
        .patch(
            "by-rust",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"v": "2"}})),
        )
        .await
        .expect("tenure's new term writes");
    let refused = plain.create(&pp, &cm("tokenless-again", "x")).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.message.contains("missing token")),
        "{refused:?}"
    );
    held.release().await.expect("release");
}
