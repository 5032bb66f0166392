//! The fence proves itself on a real kube-apiserver: the default policy (every resource but the
//! election's own) lets the election run and fences a governed write; a term's first write
//! waits for the proof; a binding deleted mid-term fails the term's writes closed within one
//! recheck, says so (log, Event, metric, readiness) and recovers when it is back; with the
//! anchor installed, deleting one election's binding leaves the others fenced; object tokens
//! and floors of any shape neither lock a term out nor make the CEL fail; CONNECT is fenced;
//! `tenure policy --check` tells a live fence from a missing policy, binding or Lease.
//!
//! The anchor is installed before anything else here, as `tenure policy` prints it: without
//! it, deleting the last binding stops this API server's Lease informer for good
//! (kubernetes#130887) — `tests/kube_fence_open.rs` shows that, on a server of its own.

mod kube_support;

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_support::fencing::{apply, cm, install, install_anchor, obj, participant, take};
use kube_support::{shared, unique};
use tenure::Locker;
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::election::{ElectionConfig, ElectionMetrics, LeaderElector};
use tenure::fence::kube::{FenceError, FenceState, FencedApi, Fencer, FencingPolicy};

fn backend(client: &kube::Client, ns: &str) -> KubeBackend {
    KubeBackend::from_client(client.clone(), KubeOptions::new().namespace(ns)).expect("backend")
}

/// An election `ctl` in a fresh namespace: its participant `ctl`, a first term, and its
/// policy (governing ConfigMaps) installed after the anchor and enforced.
struct Election {
    ns: String,
    client: kube::Client,
    policy: FencingPolicy,
    locker: Locker,
    held: tenure::lock::Lease,
}

async fn configmap_election(tag: &str) -> Election {
    install_anchor().await;
    let ns = unique(tag);
    shared().namespace(&ns).await;
    let (client, _) = participant(&ns, "ctl").await;
    let policy = FencingPolicy::new(&ns, "ctl")
        .and_then(|p| p.service_account(&ns, "ctl"))
        .and_then(|p| p.resource("configmaps"))
        .expect("valid policy");
    let locker = Locker::with_identity(backend(&client, &ns), "ctl-0").expect("identity");
    let held = take(&locker, "ctl").await;
    install(&policy, &Api::namespaced(client.clone(), &ns)).await;
    Election {
        ns,
        client,
        policy,
        locker,
        held,
    }
}

async fn fencer(client: &kube::Client, ns: &str) -> Fencer {
    Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(ns)
}

fn refusal<T: std::fmt::Debug>(r: &Result<T, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) => s.message.clone(),
        other => panic!("expected a refusal by the API server, got {other:?}"),
    }
}

/// The policy as `tenure policy` makes it by default: every resource but the election's own.
fn default_policy(ns: &str, lease: &str, sa: &str) -> FencingPolicy {
    FencingPolicy::new(ns, lease)
        .and_then(|p| p.service_account(ns, sa))
        .expect("valid policy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_policy_lets_the_election_run_and_fences_governed_writes_and_connect() {
    let server = shared();
    install_anchor().await;
    let ns = unique("proof-default");
    server.namespace(&ns).await;
    let lease = "ctl";
    let (client, _) = participant(&ns, "ctl").await;
    // Pods and their CONNECT subresources, for the CONNECT check below.
    let admin = server.admin().await;
    apply(
        &Api::<Role>::namespaced(admin.clone(), &ns),
        "pods",
        &obj(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods", "pods/proxy", "pods/exec", "services/proxy"], "verbs": ["*"]}]
        })),
    )
    .await;
    apply(
        &Api::<RoleBinding>::namespaced(admin.clone(), &ns),
        "pods",
        &obj(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "ctl", "namespace": ns}]
        })),
    )
    .await;
    let policy = default_policy(&ns, lease, "ctl");
    let plain: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    // As `tenure policy` prints it: the empty Lease, then the policy.
    Api::<Lease>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &policy.lease())
        .await
        .expect("the empty Lease");
    install(&policy, &plain).await;

    // An elector under the default policy: its Lease, its Events, its member Leases pass.
    let locker = Locker::with_identity(backend(&client, &ns), "ctl-0").expect("identity");
    // A renewal every 2 s, due within 2 s more: each Lease write passes the policy's
    // admission on an API server that may be slow on a loaded machine (a 1 s window, with
    // 3 s / 2 s, lost the term now and then, #42).
    const LEASE: Duration = Duration::from_secs(6);
    let config = ElectionConfig::new()
        .lease_duration(LEASE)
        .renew_deadline(Duration::from_secs(4))
        .retry_period(Duration::from_secs(1))
        .stop_margin(Duration::from_millis(300));
    let elector = LeaderElector::new(locker, lease, config).expect("config");
    let fencer = fencer(&client, &ns).await;
    let (fencer_in, ns_in) = (fencer.clone(), ns.clone());
    let worked = elector
        .run(move |term| {
            let (fencer_in, ns_in) = (fencer_in.clone(), ns_in.clone());
            async move {
                let cms: FencedApi<ConfigMap> = fencer_in.namespaced(&term, &ns_in);
                let started = Instant::now();
                cms.create(&PostParams::default(), &cm("governed", "1"))
                    .await
                    .expect("the leader's first governed write");
                let barrier = started.elapsed();
                assert_eq!(fencer_in.prove(&term).await, FenceState::Enforced);
                // Three whole leases of renewals under the policy, writing all along.
                let mut writes = 1;
                while started.elapsed() < LEASE * 3 {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    cms.patch(
                        "governed",
                        &PatchParams::default(),
                        &Patch::Merge(serde_json::json!({"data": {"n": writes.to_string()}})),
                    )
                    .await
                    .expect("the leader keeps writing");
                    writes += 1;
                    assert!(term.is_valid(), "the term ended under the policy");
                }
                (term.fencing_token(), barrier, writes)
            }
        })
        .await
        .expect("the election ran under the default policy");
    let (token, barrier, writes) = worked;
    println!("default policy: first write after {barrier:?} (proof included), {writes} writes");

    // A participant's governed write without a token is refused; a Lease of its own is not.
    let unfenced = plain
        .create(&PostParams::default(), &cm("unfenced", "x"))
        .await;
    assert!(refusal(&unfenced).contains("missing token"), "{unfenced:?}");
    let own: Api<Lease> = Api::namespaced(client.clone(), &ns);
    own.create(
        &PostParams::default(),
        &obj(serde_json::json!({"metadata": {"name": "a-member-lease"}})),
    )
    .await
    .expect("the election's own Leases are not governed");
    // The probe is only ever dry-run.
    assert!(
        own.get_opt(&policy.probe()).await.expect("read").is_none(),
        "the probe Lease must never be created"
    );

    // CONNECT: a participant's proxy and exec without a token are refused by the policy;
    // with the current token they pass admission (and then find no pod).
    let connect = |client: kube::Client, path: String| async move {
        let request = http::Request::get(path).body(Vec::new()).expect("request");
        client.request_text(request).await
    };
    for sub in ["proxy/", "exec?command=true&stdout=true"] {
        let path = format!("/api/v1/namespaces/{ns}/pods/nowhere/{sub}");
        let refused = connect(client.clone(), path.clone()).await;
        assert!(
            refusal(&refused).contains("tenure fencing: lease")
                && refusal(&refused).contains("missing token"),
            "{sub}: {refused:?}"
        );
        let with_token = Fencer::new(client.clone())
            .await
            .expect("identity")
            .lease_namespace(&ns)
            .client_with_token(lease, token);
        let passed = connect(with_token, path).await;
        let message = refusal(&passed);
        assert!(
            !message.contains("tenure fencing"),
            "{sub}: the current token passes admission: {message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_deleted_mid_term_fails_writes_closed_loudly_and_recovers() {
    let server = shared();
    let lease = "ctl";
    let Election {
        ns,
        client,
        policy,
        held,
        ..
    } = configmap_election("proof-open").await;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ElectionMetrics::register(&mut registry);
    let recheck = Duration::from_secs(1);
    let fencer = fencer(&client, &ns)
        .await
        .recheck_every(recheck)
        .with_metrics(metrics);
    let cms: FencedApi<ConfigMap> = fencer.namespaced_with_token(lease, held.fencing_token(), &ns);
    let pp = PostParams::default();
    cms.create(&pp, &cm("a", "1"))
        .await
        .expect("enforced: the write goes");
    assert_eq!(fencer.open_fence(), None);
    let text = || {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encode");
        out
    };
    assert!(
        text().contains(&format!("tenure_fence_enforced{{name=\"{lease}\"}} 1")),
        "{}",
        text()
    );

    // Someone deletes the binding (the anchor keeps the API server's Lease cache alive).
    let admin = server.admin().await;
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
    bindings
        .delete(&policy.name(), &DeleteParams::default())
        .await
        .expect("delete the binding");
    let deleted = Instant::now();
    let refused = loop {
        match cms
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"data": {"v": "2"}})),
            )
            .await
        {
            Ok(_) => {}
            Err(e) => break e,
        }
        assert!(
            deleted.elapsed() < Duration::from_secs(20),
            "fenced writes still go with no binding"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let detected = deleted.elapsed();
    println!(
        "binding deleted -> fenced writes fail closed after {detected:?} (recheck {recheck:?})"
    );
    match &refused {
        FenceError::Unenforced { lease: l, cause } => {
            assert_eq!(l, &format!("{ns}/{lease}"));
            assert!(cause.contains(&policy.name()), "names the objects: {cause}");
            assert!(cause.contains("restart"), "names the fix: {cause}");
        }
        other => panic!("expected Unenforced, got {other:?}"),
    }
    assert!(
        fencer
            .open_fence()
            .is_some_and(|m| m.contains(&format!("lease {ns}/{lease}"))),
        "{:?}",
        fencer.open_fence()
    );
    assert!(
        text().contains(&format!("tenure_fence_enforced{{name=\"{lease}\"}} 0")),
        "{}",
        text()
    );
    assert!(text().contains("result=\"unenforced\""), "{}", text());
    let events: Api<Event> = Api::namespaced(admin.clone(), &ns);
    let reasons = |list: Vec<Event>| -> Vec<String> {
        list.into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(lease))
            .filter_map(|e| e.reason)
            .collect()
    };
    let seen = reasons(
        events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items,
    );
    assert!(seen.iter().any(|r| r == "FenceOpen"), "{seen:?}");

    // The binding is back: the next recheck proves the fence, and writes go again.
    apply(&bindings, &policy.name(), &policy.binding()).await;
    let back = Instant::now();
    loop {
        if cms
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"data": {"v": "3"}})),
            )
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(20),
            "fenced writes never went again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(fencer.open_fence(), None);
    let seen = reasons(
        events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items,
    );
    assert!(seen.iter().any(|r| r == "FenceEnforced"), "{seen:?}");
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_anchor_deleting_one_elections_binding_leaves_the_others_fenced() {
    let server = shared();
    install_anchor().await;
    let ns = unique("proof-anchor");
    server.namespace(&ns).await;
    let (client, _) = participant(&ns, "ctl").await;
    let plain: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let kept = FencingPolicy::new(&ns, "kept")
        .and_then(|p| p.service_account(&ns, "ctl"))
        .and_then(|p| p.resource("configmaps"))
        .expect("valid");
    let gone = FencingPolicy::new(&ns, "gone")
        .and_then(|p| p.service_account(&ns, "ctl"))
        .and_then(|p| p.resource("secrets"))
        .expect("valid");
    let a = Locker::with_identity(backend(&client, &ns), "a").expect("identity");
    let first = take(&a, "kept").await;
    install(&kept, &plain).await;
    // The other election's policy and binding exist for a while (as a release would)...
    apply(
        &Api::<ValidatingAdmissionPolicy>::all(server.admin().await),
        &gone.name(),
        &gone.policy(),
    )
    .await;
    apply(
        &Api::<ValidatingAdmissionPolicyBinding>::all(server.admin().await),
        &gone.name(),
        &gone.binding(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // ...then the other election goes: its binding (the upstream trigger, were it the last one) and
    // its policy.
    kube_support::fencing::uninstall(&gone.name()).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // > the API server's 1 s policy refresh
    // A takeover after the deletion: the API server must see the new floor.
    let stale = first.fencing_token();
    first.orphan();
    let b = Locker::with_identity(backend(&client, &ns), "b").expect("identity");
    let second = take(&b, "kept").await;
    let fencer = fencer(&client, &ns).await;
    let current: FencedApi<ConfigMap> =
        fencer.namespaced_with_token("kept", second.fencing_token(), &ns);
    current
        .create(&PostParams::default(), &cm("b", "1"))
        .await
        .expect("the new term proves its fence and writes");
    // The old term's token, sent by hand (warn-only: no proof in the way), is refused by the
    // API server itself.
    let loose = fencer.clone().warn_only(true);
    let old: FencedApi<ConfigMap> = loose.namespaced_with_token("kept", stale, &ns);
    match old.create(&PostParams::default(), &cm("a", "stale")).await {
        Err(FenceError::Stale { ours, .. }) => assert_eq!(ours, stale.get()),
        other => panic!("the stale token must be refused: {other:?}"),
    }
    assert!(
        Api::<ConfigMap>::namespaced(server.admin().await, &ns)
            .get_opt("a")
            .await
            .expect("read")
            .is_none()
    );
    second.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_tokens_of_any_shape_lock_no_term_out_and_participants_stamp_only_their_own() {
    let server = shared();
    let lease = "ctl";
    let Election {
        ns, client, held, ..
    } = configmap_election("proof-object").await;
    let token = held.fencing_token();
    let fencer = fencer(&client, &ns).await;
    let ours: FencedApi<ConfigMap> = fencer.namespaced_with_token(lease, token, &ns);
    let pp = PostParams::default();
    ours.create(&pp, &cm("obj", "0"))
        .await
        .expect("first write");
    let admin: Api<ConfigMap> = Api::namespaced(server.admin().await, &ns);
    let planted = [
        (token.get() + 1_000_000).to_string(),
        "99999999999999999999".to_owned(), // 20 digits: over int64
        "1234567890123456789012345".to_owned(), // 25 digits: over u64
        "-5".to_owned(),
        "007".to_owned(),
        "garbage".to_owned(),
        "x".repeat(5000),
    ];
    for (i, value) in planted.iter().enumerate() {
        admin
            .patch(
                "obj",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"tenure.dev/fencing-token": value}}})),
            )
            .await
            .unwrap_or_else(|e| panic!("a non-participant plants {value:.20}: {e}"));
        let landed = ours
            .patch(
                "obj",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"data": {"v": i.to_string()}})),
            )
            .await
            .unwrap_or_else(|e| panic!("after {value:.30} was planted: {e}"));
        assert_eq!(
            landed
                .metadata
                .annotations
                .and_then(|a| a.get("tenure.dev/fencing-token").cloned()),
            Some(token.get().to_string())
        );
    }
    // A participant may not set the object token to anything but its own request token.
    let raw = fencer.client_with_token(lease, token);
    let raw: Api<ConfigMap> = Api::namespaced(raw, &ns);
    let forged = raw
        .patch(
            "obj",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"tenure.dev/fencing-token": (token.get() + 5).to_string()}}})),
        )
        .await;
    let message = refusal(&forged);
    assert!(
        message.contains("object token") && message.contains(&token.get().to_string()),
        "{message}"
    );
    // Leaving it as it is, or writing its own, is fine.
    raw.patch(
        "obj",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"kept": "1"}})),
    )
    .await
    .expect("a write that keeps the object token");
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_floor_fails_closed_naming_the_lease_and_the_next_grant_repairs_it() {
    let server = shared();
    let lease = "ctl";
    let Election {
        ns,
        client,
        locker,
        held,
        ..
    } = configmap_election("proof-floor").await;
    let token = held.fencing_token();
    held.release().await.expect("release");
    let fencer = fencer(&client, &ns).await;
    // Warn-only: the writes reach the server although the proof fails, to see its refusal.
    let loose = fencer.clone().warn_only(true);
    let raw: Api<ConfigMap> = Api::namespaced(loose.client_with_token(lease, token), &ns);
    let leases: Api<Lease> = Api::namespaced(server.admin().await, &ns);
    // 20 digits above u64::MAX: broken to the policy as to `tenure policy --check`.
    for floor in [
        "garbage",
        "-5",
        "99999999999999999999999",
        "0012",
        "99999999999999999999",
    ] {
        leases
            .patch(
                lease,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"tenure.dev/fencing-floor": floor}}})),
            )
            .await
            .expect("a broken floor");
        let deadline = Instant::now() + Duration::from_secs(15);
        let message = loop {
            let r = raw.create(&PostParams::default(), &cm("w", floor)).await;
            // The policy reads the Lease from the API server's informer, a little behind the
            // patch: a refusal may still name the previous broken floor. Wait for this one.
            if let Err(kube::Error::Api(s)) = &r
                && s.message.contains("broken floor")
                && s.message.contains(&format!("\"{:.20}", floor))
            {
                break s.message.clone();
            }
            if r.is_ok() {
                let _ = raw.delete("w", &DeleteParams::default()).await;
            }
            assert!(
                Instant::now() < deadline,
                "{floor}: writes not refused: {r:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            message.contains(&format!("lease {ns}/{lease}"))
                && message.contains("tenure.dev/fencing-floor")
                && message.contains(&format!("{:.20}", floor)),
            "{message}"
        );
    }
    // The next grant writes a good floor: a new term's fenced writes go.
    let again = take(&locker, lease).await;
    let ours: FencedApi<ConfigMap> =
        fencer.namespaced_with_token(lease, again.fencing_token(), &ns);
    ours.create(&PostParams::default(), &cm("after", "1"))
        .await
        .expect("the next grant repairs the floor");
    again.release().await.expect("release");
}

/// `tenure policy --check` as a cluster admin would run it.
fn check(ns: &str, lease: &str, extra: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["policy", "--check", "--lease", lease, "--namespace", ns])
        .args(extra)
        .env("KUBECONFIG", shared().admin_kubeconfig())
        .env("TENURE_LOG", "warn")
        .output()
        .expect("run tenure");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenure_policy_check_tells_a_live_fence_from_missing_pieces() {
    let server = shared();
    install_anchor().await;
    let ns = unique("proof-check");
    server.namespace(&ns).await;
    let lease = "ctl";
    let (client, _) = participant(&ns, "ctl").await;
    let sa = ["--service-account", "ctl"];
    let (code, _, err) = check(&ns, lease, &sa);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("no ValidatingAdmissionPolicy"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");

    let policy = FencingPolicy::new(&ns, lease)
        .and_then(|p| p.service_account(&ns, "ctl"))
        .and_then(|p| p.resource("configmaps"))
        .expect("valid");
    let admin = server.admin().await;
    apply(
        &Api::<ValidatingAdmissionPolicy>::all(admin.clone()),
        &policy.name(),
        &policy.policy(),
    )
    .await;
    let (code, _, err) = check(&ns, lease, &sa);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("has no binding"), "{err}");

    apply(
        &Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone()),
        &policy.name(),
        &policy.binding(),
    )
    .await;
    let (code, _, err) = check(&ns, lease, &sa);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("does not exist"), "the Lease: {err}");

    // Before any term: the empty Lease; a token-less write must be refused.
    Api::<Lease>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &policy.lease())
        .await
        .expect("the empty Lease");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, out, err) = check(&ns, lease, &sa);
        if code == 0 {
            assert!(out.contains("enforced") && out.contains("floor 0"), "{out}");
            break;
        }
        assert!(Instant::now() < deadline, "never enforced: {code} {err}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // After a grant: the floor's predecessor must be refused.
    let locker = Locker::with_identity(backend(&client, &ns), "ctl-0").expect("identity");
    let held = take(&locker, lease).await;
    let (code, out, err) = check(&ns, lease, &sa);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("floor {}", held.fencing_token().get())),
        "{out}"
    );
    // A floor that parses but is not canonical ("0012") is broken for the policy too.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns);
    leases
        .patch(
            lease,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"tenure.dev/fencing-floor": "0012"}}})),
        )
        .await
        .expect("a non-canonical floor");
    let (code, _, err) = check(&ns, lease, &sa);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("\"0012\", not a fencing token"), "{err}");
    leases
        .patch(
            lease,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"tenure.dev/fencing-floor": held.fencing_token().get().to_string()}}})),
        )
        .await
        .expect("the floor back");
    // Someone who is not a participant proves nothing: the policy does not match them.
    let _ = participant(&ns, "stranger").await;
    let (code, _, err) = check(&ns, lease, &["--service-account", "stranger"]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("not a participant"), "{err}");
    held.release().await.expect("release");
}

/// `tenure policy --check` as `kubeconfig`'s user.
fn check_as(kubeconfig: &std::path::Path, ns: &str, lease: &str, extra: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["policy", "--check", "--lease", lease, "--namespace", ns])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .env("TENURE_LOG", "warn")
        .output()
        .expect("run tenure");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The check of a user participant whose permissions come from a group proves as that user
/// *with* the group (impersonated without it, the user may create nothing); a binding that
/// reads another Lease is an open fence (5), not a check that could not run; a caller who may
/// not read the policy is told so (4), not sent an impersonation hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenure_policy_check_proves_as_a_group_user_and_names_a_moved_binding_and_what_it_cannot_read()
 {
    let server = shared();
    install_anchor().await;
    let ns = unique("check-group");
    server.namespace(&ns).await;
    let lease = "ctl";
    let admin = server.admin().await;
    // carol may create leases only through her group.
    apply(
        &Api::<Role>::namespaced(admin.clone(), &ns),
        "team",
        &obj(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "team"},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
        })),
    )
    .await;
    apply(
        &Api::<RoleBinding>::namespaced(admin.clone(), &ns),
        "team",
        &obj(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "team"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "team"},
            "subjects": [{"kind": "Group", "name": "team-ops", "apiGroup": "rbac.authorization.k8s.io"}]
        })),
    )
    .await;
    let policy = FencingPolicy::new(&ns, lease)
        .and_then(|p| p.user("carol"))
        .and_then(|p| p.resource("configmaps"))
        .expect("valid");
    let kubeconfig = server.admin_kubeconfig();
    let carol = ["--user", "carol", "--group", "team-ops"];
    // Not installed: open.
    let (code, out) = check_as(&kubeconfig, &ns, lease, &carol);
    assert_eq!(code, 5, "{out}");
    Api::<Lease>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &policy.lease())
        .await
        .expect("the empty Lease");
    apply(
        &Api::<ValidatingAdmissionPolicy>::all(admin.clone()),
        &policy.name(),
        &policy.policy(),
    )
    .await;
    apply(
        &Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone()),
        &policy.name(),
        &policy.binding(),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let out = loop {
        let (code, out) = check_as(&kubeconfig, &ns, lease, &carol);
        if code == 0 {
            break out;
        }
        assert!(Instant::now() < deadline, "never enforced: {code} {out}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(out.contains("checked as carol (groups team-ops)"), "{out}");
    // Without her group she may create nothing: the check cannot run, and says why.
    let (code, out) = check_as(&kubeconfig, &ns, lease, &["--user", "carol"]);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains("the dry run as carol was refused") && out.contains("each of its groups"),
        "{out}"
    );

    // A binding that reads another Lease fences nothing of this election: open, naming it.
    let mut moved = policy.binding();
    if let Some(p) = moved.spec.param_ref.as_mut() {
        p.name = Some("elsewhere".into());
    }
    apply(
        &Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone()),
        &policy.name(),
        &moved,
    )
    .await;
    let (code, out) = check_as(&kubeconfig, &ns, lease, &carol);
    assert_eq!(code, 5, "{out}");
    assert!(
        out.contains(&format!("reads the Lease {ns}/elsewhere")),
        "{out}"
    );
    apply(
        &Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone()),
        &policy.name(),
        &policy.binding(),
    )
    .await;

    // A caller that may not read ValidatingAdmissionPolicies: 4, saying so.
    let (_, worker) = participant(&ns, "worker").await;
    let (code, out) = check_as(&worker, &ns, lease, &carol);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains("cannot read the ValidatingAdmissionPolicy") && out.contains("cluster admin"),
        "{out}"
    );
    assert!(!out.contains("ServiceError"), "{out}");
}

#[test]
fn tenure_policy_refuses_to_govern_the_elections_own_resources() {
    for own in [
        "leases.coordination.k8s.io",
        "events",
        "events.events.k8s.io",
        "elections.tenure.dev",
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args([
                "policy",
                "--lease",
                "x",
                "--namespace",
                "ns",
                "--resource",
                own,
            ])
            .output()
            .expect("run tenure");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{own}: {err}");
        assert_eq!(err.lines().count(), 1, "{own}: one line: {err}");
        assert!(
            err.contains(own) && err.contains("without a token"),
            "{own}: {err}"
        );
        assert!(out.stdout.is_empty(), "nothing printed for {own}");
    }
    // The anchor comes first in what it prints.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["policy", "--lease", "x", "--namespace", "ns"])
        .output()
        .expect("run tenure");
    let text = String::from_utf8_lossy(&out.stdout);
    let anchor = text
        .find("name: tenure-fencing-anchor")
        .expect("the anchor");
    let policy = text.find("name: tenure-fencing.ns.x").expect("the policy");
    assert!(anchor < policy, "{text}");
}
