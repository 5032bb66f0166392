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
//!
//! Leases reach the task through a queue it drains whenever it wakes, and it is woken only
//! when it must be: when a new lease falls due in an earlier timer bucket than the one it
//! sleeps until, or when the queue has grown long ([`WAKE_AT`]); it never sleeps more than
//! [`MAX_SLEEP`] (at most the linger) while it tracks leases, so it exits in time after the
//! last one ends without being woken for it. Releasing a lease only queues its removal. So a
//! lease acquired and released between two wake-ups costs two queue entries and no wake-up of
//! the task, which is what keeps a short lock cycle close to the bare backend's cost.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use super::options::Plan;
use super::state::{LeaseKey, LeaseShared};
use super::{LeaseEnd, LostReason};
use crate::backend::{Backend, BackendError, HolderToken, RenewRequest, Renewed};

/// The most renewals sent in one `renew_many` call; larger due sets are split.
const MAX_BATCH: usize = 4096;

/// How long the task stays after its last lease ended, waiting for the next one.
pub(crate) const LINGER: Duration = Duration::from_secs(1);

/// Queued commands at which a sleeping task is woken to take them in, so that the queue (and
/// the lease state its entries keep alive) stays bounded while the task sleeps toward a far
/// timer: one wake-up per ~500 short lock cycles.
const WAKE_AT: usize = 1024;

/// The longest the task sleeps while it tracks leases. At most the linger, so that a task
/// asleep when its last lease ends wakes in time to exit without being woken (see
/// `Scheduler::remove`).
const MAX_SLEEP: Duration = Duration::from_secs(1);
const _: () = assert!(MAX_SLEEP.as_nanos() <= LINGER.as_nanos());

/// Stale timer keys tolerated beyond the live ones before the timers are rebuilt.
const TIMER_SLACK: usize = 4096;

/// The scheduler of one locker: a lazily started task and the queue to it.
pub(crate) struct Scheduler {
    backend: Arc<dyn Backend>,
    shared: Arc<Shared>,
}

/// What the lease handles and the task share.
struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the task; see [`Scheduler::wake`] for when.
    wake: Notify,
    stats: Stats,
}

/// The task's inbox and the slot allocator, under one lock.
///
/// Invariants, all kept under this lock:
/// - `running` is set by the `add` that starts a task and cleared by the task only when it
///   tracks no entry, has no batch in flight and `commands` is empty (`Task::try_sleep`), or
///   by its `Drop`, which ends every lease it had: so no command is ever queued to a task that
///   is exiting, and every tracked lease has an entry in the task's table or an `Add` here.
/// - A lease is untracked ([`LeaseShared::untrack`]) exactly once. A remover untracks it and
///   queues its `Remove` in one critical section, so when the task fails to untrack a lease
///   it wants to end, that lease's `Remove` is already queued and the task leaves the entry
///   to it. Each lease's slot is freed exactly once: by the task when it untracked the lease,
///   otherwise when it applies the `Remove`.
struct Queue {
    running: bool,
    task: TaskState,
    commands: Vec<Command>,
    /// Free entry-table slots.
    free: Vec<u32>,
    next_slot: u32,
    next_id: u64,
    /// When a remover last took away a lease: the linger is measured from the last end.
    last_end: Instant,
}

/// What the task is doing, as producers need to know it to decide whether to wake it.
#[derive(Clone, Copy, Debug)]
enum TaskState {
    /// Working: it takes in the queue again before it sleeps, so nothing needs to wake it.
    Awake,
    /// Sleeping until this instant (a timer bucket, or the end of the linger), or, with
    /// `None`, until a renewal batch answers or it is woken.
    Asleep(Option<Instant>),
}

#[derive(Default)]
pub(crate) struct Stats {
    /// Leases tracked: counted at `add`, uncounted when untracked.
    pub active: AtomicUsize,
    /// Entries in the task's table: `active` once the task has taken in its queue.
    pub tracked: AtomicUsize,
    pub tasks: AtomicUsize,
    pub renewals: AtomicU64,
    pub batches: AtomicU64,
    /// Times the task woke up (ran a round of its loop).
    pub wakeups: AtomicU64,
    /// Timer keys held, live or stale (see `Timers`).
    pub timers: AtomicUsize,
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
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    running: false,
                    task: TaskState::Awake,
                    commands: Vec::new(),
                    free: Vec::new(),
                    next_slot: 0,
                    next_id: 0,
                    last_end: Instant::now(),
                }),
                wake: Notify::new(),
                stats: Stats::default(),
            }),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Starts tracking the lease `lease` builds with the key given to it, acquired by a
    /// request sent at `sent` under `plan`. Key and queue entry are taken under one lock.
    pub fn add(
        &self,
        plan: &Plan,
        sent: Instant,
        lease: impl FnOnce(LeaseKey) -> LeaseShared,
    ) -> Arc<LeaseShared> {
        let first = sent
            + if plan.auto_renew {
                plan.renew_interval.min(plan.renew_deadline)
            } else {
                plan.renew_deadline
            };
        let mut q = self.shared.lock();
        q.next_id += 1;
        let slot = q.free.pop().unwrap_or_else(|| {
            q.next_slot += 1;
            q.next_slot - 1
        });
        let lease = Arc::new(lease(LeaseKey {
            slot,
            id: q.next_id,
        }));
        self.shared.stats.active.fetch_add(1, Ordering::Relaxed);
        q.commands.push(Command::Add(lease.clone(), sent));
        if !q.running {
            self.start(&mut q);
            return lease;
        }
        // The task's timers fire on a grid of `Timers::GRANULARITY`, so a lease due within
        // one step of what the task sleeps until is served by that same wake-up (at most a
        // step late, which `Timers` allows anyway).
        let due_earlier = |at: Instant| first + Timers::GRANULARITY <= at;
        let wake = match q.task {
            TaskState::Awake => false,
            TaskState::Asleep(None) => true,
            TaskState::Asleep(Some(at)) => due_earlier(at) || q.commands.len() >= WAKE_AT,
        };
        self.wake(q, wake);
        lease
    }

    /// A renewal sent at `sent` succeeded outside the scheduler ([`Lease::refresh`](super::Lease::refresh)).
    /// It only moves the lease's events later, so the task need not wake for it.
    pub fn renewed(&self, key: LeaseKey, sent: Instant) {
        let mut q = self.shared.lock();
        if !q.running {
            // No task means no tracked lease: nothing to update.
            return;
        }
        q.commands.push(Command::Renewed(key, sent));
        let wake = matches!(q.task, TaskState::Asleep(_)) && q.commands.len() >= WAKE_AT;
        self.wake(q, wake);
    }

    /// Stops tracking a lease (released, orphaned, or answered "not held" to a refresh).
    /// Idempotent, and a no-op for a lease the task already ended.
    pub fn remove(&self, lease: &LeaseShared) {
        let mut q = self.shared.lock();
        // Under the lock, with the push below: see the invariants on `Queue`. A tracked lease
        // implies a running task, so the first test only guards that invariant.
        if !q.running || !lease.untrack() {
            return;
        }
        q.commands.push(Command::Remove(lease.key));
        let last = self.shared.stats.active.fetch_sub(1, Ordering::Relaxed) == 1;
        // The linger only counts once no lease is left, so only the last end needs the time
        // (one clock read less per lock cycle while others are held).
        if last {
            q.last_end = Instant::now();
        }
        // The entry can wait in the queue for the task's next wake-up, also when this was the
        // last lease: a task asleep with a bound wakes within `MAX_SLEEP` (at most the
        // linger), in time to exit a linger after this end; one asleep without a bound waits
        // for a renewal batch's answer, and cannot exit before that anyway.
        let wake = matches!(q.task, TaskState::Asleep(_)) && q.commands.len() >= WAKE_AT;
        self.wake(q, wake);
    }

    /// Wakes the task if `wake`. The state is set to `Awake` under the lock so that the
    /// producers after this one do not wake it again.
    fn wake(&self, mut q: MutexGuard<'_, Queue>, wake: bool) {
        if wake {
            q.task = TaskState::Awake;
            drop(q);
            self.shared.wake.notify_one();
        }
    }

    fn start(&self, q: &mut Queue) {
        q.running = true;
        q.task = TaskState::Awake;
        let now = Instant::now();
        q.last_end = now;
        self.shared.stats.tasks.fetch_add(1, Ordering::Relaxed);
        let task = Task {
            backend: self.backend.clone(),
            shared: self.shared.clone(),
            inbox: Vec::new(),
            entries: Vec::new(),
            freed: Vec::new(),
            timers: Timers::new(),
            in_flight: FuturesUnordered::new(),
            last_end: now,
            exited: false,
        };
        tokio::spawn(task.run());
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Nothing panics while this lock is held; recover rather than propagate a poison.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
/// from its clock.
///
/// Buckets may hold stale keys: a lease released, or renewed to a later instant, leaves its
/// timer behind (removing it would mean a scan of its bucket, which a burst fills with
/// 100,000 keys). Each key is checked against its entry when it fires; the task drops stale
/// buckets at the front before it sleeps ([`Task::next_live_timer`]), so it never wakes for
/// one, and rebuilds the whole set once stale keys outnumber live ones
/// ([`Task::bound_timers`]), so a locker cycling short locks under a long ttl holds timers
/// for the leases it tracks, not for every lease of the last ttl.
struct Timers {
    base: Instant,
    buckets: BTreeMap<Instant, Vec<LeaseKey>>,
    /// Keys in `buckets`.
    len: usize,
}

impl Timers {
    const GRANULARITY: Duration = Duration::from_millis(1);

    fn new() -> Self {
        Self {
            base: Instant::now(),
            buckets: BTreeMap::new(),
            len: 0,
        }
    }

    fn push(&mut self, at: Instant, key: LeaseKey) {
        let offset = at.saturating_duration_since(self.base).as_nanos();
        let step = Self::GRANULARITY.as_nanos();
        let ticks = offset.div_ceil(step);
        let when = self.base + Self::GRANULARITY * u32::try_from(ticks).unwrap_or(u32::MAX);
        self.buckets.entry(when).or_default().push(key);
        self.len += 1;
    }

    fn next(&self) -> Option<Instant> {
        self.buckets.first_key_value().map(|(at, _)| *at)
    }

    /// Forgets every timer (when no entry is left, all of them are stale).
    fn clear(&mut self) {
        self.buckets.clear();
        self.len = 0;
    }

    /// Removes and returns the keys of every bucket due at `now`.
    fn take_due(&mut self, now: Instant) -> Vec<LeaseKey> {
        let mut due = Vec::new();
        while let Some(entry) = self.buckets.first_entry() {
            if *entry.key() > now {
                break;
            }
            let keys = entry.remove();
            self.len -= keys.len();
            if due.is_empty() {
                due = keys;
            } else {
                due.extend(keys);
            }
        }
        due
    }
}

/// The entry `key` names, unless its slot went to another lease since.
fn entry_in(entries: &[Option<Entry>], key: LeaseKey) -> Option<&Entry> {
    entries
        .get(key.slot as usize)
        .and_then(Option::as_ref)
        .filter(|e| e.id == key.id)
}

/// What the task does after a round of work.
enum Next {
    Exit,
    /// Commands were queued meanwhile: take them in first.
    TakeIn,
    /// Sleep until this instant (`None`: until a batch answers or a producer wakes it).
    Sleep(Option<Instant>),
}

type BatchResult = (
    Vec<LeaseKey>,
    Instant,
    Result<Vec<Result<Renewed, BackendError>>, BackendError>,
);

struct Task {
    backend: Arc<dyn Backend>,
    shared: Arc<Shared>,
    /// The commands being applied; swapped with the queue's buffer, so both keep capacity.
    inbox: Vec<Command>,
    /// Indexed by `LeaseKey::slot`.
    entries: Vec<Option<Entry>>,
    /// Slots freed since the queue was last locked, handed back to it then.
    freed: Vec<u32>,
    timers: Timers,
    in_flight: FuturesUnordered<BoxFuture<'static, BatchResult>>,
    /// When the task last ended a lease itself; `Queue::last_end` has the removers' ends.
    last_end: Instant,
    /// Set when the task leaves through `try_sleep`; any other way out is a failure.
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
        let panicked = std::thread::panicking();
        let stats = &self.shared.stats;
        // Under the lock throughout, so no remover untracks a lease between `running` being
        // cleared and this loop (see the invariants on `Queue`).
        let mut q = self.shared.lock();
        q.running = false;
        q.task = TaskState::Awake;
        stats.tasks.fetch_sub(1, Ordering::Relaxed);
        let pending = std::mem::take(&mut q.commands);
        q.free.append(&mut self.freed);
        let entries = self.entries.drain(..).flatten().map(|e| e.lease);
        let added = pending.iter().filter_map(|c| match c {
            Command::Add(lease, _) if lease.is_tracked() => Some(lease.clone()),
            _ => None,
        });
        for lease in entries.chain(added) {
            if lease.untrack() {
                lease.end(LeaseEnd::Lost(LostReason::RenewalStopped { panicked }));
                stats.active.fetch_sub(1, Ordering::Relaxed);
                q.free.push(lease.key.slot);
            }
            // Otherwise its `Remove` is among `pending`, which frees the slot below.
        }
        for c in &pending {
            if let Command::Remove(key) = c {
                q.free.push(key.slot);
            }
        }
        stats.tracked.store(0, Ordering::Relaxed);
    }
}

impl Task {
    async fn run(mut self) {
        loop {
            self.shared.stats.wakeups.fetch_add(1, Ordering::Relaxed);
            self.take_in();
            let now = Instant::now();
            if self.timers.next().is_some_and(|at| at <= now) {
                self.fire_due(now);
            }
            let wake_at = match self.try_sleep(now) {
                Next::Exit => return,
                // Commands arrived meanwhile: take them in before sleeping.
                Next::TakeIn => continue,
                Next::Sleep(until) => until,
            };
            tokio::select! {
                biased;
                () = self.shared.wake.notified() => {}
                Some(done) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.finish_batch(done);
                }
                () = crate::util::sleep_until_opt(wake_at) => {}
            }
        }
    }

    /// Applies every queued command.
    fn take_in(&mut self) {
        let mut inbox = std::mem::take(&mut self.inbox);
        {
            let mut q = self.shared.lock();
            std::mem::swap(&mut q.commands, &mut inbox);
            q.task = TaskState::Awake;
            q.free.append(&mut self.freed);
            self.last_end = self.last_end.max(q.last_end);
        }
        for cmd in inbox.drain(..) {
            self.apply(cmd);
        }
        self.bound_timers();
        // A burst (100,000 leases acquired at once) must not pin its queue's size for good.
        if inbox.capacity() > 4 * WAKE_AT {
            inbox = Vec::new();
        }
        self.inbox = inbox;
    }

    /// Decides what to sleep until and publishes it, or exits.
    ///
    /// Exits only when nothing is tracked, in flight or queued, a [`LINGER`] after the last
    /// lease ended; see the invariants on `Queue`.
    fn try_sleep(&mut self, now: Instant) -> Next {
        let idle = self.is_empty() && self.in_flight.is_empty();
        let next_timer = if idle {
            // Every timer left is stale: drop them rather than wake up for them.
            self.timers.clear();
            None
        } else {
            self.next_live_timer()
        };
        self.shared
            .stats
            .timers
            .store(self.timers.len, Ordering::Relaxed);
        let mut q = self.shared.lock();
        q.free.append(&mut self.freed);
        if !q.commands.is_empty() {
            return Next::TakeIn;
        }
        let wake_at = if idle {
            // The queue is empty, so no lease ended since `take_in` read `last_end`.
            let until = self.last_end.max(q.last_end) + LINGER;
            if now >= until {
                q.running = false;
                self.shared.stats.tasks.fetch_sub(1, Ordering::Relaxed);
                self.exited = true;
                return Next::Exit;
            }
            Some(until)
        } else {
            // At most `MAX_SLEEP` ahead, so a new lease due later than that need not wake
            // the task (see `Scheduler::add`): without the cap, one lease held for hours
            // beside short lock cycles would have every cycle wake it.
            next_timer.map(|at| at.min(now + MAX_SLEEP))
        };
        q.task = TaskState::Asleep(wake_at);
        Next::Sleep(wake_at)
    }

    /// The first bucket holding a key that is due by then, after dropping the stale buckets
    /// before it: a lease acquired and released leaves its timer, and without this a locker
    /// cycling short locks would wake once per millisecond bucket, a ttl later, for nothing.
    /// Each stale key is looked at once here, so this costs O(1) per timer pushed.
    fn next_live_timer(&mut self) -> Option<Instant> {
        let entries = &self.entries;
        // Due by `at`: the entry still exists and its next event (not yet fired, nothing in
        // flight) falls at or before the bucket. A later event has a timer of its own.
        let due_by = |key: LeaseKey, at: Instant| {
            entry_in(entries, key)
                .and_then(Entry::next_event)
                .is_some_and(|next| next <= at)
        };
        while let Some(first) = self.timers.buckets.first_entry() {
            let at = *first.key();
            if first.get().iter().any(|&key| due_by(key, at)) {
                return Some(at);
            }
            self.timers.len -= first.remove().len();
        }
        None
    }

    /// Rebuilds the timers from the entries once stale keys outnumber live ones (plus some
    /// slack), so that they stay O(tracked leases): amortised O(1) per timer pushed.
    fn bound_timers(&mut self) {
        let live = self.shared.stats.tracked.load(Ordering::Relaxed);
        if self.timers.len <= 2 * live + TIMER_SLACK {
            return;
        }
        self.timers.clear();
        for (slot, entry) in self.entries.iter().enumerate() {
            // Slots are handed out as u32, so the conversion holds for every entry.
            let (Some(entry), Ok(slot)) = (entry, u32::try_from(slot)) else {
                continue;
            };
            if let Some(at) = entry.next_event() {
                self.timers.push(at, LeaseKey { slot, id: entry.id });
            }
        }
    }

    fn entry(&self, key: LeaseKey) -> Option<&Entry> {
        entry_in(&self.entries, key)
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
                if !lease.is_tracked() {
                    // Released before the task looked: its `Remove` follows in the queue and
                    // frees the slot. Nothing to schedule.
                    return;
                }
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
                self.shared.stats.tracked.fetch_add(1, Ordering::Relaxed);
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
            Command::Remove(key) => {
                // The remover untracked the lease; its entry exists unless the `Add` was
                // skipped. Either way this frees the slot, once (see `Queue`).
                if self.entry(key).is_some() {
                    self.entries[key.slot as usize] = None;
                    self.shared.stats.tracked.fetch_sub(1, Ordering::Relaxed);
                }
                self.freed.push(key.slot);
            }
        }
    }

    /// Ends a lease the task found lost, unless a remover untracked it first (then its
    /// `Remove` is queued and drops the entry).
    fn end_entry(&mut self, key: LeaseKey, cause: LeaseEnd) {
        let Some(e) = self.entry(key) else {
            return;
        };
        if !e.lease.untrack() {
            return;
        }
        if let Some(e) = self.entries[key.slot as usize].take() {
            e.lease.end(cause);
        }
        self.freed.push(key.slot);
        self.last_end = Instant::now();
        self.shared.stats.active.fetch_sub(1, Ordering::Relaxed);
        self.shared.stats.tracked.fetch_sub(1, Ordering::Relaxed);
    }

    fn is_empty(&self) -> bool {
        self.shared.stats.tracked.load(Ordering::Relaxed) == 0
    }

    /// Handles every timer that is due: ends leases past their deadline, and sends the leases
    /// due for renewal in batches.
    fn fire_due(&mut self, now: Instant) {
        let mut due = Vec::new();
        for key in self.timers.take_due(now) {
            // Removed leases were dropped by their command, taken in before timers fire; a
            // missing entry is a stale timer.
            let Some(e) = self.entry_mut(key) else {
                continue;
            };
            if e.in_flight {
                continue;
            }
            if now >= e.deadline() {
                let reason = e.reason_at_deadline();
                self.end_entry(key, LeaseEnd::Lost(reason));
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
        self.shared.stats.batches.fetch_add(1, Ordering::Relaxed);
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
                    e.lease.renewed(sent, now);
                    if sent > e.last_ok {
                        e.last_ok = sent;
                    }
                    e.next_renew = sent + e.renew_interval;
                }
                Ok(Renewed::NotHeld) => {
                    self.end_entry(key, LeaseEnd::Lost(LostReason::NotHeld));
                    continue;
                }
                Err(err) if err.is_transient() => {
                    tracing::debug!(lock = %e.name, error = %err, "renewal failed; retrying");
                    e.next_renew = now + e.lease.plan.jittered_retry();
                }
                Err(err) => {
                    self.end_entry(key, LeaseEnd::Lost(LostReason::Backend(err)));
                    continue;
                }
            }
            if let Some(at) = e.next_event() {
                self.timers.push(at, key);
            }
        }
        self.shared
            .stats
            .renewals
            .fetch_add(renewed, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockOptions;
    use crate::backend::FencingToken;
    use crate::backend::memory::MemoryBackend;

    fn add(scheduler: &Scheduler, name: &str) -> Arc<LeaseShared> {
        let plan = LockOptions::new().plan(false).expect("valid");
        let sent = Instant::now();
        scheduler.add(&plan, sent, |key| {
            LeaseShared::new(
                key,
                name.into(),
                HolderToken::random(),
                FencingToken::new(1),
                plan,
                sent,
            )
        })
    }

    /// Slots index the task's entry table: held leases get distinct ones, densely from 0, and
    /// a freed slot is reused; ids are never reused, so a late command about an ended lease
    /// cannot touch the lease that took its slot.
    #[tokio::test(start_paused = true)]
    async fn keys_reuse_slots_densely_and_never_ids() {
        let scheduler = Scheduler::new(Arc::new(MemoryBackend::new()));
        let a = add(&scheduler, "a");
        let b = add(&scheduler, "b");
        assert_eq!((a.key.slot, b.key.slot), (0, 1));
        assert_ne!(a.key.id, b.key.id);
        scheduler.remove(&a);
        // The task frees the slot when it applies the removal.
        while scheduler.stats().tracked.load(Ordering::Relaxed) != 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let c = add(&scheduler, "c");
        assert_eq!(c.key.slot, a.key.slot, "the freed slot is reused");
        assert!(
            c.key.id > b.key.id,
            "ids only grow: {:?} after {:?}",
            c.key,
            b.key
        );
    }
}
