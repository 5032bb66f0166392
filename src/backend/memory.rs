//! An in-process lease store with the same semantics as the networked backends.
//!
//! For tests and development: ttl expiry, holder-token ownership, a fencing counter, replayed
//! acquires and releases, and release notifications, all driven by tokio's clock so that tests
//! on a paused clock (`tokio::time::pause`, feature `test-util`) run thousands of virtual seconds in milliseconds.
//! It gives no exclusion across processes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::{BoxFuture, ready};
use futures::stream::BoxStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{
    AcquireRequest, Acquired, Backend, BackendError, Completion, CompletionCheck, CompletionRead,
    FencingToken, GroupRead, GroupRecord, GroupVersion, Handoff, HolderChange, HolderToken,
    InvalidName, LeaseRecord, Member, Released, Renewed,
};

/// Fencing tokens of the memory backend come from one process-wide counter, so they rise
/// across every `MemoryBackend` instance and every lock name in the process.
static NEXT_FENCING: AtomicU64 = AtomicU64::new(1);

/// How long a release is remembered so that a replayed release still reports success.
const RELEASE_ACK_TTL: Duration = Duration::from_secs(60);
/// At most this many remembered releases per lock.
const RELEASE_ACKS_KEPT: usize = 8;
/// The longest lock name accepted.
pub const MAX_NAME_LEN: usize = 512;

/// An in-process lease store.
///
/// Clones share the same state. Tokens come from a process-wide counter
/// ([`with_own_tokens`](Self::with_own_tokens): from the store's own).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tenure::backend::memory::MemoryBackend;
/// use tenure::{LockOptions, Locker};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tenure::LockError> {
/// let locker = Locker::new(MemoryBackend::new());
/// let lease = locker.try_acquire("report", &LockOptions::new()).await?;
/// // A second attempt, even from the same locker, finds the lock busy.
/// assert!(locker.try_acquire("report", &LockOptions::new()).await.is_err());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryBackend {
    // Ordered maps: a wipe notifies observers in one order every run (deterministic
    // simulation replays byte for byte).
    state: Arc<Mutex<BTreeMap<Arc<str>, Slot>>>,
    groups: Arc<Mutex<BTreeMap<Arc<str>, Group>>>,
    /// The store's own fencing counter; `None`: the process-wide one.
    tokens: Option<Arc<AtomicU64>>,
    /// The store's clock for completion records: the wall clock (ms) read once, at the first
    /// check, then advanced by tokio's clock, so it moves with a paused test clock.
    clock: Arc<std::sync::OnceLock<(u64, Instant)>>,
}

/// The members of one group, each until its announcement expires; observers are told of
/// every announcement and withdrawal (expiries they compute from the instants).
struct Group {
    members: BTreeMap<String, (Member, Instant)>,
    changed: watch::Sender<()>,
    /// The group record's stored text; its version is the text itself, since every change
    /// of a record changes its text (the generation rises or draining ends).
    record: Option<String>,
}

impl Default for Group {
    fn default() -> Self {
        Self {
            members: BTreeMap::new(),
            changed: watch::channel(()).0,
            record: None,
        }
    }
}

impl Group {
    /// The members live at `now`, sorted by identity, and the next instant one expires.
    fn live(&self, now: Instant) -> (Vec<Member>, Option<Instant>) {
        let live = self.members.values().filter(|(_, until)| *until > now);
        let next = live.clone().map(|(_, until)| *until).min();
        (live.map(|(m, _)| m.clone()).collect(), next)
    }
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("locks", &self.locked().len())
            .finish()
    }
}

#[derive(Default)]
struct Slot {
    held: Option<Held>,
    transitions: u64,
    /// Holder tokens that released recently, so a replayed release still succeeds.
    acks: VecDeque<(HolderToken, Instant)>,
    /// Created on the first `observe`; every grant and release is published to it.
    notify: Option<watch::Sender<HolderChange>>,
    /// A hand-over asked for or made (`request_handoff`, `release_to`), until its window ends
    /// or the next grant.
    handoff: Option<(Handoff, Instant)>,
    /// The latest term's fencing token (kept after its release): a completion is recorded
    /// only by that term.
    latest: Option<FencingToken>,
    /// The run-once job's completion record, as stored text.
    completion: Option<String>,
}

struct Held {
    holder: HolderToken,
    identity: Arc<str>,
    fencing: FencingToken,
    expires_at: Instant,
}

impl Slot {
    /// The current holder, if its lease has not run out at `now`.
    fn live(&self, now: Instant) -> Option<&Held> {
        self.held.as_ref().filter(|h| h.expires_at > now)
    }

    /// The hand-over preference still in its window at `now`.
    fn handoff(&self, now: Instant) -> Option<&Handoff> {
        self.handoff
            .as_ref()
            .filter(|(_, until)| *until > now)
            .map(|(h, _)| h)
    }

    fn publish(&self) {
        if let Some(tx) = &self.notify {
            let change = self
                .held
                .as_ref()
                .map_or_else(HolderChange::free, |h| HolderChange {
                    holder: Some(h.identity.to_string()),
                    fencing: Some(h.fencing),
                });
            tx.send_replace(change);
        }
    }
}

impl MemoryBackend {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose fencing tokens come from a counter of its own, starting at 1,
    /// instead of the process-wide one: two such stores fed the same requests hand out the
    /// same tokens, whatever else ran in the process (deterministic simulation).
    #[must_use]
    pub fn with_own_tokens() -> Self {
        Self {
            tokens: Some(Arc::new(AtomicU64::new(1))),
            ..Self::default()
        }
    }

    /// The next fencing token, from this store's counter or the process-wide one.
    fn next_token(&self) -> FencingToken {
        let counter = self.tokens.as_deref().unwrap_or(&NEXT_FENCING);
        FencingToken::new(counter.fetch_add(1, Ordering::Relaxed))
    }

    fn locked(&self) -> MutexGuard<'_, BTreeMap<Arc<str>, Slot>> {
        // A panic while holding this lock can only come from a bug in the few lines below
        // that never panic; the state stays consistent either way, so recover it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The store's clock in milliseconds since the Unix epoch: the wall clock read at the
    /// first call, advanced by tokio's clock since.
    fn clock_ms(&self) -> u64 {
        let (wall, at) = *self.clock.get_or_init(|| {
            let wall = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            (wall, Instant::now())
        });
        wall.saturating_add(u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    fn groups(&self) -> MutexGuard<'_, BTreeMap<Arc<str>, Group>> {
        // As `locked`: nothing panics while this lock is held.
        self.groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn acquire_now(&self, req: &AcquireRequest) -> Acquired {
        let now = Instant::now();
        let mut locks = self.locked();
        let slot = locks.entry(req.name.clone()).or_default();
        match slot.live(now) {
            Some(h) if h.holder == req.holder => {
                // A replay by the current holder: the original grant, with the ttl restarted
                // from now so the caller's validity (measured from its latest send) is safe.
                let fencing = h.fencing;
                if let Some(h) = slot.held.as_mut() {
                    h.expires_at = now + req.ttl;
                }
                Acquired::Granted { fencing }
            }
            Some(h) => Acquired::Busy {
                holder: Some(h.identity.to_string()),
                remaining: Some(h.expires_at - now),
            },
            // Free, but handed to another replica whose window still runs.
            None if slot.handoff(now).is_some_and(|p| p.excludes(&req.identity)) => {
                let (target, until) = slot.handoff.as_ref().map_or((None, now), |(h, until)| {
                    (h.target().map(str::to_owned), *until)
                });
                Acquired::Busy {
                    holder: target,
                    remaining: Some(until - now),
                }
            }
            None => {
                slot.handoff = None;
                let fencing = self.next_token();
                slot.held = Some(Held {
                    holder: req.holder,
                    identity: req.identity.clone(),
                    fencing,
                    expires_at: now + req.ttl,
                });
                slot.transitions += 1;
                slot.latest = Some(fencing);
                slot.publish();
                Acquired::Granted { fencing }
            }
        }
    }

    fn renew_now(&self, name: &str, holder: &HolderToken, ttl: Duration) -> Renewed {
        renew_in(&mut self.locked(), Instant::now(), name, holder, ttl)
    }

    /// Releases `name` if `holder` holds it and, when `identity` is given, under that
    /// identity (`release_as`: then a replay counts as not held); with `to`, only that
    /// identity may take it until the window ends (`release_to`).
    fn release_now(
        &self,
        name: &str,
        holder: &HolderToken,
        identity: Option<&str>,
        to: Option<(&str, Duration)>,
    ) -> Released {
        let now = Instant::now();
        let mut locks = self.locked();
        let Some(slot) = locks.get_mut(name) else {
            return Released::NotHeld;
        };
        slot.acks
            .retain(|(_, at)| now.duration_since(*at) < RELEASE_ACK_TTL);
        if identity.is_none() && slot.acks.iter().any(|(t, _)| t == holder) {
            return Released::Released;
        }
        match slot.live(now) {
            Some(h) if h.holder == *holder && identity.is_none_or(|i| *h.identity == *i) => {
                slot.held = None;
                if let Some((who, window)) = to {
                    slot.handoff = Some((Handoff::To(who.to_owned()), now + window));
                }
                if slot.acks.len() == RELEASE_ACKS_KEPT {
                    slot.acks.pop_front();
                }
                slot.acks.push_back((*holder, now));
                slot.publish();
                Released::Released
            }
            _ => Released::NotHeld,
        }
    }

    fn inspect_now(&self, name: &str) -> Option<LeaseRecord> {
        let now = Instant::now();
        let locks = self.locked();
        let slot = locks.get(name)?;
        slot.live(now).map(|h| LeaseRecord {
            identity: h.identity.to_string(),
            fencing: h.fencing,
            remaining: Some(h.expires_at - now),
            transitions: Some(slot.transitions.saturating_sub(1)),
            handoff: slot.handoff(now).cloned(),
            preferred_holder: false,
        })
    }

    /// Grants the lease `name` to `identity` now, whoever holds it, with a new fencing token
    /// and a ttl of `ttl`: another replica winning the lease while this one still believes it
    /// holds it, as after a partition or a pause longer than the lease. For tests of what a
    /// workload does in a split brain.
    ///
    /// The holder that was robbed learns it at its next renewal, which the store answers
    /// "not held": its lease ends, and a [`LeaderElector`](crate::election::LeaderElector)
    /// cancels the term and drops the workload at once. Until then its writes carry the old,
    /// lower fencing token, which [`crate::fence`] refuses.
    ///
    /// Returns the thief's fencing token.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tenure::backend::memory::MemoryBackend;
    /// use tenure::election::{ElectionConfig, LeaderElector};
    /// use tenure::Locker;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tenure::election::ElectionError> {
    /// let store = MemoryBackend::new();
    /// let elector = LeaderElector::new(
    ///     Locker::with_identity(store.clone(), "pod-a")?,
    ///     "reports",
    ///     ElectionConfig::new(),
    /// )?;
    /// let thief = store.clone();
    /// let outcome = elector
    ///     .run(|term| {
    ///         let thief = thief.clone();
    ///         async move {
    ///             let stolen = thief.steal("reports", "pod-b", Duration::from_secs(15));
    ///             assert!(stolen > term.fencing_token());
    ///             // The next renewal finds the lease gone: the term is cancelled.
    ///             term.cancellation().cancelled().await;
    ///             term.is_valid()
    ///         }
    ///     })
    ///     .await;
    /// // Without `rejoin`, a lost term ends `run` with an error; the workload saw it invalid.
    /// assert!(matches!(outcome, Err(tenure::election::ElectionError::Lost { .. })));
    /// # Ok(()) }
    /// ```
    pub fn steal(&self, name: &str, identity: &str, ttl: Duration) -> FencingToken {
        let now = Instant::now();
        let mut locks = self.locked();
        let slot = locks.entry(Arc::from(name)).or_default();
        let fencing = self.next_token();
        slot.held = Some(Held {
            holder: HolderToken::random(),
            identity: Arc::from(identity),
            fencing,
            expires_at: now + ttl,
        });
        slot.transitions += 1;
        slot.latest = Some(fencing);
        slot.publish();
        fencing
    }

    /// Forgets every lock and every group's members, as a store that lost its data would. Fencing tokens keep rising
    /// (the counter is not wiped), as the Redis backend's do after a wipe.
    pub fn wipe(&self) {
        for group in self.groups().values_mut() {
            group.members.clear();
            group.record = None;
            group.changed.send_replace(());
        }
        let mut locks = self.locked();
        for slot in locks.values_mut() {
            slot.held = None;
            slot.acks.clear();
            slot.handoff = None;
            slot.latest = None;
            slot.completion = None;
            slot.publish();
        }
    }
}

fn renew_in(
    locks: &mut BTreeMap<Arc<str>, Slot>,
    now: Instant,
    name: &str,
    holder: &HolderToken,
    ttl: Duration,
) -> Renewed {
    match locks.get_mut(name).and_then(|s| s.held.as_mut()) {
        Some(h) if h.holder == *holder && h.expires_at > now => {
            h.expires_at = now + ttl;
            Renewed::Held
        }
        _ => Renewed::NotHeld,
    }
}

impl Backend for MemoryBackend {
    fn validate_name(&self, name: &str) -> Result<(), InvalidName> {
        super::check_common_name_rules(name, MAX_NAME_LEN)
    }

    fn try_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquired, BackendError>> {
        Box::pin(ready(Ok(self.acquire_now(req))))
    }

    fn renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Renewed, BackendError>> {
        Box::pin(ready(Ok(self.renew_now(name, holder, ttl))))
    }

    fn renew_many<'a>(
        &'a self,
        batch: &'a [super::RenewRequest],
    ) -> BoxFuture<'a, Vec<Result<Renewed, BackendError>>> {
        // One lock and one clock reading for the whole batch, as one round trip would be.
        let now = Instant::now();
        let mut locks = self.locked();
        let out = batch
            .iter()
            .map(|r| Ok(renew_in(&mut locks, now, &r.name, &r.holder, r.ttl)))
            .collect();
        Box::pin(ready(out))
    }

    fn release<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        Box::pin(ready(Ok(self.release_now(name, holder, None, None))))
    }

    fn release_as<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        Box::pin(ready(Ok(self.release_now(
            name,
            holder,
            Some(identity),
            None,
        ))))
    }

    fn release_to<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        to: &'a str,
        window: Duration,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        Box::pin(ready(Ok(self.release_now(
            name,
            holder,
            None,
            Some((to, window)),
        ))))
    }

    fn request_handoff<'a>(
        &'a self,
        name: &'a str,
        handoff: &'a Handoff,
        window: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let now = Instant::now();
        let mut locks = self.locked();
        let held = match locks.get_mut(name) {
            Some(slot) if slot.live(now).is_some() => {
                slot.handoff = Some((handoff.clone(), now + window));
                true
            }
            _ => false,
        };
        Box::pin(ready(Ok(held)))
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseRecord>, BackendError>> {
        Box::pin(ready(Ok(self.inspect_now(name))))
    }

    fn announce_member<'a>(
        &'a self,
        group: &'a str,
        member: &'a Member,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let until = Instant::now() + ttl;
        let mut groups = self.groups();
        let g = groups.entry(Arc::from(group)).or_default();
        g.members
            .insert(member.identity.clone(), (member.clone(), until));
        g.changed.send_replace(());
        Box::pin(ready(Ok(())))
    }

    fn withdraw_member<'a>(
        &'a self,
        group: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        if let Some(g) = self.groups().get_mut(group)
            && g.members.remove(identity).is_some()
        {
            g.changed.send_replace(());
        }
        Box::pin(ready(Ok(())))
    }

    fn group_record<'a>(
        &'a self,
        group: &'a str,
    ) -> BoxFuture<'a, Result<GroupRead, BackendError>> {
        let text = self.groups().get(group).and_then(|g| g.record.clone());
        Box::pin(ready(Ok(text.map_or(GroupRead::Absent, |t| {
            GroupRead::parse(t.as_bytes(), GroupVersion(t.clone()))
        }))))
    }

    fn swap_group_record<'a>(
        &'a self,
        group: &'a str,
        expected: Option<&'a GroupVersion>,
        record: &'a GroupRecord,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let mut groups = self.groups();
        let g = groups.entry(Arc::from(group)).or_default();
        let swapped = g.record.as_deref() == expected.map(|v| v.0.as_str());
        if swapped {
            g.record = Some(record.encode());
        }
        Box::pin(ready(Ok(swapped)))
    }

    fn check_completion<'a>(
        &'a self,
        name: &'a str,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<CompletionCheck, BackendError>> {
        let now_ms = self.clock_ms();
        let locks = self.locked();
        let slot = locks.get(name);
        let last = slot
            .and_then(|s| s.completion.as_deref())
            .map_or(CompletionRead::Absent, |t| {
                CompletionRead::parse(t.as_bytes())
            });
        let latest = slot.and_then(|s| s.latest) == Some(token);
        Box::pin(ready(Ok(CompletionCheck {
            now_ms,
            last,
            latest,
        })))
    }

    fn record_completion<'a>(
        &'a self,
        name: &'a str,
        record: &'a Completion,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let mut locks = self.locked();
        let written = match locks.get_mut(name) {
            Some(slot) if slot.latest == Some(record.token) => {
                slot.completion = Some(record.encode());
                true
            }
            _ => false,
        };
        Box::pin(ready(Ok(written)))
    }

    fn members(&self, group: &str) -> BoxStream<'static, Result<Vec<Member>, BackendError>> {
        let group: Arc<str> = Arc::from(group);
        let rx = self
            .groups()
            .entry(group.clone())
            .or_default()
            .changed
            .subscribe();
        let this = self.clone();
        // Emits the live set whenever it differs from the last one emitted: after an
        // announcement or withdrawal (notified), or when a member's announcement runs out.
        Box::pin(futures::stream::unfold(
            (rx, None::<Vec<Member>>),
            move |(mut rx, last)| {
                let (this, group) = (this.clone(), group.clone());
                async move {
                    loop {
                        let (live, next) = this
                            .groups()
                            .get(&group)
                            .map_or((Vec::new(), None), |g| g.live(Instant::now()));
                        if last.as_ref() != Some(&live) {
                            return Some((Ok(live.clone()), (rx, Some(live))));
                        }
                        let expiry = async {
                            match next {
                                Some(at) => tokio::time::sleep_until(at).await,
                                None => std::future::pending().await,
                            }
                        };
                        tokio::select! {
                            changed = rx.changed() => changed.ok()?,
                            () = expiry => {}
                        }
                    }
                }
            },
        ))
    }

    fn observe(&self, name: &str) -> BoxStream<'static, Result<HolderChange, BackendError>> {
        let rx = {
            let mut locks = self.locked();
            let slot = locks.entry(Arc::from(name)).or_default();
            if slot.notify.is_none() {
                let (tx, _) = watch::channel(HolderChange::free());
                slot.notify = Some(tx);
                slot.publish();
            }
            slot.notify.as_ref().map(watch::Sender::subscribe)
        };
        let Some(mut rx) = rx else {
            return Box::pin(futures::stream::empty());
        };
        rx.mark_changed();
        Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            let change = rx.borrow_and_update().clone();
            Some((Ok(change), rx))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn req(name: &str, ttl_ms: u64) -> AcquireRequest {
        AcquireRequest {
            name: Arc::from(name),
            holder: HolderToken::random(),
            identity: Arc::from("me"),
            ttl: Duration::from_millis(ttl_ms),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn memory_should_expire_by_tokio_clock_and_keep_tokens_rising() {
        let b = MemoryBackend::new();
        let a = req("x", 100);
        let Ok(Acquired::Granted { fencing: t1 }) = b.try_acquire(&a).await else {
            panic!("first acquire must be granted")
        };
        let other = req("x", 100);
        assert!(matches!(
            b.try_acquire(&other).await,
            Ok(Acquired::Busy { remaining: Some(r), .. }) if r == Duration::from_millis(100)
        ));
        tokio::time::advance(Duration::from_millis(100)).await;
        let Ok(Acquired::Granted { fencing: t2 }) = b.try_acquire(&other).await else {
            panic!("acquire after expiry must be granted")
        };
        assert!(t2 > t1);
        assert_eq!(
            b.renew(&a.name, &a.holder, a.ttl).await.ok(),
            Some(Renewed::NotHeld)
        );
    }

    /// Two stores with their own counters, fed the same requests, give the same tokens,
    /// from 1 (whatever the process-wide counter is at), and keep them rising across a wipe.
    #[tokio::test(start_paused = true)]
    async fn stores_with_their_own_tokens_count_alone() {
        let grant = |b: &MemoryBackend, name: &str| {
            let (b, r) = (b.clone(), req(name, 100));
            async move {
                match b.try_acquire(&r).await {
                    Ok(Acquired::Granted { fencing }) => fencing.get(),
                    other => panic!("not granted: {other:?}"),
                }
            }
        };
        let (one, two) = (
            MemoryBackend::with_own_tokens(),
            MemoryBackend::with_own_tokens(),
        );
        // The process-wide counter moves past 1 first.
        grant(&MemoryBackend::new(), "s").await;
        assert_eq!((grant(&one, "a").await, grant(&one, "b").await), (1, 2));
        one.wipe();
        assert_eq!(grant(&one, "a").await, 3, "tokens rise across a wipe");
        assert_eq!((grant(&two, "a").await, grant(&two, "b").await), (1, 2));
    }

    /// A release's replay (its answer lost) counts as released for [`RELEASE_ACK_TTL`] and for
    /// the last [`RELEASE_ACKS_KEPT`] releases of the lease, and never for `release_as`: a
    /// restart record's token must not release what the store no longer says it holds.
    #[tokio::test(start_paused = true)]
    async fn a_release_replayed_counts_for_the_last_releases_within_the_ack_ttl() {
        async fn release(b: &MemoryBackend, r: &AcquireRequest) -> Option<Released> {
            b.release(&r.name, &r.holder).await.ok()
        }
        let b = MemoryBackend::new();
        let mut terms = Vec::new();
        for _ in 0..=RELEASE_ACKS_KEPT {
            let r = req("acks", 1000);
            assert!(matches!(
                b.try_acquire(&r).await,
                Ok(Acquired::Granted { .. })
            ));
            assert_eq!(release(&b, &r).await, Some(Released::Released));
            terms.push(r);
        }
        let (oldest, kept) = terms.split_first().expect("terms");
        assert_eq!(
            release(&b, oldest).await,
            Some(Released::NotHeld),
            "only the last {RELEASE_ACKS_KEPT} releases are remembered"
        );
        for r in kept {
            assert_eq!(release(&b, r).await, Some(Released::Released), "a replay");
            assert_eq!(
                b.release_as(&r.name, &r.holder, "me").await.ok(),
                Some(Released::NotHeld),
                "release_as: a replay is not held"
            );
        }
        let last = kept.last().expect("kept");
        tokio::time::advance(RELEASE_ACK_TTL - Duration::from_nanos(1)).await;
        assert_eq!(release(&b, last).await, Some(Released::Released));
        tokio::time::advance(Duration::from_nanos(1)).await;
        assert_eq!(
            release(&b, last).await,
            Some(Released::NotHeld),
            "forgotten once the ack's time is up"
        );
        // A token that never held the lease is not held, acks or not.
        let never = req("acks", 1000);
        assert_eq!(release(&b, &never).await, Some(Released::NotHeld));
    }

    #[tokio::test(start_paused = true)]
    async fn memory_should_notify_observers_of_release() {
        let b = MemoryBackend::new();
        let mut changes = b.observe("y");
        assert_eq!(
            changes.next().await.and_then(Result::ok),
            Some(HolderChange::free())
        );
        let a = req("y", 1000);
        assert!(matches!(
            b.try_acquire(&a).await,
            Ok(Acquired::Granted { .. })
        ));
        let granted = changes.next().await.and_then(Result::ok);
        assert_eq!(granted.and_then(|c| c.holder).as_deref(), Some("me"));
        assert_eq!(
            b.release(&a.name, &a.holder).await.ok(),
            Some(Released::Released)
        );
        // Bounded (the clock is paused): a release that frees nothing fails, not hangs.
        let freed = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("the release is published");
        assert_eq!(freed.and_then(Result::ok), Some(HolderChange::free()));
    }
}
