//! A seed whose virtual clock stands still: a task of the code under test that never waits.
//!
//! The paused clock moves only when no task is ready. A task that loops without waiting (a
//! `sleep_until` of an instant already past, polled again and again) keeps one always ready,
//! so the clock stops, every timer stops with it, and the seed would run forever while the
//! host burns CPU. In a real process that loop is a busy wait; here it is a finding, `Stuck`,
//! and the seed ends at it (`run` drops the rest of its history). Counted in task polls, not
//! host time, so the cut is part of the seed's history like everything else.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::Notify;
use tokio::time::Instant;

/// Task polls at one virtual instant that make a seed stuck, at the least: no instant of the
/// 200 CI seeds takes 2,048 (every replica's tasks woken by one store answer). A busy loop
/// reaches this within a second of host time (about 25 µs a poll).
const STUCK_AFTER_POLLS: u64 = 1 << 15;

/// ... and at the most: a large group wakes many tasks at one instant (its start, a store
/// answer to every shard), each polled a few times.
const STUCK_POLLS_PER_TASK: u64 = 64;

/// The clock is read once every this many polls: reading it takes the clock's lock.
const SAMPLE_EVERY: u64 = 1 << 10;

/// Counts the runtime's task polls (`on_after_task_poll`) since the clock last moved.
#[derive(Default)]
pub struct Watch {
    polls: AtomicU64,
    /// Polls since the sampled clock last moved (a multiple of `SAMPLE_EVERY`).
    still: AtomicU64,
    /// The virtual instant of the last sample, as nanoseconds since `origin`.
    last: AtomicU64,
    origin: std::sync::OnceLock<Instant>,
    stuck: AtomicBool,
    /// The polls at one instant that made the seed stuck.
    pub polls_still: AtomicU64,
    /// Woken once, when the polls at one instant reach `STUCK_AFTER_POLLS`.
    pub notify: Notify,
}

impl Watch {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// One task poll ended (on the runtime's thread: the paused clock is readable).
    pub fn polled(&self) {
        let n = self.polls.fetch_add(1, Ordering::Relaxed) + 1;
        if !n.is_multiple_of(SAMPLE_EVERY) || self.stuck.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        let origin = *self.origin.get_or_init(|| now);
        let at = u64::try_from(now.duration_since(origin).as_nanos()).unwrap_or(u64::MAX);
        if self.last.swap(at, Ordering::Relaxed) != at {
            self.still.store(0, Ordering::Relaxed);
            return;
        }
        let still = self.still.fetch_add(SAMPLE_EVERY, Ordering::Relaxed) + SAMPLE_EVERY;
        let tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        let limit = STUCK_AFTER_POLLS.max(STUCK_POLLS_PER_TASK * tasks as u64);
        if still >= limit && !self.stuck.swap(true, Ordering::Relaxed) {
            self.polls_still.store(still, Ordering::Relaxed);
            self.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn paused(watch: &Arc<Watch>) -> tokio::runtime::Runtime {
        let polled = watch.clone();
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .on_after_task_poll(move |_| polled.polled())
            .build()
            .expect("a current-thread runtime builds")
    }

    /// A task that never waits stops the paused clock; the watch says so instead of the run
    /// going on forever (without it, this test never ends).
    #[test]
    fn a_busy_loop_is_reported() {
        let watch = Watch::new();
        let rt = paused(&watch);
        let still = rt.block_on(async {
            let busy = tokio::spawn(async {
                loop {
                    tokio::task::yield_now().await;
                }
            });
            let sleeper = tokio::spawn(tokio::time::sleep(Duration::from_secs(1)));
            watch.notify.notified().await;
            assert!(!sleeper.is_finished(), "the clock stood still");
            busy.abort();
            watch.polls_still.load(Ordering::Relaxed)
        });
        assert!(still >= STUCK_AFTER_POLLS, "reported after {still} polls");
    }

    /// Many tasks woken at one instant (more polls than `STUCK_AFTER_POLLS`), then waiting, are
    /// not a busy loop.
    #[test]
    fn tasks_that_wait_are_not_reported() {
        let watch = Watch::new();
        let rt = paused(&watch);
        let ended = rt.block_on(async {
            let tasks: Vec<_> = (0..20_000u64)
                .map(|i| {
                    tokio::spawn(async move {
                        for round in 0..5u64 {
                            tokio::task::yield_now().await;
                            tokio::time::sleep(Duration::from_millis(1 + (i * round) % 7)).await;
                        }
                    })
                })
                .collect();
            tokio::select! {
                biased;
                () = watch.notify.notified() => false,
                _ = futures::future::join_all(tasks) => true,
            }
        });
        assert!(ended, "reported as stuck: {:?}", watch.polls_still);
    }
}
