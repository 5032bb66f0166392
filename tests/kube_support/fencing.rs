//! Fencing on the real apiserver, shared by the fencing suite and its bench: a participant
//! ServiceAccount with the RBAC a fenced client needs, and installing a policy.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;

use tenure::Locker;
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::election::{ElectionConfig, Term};
use tenure::fence::kube::{FenceState, Fencer, FencingPolicy};
use tenure::shard::ShardedElector;
use tokio::sync::{mpsc, oneshot};

use super::{kubectl, shared};

pub fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
}

pub async fn apply<K>(api: &Api<K>, name: &str, object: &K)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply("tenure-tests").force(),
        &Patch::Apply(object),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {name}: {e}"));
}

/// A ServiceAccount `sa` in `ns` with what a fenced controller needs: configmaps and
/// deployments (with status), its Lease, Events, and impersonating itself with the token
/// extra. Returns a client authenticated as it (a TokenRequest token), and its kubeconfig.
pub async fn participant(ns: &str, sa: &str) -> (kube::Client, PathBuf) {
    let server = shared();
    let admin = server.admin().await;
    // The ServiceAccount itself is made by `service_account`, below: a binding may name it
    // before it exists.
    let role = format!("{sa}-fenced");
    apply(
        &Api::<Role>::namespaced(admin.clone(), ns),
        &role,
        &obj(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": role},
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]},
                {"apiGroups": ["apps"], "resources": ["deployments", "deployments/status"], "verbs": ["*"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": [sa], "verbs": ["impersonate"]}
            ]
        })),
    )
    .await;
    apply(
        &Api::<RoleBinding>::namespaced(admin.clone(), ns),
        &role,
        &obj(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
        })),
    )
    .await;
    let cluster_role = "tenure-fencing-token-extra";
    apply(
        &Api::<ClusterRole>::all(admin.clone()),
        cluster_role,
        &obj(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": cluster_role},
            "rules": [{"apiGroups": ["authentication.k8s.io"], "resources": ["userextras/tenure.dev/fencing-token", "userextras/tenure.dev/fencing-election"], "verbs": ["impersonate"]}]
        })),
    )
    .await;
    let binding = format!("tenure-fencing-token-extra-{ns}-{sa}");
    apply(
        &Api::<ClusterRoleBinding>::all(admin.clone()),
        &binding,
        &obj(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
        })),
    )
    .await;
    service_account(ns, sa).await
}

/// The ServiceAccount `sa` in `ns` (created if missing), a client authenticated as it (a
/// TokenRequest token) and its kubeconfig; RBAC is the caller's.
pub async fn service_account(ns: &str, sa: &str) -> (kube::Client, PathBuf) {
    let server = shared();
    let admin = server.admin().await;
    apply(
        &Api::<ServiceAccount>::namespaced(admin.clone(), ns),
        sa,
        &obj(serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}})),
    )
    .await;
    // A token for the ServiceAccount, then a kubeconfig like the tester's with it.
    let sas: Api<ServiceAccount> = Api::namespaced(admin, ns);
    let request = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}
    });
    let answer: serde_json::Value = sas
        .create_subresource("token", sa, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {sa}: {e}"));
    let token = answer["status"]["token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!token.is_empty(), "no token: {answer}");
    let tester = std::fs::read_to_string(server.tester_kubeconfig()).unwrap_or_default();
    let tester_token = std::fs::read_to_string(server.dir.join("tester.token")).unwrap_or_default();
    let kubeconfig = tester.replace(tester_token.trim(), &token);
    let path = super::fresh_dir("fencing").join(format!("{sa}.kubeconfig"));
    std::fs::write(&path, &kubeconfig).unwrap_or_else(|e| panic!("{e}"));
    (server.client_from(&path).await, path)
}

/// Installs the anchor (`FencingPolicy::anchor`) as admin: before any policy, as `tenure
/// policy` prints it, so that deleting an election's binding never stops the API server's
/// Lease parameter informer (kubernetes#130887).
pub async fn install_anchor() {
    let admin = shared().admin().await;
    let (policy, binding) = FencingPolicy::anchor();
    apply(
        &Api::<ValidatingAdmissionPolicy>::all(admin.clone()),
        tenure::fence::kube::ANCHOR_NAME,
        &policy,
    )
    .await;
    apply(
        &Api::<ValidatingAdmissionPolicyBinding>::all(admin),
        tenure::fence::kube::ANCHOR_NAME,
        &binding,
    )
    .await;
}

/// Applies the anchor, then `policy` and its binding, as admin, without waiting for the API
/// server to enforce it (a policy over a resource nobody writes yet cannot be waited for by
/// a write: prove a term with [`enforced`] instead).
pub async fn apply_policy(policy: &FencingPolicy) {
    install_anchor().await;
    let admin = shared().admin().await;
    apply(
        &Api::<ValidatingAdmissionPolicy>::all(admin.clone()),
        &policy.name(),
        &policy.policy(),
    )
    .await;
    apply(
        &Api::<ValidatingAdmissionPolicyBinding>::all(admin),
        &policy.name(),
        &policy.binding(),
    )
    .await;
}

/// Proves `term`'s fence with fresh fencers of `client` until it is enforced (a policy just
/// applied is loaded by the API server within a second or so); fails after 30 s.
pub async fn enforced(client: &kube::Client, ns: &str, term: &tenure::election::Term) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let fencer = Fencer::new(client.clone())
            .await
            .expect("identity")
            .lease_namespace(ns);
        match fencer.prove(term).await {
            FenceState::Enforced => return,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "{}'s fence not enforced within 30 s: {other:?}",
                term.lease_name()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `kubectl annotate` of ConfigMap `name` in `ns` as the participant `ctl` (its kubeconfig),
/// with `extras` as `--as-user-extra` values (`tenure.dev/fencing-token=…`): a write that
/// bypasses tenure's client, judged by the API server alone. `Ok` or its refusal.
pub fn raw_write(kubeconfig: &Path, ns: &str, name: &str, extras: &[String]) -> Result<(), String> {
    let out = std::process::Command::new(kubectl())
        .args([
            "annotate",
            "configmap",
            name,
            "-n",
            ns,
            "--overwrite",
            "raw=1",
        ])
        .arg(format!("--as=system:serviceaccount:{ns}:ctl"))
        .args(extras.iter().map(|e| format!("--as-user-extra={e}")))
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run kubectl");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Installs the anchor and `policy` as admin and waits until the API server enforces it (a
/// participant's write without a token is refused by it).
pub async fn install(policy: &FencingPolicy, probe: &Api<ConfigMap>) {
    apply_policy(policy).await;
    wait_until_enforced(probe, &policy.name()).await;
}

/// Waits until the policy named `policy` refuses a participant's write without a token
/// (`probe` is the participant's ConfigMaps in a governed namespace): the API server enforces
/// it.
pub async fn wait_until_enforced(probe: &Api<ConfigMap>, policy: &str) {
    let cm = cm("policy-probe", "x");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match probe.create(&PostParams::default(), &cm).await {
            // Refused by *this* policy (its name is in the message), not an older one.
            Err(kube::Error::Api(s))
                if s.message.contains("tenure fencing:") && s.message.contains(policy) =>
            {
                return;
            }
            Ok(_) => {
                let _ = probe.delete("policy-probe", &DeleteParams::default()).await;
            }
            Err(_) => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the policy was not enforced within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Takes `lease` for a term with a 3 s ttl, renewed (waiting out the previous holder's).
pub async fn take(locker: &tenure::Locker, lease: &str) -> tenure::lock::Lease {
    locker
        .acquire(
            lease,
            &tenure::lock::LockOptions::new()
                .ttl(Duration::from_secs(3))
                .wait(Duration::from_secs(20))
                .auto_renew(true),
        )
        .await
        .unwrap_or_else(|e| panic!("acquire {lease}: {e}"))
}

pub fn cm(name: &str, value: &str) -> ConfigMap {
    obj(serde_json::json!({"metadata": {"name": name}, "data": {"v": value}}))
}

/// Deletes the policy named `name` and its binding (of the same name) as admin.
pub async fn uninstall(name: &str) {
    let admin = shared().admin().await;
    let _ = Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .delete(name, &DeleteParams::default())
        .await;
    let _ = Api::<ValidatingAdmissionPolicy>::all(admin)
        .delete(name, &DeleteParams::default())
        .await;
}

/// A term of the election `name` in `ns`, won by an elector of `client` (default durations),
/// which serves it in the background until the returned sender fires (or is dropped); the
/// handle ends with the run.
pub async fn elect(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> (
    tenure::election::Term,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let backend = tenure::backend::kube::KubeBackend::from_client(
        client.clone(),
        tenure::backend::kube::KubeOptions::new().namespace(ns),
    )
    .unwrap_or_else(|e| panic!("backend: {e}"));
    let locker = tenure::Locker::with_identity(backend, "bench").expect("identity");
    let elector =
        tenure::election::LeaderElector::new(locker, name, tenure::election::ElectionConfig::new())
            .expect("elector");
    let (begun, term) = tokio::sync::oneshot::channel();
    let (end, ended) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        let mut begun = Some(begun);
        let result = elector
            .run_until(
                async {
                    let _ = ended.await;
                },
                move |term: tenure::election::Term| {
                    if let Some(begun) = begun.take() {
                        let _ = begun.send(term.clone());
                    }
                    async move { term.cancellation().cancelled().await }
                },
            )
            .await;
        if let Err(e) = result {
            eprintln!("the bench's election ended: {e}");
        }
    });
    let term = tokio::time::timeout(Duration::from_secs(60), term)
        .await
        .unwrap_or_else(|_| panic!("no term of {name} within 60 s"))
        .unwrap_or_else(|_| panic!("the election of {name} ended without a term"));
    (term, end, run)
}

/// One replica of the sharded group `group` with `shards` shards as `client`, run in the background:
/// each shard term it begins is sent on the channel; the sender ends it. Leases of 15 s: the
/// test wants its terms to last (a term lost to a slow renewal on a loaded machine would
/// make its live token stale under the test's feet).
pub fn group_replica(
    client: &kube::Client,
    ns: &str,
    group: &str,
    identity: &str,
    shards: u32,
) -> (mpsc::UnboundedReceiver<(u32, Term)>, oneshot::Sender<()>) {
    let backend = KubeBackend::from_client(client.clone(), KubeOptions::new().namespace(ns))
        .expect("backend");
    let locker = Locker::with_identity(backend, identity).expect("identity");
    let config = ElectionConfig::new()
        .lease_duration(Duration::from_secs(15))
        .renew_deadline(Duration::from_secs(10))
        .retry_period(Duration::from_millis(500));
    let elector = ShardedElector::new(locker, group, shards, config).expect("elector");
    let (terms, begun) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let run = elector.run_until(
            async {
                let _ = stopped.await;
            },
            move |shard, term: Term| {
                let _ = terms.send((shard, term.clone()));
                async move { term.cancellation().cancelled().await }
            },
        );
        if let Err(e) = run.await {
            eprintln!("the replica's group run ended: {e}");
        }
    });
    (begun, stop)
}

/// The first term of every shard `0..shards`, as they begin.
pub async fn terms_of_all(
    begun: &mut mpsc::UnboundedReceiver<(u32, Term)>,
    shards: u32,
) -> BTreeMap<u32, Term> {
    let mut terms = BTreeMap::new();
    while terms.len() < shards as usize {
        let (shard, term) = tokio::time::timeout(Duration::from_secs(90), begun.recv())
            .await
            .unwrap_or_else(|_| panic!("only shards {:?} began within 90 s", terms.keys()))
            .expect("the replica runs");
        terms.insert(shard, term);
    }
    terms
}
