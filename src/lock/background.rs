//! The lock runtime's work left to the background: the release of a dropped lease, of an
//! acquire abandoned after its request went out (it may have been granted), and of a release
//! whose caller stopped waiting. Counted per locker, so that a run about to return can wait
//! for it, bounded, before its process exits: a runtime that shuts down drops whatever it has
//! not finished, and a release dropped that way leaves its lease to the ttl.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;
use tokio::time::Instant;

/// The background work of one locker still running.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    count: AtomicUsize,
    idle: Notify,
}

impl Pending {
    /// Spawns `work` on `rt`, counted until it ends or its runtime drops it.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        rt: &tokio::runtime::Handle,
        work: impl Future<Output = ()> + Send + 'static,
    ) {
        let counted = Counted::new(self);
        drop(rt.spawn(async move {
            let _counted = counted;
            work.await;
        }));
    }

    /// Waits until none is left, or until `deadline`; whether none is left.
    pub(crate) async fn settled(&self, deadline: Instant) -> bool {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            // Registered before the count is read, so work ending between the two is seen.
            idle.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.count.load(Ordering::Acquire) == 0;
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}

/// One piece of background work, counted while it lives. Work that spawns more (a dropped
/// lease's release) counts the new piece before its own ends, so the count never passes
/// through zero on the way.
struct Counted(Arc<Pending>);

impl Counted {
    fn new(pending: &Arc<Pending>) -> Self {
        pending.count.fetch_add(1, Ordering::AcqRel);
        Self(pending.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn settled_waits_for_every_piece_and_for_what_a_piece_spawns() {
        let pending = Arc::new(Pending::default());
        let rt = tokio::runtime::Handle::current();
        let inner = pending.clone();
        let rt2 = rt.clone();
        pending.spawn(&rt, async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            inner.spawn(&rt2, tokio::time::sleep(Duration::from_secs(2)));
        });
        pending.spawn(&rt, tokio::time::sleep(Duration::from_millis(500)));
        assert_eq!(pending.len(), 2);
        let start = Instant::now();
        assert!(pending.settled(start + Duration::from_secs(10)).await);
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(3),
            "waited for the chain"
        );
        assert_eq!(pending.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn settled_gives_up_at_its_deadline() {
        let pending = Arc::new(Pending::default());
        pending.spawn(
            &tokio::runtime::Handle::current(),
            std::future::pending::<()>(),
        );
        let start = Instant::now();
        assert!(!pending.settled(start + Duration::from_secs(1)).await);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert!(
            Arc::new(Pending::default()).settled(start).await,
            "nothing pending: settled at once, even past the deadline"
        );
    }
}
