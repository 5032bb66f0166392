//! `tenure run --shards N`: a [`ShardedElector`] whose workload, for every shard term, is the
//! same [`Supervisor::term`] `tenure run` runs for its one lease: one copy of the command per
//! shard held here, each with its own process group, watchdog, grace and reaping.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use tenure::backend::BackendErrorKind;
use tenure::election::ElectionMetrics;
use tenure::shard::{ShardError, ShardedElector, lease_name};
use tokio_util::sync::CancellationToken;

use crate::args::RunArgs;
use crate::backend::Connected;
use crate::error::{CliError, chain};
use crate::process::term_env::{ENV_SHARD, ENV_SHARDS};
use crate::run::publish;
use crate::run::restart;
use crate::run::setup;
use crate::run::shard_probe;
use crate::run::supervisor::{Supervisor, Terms};

/// Runs `tenure run --shards N`; the result is the process exit code.
pub async fn run(args: RunArgs, shards: u32) -> Result<u8, CliError> {
    let (config, stop_margin) = setup::election_config(&args);
    let (connected, locker, identity) = setup::connect(&args).await?;
    let mut elector =
        ShardedElector::new(locker, &args.lease, shards, config).map_err(shard_error)?;
    // One lock for the replica, named after the group: every shard's command copy and watchdog
    // inherit it, so it is free only once all of them are gone.
    if let Some(lock) = restart::take(&args, &args.lease).await? {
        elector = elector.with_restart_lock(lock);
    }
    setup::probe(&connected, &lease_name(&args.lease, 0), args.retry_period).await?;
    probe_membership(&connected, &args.lease, args.retry_period).await?;

    // Every shard lease's series as one lease's run exports them (`name="GROUP-SHARD"`), the
    // fence's included: the same metrics go to the fence below.
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ElectionMetrics::register(&mut registry);
    elector = elector.with_metrics(metrics.clone());
    connected.register_metrics(&mut registry);
    if let Some(addr) = args.listen {
        let listener = setup::listen(addr).await?;
        tokio::spawn(shard_probe::serve(listener, elector.clone(), registry));
    }

    let publishing = if args.publish_status {
        Some(publish::spawn_sharded(&args, &connected, &elector).await?)
    } else {
        None
    };

    let fence = setup::fence(&args, &connected).await?;
    let (mut supervisor, signalled) =
        Supervisor::start(args.command, args.grace, stop_margin, Terms::Several)?;
    if let Some(fence) = fence {
        supervisor = supervisor.with_fence(fence.with_metrics(metrics).per_shard());
    }
    // A copy that cannot be started (command not found, no watchdog process) stops tenure:
    // every shard would fail the same way.
    let failed = CancellationToken::new();
    let fatal: Arc<Mutex<Option<CliError>>> = Arc::new(Mutex::new(None));
    let shutdown = {
        let failed = failed.clone();
        async move {
            tokio::select! {
                () = signalled => {}
                () = failed.cancelled() => {}
            }
        }
    };
    tracing::info!(
        lease = %args.lease,
        shards,
        identity = %identity,
        backend = %connected.description,
        "joining the group"
    );
    let supervisor = Arc::new(supervisor);
    let workload = {
        let supervisor = Arc::clone(&supervisor);
        let fatal = Arc::clone(&fatal);
        move |shard: u32, term: tenure::Term| {
            let copy = supervisor.term(
                term,
                vec![
                    (ENV_SHARD, shard.to_string()),
                    (ENV_SHARDS, shards.to_string()),
                ],
            );
            let fatal = Arc::clone(&fatal);
            let failed = failed.clone();
            async move {
                match copy.await {
                    Ok(code) => {
                        tracing::info!(shard, code, "the shard's copy exited: its term ends");
                    }
                    Err(e) => {
                        tracing::error!(shard, error = %e, "cannot run the shard's copy: leaving the group");
                        fatal
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .get_or_insert(e);
                        failed.cancel();
                    }
                }
            }
        }
    };
    let outcome = elector.run_until(shutdown, workload).await;
    if let Some(publishing) = publishing {
        publishing.finish().await;
    }
    let fatal = fatal.lock().unwrap_or_else(PoisonError::into_inner).take();
    match (outcome, fatal) {
        (_, Some(e)) => Err(e),
        (Ok(()), None) => {
            let signo = supervisor.received_signal();
            tracing::info!(signal = signo, "left the group: every shard released");
            Ok(0)
        }
        (Err(e), None) => Err(shard_error(e)),
    }
}

/// One read of the group's membership before joining: a backend without membership, or one
/// that refuses it, ends tenure with one clear line.
async fn probe_membership(
    connected: &Connected,
    group: &str,
    retry_period: Duration,
) -> Result<(), CliError> {
    let timeout = retry_period.max(Duration::from_secs(2));
    let what = format!(
        "cannot read the members of group {group:?} from {}",
        connected.description
    );
    let mut members = connected.backend.members(group);
    match tokio::time::timeout(timeout, members.next()).await {
        Ok(Some(Ok(_))) => Ok(()),
        Ok(Some(Err(e))) if e.kind() == BackendErrorKind::Config => Err(CliError::Config {
            message: format!("--shards: {what}: {}", chain(&e)),
        }),
        Ok(Some(Err(e))) => Err(CliError::backend(&what, &e)),
        Ok(None) => Err(CliError::Backend {
            message: format!("{what}: the membership stream ended"),
        }),
        Err(_) => Err(CliError::Backend {
            message: format!("{what}: no answer within {timeout:?}"),
        }),
    }
}

/// The CLI error, and so the exit code, of a sharded elector's failure.
fn shard_error(e: ShardError) -> CliError {
    let message = chain(&e);
    match e {
        ShardError::InvalidShardCount { .. } => CliError::Config {
            message: format!("--shards: {message}"),
        },
        ShardError::Membership { source, .. } if source.kind() == BackendErrorKind::Config => {
            CliError::Config {
                message: format!("--shards: {message}"),
            }
        }
        ShardError::Membership { .. } => CliError::Backend { message },
        ShardError::Election(inner) => CliError::from(inner),
        _ => CliError::Internal { message },
    }
}
