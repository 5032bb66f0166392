//! What this client knows of each lease's expiry on the server: the earliest moment the server
//! may let it go. A release asks it whether the tombstone acknowledging the release can simply
//! keep what remains of the lease's ttl, or must be given the release-ack ttl (one more call
//! inside the script, which the common case — a release well before expiry — skips).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::backend::HolderToken;

/// Lower bounds of server-side expiry, by holder token.
#[derive(Debug, Default)]
pub(crate) struct Expiries {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    until: HashMap<u128, Instant>,
    /// Forgotten leases (lost without a release, dropped) are swept when the table grows past
    /// this size, so it stays proportional to the leases alive.
    sweep_above: usize,
}

const MIN_SWEEP: usize = 1024;

fn key(holder: &HolderToken) -> u128 {
    u128::from_le_bytes(*holder.as_bytes())
}

impl Expiries {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held; recover the table rather than propagate.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A grant or renewal of `ttl`, sent at `sent`, succeeded: the server applied the ttl when
    /// it processed the request, never before `sent`, so it holds the lease until at least
    /// `sent + ttl`.
    pub(crate) fn extended(&self, holder: &HolderToken, sent: Instant, ttl: Duration) {
        let until = sent.checked_add(ttl).unwrap_or(sent);
        let mut st = self.lock();
        st.until.insert(key(holder), until);
        if st.until.len() > st.sweep_above.max(MIN_SWEEP) {
            let now = Instant::now();
            st.until.retain(|_, u| *u > now);
            st.sweep_above = st.until.len() * 2;
        }
    }

    /// The lease is gone (not held any more).
    pub(crate) fn forget(&self, holder: &HolderToken) {
        self.lock().until.remove(&key(holder));
    }

    /// Forgets the lease and tells whether the server may let it go within `window` from now:
    /// true when nothing is known of it.
    pub(crate) fn take_ends_within(&self, holder: &HolderToken, window: Duration) -> bool {
        let known = self.lock().until.remove(&key(holder));
        match (known, Instant::now().checked_add(window)) {
            (Some(until), Some(at)) => until < at,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_leases_answer_from_their_bound_and_unknown_ones_are_short() {
        let e = Expiries::default();
        let t = HolderToken::random();
        let now = Instant::now();
        let s = Duration::from_secs;
        assert!(e.take_ends_within(&t, s(0)), "unknown: assume short");
        e.extended(&t, now, s(10));
        assert!(!e.take_ends_within(&t, s(5)));
        assert!(e.take_ends_within(&t, s(0)), "taken: unknown again");
        e.extended(&t, now, s(10));
        assert!(e.take_ends_within(&t, s(11)));
        e.extended(&t, now, s(10));
        assert!(e.take_ends_within(&t, Duration::MAX), "no overflow");
        e.extended(&t, now, s(10));
        e.forget(&t);
        assert!(e.take_ends_within(&t, s(0)));
    }

    #[test]
    fn expired_entries_are_swept() {
        let e = Expiries::default();
        let past = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        for _ in 0..3 * MIN_SWEEP {
            e.extended(&HolderToken::random(), past, Duration::ZERO);
        }
        assert!(e.lock().until.len() <= MIN_SWEEP + 1, "swept as it grew");
    }
}
