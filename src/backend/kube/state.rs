//! What this process has seen of each Lease, on its own monotonic clock: the basis of every
//! expiry judgement (client-go semantics) and of the watch-fed cache.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{BackendError, FencingToken, HolderChange, HolderToken};

/// What observers of one Lease see: `None` until the watch has synced once, then the current
/// holder, or the latest failure of the watch.
pub type Notice = Option<Result<HolderChange, BackendError>>;
/// The sending side of a Lease's notices, shared by the Lease's watch task and its
/// [`LockState`] (where new observers subscribe).
pub type Notices = Arc<watch::Sender<Notice>>;

/// The Lease as this process last saw it.
#[derive(Clone, Debug)]
pub enum Current {
    /// There is no Lease of that name.
    Absent,
    /// The Lease, its resourceVersion, and when this process first saw that resourceVersion.
    Present(Box<Seen>),
}

/// One version of the Lease and the local instant it was first seen.
#[derive(Clone, Debug)]
pub struct Seen {
    pub lease: Lease,
    pub rv: u64,
    /// When this process first saw `rv`: the start of a non-holder's wait. Never earlier than
    /// the write that made `rv` was sent, so `at + leaseDurationSeconds` is never earlier than
    /// the holder's own validity ends.
    pub at: Instant,
}

impl Seen {
    /// Time left on the holder's lease by this process's clock.
    pub fn remaining(&self, duration: Duration, now: Instant) -> Duration {
        duration.saturating_sub(now.saturating_duration_since(self.at))
    }
}

/// A grant this process holds (or held) through this backend.
#[derive(Clone, Copy, Debug)]
pub struct Own {
    pub holder: HolderToken,
    pub fencing: FencingToken,
    /// When the latest successful write of this holder was sent.
    pub last_sent: Instant,
    /// The leaseDurationSeconds of that write.
    pub duration: Duration,
}

impl Own {
    /// Whether, by this process's clock, others may already judge the lease expired: then a
    /// renewal would resurrect it, which the contract forbids.
    pub fn expired(&self, now: Instant) -> bool {
        now >= self.last_sent + self.duration
    }
}

/// Everything known about one lock name.
#[derive(Debug, Default)]
pub struct LockState {
    /// The latest version seen; `None` when unknown.
    pub known: Option<Current>,
    /// The highest resourceVersion seen from the watch, to drop reordered events.
    pub last_rv: u64,
    /// The grant held through this backend, if any.
    pub own: Option<Own>,
    /// The shared watch of this Lease, while anyone observes it.
    pub watch: Option<Notices>,
    /// The watch is synced: `known` follows the server without reads.
    pub live: bool,
}

impl LockState {
    /// Records `lease` (or its absence) seen now. `authoritative` reads (GET, LIST, our own
    /// write's answer) always apply; watch events only when newer than any seen.
    pub fn note(&mut self, lease: Option<(Lease, u64)>, authoritative: bool, now: Instant) {
        match lease {
            None => self.known = Some(Current::Absent),
            Some((lease, rv)) => {
                if !authoritative && rv <= self.last_rv {
                    return;
                }
                let at = match &self.known {
                    Some(Current::Present(s)) if s.rv == rv => s.at,
                    _ => now,
                };
                self.known = Some(Current::Present(Box::new(Seen { lease, rv, at })));
                self.last_rv = if authoritative {
                    rv
                } else {
                    self.last_rv.max(rv)
                };
            }
        }
    }

    /// The grant of `holder`, if this backend made it.
    pub fn own_of(&self, holder: &HolderToken) -> Option<Own> {
        self.own.filter(|o| o.holder == *holder)
    }

    /// Forgets the grant of `holder`.
    pub fn forget(&mut self, holder: &HolderToken) {
        if self.own.is_some_and(|o| o.holder == *holder) {
            self.own = None;
        }
    }

    /// Whether nothing here is worth keeping.
    pub fn is_idle(&self) -> bool {
        self.own.is_none() && self.watch.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> Lease {
        Lease::default()
    }

    #[tokio::test(start_paused = true)]
    async fn observation_clock_restarts_only_on_a_new_version() {
        let mut s = LockState::default();
        let t0 = Instant::now();
        s.note(Some((lease(), 5)), true, t0);
        tokio::time::advance(Duration::from_secs(3)).await;
        s.note(Some((lease(), 5)), true, Instant::now());
        let Some(Current::Present(seen)) = &s.known else {
            panic!("present")
        };
        assert_eq!(seen.at, t0, "the same version must not restart the wait");
        assert_eq!(
            seen.remaining(Duration::from_secs(10), Instant::now()),
            Duration::from_secs(7)
        );
        s.note(Some((lease(), 6)), false, Instant::now());
        let Some(Current::Present(seen)) = &s.known else {
            panic!("present")
        };
        assert_eq!(seen.rv, 6);
        assert_eq!(seen.at, Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn reordered_watch_events_are_dropped() {
        let mut s = LockState::default();
        s.note(Some((lease(), 9)), true, Instant::now());
        s.note(Some((lease(), 8)), false, Instant::now());
        let Some(Current::Present(seen)) = &s.known else {
            panic!("present")
        };
        assert_eq!(seen.rv, 9);
        // An authoritative read wins even when lower (etcd restored from a backup).
        s.note(Some((lease(), 3)), true, Instant::now());
        assert_eq!(s.last_rv, 3);
    }
}
