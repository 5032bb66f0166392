//! How long a lease lasts, how it is waited for and renewed: [`LockOptions`] and its validation.

use std::time::Duration;

use super::LockError;

/// The shortest ttl auto-renewal accepts: below it, a renewal round trip plus scheduling
/// jitter would eat most of the lease.
pub const MIN_AUTO_RENEW_TTL: Duration = Duration::from_millis(30);

/// The longest value any duration option accepts: 365 days. Longer values are mistakes, and
/// instants that far ahead approach what clock arithmetic can represent.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The fixed part of the clock-drift allowance subtracted from every validity estimate.
pub const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// Options for one acquisition. Every field has a default; setters return the changed options.
///
/// | option | default | meaning |
/// |---|---|---|
/// | [`ttl`](Self::ttl) | 30 s | how long the store keeps the lease without renewal |
/// | [`wait`](Self::wait) | 0 | how long [`Locker::acquire`](super::Locker::acquire) keeps trying |
/// | [`retry_interval`](Self::retry_interval) | 100 ms | pause between attempts, and between renewal retries after a failure |
/// | [`retry_jitter`](Self::retry_jitter) | 0.2 | ± fraction of randomness on each pause, so waiters do not retry in step |
/// | [`auto_renew`](Self::auto_renew) | off for bare acquire, on inside `with_lock` | renew in the background |
/// | [`renew_fraction`](Self::renew_fraction) | 1/3 | renew this fraction of the ttl after the last success |
/// | [`drift_factor`](Self::drift_factor) | 0.01 | validity = sent + ttl − (ttl × factor + 2 ms) |
/// | [`renew_deadline`](Self::renew_deadline) | the end of validity | give up on a lease not renewed within this long of the last success |
/// | [`request_timeout`](Self::request_timeout) | min(5 s, ttl × renew_fraction) | bound on each backend request |
/// | [`release_timeout`](Self::release_timeout) | 5 s | bound on a release |
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tenure::LockOptions;
///
/// let opts = LockOptions::new()
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .auto_renew(true);
/// assert_eq!(opts.get_ttl(), Duration::from_secs(10));
/// ```
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub struct LockOptions {
    ttl: Duration,
    wait: Duration,
    retry_interval: Duration,
    retry_jitter: f64,
    auto_renew: Option<bool>,
    renew_fraction: f64,
    drift_factor: f64,
    renew_deadline: Option<Duration>,
    request_timeout: Option<Duration>,
    release_timeout: Duration,
    follow_expiry: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            wait: Duration::ZERO,
            retry_interval: Duration::from_millis(100),
            retry_jitter: 0.2,
            auto_renew: None,
            renew_fraction: 1.0 / 3.0,
            drift_factor: 0.01,
            renew_deadline: None,
            request_timeout: None,
            release_timeout: Duration::from_secs(5),
            follow_expiry: false,
        }
    }
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $ty:ty) => {
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.$name = value;
            self
        }
    };
}

impl LockOptions {
    /// The defaults (see the table above).
    pub fn new() -> Self {
        Self::default()
    }

    setter!(
        /// How long the store keeps the lease without renewal; a crashed holder blocks others
        /// at most this long.
        ttl: Duration
    );
    setter!(
        /// How long [`Locker::acquire`](super::Locker::acquire) keeps trying before it gives
        /// up with [`LockError::NotAcquired`]. Zero means one attempt.
        wait: Duration
    );
    setter!(
        /// The pause between acquire attempts (shortened to the holder's remaining ttl, and cut
        /// short by a release notification), and between renewal retries after a failure.
        retry_interval: Duration
    );
    setter!(
        /// Randomness on each retry pause, as a fraction of it in `[0, 1)`.
        retry_jitter: f64
    );
    setter!(
        /// The fraction of the ttl after the last successful renewal at which to renew, in
        /// `(0, 1)`.
        renew_fraction: f64
    );
    setter!(
        /// How much of the ttl to distrust for clock-rate differences, in `[0, 1)`.
        drift_factor: f64
    );
    setter!(
        /// The bound on a release, which runs to completion even if its caller is cancelled.
        release_timeout: Duration
    );

    /// Whether to renew the lease in the background. Unset, it is off for
    /// [`Locker::acquire`](super::Locker::acquire) and on for
    /// [`Locker::with_lock`](super::Locker::with_lock).
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = Some(on);
        self
    }

    /// End an auto-renewed lease whose renewals have failed for this long since the last
    /// success, even if its validity has not run out yet. Must leave room for one renewal:
    /// longer than `ttl × renew_fraction`, at most the validity `ttl − drift`.
    pub fn renew_deadline(mut self, deadline: Duration) -> Self {
        self.renew_deadline = Some(deadline);
        self
    }

    /// The bound on each backend request (acquire attempt, renewal batch). At most the
    /// validity (ttl − drift). A renewal is never awaited past its renew deadline whatever
    /// this says.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// While the lock is busy, wait for the holder's remaining ttl (plus jitter) instead of
    /// retrying every `retry_interval`, relying on the release notification to wake up early.
    /// Off by default; the elector turns it on so that followers cost the store about one
    /// request per ttl instead of one per retry interval. Stores that cannot tell the remaining
    /// ttl are still retried every `retry_interval`.
    pub fn follow_expiry(mut self, on: bool) -> Self {
        self.follow_expiry = on;
        self
    }

    /// The ttl.
    #[must_use]
    pub fn get_ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait window.
    #[must_use]
    pub fn get_wait(&self) -> Duration {
        self.wait
    }

    /// The bound on a release.
    pub(crate) fn get_release_timeout(&self) -> Duration {
        self.release_timeout
    }

    /// Checks the options and works out the timings of a lease acquired with them.
    pub(crate) fn plan(&self, auto_renew_default: bool) -> Result<Plan, LockError> {
        let invalid = |rule: &str| Err(LockError::InvalidConfig { rule: rule.into() });
        let auto_renew = self.auto_renew.unwrap_or(auto_renew_default);
        for (name, value) in [
            ("ttl", Some(self.ttl)),
            ("wait", Some(self.wait)),
            ("retry_interval", Some(self.retry_interval)),
            ("release_timeout", Some(self.release_timeout)),
            ("renew_deadline", self.renew_deadline),
            ("request_timeout", self.request_timeout),
        ] {
            if value.is_some_and(|v| v > MAX_DURATION) {
                return invalid(&format!("{name} must be at most 365 days"));
            }
        }
        if self.ttl.is_zero() {
            return invalid("ttl must be positive");
        }
        if auto_renew && self.ttl < MIN_AUTO_RENEW_TTL {
            return Err(LockError::TtlTooShort {
                ttl: self.ttl,
                min: MIN_AUTO_RENEW_TTL,
            });
        }
        if !(self.renew_fraction > 0.0 && self.renew_fraction < 1.0) {
            return invalid("renew_fraction must be between 0 and 1, exclusive");
        }
        if !(0.0..1.0).contains(&self.drift_factor) {
            return invalid("drift_factor must be in [0, 1)");
        }
        if !(0.0..1.0).contains(&self.retry_jitter) {
            return invalid("retry_jitter must be in [0, 1)");
        }
        if self.retry_interval.is_zero() {
            return invalid("retry_interval must be positive");
        }
        if self.release_timeout.is_zero() {
            return invalid("release_timeout must be positive");
        }
        let drift = self.ttl.mul_f64(self.drift_factor) + DRIFT_FLOOR;
        let Some(validity) = self.ttl.checked_sub(drift).filter(|v| !v.is_zero()) else {
            return invalid(
                "ttl must be longer than its drift allowance (ttl × drift_factor + 2 ms)",
            );
        };
        let renew_interval = self.ttl.mul_f64(self.renew_fraction);
        if auto_renew && renew_interval >= validity {
            return invalid("ttl × renew_fraction must be shorter than ttl − drift");
        }
        let renew_deadline = match self.renew_deadline {
            None => validity,
            Some(d) if d > validity => {
                return invalid("renew_deadline must not exceed ttl − drift");
            }
            Some(d) if auto_renew && d <= renew_interval => {
                return invalid("renew_deadline must be longer than ttl × renew_fraction");
            }
            Some(d) => d,
        };
        let request_timeout = match self.request_timeout {
            None => renew_interval.min(Duration::from_secs(5)),
            Some(t) if t.is_zero() => return invalid("request_timeout must be positive"),
            // An answer later than that would be of no use: the lease it vouches for has
            // run out by then.
            Some(t) if t > validity => {
                return invalid("request_timeout must not exceed ttl − drift");
            }
            Some(t) => t,
        };
        Ok(Plan {
            ttl: self.ttl,
            validity,
            auto_renew,
            renew_interval,
            renew_deadline,
            retry_interval: self.retry_interval,
            retry_jitter: self.retry_jitter,
            request_timeout,
            release_timeout: self.release_timeout,
            follow_expiry: self.follow_expiry,
        })
    }
}

/// Validated options, in the form the runtime uses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub ttl: Duration,
    /// ttl − drift: how long after sending a successful request the lease is surely ours.
    pub validity: Duration,
    pub auto_renew: bool,
    pub renew_interval: Duration,
    /// At most `validity`; `validity` itself when auto-renew is off.
    pub renew_deadline: Duration,
    pub retry_interval: Duration,
    pub retry_jitter: f64,
    pub request_timeout: Duration,
    pub release_timeout: Duration,
    pub follow_expiry: bool,
}

impl Plan {
    /// `retry_interval` ± jitter, drawn fresh each call.
    pub fn jittered_retry(&self) -> Duration {
        if self.retry_jitter == 0.0 {
            return self.retry_interval;
        }
        // A uniform draw in [-1, 1]; u64 → f64 keeps 53 bits, plenty for jitter.
        let unit = (crate::util::random_u64() as f64 / u64::MAX as f64) * 2.0 - 1.0;
        self.retry_interval.mul_f64(1.0 + self.retry_jitter * unit)
    }

    /// How long to pause before the next acquire attempt when the holder has `remaining`.
    pub fn busy_pause(&self, remaining: Option<Duration>) -> Duration {
        match remaining {
            Some(r) if self.follow_expiry => {
                // Spread waiters over a little time after the expiry, not all at one instant.
                let unit = crate::util::random_u64() as f64 / u64::MAX as f64;
                r + self.retry_interval.mul_f64(self.retry_jitter * unit)
            }
            Some(r) => self.jittered_retry().min(r),
            None => self.jittered_retry(),
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn durations_beyond_a_year_are_refused_not_overflowed() {
        let year_and_a_day = MAX_DURATION + Duration::from_secs(86_400);
        for opts in [
            LockOptions::new().ttl(year_and_a_day),
            LockOptions::new().wait(year_and_a_day),
            LockOptions::new().retry_interval(year_and_a_day),
            LockOptions::new().request_timeout(year_and_a_day),
        ] {
            assert!(
                matches!(opts.plan(false), Err(LockError::InvalidConfig { ref rule }) if rule.contains("at most 365 days")),
                "{opts:?}"
            );
        }
        assert!(LockOptions::new().ttl(MAX_DURATION).plan(false).is_ok());
    }

    use super::*;

    fn rule(opts: &LockOptions, auto: bool) -> String {
        match opts.plan(auto) {
            Err(LockError::InvalidConfig { rule }) => rule,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn defaults_plan_as_documented() {
        let p = LockOptions::new().plan(true).expect("defaults are valid");
        assert_eq!(p.ttl, Duration::from_secs(30));
        assert_eq!(p.renew_interval, Duration::from_secs(10));
        assert_eq!(p.validity, Duration::from_millis(30_000 - 300 - 2));
        assert_eq!(p.renew_deadline, p.validity);
        assert_eq!(p.request_timeout, Duration::from_secs(5));
        assert!(p.auto_renew);
        assert!(!LockOptions::new().plan(false).expect("valid").auto_renew);
    }

    /// "Must not exceed": a renew deadline of exactly `ttl − drift` is the default's own
    /// value and is allowed; a millisecond more is refused.
    #[test]
    fn a_renew_deadline_of_exactly_the_validity_is_allowed() {
        let validity = Duration::from_millis(30_000 - 300 - 2);
        let p = LockOptions::new()
            .renew_deadline(validity)
            .plan(true)
            .expect("a renew deadline equal to the validity is valid");
        assert_eq!(p.renew_deadline, validity);
        assert_eq!(p.validity, validity);
        let over = LockOptions::new().renew_deadline(validity + Duration::from_millis(1));
        assert!(rule(&over, true).contains("must not exceed ttl − drift"));
    }

    #[test]
    fn auto_renew_below_minimum_ttl_is_ttl_too_short() {
        let opts = LockOptions::new().ttl(Duration::from_millis(29));
        assert!(matches!(
            opts.plan(true),
            Err(LockError::TtlTooShort { ttl, min }) if ttl == Duration::from_millis(29) && min == MIN_AUTO_RENEW_TTL
        ));
        // Without auto-renew a short ttl is fine.
        assert!(opts.plan(false).is_ok());
    }

    #[test]
    fn invalid_combinations_name_the_rule() {
        let o = LockOptions::new;
        assert!(rule(&o().ttl(Duration::ZERO), false).contains("ttl must be positive"));
        assert!(rule(&o().renew_fraction(1.0), true).contains("renew_fraction"));
        assert!(rule(&o().drift_factor(-0.1), true).contains("drift_factor"));
        assert!(rule(&o().retry_jitter(1.0), true).contains("retry_jitter"));
        assert!(rule(&o().retry_interval(Duration::ZERO), true).contains("retry_interval"));
        assert!(rule(&o().release_timeout(Duration::ZERO), true).contains("release_timeout"));
        assert!(rule(&o().ttl(Duration::from_millis(2)), false).contains("drift allowance"));
        assert!(
            rule(&o().renew_deadline(Duration::from_secs(31)), true).contains("renew_deadline")
        );
        assert!(
            rule(&o().renew_deadline(Duration::from_secs(5)), true)
                .contains("longer than ttl × renew_fraction")
        );
        assert!(
            rule(&o().request_timeout(Duration::from_secs(40)), true).contains("request_timeout")
        );
        // Up to the validity itself (an elector's renew deadline may reach it): 30 s − 302 ms.
        let validity = Duration::from_millis(29_698);
        assert_eq!(
            o().request_timeout(validity)
                .plan(true)
                .expect("a bound of the validity")
                .request_timeout,
            validity
        );
        assert!(
            rule(
                &o().request_timeout(validity + Duration::from_nanos(1)),
                true
            )
            .contains("must not exceed ttl − drift")
        );
    }

    /// Each rule at its edge: the last value allowed beside the first refused, so that a
    /// comparison moved by one (`<` for `<=`) or a shrunk limit is seen.
    #[test]
    fn each_rule_holds_at_its_edge() {
        let o = LockOptions::new;
        // 365 days written out, not `MAX_DURATION`: the limit the docs promise.
        let year = Duration::from_secs(31_536_000);
        let long = o()
            .ttl(year)
            .wait(year)
            .retry_interval(year)
            .release_timeout(year);
        assert!(long.plan(false).is_ok(), "365 days is allowed");
        assert!(rule(&o().ttl(year + Duration::from_secs(1)), false).contains("at most 365 days"));
        // The shortest ttl auto-renewal accepts is accepted.
        assert!(o().ttl(MIN_AUTO_RENEW_TTL).plan(true).is_ok());
        // The fraction's bounds are its own rule's, even where auto-renew's would not apply.
        for fraction in [0.0, 1.0] {
            assert!(
                rule(&o().renew_fraction(fraction), false).contains("between 0 and 1"),
                "{fraction}"
            );
        }
        assert!(
            rule(&o().request_timeout(Duration::ZERO), true)
                .contains("request_timeout must be positive")
        );
    }

    /// `get_wait` is the window `Locker::acquire` keeps trying for: a getter that lost it
    /// would make every acquire a single attempt.
    #[test]
    fn getters_return_what_was_set() {
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(7))
            .wait(Duration::from_secs(3));
        assert_eq!(opts.get_ttl(), Duration::from_secs(7));
        assert_eq!(opts.get_wait(), Duration::from_secs(3));
    }

    /// While the lock is busy: with `follow_expiry`, the holder's remaining ttl plus up to
    /// `retry_interval × retry_jitter` (spread, so waiters do not all retry at one instant);
    /// without it, the jittered retry cut to the remaining ttl.
    #[test]
    fn busy_pause_follows_the_expiry_or_the_retry_interval() {
        let following = LockOptions::new()
            .follow_expiry(true)
            .plan(false)
            .expect("valid");
        let polling = LockOptions::new().plan(false).expect("valid");
        let retry = Duration::from_millis(80)..=Duration::from_millis(120);
        let remaining = Duration::from_secs(7);
        let (mut least, mut most) = (Duration::MAX, Duration::ZERO);
        for _ in 0..1000 {
            let d = following.busy_pause(Some(remaining));
            assert!(
                d >= remaining && d <= remaining + Duration::from_millis(20),
                "{d:?}"
            );
            least = least.min(d);
            most = most.max(d);
            let d = polling.busy_pause(Some(remaining));
            assert!(retry.contains(&d), "{d:?}");
            let d = following.busy_pause(None);
            assert!(retry.contains(&d), "{d:?}");
        }
        assert!(
            least < remaining + Duration::from_millis(5)
                && most > remaining + Duration::from_millis(15),
            "{least:?}..{most:?}"
        );
        let soon = Duration::from_millis(30);
        assert_eq!(polling.busy_pause(Some(soon)), soon);
    }

    #[test]
    fn jitter_stays_within_its_bounds() {
        let p = LockOptions::new().plan(false).expect("valid");
        let (mut least, mut most) = (Duration::MAX, Duration::ZERO);
        for _ in 0..1000 {
            let d = p.jittered_retry();
            assert!(
                d >= Duration::from_millis(80) && d <= Duration::from_millis(120),
                "{d:?}"
            );
            least = least.min(d);
            most = most.max(d);
        }
        // And spreads to both sides: 1000 uniform draws all within ±5 ms of the interval
        // (or all on one side) have a chance below 10^-100.
        assert!(
            least < Duration::from_millis(95) && most > Duration::from_millis(105),
            "{least:?}..{most:?}"
        );
    }
}
