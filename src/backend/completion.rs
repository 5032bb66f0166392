//! The completion record of a run-once job (`tenure run --once-per`): which term of a lease
//! last completed the job, and when its run began on the store's clock.
//!
//! The store keeps one record per lease beside the lease itself, written only by
//! [`Backend::record_completion`](super::Backend::record_completion), which is fenced: it
//! refuses a record from a term that is no longer the lease's latest. Every backend stores
//! the same text, `c1:<token>:<started ms>:<took ms>:<identity>`, so one parser here judges
//! what another process wrote: bounded, each field checked, anything else reported as
//! [`CompletionRead::Damaged`] rather than guessed at.
//!
//! Time comes from the store, never from a client's wall clock: Redis' `TIME`, the API
//! server's (the time it stamps on a write), the host's clock for the local backend. A run
//! belongs to the period in which its check ([`Backend::check_completion`](super::Backend::check_completion))
//! read that clock; periods are calendar-aligned (`floor(time / period)`), see
//! [`same_period`].

use std::fmt;
use std::time::Duration;

use super::FencingToken;
use super::types::MAX_IDENTITY_LEN;

/// The longest completion record tenure writes is far below this; anything longer is damaged.
pub const MAX_COMPLETION_RECORD: usize = 512;

const VERSION: &str = "c1";

/// A run-once job's completion, as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The fencing token of the term that completed the job.
    pub token: FencingToken,
    /// When that term's run began: the store's clock, in milliseconds since the Unix epoch, as
    /// [`CompletionCheck::now_ms`] read it. On Kubernetes whole seconds (the API server's
    /// timestamps have no finer resolution).
    pub started_ms: u64,
    /// How long the run took, measured on the runner's monotonic clock: for people reading
    /// the record; nothing is ordered by it.
    pub took_ms: u64,
    /// Who ran it (at most [`MAX_IDENTITY_LEN`] bytes, no control characters).
    pub identity: String,
}

impl Completion {
    /// The text every backend stores.
    #[must_use]
    pub fn encode(&self) -> String {
        format!(
            "{VERSION}:{}:{}:{}:{}",
            self.token, self.started_ms, self.took_ms, self.identity
        )
    }

    /// Parses what a store holds, whoever wrote it.
    ///
    /// # Errors
    ///
    /// What is wrong with `text`, in words, without echoing it (it may be huge or hostile).
    pub fn decode(text: &[u8]) -> Result<Self, &'static str> {
        if text.len() > MAX_COMPLETION_RECORD {
            return Err("longer than any completion record");
        }
        let text = std::str::from_utf8(text).map_err(|_| "not UTF-8")?;
        let mut fields = text.splitn(5, ':');
        if fields.next() != Some(VERSION) {
            return Err("not a c1 completion record");
        }
        let mut number = |what: &'static str| {
            fields
                .next()
                .filter(|s| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(what)
        };
        let token = number("bad fencing token")?;
        let started_ms = number("bad start time")?;
        let took_ms = number("bad duration")?;
        let identity = fields.next().ok_or("missing identity")?;
        if identity.is_empty()
            || identity.len() > MAX_IDENTITY_LEN
            || identity.chars().any(char::is_control)
        {
            return Err("bad identity");
        }
        if token == 0 {
            return Err("bad fencing token");
        }
        Ok(Self {
            token: FencingToken::new(token),
            started_ms,
            took_ms,
            identity: identity.to_owned(),
        })
    }

    /// Whether this completion counts for the period that contains `now_ms` (see
    /// [`same_period`]).
    #[must_use]
    pub fn covers(&self, now_ms: u64, period: Duration) -> bool {
        same_period(self.started_ms, now_ms, period)
    }
}

impl fmt::Display for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "completed by {} (fencing token {}), started at {} ms on the store's clock, took {} ms",
            self.identity, self.token, self.started_ms, self.took_ms
        )
    }
}

/// Whether a run that began at `started_ms` counts for the period of `now_ms` (both on the
/// store's clock, milliseconds since the Unix epoch): periods are calendar-aligned, period
/// number `floor(t / period)`, so `24h` means UTC days and `1h` clock hours, as cron users
/// expect, rather than "24 hours after the last run", which would drift later with every
/// late run. A start in a *later* period than `now_ms` counts as well: a store clock that
/// stepped back must not make a completed job run again.
///
/// A zero period never counts (every run is a new period).
#[must_use]
pub fn same_period(started_ms: u64, now_ms: u64, period: Duration) -> bool {
    let p = u64::try_from(period.as_millis()).unwrap_or(u64::MAX);
    p > 0 && started_ms / p >= now_ms / p
}

/// One read of a lease's completion record.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompletionRead {
    /// The job never completed (or its record was deleted).
    Absent,
    /// The latest completion.
    Present(Completion),
    /// Something is stored where the record belongs that tenure cannot parse: it counts as
    /// no completion (the job runs, and its completion replaces it), with a warning.
    Damaged {
        /// What is wrong, in words (never the stored bytes).
        reason: String,
    },
}

impl CompletionRead {
    /// Parses `text` as stored.
    #[must_use]
    pub fn parse(text: &[u8]) -> Self {
        match Completion::decode(text) {
            Ok(c) => Self::Present(c),
            Err(reason) => Self::Damaged {
                reason: reason.to_owned(),
            },
        }
    }
}

/// The answer of [`Backend::check_completion`](super::Backend::check_completion).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletionCheck {
    /// The store's clock when it answered, in milliseconds since the Unix epoch (on
    /// Kubernetes whole seconds).
    pub now_ms: u64,
    /// The lease's completion record.
    pub last: CompletionRead,
    /// Whether the checking term is the lease's latest: `false` when a term with a higher
    /// fencing token has begun (its grant, or its own check), so this term's completion would
    /// be refused.
    pub latest: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Completion {
        Completion {
            token: FencingToken::new(1_767_225_600_123_456),
            started_ms: 1_767_225_600_000,
            took_ms: 1234,
            identity: "web-1:worker é".into(),
        }
    }

    #[test]
    fn records_round_trip_within_the_bound() {
        let r = sample();
        assert_eq!(Completion::decode(r.encode().as_bytes()), Ok(r));
        let longest = Completion {
            token: FencingToken::new(u64::MAX),
            started_ms: u64::MAX,
            took_ms: u64::MAX,
            identity: "x".repeat(MAX_IDENTITY_LEN),
        };
        assert!(longest.encode().len() <= MAX_COMPLETION_RECORD);
        assert_eq!(Completion::decode(longest.encode().as_bytes()), Ok(longest));
    }

    #[test]
    fn anything_else_is_damaged() {
        for bad in [
            "",
            "c1",
            "c2:1:2:3:a",
            "c1:0:2:3:a",
            "c1:+1:2:3:a",
            "c1: 1:2:3:a",
            "c1:1:2:3",
            "c1:1:2:3:",
            "c1:1:x:3:a",
            "c1:1:2:-3:a",
            "c1:18446744073709551616:2:3:a",
            "c1:1:2:3:a\nb",
            "c1:1:2:3:a\u{1b}[2J",
        ] {
            assert!(Completion::decode(bad.as_bytes()).is_err(), "{bad:?}");
            assert!(
                matches!(
                    CompletionRead::parse(bad.as_bytes()),
                    CompletionRead::Damaged { .. }
                ),
                "{bad:?}"
            );
        }
        assert!(Completion::decode(&[0xff, b':']).is_err());
        let long = format!("c1:1:2:3:{}", "x".repeat(MAX_IDENTITY_LEN + 1));
        assert_eq!(Completion::decode(long.as_bytes()), Err("bad identity"));
        let huge = format!("c1:1:2:3:{}", "x".repeat(MAX_COMPLETION_RECORD));
        assert_eq!(
            Completion::decode(huge.as_bytes()),
            Err("longer than any completion record")
        );
    }

    #[test]
    fn periods_are_calendar_aligned_on_the_store_clock() {
        let day = Duration::from_secs(86_400);
        let midnight = 1_767_225_600_000; // 2026-01-01T00:00:00Z
        assert!(same_period(midnight, midnight + 86_399_999, day));
        assert!(
            !same_period(midnight - 1, midnight, day),
            "23:59:59.999 is yesterday"
        );
        assert!(!same_period(midnight, midnight + 86_400_000, day));
        assert!(
            same_period(midnight, midnight - 1, day),
            "a clock that stepped back"
        );
        let two = Duration::from_secs(2);
        assert!(same_period(4_000, 5_999, two));
        assert!(!same_period(3_999, 4_000, two));
        assert!(!same_period(0, 0, Duration::ZERO));
        let r = sample();
        assert!(r.covers(r.started_ms + 1, Duration::from_secs(3600)));
    }
}
