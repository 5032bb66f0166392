//! kube-runtime's `Controller` surface under leadership, on the real kube-apiserver:
//! `examples/configmapgen.rs` (kube-rs's `configmapgen_controller`, ported) run as two replica
//! processes repairs a deleted or hand-edited owned ConfigMap at once — on the leader only —
//! and keeps doing so across a SIGTERM hand-off and a `kill -9` takeover; in-process, a
//! watched kind through a mapper, `reconcile_all_on` and `reconcile_on` trigger the leader and
//! never a follower.

mod kube_support;
mod safety;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube_support::{fresh_dir, shared, unique};
use tenure::Locker;
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::controller::Controller;
use tenure::election::LeaderElector;

/// kube-rs's `ConfigMapGenerator` CRD (`nullable.se/v1`), as its example defines it.
async fn install_generator_crd(admin: &kube::Client) {
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "configmapgenerators.nullable.se"},
        "spec": {
            "group": "nullable.se",
            "names": {"kind": "ConfigMapGenerator", "plural": "configmapgenerators",
                      "singular": "configmapgenerator", "shortNames": ["cmg"]},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "required": ["spec"],
                    "properties": {"spec": {"type": "object", "required": ["content"],
                        "properties": {"content": {"type": "string"}}}}}}}]
        }
    }))
    .expect("crd");
    let api: Api<CustomResourceDefinition> = Api::all(admin.clone());
    api.patch(
        "configmapgenerators.nullable.se",
        &PatchParams::apply("tenure-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("apply the CRD");
    let generators = generators(admin, "default");
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = generators.list(&Default::default()).await {
        assert!(Instant::now() < deadline, "not served: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn generators(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "nullable.se".into(),
        version: "v1".into(),
        api_version: "nullable.se/v1".into(),
        kind: "ConfigMapGenerator".into(),
        plural: "configmapgenerators".into(),
    };
    Api::namespaced_with(client.clone(), ns, &resource)
}

/// The admin kubeconfig with `ns` as its namespace (the example's Lease and client default).
fn kubeconfig_in(ns: &str, dir: &Path) -> PathBuf {
    let admin = std::fs::read_to_string(shared().admin_kubeconfig()).expect("kubeconfig");
    assert!(admin.contains("namespace: default"), "{admin}");
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        admin.replace("namespace: default", &format!("namespace: {ns}")),
    )
    .expect("write");
    path
}

/// One replica of the example, its stdout (the controller's log) collected line by line.
struct Replica {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Replica {
    fn start(kubeconfig: &Path) -> Self {
        let mut child = Command::new(safety::example("configmapgen"))
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the example");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().expect("stdout");
        let seen = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                seen.lock().expect("not poisoned").push(line);
            }
        });
        Self { child, lines }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How many reconciles it reported, successful or not.
    fn reconciled(&self) -> usize {
        self.lines
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|l| l.contains("reconciled") || l.contains("reconcile failed"))
            .count()
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: signalling a child process this test started.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }

    fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "the replica did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The pid in the Lease's holder (the example's identity is `<hostname>-<pid>`).
async fn holder_pid(leases: &Api<Lease>) -> Option<u32> {
    let lease = leases.get_opt("configmapgen").await.ok().flatten()?;
    let holder = lease.spec?.holder_identity?;
    holder.rsplit('-').next()?.parse().ok()
}

async fn leader_of(leases: &Api<Lease>, replicas: &[&Replica]) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(pid) = holder_pid(leases).await
            && replicas.iter().any(|r| r.pid() == pid)
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no replica leads");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until ConfigMap `name` exists with `content`; the time it took.
async fn generated(cms: &Api<ConfigMap>, name: &str, content: &str) -> Duration {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    loop {
        if let Ok(Some(cm)) = cms.get_opt(name).await
            && cm
                .data
                .as_ref()
                .and_then(|d| d.get("content"))
                .map(String::as_str)
                == Some(content)
        {
            return started.elapsed();
        }
        assert!(Instant::now() < deadline, "{name} never held {content:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The owned ConfigMap deleted (repaired: created again) and edited by hand (its owner
/// reconciled by `leader`: kube-rs's example applies without `force`, so it re-applies its own
/// field and leaves the hand-set one). Returns both times.
async fn break_and_repair(cms: &Api<ConfigMap>, leader: &Replica) -> (Duration, Duration) {
    cms.delete("gen", &Default::default())
        .await
        .expect("delete");
    let deleted = generated(cms, "gen", "v1").await;
    let before = leader.reconciled();
    let edited = Instant::now();
    cms.patch(
        "gen",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"extra": "by hand"}})),
    )
    .await
    .expect("edit");
    let deadline = edited + Duration::from_secs(30);
    while leader.reconciled() <= before {
        assert!(
            Instant::now() < deadline,
            "the edit did not trigger the owner"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (deleted, edited.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ported_configmapgen_repairs_its_children_on_the_leader_across_hand_offs() {
    let server = shared();
    let admin = server.admin().await;
    install_generator_crd(&admin).await;
    let ns = unique("cmgen");
    server.namespace(&ns).await;
    let dir = fresh_dir("cmgen");
    let kubeconfig = kubeconfig_in(&ns, &dir);
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns);
    let generator: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "nullable.se/v1", "kind": "ConfigMapGenerator",
        "metadata": {"name": "gen"}, "spec": {"content": "v1"}
    }))
    .expect("generator");
    generators(&admin, &ns)
        .create(&PostParams::default(), &generator)
        .await
        .expect("create the generator");

    let mut a = Replica::start(&kubeconfig);
    let first = leader_of(&leases, &[&a]).await;
    assert_eq!(first, a.pid());
    let mut b = Replica::start(&kubeconfig);
    generated(&cms, "gen", "v1").await;
    // b follows: let its caches list.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut times = BTreeMap::new();
    times.insert("a", break_and_repair(&cms, &a).await);
    assert_eq!(b.reconciled(), 0, "a follower reconciled");
    assert!(a.reconciled() >= 3, "the leader reported its reconciles");

    // SIGTERM: a hands over at once; b repairs from then on.
    let stopped = Instant::now();
    a.signal(libc::SIGTERM);
    assert!(a.wait(Duration::from_secs(20)).success(), "a exits cleanly");
    assert_eq!(leader_of(&leases, &[&b]).await, b.pid());
    let handoff = stopped.elapsed();
    let before = b.reconciled();
    times.insert("b", break_and_repair(&cms, &b).await);
    assert!(b.reconciled() > before, "b reconciles once it leads");

    // kill -9 of b: a new replica c takes over once b's lease expires.
    let c = Replica::start(&kubeconfig);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.reconciled(), 0, "a follower reconciled");
    let killed = Instant::now();
    b.signal(libc::SIGKILL);
    b.wait(Duration::from_secs(10));
    assert_eq!(leader_of(&leases, &[&c]).await, c.pid());
    let takeover = killed.elapsed();
    times.insert("c", break_and_repair(&cms, &c).await);
    println!(
        "configmapgen: child deleted -> repaired / edited -> repaired per leader {times:?}; \
         SIGTERM hand-off {handoff:?}; kill -9 takeover {takeover:?} (15 s lease)"
    );
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// Two replicas of one controller in this process, each with its own elector on the real
/// apiserver; every reconcile is recorded with who ran it and why.
type Log = Arc<Mutex<Vec<(String, String, String)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_reconcile_all_on_and_reconcile_on_trigger_the_leader_only() {
    let server = shared();
    let admin = server.admin().await;
    let ns = unique("triggers");
    server.namespace(&ns).await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    // Primaries: ConfigMaps labelled `role=primary`; related: Secrets whose `target`
    // annotation names a primary.
    for name in ["p1", "p2"] {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.labels = Some([("role".to_owned(), "primary".to_owned())].into());
        cms.create(&PostParams::default(), &cm)
            .await
            .expect("primary");
    }
    let log: Log = Arc::default();
    let (all_tx, _) = tokio::sync::broadcast::channel::<()>(4);
    let (on_tx, _) = tokio::sync::broadcast::channel::<ObjectRef<ConfigMap>>(4);
    let replica = |who: &'static str, stop: tokio_util::sync::CancellationToken| {
        let backend =
            KubeBackend::from_client(admin.clone(), KubeOptions::new().namespace(ns.clone()))
                .expect("backend");
        let elector = LeaderElector::new(
            Locker::with_identity(backend, who).expect("identity"),
            "triggers",
            safety::kube_config(),
        )
        .expect("elector");
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), &ns);
        let all = tokio_stream_of(all_tx.subscribe());
        let on = tokio_stream_of(on_tx.subscribe());
        let ns_in = ns.clone();
        let log = log.clone();
        let run = Controller::new(
            cms.clone(),
            watcher::Config::default().labels("role=primary"),
        )
        .watches(secrets, watcher::Config::default(), move |s| {
            let target = s
                .metadata
                .annotations
                .and_then(|a| a.get("target").cloned());
            target.map(|t| ObjectRef::new(&t).within(&ns_in))
        })
        .reconcile_all_on(all)
        .reconcile_on(on)
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(
            &elector,
            move |cm: Arc<ConfigMap>, log: Log| async move {
                let name = cm.metadata.name.clone().unwrap_or_default();
                log.lock()
                    .expect("not poisoned")
                    .push((who.to_owned(), name, String::new()));
                Ok::<_, Never>(Action::await_change())
            },
            |_, _, _| Action::await_change(),
            log,
        );
        (elector, tokio::spawn(run.collect::<Vec<_>>()))
    };
    let (stop_a, stop_b) = (
        tokio_util::sync::CancellationToken::new(),
        tokio_util::sync::CancellationToken::new(),
    );
    let (a, run_a) = replica("ctl-a", stop_a.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !a.is_leader() {
        assert!(Instant::now() < deadline, "a never led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (b, run_b) = replica("ctl-b", stop_b.clone());
    let count = |who: &str, name: &str| {
        log.lock()
            .expect("not poisoned")
            .iter()
            .filter(|(w, n, _)| w == who && n == name)
            .count()
    };
    let wait_more = |who: &'static str, name: &'static str, before: usize| {
        let log = log.clone();
        async move {
            let started = Instant::now();
            let deadline = started + Duration::from_secs(30);
            loop {
                let n = log
                    .lock()
                    .expect("not poisoned")
                    .iter()
                    .filter(|(w, n, _)| w == who && n == name)
                    .count();
                if n > before {
                    return started.elapsed();
                }
                assert!(
                    Instant::now() < deadline,
                    "{who} never reconciled {name} again"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    wait_more("ctl-a", "p1", 0).await;
    // b's caches list before the triggers fire.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A related Secret naming p2: p2 is reconciled on the leader.
    let before = count("ctl-a", "p2");
    let mut secret = k8s_openapi::api::core::v1::Secret::default();
    secret.metadata.name = Some("rel".into());
    secret.metadata.annotations = Some([("target".to_owned(), "p2".to_owned())].into());
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let watched = wait_more("ctl-a", "p2", before).await;
    // Deleting it triggers too.
    let before = count("ctl-a", "p2");
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), &ns)
        .delete("rel", &Default::default())
        .await
        .expect("delete");
    let watched_delete = wait_more("ctl-a", "p2", before).await;
    // reconcile_all_on: every primary again; reconcile_on: the one named.
    let (p1, p2) = (count("ctl-a", "p1"), count("ctl-a", "p2"));
    all_tx.send(()).expect("both replicas listen");
    wait_more("ctl-a", "p1", p1).await;
    wait_more("ctl-a", "p2", p2).await;
    let p1 = count("ctl-a", "p1");
    on_tx
        .send(ObjectRef::new("p1").within(&ns))
        .expect("both replicas listen");
    wait_more("ctl-a", "p1", p1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let by_b = log
        .lock()
        .expect("not poisoned")
        .iter()
        .filter(|(w, _, _)| w == "ctl-b")
        .count();
    assert_eq!(by_b, 0, "the follower reconciled");
    println!("watched Secret -> owner reconciled {watched:?}, on its deletion {watched_delete:?}");

    // a hands over: b reconciles every primary at once, and the triggers reach b from then on.
    stop_a.cancel();
    let items_a = run_a.await.expect("joined");
    assert!(items_a.iter().all(Result::is_ok), "{items_a:?}");
    let handed = wait_more("ctl-b", "p2", 0).await;
    wait_more("ctl-b", "p1", 0).await;
    let p1 = count("ctl-b", "p1");
    on_tx
        .send(ObjectRef::new("p1").within(&ns))
        .expect("b listens");
    wait_more("ctl-b", "p1", p1).await;
    println!("graceful hand-off -> b's first reconcile {handed:?}");
    stop_b.cancel();
    let items_b = run_b.await.expect("joined");
    assert!(items_b.iter().all(Result::is_ok), "{items_b:?}");
    assert!(!a.is_leader() && !b.is_leader());
}

/// A broadcast receiver as a stream of its items (lagged items skipped).
fn tokio_stream_of<T: Clone + Send + 'static>(
    rx: tokio::sync::broadcast::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(item) => return Some((item, rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}
