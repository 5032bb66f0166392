//! The end-to-end safety run on a real kube-apiserver: five candidate processes, the leader
//! repeatedly killed (SIGKILL) or frozen (SIGSTOP) past its lease and resumed (see
//! `safety/mod.rs`).

mod kube_support;
mod safety;

use std::path::PathBuf;
use std::time::Duration;

const CHILD_KUBECONFIG: &str = "TENURE_SAFETY_KUBECONFIG";
const CHILD_DIR: &str = "TENURE_SAFETY_DIR";

/// After a kill a new leader's workload starts within this (the summary prints the failovers
/// measured): the takeover bound of [`safety::config`]'s durations.
fn failover_bound() -> Duration {
    safety::kube_takeover_bound(safety::LEASE, safety::RENEW_DEADLINE, safety::RETRY)
}

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
    let summary = safety::run_parent(
        "five_candidates_killed_and_frozen_never_overlap",
        env,
        dir,
        6,
        failover_bound(),
    )
    .await;
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
    // The example's fenced writes prove the fence first and fail closed without it: install
    // its policy as the README says, with this test's user (the admin) as the participant.
    let who = kube::Api::<k8s_openapi::api::authentication::v1::SelfSubjectReview>::all(
        server.admin().await,
    )
    .create(&PostParams::default(), &Default::default())
    .await
    .unwrap_or_else(|e| panic!("{e}"))
    .status
    .and_then(|s| s.user_info)
    .and_then(|u| u.username)
    .unwrap_or_default();
    let policy = tenure::fence::kube::FencingPolicy::new("default", "tenure-demo-controller")
        .and_then(|p| p.user(&who))
        .and_then(|p| p.resource("configmaps"))
        .unwrap_or_else(|e| panic!("{e}"));
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(server.admin().await, "default");
    if leases
        .get_opt("tenure-demo-controller")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .is_none()
    {
        leases
            .create(&PostParams::default(), &policy.lease())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    kube_support::fencing::install(&policy, &api).await;
    // Two replicas of the controller. The first starts earlier and leads; the second waits,
    // reconciling nothing, until the first shuts down and releases; then it takes over at
    // once with a higher token and stamps again.
    let spawn = |seconds: &str| {
        std::process::Command::new(safety::example("kube_controller"))
            .env("KUBECONFIG", server.admin_kubeconfig())
            .env("DEMO_SECONDS", seconds)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run the example: {e}"))
    };
    let mut first = spawn("5");
    // The second starts once the first leads (not after a fixed pause, which a loaded machine
    // can outlast before the first has even connected): the first's lines are read as they
    // come, and kept for the checks below.
    let (led, first_led) = std::sync::mpsc::channel();
    let first_stdout = first.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut text = String::new();
        for line in std::io::BufReader::new(first_stdout)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains(" leads with fencing token ") {
                let _ = led.send(());
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    if let Err(e) = first_led.recv_timeout(Duration::from_secs(60)) {
        let out = first.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
        panic!(
            "the first replica never led ({e}): {}\n{}",
            reader.join().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let second = spawn("10");
    let outputs: Vec<_> = [first, second]
        .into_iter()
        .map(|c| c.wait_with_output().unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let mut stdout: Vec<String> = outputs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .collect();
    stdout[0] = reader.join().expect("the first replica's reader");
    for (o, s) in outputs.iter().zip(&stdout) {
        assert!(
            o.status.success(),
            "a replica failed: {s}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // The token each replica led with, and the token each stamped with.
    let token_after = |text: &str, marker: &str| -> Vec<u64> {
        text.lines()
            .filter_map(|l| l.split_once(marker))
            .filter_map(|(_, t)| t.trim().parse().ok())
            .collect()
    };
    let led: Vec<Vec<u64>> = stdout
        .iter()
        .map(|s| token_after(s, " leads with fencing token "))
        .collect();
    let stamped: Vec<Vec<u64>> = stdout
        .iter()
        .map(|s| token_after(s, &format!("stamped {name} with token ")))
        .collect();
    assert_eq!(led[0].len(), 1, "the first replica leads once: {stdout:?}");
    assert_eq!(
        led[1].len(),
        1,
        "the second takes over once the first is gone: {stdout:?}"
    );
    assert!(led[1][0] > led[0][0], "the new term's token rises: {led:?}");
    assert_eq!(
        stamped[0], led[0],
        "the first stamps with its own term's token: {stdout:?}"
    );
    assert_eq!(
        stamped[1], led[1],
        "the second stamps only as leader: {stdout:?}"
    );
    let object = api.get(&name).await.unwrap_or_else(|e| panic!("{e}"));
    let annotations = object.metadata.annotations.unwrap_or_default();
    let token: u64 = annotations
        .get("tenure.dev/fencing-token")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no token stamped: {annotations:?}"));
    assert_eq!(token, led[1][0], "the latest leader's stamp stands");
}
