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
    /// The highest resourceVersion applied to `known`, from any source: the view only moves
    /// forward.
    pub last_rv: u64,
    /// When the latest observation was applied to `known`.
    pub applied_at: Option<Instant>,
    /// The grant held through this backend, if any.
    pub own: Option<Own>,
    /// The shared watch of this Lease, while anyone observes it.
    pub watch: Option<Notices>,
    /// The watch is synced: `known` follows the server without reads.
    pub live: bool,
    /// The sharded group whose joint watch follows this Lease, if any.
    pub joint: Option<Joint>,
}

/// A sharded group's joint watch of this Lease ([`super::shard_watch`]).
#[derive(Debug)]
pub struct Joint {
    /// The group's label value, which the Lease carries when this process writes it.
    pub label: Arc<str>,
    /// How many joint watches of this process follow the Lease (one per running sharded
    /// elector of the group).
    pub followers: u32,
    /// A joint watch is synced: `known` follows the server without reads.
    pub live: bool,
    /// `watch` was opened for the joint watch to feed: no watch of this Lease alone is
    /// behind it.
    pub feeds: bool,
}

/// Where an observation of a Lease came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// An event of the Lease's watch: the stream is in the server's order.
    Watch,
    /// The answer to a request (GET, LIST, our own write) sent at this instant. Answers of
    /// requests in flight together may arrive in any order, and after watch events newer
    /// than they are.
    Answer(Instant),
}

impl LockState {
    /// Records `lease` (or its absence; `rv` then is the deletion's version when known) seen
    /// now, unless it is older than what was already applied: the cached view only moves
    /// forward, so a read answered after a newer watch event cannot put an old holder back
    /// (which made a waiter sit out a whole lease on a holder that had released).
    ///
    /// An answer with a lower resourceVersion than the newest applied is dropped if its
    /// request was sent before that newest observation was applied (it may predate it); sent
    /// after, it is the server's word now, and a lower version means etcd went backwards
    /// (restored from a backup), which the view then follows. An absence without a version
    /// (a 404) counts as an answer at its send instant the same way.
    pub fn note(
        &mut self,
        lease: Option<(Lease, u64)>,
        deleted_rv: Option<u64>,
        source: Source,
        now: Instant,
    ) {
        let rv = lease.as_ref().map(|(_, rv)| *rv).or(deleted_rv);
        let sent_after_newest = match (source, self.applied_at) {
            (Source::Answer(sent), Some(applied)) => sent > applied,
            (Source::Answer(_), None) => true,
            (Source::Watch, _) => false,
        };
        let apply = match rv {
            Some(rv) if rv > self.last_rv => true,
            // The same version again: refresh nothing but the object (the clock stays).
            Some(rv) if rv == self.last_rv => lease.is_some() || sent_after_newest,
            Some(_) => sent_after_newest,
            None => source == Source::Watch || sent_after_newest,
        };
        if !apply {
            return;
        }
        match lease {
            None => self.known = Some(Current::Absent),
            Some((lease, rv)) => {
                let at = match &self.known {
                    Some(Current::Present(s)) if s.rv == rv => s.at,
                    _ => now,
                };
                self.known = Some(Current::Present(Box::new(Seen { lease, rv, at })));
            }
        }
        if let Some(rv) = rv {
            self.last_rv = rv;
        }
        self.applied_at = Some(now);
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

    /// Whether a synced watch keeps `known` current, so reads need not ask the server.
    pub fn synced(&self) -> bool {
        self.live || self.joint.as_ref().is_some_and(|j| j.live)
    }

    /// Whether nothing here is worth keeping.
    pub fn is_idle(&self) -> bool {
        self.own.is_none() && self.watch.is_none() && self.joint.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> Lease {
        Lease::default()
    }

    /// An answer to a request sent now.
    fn answer() -> Source {
        Source::Answer(Instant::now())
    }

    fn seen(s: &LockState) -> (u64, Instant) {
        match &s.known {
            Some(Current::Present(seen)) => (seen.rv, seen.at),
            other => panic!("present expected: {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn observation_clock_restarts_only_on_a_new_version() {
        let mut s = LockState::default();
        let t0 = Instant::now();
        s.note(Some((lease(), 5)), None, answer(), t0);
        tokio::time::advance(Duration::from_secs(3)).await;
        s.note(Some((lease(), 5)), None, answer(), Instant::now());
        let Some(Current::Present(first)) = &s.known else {
            panic!("present")
        };
        assert_eq!(first.at, t0, "the same version must not restart the wait");
        assert_eq!(
            first.remaining(Duration::from_secs(10), Instant::now()),
            Duration::from_secs(7)
        );
        s.note(Some((lease(), 6)), None, Source::Watch, Instant::now());
        assert_eq!(seen(&s), (6, Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn reordered_watch_events_are_dropped() {
        let mut s = LockState::default();
        s.note(Some((lease(), 9)), None, answer(), Instant::now());
        s.note(Some((lease(), 8)), None, Source::Watch, Instant::now());
        assert_eq!(seen(&s).0, 9);
    }

    /// Issue #27: a GET sent before a release, answered after the watch delivered the
    /// release, must not put the old holder back (a waiter then sat out a whole lease).
    #[tokio::test(start_paused = true)]
    async fn a_read_answered_after_a_newer_watch_event_is_dropped() {
        let mut s = LockState::default();
        s.note(Some((lease(), 10)), None, Source::Watch, Instant::now());
        let get_sent = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        s.note(Some((lease(), 12)), None, Source::Watch, Instant::now());
        let released_at = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        // The GET's answer: the version before the release.
        s.note(
            Some((lease(), 11)),
            None,
            Source::Answer(get_sent),
            Instant::now(),
        );
        assert_eq!(
            seen(&s),
            (12, released_at),
            "the older answer changed the view"
        );
        // So is a 404 sent before a create the watch already delivered.
        s.note(None, None, Source::Answer(get_sent), Instant::now());
        assert_eq!(seen(&s).0, 12, "an old 404 hid the Lease");
        // And a deletion older than what a read already showed.
        s.note(Some((lease(), 20)), None, answer(), Instant::now());
        s.note(None, Some(15), Source::Watch, Instant::now());
        assert_eq!(seen(&s).0, 20, "an older deletion hid the Lease");
        // A newer deletion applies.
        s.note(None, Some(21), Source::Watch, Instant::now());
        assert!(matches!(s.known, Some(Current::Absent)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lower_version_asked_for_after_the_newest_means_etcd_went_back() {
        let mut s = LockState::default();
        s.note(Some((lease(), 9)), None, Source::Watch, Instant::now());
        tokio::time::advance(Duration::from_millis(1)).await;
        // Sent after the newest observation was applied: the server's word now.
        s.note(Some((lease(), 3)), None, answer(), Instant::now());
        assert_eq!(seen(&s).0, 3);
        assert_eq!(s.last_rv, 3);
        // Likewise an absence asked for later.
        tokio::time::advance(Duration::from_millis(1)).await;
        s.note(None, None, answer(), Instant::now());
        assert!(matches!(s.known, Some(Current::Absent)));
    }
}
