//! [`ElectionConfig`]: the elector's durations and policies, and the rules they must follow
//! (checked once, when the elector is built, into the lock runtime's options).

use std::time::Duration;

use super::ElectionError;
use crate::{LockError, LockOptions};

/// Durations and policies of a [`LeaderElector`](super::LeaderElector), with client-go's names and defaults.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`lease_duration`](Self::lease_duration) | 15 s | how long a lease lasts without renewal; candidates wait this long for a silent leader |
/// | [`renew_deadline`](Self::renew_deadline) | 10 s | a leader that has not renewed for this long steps down |
/// | [`retry_period`](Self::retry_period) | 2 s | pause between retries of a failed renewal or campaign request |
/// | [`request_timeout`](Self::request_timeout) | unset: the renew deadline for campaign attempts and renewals, retry period / 2 for the rest | bound on each store request |
/// | [`stop_margin`](Self::stop_margin) | 1 s | the workload is dropped this long before the lease could be won by another |
/// | [`grace`](Self::grace) | 5 s | on shutdown, how long the workload may take to stop after cancellation |
/// | [`rejoin`](Self::rejoin) | false | after a lost term, campaign again instead of returning an error |
/// | [`store_unreachable_after`](Self::store_unreachable_after) | 2 × lease duration + retry period | [`Health::store_reachable`](super::Health::store_reachable) turns false when the store has not answered this candidate for longer |
///
/// The leader renews every `lease_duration / 3` (5 s with the defaults), so it writes 40% as
/// often as client-go's leader, which renews every retry period (2 s).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tenure::election::ElectionConfig;
///
/// let config = ElectionConfig::new()
///     .lease_duration(Duration::from_secs(30))
///     .renew_deadline(Duration::from_secs(20))
///     .retry_period(Duration::from_secs(4))
///     .rejoin(true);
/// # let _ = config;
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct ElectionConfig {
    pub(super) lease_duration: Duration,
    pub(super) renew_deadline: Duration,
    pub(super) retry_period: Duration,
    pub(super) request_timeout: Option<Duration>,
    pub(super) stop_margin: Duration,
    pub(super) grace: Duration,
    pub(super) rejoin: bool,
    pub(super) store_unreachable_after: Option<Duration>,
    pub(super) handoff_window: Duration,
    pub(super) health: Option<super::HealthPolicy>,
    pub(super) prefer: Option<super::Preference>,
}

impl Default for ElectionConfig {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            request_timeout: None,
            stop_margin: Duration::from_secs(1),
            grace: Duration::from_secs(5),
            rejoin: false,
            store_unreachable_after: None,
            handoff_window: Duration::from_secs(4),
            health: None,
            prefer: None,
        }
    }
}

macro_rules! duration_setter {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub fn $name(mut self, value: Duration) -> Self {
            self.$name = value;
            self
        }
    };
}

impl ElectionConfig {
    /// The defaults in the table above: controller-runtime's (client-go's `leaderelection`
    /// has no defaults of its own).
    pub fn new() -> Self {
        Self::default()
    }

    duration_setter!(
        /// How long a lease lasts without renewal.
        lease_duration
    );
    duration_setter!(
        /// How long a leader keeps trying to renew before it steps down.
        renew_deadline
    );
    duration_setter!(
        /// The pause between retries of failed requests.
        retry_period
    );
    duration_setter!(
        /// How long before the end of the lease's validity the workload is dropped.
        stop_margin
    );
    duration_setter!(
        /// How long the workload may take to stop on shutdown.
        grace
    );

    duration_setter!(
        /// How long a hand-over's target alone may take the lease after the leader released
        /// it to them (default 4 s, two retry periods: a target that missed the release
        /// notification retries within one). After it, anyone may: a dead target costs at
        /// most this long. A leader that stepped down without a target sits out this long.
        handoff_window
    );

    /// Lets leadership follow health: a leader whose workload reports itself unhealthy
    /// ([`LeaderElector::report_health`](super::LeaderElector::report_health),
    /// [`Term::report_health`](super::Term::report_health)) for the policy's bound hands over
    /// to a follower that announced itself healthy, and keeps the lease when none did. Off by
    /// default.
    pub fn health(mut self, policy: super::HealthPolicy) -> Self {
        self.health = Some(policy);
        self
    }

    /// Which follower the leader hands the lease to when it lets go without a named target:
    /// on a graceful shutdown, a step-down for its health, a step-down without a target.
    /// Every running replica then announces itself (with a [`health`](Self::health) policy,
    /// only while healthy) in the election's ready group
    /// ([`health_group`](super::health_group)), with the time its run began, and the leader
    /// reads that group once before it releases. Off by default: a graceful shutdown is an
    /// ordinary release.
    pub fn prefer(mut self, preference: super::Preference) -> Self {
        self.prefer = Some(preference);
        self
    }

    /// The bound on each store request; must be shorter than the retry period.
    ///
    /// Unset (the default), a campaign attempt or a renewal may take until the renew deadline,
    /// as in client-go, and the other requests (releases, hand-over reads and writes) half the
    /// retry period. A late answer is as good as a quick one — the lease's validity counts
    /// from when the request was *sent*, never from its answer — while cutting a write sooner
    /// throws away one the store may already have applied and sends it again to a store that
    /// was already slow (on Kubernetes, into a conflict: the cut write moved the Lease's
    /// version). With half a retry period as the bound, an API server answering in 0.3–1 s
    /// under CPU load had every renewal cut and shard terms lost (#42). Set, it bounds every
    /// request, those of a [`ShardedElector`](crate::shard::ShardedElector)'s membership
    /// and group record included.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Whether to campaign again after a lost term (`true`) or return
    /// [`ElectionError::Lost`] (`false`, the default, like client-go).
    pub fn rejoin(mut self, on: bool) -> Self {
        self.rejoin = on;
        self
    }

    /// How long the store may stay silent towards this candidate before
    /// [`Health::store_reachable`](super::Health::store_reachable) turns false.
    ///
    /// A follower hears from the store at least once a lease duration while the leader is
    /// alive (it retries when the leader's lease would run out, and sees every change of
    /// holder), a leader at every renewal; the default, `2 × lease_duration + retry_period`,
    /// leaves room for one missed round.
    pub fn store_unreachable_after(mut self, limit: Duration) -> Self {
        self.store_unreachable_after = Some(limit);
        self
    }

    /// The lease duration and the retry period, for electors built on this one's timing
    /// ([`crate::shard`]'s membership heartbeat).
    pub(crate) fn timings(&self) -> (Duration, Duration) {
        (self.lease_duration, self.retry_period)
    }

    /// The lease duration, renew deadline and retry period.
    #[cfg(feature = "crd")]
    pub(crate) fn durations(&self) -> (Duration, Duration, Duration) {
        (self.lease_duration, self.renew_deadline, self.retry_period)
    }

    /// The request bound the user set, if any: the shard layer's own bounds give way to it.
    pub(crate) fn user_request_timeout(&self) -> Option<Duration> {
        self.request_timeout
    }

    /// How long the store may stay silent before it counts as unreachable.
    pub(super) fn silence_limit(&self) -> Duration {
        self.store_unreachable_after
            .unwrap_or(self.lease_duration.saturating_mul(2) + self.retry_period)
    }

    /// The bound on each store request other than campaign attempts and renewals: the one
    /// set, or half the retry period.
    pub(super) fn effective_request_timeout(&self) -> Duration {
        self.request_timeout.unwrap_or(self.retry_period / 2)
    }

    /// Checks the rules and derives the lease options.
    pub(super) fn lease_options(&self) -> Result<LockOptions, ElectionError> {
        let invalid = |rule: &str| Err(ElectionError::InvalidConfig { rule: rule.into() });
        for (name, value) in [
            ("lease_duration", Some(self.lease_duration)),
            ("renew_deadline", Some(self.renew_deadline)),
            ("retry_period", Some(self.retry_period)),
            ("stop_margin", Some(self.stop_margin)),
            ("grace", Some(self.grace)),
            ("request_timeout", self.request_timeout),
            ("store_unreachable_after", self.store_unreachable_after),
            ("handoff_window", Some(self.handoff_window)),
            (
                "health.unhealthy_after",
                self.health.map(|h| h.unhealthy_after),
            ),
            ("health.recovery", self.health.map(|h| h.recovery)),
        ] {
            if value.is_some_and(|v| v > crate::lock::MAX_DURATION) {
                return invalid(&format!("{name} must be at most 365 days"));
            }
        }
        if self.store_unreachable_after.is_some_and(|d| d.is_zero()) {
            return invalid("store_unreachable_after must be positive");
        }
        if self.handoff_window.is_zero() {
            return invalid("handoff_window must be positive");
        }
        if self.retry_period.is_zero() {
            return invalid("retry_period must be positive");
        }
        if self.renew_deadline <= self.retry_period.mul_f64(1.2) {
            return invalid("renew_deadline must be greater than 1.2 × retry_period");
        }
        if self.lease_duration <= self.renew_deadline {
            return invalid("lease_duration must be greater than renew_deadline");
        }
        if self.renew_deadline + self.stop_margin >= self.lease_duration {
            return invalid("lease_duration must be greater than renew_deadline + stop_margin");
        }
        let request_timeout = self.effective_request_timeout();
        if request_timeout.is_zero() || request_timeout >= self.retry_period {
            return invalid("request_timeout must be positive and shorter than retry_period");
        }
        let opts = LockOptions::new()
            .ttl(self.lease_duration)
            .auto_renew(true)
            .renew_fraction(1.0 / 3.0)
            .renew_deadline(self.renew_deadline)
            .retry_interval(self.retry_period)
            // Campaign attempts and renewals: a grant or renewal answered by the renew
            // deadline is still of use (see `request_timeout`'s docs), one answered later is
            // not (the term would end at once).
            .request_timeout(self.request_timeout.unwrap_or(self.renew_deadline))
            .follow_expiry(true);
        opts.plan(true).map_err(|e| match e {
            LockError::InvalidConfig { rule } => ElectionError::InvalidConfig { rule },
            other => ElectionError::Lock(other),
        })?;
        Ok(opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ElectionConfig {
        ElectionConfig::new()
            .lease_duration(Duration::from_secs(3))
            .renew_deadline(Duration::from_secs(2))
            .retry_period(Duration::from_millis(500))
            .stop_margin(Duration::from_millis(300))
    }

    /// Unset, the bound of campaign attempts and renewals is the renew deadline: cut at half a
    /// retry period, every one of them was lost to an API server answering 400 ms late
    /// (#42); the other requests keep half the retry period. A bound that is set is kept.
    #[test]
    fn unset_request_timeout_lets_campaigns_and_renewals_run_to_the_renew_deadline() {
        let plan = |c: ElectionConfig| {
            c.lease_options()
                .expect("valid")
                .plan(true)
                .expect("valid plan")
        };
        assert_eq!(plan(config()).request_timeout, Duration::from_secs(2));
        assert_eq!(
            config().effective_request_timeout(),
            Duration::from_millis(250)
        );
        assert_eq!(config().user_request_timeout(), None);
        let set = config().request_timeout(Duration::from_millis(100));
        assert_eq!(
            plan(set.clone()).request_timeout,
            Duration::from_millis(100)
        );
        assert_eq!(set.effective_request_timeout(), Duration::from_millis(100));
        assert_eq!(set.user_request_timeout(), Some(Duration::from_millis(100)));
    }
}
