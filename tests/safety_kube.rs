//! The end-to-end safety run on a real kube-apiserver: five candidate processes, the leader
//! repeatedly killed (SIGKILL) or frozen (SIGSTOP) past its lease and resumed (see
//! `safety/mod.rs`).

mod kube_support;
mod safety;

use std::path::PathBuf;

const CHILD_KUBECONFIG: &str = "TENURE_SAFETY_KUBECONFIG";
const CHILD_DIR: &str = "TENURE_SAFETY_DIR";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_killed_and_frozen_never_overlap() {
    if let (Ok(kubeconfig), Ok(dir), Ok(identity)) = (
        std::env::var(CHILD_KUBECONFIG),
        std::env::var(CHILD_DIR),
        std::env::var("TENURE_SAFETY_IDENTITY"),
    ) {
        // This binary, re-run as one candidate process by the parent below.
        use tenure::backend::kube::{KubeBackend, KubeOptions};
        let backend =
            KubeBackend::from_kubeconfig(&kubeconfig, KubeOptions::new().namespace("default"))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        safety::candidate(backend, &identity, &PathBuf::from(dir)).await;
        return;
    }
    let server = kube_support::shared();
    let dir = kube_support::fresh_dir("safety");
    let env = vec![
        (
            CHILD_KUBECONFIG,
            server.admin_kubeconfig().display().to_string(),
        ),
        (CHILD_DIR, dir.display().to_string()),
    ];
    let summary = tokio::task::spawn_blocking(move || {
        safety::run_rounds(&dir, 6, &|identity| {
            safety::Candidate::spawn(
                "five_candidates_killed_and_frozen_never_overlap",
                &env,
                identity,
            )
        })
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    println!("kube safety: {summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_controller_example_reconciles_only_while_leading_and_stamps_the_token() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams};
    let server = kube_support::shared();
    let api: Api<ConfigMap> = Api::namespaced(server.admin().await, "default");
    let name = kube_support::unique("demo");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { "app": "tenure-demo" } },
        "data": { "k": "v" }
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    api.create(&PostParams::default(), &cm)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Two replicas of the controller: only the leader may reconcile.
    let replicas: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(safety::example("kube_controller"))
                .env("KUBECONFIG", server.admin_kubeconfig())
                .env("DEMO_SECONDS", "8")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run the example: {e}"))
        })
        .collect();
    let outputs: Vec<_> = replicas
        .into_iter()
        .map(|c| c.wait_with_output().unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let stdout: Vec<String> = outputs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .collect();
    for (o, s) in outputs.iter().zip(&stdout) {
        assert!(
            o.status.success(),
            "a replica failed: {s}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let leaders = stdout
        .iter()
        .filter(|s| s.contains(" leads with fencing token "))
        .count();
    let stampers = stdout
        .iter()
        .filter(|s| s.contains(&format!("stamped {name}")))
        .count();
    assert_eq!(leaders, 1, "exactly one replica leads in 8 s: {stdout:?}");
    assert_eq!(stampers, 1, "only the leader reconciles: {stdout:?}");
    let stamped = api.get(&name).await.unwrap_or_else(|e| panic!("{e}"));
    let annotations = stamped.metadata.annotations.unwrap_or_default();
    let token: u64 = annotations
        .get("tenure.dev/fencing-token")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no token stamped: {annotations:?}"));
    assert!(token > 0);
    assert!(
        stdout
            .iter()
            .any(|s| s.contains(&format!("with token {token}")))
    );
}
