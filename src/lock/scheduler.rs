//! Keeps every lease of a [`Locker`](super::Locker) alive from one task: renews leases as they
//! fall due, batching those due together into one `renew_many`, and ends leases whose renew
//! deadline or validity passes.
//!
//! One task and one timer heap serve all leases of a locker, so N held leases cost one task and
//! O(N) memory, never a task per lease. The task starts with the first lease and exits
//! [`LINGER`] after the last one ends (so a locker taking one lease after another does not
//! start a task per lease). It never waits on the store inside its loop: renewal batches are
//! in-flight futures polled beside the timer, so one slow batch cannot delay another lease's
//! deadline.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;

use super::lease::LeaseShared;
use super::{LeaseEnd, LostReason};
use crate::backend::{Backend, BackendError, HolderToken, RenewRequest, Renewed};

/// The most renewals sent in one `renew_many` call; larger due sets are split.
const MAX_BATCH: usize = 4096;

/// How long the task stays after its last lease ended, waiting for the next one.
pub(crate) const LINGER: Duration = Duration::from_secs(1);

/// The scheduler of one locker: a lazily started task and the channel to it.
pub(crate) struct Scheduler {
    backend: Arc<dyn Backend>,
    /// `Some` while a scheduler task runs. Sends happen under this lock, and the task clears it
    /// under this lock only when it has no leases and no queued command, so no command is ever
    /// sent to a task that is exiting.
    tx: Arc<Mutex<Option<mpsc::UnboundedSender<Command>>>>,
    slots: Arc<Mutex<Slots>>,
    stats: Arc<Stats>,
}

/// Identifies a lease to the scheduler: a slot in its entry table, reused after the lease is
/// gone, and an id that is never reused, so a late command about an ended lease can never
/// touch the lease that took its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseKey {
    slot: u32,
    id: u64,
}

/// Hands out entry-table slots, densely: leases acquired together sit together in memory, so
/// firing a burst of them walks the table in order instead of hopping around a hash map.
#[derive(Default)]
struct Slots {
    free: Vec<u32>,
    next_slot: u32,
    next_id: u64,
}

impl Slots {
    fn take(&mut self) -> LeaseKey {
        self.next_id += 1;
        let slot = self.free.pop().unwrap_or_else(|| {
            self.next_slot += 1;
            self.next_slot - 1
        });
        LeaseKey {
            slot,
            id: self.next_id,
        }
    }
}

#[derive(Default)]
pub(crate) struct Stats {
    pub active: AtomicUsize,
    /// Entries in the task's map: `active` once the task has caught up with its commands.
    pub tracked: AtomicUsize,
    pub tasks: AtomicUsize,
    pub renewals: AtomicU64,
    pub batches: AtomicU64,
}

enum Command {
    Add(Arc<LeaseShared>, Instant),
    Renewed(LeaseKey, Instant),
    Remove(LeaseKey),
}

impl Scheduler {
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            tx: Arc::default(),
            slots: Arc::default(),
            stats: Arc::default(),
        }
    }

    /// A key for a lease about to be added.
    pub fn key(&self) -> LeaseKey {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
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
    pub fn renewed(&self, key: LeaseKey, sent: Instant) {
        self.send(Command::Renewed(key, sent), false);
    }

    /// Stops tracking a lease (released or orphaned).
    pub fn remove(&self, key: LeaseKey) {
        self.send(Command::Remove(key), false);
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
            slots: self.slots.clone(),
            stats: self.stats.clone(),
            rx,
            entries: Vec::new(),
            timers: Timers::new(),
            in_flight: FuturesUnordered::new(),
            exited: false,
        };
        tokio::spawn(task.run());
    }
}

/// What the scheduler keeps per lease. The fields the hot paths read are copied out of the
/// shared lease state, so that firing timers for many leases touches this map and the timer
/// heap only, not one scattered allocation per lease.
struct Entry {
    id: u64,
    lease: Arc<LeaseShared>,
    name: Arc<str>,
    holder: HolderToken,
    /// When the last successful acquire or renewal of this lease was sent.
    last_ok: Instant,
    next_renew: Instant,
    ttl: Duration,
    renew_interval: Duration,
    renew_deadline: Duration,
    request_timeout: Duration,
    auto_renew: bool,
    in_flight: bool,
}

impl Entry {
    /// The instant the lease ends unless a renewal succeeds first.
    fn deadline(&self) -> Instant {
        self.last_ok + self.renew_deadline
    }

    /// When the scheduler must look at this lease again. While a renewal is in flight that is
    /// when its answer arrives: the batch's timeout never extends past this lease's deadline.
    fn next_event(&self) -> Option<Instant> {
        match (self.in_flight, self.auto_renew) {
            (true, _) => None,
            (false, true) => Some(self.next_renew.min(self.deadline())),
            (false, false) => Some(self.deadline()),
        }
    }

    fn reason_at_deadline(&self) -> LostReason {
        if self.auto_renew {
            LostReason::RenewDeadline
        } else {
            LostReason::Expired
        }
    }
}

/// When to look at which lease, in buckets of one millisecond.
///
/// Timers are rounded *up* to the next millisecond, so a bucket never fires early, and leases
/// that fall due together share a bucket: firing 100,000 of them is one map operation and a
/// walk over a vector, not 100,000 heap pops. Firing up to a millisecond late is harmless:
/// renewals happen long before deadlines, and a lease handle judges its own deadline exactly
/// from its clock. Buckets may hold stale ids; each is checked against its entry when it fires.
struct Timers {
    base: Instant,
    buckets: BTreeMap<Instant, Vec<LeaseKey>>,
}

impl Timers {
    const GRANULARITY: Duration = Duration::from_millis(1);

    fn new() -> Self {
        Self {
            base: Instant::now(),
            buckets: BTreeMap::new(),
        }
    }

    fn push(&mut self, at: Instant, key: LeaseKey) {
        let offset = at.saturating_duration_since(self.base).as_nanos();
        let step = Self::GRANULARITY.as_nanos();
        let ticks = offset.div_ceil(step);
        let when = self.base + Self::GRANULARITY * u32::try_from(ticks).unwrap_or(u32::MAX);
        self.buckets.entry(when).or_default().push(key);
    }

    fn next(&self) -> Option<Instant> {
        self.buckets.first_key_value().map(|(at, _)| *at)
    }

    /// Removes and returns the keys of every bucket due at `now`.
    fn take_due(&mut self, now: Instant) -> Vec<LeaseKey> {
        let mut due = Vec::new();
        while let Some(entry) = self.buckets.first_entry() {
            if *entry.key() > now {
                break;
            }
            let keys = entry.remove();
            if due.is_empty() {
                due = keys;
            } else {
                due.extend(keys);
            }
        }
        due
    }
}

type BatchResult = (
    Vec<LeaseKey>,
    Instant,
    Result<Vec<Result<Renewed, BackendError>>, BackendError>,
);

struct Task {
    backend: Arc<dyn Backend>,
    slot: Arc<Mutex<Option<mpsc::UnboundedSender<Command>>>>,
    slots: Arc<Mutex<Slots>>,
    stats: Arc<Stats>,
    rx: mpsc::UnboundedReceiver<Command>,
    /// Indexed by `LeaseKey::slot`.
    entries: Vec<Option<Entry>>,
    timers: Timers,
    in_flight: FuturesUnordered<BoxFuture<'static, BatchResult>>,
    /// Set when the task leaves through `try_exit`; any other way out is a failure.
    exited: bool,
}

/// The task is dropped without having exited normally when it panicked or its runtime is
/// shutting down. Then no lease it tracks can be renewed any more: end them all now, so every
/// holder learns it at once instead of at its deadline, and let the next lease start a new task.
impl Drop for Task {
    fn drop(&mut self) {
        if self.exited {
            return;
        }
        *self
            .slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        self.stats.tasks.fetch_sub(1, Ordering::Relaxed);
        let panicked = std::thread::panicking();
        for entry in self.entries.drain(..).flatten() {
            entry
                .lease
                .end(LeaseEnd::Lost(LostReason::RenewalStopped { panicked }));
            self.stats.active.fetch_sub(1, Ordering::Relaxed);
            self.stats.tracked.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Task {
    async fn run(mut self) {
        // Set while nothing is tracked or in flight: when the task may exit.
        let mut idle_until: Option<Instant> = None;
        loop {
            let wake = self.timers.next();
            tokio::select! {
                biased;
                cmd = self.rx.recv() => match cmd {
                    Some(cmd) => self.apply(cmd),
                    // Unreachable while the slot holds the sender; `Drop` cleans up.
                    None => return,
                },
                Some(done) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.finish_batch(done);
                }
                () = sleep_until_opt(wake) => self.fire_due(),
                () = sleep_until_opt(idle_until) => {
                    if self.try_exit() {
                        return;
                    }
                }
            }
            idle_until = if self.is_empty() && self.in_flight.is_empty() {
                idle_until.or_else(|| Some(Instant::now() + LINGER))
            } else {
                None
            };
        }
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
        self.exited = true;
        true
    }

    fn entry(&self, key: LeaseKey) -> Option<&Entry> {
        self.entries
            .get(key.slot as usize)
            .and_then(Option::as_ref)
            .filter(|e| e.id == key.id)
    }

    fn entry_mut(&mut self, key: LeaseKey) -> Option<&mut Entry> {
        self.entries
            .get_mut(key.slot as usize)
            .and_then(Option::as_mut)
            .filter(|e| e.id == key.id)
    }

    fn schedule(&mut self, key: LeaseKey) {
        if let Some(at) = self.entry(key).and_then(Entry::next_event) {
            self.timers.push(at, key);
        }
    }

    fn apply(&mut self, cmd: Command) {
        match cmd {
            Command::Add(lease, sent) => {
                let key = lease.key;
                let plan = lease.plan;
                let entry = Entry {
                    id: key.id,
                    name: lease.name.clone(),
                    holder: lease.holder,
                    lease,
                    last_ok: sent,
                    next_renew: sent + plan.renew_interval,
                    ttl: plan.ttl,
                    renew_interval: plan.renew_interval,
                    renew_deadline: plan.renew_deadline,
                    request_timeout: plan.request_timeout,
                    auto_renew: plan.auto_renew,
                    in_flight: false,
                };
                let slot = key.slot as usize;
                if self.entries.len() <= slot {
                    self.entries.resize_with(slot + 1, || None);
                }
                self.entries[slot] = Some(entry);
                self.stats.tracked.fetch_add(1, Ordering::Relaxed);
                self.schedule(key);
            }
            Command::Renewed(key, sent) => {
                if let Some(e) = self.entry_mut(key)
                    && sent > e.last_ok
                {
                    e.last_ok = sent;
                    e.next_renew = sent + e.renew_interval;
                    self.schedule(key);
                }
            }
            Command::Remove(key) => self.drop_entry(key),
        }
    }

    fn drop_entry(&mut self, key: LeaseKey) {
        if self.entry(key).is_none() {
            return;
        }
        self.entries[key.slot as usize] = None;
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .free
            .push(key.slot);
        self.stats.active.fetch_sub(1, Ordering::Relaxed);
        self.stats.tracked.fetch_sub(1, Ordering::Relaxed);
    }

    fn is_empty(&self) -> bool {
        self.stats.tracked.load(Ordering::Relaxed) == 0
    }

    /// Handles every timer that is due: ends leases past their deadline, and sends the leases
    /// due for renewal in batches.
    fn fire_due(&mut self) {
        let now = Instant::now();
        let mut due = Vec::new();
        for key in self.timers.take_due(now) {
            // Released and orphaned leases were removed by their command, which is always
            // handled before timers; a missing entry is a stale timer.
            let Some(e) = self.entry_mut(key) else {
                continue;
            };
            if e.in_flight {
                continue;
            }
            if now >= e.deadline() {
                let reason = e.reason_at_deadline();
                e.lease.end(LeaseEnd::Lost(reason));
                self.drop_entry(key);
                continue;
            }
            if e.auto_renew && now >= e.next_renew {
                e.in_flight = true;
                due.push(key);
            }
            // Otherwise the timer is stale: whenever an entry's next event changes, a timer
            // for it is pushed, so a newer one for this entry is already scheduled.
        }
        for chunk in due.chunks(MAX_BATCH) {
            self.send_batch(chunk, now);
        }
    }

    fn send_batch(&mut self, keys: &[LeaseKey], now: Instant) {
        let mut timeout = None::<Duration>;
        let mut batch = Vec::with_capacity(keys.len());
        for &key in keys {
            let Some(e) = self.entry(key) else {
                continue;
            };
            // Never wait for an answer past a deadline: the lease must be looked at by then.
            let bound = e.request_timeout.min(e.deadline() - now);
            timeout = Some(timeout.map_or(bound, |t| t.min(bound)));
            batch.push(RenewRequest {
                name: e.name.clone(),
                holder: e.holder,
                ttl: e.ttl,
            });
        }
        let Some(timeout) = timeout else {
            return;
        };
        let backend = self.backend.clone();
        let keys = keys.to_vec();
        let span = tracing::debug_span!("renew", leases = batch.len());
        self.in_flight.push(Box::pin(
            async move {
                let sent = Instant::now();
                let answer = tokio::time::timeout(timeout, backend.renew_many(&batch))
                    .await
                    .map_err(|_| BackendError::timeout("renewal batch", timeout));
                (keys, sent, answer)
            }
            .instrument(span),
        ));
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
        let mut renewed = 0;
        for (key, answer) in ids.into_iter().zip(answers) {
            let Some(e) = self.entry_mut(key) else {
                continue;
            };
            e.in_flight = false;
            match answer {
                Ok(Renewed::Held) => {
                    renewed += 1;
                    e.lease.renewed(sent, now - sent);
                    if sent > e.last_ok {
                        e.last_ok = sent;
                    }
                    e.next_renew = sent + e.renew_interval;
                }
                Ok(Renewed::NotHeld) => {
                    e.lease.end(LeaseEnd::Lost(LostReason::NotHeld));
                    self.drop_entry(key);
                    continue;
                }
                Err(err) if err.is_transient() => {
                    tracing::debug!(lock = %e.name, error = %err, "renewal failed; retrying");
                    e.next_renew = now + e.lease.plan.jittered_retry();
                }
                Err(err) => {
                    e.lease.end(LeaseEnd::Lost(LostReason::Backend(err)));
                    self.drop_entry(key);
                    continue;
                }
            }
            if let Some(at) = e.next_event() {
                self.timers.push(at, key);
            }
        }
        self.stats.renewals.fetch_add(renewed, Ordering::Relaxed);
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
