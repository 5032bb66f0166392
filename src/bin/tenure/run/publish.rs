//! `--publish-status`: this replica's view of the election, written into the status of the
//! `Election` custom resource (whatever the backend), so `kubectl get elections` shows it.

use std::time::Duration;

use tenure::crd::{ElectionSpec, StatusPublisher};
use tenure::election::LeaderElector;
use tenure::shard::ShardedElector;
use tokio_util::sync::CancellationToken;

use crate::args::RunArgs;
use crate::backend::Connected;
use crate::error::CliError;

/// How long tenure waits on exit for the publisher's last write (stepping down).
const FINAL_WRITE: Duration = Duration::from_secs(3);

/// A running publisher.
pub struct Publishing {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Publishing {
    /// Asks the publisher to record the step-down and waits a little for it.
    pub async fn finish(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(FINAL_WRITE, self.task).await;
    }
}

/// Starts the status publisher of a single election in the background. Its failures are
/// logged and never affect the lease; only a missing Kubernetes configuration stops tenure
/// here.
pub async fn spawn(
    args: &RunArgs,
    connected: &Connected,
    elector: &LeaderElector,
) -> Result<Publishing, CliError> {
    let spec = ElectionSpec::for_elector(elector, connected.election_backend.clone());
    let publisher = publisher(args, spec).await?;
    let elector = elector.clone();
    Ok(Publishing::start(|stop| publisher.run(elector, stop)))
}

/// Starts the status publisher of a sharded group's member in the background (the shards
/// it holds, with their tokens); as [`spawn`] otherwise.
pub async fn spawn_sharded(
    args: &RunArgs,
    connected: &Connected,
    elector: &ShardedElector,
) -> Result<Publishing, CliError> {
    let spec = ElectionSpec::for_sharded(elector, connected.election_backend.clone());
    let publisher = publisher(args, spec).await?;
    let elector = elector.clone();
    Ok(Publishing::start(|stop| {
        publisher.run_sharded(elector, stop)
    }))
}

/// The publisher into `--election` (default: the lease or group name) in the backend's
/// namespace or the kubeconfig's.
async fn publisher(args: &RunArgs, spec: ElectionSpec) -> Result<StatusPublisher, CliError> {
    let client = crate::backend::kube_client("--publish-status").await?;
    let namespace = args
        .backend
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let name = args.election.as_deref().unwrap_or(&args.lease);
    Ok(StatusPublisher::new(client, &namespace, name).create_if_missing(spec))
}

impl Publishing {
    fn start<F, Fut>(run: F) -> Self
    where
        F: FnOnce(tokio_util::sync::WaitForCancellationFutureOwned) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(stop.clone().cancelled_owned()));
        Self { stop, task }
    }
}
