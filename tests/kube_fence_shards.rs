//! One fencing policy per sharded group, on a real kube-apiserver: the binding selects the
//! group's shard Leases by their label and the API server evaluates the policy once per shard
//! Lease, each evaluation judging only the requests that name its own shard. A shard term's
//! `Fencer` clients prove their shard's fence and write; a stale token for a shard, another
//! shard's token (a shard its replica does not hold) and a write naming no shard are refused
//! by the API server, naming the group, the shard, the token and the current one; with the
//! group's binding deleted a shard term's proof fails closed naming the group's policy.
//! `tenure policy --shards` prints it (applied with kubectl) and `--check --shards` proves
//! every shard.

mod kube_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use kube_support::fencing::{apply, cm, install_anchor, participant};
use kube_support::{kubectl, shared, unique};
use tenure::Locker;
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::election::{ElectionConfig, Term};
use tenure::fence::kube::{FenceError, FenceState, Fencer, FencingPolicy};
use tenure::shard::ShardedElector;
use tokio::sync::{mpsc, oneshot};

const GROUP: &str = "orders";

fn group_policy(ns: &str, shards: u32) -> FencingPolicy {
    FencingPolicy::new(ns, GROUP)
        .and_then(|p| p.service_account(ns, "ctl"))
        .and_then(|p| p.resource("configmaps"))
        .and_then(|p| p.shards(shards))
        .expect("valid policy")
}

/// Applies the anchor, then `policy` and its binding, as admin.
async fn apply_policy(policy: &FencingPolicy) {
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

/// One replica of the group `GROUP` with `shards` shards as `client` (fast timings), run in
/// the background: each shard term it begins is sent on the channel; the sender ends it.
fn replica(
    client: &kube::Client,
    ns: &str,
    identity: &str,
    shards: u32,
) -> (mpsc::UnboundedReceiver<(u32, Term)>, oneshot::Sender<()>) {
    let backend = KubeBackend::with_options(client.clone(), KubeOptions::new().namespace(ns))
        .expect("backend");
    let locker = Locker::with_identity(backend, identity).expect("identity");
    let config = ElectionConfig::new()
        .lease_duration(Duration::from_secs(4))
        .renew_deadline(Duration::from_secs(3))
        .retry_period(Duration::from_millis(500))
        .stop_margin(Duration::from_millis(500));
    let elector = ShardedElector::new(locker, GROUP, shards, config).expect("elector");
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
async fn terms_of_all(
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

/// `kubectl annotate` of ConfigMap `name` as the participant `ctl` with `extras` as
/// `--as-user-extra` values: a write judged by the API server alone. `Ok` or its refusal.
fn raw_write(kubeconfig: &Path, ns: &str, name: &str, extras: &[String]) -> Result<(), String> {
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

fn extras(election: Option<&str>, token: Option<u64>) -> Vec<String> {
    let mut e = Vec::new();
    if let Some(token) = token {
        e.push(format!("tenure.dev/fencing-token={token}"));
    }
    if let Some(election) = election {
        e.push(format!("tenure.dev/fencing-election={election}"));
    }
    e
}

/// Proves `term`'s fence with fresh fencers until it is enforced (a policy just applied is
/// loaded by the API server within a second or so).
async fn enforced(client: &kube::Client, ns: &str, term: &Term) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_policy_judges_each_shard_by_its_own_lease_and_refuses_writes_naming_no_shard() {
    let ns = unique("shardfence");
    shared().namespace(&ns).await;
    let (client, kubeconfig) = participant(&ns, "ctl").await;
    let policy = group_policy(&ns, 4);
    let (mut begun, _stop) = replica(&client, &ns, "r1", 4);
    let terms = terms_of_all(&mut begun, 4).await;
    apply_policy(&policy).await;
    for term in terms.values() {
        enforced(&client, &ns, term).await;
    }
    let fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    // Every shard's live term writes through a FencedApi of its Term, whatever the order of
    // the tokens: each is judged by its own shard Lease.
    for (shard, term) in &terms {
        fencer
            .namespaced::<ConfigMap>(term, &ns)
            .create(&PostParams::default(), &cm(&format!("obj-{shard}"), "x"))
            .await
            .unwrap_or_else(|e| panic!("shard {shard}'s live term was refused: {e}"));
    }
    let token = |shard: u32| terms[&shard].fencing_token().get();
    let election = |shard: u32| format!("{ns}/{GROUP}-{shard}");
    // The live token of each shard, naming it: admitted by the API server alone.
    for shard in 0..4 {
        raw_write(
            &kubeconfig,
            &ns,
            &format!("obj-{shard}"),
            &extras(Some(&election(shard)), Some(token(shard))),
        )
        .unwrap_or_else(|e| panic!("shard {shard}'s live token refused: {e}"));
    }
    // A stale token for shard 1: refused, naming the group, the shard, the token and the
    // current one.
    let refused = raw_write(
        &kubeconfig,
        &ns,
        "obj-1",
        &extras(Some(&election(1)), Some(token(1) - 1)),
    )
    .expect_err("a stale token of shard 1 admitted");
    assert!(
        refused.contains(&format!(
            "lease {ns}/{GROUP}-1: stale: token {} < current {} (shard 1 of group {ns}/{GROUP})",
            token(1) - 1,
            token(1)
        )),
        "{refused}"
    );
    // Another shard's live token naming shard 2: the replica does not hold shard 2 with it.
    let other = if token(3) > token(2) { 3 } else { 0 };
    let refused = raw_write(
        &kubeconfig,
        &ns,
        "obj-2",
        &extras(Some(&election(2)), Some(token(other))),
    )
    .expect_err("another shard's token admitted for shard 2");
    assert!(
        refused.contains(&format!("lease {ns}/{GROUP}-2: "))
            && refused.contains(&format!("token {}", token(other)))
            && refused.contains(&format!("{}", token(2)))
            && refused.contains(&format!("shard 2 of group {ns}/{GROUP}")),
        "{refused}"
    );
    // Writes naming no shard: the group itself, no election, no token.
    let refused = raw_write(
        &kubeconfig,
        &ns,
        "obj-0",
        &extras(Some(&format!("{ns}/{GROUP}")), Some(token(0))),
    )
    .expect_err("a write naming the group but no shard admitted");
    assert!(
        refused.contains(&format!("group {ns}/{GROUP}: missing shard")),
        "{refused}"
    );
    let refused = raw_write(&kubeconfig, &ns, "obj-0", &extras(None, Some(token(0))))
        .expect_err("a token naming no election admitted");
    assert!(refused.contains("missing election"), "{refused}");
    let refused = raw_write(&kubeconfig, &ns, "obj-0", &extras(None, None))
        .expect_err("a participant's write without a token admitted");
    assert!(refused.contains("missing token"), "{refused}");
    // Another election of the same participant is not judged by the group's policy.
    raw_write(
        &kubeconfig,
        &ns,
        "obj-0",
        &extras(Some(&format!("{ns}/elsewhere")), Some(1)),
    )
    .unwrap_or_else(|e| panic!("a write naming another election refused by the group: {e}"));

    // The group's binding deleted: a shard term's proof fails closed, naming the group's
    // policy, and its fenced write is not sent.
    let admin = shared().admin().await;
    Api::<ValidatingAdmissionPolicyBinding>::all(admin)
        .delete(&policy.name(), &DeleteParams::default())
        .await
        .expect("delete the binding");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let cause = loop {
        let fresh = Fencer::new(client.clone())
            .await
            .expect("identity")
            .lease_namespace(&ns);
        match fresh.prove(&terms[&3]).await {
            FenceState::Unenforced { cause } => break cause,
            FenceState::Enforced if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("the deleted binding was not seen: {other:?}"),
        }
    };
    assert!(
        cause.contains(&format!("tenure-fencing.{ns}.{GROUP} ")) && cause.contains("shard 3"),
        "{cause}"
    );
    let fresh = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    match fresh
        .namespaced::<ConfigMap>(&terms[&3], &ns)
        .create(&PostParams::default(), &cm("unfenced", "x"))
        .await
    {
        Err(FenceError::Unenforced { lease, .. }) => assert_eq!(lease, election(3)),
        other => panic!("a write with the binding gone was not refused: {other:?}"),
    }
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    assert!(cms.get_opt("unfenced").await.expect("read").is_none());
}
