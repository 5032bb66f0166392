//! Sharded leadership end to end on the real kube-apiserver, with separate processes (the
//! scenario is in `shard_e2e`): 32 shards over 3 → 5 → 2 → 3 replicas and a kill -9, 0 stale
//! writes accepted, rebalance times printed; and a rolling update from 8 to 12 shards.

mod kube_support;
mod safety;
mod shard_e2e;

use std::path::PathBuf;

use tenure::backend::kube::{KubeBackend, KubeOptions};

const CHILD_DIR: &str = "TENURE_SHARD_DIR";
const CHILD_KUBECONFIG: &str = "TENURE_SHARD_KUBECONFIG";
const CHILD_NS: &str = "TENURE_SHARD_NS";

/// Runs this binary's replica when the scenario re-ran it as one; whether it did.
async fn as_replica() -> bool {
    let (Ok(dir), Ok(kubeconfig), Ok(ns), Ok(identity)) = (
        std::env::var(CHILD_DIR),
        std::env::var(CHILD_KUBECONFIG),
        std::env::var(CHILD_NS),
        std::env::var("TENURE_SAFETY_IDENTITY"),
    ) else {
        return false;
    };
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let backend =
        KubeBackend::from_config(config, KubeOptions::new().namespace(ns)).expect("backend");
    shard_e2e::candidate(backend, &identity, &PathBuf::from(dir)).await;
    true
}

/// A fresh namespace and register directory, and the replicas' environment.
async fn setting(what: &str) -> (PathBuf, [(&'static str, String); 3]) {
    let server = kube_support::shared();
    let ns = kube_support::unique(what);
    server.namespace(&ns).await;
    let dir = kube_support::fresh_dir(what);
    shard_e2e::registers(&dir);
    let env = [
        (CHILD_DIR, dir.display().to_string()),
        (
            CHILD_KUBECONFIG,
            server.admin_kubeconfig().display().to_string(),
        ),
        (CHILD_NS, ns),
    ];
    (dir, env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_shards_over_three_five_two_three_replicas_and_a_kill() {
    if as_replica().await {
        return;
    }
    let (dir, env) = setting("shards").await;
    let times = shard_e2e::scenario(
        "thirty_two_shards_over_three_five_two_three_replicas_and_a_kill",
        &env,
        &dir,
    );
    println!("sharded rebalance on kube (32 shards, lease 2 s), 0 stale writes: {times:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_from_8_to_12_shards_never_runs_two_counts_at_once() {
    if as_replica().await {
        return;
    }
    let (dir, env) = setting("resize").await;
    let took = shard_e2e::resize_scenario(
        "a_rolling_update_from_8_to_12_shards_never_runs_two_counts_at_once",
        &env,
        &dir,
        8,
        12,
    );
    println!(
        "8 → 12 shards on kube (lease 2 s): the new count ran {took:?} after the last old replica's SIGTERM"
    );
}
