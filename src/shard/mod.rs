//! Sharded leadership: N shards spread evenly over the live replicas, each shard a fenced term.
//!
//! One [`LeaderElector`] runs one workload on one replica. When that is not enough, a
//! [`ShardedElector`] splits the work into `N` shards: every replica announces itself in the
//! group's **membership** (a record that expires like a lease), computes from the live members
//! the same **assignment** as every other replica ([`assign`]: balanced to ±1 shard, few moves
//! when a replica comes or goes), and campaigns only for the shards assigned to it. Each shard
//! is a term of its own lease (`NAME-SHARD`), served by a [`LeaderElector`]: its own fencing
//! token, cancellation and stop deadline, with every guarantee of a single election. All
//! shards of a replica share its [`Locker`]'s one renewal task.
//!
//! A shard assigned elsewhere is handed over gracefully: its workload is cancelled and
//! stopped, then its lease released, so the new owner takes it on the release notification. A
//! replica that leaves on shutdown withdraws from the membership first. A replica that dies
//! stops announcing; its shards move when its membership expires and their leases run out
//! (lease duration + retry period). A replica follows every shard lease of its count from
//! the moment it joins ([`Backend::follow_shard_leases`](crate::Backend::follow_shard_leases)):
//! where expiry is judged on the observer's clock (Kubernetes) that clock has then run since
//! the dead holder's last renewal, so its shards are free one lease after it, and the
//! replica watches them all with one watch.
//!
//! Views of the membership can differ for a moment (a replica that has seen a join and one
//! that has not yet): two replicas may then both campaign for one shard, and its lease lets
//! only one hold it. The assignment decides who *tries*; the lease decides who *holds*.
//!
//! The shard count is the group's, kept by the store in one group record that changes only by
//! compare-and-swap (the `group` module documents the protocol): a replica started with
//! another count runs no shard and waits ([`GroupStatus::Waiting`]); it changes the group to
//! its count once no live member runs the old one and every lease of the old count is free.
//! So a rolling update that changes the count completes, and workloads of two counts (which
//! map keys to shards differently) never run at once.
//!
//! Keys map to shards with [`shard_of`], a documented hash other languages can compute.

mod assign;
mod group;
mod losses;
mod restart;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use assign::{Seat, assign, shard_of};
pub use group::GroupStatus;

use crate::Locker;
use crate::backend::{BackendError, Member};
use crate::election::{ElectionConfig, ElectionError, LeaderElector, RestartLock, Term};

/// The most shards a group may have.
pub const MAX_SHARDS: u32 = 4096;

/// The assignment is computed at most once per this interval: a membership change after a
/// quiet spell is acted on at once, and the rest of a burst (every replica joining at a
/// deployment, or announcing its new shards after one) once the interval has passed, from
/// the latest list. Without it every replica recomputed the whole assignment once per
/// announcement of every other — members² computations of shards each at a start.
const REBALANCE_EVERY: Duration = Duration::from_millis(20);

/// Why a [`ShardedElector`] could not be built or stopped running.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// The shard count is 0 or above [`MAX_SHARDS`].
    #[error("invalid shard count {shards}: it must be between 1 and {MAX_SHARDS}")]
    InvalidShardCount {
        /// The count given.
        shards: u32,
    },
    /// The election durations or a shard's lease name were refused (see [`ElectionError`]).
    #[error(transparent)]
    Election(#[from] ElectionError),
    /// The store refused the membership for good (no membership support, permissions).
    #[error("membership of group {group:?} failed: {source}")]
    Membership {
        /// The group's name.
        group: String,
        /// The store's error.
        source: BackendError,
    },
    /// This elector is already running.
    #[error("this sharded elector is already running")]
    AlreadyRunning,
}

/// Who owns which shard, as this replica last computed it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Assignment {
    /// The live members the assignment was computed from (those running the group's shard
    /// count), sorted by identity.
    pub members: Vec<Member>,
    /// The identity each shard is assigned to, by shard number.
    pub owners: Vec<Option<String>>,
}

/// Runs a workload per shard for the shards assigned to this replica.
///
/// Cheap to clone: clones share the state, so one clone can run while others serve
/// [`owned`](Self::owned), [`owns`](Self::owns) and [`assignment`](Self::assignment).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tenure::backend::memory::MemoryBackend;
/// use tenure::election::ElectionConfig;
/// use tenure::shard::ShardedElector;
/// use tenure::Locker;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), tenure::shard::ShardError> {
/// let store = MemoryBackend::new();
/// let replicas: Vec<ShardedElector> = ["pod-a", "pod-b"]
///     .into_iter()
///     .map(|id| {
///         let locker = Locker::with_identity(store.clone(), id).expect("valid identity");
///         ShardedElector::new(locker, "workers", 8, ElectionConfig::new())
///     })
///     .collect::<Result<_, _>>()?;
/// for r in &replicas {
///     let r = r.clone();
///     tokio::spawn(async move {
///         r.run_until(std::future::pending(), |shard, term| async move {
///             // Work on shard `shard` until the term ends; fence with term.fencing_token().
///             let _ = shard;
///             term.cancellation().cancelled().await;
///         })
///         .await
///     });
/// }
/// tokio::time::sleep(Duration::from_secs(5)).await;
/// let owned: Vec<usize> = replicas.iter().map(|r| r.owned().borrow().len()).collect();
/// assert_eq!(owned, vec![4, 4]);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ShardedElector {
    inner: Arc<Inner>,
}

struct Inner {
    locker: Locker,
    name: Arc<str>,
    shards: u32,
    config: ElectionConfig,
    /// Shards whose term runs here now.
    owned: watch::Sender<BTreeSet<u32>>,
    /// The term of each shard in `owned`.
    terms: std::sync::Mutex<BTreeMap<u32, Term>>,
    assignment: watch::Sender<Assignment>,
    group: watch::Sender<GroupStatus>,
    /// Woken when a shard's term found the record changed: the keeper reads it again.
    recheck: tokio::sync::Notify,
    running: AtomicBool,
    /// Shard terms lost to the store, and the warning when they pile up.
    losses: losses::Losses,
    /// Member announcements that did not land (failed, or unanswered within the bound).
    missed_heartbeats: AtomicU64,
    /// Proves this replica's previous process gone (see [`ShardedElector::with_restart_lock`]).
    restart: std::sync::Mutex<Option<Arc<RestartLock>>>,
    /// Given to every shard's elector (see [`ShardedElector::with_metrics`]).
    #[cfg(feature = "metrics")]
    metrics: std::sync::Mutex<Option<crate::election::ElectionMetrics>>,
}

impl std::fmt::Debug for ShardedElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedElector")
            .field("group", &self.inner.name)
            .field("identity", &self.inner.locker.identity())
            .field("shards", &self.inner.shards)
            .field("owned", &*self.inner.owned.borrow())
            .finish_non_exhaustive()
    }
}

impl ShardedElector {
    /// A sharded elector for group `name` with `shards` shards, campaigning as `locker`'s
    /// identity (which must differ between replicas). Shard `s` is the lease `NAME-s`.
    ///
    /// # Errors
    ///
    /// [`ShardError::InvalidShardCount`]; [`ShardError::Election`] for durations that break
    /// a rule or a name the backend refuses.
    pub fn new(
        locker: Locker,
        name: &str,
        shards: u32,
        config: ElectionConfig,
    ) -> Result<Self, ShardError> {
        if shards == 0 || shards > MAX_SHARDS {
            return Err(ShardError::InvalidShardCount { shards });
        }
        // The first and the longest shard names pass the same checks a run would make.
        for shard in [0, shards - 1] {
            LeaderElector::for_shard(locker.clone(), &lease_name(name, shard), config.clone())?;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                locker,
                name: name.into(),
                shards,
                config: config.rejoin(true),
                owned: watch::channel(BTreeSet::new()).0,
                terms: std::sync::Mutex::new(BTreeMap::new()),
                assignment: watch::channel(Assignment::default()).0,
                group: watch::channel(GroupStatus::Joining).0,
                recheck: tokio::sync::Notify::new(),
                losses: losses::Losses::default(),
                missed_heartbeats: AtomicU64::new(0),
                running: AtomicBool::new(false),
                restart: std::sync::Mutex::new(None),
                #[cfg(feature = "metrics")]
                metrics: std::sync::Mutex::new(None),
            }),
        })
    }

    /// Reports every shard's elector into `metrics` (feature `metrics`), as
    /// [`LeaderElector::with_metrics`] does for one lease: the series of shard `s` carry
    /// `name="NAME-s"` (`leader_election_master_status`, `tenure_fencing_token`, the terms'
    /// counters and latencies), from the first campaign for that shard on this replica. The
    /// same metrics given to a `Fencer` (feature `kube`) add each shard term's
    /// fence state under the same names.
    ///
    /// # Example
    ///
    /// ```
    /// use prometheus_client::registry::Registry;
    /// use tenure::backend::memory::MemoryBackend;
    /// use tenure::election::{ElectionConfig, ElectionMetrics};
    /// use tenure::shard::ShardedElector;
    /// use tenure::Locker;
    ///
    /// let mut registry = Registry::default();
    /// let locker = Locker::with_identity(MemoryBackend::new(), "replica-a").expect("identity");
    /// let elector = ShardedElector::new(locker, "mailer", 4, ElectionConfig::new())
    ///     .expect("valid group")
    ///     .with_metrics(ElectionMetrics::register(&mut registry));
    /// # let _ = elector;
    /// ```
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn with_metrics(self, metrics: crate::election::ElectionMetrics) -> Self {
        *self
            .inner
            .metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(metrics);
        self
    }

    /// Lets a restart of this replica take its shards back at once, as
    /// [`LeaderElector::with_restart_lock`] does for one lease: with `lock` held (taken with
    /// the group's name, see [`RestartLock::take`]), each shard campaign records its holder
    /// token in the lock's file before the request goes out, and when
    /// [`run_until`](Self::run_until) starts it ends every shard term the previous process
    /// recorded there under this identity. Only a lock that was free proves the previous
    /// process gone; without one, nothing changes.
    #[must_use]
    pub fn with_restart_lock(self, lock: RestartLock) -> Self {
        *self
            .inner
            .restart
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(lock));
        self
    }

    /// This replica's identity.
    #[must_use]
    pub fn identity(&self) -> &str {
        self.inner.locker.identity()
    }

    /// The group's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The shard count.
    #[must_use]
    pub fn shards(&self) -> u32 {
        self.inner.shards
    }

    /// The three durations of every shard's election, for the `Election` resource's spec and
    /// the status publisher's default heartbeat ([`crate::crd`]).
    #[cfg(feature = "crd")]
    pub(crate) fn timings(&self) -> (Duration, Duration, Duration) {
        self.inner.config.durations()
    }

    /// The shards whose term runs on this replica now, updated as terms begin and end.
    #[must_use]
    pub fn owned(&self) -> watch::Receiver<BTreeSet<u32>> {
        self.inner.owned.subscribe()
    }

    /// How many shard terms this replica has lost to the store since it was made (renewals
    /// that missed their deadline, a lease taken), not counting terms given up (a shard
    /// moved, a shutdown). A few are ordinary (a partition, a pause); when three are lost
    /// within two lease durations the elector warns that the store may be past what it can
    /// write for the group. For a metric (`tenure_shard_terms_lost_total` in `tenure run`).
    #[must_use]
    pub fn lost_terms(&self) -> u64 {
        self.inner.losses.total()
    }

    /// How many of this replica's member announcements (its heartbeat in the group) did not
    /// land since it was made: failed, or unanswered within a third of a lease (each is sent
    /// again, and logged at warn with this count). The member record lasts a lease, so an
    /// occasional miss costs nothing; about three in a row and the others drop this replica
    /// from the group and take its shards. For a metric
    /// (`tenure_shard_heartbeats_missed_total` in `tenure run`).
    #[must_use]
    pub fn missed_heartbeats(&self) -> u64 {
        self.inner.missed_heartbeats.load(Ordering::Relaxed)
    }

    /// Whether the shard of `key` ([`shard_of`]) has a term running on this replica now.
    #[must_use]
    pub fn owns(&self, key: &str) -> bool {
        self.inner
            .owned
            .borrow()
            .contains(&shard_of(key, self.inner.shards))
    }

    /// The term of `shard` if it runs on this replica now: its fencing token for writes
    /// about the shard's keys, its cancellation to stop them.
    #[must_use]
    pub fn term(&self, shard: u32) -> Option<Term> {
        self.inner.terms().get(&shard).cloned()
    }

    /// The assignment this replica last computed from the membership.
    #[must_use]
    pub fn assignment(&self) -> watch::Receiver<Assignment> {
        self.inner.assignment.subscribe()
    }

    /// Where this replica stands in its group: running the group's shard count, or waiting
    /// while the group runs or drains another (see [`GroupStatus`]).
    #[must_use]
    pub fn group(&self) -> watch::Receiver<GroupStatus> {
        self.inner.group.subscribe()
    }

    /// Joins the group and runs `workload(shard, term)` for every term of every shard
    /// assigned here, until `shutdown` completes; then withdraws from the group, stops every
    /// shard's workload and releases its lease.
    ///
    /// Each shard term behaves as a [`LeaderElector`] term (cancellation, stop deadline,
    /// tasks bound to it, release after the workload stopped). A workload that returns ends
    /// its term; the shard is campaigned for again while it stays assigned here. A shard
    /// that moves elsewhere is stopped gracefully and released.
    ///
    /// The group's shard count is the one its record in the store holds, not this
    /// replica's: while they differ, this replica runs no shard and waits (see
    /// [`group`](Self::group)); it changes the group to its count once no live member runs
    /// the old one and every lease of the old count is free, so terms of two counts never
    /// run at once.
    ///
    /// # Errors
    ///
    /// [`ShardError::Membership`], [`ShardError::AlreadyRunning`];
    /// [`ShardError::Election`] if a shard's campaign fails for good (credentials,
    /// permissions). Every shard's workload has stopped and its lease was released when it
    /// returns.
    pub async fn run_until<S, F, Fut>(&self, shutdown: S, workload: F) -> Result<(), ShardError>
    where
        S: Future<Output = ()>,
        F: Fn(u32, Term) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        if self.inner.running.swap(true, Ordering::AcqRel) {
            return Err(ShardError::AlreadyRunning);
        }
        let _running = Running(self);
        let workload: Workload = Arc::new(move |shard, term| Box::pin(workload(shard, term)));
        let me = Member {
            identity: self.inner.locker.identity().to_owned(),
            shards: self.inner.shards,
            joined_ms: unix_ms(),
            holds: Vec::new(),
        };
        let mut shards = Shards::default();
        // Every shard lease followed from now until the last is released (the end of this
        // function): a dead member's shards are then free one lease after its last renewal,
        // not one lease after their new owner first looks (on Kubernetes, with one watch).
        let leases: Vec<String> = (0..self.inner.shards)
            .map(|shard| lease_name(&self.inner.name, shard))
            .collect();
        let _following = self
            .inner
            .locker
            .backend()
            .follow_shard_leases(&self.inner.name, &leases);
        if let Some(lock) = self.inner.restart_lock() {
            restart::end_previous_terms(
                &self.inner.locker,
                &self.inner.name,
                &lock,
                self.inner.group_request_bound(),
            )
            .await;
        }
        let (lease, retry) = self.inner.config.timings();
        let keeper = group::Keeper {
            backend: self.inner.locker.backend(),
            group: &self.inner.name,
            identity: self.inner.locker.identity(),
            shards: self.inner.shards,
            lease,
            retry,
            request_timeout: self.inner.record_bound(),
        };
        // The latest membership: here for the assignment, in `seen` for the keeper.
        let mut last = Vec::<Member>::new();
        // The last computation of the assignment, and when the next is due (a change came
        // sooner than `REBALANCE_EVERY` after it).
        let mut computed_at: Option<tokio::time::Instant> = None;
        let mut recompute_at: Option<tokio::time::Instant> = None;
        let (seen, latest) = watch::channel(None::<Vec<Member>>);
        let mut status = self.inner.group.subscribe();
        let outcome = {
            let mut shutdown = pin!(shutdown);
            let mut heartbeat = pin!(self.heartbeat(&me));
            let mut keeping = pin!(keeper.keep(&self.inner.group, latest, &self.inner.recheck));
            let mut members = self.inner.locker.backend().members(&self.inner.name);
            loop {
                tokio::select! {
                    () = &mut shutdown => break Ok(()),
                    failed = &mut heartbeat => break Err(failed),
                    failed = &mut keeping => break Err(ShardError::Membership {
                        group: self.inner.name.to_string(),
                        source: failed,
                    }),
                    next = members.next() => match next {
                        Some(Ok(list)) => {
                            seen.send_replace(Some(list.clone()));
                            last = list;
                            let now = tokio::time::Instant::now();
                            match computed_at {
                                Some(at) if now < at + REBALANCE_EVERY => {
                                    recompute_at.get_or_insert(at + REBALANCE_EVERY);
                                }
                                _ => {
                                    computed_at = Some(now);
                                    if let Err(e) = self.rebalance(&me, &last, &mut shards, &workload) {
                                        break Err(e);
                                    }
                                }
                            }
                        }
                        Some(Err(e)) => tracing::warn!(group = %self.inner.name, error = %e, "membership watch hiccup"),
                        None => break Err(ShardError::Membership {
                            group: self.inner.name.to_string(),
                            source: BackendError::new(crate::backend::BackendErrorKind::Unavailable, "the membership stream ended"),
                        }),
                    },
                    () = crate::util::sleep_until_opt(recompute_at) => {
                        recompute_at = None;
                        computed_at = Some(tokio::time::Instant::now());
                        if let Err(e) = self.rebalance(&me, &last, &mut shards, &workload) {
                            break Err(e);
                        }
                    }
                    Ok(()) = status.changed() => {
                        status.mark_unchanged();
                        if let Err(e) = self.rebalance(&me, &last, &mut shards, &workload) {
                            break Err(e);
                        }
                    }
                    Some(ended) = shards.tasks.join_next_with_id(), if !shards.tasks.is_empty() => {
                        if let Err(e) = self.reap(ended, &mut shards, &workload) {
                            break Err(e);
                        }
                    }
                }
            }
        };
        // Leave the group first, so the others take our shards over as we release them.
        let backend = self.inner.locker.backend();
        let withdraw = backend.withdraw_member(&self.inner.name, &me.identity);
        if let Err(e) = tokio::time::timeout(self.inner.group_request_bound(), withdraw)
            .await
            .unwrap_or_else(|_| {
                Err(BackendError::new(
                    crate::backend::BackendErrorKind::Timeout,
                    "withdrawing from the group timed out",
                ))
            })
        {
            tracing::warn!(group = %self.inner.name, error = %e, "could not withdraw; the membership will expire");
        }
        shards.stop_all().await;
        outcome
    }

    /// Announces this replica, with the shards it holds, every third of a lease and at once
    /// when that set changes; each announcement lasts a lease from when it lands. Returns only
    /// on a permanent failure. A transient one is tried again after a retry period; one still
    /// unanswered when the last announcement that landed runs out
    /// ([`Inner::announce_deadline`]) is given up and sent again at once. Each miss is counted
    /// ([`ShardedElector::missed_heartbeats`]) and logged at warn.
    async fn heartbeat(&self, me: &Member) -> ShardError {
        let (lease, retry) = self.inner.config.timings();
        let backend = self.inner.locker.backend();
        let mut owned = self.inner.owned.subscribe();
        let mut me = me.clone();
        let mut landed: Option<tokio::time::Instant> = None;
        loop {
            me.holds = owned.borrow_and_update().iter().copied().collect();
            let sent_at = tokio::time::Instant::now();
            let deadline = self.inner.announce_deadline(landed, sent_at);
            let sent = backend.announce_member(&self.inner.name, &me, lease);
            let pause = match tokio::time::timeout_at(deadline, sent).await {
                Ok(Ok(())) => {
                    landed = Some(sent_at);
                    lease / 3
                }
                Ok(Err(e)) if !e.is_transient() => {
                    return ShardError::Membership {
                        group: self.inner.name.to_string(),
                        source: e,
                    };
                }
                Ok(Err(e)) => {
                    let missed = self.inner.missed_heartbeat();
                    tracing::warn!(group = %self.inner.name, error = %e, missed, "membership announcement failed; retrying");
                    retry
                }
                Err(_) => {
                    let missed = self.inner.missed_heartbeat();
                    let waited = sent_at.elapsed();
                    tracing::warn!(group = %self.inner.name, ?waited, missed, "membership announcement unanswered until the last one ran out; sending it again");
                    Duration::ZERO
                }
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                changed = owned.changed() => {
                    if changed.is_err() {
                        // The sender lives in `self`: it outlives this loop.
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        }
    }

    /// Computes the assignment from `list` and starts or stops shard terms to match it.
    /// Nothing is assigned here unless the group record runs this replica's count.
    fn rebalance(
        &self,
        me: &Member,
        list: &[Member],
        shards: &mut Shards,
        workload: &Workload,
    ) -> Result<(), ShardError> {
        let generation = match *self.inner.group.borrow() {
            GroupStatus::Running { generation } => Some(generation),
            _ => None,
        };
        // Members announcing another count wait, as this replica does when it is one of
        // them: only the record's count is assigned.
        let members: Vec<Member> = list
            .iter()
            .filter(|m| m.shards == me.shards)
            .cloned()
            .collect();
        let ids: Vec<&str> = members.iter().map(|m| m.identity.as_str()).collect();
        let seats: Vec<Seat<'_>> = members
            .iter()
            .map(|m| Seat {
                identity: &m.identity,
                holds: &m.holds,
            })
            .collect();
        let owners = if generation.is_some() {
            assign(&self.inner.name, self.inner.shards, &seats)
        } else {
            vec![None; self.inner.shards as usize]
        };
        let mine: BTreeSet<u32> = (0..self.inner.shards)
            .filter(|&s| owners[s as usize].is_some_and(|i| ids[i] == me.identity))
            .collect();
        // Most membership changes only change what members hold, not who owns what: the
        // owners' names are then kept, not allocated again (one string per shard, on every
        // replica, at every change — the allocator was most of a large group's CPU).
        let renamed = {
            let current = self.inner.assignment.borrow();
            let same = current.owners.len() == owners.len()
                && current
                    .owners
                    .iter()
                    .zip(&owners)
                    .all(|(was, now)| was.as_deref() == now.map(|i| ids[i]));
            (!same).then(|| {
                owners
                    .iter()
                    .map(|o| o.map(|i| ids[i].to_owned()))
                    .collect::<Vec<_>>()
            })
        };
        self.inner.assignment.send_modify(|current| {
            if let Some(owners) = renamed {
                current.owners = owners;
            }
            current.members = members;
        });
        shards.assigned.clone_from(&mine);
        for (shard, stop) in &shards.running {
            if !mine.contains(shard) || Some(stop.generation) != generation {
                stop.stop.cancel();
            }
        }
        let Some(generation) = generation else {
            return Ok(());
        };
        shards.generation = generation;
        for shard in mine {
            if !shards.running.contains_key(&shard) {
                self.start(shard, shards, workload, Duration::ZERO)?;
            }
        }
        Ok(())
    }

    /// Starts the elector of `shard` after `delay`.
    fn start(
        &self,
        shard: u32,
        shards: &mut Shards,
        workload: &Workload,
        delay: Duration,
    ) -> Result<(), ShardError> {
        let mut elector = LeaderElector::for_shard(
            self.inner.locker.clone(),
            &lease_name(&self.inner.name, shard),
            self.inner.config.clone(),
        )?;
        if let Some(lock) = self.inner.restart_lock() {
            elector = elector.with_shared_restart_lock(lock);
        }
        #[cfg(feature = "metrics")]
        if let Some(metrics) = self
            .inner
            .metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
        {
            elector = elector.with_metrics(metrics);
        }
        let stop = CancellationToken::new();
        let inner = self.inner.clone();
        let workload = workload.clone();
        let until = stop.clone();
        let generation = shards.generation;
        let id = shards
            .tasks
            .spawn(async move {
                if until
                    .run_until_cancelled(tokio::time::sleep(delay))
                    .await
                    .is_none()
                {
                    return Ok(None);
                }
                elector
                    .run_until(until.cancelled(), |term| {
                        let (inner, workload, until) =
                            (inner.clone(), workload.clone(), until.clone());
                        async move {
                            // Step 4 of the group protocol (`group`): the lease is ours;
                            // the workload starts only if the record still runs our count.
                            let admitted = group::admits(
                                inner.locker.backend(),
                                &inner.name,
                                inner.shards,
                                generation,
                                inner.record_bound(),
                            )
                            .await;
                            if let Err(doubt) = admitted {
                                match doubt {
                                    group::Doubt::Refused => tracing::warn!(group = %inner.name, shard, generation, "the group record no longer runs this generation: the shard's term ends before its workload starts"),
                                    group::Doubt::Unread(e) => tracing::warn!(group = %inner.name, shard, generation, error = %e, "the group record could not be read to confirm this generation: the shard's term ends before its workload starts"),
                                }
                                until.cancel();
                                inner.recheck.notify_one();
                                return;
                            }
                            let _holding = Holding::begin(inner, shard, &term);
                            workload(shard, term).await;
                        }
                    })
                    .await
            })
            .id();
        shards.ids.insert(id, shard);
        shards.running.insert(shard, ShardRun { stop, generation });
        Ok(())
    }

    /// A shard's elector returned: restart it if the shard is still ours and it ended
    /// because its workload returned; propagate a permanent failure.
    fn reap(
        &self,
        ended: Result<(tokio::task::Id, Result<Option<()>, ElectionError>), tokio::task::JoinError>,
        shards: &mut Shards,
        workload: &Workload,
    ) -> Result<(), ShardError> {
        let (id, result) = match ended {
            Ok((id, result)) => (id, result),
            Err(e) => (
                e.id(),
                Err(ElectionError::Internal {
                    message: format!("a shard's task failed: {e}"),
                }),
            ),
        };
        let Some(shard) = shards.ids.remove(&id) else {
            return Ok(());
        };
        shards.running.remove(&shard);
        match result {
            Err(ElectionError::Lock(e)) => Err(ShardError::Election(ElectionError::Lock(e))),
            Err(e) => {
                tracing::warn!(group = %self.inner.name, shard, error = %e, "a shard's term failed");
                self.restart_if_ours(shard, shards, workload)
            }
            Ok(_) => self.restart_if_ours(shard, shards, workload),
        }
    }

    fn restart_if_ours(
        &self,
        shard: u32,
        shards: &mut Shards,
        workload: &Workload,
    ) -> Result<(), ShardError> {
        if shards.assigned.contains(&shard) {
            let (_, retry) = self.inner.config.timings();
            self.start(shard, shards, workload, retry)?;
        }
        Ok(())
    }
}

/// The workload of every shard term, boxed once so the machinery below is not generic.
type Workload = Arc<dyn Fn(u32, Term) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// The shard electors running on this replica.
#[derive(Default)]
struct Shards {
    /// The shards assigned here by the latest assignment.
    assigned: BTreeSet<u32>,
    /// Each running shard's elector, in shard order: shards are stopped and started in one
    /// order every run (deterministic simulation replays byte for byte).
    running: BTreeMap<u32, ShardRun>,
    /// The group record's generation the latest assignment was computed under.
    generation: u64,
    ids: HashMap<tokio::task::Id, u32>,
    tasks: JoinSet<Result<Option<()>, ElectionError>>,
}

impl Shards {
    /// Stops every shard gracefully and waits until each has released its lease.
    async fn stop_all(&mut self) {
        for run in self.running.values() {
            run.stop.cancel();
        }
        while self.tasks.join_next().await.is_some() {}
        self.running.clear();
        self.ids.clear();
    }
}

/// A shard's elector running here.
struct ShardRun {
    /// Stops it gracefully.
    stop: CancellationToken,
    /// The group record's generation it was started under: a change of generation stops it.
    generation: u64,
}

/// A shard's term running here: in the owned set and the term table from when its workload
/// starts until it ends, however it ends.
struct Holding {
    inner: Arc<Inner>,
    shard: u32,
    term: Term,
}

impl Holding {
    fn begin(inner: Arc<Inner>, shard: u32, term: &Term) -> Self {
        inner.terms().insert(shard, term.clone());
        inner.owned.send_modify(|o| {
            o.insert(shard);
        });
        Self {
            inner,
            shard,
            term: term.clone(),
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let shard = self.shard;
        if self.term.end_cause().is_some_and(|end| end.is_lost()) {
            let (lease, _) = self.inner.config.timings();
            self.inner
                .losses
                .lost(&self.inner.name, self.inner.shards, shard, lease * 2);
        }
        self.inner.terms().remove(&shard);
        self.inner.owned.send_modify(|o| {
            o.remove(&shard);
        });
    }
}

/// Clears the "running" flag however `run_until` ends.
struct Running<'a>(&'a ShardedElector);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.inner.running.store(false, Ordering::Release);
    }
}

impl Inner {
    fn terms(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Term>> {
        // Nothing panics while this lock is held.
        self.terms
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn restart_lock(&self) -> Option<Arc<RestartLock>> {
        self.restart
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How long a member announcement sent at `now` may take: until the last one that
    /// landed (sent at `landed`) runs out, a lease after it was sent, and at least a third of a
    /// lease (the first, or one after the record ran out).
    ///
    /// The bound guards against an answer that never comes (a dead connection), so another
    /// attempt goes out; it is not a freshness bound. The record lasts a lease from when it
    /// lands, so an announcement that lands before the last one runs out loses this replica
    /// nothing, however slow; cutting it sooner only throws the write away and sends it
    /// again, more load on a server that was already slow. The bound was half a retry period
    /// (250 ms in the end-to-end tests): an API server under load answers slower, and three
    /// replicas missed 210 heartbeats a minute and dropped every shard. The backend bounds
    /// each of its requests too (`KubeOptions::request_timeout`, Redis's): the shorter wins.
    /// A request timeout the user set ([`ElectionConfig::request_timeout`]) bounds it instead.
    fn announce_deadline(
        &self,
        landed: Option<tokio::time::Instant>,
        now: tokio::time::Instant,
    ) -> tokio::time::Instant {
        if let Some(set) = self.config.user_request_timeout() {
            return now + set;
        }
        let (lease, _) = self.config.timings();
        let floor = now + lease / 3;
        landed.map_or(floor, |at| (at + lease).max(floor))
    }

    /// The bound on each request about the group record: the keeper's reads and swaps (and
    /// its drain's takes of old leases), and the read a shard term makes before its workload
    /// starts. A lease: the keeper reads the record again once a lease anyway, and a read that
    /// answers late is as good as a quick one — it was served after the grant it vouches for,
    /// so it still shows whether the group ran this count when the term began. Cut at half a
    /// retry period, a read on a loaded API server timed out (212 a minute over three
    /// replicas), the term it gated ended before its workload started, and the shard was
    /// taken and given up again and again. A request timeout the user set bounds it instead.
    fn record_bound(&self) -> Duration {
        let (lease, _) = self.config.timings();
        self.config.user_request_timeout().unwrap_or(lease)
    }

    /// The bound on a request made once, not repeated: the release of a previous run's terms
    /// at the start, the withdrawal from the group at the end. Each is a courtesy (what it
    /// frees runs out after a lease anyway), so a third of a lease, not to hold a start or a
    /// shutdown up for long. A request timeout the user set bounds it instead.
    fn group_request_bound(&self) -> Duration {
        let (lease, _) = self.config.timings();
        self.config.user_request_timeout().unwrap_or(lease / 3)
    }

    /// Counts a missed member announcement; the count so far.
    fn missed_heartbeat(&self) -> u64 {
        self.missed_heartbeats.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// The lease of one shard: `GROUP-SHARD`; [`crate::backend::group::parse_shard_lease_name`]
/// reads it back.
///
/// ```
/// assert_eq!(tenure::shard::lease_name("mailer", 3), "mailer-3");
/// ```
#[must_use]
pub fn lease_name(group: &str, shard: u32) -> String {
    crate::backend::group::shard_lease_name(group, shard)
}

fn unix_ms() -> u64 {
    crate::util::unix_millis()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryBackend;

    fn elector() -> ShardedElector {
        let config = ElectionConfig::new()
            .lease_duration(Duration::from_secs(3))
            .renew_deadline(Duration::from_secs(2))
            .retry_period(Duration::from_millis(500))
            .stop_margin(Duration::from_millis(300));
        let locker = Locker::with_identity(MemoryBackend::new(), "r0").expect("identity");
        ShardedElector::new(locker, "bounds", 4, config).expect("elector")
    }

    /// The bounds follow the lease, not the retry period (#42: half a retry period cut
    /// heartbeats and record reads an API server under load answered a little later).
    #[test]
    fn a_heartbeat_may_take_until_the_last_one_that_landed_runs_out() {
        let inner = &elector().inner;
        let landed = tokio::time::Instant::now();
        let at = |ms: u64| landed + Duration::from_millis(ms);
        // None landed yet: a third of a lease.
        assert_eq!(inner.announce_deadline(None, landed), at(1_000));
        // The last one landed half a second ago: until it runs out, a lease after it.
        assert_eq!(inner.announce_deadline(Some(landed), at(500)), at(3_000));
        // It has (nearly) run out: still a third of a lease.
        assert_eq!(inner.announce_deadline(Some(landed), at(2_500)), at(3_500));
        assert_eq!(inner.record_bound(), Duration::from_secs(3));
        assert_eq!(inner.group_request_bound(), Duration::from_secs(1));
    }

    /// A request timeout the user set bounds the group layer's requests too.
    #[test]
    fn a_set_request_timeout_bounds_the_group_requests() {
        let config = ElectionConfig::new()
            .lease_duration(Duration::from_secs(3))
            .renew_deadline(Duration::from_secs(2))
            .retry_period(Duration::from_millis(500))
            .stop_margin(Duration::from_millis(300))
            .request_timeout(Duration::from_millis(400));
        let locker = Locker::with_identity(MemoryBackend::new(), "r0").expect("identity");
        let elector = ShardedElector::new(locker, "bounds", 4, config).expect("elector");
        let inner = &elector.inner;
        let landed = tokio::time::Instant::now();
        let at = |ms: u64| landed + Duration::from_millis(ms);
        assert_eq!(inner.announce_deadline(None, landed), at(400));
        assert_eq!(inner.announce_deadline(Some(landed), at(500)), at(900));
        assert_eq!(inner.record_bound(), Duration::from_millis(400));
        assert_eq!(inner.group_request_bound(), Duration::from_millis(400));
    }

    #[test]
    fn missed_heartbeats_are_counted() {
        let elector = elector();
        assert_eq!(elector.missed_heartbeats(), 0);
        assert_eq!(elector.inner.missed_heartbeat(), 1);
        assert_eq!(elector.inner.missed_heartbeat(), 2);
        assert_eq!(elector.missed_heartbeats(), 2);
    }
}
