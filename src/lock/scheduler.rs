//! Keeps every lease of a [`Locker`](super::Locker) alive from one task: renews leases as they
//! fall due, batching those due together into one `renew_many`, and ends leases whose renew
//! deadline or validity passes.
//!
//! One task and one timer heap serve all leases of a locker, so N held leases cost one task and
//! O(N) memory, never a task per lease. The task starts with the first lease and exits when the
//! last one ends. It never waits on the store inside its loop: renewal batches are in-flight
//! futures polled beside the timer, so one slow batch cannot delay another lease's deadline.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::lease::LeaseShared;
use super::{LeaseEnd, LostReason};
use crate::backend::{Backend, BackendError, RenewRequest, Renewed};

/// The most renewals sent in one `renew_many` call; larger due sets are split.
const MAX_BATCH: usize = 4096;

/// The scheduler of one locker: a lazily started task and the channel to it.
pub(crate) struct Scheduler {
    backend: Arc<dyn Backend>,
    /// `Some` while a scheduler task runs. Sends happen under this lock, and the task clears it
    /// under this lock only when it has no leases and no queued command, so no command is ever
    /// sent to a task that is exiting.
    tx: Arc<Mutex<Option<mpsc::UnboundedSender<Command>>>>,
    stats: Arc<Stats>,
}

#[derive(Default)]
pub(crate) struct Stats {
    pub active: AtomicUsize,
    pub tasks: AtomicUsize,
    pub renewals: AtomicU64,
    pub batches: AtomicU64,
}

enum Command {
    Add(Arc<LeaseShared>, Instant),
    Renewed(u64, Instant),
    Remove(u64),
}

impl Scheduler {
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            tx: Arc::default(),
            stats: Arc::default(),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Starts tracking a lease acquired by a request sent at `sent`.
    pub fn add(&self, lease: Arc<LeaseShared>, sent: Instant) {
        self.stats.active.fetch_add(1, Ordering::Relaxed);
        self.send(Command::Add(lease, sent), true);
    }

    /// A renewal sent at `sent` succeeded outside the scheduler ([`Lease::refresh`](super::Lease::refresh)).
    pub fn renewed(&self, id: u64, sent: Instant) {
        self.send(Command::Renewed(id, sent), false);
    }

    /// Stops tracking a lease (released or orphaned).
    pub fn remove(&self, id: u64) {
        self.send(Command::Remove(id), false);
    }

    fn send(&self, cmd: Command, start: bool) {
        let mut slot = self
            .tx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tx) = slot.as_ref() {
            // The receiver lives as long as the slot is `Some`: the task clears the slot
            // before dropping it.
            let _ = tx.send(cmd);
            return;
        }
        if !start {
            // No task means no tracked lease: nothing to update or remove.
            return;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(cmd);
        *slot = Some(tx);
        self.stats.tasks.fetch_add(1, Ordering::Relaxed);
        let task = Task {
            backend: self.backend.clone(),
            slot: self.tx.clone(),
            stats: self.stats.clone(),
            rx,
            entries: HashMap::new(),
            timers: BinaryHeap::new(),
            in_flight: FuturesUnordered::new(),
        };
        tokio::spawn(task.run());
    }
}

/// What the scheduler keeps per lease beyond the shared state: when the last renewal that
/// succeeded was sent, and when to act next.
struct Entry {
    lease: Arc<LeaseShared>,
    last_ok: Instant,
    next_renew: Instant,
    in_flight: bool,
}

impl Entry {
    /// The instant the lease ends unless a renewal succeeds first.
    fn deadline(&self) -> Instant {
        self.last_ok + self.lease.plan.renew_deadline
    }

    /// When the scheduler must look at this lease again.
    fn next_event(&self) -> Instant {
        if self.lease.plan.auto_renew && !self.in_flight {
            self.next_renew.min(self.deadline())
        } else {
            self.deadline()
        }
    }

    fn reason_at_deadline(&self) -> LostReason {
        if self.lease.plan.auto_renew {
            LostReason::RenewDeadline
        } else {
            LostReason::Expired
        }
    }
}

type BatchResult = (
    Vec<u64>,
    Instant,
    Result<Vec<Result<Renewed, BackendError>>, BackendError>,
);

struct Task {
    backend: Arc<dyn Backend>,
    slot: Arc<Mutex<Option<mpsc::UnboundedSender<Command>>>>,
    stats: Arc<Stats>,
    rx: mpsc::UnboundedReceiver<Command>,
    entries: HashMap<u64, Entry>,
    /// (when, lease id). May hold stale items; each is checked against the entry when it fires.
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    in_flight: FuturesUnordered<BoxFuture<'static, BatchResult>>,
}

impl Task {
    async fn run(mut self) {
        loop {
            let wake = self.timers.peek().map(|Reverse((at, _))| *at);
            tokio::select! {
                biased;
                cmd = self.rx.recv() => match cmd {
                    Some(cmd) => self.apply(cmd),
                    // Unreachable while the slot holds the sender; exit defensively.
                    None => break,
                },
                Some(done) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.finish_batch(done);
                }
                () = sleep_until_opt(wake) => self.fire_due(),
            }
            if self.entries.is_empty() && self.in_flight.is_empty() && self.try_exit() {
                return;
            }
        }
        self.stats.tasks.fetch_sub(1, Ordering::Relaxed);
    }

    /// Exits if no command is queued; see the invariant on `Scheduler::tx`.
    fn try_exit(&mut self) -> bool {
        let mut slot = self
            .slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !self.rx.is_empty() {
            return false;
        }
        *slot = None;
        self.stats.tasks.fetch_sub(1, Ordering::Relaxed);
        true
    }

    fn apply(&mut self, cmd: Command) {
        match cmd {
            Command::Add(lease, sent) => {
                let id = lease.id;
                let entry = Entry {
                    next_renew: sent + lease.plan.renew_interval,
                    lease,
                    last_ok: sent,
                    in_flight: false,
                };
                self.timers.push(Reverse((entry.next_event(), id)));
                self.entries.insert(id, entry);
            }
            Command::Renewed(id, sent) => {
                if let Some(e) = self.entries.get_mut(&id)
                    && sent > e.last_ok
                {
                    e.last_ok = sent;
                    e.next_renew = sent + e.lease.plan.renew_interval;
                    self.timers.push(Reverse((e.next_event(), id)));
                }
            }
            Command::Remove(id) => self.drop_entry(id),
        }
    }

    fn drop_entry(&mut self, id: u64) {
        if self.entries.remove(&id).is_some() {
            self.stats.active.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Handles every timer that is due: ends leases past their deadline, and sends the leases
    /// due for renewal in batches.
    fn fire_due(&mut self) {
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(&Reverse((at, id))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(e) = self.entries.get_mut(&id) else {
                continue;
            };
            if e.lease.end_cause().is_some() {
                self.drop_entry(id);
                continue;
            }
            if now >= e.deadline() {
                let reason = e.reason_at_deadline();
                e.lease.end(LeaseEnd::Lost(reason));
                self.drop_entry(id);
                continue;
            }
            if e.lease.plan.auto_renew && !e.in_flight && now >= e.next_renew {
                e.in_flight = true;
                due.push(id);
            }
            // Otherwise the item is stale: whenever an entry's next event changes, a timer for
            // it is pushed, so a newer item for this entry is already in the heap.
        }
        for chunk in due.chunks(MAX_BATCH) {
            self.send_batch(chunk, now);
        }
        // Every live entry keeps a timer for its next event.
        for id in due {
            if let Some(e) = self.entries.get(&id) {
                self.timers.push(Reverse((e.deadline(), id)));
            }
        }
    }

    fn send_batch(&mut self, ids: &[u64], now: Instant) {
        let mut timeout = None::<std::time::Duration>;
        let mut batch = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(e) = self.entries.get(id) else {
                continue;
            };
            let plan = &e.lease.plan;
            // Never wait for an answer past the deadline: by then the lease is ended anyway.
            let bound = plan.request_timeout.min(e.deadline() - now);
            timeout = Some(timeout.map_or(bound, |t| t.min(bound)));
            batch.push(RenewRequest {
                name: e.lease.name.clone(),
                holder: e.lease.holder,
                ttl: plan.ttl,
            });
        }
        let Some(timeout) = timeout else {
            return;
        };
        let backend = self.backend.clone();
        let ids = ids.to_vec();
        self.in_flight.push(Box::pin(async move {
            let sent = Instant::now();
            let answer = tokio::time::timeout(timeout, backend.renew_many(&batch))
                .await
                .map_err(|_| BackendError::timeout("renewal batch", timeout));
            (ids, sent, answer)
        }));
    }

    fn finish_batch(&mut self, (ids, sent, answer): BatchResult) {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let answers: Vec<Result<Renewed, BackendError>> = match answer {
            Ok(list) if list.len() == ids.len() => list,
            Ok(list) => {
                let e = BackendError::new(
                    crate::backend::BackendErrorKind::Protocol,
                    format!(
                        "renew_many answered {} of {} renewals",
                        list.len(),
                        ids.len()
                    ),
                );
                vec![Err(e); ids.len()]
            }
            Err(e) => vec![Err(e); ids.len()],
        };
        for (id, answer) in ids.into_iter().zip(answers) {
            let Some(e) = self.entries.get_mut(&id) else {
                continue;
            };
            e.in_flight = false;
            match answer {
                Ok(Renewed::Held) => {
                    self.stats.renewals.fetch_add(1, Ordering::Relaxed);
                    e.lease.renewed(sent);
                    if sent > e.last_ok {
                        e.last_ok = sent;
                    }
                    e.next_renew = sent + e.lease.plan.renew_interval;
                }
                Ok(Renewed::NotHeld) => {
                    e.lease.end(LeaseEnd::Lost(LostReason::NotHeld));
                    self.drop_entry(id);
                    continue;
                }
                Err(err) if err.is_transient() => {
                    tracing::debug!(lock = %e.lease.name, error = %err, "renewal failed; retrying");
                    e.next_renew = now + e.lease.plan.jittered_retry();
                }
                Err(err) => {
                    e.lease.end(LeaseEnd::Lost(LostReason::Backend(err)));
                    self.drop_entry(id);
                    continue;
                }
            }
            self.timers.push(Reverse((e.next_event(), id)));
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
