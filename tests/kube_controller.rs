//! Controllers under leadership on the real kube-apiserver: a warm follower that wins
//! reconciles without listing (counted in the API server's audit log by User-Agent), a
//! graceful hand-off cuts no reconcile off, an always-on endpoint answers on both replicas
//! throughout, a cold follower does list (so the audit count can fail), and a refused watch
//! or a panicking reconcile ends the term with an error instead of a silent follower.

mod kube_support;
mod safety;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube_support::{Launch, Server, free_port, fresh_dir, unique};
use tenure::Locker;
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::controller::{CacheMode, Controller, ControllerError, Replica};
use tenure::election::{ElectionError, LeaderElector};

const CHILD_KUBECONFIG: &str = "TENURE_CTRL_KUBECONFIG";
const CHILD_NS: &str = "TENURE_CTRL_NS";
const CHILD_LOG: &str = "TENURE_CTRL_LOG";
const CHILD_MODE: &str = "TENURE_CTRL_MODE";
const CHILD_PORT: &str = "TENURE_CTRL_PORT";
const LABEL: &str = "app=warm";
const OBJECTS: usize = 20;
/// Each reconcile takes this long, so that a hand-off always finds some in flight.
const RECONCILE: Duration = Duration::from_millis(400);

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn append(log: &Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log");
    // One write per line: with O_APPEND a single small write is never interleaved with
    // another process's or task's, where `writeln!` may split a line across writes.
    f.write_all(format!("{line}\n").as_bytes())
        .expect("write log");
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

struct Ctx {
    identity: String,
    log: PathBuf,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, Never> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    append(
        &ctx.log,
        &format!("START {} {name} {}", ctx.identity, unix_ns()),
    );
    tokio::time::sleep(RECONCILE).await;
    append(
        &ctx.log,
        &format!("END {} {name} {}", ctx.identity, unix_ns()),
    );
    Ok(Action::requeue(Duration::from_millis(100)))
}

/// A kube config from `kubeconfig` whose requests carry `user_agent`.
async fn config(kubeconfig: &str, user_agent: &str) -> kube::Config {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(user_agent).expect("user agent"),
    ));
    config
}

/// The candidate process: a `Replica` whose always-on part answers TCP connections on its
/// port with its identity, and whose leader-only part reconciles the labelled ConfigMaps
/// from a cache (warm or cold). SIGTERM shuts it down gracefully.
async fn candidate() -> bool {
    let (Ok(kubeconfig), Ok(ns), Ok(log), Ok(identity), Ok(mode), Ok(port)) = (
        std::env::var(CHILD_KUBECONFIG),
        std::env::var(CHILD_NS),
        std::env::var(CHILD_LOG),
        std::env::var("TENURE_SAFETY_IDENTITY"),
        std::env::var(CHILD_MODE),
        std::env::var(CHILD_PORT),
    ) else {
        return false;
    };
    let log = PathBuf::from(log);
    let config = config(&kubeconfig, &identity).await;
    let client = kube::Client::try_from(config.clone()).expect("client");
    let backend = KubeBackend::from_config(config, KubeOptions::new().namespace(ns.clone()))
        .expect("backend");
    let elector = LeaderElector::new(
        Locker::with_identity(backend, &identity).expect("identity"),
        "controller",
        safety::kube_config(),
    )
    .expect("elector");
    let mode = if mode == "cold" {
        CacheMode::Cold
    } else {
        CacheMode::Warm
    };
    let ctx = Arc::new(Ctx {
        identity: identity.clone(),
        log: log.clone(),
    });
    // Started here (the watch warm from now on); reconciling during the terms the Replica's
    // election gives it.
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(client, &ns),
        watcher::Config::default().labels(LABEL),
    )
    .cache_mode(mode);
    let status = controller.status();
    let runner = controller.runner(
        reconcile,
        |_, _, _| Action::requeue(Duration::from_secs(1)),
        ctx,
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port.parse::<u16>().expect("port")))
        .await
        .expect("bind");
    let mut sigterm =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("sigterm");
    let warm_log = log.clone();
    let warm_id = identity.clone();
    let answer = identity.clone();
    let out = Replica::new(elector)
        .always("identity endpoint", move |stop| async move {
            use tokio::io::AsyncWriteExt;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    conn = listener.accept() => {
                        if let Ok((mut s, _)) = conn {
                            let _ = s.write_all(answer.as_bytes()).await;
                        }
                    }
                }
            }
        })
        .always("warm reporter", move |stop| async move {
            // Reports once the warm cache has listed: the parent waits for it.
            while status.state() != tenure::controller::CacheState::Warm {
                tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
            append(&warm_log, &format!("WARM {warm_id} {}", unix_ns()));
            Ok(())
        })
        .run_until(
            async {
                sigterm.recv().await;
            },
            |term| {
                let (runner, log) = (runner.clone(), log.clone());
                async move {
                    append(
                        &log,
                        &format!(
                            "GRANT {} {} {}",
                            term.identity(),
                            term.fencing_token(),
                            unix_ns()
                        ),
                    );
                    runner
                        .term(&term)
                        .for_each(|r| {
                            if let Err(e) = r {
                                eprintln!("controller: {e}");
                            }
                            async {}
                        })
                        .await;
                    append(&log, &format!("STOPPED {} {}", term.identity(), unix_ns()));
                }
            },
        )
        .await;
    append(&log, &format!("EXIT {identity} {out:?} {}", unix_ns()));
    true
}

/// The log's lines of `kind`, as (identity, rest).
fn lines(log: &Path, kind: &str) -> Vec<(String, Vec<String>)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut p = l.split(' ');
            (p.next() == Some(kind)).then(|| {
                let who = p.next().unwrap_or_default().to_owned();
                (who, p.map(str::to_owned).collect())
            })
        })
        .collect()
}

fn wait_line(log: &Path, kind: &str, who: &str, what: &str) -> u128 {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((_, rest)) = lines(log, kind).into_iter().find(|(w, _)| w == who) {
            return rest.last().and_then(|t| t.parse().ok()).unwrap_or(0);
        }
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One apiserver for this binary's process-based tests, with an audit log of ConfigMap
/// requests.
struct Audited {
    server: Server,
    audit: PathBuf,
}

fn audited() -> &'static Audited {
    static SERVER: std::sync::OnceLock<Audited> = std::sync::OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = fresh_dir("ctrl-audit");
        let policy = dir.join("policy.yaml");
        let audit = dir.join("audit.log");
        std::fs::write(
            &policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n\
             - level: Metadata\n  resources:\n  - group: \"\"\n    resources: [\"configmaps\"]\n\
             - level: None\n",
        )
        .expect("audit policy");
        let server = Server::start(Launch {
            extra: vec![
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", audit.display()),
                "--audit-log-format=json".into(),
                "--audit-log-mode=blocking".into(),
            ],
            ..Launch::default()
        });
        Audited { server, audit }
    })
}

/// ConfigMap requests by verb from `user_agent` received at or after `from` (unix ns).
fn configmap_verbs(audit: &Path, user_agent: &str, from: u128) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in std::fs::read_to_string(audit).unwrap_or_default().lines() {
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if ev["userAgent"].as_str() != Some(user_agent)
            || ev["objectRef"]["resource"] != "configmaps"
        {
            continue;
        }
        let at = ev["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map_or(0, |t| t.as_nanosecond().max(0) as u128);
        if at >= from {
            *out.entry(ev["verb"].as_str().unwrap_or_default().to_owned())
                .or_insert(0) += 1;
        }
    }
    out
}

/// A namespace with `OBJECTS` labelled ConfigMaps, and the environment of a candidate.
async fn setup(tag: &str) -> (String, PathBuf, PathBuf) {
    let a = audited();
    let ns = unique(tag);
    a.server.namespace(&ns).await;
    let api: Api<ConfigMap> = Api::namespaced(a.server.admin().await, &ns);
    for i in 0..OBJECTS {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(format!("obj-{i}"));
        cm.metadata.labels = Some([("app".to_owned(), "warm".to_owned())].into());
        api.create(&PostParams::default(), &cm)
            .await
            .expect("configmap");
    }
    let log = fresh_dir("ctrl").join(format!("{tag}.log"));
    (ns, a.server.admin_kubeconfig(), log)
}

fn spawn(
    test: &str,
    ns: &str,
    kubeconfig: &Path,
    log: &Path,
    who: &str,
    mode: &str,
    port: u16,
) -> safety::Candidate {
    safety::Candidate::spawn(
        test,
        &[
            (CHILD_KUBECONFIG, kubeconfig.display().to_string()),
            (CHILD_NS, ns.to_owned()),
            (CHILD_LOG, log.display().to_string()),
            (CHILD_MODE, mode.to_owned()),
            (CHILD_PORT, port.to_string()),
        ],
        who,
    )
}

/// Whether the always-on endpoint on `port` answers with `who`.
fn answers(port: u16, who: &str) -> bool {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    ) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut got = String::new();
    let _ = s.read_to_string(&mut got);
    got == who
}

/// Starts without reconciles cut off: every START of `who` has its END.
fn assert_no_cut_reconciles(log: &Path, who: &str) {
    let mut open: BTreeMap<String, i64> = BTreeMap::new();
    for (w, rest) in lines(log, "START") {
        if w == who {
            *open.entry(rest[0].clone()).or_default() += 1;
        }
    }
    for (w, rest) in lines(log, "END") {
        if w == who {
            *open.entry(rest[0].clone()).or_default() -= 1;
        }
    }
    let cut: Vec<_> = open.iter().filter(|(_, n)| **n != 0).collect();
    assert!(
        cut.is_empty(),
        "{who}'s reconciles cut off by the hand-off: {cut:?}"
    );
}

/// The first reconcile START of `who` and how many of them there were.
fn first_start(log: &Path, who: &str) -> Option<u128> {
    lines(log, "START")
        .into_iter()
        .filter(|(w, _)| w == who)
        .filter_map(|(_, rest)| rest.last().and_then(|t| t.parse().ok()))
        .min()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_follower_takes_over_without_listing_and_no_reconcile_is_cut_off() {
    if candidate().await {
        return;
    }
    let test = "a_warm_follower_takes_over_without_listing_and_no_reconcile_is_cut_off";
    let (ns, kubeconfig, log) = setup("warm").await;
    let (port_a, port_b, port_c) = (free_port(), free_port(), free_port());
    let a = spawn(test, &ns, &kubeconfig, &log, "ctrl-a", "warm", port_a);
    wait_line(&log, "GRANT", "ctrl-a", "a never led");
    let b = spawn(test, &ns, &kubeconfig, &log, "ctrl-b", "warm", port_b);
    wait_line(&log, "WARM", "ctrl-b", "b's cache never listed");
    std::thread::sleep(Duration::from_millis(1000));

    // Graceful hand-off: SIGTERM to a, while its reconciles are in flight. Both endpoints
    // are polled throughout.
    let sent = unix_ns();
    a.signal("TERM");
    let mut b_failed = 0;
    let mut a_answered_after_term = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while lines(&log, "GRANT").iter().all(|(w, _)| w != "ctrl-b") {
        assert!(
            std::time::Instant::now() < deadline,
            "b never took over from a"
        );
        if !answers(port_b, "ctrl-b") {
            b_failed += 1;
        }
        if answers(port_a, "ctrl-a") {
            a_answered_after_term += 1;
        }
    }
    let b_grant = wait_line(&log, "GRANT", "ctrl-b", "b never led");
    wait_line(&log, "EXIT", "ctrl-a", "a never exited");
    assert!(b_grant > sent);
    assert_no_cut_reconciles(&log, "ctrl-a");
    assert_eq!(
        b_failed, 0,
        "b's always-on endpoint failed during the hand-off"
    );
    assert!(
        a_answered_after_term > 0,
        "a's always-on endpoint kept serving while its term wound down"
    );
    // b's first reconcile comes from its warm store: no LIST after its grant.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let b_first = loop {
        if let Some(t) = first_start(&log, "ctrl-b").filter(|t| *t > b_grant) {
            break t;
        }
        assert!(std::time::Instant::now() < deadline, "b never reconciled");
        std::thread::sleep(Duration::from_millis(20));
    };
    let verbs = configmap_verbs(&audited().audit, "ctrl-b", b_grant);
    assert_eq!(
        verbs.get("list"),
        None,
        "b listed after its grant: {verbs:?}"
    );
    println!(
        "graceful: b's first reconcile {:?} after its grant; b's ConfigMap requests since: {verbs:?}",
        Duration::from_nanos((b_first - b_grant) as u64)
    );

    // Crash: c follows warm, b is killed; c's first reconcile needs no list either.
    let c = spawn(test, &ns, &kubeconfig, &log, "ctrl-c", "warm", port_c);
    wait_line(&log, "WARM", "ctrl-c", "c's cache never listed");
    std::thread::sleep(Duration::from_millis(500));
    b.signal("KILL");
    let c_grant = wait_line(
        &log,
        "GRANT",
        "ctrl-c",
        "c never took over from the killed b",
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let c_first = loop {
        if let Some(t) = first_start(&log, "ctrl-c").filter(|t| *t > c_grant) {
            break t;
        }
        assert!(std::time::Instant::now() < deadline, "c never reconciled");
        std::thread::sleep(Duration::from_millis(20));
    };
    let verbs = configmap_verbs(&audited().audit, "ctrl-c", c_grant);
    assert_eq!(
        verbs.get("list"),
        None,
        "c listed after its grant: {verbs:?}"
    );
    println!(
        "crash: c's first reconcile {:?} after its grant",
        Duration::from_nanos((c_first - c_grant) as u64)
    );
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_follower_lists_after_its_grant() {
    if candidate().await {
        return;
    }
    let test = "a_cold_follower_lists_after_its_grant";
    let (ns, kubeconfig, log) = setup("cold").await;
    let a = spawn(test, &ns, &kubeconfig, &log, "cold-a", "cold", free_port());
    wait_line(&log, "GRANT", "cold-a", "a never led");
    let port_b = free_port();
    let b = spawn(test, &ns, &kubeconfig, &log, "cold-b", "cold", port_b);
    // b runs as a follower (its always-on part answers) for a while before the audit is read:
    // on a loaded machine a fixed pause alone could end before b had even started.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !answers(port_b, "cold-b") {
        assert!(std::time::Instant::now() < deadline, "b never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let before = configmap_verbs(&audited().audit, "cold-b", 0);
    assert_eq!(
        before.get("list"),
        None,
        "a cold follower lists nothing: {before:?}"
    );
    a.signal("TERM");
    let b_grant = wait_line(&log, "GRANT", "cold-b", "b never led");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while first_start(&log, "cold-b").is_none() {
        assert!(std::time::Instant::now() < deadline, "b never reconciled");
        std::thread::sleep(Duration::from_millis(20));
    }
    let verbs = configmap_verbs(&audited().audit, "cold-b", b_grant);
    assert!(
        verbs.get("list").is_some_and(|n| *n >= 1),
        "a cold leader lists after its grant: {verbs:?}"
    );
    assert_no_cut_reconciles(&log, "cold-a");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_watch_ends_the_term_with_an_error_instead_of_a_silent_follower() {
    let server = kube_support::shared();
    let ns = unique("refused");
    server.namespace(&ns).await;
    // A ServiceAccount that may campaign but not list ConfigMaps.
    let (client, _) = kube_support::fencing::participant(&ns, "no-configmaps").await;
    let backend =
        KubeBackend::from_client(client.clone(), KubeOptions::new().namespace(ns.clone()))
            .expect("backend");
    let elector = LeaderElector::new(
        Locker::with_identity(backend, "refused").expect("identity"),
        "controller",
        safety::kube_config(),
    )
    .expect("elector");
    // Secrets: the participant has no rights on them.
    let controller = Controller::new(
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client, &ns),
        watcher::Config::default(),
    );
    let status = controller.status();
    let items: Vec<_> = tokio::time::timeout(
        Duration::from_secs(30),
        controller
            .run(
                &elector,
                |_, _: Arc<()>| async { Ok::<_, Never>(Action::await_change()) },
                |_, _, _| Action::await_change(),
                Arc::new(()),
            )
            .collect(),
    )
    .await
    .expect("the run does not hang on a refused watch");
    assert!(
        matches!(
            items.first(),
            Some(Err(kube::runtime::controller::Error::QueueError(
                ControllerError::Refused { .. }
            )))
        ),
        "{items:?}"
    );
    assert_eq!(items.len(), 1, "the run ends with the refusal: {items:?}");
    assert!(
        matches!(
            status.state(),
            tenure::controller::CacheState::Failing { refused: true, .. }
        ),
        "{:?}",
        status.state()
    );
    assert!(!elector.is_leader(), "the lease was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_reconcile_ends_the_term_and_surfaces_from_run() {
    let server = kube_support::shared();
    let ns = unique("panics");
    server.namespace(&ns).await;
    let client = server.admin().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("boom".into());
    api.create(&PostParams::default(), &cm)
        .await
        .expect("configmap");
    let backend = KubeBackend::from_client(client, KubeOptions::new().namespace(ns.clone()))
        .expect("backend");
    let elector = LeaderElector::new(
        Locker::with_identity(backend, "panics").expect("identity"),
        "controller",
        safety::kube_config(),
    )
    .expect("elector");
    let items: Vec<_> = tokio::time::timeout(
        Duration::from_secs(30),
        Controller::new(api, watcher::Config::default())
            .run(
                &elector,
                |_, _: Arc<()>| async {
                    panic!("reconcile bug");
                    #[allow(unreachable_code)]
                    Ok::<_, Never>(Action::await_change())
                },
                |_, _, _| Action::await_change(),
                Arc::new(()),
            )
            .collect(),
    )
    .await
    .expect("a panic does not hang the term");
    assert!(
        matches!(
            items.last(),
            Some(Err(kube::runtime::controller::Error::QueueError(
                ControllerError::Election(ElectionError::WorkloadPanicked { message })
            ))) if message.contains("reconcile bug")
        ),
        "{items:?}"
    );
    assert!(!elector.is_leader());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_controller_reconciles_only_its_shards_and_takes_over_moved_ones_at_once() {
    use std::sync::Mutex;
    use tenure::shard::{ShardedElector, shard_of};
    let server = kube_support::shared();
    let ns = unique("sharded");
    server.namespace(&ns).await;
    let client = server.admin().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for i in 0..OBJECTS {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(format!("obj-{i}"));
        api.create(&PostParams::default(), &cm)
            .await
            .expect("configmap");
    }
    const SHARDS: u32 = 4;
    // (replica, object, shard, owned at reconcile time)
    type Seen = Arc<Mutex<Vec<(String, String, bool)>>>;
    let seen: Seen = Arc::default();
    let replica = |who: &'static str| {
        let backend =
            KubeBackend::from_client(client.clone(), KubeOptions::new().namespace(ns.clone()))
                .expect("backend");
        let sharded = ShardedElector::new(
            Locker::with_identity(backend, who).expect("identity"),
            "sharded-ctrl",
            SHARDS,
            safety::kube_config(),
        )
        .expect("elector");
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let seen = seen.clone();
        let s = sharded.clone();
        let mut stopped = stopped.clone();
        // The shard's term reaches the reconcile through the context, as in single mode.
        let context = tenure::controller::per_term(move |term| {
            Arc::new((term.clone(), s.clone(), seen.clone()))
        });
        let controller = Controller::new(api.clone(), watcher::Config::default())
            .graceful_shutdown_on(async move {
                let _ = stopped.wait_for(|v| *v).await;
            })
            .run_sharded(
                &sharded,
                move |cm: Arc<ConfigMap>, ctx: Arc<(tenure::Term, ShardedElector, Seen)>| async move {
                    let (term, shards, seen) = &*ctx;
                    let key = tenure::controller::object_key(&*cm);
                    let shard = shard_of(&key, SHARDS);
                    let owned = shards.term(shard).is_some_and(|t| {
                        t.fencing_token() == term.fencing_token() && t.is_valid()
                    });
                    seen.lock()
                        .expect("not poisoned")
                        .push((who.to_owned(), key, owned));
                    Ok::<_, Never>(Action::await_change())
                },
                |_, _, _| Action::await_change(),
                context,
            );
        let run = tokio::spawn(controller.collect::<Vec<_>>());
        (sharded, stop, run)
    };
    let (a, _stop_a, _run_a) = replica("shard-a");
    let (b, stop_b, run_b) = replica("shard-b");
    let all = |who: &str, seen: &Seen| -> usize {
        let s = seen.lock().expect("not poisoned");
        let keys: std::collections::BTreeSet<&String> = s
            .iter()
            .filter(|(w, _, _)| w == who)
            .map(|(_, k, _)| k)
            .collect();
        keys.len()
    };
    // Settled once the shards are balanced (2 each) and every object was reconciled. Both
    // replicas start at once, so one may first take every shard and hand two over when it
    // sees the other: a look at the first moment all 4 are held could catch that in flux.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while a.owned().borrow().len() != 2
        || b.owned().borrow().len() != 2
        || all("shard-a", &seen) + all("shard-b", &seen) < OBJECTS
    {
        assert!(
            std::time::Instant::now() < deadline,
            "never settled balanced: a owns {:?}, b owns {:?}, reconciled {:?}",
            *a.owned().borrow(),
            *b.owned().borrow(),
            seen.lock().expect("not poisoned")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // b leaves gracefully: a reconciles b's objects at once, from its warm store.
    let left = std::time::Instant::now();
    stop_b.send_replace(true);
    let items = run_b.await.expect("joined");
    assert!(
        items.iter().all(Result::is_ok),
        "b left without an error: {items:?}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while all("shard-a", &seen) < OBJECTS {
        assert!(
            std::time::Instant::now() < deadline,
            "a never took b's objects over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("a reconciled b's objects {:?} after b left", left.elapsed());
    let s = seen.lock().expect("not poisoned");
    let strays: Vec<_> = s.iter().filter(|(_, _, owned)| !owned).collect();
    assert!(
        strays.is_empty(),
        "reconciled outside the shard's term: {strays:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_reconciles_each_object_as_it_is_at_the_grant_and_stands_by_again() {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    use tenure::backend::memory::MemoryBackend;
    let server = kube_support::shared();
    let ns = unique("standby");
    server.namespace(&ns).await;
    let api: Api<ConfigMap> = Api::namespaced(server.admin().await, &ns);
    let version = |cm: &ConfigMap| {
        cm.data
            .as_ref()
            .and_then(|d| d.get("v"))
            .cloned()
            .unwrap_or_default()
    };
    let put = |name: String, v: &str| {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name);
        cm.data = Some(BTreeMap::from([("v".to_owned(), v.to_owned())]));
        cm
    };
    for i in 0..OBJECTS {
        api.create(&PostParams::default(), &put(format!("obj-{i}"), "0"))
            .await
            .expect("configmap");
    }
    // One shared record of (name, version seen), cleared at each term's start.
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let runner = Controller::new(api.clone(), watcher::Config::default()).runner(
        move |cm: Arc<ConfigMap>, seen: Arc<Mutex<Vec<(String, String)>>>| async move {
            let name = cm.metadata.name.clone().unwrap_or_default();
            seen.lock()
                .expect("not poisoned")
                .push((name, version(&cm)));
            Ok::<_, Never>(Action::await_change())
        },
        |_, _, _| Action::await_change(),
        seen.clone(),
    );
    let status = runner.status().clone();
    let until = |what: &'static str, ok: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !ok() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    until("the standby is ready", &|| status.standby_ready());

    // While it stands by: five objects change, one is deleted, one is created.
    let changed: BTreeSet<String> = (1..6).map(|i| format!("obj-{i}")).collect();
    for name in &changed {
        api.replace(name, &PostParams::default(), &{
            let mut cm = api.get(name).await.expect("get");
            cm.data = Some(BTreeMap::from([("v".to_owned(), "1".to_owned())]));
            cm
        })
        .await
        .expect("replace");
    }
    api.delete("obj-0", &Default::default())
        .await
        .expect("delete");
    api.create(&PostParams::default(), &put("obj-new".into(), "1"))
        .await
        .expect("create");
    let store = status.store().expect("warm");
    until("the store sees the changes", &|| {
        let get =
            |name: &str| store.get(&kube::runtime::reflector::ObjectRef::new(name).within(&ns));
        get("obj-0").is_none()
            && get("obj-new").is_some()
            && changed
                .iter()
                .all(|n| get(n).is_some_and(|cm| version(&cm) == "1"))
    });
    assert!(status.standby_ready());

    let elector = LeaderElector::new(
        Locker::with_identity(MemoryBackend::new(), "standby").expect("identity"),
        "controller",
        safety::config(),
    )
    .expect("elector");
    // One term: every live object reconciled; returns (name, version seen) in order.
    let term = || {
        let (runner, seen) = (runner.clone(), seen.clone());
        elector.run(move |term| {
            let (runner, seen) = (runner.clone(), seen.clone());
            async move {
                seen.lock().expect("not poisoned").clear();
                let mut items = std::pin::pin!(runner.term(&term));
                let taken = runner.status().standby_ready();
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                loop {
                    let distinct: BTreeSet<String> = seen
                        .lock()
                        .expect("not poisoned")
                        .iter()
                        .map(|(n, _)| n.clone())
                        .collect();
                    if distinct.len() == OBJECTS {
                        break;
                    }
                    match tokio::time::timeout_at(deadline, items.next()).await {
                        Ok(Some(Ok(_))) => {}
                        other => panic!("{other:?} with {distinct:?} reconciled"),
                    }
                }
                let seen = seen.lock().expect("not poisoned").clone();
                (seen, taken)
            }
        })
    };
    let (first, ready_in_term) = tokio::time::timeout(Duration::from_secs(60), term())
        .await
        .expect("term 1")
        .expect("ran");
    assert!(!ready_in_term, "the term took the standby");
    let firsts: BTreeMap<&str, &str> = first
        .iter()
        .rev()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    assert!(
        !firsts.contains_key("obj-0"),
        "deleted while parked: {first:?}"
    );
    assert_eq!(firsts.get("obj-new"), Some(&"1"), "{first:?}");
    for name in &changed {
        assert_eq!(
            firsts.get(name.as_str()),
            Some(&"1"),
            "{name}'s first reconcile: {first:?}"
        );
    }

    until("the next standby is ready", &|| status.standby_ready());
    let (second, _) = tokio::time::timeout(Duration::from_secs(60), term())
        .await
        .expect("term 2")
        .expect("ran");
    let again: BTreeSet<&str> = second.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        again.len(),
        OBJECTS,
        "every object again in the next term: {second:?}"
    );
}
