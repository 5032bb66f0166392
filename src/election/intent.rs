//! What the workload and the operator tell an elector about leadership: step-down requests,
//! health reports, the health policy, and when a replica that stepped down for its health may
//! lead again. State only; the elector acts on it in `handover.rs`.

use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{FencingToken, Handoff};

/// When a leader's bad health moves leadership, and how long a replica that stepped down for
/// it stays out.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tenure::election::{ElectionConfig, HealthPolicy};
///
/// let config = ElectionConfig::new().health(
///     HealthPolicy::new()
///         .unhealthy_after(Duration::from_secs(10))
///         .recovery(Duration::from_secs(60)),
/// );
/// # let _ = config;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct HealthPolicy {
    pub(super) unhealthy_after: Duration,
    pub(super) recovery: Duration,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            unhealthy_after: Duration::from_secs(10),
            recovery: Duration::from_secs(60),
        }
    }
}

impl HealthPolicy {
    /// Defaults: hand over after 10 s of continuous bad health; sit out until healthy for
    /// 60 s after such a step-down.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long the leader must stay unhealthy, without a healthy report in between, before
    /// it hands over (when a healthy follower exists).
    pub fn unhealthy_after(mut self, bound: Duration) -> Self {
        self.unhealthy_after = bound;
        self
    }

    /// The hysteresis: how long a replica that stepped down for its health must be healthy
    /// again before it campaigns (and counts as a healthy follower) again.
    pub fn recovery(mut self, window: Duration) -> Self {
        self.recovery = window;
        self
    }
}

/// Why a leader ended its term on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HandoffCause {
    /// The run was shut down gracefully; the lease was released for whoever campaigns next.
    Shutdown,
    /// The leader's health stayed bad for its [`HealthPolicy`]'s bound while a healthy
    /// follower waited.
    Unhealthy,
    /// Asked for: by the workload ([`Term::step_down`](super::Term::step_down),
    /// [`Term::hand_over`](super::Term::hand_over)), through
    /// [`LeaderElector::hand_over`](super::LeaderElector::hand_over), or by an operator through
    /// the store (`tenure handoff`, [`Backend::request_handoff`](crate::Backend::request_handoff)).
    Requested,
    /// The Kubernetes Lease's `spec.preferredHolder` (coordinated leader election) named
    /// another candidate.
    PreferredHolder,
}

/// A term this replica ended on purpose: why, to whom, when. What
/// [`LeaderElector::last_handoff`](super::LeaderElector::last_handoff) reports, and what the
/// `Election` status shows as `lastHandoff`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandedOff {
    /// Why the term ended.
    pub cause: HandoffCause,
    /// The identity that led the term.
    pub from: String,
    /// The replica the lease was released to, when the hand-off named one.
    pub to: Option<String>,
    /// The fencing token of the term that ended.
    pub fencing: FencingToken,
    /// When the lease was released, on this replica's wall clock.
    pub at: SystemTime,
    /// The reason given (by the caller, or the elector's own words), for humans.
    pub reason: String,
}

/// A request to end the current term on purpose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct StepDown {
    /// The term it is for: a request made through an older term's handle is ignored.
    pub(super) fencing: Option<FencingToken>,
    pub(super) to: Handoff,
    pub(super) reason: String,
    /// Why; a step-down for health makes this replica sit out until it recovers.
    pub(super) cause: HandoffCause,
}

/// The replica's health as its workload last reported it, and since when.
#[derive(Clone, Copy, Debug)]
pub(super) struct HealthReport {
    pub(super) healthy: bool,
    pub(super) since: Instant,
}

/// What the workload and the operator tell the elector: step-down requests and health.
#[derive(Debug)]
pub(crate) struct Intent {
    pub(super) step_down: watch::Sender<Option<StepDown>>,
    pub(super) health: watch::Sender<HealthReport>,
    /// When this replica last stepped down for its health, if it did.
    pub(super) health_step_down: std::sync::Mutex<Option<Instant>>,
    /// The last term this replica ended on purpose.
    pub(super) handed_off: watch::Sender<Option<HandedOff>>,
}

impl Default for Intent {
    fn default() -> Self {
        Self {
            step_down: watch::channel(None).0,
            health: watch::channel(HealthReport {
                healthy: true,
                since: Instant::now(),
            })
            .0,
            health_step_down: std::sync::Mutex::new(None),
            handed_off: watch::channel(None).0,
        }
    }
}

impl Intent {
    /// Records a health report; only a change moves `since`.
    pub(super) fn report_health(&self, healthy: bool) {
        self.health.send_if_modified(|h| {
            if h.healthy == healthy {
                return false;
            }
            *h = HealthReport {
                healthy,
                since: Instant::now(),
            };
            true
        });
    }

    /// Asks the term `fencing` (or whichever runs, with `None`) to step down.
    pub(super) fn request(&self, fencing: Option<FencingToken>, to: Handoff, reason: &str) {
        self.step_down.send_replace(Some(StepDown {
            fencing,
            to,
            reason: reason.to_owned(),
            cause: HandoffCause::Requested,
        }));
    }

    pub(super) fn last_health_step_down(&self) -> Option<Instant> {
        *self
            .health_step_down
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// When this replica may campaign and count as a healthy follower again: `None` while
    /// unhealthy, `now` when nothing holds it back.
    pub(super) fn eligible_at(&self, policy: Option<&HealthPolicy>) -> Option<Instant> {
        let report = *self.health.borrow();
        match (policy, self.last_health_step_down()) {
            (Some(policy), Some(stepped)) => report
                .healthy
                .then(|| report.since.max(stepped) + policy.recovery),
            (Some(_), None) => report.healthy.then(Instant::now),
            (None, _) => Some(Instant::now()),
        }
    }
}

/// The membership group in which the healthy replicas of election `lease` announce
/// themselves.
#[must_use]
pub fn health_group(lease: &str) -> String {
    format!("{lease}-healthy")
}
