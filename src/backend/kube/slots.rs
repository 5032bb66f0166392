//! The bound on one backend's requests in flight, and who is served first under it: upkeep —
//! the requests that keep what this replica already holds alive — never queues behind
//! acquisitions, reads, watches and campaign traffic.
//!
//! The Kubernetes client speaks HTTP/1.1, one connection (one file descriptor) per request in
//! flight, so the bound is a file-descriptor bound: unbounded, a replica renewing a thousand
//! shard leases at once would open a thousand. Under one shared first-come queue, a sharded
//! replica's burst of acquisitions and reads filled it; its member heartbeat and lease
//! renewals waited behind them past the request timeout, the heartbeat timed out, and the
//! replica dropped every shard it held (634 → 0 under load). Hence two classes ([`Traffic`])
//! and this invariant, kept by [`State::admits`] and [`State::hand_over`]:
//!
//! - at most [`MAX_IN_FLIGHT`] requests are in flight, whatever their class;
//! - ordinary requests hold at most [`MAX_IN_FLIGHT`] − [`UPKEEP_RESERVE`] slots, so upkeep
//!   finds a free slot even while every ordinary request is stuck on a slow server;
//! - a freed slot goes to a waiting upkeep request before any waiting ordinary one; within a
//!   class, first come first served.
//!
//! Upkeep can starve ordinary traffic for as long as it keeps every slot busy: keeping a held
//! lease outranks taking a new one.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// How many requests one backend has in flight at most, both classes together (watches
/// count while they open). A plain election never has more than a few; a burst of shard
/// renewals queues here, its wait counted in the request's timeout and, being before the
/// send, in the lease's validity (which starts when the renewal was decided).
pub(super) const MAX_IN_FLIGHT: usize = 32;

/// Slots ordinary traffic never takes: what a replica keeping its member heartbeat and a
/// few renewals or releases going needs at once while everything else is stuck. Upkeep
/// beyond it takes any free slot, ahead of waiting ordinary requests.
pub(super) const UPKEEP_RESERVE: usize = 8;

/// The most slots ordinary traffic holds at once.
const MAX_ORDINARY: usize = MAX_IN_FLIGHT - UPKEEP_RESERVE;

/// Which class a request is queued in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Traffic {
    /// Keeps something this replica already holds alive, or gives it up: the renewal of a
    /// held lease (and the read after its conflict), the member heartbeat, a release, a
    /// withdrawal from the group. Missing its deadline loses a term or every shard.
    Upkeep,
    /// Everything else: acquisitions and their fencing stamps, reads, watches, the group
    /// record, hand-over requests, Events, completion records. Late, it only retries later.
    Ordinary,
}

/// The request slots of one backend.
pub(super) struct Slots {
    state: Mutex<State>,
}

/// Counts and queues; every change runs [`State::hand_over`] before the lock is let go, so
/// no waiter is ever left queued while a slot it may take is free.
#[derive(Default)]
struct State {
    in_flight: usize,
    /// The ordinary requests among `in_flight`.
    ordinary: usize,
    /// Each waiter's channel; a slot is taken on the waiter's behalf before it is sent.
    upkeep_waiting: VecDeque<oneshot::Sender<()>>,
    ordinary_waiting: VecDeque<oneshot::Sender<()>>,
}

/// A slot held: the request it was taken for is in flight until this drops.
pub(super) struct Slot<'a> {
    slots: &'a Slots,
    traffic: Traffic,
}

/// A queued waiter. Dropped before it was served (its request timed out), it leaves the
/// queue; dropped after a slot was sent but before it was received, it gives the slot back.
struct Waiting<'a> {
    slots: &'a Slots,
    traffic: Traffic,
    granted: Option<oneshot::Receiver<()>>,
}

impl State {
    /// Whether a request of `traffic` may go out now, by the counts alone.
    fn admits(&self, traffic: Traffic) -> bool {
        self.in_flight < MAX_IN_FLIGHT
            && (traffic == Traffic::Upkeep || self.ordinary < MAX_ORDINARY)
    }

    fn take(&mut self, traffic: Traffic) {
        self.in_flight += 1;
        if traffic == Traffic::Ordinary {
            self.ordinary += 1;
        }
    }

    fn give_back(&mut self, traffic: Traffic) {
        self.in_flight -= 1;
        if traffic == Traffic::Ordinary {
            self.ordinary -= 1;
        }
    }

    fn queue(&mut self, traffic: Traffic) -> &mut VecDeque<oneshot::Sender<()>> {
        match traffic {
            Traffic::Upkeep => &mut self.upkeep_waiting,
            Traffic::Ordinary => &mut self.ordinary_waiting,
        }
    }

    /// Serves waiters while a slot is free for them: upkeep first. A waiter that gave up
    /// (its channel is closed) is skipped and its slot offered to the next.
    fn hand_over(&mut self) {
        loop {
            let traffic = if !self.upkeep_waiting.is_empty() && self.admits(Traffic::Upkeep) {
                Traffic::Upkeep
            } else if !self.ordinary_waiting.is_empty() && self.admits(Traffic::Ordinary) {
                Traffic::Ordinary
            } else {
                return;
            };
            let Some(waiter) = self.queue(traffic).pop_front() else {
                return;
            };
            self.take(traffic);
            if waiter.send(()).is_err() {
                self.give_back(traffic);
            }
        }
    }
}

impl Slots {
    pub(super) fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while this lock is held; recover rather than propagate a poison.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a request of `traffic`, once its class may have one.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future (the request timed out) leaves the queue without taking a slot.
    pub(super) async fn acquire(&self, traffic: Traffic) -> Slot<'_> {
        loop {
            let granted = {
                let mut state = self.state();
                // Every release serves the waiters it can, so a class with waiters admits
                // nobody: a newcomer its class admits overtakes no one of its own class,
                // and upkeep overtakes only ordinary waiters.
                if state.admits(traffic) {
                    state.take(traffic);
                    return Slot {
                        slots: self,
                        traffic,
                    };
                }
                let (tx, rx) = oneshot::channel();
                state.queue(traffic).push_back(tx);
                rx
            };
            let mut waiting = Waiting {
                slots: self,
                traffic,
                granted: Some(granted),
            };
            if waiting.served().await {
                return Slot {
                    slots: self,
                    traffic,
                };
            }
            // The sender went without sending, which `hand_over` never does: queue again.
        }
    }

    fn release(&self, traffic: Traffic) {
        let mut state = self.state();
        state.give_back(traffic);
        state.hand_over();
    }
}

impl Waiting<'_> {
    /// Whether a slot was handed to this waiter (taken on its behalf, now its own).
    async fn served(&mut self) -> bool {
        let Some(granted) = self.granted.as_mut() else {
            return false;
        };
        let served = granted.await.is_ok();
        self.granted = None;
        served
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(mut granted) = self.granted.take() else {
            return;
        };
        // Closed, it can no longer be served; a slot sent before that is ours to give back.
        granted.close();
        if granted.try_recv().is_ok() {
            self.slots.release(self.traffic);
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.slots.release(self.traffic);
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    fn counts(slots: &Slots) -> (usize, usize, usize, usize) {
        let s = slots.state();
        (
            s.in_flight,
            s.ordinary,
            s.upkeep_waiting.len(),
            s.ordinary_waiting.len(),
        )
    }

    /// Polls a queued acquisition once: its slot, if it has been served. Every hand-over
    /// happens inside the release that frees the slot, so one poll sees it.
    fn served<'a>(waiter: &mut (impl Future<Output = Slot<'a>> + Unpin)) -> Option<Slot<'a>> {
        waiter.now_or_never()
    }

    /// Takes `n` slots of `traffic`, which must be free.
    fn hold(slots: &Slots, traffic: Traffic, n: usize) -> Vec<Slot<'_>> {
        (0..n)
            .map(|_| {
                slots
                    .acquire(traffic)
                    .now_or_never()
                    .expect("a free slot is taken at once")
            })
            .collect()
    }

    #[test]
    fn slots_should_keep_a_reserve_for_upkeep_while_ordinary_traffic_is_stuck() {
        let slots = Slots::new();
        let _stuck = hold(&slots, Traffic::Ordinary, MAX_ORDINARY);
        assert_eq!(counts(&slots), (MAX_ORDINARY, MAX_ORDINARY, 0, 0));
        let mut more = Box::pin(slots.acquire(Traffic::Ordinary));
        assert!(
            served(&mut more).is_none(),
            "ordinary traffic took the reserve"
        );
        // The whole reserve is upkeep's, at once, with an ordinary request waiting.
        let upkeep = hold(&slots, Traffic::Upkeep, UPKEEP_RESERVE);
        assert_eq!(counts(&slots), (MAX_IN_FLIGHT, MAX_ORDINARY, 0, 1));
        // And never more than the total bound.
        let mut beyond = Box::pin(slots.acquire(Traffic::Upkeep));
        assert!(served(&mut beyond).is_none(), "more than MAX_IN_FLIGHT");
        drop(upkeep);
        // A freed reserve slot goes to upkeep, never to the ordinary waiter.
        let beyond = served(&mut beyond).expect("upkeep served from the reserve");
        assert!(
            served(&mut more).is_none(),
            "an ordinary request in the reserve"
        );
        assert_eq!(counts(&slots), (MAX_ORDINARY + 1, MAX_ORDINARY, 0, 1));
        drop(beyond);
    }

    #[test]
    fn slots_should_serve_waiting_upkeep_before_ordinary_waiters_that_came_first() {
        let slots = Slots::new();
        let mut ordinary = hold(&slots, Traffic::Ordinary, MAX_ORDINARY);
        let _upkeep = hold(&slots, Traffic::Upkeep, UPKEEP_RESERVE);
        let mut first = Box::pin(slots.acquire(Traffic::Ordinary));
        assert!(served(&mut first).is_none());
        let mut renewal = Box::pin(slots.acquire(Traffic::Upkeep));
        assert!(served(&mut renewal).is_none());
        assert_eq!(counts(&slots), (MAX_IN_FLIGHT, MAX_ORDINARY, 1, 1));
        // An ordinary slot frees: the renewal that came later gets it.
        ordinary.pop();
        let renewal = served(&mut renewal).expect("upkeep first");
        assert_eq!(renewal.traffic, Traffic::Upkeep);
        assert!(served(&mut first).is_none());
        // The next goes to the ordinary waiter.
        ordinary.pop();
        let first = served(&mut first).expect("then the ordinary waiter");
        assert_eq!(first.traffic, Traffic::Ordinary);
        assert_eq!(counts(&slots), (MAX_IN_FLIGHT, MAX_ORDINARY - 1, 0, 0));
    }

    #[test]
    fn slots_should_let_upkeep_overtake_ordinary_waiters_but_not_its_own_class() {
        let slots = Slots::new();
        let mut held = hold(&slots, Traffic::Upkeep, MAX_IN_FLIGHT - 1);
        held.extend(hold(&slots, Traffic::Ordinary, 1));
        let mut ordinary = Box::pin(slots.acquire(Traffic::Ordinary));
        let mut a = Box::pin(slots.acquire(Traffic::Upkeep));
        let mut b = Box::pin(slots.acquire(Traffic::Upkeep));
        assert!(served(&mut ordinary).is_none());
        assert!(served(&mut a).is_none() && served(&mut b).is_none());
        held.remove(0);
        let _a = served(&mut a).expect("the first upkeep waiter first");
        assert!(served(&mut b).is_none());
        // A newcomer does not overtake a waiter of its class.
        let mut c = Box::pin(slots.acquire(Traffic::Upkeep));
        held.remove(0);
        let _b = served(&mut b).expect("the earlier waiter");
        assert!(served(&mut c).is_none());
        held.remove(0);
        let _c = served(&mut c).expect("then the newcomer");
        assert!(served(&mut ordinary).is_none(), "ordinary before upkeep");
        // With a slot free and only ordinary waiters, a new upkeep request goes straight out.
        held.remove(0);
        let _ordinary = served(&mut ordinary).expect("free slot");
        held.remove(0);
        let newcomer = slots.acquire(Traffic::Upkeep).now_or_never();
        assert!(newcomer.is_some(), "upkeep queued behind nobody");
    }

    #[test]
    fn slots_should_not_leak_when_a_waiter_gives_up() {
        let slots = Slots::new();
        let mut held = hold(&slots, Traffic::Ordinary, MAX_ORDINARY);
        // Its request timed out while queued: it leaves the queue, having taken nothing.
        assert!(slots.acquire(Traffic::Ordinary).now_or_never().is_none());
        assert_eq!(counts(&slots), (MAX_ORDINARY, MAX_ORDINARY, 0, 1));
        held.pop();
        assert_eq!(counts(&slots), (MAX_ORDINARY - 1, MAX_ORDINARY - 1, 0, 0));
        // Served (the slot taken on its behalf) but dropped before it ran: the slot comes
        // back.
        held.extend(hold(&slots, Traffic::Ordinary, 1));
        let mut late = Box::pin(slots.acquire(Traffic::Ordinary));
        assert!(served(&mut late).is_none());
        held.pop();
        assert_eq!(counts(&slots), (MAX_ORDINARY, MAX_ORDINARY, 0, 0));
        drop(late);
        assert_eq!(counts(&slots), (MAX_ORDINARY - 1, MAX_ORDINARY - 1, 0, 0));
        drop(held);
        assert_eq!(counts(&slots), (0, 0, 0, 0));
    }
}
