//! The upstream bug that fails the fence open, reproduced on a real kube-apiserver of this
//! test binary's own (it breaks the server for good): without the anchor, deleting the last
//! binding of a Lease-parameter policy stops the server's Lease informer
//! (kubernetes/kubernetes#130887, #133827); re-creating the binding does not help, and the
//! policy then judges by a frozen Lease. The API server admits a stale token — and tenure's
//! per-term proof catches it: the new term's fenced writes fail closed at once, the leader
//! says so, and `tenure policy --check` exits 5.

mod kube_support;

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use kube_support::fencing::{apply, cm, participant, take};
use kube_support::{shared, unique};
use tenure::Locker;
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::fence::kube::{FenceError, FencedApi, Fencer, FencingPolicy, PROOF_WINDOW};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_lease_cache_is_caught_by_the_proof_and_fails_closed() {
    let server = shared();
    let ns = unique("open");
    server.namespace(&ns).await;
    let lease = "a";
    let (client, _) = participant(&ns, "ctl").await;
    let policy = FencingPolicy::new(&ns, lease)
        .and_then(|p| p.service_account(&ns, "ctl"))
        .and_then(|p| p.resource("configmaps"))
        .expect("valid");
    let admin = server.admin().await;
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
    let backend = || {
        KubeBackend::from_client(client.clone(), KubeOptions::new().namespace(ns.clone()))
            .expect("backend")
    };
    let first = take(&Locker::with_identity(backend(), "one").expect("id"), lease).await;
    // No anchor: this election's binding is the only one with a Lease parameter.
    apply(&policies, &policy.name(), &policy.policy()).await;
    apply(&bindings, &policy.name(), &policy.binding()).await;
    let fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    let before: FencedApi<ConfigMap> =
        fencer.namespaced_with_token(lease, first.fencing_token(), &ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = before
        .create(&PostParams::default(), &cm("healthy", "1"))
        .await
    {
        // The policy takes a refresh (1 s) to load; until then the proof fails closed.
        assert!(
            Instant::now() < deadline,
            "the healthy fence never proved itself: {e}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The trigger: the last Lease-parameter binding goes (as `helm uninstall` does), then comes
    // back. Each side lasts longer than the API server's 1 s policy refresh.
    bindings
        .delete(&policy.name(), &DeleteParams::default())
        .await
        .expect("delete the binding");
    tokio::time::sleep(Duration::from_secs(3)).await;
    apply(&bindings, &policy.name(), &policy.binding()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // A takeover: etcd has the new floor, the server's stopped cache the old one.
    let stale = first.fencing_token();
    first.orphan();
    let second = take(&Locker::with_identity(backend(), "two").expect("id"), lease).await;
    assert!(second.fencing_token() > stale);
    let leader = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    let api: FencedApi<ConfigMap> =
        leader.namespaced_with_token(lease, second.fencing_token(), &ns);
    let started = Instant::now();
    let refused = api.create(&PostParams::default(), &cm("by-two", "2")).await;
    let reported = started.elapsed();
    println!("stopped Lease cache: the new term's first write failed closed after {reported:?}");
    match &refused {
        Err(FenceError::Unenforced { cause, .. }) => {
            assert!(
                cause.contains("130887") && cause.contains("restart"),
                "{cause}"
            );
        }
        other => panic!("the open fence must fail the new term's write closed: {other:?}"),
    }
    assert!(
        reported < PROOF_WINDOW + Duration::from_secs(5),
        "reported after {reported:?}"
    );
    assert!(leader.open_fence().is_some());

    // What the proof caught is real: the API server itself admits the old term's token.
    let loose = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns)
        .warn_only(true);
    let old: FencedApi<ConfigMap> = loose.namespaced_with_token(lease, stale, &ns);
    let admitted = old
        .create(&PostParams::default(), &cm("by-one", "stale"))
        .await;
    assert!(
        admitted.is_ok(),
        "this API server refused the stale token: it no longer has kubernetes#130887, so this \
         test no longer reproduces it ({admitted:?})"
    );

    // `tenure policy --check` from outside says the same, and why.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["policy", "--check", "--lease", lease, "--namespace", &ns])
        .args(["--service-account", "ctl"])
        .env("KUBECONFIG", server.admin_kubeconfig())
        .output()
        .expect("run tenure");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(
        err.contains("stale") && err.contains("restart every kube-apiserver"),
        "{err}"
    );
    second.release().await.expect("release");
}
