//! When the publisher writes: the rate limit, the heartbeat (jittered), the step-down check,
//! the backoff after failures and the rate-limited failure log — the bookkeeping between
//! writes, apart from the requests themselves.

use std::time::Duration;

use tokio::time::Instant;

use super::stats::PublisherStats;
use super::status::Intent;
use crate::FencingToken;
use crate::crd::{LastHandoff, PublishError};

/// A repeated failure of the same kind is logged at `warn` at most this often.
const LOG_EVERY: Duration = Duration::from_secs(300);

/// Timings `settle` needs.
#[derive(Clone, Copy)]
pub(super) struct Settings {
    pub(super) min_interval: Duration,
    pub(super) heartbeat: Duration,
}

/// The publisher's bookkeeping between writes.
pub(super) struct State {
    /// The token of the term the status shows this candidate leading, as far as we know.
    pub(super) published: Option<FencingToken>,
    /// The token of our current term, not yet published.
    pub(super) want: Option<FencingToken>,
    /// Our published term ended: check (and clear if nobody took over) at this instant.
    pub(super) step_down: Option<(FencingToken, Instant)>,
    pub(super) heartbeat_at: Instant,
    /// No write before this instant (the rate limit, and the backoff after failures).
    pub(super) not_before: Instant,
    pub(super) backoff: Option<Duration>,
    pub(super) logged: LogGate,
    pub(super) spec_checked: bool,
    /// A term this candidate ended on purpose, not yet published.
    pub(super) handoff: Option<LastHandoff>,
    /// The token of the last term whose hand-off was published (or seen superseded).
    pub(super) handoff_done: Option<u64>,
}

impl State {
    /// Nothing published yet; a write (the first heartbeat) is due now.
    pub(super) fn new() -> Self {
        let now = Instant::now();
        Self {
            published: None,
            want: None,
            step_down: None,
            heartbeat_at: now,
            not_before: now,
            backoff: None,
            logged: LogGate::default(),
            spec_checked: false,
            handoff: None,
            handoff_done: None,
        }
    }

    /// Takes in the last term this candidate ended on purpose.
    pub(super) fn observe_handoff(&mut self, handoff: Option<LastHandoff>) {
        if let Some(h) = handoff
            && self.handoff_done != Some(h.fencing_token)
        {
            self.handoff = Some(h);
        }
    }

    /// Takes in whether (and in which term) this candidate leads now.
    pub(super) fn observe(&mut self, leading: Option<FencingToken>, step_down_at: Instant) {
        match leading {
            Some(token) => {
                self.step_down = None;
                self.want = (self.published != Some(token)).then_some(token);
            }
            None => {
                self.want = None;
                if let Some(token) = self.published
                    && self.step_down.is_none()
                {
                    self.step_down = Some((token, step_down_at));
                }
            }
        }
    }

    /// When the next write is due.
    pub(super) fn due(&self) -> Instant {
        let mut due = self.heartbeat_at;
        if self.want.is_some() || self.handoff.is_some() {
            due = Instant::now();
        }
        if let Some((_, at)) = self.step_down {
            due = due.min(at);
        }
        due.max(self.not_before)
    }

    pub(super) fn settle(
        &mut self,
        intent: &Intent<'_>,
        result: Result<bool, PublishError>,
        stats: &PublisherStats,
        settings: Settings,
    ) {
        let now = Instant::now();
        match result {
            Ok(wrote) => {
                if wrote {
                    stats.count_write();
                    self.not_before = after(now, settings.min_interval);
                    // Every write refreshes our entry.
                    self.heartbeat_at = after(now, jittered(settings.heartbeat));
                } else if intent.heartbeat {
                    self.heartbeat_at = after(now, jittered(settings.heartbeat));
                }
                if let Some(token) = intent.lead {
                    // Published, or a newer term already was: either way nothing is pending.
                    self.published = Some(token);
                    if self.want == Some(token) {
                        self.want = None;
                    }
                }
                if intent.clear.is_some() {
                    self.published = None;
                    self.step_down = None;
                }
                if let Some(h) = intent.handoff {
                    self.handoff_done = Some(h.fencing_token);
                    if self.handoff.as_ref() == Some(h) {
                        self.handoff = None;
                    }
                }
                self.backoff = None;
                if self.logged.recover() {
                    tracing::info!("publishing the election's status again");
                }
            }
            Err(e) => {
                stats.count_failure();
                let backoff = self
                    .backoff
                    .map_or(settings.min_interval.max(Duration::from_secs(1)), |b| {
                        b.saturating_mul(2)
                    })
                    .min(settings.heartbeat);
                self.backoff = Some(backoff);
                self.not_before = after(now, backoff);
                if self.logged.should_warn(e.kind_name(), now) {
                    tracing::warn!(error = %e, retry_in = ?backoff, "cannot publish the election's status; the lease and the workload are unaffected");
                } else {
                    tracing::debug!(error = %e, retry_in = ?backoff, "cannot publish the election's status");
                }
                stats.set_last_error(e);
            }
        }
    }
}

/// `now + d`, or about 30 years from now when that does not fit an `Instant` (tokio's own
/// "far future"): never a panic on a huge caller-supplied duration.
pub(super) fn after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(86_400 * 365 * 30)))
        .unwrap_or(now)
}

/// `d` minus up to 10 %, at random.
fn jittered(d: Duration) -> Duration {
    let tenth = d / 10;
    let nanos = u64::try_from(tenth.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return d;
    }
    d - Duration::from_nanos(crate::util::random_u64() % nanos)
}

/// Rate-limits failure logs: a kind of failure is logged at `warn` when it first happens
/// and then at most every [`LOG_EVERY`]; repeats in between go to `debug`.
#[derive(Default)]
pub(super) struct LogGate {
    last: Option<(&'static str, Instant)>,
    failing: bool,
}

impl LogGate {
    fn should_warn(&mut self, kind: &'static str, now: Instant) -> bool {
        self.failing = true;
        let warn = match self.last {
            Some((k, at)) => k != kind || now.duration_since(at) >= LOG_EVERY,
            None => true,
        };
        if warn {
            self.last = Some((kind, now));
        }
        warn
    }

    /// Whether a failure streak just ended.
    fn recover(&mut self) -> bool {
        std::mem::take(&mut self.failing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_should_saturate_instead_of_panicking() {
        let now = Instant::now();
        assert!(after(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
        assert_eq!(
            after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }
}
