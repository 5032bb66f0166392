//! What `tenure run` sets up before campaigning, with or without `--shards`: the election's
//! durations, the store and locker, one probe of the store, and the probe endpoint's socket.

use std::sync::Arc;
use std::time::Duration;

use tenure::Locker;
use tenure::election::ElectionConfig;

use crate::args::RunArgs;
use crate::backend;
use crate::error::CliError;

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

/// The socket of `--listen` (the /metrics and probe endpoint).
pub async fn listen(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener, CliError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::Config {
            message: format!("--listen {addr}: {e}"),
        })
}
