//! A kube-rs `Controller` whose reconcile loop runs only while this replica leads.
//!
//! It reconciles ConfigMaps labelled `app=tenure-demo` by stamping the current term's fencing
//! token and this replica's identity into their annotations. The stamp is a fenced write: the
//! reconciler reads the object, refuses to write if it already carries a *higher* token (a
//! newer leader has been here; this replica is stale), and writes with the object's
//! resourceVersion so a concurrent writer makes it fail rather than be overwritten.
//!
//! Run it against a cluster (`KUBECONFIG` or in-cluster config), several copies at once:
//! `cargo run --features kube --example kube_controller` — only the leader reconciles, and a
//! new leader takes over within the lease duration when it dies. `DEMO_SECONDS=N` stops it
//! after N seconds (the e2e suite uses that).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use tenure::Locker;
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::election::{ElectionConfig, LeaderElector, Term};

const TOKEN: &str = "tenure.dev/fencing-token";
const BY: &str = "tenure.dev/reconciled-by";

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    #[error("stale: {name} already carries token {seen}, ours is {ours}")]
    Stale { name: String, seen: u64, ours: u64 },
}

struct Ctx {
    api: Api<ConfigMap>,
    term: Term,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let ours = ctx.term.fencing_token().get();
    // Read the current object: the fence compares against what is stored, not the cache.
    let mut current = ctx.api.get(&name).await?;
    let annotations = current
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    let seen = annotations
        .get(TOKEN)
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(0);
    if seen > ours {
        return Err(Error::Stale { name, seen, ours });
    }
    if seen < ours || annotations.get(BY).map(String::as_str) != Some(ctx.term.identity()) {
        annotations.insert(TOKEN.into(), ours.to_string());
        annotations.insert(BY.into(), ctx.term.identity().to_owned());
        // `current` carries its resourceVersion: a concurrent write makes this a 409.
        ctx.api
            .replace(&name, &PostParams::default(), &current)
            .await?;
        println!("{} stamped {name} with token {ours}", ctx.term.identity());
    }
    Ok(Action::requeue(Duration::from_secs(30)))
}

fn error_policy(_: Arc<ConfigMap>, error: &Error, _: Arc<Ctx>) -> Action {
    eprintln!("reconcile failed: {error}");
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
    let locker = Locker::new(backend);
    let elector = LeaderElector::new(locker, "tenure-demo-controller", ElectionConfig::new())?;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);

    let stop = async {
        match std::env::var("DEMO_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
        {
            Some(secs) => tokio::time::sleep(Duration::from_secs(secs)).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    elector
        .run_until(stop, |term| {
            let api = api.clone();
            async move {
                println!(
                    "{} leads with fencing token {}",
                    term.identity(),
                    term.fencing_token()
                );
                let cancelled = term.cancellation().clone();
                let ctx = Arc::new(Ctx {
                    api: api.clone(),
                    term,
                });
                Controller::new(api, watcher::Config::default().labels("app=tenure-demo"))
                    .run(reconcile, error_policy, ctx)
                    .take_until(cancelled.cancelled_owned())
                    .for_each(|_| async {})
                    .await;
            }
        })
        .await?;
    Ok(())
}
