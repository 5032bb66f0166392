//! Fences that compose, on a real kube-apiserver: one ServiceAccount takes part in several
//! fenced elections, each with its own policy over the same resource. Every request names its
//! election beside its token, and each policy judges only the requests naming it, so every
//! live term's writes are admitted while each election's stale tokens are refused (tokens are
//! resourceVersions, ordered across all Leases: judged by another election's floor, a live
//! term's token would be refused — the defect this suite reproduces with a policy that judges
//! every request, as policies did before). A write naming no election is refused by the API
//! server; an election whose policy is not installed is refused by the proof, naming it.

mod kube_support;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube_support::fencing::{
    apply, apply_policy, cm, elect, enforced, group_replica, install, participant, raw_write,
    terms_of_all, uninstall,
};
use kube_support::{shared, unique};
use tenure::election::Term;
use tenure::fence::kube::{Current, FenceError, FenceState, FencedApi, Fencer, FencingPolicy};

fn configmap_policy(ns: &str, lease: &str) -> FencingPolicy {
    FencingPolicy::new(ns, lease)
        .and_then(|p| p.service_account(ns, "ctl"))
        .and_then(|p| p.resource("configmaps"))
        .expect("valid policy")
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

    // Election "legacy", granted after alpha, with a policy that ignores the election named
    // (as one written before requests named their election: its message is built for every
    // refusal too, not spared for other elections).
    let (legacy_term, _end_l, _run_l) = elect(&client, &ns, "legacy").await;
    assert!(legacy_term.fencing_token() > alpha.fencing_token());
    let legacy = configmap_policy(&ns, "legacy");
    let mut vap = legacy.policy();
    if let Some(v) = vap.spec.as_mut().and_then(|s| s.validations.as_mut()) {
        v[0].expression = v[0]
            .expression
            .replacen("variables.otherElection || ", "", 1);
        v[0].message_expression = v[0]
            .message_expression
            .as_ref()
            .map(|m| m.replacen("variables.otherElection ? '' : ", "", 1));
        assert!(!v[0].expression.contains("otherElection"));
        assert!(
            !v[0]
                .message_expression
                .as_ref()
                .is_some_and(|m| m.contains("otherElection ?"))
        );
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

/// A sharded group's policy over ConfigMaps for the participant `ctl`.
fn group_policy(ns: &str, group: &str, shards: u32) -> FencingPolicy {
    configmap_policy(ns, group)
        .shards(shards)
        .expect("valid policy")
}

/// One fenced writer: the election it names (a Lease's name) and its API.
struct Writer {
    lease: String,
    api: FencedApi<ConfigMap>,
}

/// What `rounds` writes of `writer` got: each creates the ConfigMap `LEASE-TAG-ROUND`.
/// Returns the admitted count and the refusals.
async fn write_rounds(writer: &Writer, tag: &str, rounds: usize) -> (usize, Vec<FenceError>) {
    let mut admitted = 0;
    let mut refused = Vec::new();
    for round in 0..rounds {
        let name = format!("{}-{tag}-{round}", writer.lease);
        match writer
            .api
            .create(&PostParams::default(), &cm(&name, tag))
            .await
        {
            Ok(_) => admitted += 1,
            Err(e) => refused.push(e),
        }
    }
    (admitted, refused)
}

/// One ServiceAccount in three fenced elections at once — two single leases and a sharded
/// group of three shards, each with its own policy — writing through its fenced clients: every
/// live term's writes are admitted; then each election's term is superseded while a writer of
/// it is frozen (its election and token kept, its proof made, no look at the term: a process
/// stopped between its proof and its write), and all of them, live and frozen, write at once:
/// every write of a new term is admitted and no write of a superseded term of any of the
/// three (each shard counted) is, each refused by its own election's policy as stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_elections_of_one_participant_write_at_once_and_no_superseded_term_writes() {
    const GROUP: &str = "orders";
    const SHARDS: u32 = 3;
    const ROUNDS: usize = 8;
    let ns = unique("three");
    shared().namespace(&ns).await;
    let (client, _) = participant(&ns, "ctl").await;
    let (alpha, end_a, run_a) = elect(&client, &ns, "alpha").await;
    let (beta, end_b, run_b) = elect(&client, &ns, "beta").await;
    let (mut begun, stop_group) = group_replica(&client, &ns, GROUP, "r1", SHARDS);
    let shards = terms_of_all(&mut begun, SHARDS).await;
    // Each policy once its Leases exist (a policy without its Lease admits everything).
    for policy in [
        configmap_policy(&ns, "alpha"),
        configmap_policy(&ns, "beta"),
        group_policy(&ns, GROUP, SHARDS),
    ] {
        apply_policy(&policy).await;
    }
    let old_terms: Vec<&Term> = [&alpha, &beta].into_iter().chain(shards.values()).collect();
    for term in &old_terms {
        enforced(&client, &ns, term).await;
    }
    // The writers that will be frozen: their fence proven once (no recheck in the test), the
    // term's election and token, and nothing that sees the term end.
    let frozen_fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns)
        .recheck_every(Duration::from_secs(3600));
    let frozen: Vec<Writer> = old_terms
        .iter()
        .map(|term| Writer {
            lease: term.lease_name().to_owned(),
            api: frozen_fencer.namespaced_with_token(term.lease_name(), term.fencing_token(), &ns),
        })
        .collect();
    // In their live terms, all five write at once, every write admitted.
    let live_then =
        futures::future::join_all(frozen.iter().map(|w| write_rounds(w, "then", 2))).await;
    for (writer, (admitted, refused)) in frozen.iter().zip(&live_then) {
        assert!(
            refused.is_empty(),
            "{}'s live term was refused: {refused:?}",
            writer.lease
        );
        assert_eq!(*admitted, 2, "{}", writer.lease);
    }

    // Every term superseded: both elections end and are won again, the group moves to
    // another replica. The new tokens are above the old ones (resourceVersions).
    let _ = end_a.send(());
    let _ = end_b.send(());
    let _ = stop_group.send(());
    run_a.await.expect("alpha's election ends");
    run_b.await.expect("beta's election ends");
    let (alpha2, _end_a2, _run_a2) = elect(&client, &ns, "alpha").await;
    let (beta2, _end_b2, _run_b2) = elect(&client, &ns, "beta").await;
    let (mut begun2, _stop_group2) = group_replica(&client, &ns, GROUP, "r2", SHARDS);
    let shards2 = terms_of_all(&mut begun2, SHARDS).await;
    let new_terms: Vec<&Term> = [&alpha2, &beta2]
        .into_iter()
        .chain(shards2.values())
        .collect();
    for (old, new) in old_terms.iter().zip(&new_terms) {
        assert_eq!(old.lease_name(), new.lease_name());
        assert!(
            new.fencing_token() > old.fencing_token(),
            "{}: {:?} after {:?}",
            new.lease_name(),
            new.fencing_token(),
            old.fencing_token()
        );
        enforced(&client, &ns, new).await;
    }
    let live_fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    let live: Vec<Writer> = new_terms
        .iter()
        .map(|term| Writer {
            lease: term.lease_name().to_owned(),
            api: live_fencer.namespaced::<ConfigMap>(term, &ns),
        })
        .collect();

    // All ten write at once: five live terms, five frozen ones thawed.
    let (live_now, stale_now) = tokio::join!(
        futures::future::join_all(live.iter().map(|w| write_rounds(w, "live", ROUNDS))),
        futures::future::join_all(frozen.iter().map(|w| write_rounds(w, "stale", ROUNDS))),
    );
    let mut counts = Vec::new();
    for ((writer, (admitted, refused)), term) in live.iter().zip(&live_now).zip(&new_terms) {
        assert!(
            refused.is_empty(),
            "{}'s live term {:?} was refused: {refused:?}",
            writer.lease,
            term.fencing_token()
        );
        assert_eq!(*admitted, ROUNDS, "{}", writer.lease);
        counts.push(format!("{} live {admitted}/{ROUNDS}", writer.lease));
    }
    for (((writer, (admitted, refused)), old), new) in frozen
        .iter()
        .zip(&stale_now)
        .zip(&old_terms)
        .zip(&new_terms)
    {
        assert_eq!(
            *admitted, 0,
            "{}: a superseded term's write admitted",
            writer.lease
        );
        assert_eq!(refused.len(), ROUNDS);
        for e in refused {
            // Refused by the API server, by this election's own policy, as stale: the
            // refusal names the election, the frozen term's token and the new term's.
            assert!(
                matches!(e, FenceError::Stale { lease: Some(lease), ours, current: Current::Term(current) }
                    if *lease == format!("{ns}/{}", writer.lease)
                        && *ours == old.fencing_token().get()
                        && *current == new.fencing_token().get()),
                "{}: {e:?}",
                writer.lease
            );
        }
        counts.push(format!(
            "{} stale admitted {admitted}/{ROUNDS}",
            writer.lease
        ));
    }
    eprintln!("three elections at once: {}", counts.join(", "));
    // The API server's view: every live write is there, no stale one.
    let cms: Api<ConfigMap> = Api::namespaced(shared().admin().await, &ns);
    let names: Vec<String> = cms
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    let written = |tag: &str| names.iter().filter(|n| n.contains(tag)).count();
    assert_eq!(written("-live-"), live.len() * ROUNDS);
    assert_eq!(written("-then-"), frozen.len() * 2);
    assert_eq!(written("-stale-"), 0, "{names:?}");
}
