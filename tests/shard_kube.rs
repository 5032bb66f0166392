//! Sharded leadership end to end on the real kube-apiserver, with separate processes (the
//! scenario is in `shard_e2e`): 32 shards over 3 → 5 → 2 → 3 replicas and a kill -9, 0 stale
//! writes accepted, rebalance times printed.

mod kube_support;
mod safety;
mod shard_e2e;

use std::path::PathBuf;

use tenure::backend::kube::{KubeBackend, KubeOptions};

const CHILD_DIR: &str = "TENURE_SHARD_DIR";
const CHILD_KUBECONFIG: &str = "TENURE_SHARD_KUBECONFIG";
const CHILD_NS: &str = "TENURE_SHARD_NS";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_shards_over_three_five_two_three_replicas_and_a_kill() {
    if let (Ok(dir), Ok(kubeconfig), Ok(ns), Ok(identity)) = (
        std::env::var(CHILD_DIR),
        std::env::var(CHILD_KUBECONFIG),
        std::env::var(CHILD_NS),
        std::env::var("TENURE_SAFETY_IDENTITY"),
    ) {
        // This binary, re-run as one replica by the scenario below.
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("config");
        let backend =
            KubeBackend::from_config(config, KubeOptions::new().namespace(ns)).expect("backend");
        shard_e2e::candidate(backend, &identity, &PathBuf::from(dir)).await;
        return;
    }
    let server = kube_support::shared();
    let ns = kube_support::unique("shards");
    server.namespace(&ns).await;
    let dir = kube_support::fresh_dir("shards");
    shard_e2e::registers(&dir);
    let env = [
        (CHILD_DIR, dir.display().to_string()),
        (
            CHILD_KUBECONFIG,
            server.admin_kubeconfig().display().to_string(),
        ),
        (CHILD_NS, ns),
    ];
    let times = shard_e2e::scenario(
        "thirty_two_shards_over_three_five_two_three_replicas_and_a_kill",
        &env,
        &dir,
    );
    println!("sharded rebalance on kube (32 shards, lease 2 s), 0 stale writes: {times:?}");
}
