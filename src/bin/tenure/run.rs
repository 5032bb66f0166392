//! `tenure run`: campaign for the lease and run the command for each term won.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use tenure::election::{ElectionConfig, ElectionMetrics, LeaderElector};
use tenure::{Locker, Term};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::args::RunArgs;
use crate::backend;
use crate::child::{Child, exit_code};
use crate::error::CliError;
use crate::watchdog::Watchdog;

/// The environment variables the command gets.
pub const ENV_FENCING_TOKEN: &str = "TENURE_FENCING_TOKEN";
/// See [`ENV_FENCING_TOKEN`].
pub const ENV_LEASE: &str = "TENURE_LEASE";
/// See [`ENV_FENCING_TOKEN`].
pub const ENV_IDENTITY: &str = "TENURE_IDENTITY";

/// The election durations of `args`, and the stop margin among them.
pub fn election_config(args: &RunArgs) -> (ElectionConfig, Duration) {
    // The command is dropped this long before the lease could be granted to another
    // candidate. client-go has no such margin; 1 s unless the durations leave less room.
    let stop_margin =
        Duration::from_secs(1).min(args.lease_duration.saturating_sub(args.renew_deadline) / 2);
    let config = ElectionConfig::new()
        .lease_duration(args.lease_duration)
        .renew_deadline(args.renew_deadline)
        .retry_period(args.retry_period)
        .stop_margin(stop_margin)
        // The supervisor itself escalates to SIGKILL after --grace; the elector's bound is a
        // backstop that must not cut the reaping short, or the command's exit code is lost.
        .grace(args.grace.saturating_add(Duration::from_secs(2)))
        .rejoin(args.rejoin);
    (config, stop_margin)
}

/// The connected store and a locker with this replica's identity.
pub async fn connect(args: &RunArgs) -> Result<(backend::Connected, Locker, String), CliError> {
    let (identity, identity_source) = args.identity();
    let connected = backend::connect(&args.backend, true).await?;
    let locker = Locker::with_identity(Arc::clone(&connected.backend), &identity).map_err(|e| {
        CliError::Config {
            message: format!("{identity_source}: {}", crate::error::chain(&e)),
        }
    })?;
    Ok((connected, locker, identity))
}

/// Runs `tenure run`; the result is the process exit code.
pub async fn run(args: RunArgs) -> Result<u8, CliError> {
    if let Some(shards) = args.shards {
        return crate::sharded::run(args, shards).await;
    }
    let (config, stop_margin) = election_config(&args);
    let (connected, locker, identity) = connect(&args).await?;
    let mut elector = LeaderElector::new(locker, &args.lease, config)?;
    probe(&connected, &args.lease, args.retry_period).await?;
    check_permissions(&connected, &args.lease).await?;

    let mut registry = prometheus_client::registry::Registry::default();
    elector = elector.with_metrics(ElectionMetrics::register(&mut registry));
    if let Some(addr) = args.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| CliError::Config {
                message: format!("--listen {addr}: {e}"),
            })?;
        let server = tenure::election::ProbeServer::new(elector.clone())
            .tolerance(args.lease_duration)
            .store_liveness(args.store_liveness)
            .metrics(registry);
        tokio::spawn(async move {
            if let Err(e) = server.serve(listener).await {
                tracing::error!(error = %e, "the /metrics and probe endpoint stopped");
            }
        });
    }
    let publishing = if args.publish_status {
        Some(crate::publish::spawn(&args, &connected, &elector).await?)
    } else {
        None
    };

    crate::reaper::start();
    let watchdog = Watchdog::start().map_err(|e| CliError::Internal {
        message: format!("cannot start the watchdog thread: {e}"),
    })?;
    let received = Arc::new(AtomicI32::new(0));
    let hurry = CancellationToken::new();
    let shutdown = shutdown_signal(Arc::clone(&received), hurry.clone())?;
    tracing::info!(
        lease = %args.lease,
        identity = %identity,
        backend = %connected.description,
        "campaigning"
    );
    let supervisor = Supervisor {
        command: args.command,
        grace: args.grace,
        stop_margin,
        watchdog,
        received: Arc::clone(&received),
        hurry,
    };
    let outcome = elector
        .run_until(shutdown, |term| supervisor.term(term, Vec::new()))
        .await;
    if let Some(publishing) = publishing {
        publishing.finish().await;
    }
    match outcome {
        Ok(Some(code)) => code,
        Ok(None) => {
            let signo = received.load(Ordering::Acquire);
            tracing::info!(signal = signo, "stopped by signal");
            Ok(u8::try_from(128 + signo).unwrap_or(1))
        }
        Err(e) => Err(e.into()),
    }
}

/// One request to the store before campaigning, so that a wrong URL, bad credentials or
/// missing permissions end tenure with one clear line instead of endless retries.
pub async fn probe(
    connected: &backend::Connected,
    lease: &str,
    retry_period: Duration,
) -> Result<(), CliError> {
    let timeout = retry_period.max(Duration::from_secs(2));
    match tokio::time::timeout(timeout, connected.backend.inspect(lease)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(CliError::backend(
            &format!("cannot read lease {lease:?} from {}", connected.description),
            &e,
        )),
        Err(_) => Err(CliError::Backend {
            message: format!(
                "cannot read lease {lease:?} from {}: no answer within {timeout:?}",
                connected.description
            ),
        }),
    }
}

/// On Kubernetes, refuses to campaign without a permission the elector needs on its Lease
/// (exit 4): a candidate without `update` would otherwise follow quietly and fail only when it
/// has to take over. A failed check (reviews refused, no answer) is logged and not fatal.
pub async fn check_permissions(
    connected: &backend::Connected,
    lease: &str,
) -> Result<(), CliError> {
    let Some(kube) = &connected.kube else {
        return Ok(());
    };
    match kube.missing_permissions(lease).await {
        Ok(missing) if missing.is_empty() => Ok(()),
        Ok(missing) => Err(CliError::Backend {
            message: format!(
                "{}: this user may not {} lease {lease:?} (coordination.k8s.io); tenure run needs get, list, watch and update on its Lease and create on leases: grant them with a Role (the Helm chart's does)",
                connected.description,
                missing.join(", ")
            ),
        }),
        Err(e) => {
            tracing::warn!(error = %e, "cannot check the permissions on the lease; campaigning anyway");
            Ok(())
        }
    }
}

/// Completes on the first SIGTERM or SIGINT, recording which; a second one cancels `hurry`
/// (every running command is killed at once instead of after the grace period).
pub fn shutdown_signal(
    received: Arc<AtomicI32>,
    hurry: CancellationToken,
) -> Result<impl Future<Output = ()> + use<>, CliError> {
    let install = |kind: SignalKind| {
        signal(kind).map_err(|e| CliError::Internal {
            message: format!("cannot install a signal handler: {e}"),
        })
    };
    let mut term = install(SignalKind::terminate())?;
    let mut int = install(SignalKind::interrupt())?;
    Ok(async move {
        let signo = tokio::select! {
            _ = term.recv() => libc::SIGTERM,
            _ = int.recv() => libc::SIGINT,
        };
        received.store(signo, Ordering::Release);
        tracing::info!(signal = signo, "shutting down");
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::warn!("second signal: killing the command now");
            // Stays cancelled: it counts even if a supervisor is not waiting yet.
            hurry.cancel();
        });
    })
}

/// Runs the command for one term and stops it when the term ends. With `--shards`, the
/// workload of every shard's term: any number of terms may run at once.
pub struct Supervisor {
    pub command: Vec<std::ffi::OsString>,
    pub grace: Duration,
    pub stop_margin: Duration,
    pub watchdog: Watchdog,
    /// The signal tenure received, forwarded to the command on shutdown (0: none).
    pub received: Arc<AtomicI32>,
    /// Cancelled by a second signal: skip the rest of the grace period.
    pub hurry: CancellationToken,
}

impl Supervisor {
    /// The workload of one term, the command started with `extra` in its environment besides
    /// the term's own variables. Dropping the future (the elector does so at
    /// `valid_until − stop_margin`) kills the command's process group.
    pub fn term(
        &self,
        term: Term,
        extra: Vec<(&'static str, String)>,
    ) -> impl Future<Output = Result<u8, CliError>> + Send + use<> {
        let command = self.command.clone();
        let grace = self.grace;
        let stop_margin = self.stop_margin;
        let watchdog = self.watchdog.clone();
        let received = Arc::clone(&self.received);
        let hurry = self.hurry.clone();
        async move {
            let token = term.fencing_token().to_string();
            let mut env = vec![
                (ENV_FENCING_TOKEN, token.clone()),
                (ENV_LEASE, term.lease_name().to_owned()),
                (ENV_IDENTITY, term.identity().to_owned()),
            ];
            env.extend(extra);
            // tenure's own credentials are not the command's business.
            let mut child = Child::spawn(&command, &env, &backend::secret_env_vars())?;
            let deadline_term = term.clone();
            watchdog.arm(child.group(), move || {
                let until = deadline_term.valid_until().into_std();
                until.checked_sub(stop_margin).unwrap_or(until)
            })?;
            let _disarm = Disarm {
                watchdog: &watchdog,
                group: child.group().id(),
                lease: term.lease_name(),
                token: &token,
            };
            crate::reaper::begin_term(term.lease_name(), &token);
            tracing::info!(
                lease = %term.lease_name(),
                fencing_token = %term.fencing_token(),
                pid = child.group().id(),
                "leading: started the command"
            );
            let status = tokio::select! {
                status = child.wait() => status,
                () = term.cancellation().cancelled() => {
                    let signo = match received.load(Ordering::Acquire) {
                        0 => libc::SIGTERM,
                        s => s,
                    };
                    tracing::info!(signal = signo, ?grace, "term ending: signalling the command");
                    child.group().signal(signo);
                    tokio::select! {
                        status = child.wait() => status,
                        () = tokio::time::sleep(grace) => {
                            tracing::warn!(?grace, "the command outlived the grace period: SIGKILL");
                            child.group().signal(libc::SIGKILL);
                            child.wait().await
                        }
                        () = hurry.cancelled() => {
                            child.group().signal(libc::SIGKILL);
                            child.wait().await
                        }
                    }
                }
            };
            let status = status.map_err(|e| CliError::Internal {
                message: format!("cannot wait for the command: {e}"),
            })?;
            tracing::info!(lease = %term.lease_name(), %status, "the command exited");
            Ok(exit_code(status))
        }
    }
}

/// Disarms the watchdog for the term's group when the term's workload ends, however it
/// ends, and kills what the command left behind outside its process group.
struct Disarm<'a> {
    watchdog: &'a Watchdog,
    group: libc::pid_t,
    lease: &'a str,
    token: &'a str,
}

impl Drop for Disarm<'_> {
    fn drop(&mut self) {
        self.watchdog.disarm(self.group);
        crate::reaper::end_term(self.lease, self.token);
    }
}
