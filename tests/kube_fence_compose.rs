//! Fences that compose, on a real kube-apiserver: one ServiceAccount takes part in several
//! fenced elections, each with its own policy over the same resource. Every request names its
//! election beside its token, and each policy judges only the requests naming it, so every
//! live term's writes are admitted while each election's stale tokens are refused (tokens are
//! resourceVersions, ordered across all Leases: judged by another election's floor, a live
//! term's token would be refused — the defect this suite reproduces with a policy that judges
//! every request, as policies did before). A write naming no election is refused by the API
//! server; an election whose policy is not installed is refused by the proof, naming it.

mod kube_support;

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube_support::fencing::{apply, cm, elect, install, install_anchor, participant, uninstall};
use kube_support::{kubectl, shared, unique};
use tenure::fence::kube::{FenceError, FenceState, Fencer, FencingPolicy};

fn configmap_policy(ns: &str, lease: &str) -> FencingPolicy {
    FencingPolicy::new(ns, lease)
        .and_then(|p| p.service_account(ns, "ctl"))
        .and_then(|p| p.resource("configmaps"))
        .expect("valid policy")
}

/// Applies `policy` and its binding as admin (the anchor first), without waiting.
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

/// Proves `term`'s fence with fresh proofs until it is enforced (the API server loads a new
/// policy within a second or so).
async fn enforced(client: &kube::Client, ns: &str, term: &tenure::election::Term) {
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

/// `kubectl annotate` of ConfigMap `name` as the participant (its own kubeconfig), with
/// `extras` as `--as-user-extra` values: a write that bypasses tenure's client, judged by the
/// API server alone. `Ok` or the API server's refusal.
fn raw_write(kubeconfig: &Path, ns: &str, name: &str, extras: &[String]) -> Result<(), String> {
    let sa = format!("system:serviceaccount:{ns}:ctl");
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
        .arg(format!("--as={sa}"))
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

fn extras(ns: &str, election: Option<&str>, token: u64) -> Vec<String> {
    let mut e = vec![format!("tenure.dev/fencing-token={token}")];
    if let Some(lease) = election {
        e.push(format!("tenure.dev/fencing-election={ns}/{lease}"));
    }
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_participant_in_several_elections_writes_in_each_live_term_and_stale_tokens_are_refused()
 {
    let ns = unique("compose");
    shared().namespace(&ns).await;
    let (client, kubeconfig) = participant(&ns, "ctl").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    // Two elections with policies over ConfigMaps (installed once their Leases exist: a
    // policy without its Lease admits everything), and one without.
    let (alpha, _end_a, _run_a) = elect(&client, &ns, "alpha").await;
    install(&configmap_policy(&ns, "alpha"), &cms).await;
    let (beta, _end_b, _run_b) = elect(&client, &ns, "beta").await;
    apply_policy(&configmap_policy(&ns, "beta")).await;
    let (gamma, _end_g, _run_g) = elect(&client, &ns, "gamma").await;
    enforced(&client, &ns, &beta).await;
    let (a, b) = (alpha.fencing_token().get(), beta.fencing_token().get());
    assert!(a < b, "beta was granted after alpha: {a} < {b}");
    let fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);

    // Both live terms prove their fence and write, alpha although its token is below beta's
    // floor: beta's policy passes requests naming alpha.
    assert_eq!(fencer.prove(&alpha).await, FenceState::Enforced);
    assert_eq!(fencer.prove(&beta).await, FenceState::Enforced);
    let (apis_a, apis_b) = (
        fencer.namespaced::<ConfigMap>(&alpha, &ns),
        fencer.namespaced::<ConfigMap>(&beta, &ns),
    );
    let pp = kube::api::PostParams::default();
    for round in 0..5 {
        let (ca, cb) = (
            cm(&format!("alpha-{round}"), "a"),
            cm(&format!("beta-{round}"), "b"),
        );
        let (wa, wb) = tokio::join!(apis_a.create(&pp, &ca), apis_b.create(&pp, &cb),);
        wa.unwrap_or_else(|e| panic!("alpha's live term was refused: {e}"));
        wb.unwrap_or_else(|e| panic!("beta's live term was refused: {e}"));
    }

    // Server-side, each election's stale tokens are refused by its own policy, naming it;
    // each live token is admitted, whatever the other election's floor.
    let refused = raw_write(
        &kubeconfig,
        &ns,
        "alpha-0",
        &extras(&ns, Some("alpha"), a - 1),
    )
    .expect_err("alpha's stale token admitted");
    assert!(
        refused.contains(&format!("lease {ns}/alpha: stale: token {}", a - 1)),
        "{refused}"
    );
    let refused = raw_write(
        &kubeconfig,
        &ns,
        "beta-0",
        &extras(&ns, Some("beta"), b - 1),
    )
    .expect_err("beta's stale token admitted");
    assert!(
        refused.contains(&format!("lease {ns}/beta: stale")),
        "{refused}"
    );
    raw_write(&kubeconfig, &ns, "alpha-0", &extras(&ns, Some("alpha"), a))
        .unwrap_or_else(|e| panic!("alpha's live token refused: {e}"));
    raw_write(&kubeconfig, &ns, "beta-0", &extras(&ns, Some("beta"), b))
        .unwrap_or_else(|e| panic!("beta's live token refused: {e}"));
    // A token naming no election: refused, naming what is missing.
    let refused = raw_write(&kubeconfig, &ns, "alpha-0", &extras(&ns, None, b))
        .expect_err("a token without its election admitted");
    assert!(refused.contains("missing election"), "{refused}");

    // The election without a policy: its proof finds nothing refusing its lower token, so its
    // writes fail closed, naming the policy to install.
    match fencer
        .namespaced::<ConfigMap>(&gamma, &ns)
        .create(&Default::default(), &cm("gamma-0", "g"))
        .await
    {
        Err(FenceError::Unenforced { lease, cause }) => {
            assert_eq!(lease, format!("{ns}/gamma"));
            assert!(
                cause.contains(&format!("tenure-fencing.{ns}.gamma")),
                "{cause}"
            );
        }
        other => panic!("gamma's unfenced write was not refused: {other:?}"),
    }
    assert!(
        cms.get_opt("gamma-0").await.expect("read").is_none(),
        "nothing was written"
    );
}

/// A policy that judges every request of its participants, whichever election it names (as a
/// policy of a tenure whose elections did not compose did): a live term of another election
/// whose token is below its floor is refused. The proof of that other election sees it —
/// its probe meets every policy a real write does — and fails closed naming the culprit; its
/// fenced writes say which policy refused, not "stale".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_judges_every_election_is_seen_by_the_others_proof() {
    let ns = unique("interfere");
    shared().namespace(&ns).await;
    let (client, _) = participant(&ns, "ctl").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let (alpha, _end_a, _run_a) = elect(&client, &ns, "alpha").await;
    install(&configmap_policy(&ns, "alpha"), &cms).await;
    // No recheck within the test: the write below goes on the first proof's verdict.
    let fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns)
        .recheck_every(Duration::from_secs(3600));
    assert_eq!(fencer.prove(&alpha).await, FenceState::Enforced);
    fencer
        .namespaced::<ConfigMap>(&alpha, &ns)
        .create(&Default::default(), &cm("alpha-0", "a"))
        .await
        .expect("alpha writes");

    // Election "legacy", granted after alpha, with a policy that ignores the election named.
    let (legacy_term, _end_l, _run_l) = elect(&client, &ns, "legacy").await;
    assert!(legacy_term.fencing_token() > alpha.fencing_token());
    let legacy = configmap_policy(&ns, "legacy");
    let mut vap = legacy.policy();
    if let Some(v) = vap.spec.as_mut().and_then(|s| s.validations.as_mut()) {
        v[0].expression = v[0]
            .expression
            .replacen("variables.otherElection || ", "", 1);
        assert!(!v[0].expression.contains("otherElection"));
    }
    let admin = shared().admin().await;
    apply(
        &Api::<ValidatingAdmissionPolicy>::all(admin.clone()),
        &legacy.name(),
        &vap,
    )
    .await;
    apply(
        &Api::<ValidatingAdmissionPolicyBinding>::all(admin),
        &legacy.name(),
        &legacy.binding(),
    )
    .await;

    // A fresh fencer (a new proof): alpha's probe meets the legacy policy, which refuses it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let cause = loop {
        let fresh = Fencer::new(client.clone())
            .await
            .expect("identity")
            .lease_namespace(&ns);
        match fresh.prove(&alpha).await {
            FenceState::Unenforced { cause } => break cause,
            FenceState::Enforced if tokio::time::Instant::now() < deadline => {
                // The API server has not loaded the new policy yet.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("the interfering policy was not seen: {other:?}"),
        }
    };
    assert!(
        cause.contains(&format!("another election (lease {ns}/legacy)"))
            && cause.contains(&format!("name election {ns}/alpha"))
            && cause.contains("re-apply"),
        "{cause}"
    );
    // An ungated write of alpha (the proof passed before the legacy policy came) is refused by
    // the legacy policy: typed as another election's refusal, not as staleness.
    let e = fencer
        .namespaced::<ConfigMap>(&alpha, &ns)
        .create(&Default::default(), &cm("alpha-1", "a"))
        .await
        .expect_err("the legacy policy refuses alpha's live term");
    assert!(
        matches!(&e, FenceError::OtherElection { lease, election, .. }
            if *lease == format!("{ns}/legacy") && *election == format!("{ns}/alpha")),
        "{e:?}"
    );
    assert!(!e.is_stale());
    uninstall(&legacy.name()).await;
}
