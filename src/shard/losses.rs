//! Shard terms lost to the store (renewals that missed their deadline, a lease taken), as
//! opposed to terms given up: the count, and the warning that a group has outgrown what its
//! store can write. Past that ceiling (shards × replicas renewals per lease duration, see the
//! scale table in docs/sharding.md) renewals queue behind each other, terms are lost and retaken, and
//! the group thrashes; without this the only sign is churn in the logs.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Losses within one window that make the warning (fewer are ordinary: a partition, a pause).
const WARN_AT: usize = 3;
/// The warning at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Lost shard terms of one replica.
#[derive(Debug, Default)]
pub(super) struct Losses {
    total: AtomicU64,
    recent: Mutex<Recent>,
}

#[derive(Debug, Default)]
struct Recent {
    at: VecDeque<Instant>,
    warned: Option<Instant>,
}

impl Losses {
    /// Every lost term since the elector was made.
    pub(super) fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Records a lost term; warns when `WARN_AT` terms were lost within `window` (two lease
    /// durations: one round of renewals and the retakes it caused).
    pub(super) fn lost(&self, group: &str, shards: u32, shard: u32, window: Duration) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        // Nothing panics while this lock is held.
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        recent.at.push_back(now);
        while recent
            .at
            .front()
            .is_some_and(|t| now.duration_since(*t) > window)
        {
            recent.at.pop_front();
        }
        let in_window = recent.at.len();
        tracing::debug!(group, shard, "a shard's term was lost");
        if in_window >= WARN_AT
            && recent
                .warned
                .is_none_or(|w| now.duration_since(w) >= WARN_EVERY)
        {
            recent.warned = Some(now);
            tracing::warn!(
                group,
                shards,
                lost = in_window,
                ?window,
                total = self.total(),
                "shard terms are being lost to missed renewals: the store may be past what it can \
                 write for this group (about shards × replicas renewals per lease duration; see \
                 the scale table in tenure's docs/sharding.md). Raise the lease duration, lower the shard \
                 count, or check the store's latency"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn losses_are_counted_and_only_those_in_the_window_are_recent() {
        let losses = Losses::default();
        let window = Duration::from_secs(10);
        losses.lost("g", 4, 0, window);
        losses.lost("g", 4, 1, window);
        tokio::time::advance(Duration::from_secs(11)).await;
        losses.lost("g", 4, 2, window);
        assert_eq!(losses.total(), 3);
        let recent = losses.recent.lock().expect("not poisoned");
        assert_eq!(recent.at.len(), 1, "the first two fell out of the window");
        assert!(recent.warned.is_none(), "never three within the window");
        drop(recent);
        losses.lost("g", 4, 3, window);
        losses.lost("g", 4, 0, window);
        assert!(losses.recent.lock().expect("not poisoned").warned.is_some());
        assert_eq!(losses.total(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn the_warning_comes_at_most_once_a_minute() {
        let losses = Losses::default();
        let window = Duration::from_secs(10);
        let warned = || losses.recent.lock().expect("not poisoned").warned;
        for shard in 0..3 {
            losses.lost("g", 4, shard, window);
        }
        let first = warned().expect("three losses in the window warn");
        tokio::time::advance(Duration::from_secs(5)).await;
        losses.lost("g", 4, 3, window);
        assert_eq!(warned(), Some(first), "not again within a minute");
        tokio::time::advance(WARN_EVERY).await;
        for shard in 0..3 {
            losses.lost("g", 4, shard, window);
        }
        assert!(warned().is_some_and(|w| w > first), "again after a minute");
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_exactly_one_window_old_is_still_recent() {
        let losses = Losses::default();
        let window = Duration::from_secs(10);
        losses.lost("g", 4, 0, window);
        tokio::time::advance(window).await;
        losses.lost("g", 4, 1, window);
        assert_eq!(losses.recent.lock().expect("not poisoned").at.len(), 2);
    }
}
