//! `tenure run` on one lease: a [`LeaderElector`] whose workload, for each term won, is the
//! command under the [`Supervisor`]; the probe endpoint and the status publisher beside it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::Either;
use tenure::election::{ElectionMetrics, LeaderElector};

use crate::args::RunArgs;
use crate::backend;
use crate::error::CliError;
use crate::run::once::OncePer;
use crate::run::publish;
use crate::run::restart;
use crate::run::setup;
use crate::run::supervisor::{Supervisor, Terms};

/// Runs `tenure run` without `--shards`; the result is the process exit code.
pub async fn run(args: RunArgs) -> Result<u8, CliError> {
    let (mut config, stop_margin) = setup::election_config(&args);
    if let Some(policy) = super::health::policy(&args) {
        config = config.health(policy);
    }
    if let Some(preference) = args.prefer.clone() {
        config = config.prefer(preference);
    }
    let (connected, locker, identity) = setup::connect(&args).await?;
    let mut elector = LeaderElector::new(locker, &args.lease, config)?;
    if let Some(lock) = restart::take(&args, &args.lease).await? {
        elector = elector.with_restart_lock(lock);
    }
    // Independent reads: together, so that the start path waits one round trip for both
    // rather than one per request (issue #45). The store's answer is judged first, so a store
    // that cannot be reached is reported as such whichever answer came back first.
    let (read, permitted) = tokio::join!(
        setup::probe(&connected, &args.lease, args.retry_period),
        check_permissions(&connected, &args.lease, args.once_per.is_some()),
    );
    read?;
    permitted?;

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ElectionMetrics::register(&mut registry);
    elector = elector.with_metrics(metrics.clone());
    connected.register_metrics(&mut registry);
    let damaged_completions = prometheus_client::metrics::counter::Counter::<u64>::default();
    if args.once_per.is_some() {
        registry.register(
            "tenure_damaged_completion_records",
            "--once-per: completion records read that tenure could not parse (each counted as no completion: the command ran)",
            damaged_completions.clone(),
        );
    }
    if let Some(addr) = args.listen {
        let listener = setup::listen(addr).await?;
        let server = tenure::probe::ProbeServer::new(elector.clone())
            .tolerance(args.lease_duration)
            .store_liveness(args.store_liveness)
            .metrics(std::sync::Arc::new(std::sync::Mutex::new(registry)));
        tokio::spawn(async move {
            if let Err(e) = server.serve(listener).await {
                tracing::error!(error = %e, "the /metrics and probe endpoint stopped");
            }
        });
    }
    let publishing = if args.publish_status {
        Some(publish::spawn(&args, &connected, &elector).await?)
    } else {
        None
    };

    if let Some(cmd) = args.health_cmd.clone() {
        // Ends with the process; it only reports to the elector.
        tokio::spawn(super::health::check(
            cmd,
            args.health_interval,
            elector.clone(),
        ));
    }
    let fence = setup::fence(&args, &connected).await?;
    let limits = Limits {
        lease: args.lease.clone(),
        try_once: args.try_once,
        timeout: args.timeout,
        retry_period: args.retry_period,
    };
    let (mut supervisor, shutdown) =
        Supervisor::start(args.command, args.grace, stop_margin, Terms::One)?;
    if let Some(fence) = fence {
        supervisor =
            supervisor.with_fence(fence.with_metrics(metrics).follow_leader(elector.leader()));
    }
    tracing::info!(
        lease = %args.lease,
        identity = %identity,
        backend = %connected.description,
        "campaigning"
    );
    // --try / --timeout: the campaign's own deadline, disarmed by the first term.
    let began = Arc::new(AtomicBool::new(false));
    let gave_up = Arc::new(Mutex::new(None::<String>));
    let limit = campaign_limit(limits, &elector, began.clone(), gave_up.clone());
    let shutdown = async move {
        tokio::select! {
            () = shutdown => {}
            () = limit => {}
        }
    };
    let once = args.once_per.map(|period| {
        Arc::new(OncePer::new(
            Arc::clone(&connected.backend),
            period,
            args.done_exit_code,
            args.retry_period,
            args.lease_duration,
            damaged_completions,
        ))
    });
    let outcome = elector
        .run_until(shutdown, |term| {
            began.store(true, Ordering::Release);
            match &once {
                None => Either::Left(supervisor.term(term, Vec::new())),
                Some(once) => {
                    let supervisor = supervisor.clone();
                    Either::Right(
                        Arc::clone(once).term(term, move |term, env| supervisor.term(term, env)),
                    )
                }
            }
        })
        .await;
    if let Some(message) = gave_up
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    {
        return Err(CliError::NotAcquired { message });
    }
    if let Some(publishing) = publishing {
        publishing.finish().await;
    }
    match outcome {
        Ok(Some(code)) => code,
        Ok(None) => {
            let signo = supervisor.received_signal();
            tracing::info!(signal = signo, "stopped by signal");
            Ok(u8::try_from(128 + signo).unwrap_or(1))
        }
        Err(e) => Err(e.into()),
    }
}

/// On Kubernetes, refuses to campaign without a permission the elector needs on its Lease
/// (exit 4): a candidate without `update` would otherwise follow quietly and fail only when it
/// has to take over. A failed check (reviews refused, no answer) is logged and not fatal.
///
/// With `--once-per`, the completion record's Lease (`NAME-done`) is checked too: without get
/// and update on it, every run would fail after its command succeeded (exit 9).
async fn check_permissions(
    connected: &backend::Connected,
    lease: &str,
    once: bool,
) -> Result<(), CliError> {
    let Some(kube) = &connected.kube else {
        return Ok(());
    };
    if once {
        match kube.missing_completion_permissions(lease).await {
            Ok(missing) if missing.is_empty() => {}
            Ok(missing) => {
                return Err(CliError::Backend {
                    message: format!(
                        "{}: this user may not {} lease \"{lease}-done\" (coordination.k8s.io), where --once-per keeps the job's completion record; it needs get and update on it and create on leases: grant them with a Role (the Helm chart's does)",
                        connected.description,
                        missing.join(", ")
                    ),
                });
            }
            Err(e) if e.kind() == tenure::backend::BackendErrorKind::Config => {
                return Err(CliError::Config {
                    message: format!("--once-per: {}", crate::error::chain(&e)),
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot check the permissions on the completion record; campaigning anyway");
            }
        }
    }
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

/// `--try` and `--timeout`, and what their messages name.
struct Limits {
    lease: String,
    try_once: bool,
    timeout: Option<std::time::Duration>,
    retry_period: std::time::Duration,
}

/// Completes when `--try` or `--timeout` gives up the campaign, with the reason in `gave_up`;
/// never once a term has begun (`began`), nor without either flag.
async fn campaign_limit(
    args: Limits,
    elector: &LeaderElector,
    began: Arc<AtomicBool>,
    gave_up: Arc<Mutex<Option<String>>>,
) {
    let lease = args.lease.clone();
    let me = elector.identity().to_owned();
    let mut leader = elector.leader();
    let give_up = |message: String| {
        *gave_up.lock().unwrap_or_else(PoisonError::into_inner) = Some(message);
    };
    if args.try_once {
        // One campaign: another holder seen (the first attempt answered busy), or no answer
        // within a retry period.
        let seen = tokio::time::timeout(
            args.retry_period,
            leader.wait_for(|l| l.as_ref().is_some_and(|l| l.identity != me)),
        )
        .await;
        if began.load(Ordering::Acquire) {
            return std::future::pending().await;
        }
        match seen {
            Ok(Ok(l)) => {
                let holder = l.as_ref().map(|l| l.identity.clone()).unwrap_or_default();
                give_up(format!(
                    "--try: lease {lease} is held by {}: not run",
                    crate::error::printable(&holder)
                ));
            }
            _ => give_up(format!(
                "--try: lease {lease} was not won within --retry-period ({:?}) (the store did not answer, or the holder had not released it): not run",
                args.retry_period
            )),
        }
        return;
    }
    let Some(timeout) = args.timeout else {
        return std::future::pending().await;
    };
    tokio::time::sleep(timeout).await;
    if began.load(Ordering::Acquire) {
        return std::future::pending().await;
    }
    let holder = leader
        .borrow()
        .as_ref()
        .map(|l| crate::error::printable(&l.identity).into_owned());
    give_up(match holder {
        Some(h) => format!("--timeout {timeout:?}: lease {lease} is still held by {h}: not run"),
        None => format!("--timeout {timeout:?}: lease {lease} was not won in time: not run"),
    });
}
