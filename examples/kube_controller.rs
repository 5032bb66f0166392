//! A kube-rs controller that reconciles only while this replica leads, takes over with a warm
//! cache, lets reconciles in flight finish at a hand-off, and fences every write.
//!
//! It reconciles ConfigMaps labelled `app=tenure-demo` by recording this replica's identity
//! in them. `tenure::controller::Controller` watches them from the start on every replica, so
//! a follower that wins reconciles at once, without listing anything; a `Replica` runs an
//! always-on part beside it (the controller's `runner` takes the terms the replica's election
//! gives it). Every write goes through
//! `tenure::fence::kube::FencedApi`: it carries the term's fencing token (the API server's
//! fencing policy, `tenure policy`, refuses it once a newer term exists, on every object),
//! stamps it on the object (`tenure.dev/fencing-token`), and is not sent once the term has
//! ended. A stale refusal is not retried: the term is over.
//!
//! Run it against a cluster (`KUBECONFIG` or in-cluster config), several copies at once:
//! `cargo run --features kube --example kube_controller` — only the leader reconciles, and a
//! new leader takes over within the lease duration when it dies, at once when it is stopped.
//! `DEMO_SECONDS=N` stops it after N seconds (the e2e suite uses that). Install the policy
//! with `tenure policy --lease tenure-demo-controller --namespace NS --service-account SA
//! --resource configmaps | kubectl apply -f -` (and the RBAC in `tenure::fence::kube`'s docs).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use tenure::Locker;
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::controller::{Controller, Replica, per_term};
use tenure::election::{ElectionConfig, LeaderElector};
use tenure::fence::kube::{FenceError, FencedApi, Fencer};

struct Ctx {
    api: FencedApi<ConfigMap>,
    identity: String,
    /// Objects stamped in this term, for the term's progress task.
    stamped: AtomicU64,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, FenceError> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let ours = ctx.api.fencing_token().to_string();
    let annotations = cm.metadata.annotations.clone().unwrap_or_default();
    if annotations.get("tenure.dev/fencing-token") == Some(&ours)
        && annotations.get("tenure.dev/reconciled-by") == Some(&ctx.identity)
    {
        return Ok(Action::requeue(Duration::from_secs(30))); // already done in this term
    }
    let patch = serde_json::json!({
        "metadata": { "annotations": { "tenure.dev/reconciled-by": ctx.identity } }
    });
    ctx.api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    println!("{} stamped {name} with token {ours}", ctx.identity);
    ctx.stamped.fetch_add(1, Ordering::Relaxed);
    Ok(Action::requeue(Duration::from_secs(30)))
}

fn error_policy(_: Arc<ConfigMap>, error: &FenceError, _: Arc<Ctx>) -> Action {
    eprintln!("reconcile failed: {error}");
    if error.is_stale() {
        // A newer term exists: this one's work is over (the elector ends it too).
        return Action::await_change();
    }
    Action::requeue(Duration::from_secs(2))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let config = kube::Config::infer().await?;
    let namespace = config.default_namespace.clone();
    // `from_config` builds the backend's own client with TCP_NODELAY, which kube's default
    // client lacks (it costs ~40 ms on each new connection, e.g. a follower's takeover write).
    let backend = KubeBackend::from_config(
        config.clone(),
        KubeOptions::new().namespace(namespace.clone()),
    )?;
    let client = kube::Client::try_from(config)?;
    // The fence proves itself on the election's Lease, in the same namespace.
    let fencer = Fencer::new(client.clone())
        .await?
        .lease_namespace(&namespace);
    let elector = LeaderElector::new(
        Locker::new(backend),
        "tenure-demo-controller",
        ElectionConfig::new(),
    )?;
    // Each term's context: its fenced ConfigMaps (every write carries the term's token).
    let ns = namespace.clone();
    let context = per_term(move |term| {
        println!(
            "{} leads with fencing token {}",
            term.identity(),
            term.fencing_token()
        );
        let ctx = Arc::new(Ctx {
            api: fencer.namespaced(term, &ns),
            identity: term.identity().to_owned(),
            stamped: AtomicU64::new(0),
        });
        // A side task of the term: aborted when the term ends, before the lease is released
        // (a `tokio::spawn`ed one would report on into the next term).
        let progress = ctx.clone();
        term.spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(10));
            loop {
                every.tick().await;
                let n = progress.stamped.load(Ordering::Relaxed);
                println!("{}: {n} objects stamped this term", progress.identity);
            }
        });
        ctx
    });
    // Watched from now on, on every replica: warm when this one wins.
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(client, &namespace),
        watcher::Config::default().labels("app=tenure-demo"),
    );
    let status = controller.status();
    let runner = controller.runner(reconcile, error_policy, context);

    let stop = async {
        match std::env::var("DEMO_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
        {
            Some(secs) => tokio::time::sleep(Duration::from_secs(secs)).await,
            // SIGTERM is how Kubernetes stops a pod; Ctrl-C, a terminal. Either hands the
            // lease over at once (as PID 1 in a container nothing else would stop it on
            // SIGTERM, and the successor would wait for the grace period and the lease).
            None => {
                use tokio::signal::unix::{SignalKind, signal};
                match signal(SignalKind::terminate()) {
                    Ok(mut term) => {
                        tokio::select! {
                            _ = term.recv() => {}
                            _ = tokio::signal::ctrl_c() => {}
                        }
                    }
                    Err(_) => {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
            }
        }
    };
    Replica::new(elector)
        // Runs on every replica, leader or not, through hand-offs.
        .always("cache report", move |stop| async move {
            let mut every = tokio::time::interval(Duration::from_secs(10));
            while stop.run_until_cancelled(every.tick()).await.is_some() {
                let n = status.store().map_or(0, |s| s.state().len());
                println!("{n} objects cached ({:?})", status.state());
            }
            Ok(())
        })
        // Runs only while leading: until the term ends; then reconciles in flight finish, and
        // only then is the lease released.
        .run_until(stop, |term| runner.term(&term).for_each(|_| async {}))
        .await?;
    Ok(())
}
