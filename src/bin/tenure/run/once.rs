//! `--once-per PERIOD`: the command runs at most once per period across every replica of the
//! lease. Before a term's command, the completion check reads the store's record of the last
//! completed run and the store's clock; a run completed in this period ends the term without
//! running the command (exit 7, or `--done-exit-code`). After the command exits 0, the
//! completion is recorded, fenced by the term's token: the store refuses it once a newer term
//! has begun, and tenure then exits 9 ("ran, but not recorded: may run again").
//!
//! "Complete" means exactly: the command exited 0 *and* the store accepted the record. A
//! command that failed, was killed with its term (a kill -9 of tenure, a lost lease) or whose
//! record was refused or failed left no record, and the next run of the period runs it again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use tenure::Term;
use tenure::backend::{Backend, Completion, CompletionCheck, CompletionRead};

use crate::error::{CliError, printable};
use crate::process::term_env::ENV_PERIOD_START;

/// The run-once controls of `tenure run --once-per`.
pub struct OncePer {
    backend: Arc<dyn Backend>,
    period: Duration,
    done_exit: u8,
    retry_period: Duration,
    /// How long transient store failures are retried (the lease duration).
    patience: Duration,
    /// `tenure_damaged_completion_records_total`: records that did not parse.
    damaged: Counter,
}

impl OncePer {
    /// Run-once controls on `backend`'s completion records: one completed run per `period`
    /// (calendar-aligned on the store's clock), `done_exit` when the period's run is done
    /// already; transient store failures retried every `retry_period` while the term lasts,
    /// for at most `patience`;
    /// a completion record that does not parse counted in `damaged`.
    pub fn new(
        backend: Arc<dyn Backend>,
        period: Duration,
        done_exit: u8,
        retry_period: Duration,
        patience: Duration,
        damaged: Counter,
    ) -> Self {
        Self {
            backend,
            period,
            done_exit,
            retry_period,
            patience,
            damaged,
        }
    }

    /// The workload of one term: the check, then `command` (the supervisor's term, given the
    /// extra environment) unless this period's run is done, then the fenced record.
    pub async fn term<F>(
        self: Arc<Self>,
        term: Term,
        command: impl FnOnce(Term, Vec<(&'static str, String)>) -> F,
    ) -> Result<u8, CliError>
    where
        F: Future<Output = Result<u8, CliError>>,
    {
        let lease = term.lease_name().to_owned();
        let token = term.fencing_token();
        let Some(check) = self.check(&term).await? else {
            // The term ended during the check: the supervisor starts nothing and says why.
            return command(term, Vec::new()).await;
        };
        if !check.latest {
            return Err(CliError::Lost {
                message: format!(
                    "--once-per: a term of lease {lease} newer than this one (fencing token {token}) has begun: not run"
                ),
            });
        }
        match &check.last {
            CompletionRead::Present(done) if done.covers(check.now_ms, self.period) => {
                tracing::info!(
                    lease = %lease,
                    period = %period_start(check.now_ms, self.period),
                    completed_by = %printable(&done.identity),
                    completed_token = %done.token,
                    "--once-per: this period's run is done already: not running the command"
                );
                return Ok(self.done_exit);
            }
            CompletionRead::Damaged { reason } => {
                self.damaged.inc();
                tracing::warn!(
                    lease = %lease,
                    %reason,
                    "--once-per: the completion record cannot be read; it counts as none: running the command"
                );
            }
            _ => {}
        }
        let start = period_start(check.now_ms, self.period);
        tracing::info!(lease = %lease, period = %start, "--once-per: no completed run in this period");
        let began = Instant::now();
        let code = command(term.clone(), vec![(ENV_PERIOD_START, start.clone())]).await?;
        if code != 0 {
            tracing::info!(lease = %lease, code, "--once-per: the command failed: no completion recorded (the next run of the period runs it again)");
            return Ok(code);
        }
        let record = Completion {
            token,
            started_ms: check.now_ms,
            took_ms: u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
            identity: term.identity().to_owned(),
        };
        let recorded = self.record(&term, &record, &start).await;
        if let Err(e) = &recorded {
            // An ERROR line for log collectors, besides the exit line: the job may run twice.
            tracing::error!(lease = %lease, period = %start, fencing_token = %token, "{e}");
        }
        recorded
    }

    /// The completion check, transient failures retried while the term lasts, for at most
    /// `patience`; `None` when the term ended first.
    async fn check(&self, term: &Term) -> Result<Option<CompletionCheck>, CliError> {
        let lease = term.lease_name();
        let give_up = Instant::now() + self.patience;
        loop {
            let answer = tokio::select! {
                biased;
                () = term.cancellation().cancelled() => return Ok(None),
                answer = self.backend.check_completion(lease, term.fencing_token()) => answer,
            };
            match answer {
                Ok(check) => return Ok(Some(check)),
                Err(e) if e.is_transient() && Instant::now() < give_up => {
                    tracing::warn!(lease = %lease, error = %e, "--once-per: cannot read the completion record; retrying");
                }
                Err(e) => {
                    return Err(CliError::backend(
                        &format!("--once-per: cannot read the completion record of lease {lease}"),
                        &e,
                    ));
                }
            }
            tokio::select! {
                () = term.cancellation().cancelled() => return Ok(None),
                () = tokio::time::sleep(self.retry_period) => {}
            }
        }
    }

    /// Records `record` (the command exited 0): exit 0 once the store accepted it, else exit 9
    /// saying why. An attempt is never cut short; between attempts, the term's end, or
    /// `patience` spent on transient failures, gives up: a write that fails for longer than a
    /// lease (a record path the store cannot replace, say) must not hold the lease forever.
    async fn record(&self, term: &Term, record: &Completion, period: &str) -> Result<u8, CliError> {
        let lease = term.lease_name();
        let give_up = Instant::now() + self.patience;
        let not_recorded = |why: String| CliError::NotRecorded {
            message: format!(
                "--once-per: the command succeeded but its completion was not recorded ({why}): another run may run it again in the period that began {period}"
            ),
        };
        loop {
            match self.backend.record_completion(lease, record).await {
                Ok(true) => {
                    tracing::info!(lease = %lease, period = %period, fencing_token = %record.token, "--once-per: completion recorded: no run of this period runs the command again");
                    return Ok(0);
                }
                Ok(false) => {
                    return Err(not_recorded(format!(
                        "the store refused it: a term of lease {lease} newer than this one (fencing token {}) has begun",
                        record.token
                    )));
                }
                Err(e)
                    if e.is_transient()
                        && !term.cancellation().is_cancelled()
                        && Instant::now() < give_up =>
                {
                    tracing::warn!(lease = %lease, error = %e, "--once-per: cannot record the completion; retrying while the term lasts");
                }
                Err(e) => return Err(not_recorded(crate::error::chain(&e))),
            }
            tokio::select! {
                () = term.cancellation().cancelled() => {
                    return Err(not_recorded("the term ended before the store answered".to_owned()));
                }
                () = tokio::time::sleep(self.retry_period) => {}
            }
        }
    }
}

/// The start of the period that contains `now_ms` (the store's clock), as RFC 3339 UTC.
pub fn period_start(now_ms: u64, period: Duration) -> String {
    let p = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
    let start = now_ms - now_ms % p;
    i64::try_from(start)
        .ok()
        .and_then(|ms| k8s_openapi::jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(|| format!("{start} ms"), |t| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_start_at_calendar_boundaries_in_utc() {
        let day = Duration::from_secs(86_400);
        // 2026-01-01T13:45:10.250Z
        let now = 1_767_225_600_000 + 49_510_250;
        assert_eq!(period_start(now, day), "2026-01-01T00:00:00Z");
        assert_eq!(
            period_start(now, Duration::from_secs(3600)),
            "2026-01-01T13:00:00Z"
        );
        assert_eq!(
            period_start(now, Duration::from_secs(2)),
            "2026-01-01T13:45:10Z"
        );
    }
}
