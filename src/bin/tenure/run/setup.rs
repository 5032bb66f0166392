//! What `tenure run` sets up before campaigning, with or without `--shards`: the election's
//! durations, the store and locker, one probe of the store, and the probe endpoint's socket.

use std::sync::Arc;
use std::time::Duration;

use tenure::Locker;
use tenure::election::ElectionConfig;

use crate::args::RunArgs;
use crate::backend;
use crate::error::CliError;
use crate::run::fence::CommandFence;

/// The election durations of `args`, and the stop margin among them.
pub fn election_config(args: &RunArgs) -> (ElectionConfig, Duration) {
    let stop_margin = stop_margin(args.lease_duration, args.renew_deadline);
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

/// How long before the lease could be granted to another candidate the command is dropped.
/// client-go has no such margin; 1 s unless the durations leave less room.
fn stop_margin(lease: Duration, renew_deadline: Duration) -> Duration {
    Duration::from_secs(1).min(lease.saturating_sub(renew_deadline) / 2)
}

/// Checks `--lease-duration`, `--renew-deadline` and `--retry-period` against the rules the
/// election enforces, before anything connects, naming the values and the rule broken. The
/// chart's `tenure.validate` template applies the same rules with the same words (to
/// `election.*`), so `helm install` refuses what tenure would refuse in the pod.
pub fn check_durations(args: &RunArgs) -> Result<(), CliError> {
    duration_rule(args.lease_duration, args.renew_deadline, args.retry_period).map_or(
        Ok(()),
        |rule| {
            Err(CliError::Config {
                message: format!("invalid durations: {rule}"),
            })
        },
    )
}

/// The first rule that `lease`, `deadline` and `retry` break, in words with their values.
pub fn duration_rule(lease: Duration, deadline: Duration, retry: Duration) -> Option<String> {
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let min = tenure::lock::MIN_AUTO_RENEW_TTL;
    // The election's validity allowance for clock drift: 1% of the lease plus a fixed floor.
    let drift = lease / 100 + tenure::lock::DRIFT_FLOOR;
    // Debug shows durations as the flags take them: 15s, 14.9s, 150ms.
    let (l, d, r) = (
        format!("{lease:?}"),
        format!("{deadline:?}"),
        format!("{retry:?}"),
    );
    if lease < min {
        Some(format!(
            "--lease-duration ({l}) must be at least {}",
            ms(min)
        ))
    } else if retry.is_zero() {
        Some(format!("--retry-period ({r}) must be positive"))
    } else if deadline >= lease {
        Some(format!(
            "--renew-deadline ({d}) must be shorter than --lease-duration ({l})"
        ))
    } else if deadline <= retry.mul_f64(1.2) {
        Some(format!(
            "--renew-deadline ({d}) must be longer than 1.2 × --retry-period ({r})"
        ))
    } else if deadline <= lease / 3 {
        // Two thirds of the lease: client-go's ratio (15s / 10s), and always within the rules
        // below for leases this long.
        let suggested = lease * 2 / 3;
        Some(format!(
            "--renew-deadline ({d}) must be longer than a third of --lease-duration ({l}): the leader first renews a third of the way into the lease, so a renew deadline no longer than that ends every term before its first renewal; set --renew-deadline to about two thirds of the lease ({suggested:?} for {l})"
        ))
    } else if deadline > lease.saturating_sub(drift) {
        Some(format!(
            "--renew-deadline ({d}) must be at most --lease-duration ({l}) minus its clock-drift allowance (1% + 2ms): at most {} here",
            ms(lease.saturating_sub(drift))
        ))
    } else {
        None
    }
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

/// `--fence`: the fenced Kubernetes endpoint of every term's command. Only with the
/// Kubernetes backend: the API server's policy judges writes by the election's Lease.
pub async fn fence(
    args: &RunArgs,
    connected: &backend::Connected,
) -> Result<Option<CommandFence>, CliError> {
    if !args.fence {
        return Ok(None);
    }
    let Some(kube) = &connected.kube else {
        return Err(CliError::Config {
            message: format!(
                "--fence needs --backend kube (this run uses {}): the API server fences writes by the election's Lease",
                connected.description
            ),
        });
    };
    CommandFence::new(kube.namespace(), &std::env::temp_dir())
        .await
        .map(Some)
}

/// The socket of `--listen` (the /metrics and probe endpoint).
pub async fn listen(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener, CliError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::Config {
            message: format!("--listen {addr}: {e}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure::Locker;
    use tenure::backend::memory::MemoryBackend;
    use tenure::election::{ElectionConfig, LeaderElector};

    /// Whether the election itself accepts the durations, as `tenure run` sets them.
    fn election_accepts(lease: Duration, deadline: Duration, retry: Duration) -> bool {
        let config = ElectionConfig::new()
            .lease_duration(lease)
            .renew_deadline(deadline)
            .retry_period(retry)
            .stop_margin(stop_margin(lease, deadline));
        let locker = Locker::with_identity(MemoryBackend::new(), "me").expect("identity");
        LeaderElector::new(locker, "l", config).is_ok()
    }

    /// The CLI's rule and the election's agree on every combination of a grid from
    /// microseconds to minutes: the CLI refuses exactly what the election would.
    #[test]
    fn the_cli_rule_is_the_elections_rule() {
        let ms = |v: u64| Duration::from_micros(v * 1000 / 10);
        // Tenths of a millisecond, so that the edges (1.2 × retry, lease − drift) are hit.
        let points: Vec<Duration> = [
            0u64, 1, 50, 100, 200, 250, 290, 299, 300, 301, 400, 1000, 1200, 1201, 1500, 2000,
            3330, 3334, 5000, 9000, 9898, 9899, 9900, 10000, 14848, 14849, 14900, 15000, 20000,
            100_000, 148_480, 148_490, 150_000, 600_000, 1_500_000,
        ]
        .map(ms)
        .to_vec();
        let mut checked = 0;
        for &lease in &points {
            for &deadline in &points {
                for &retry in &points {
                    let cli = duration_rule(lease, deadline, retry);
                    assert_eq!(
                        cli.is_none(),
                        election_accepts(lease, deadline, retry),
                        "lease {lease:?}, renew deadline {deadline:?}, retry {retry:?}: the CLI says {cli:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 30_000);
    }

    #[test]
    fn the_message_names_the_values_and_the_rule() {
        let rule = duration_rule(
            Duration::from_secs(15),
            Duration::from_millis(14_900),
            Duration::from_secs(1),
        )
        .expect("refused");
        assert_eq!(
            rule,
            "--renew-deadline (14.9s) must be at most --lease-duration (15s) minus its clock-drift allowance (1% + 2ms): at most 14848ms here"
        );
        let rule = duration_rule(
            Duration::from_secs(15),
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .expect("refused");
        assert_eq!(
            rule,
            "--renew-deadline (1s) must be longer than 1.2 × --retry-period (1s)"
        );
    }
}
