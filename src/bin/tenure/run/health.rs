//! `--health-cmd`: run the replica's health check every `--health-interval` and report its
//! answer to the elector, which hands leadership over when the leader stays unhealthy.

use std::process::Stdio;
use std::time::Duration;

use tenure::election::{HealthPolicy, LeaderElector};

use crate::args::RunArgs;

/// The elector's health policy from the flags, when `--health-cmd` is given.
pub fn policy(args: &RunArgs) -> Option<HealthPolicy> {
    args.health_cmd.as_ref().map(|_| {
        HealthPolicy::new()
            .unhealthy_after(args.unhealthy_after)
            .recovery(args.health_recovery)
    })
}

/// Runs `cmd` every `interval` for as long as the future lives, reporting each answer.
pub async fn check(cmd: String, interval: Duration, elector: LeaderElector) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = None;
    loop {
        ticks.tick().await;
        let healthy = run_once(&cmd, interval).await;
        if last != Some(healthy) {
            tracing::info!(healthy, "health check changed");
            last = Some(healthy);
        }
        elector.report_health(healthy);
    }
}

/// One run of the check: healthy when it exits 0 within `limit`. A check that cannot be
/// started counts as unhealthy (and says why).
async fn run_once(cmd: &str, limit: Duration) -> bool {
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the health check");
            return false;
        }
    };
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(Ok(status)) => status.success(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot wait for the health check");
            false
        }
        Err(_) => {
            tracing::warn!(?limit, "the health check did not answer in time");
            false
        }
    }
}
