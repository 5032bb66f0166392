//! [`LeaderElector`]: the handle its clones share, the state they share (the current term,
//! who leads, the store's answers) and what it reports from it — leadership, health and
//! metrics. Campaigning and serving terms are `run.rs`'s.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
#[cfg(feature = "metrics")]
use tokio::time::Instant;

use super::ElectionError;
use super::config::ElectionConfig;
use super::health::{Health, StoreContact};
use super::leader::{Leader, LeaderWatch};
#[cfg(feature = "metrics")]
use super::metrics::ElectionMetrics;
use super::restart::RestartLock;
use crate::lock::LeaseShared;
use crate::{FencingToken, LockOptions, Locker};

/// Runs a workload only while this replica holds a lease.
///
/// Cheap to clone: clones share the state, so one clone can [`run`](Self::run) while others
/// serve [`health`](Self::health), [`leader`](Self::leader) and [`is_leader`](Self::is_leader).
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
/// let locker = Locker::with_identity(MemoryBackend::new(), "pod-a")?;
/// let elector = LeaderElector::new(locker, "my-controller", ElectionConfig::new())?;
/// let reconciled = elector
///     .run(|term| async move {
///         // Reconcile until the term ends; stamp term.fencing_token() on every write.
///         tokio::select! {
///             () = term.cancellation().cancelled() => 0,
///             () = tokio::time::sleep(Duration::from_secs(60)) => 42,
///         }
///     })
///     .await?;
/// assert_eq!(reconciled, 42);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaderElector {
    pub(super) inner: Arc<Inner>,
}

/// The state an elector's clones share.
pub(super) struct Inner {
    pub(super) locker: Locker,
    pub(super) name: Arc<str>,
    pub(super) config: ElectionConfig,
    /// The lease options the config derives, checked once in [`LeaderElector::new`].
    pub(super) lease_opts: LockOptions,
    /// Who leads, for [`LeaderElector::leader`].
    pub(super) leader: LeaderWatch,
    /// The lease of the current term while this process leads.
    term: Mutex<Option<Arc<LeaseShared>>>,
    /// Whether `run_until` is running (one run at a time).
    pub(super) running: AtomicBool,
    /// What tells whether the store answers this candidate, for [`Health`].
    pub(super) contact: StoreContact,
    /// Whether this elector runs a shard of a sharded group (made by [`crate::shard`]); a
    /// plain election never takes a lease named like a group's shard.
    pub(super) shard: bool,
    /// Step-down requests and health reports (`intent.rs`; acted on in `handover.rs`).
    pub(super) intent: Arc<super::intent::Intent>,
    /// The proof that this replica's previous process is gone, if the caller took it.
    pub(super) restart: Mutex<Option<Arc<RestartLock>>>,
    #[cfg(feature = "metrics")]
    metrics: Mutex<Option<ElectionMetrics>>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("lease", &self.inner.name)
            .field("identity", &self.inner.locker.identity())
            .field("config", &self.inner.config)
            .field("leading", &self.is_leader())
            .finish_non_exhaustive()
    }
}

impl LeaderElector {
    /// An elector for the lease `name`, campaigning as `locker`'s identity.
    ///
    /// # Errors
    ///
    /// [`ElectionError::InvalidConfig`] naming the broken rule (`lease_duration >
    /// renew_deadline > 1.2 × retry_period`, `request_timeout < retry_period`, ...);
    /// [`ElectionError::Lock`] with [`LockError::InvalidName`](crate::LockError::InvalidName)
    /// if the backend rejects the name.
    pub fn new(locker: Locker, name: &str, config: ElectionConfig) -> Result<Self, ElectionError> {
        Self::build(locker, name, config, false)
    }

    /// The elector of one shard's lease, which may be named like `GROUP-N`.
    pub(crate) fn for_shard(
        locker: Locker,
        name: &str,
        config: ElectionConfig,
    ) -> Result<Self, ElectionError> {
        Self::build(locker, name, config, true)
    }

    fn build(
        locker: Locker,
        name: &str,
        config: ElectionConfig,
        shard: bool,
    ) -> Result<Self, ElectionError> {
        let lease_opts = config.lease_options()?;
        locker
            .backend()
            .validate_name(name)
            .map_err(|e| ElectionError::Lock(e.into()))?;
        Ok(Self {
            inner: Arc::new(Inner {
                locker,
                name: name.into(),
                config,
                lease_opts,
                leader: LeaderWatch::new(),
                term: Mutex::new(None),
                running: AtomicBool::new(false),
                contact: StoreContact::default(),
                shard,
                intent: Arc::default(),
                restart: Mutex::new(None),
                #[cfg(feature = "metrics")]
                metrics: Mutex::new(None),
            }),
        })
    }

    /// Reports this elector's metrics into `metrics` from now on (feature `metrics`). Several
    /// electors may share one [`ElectionMetrics`]; their series differ by the `name` label.
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn with_metrics(self, metrics: ElectionMetrics) -> Self {
        // As client-go: a follower's series exists, at 0, before any term.
        metrics.leading(&self.inner.name, self.is_leader());
        *self
            .inner
            .metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(metrics);
        self
    }

    /// Lets a restart of this replica take over at once: with `lock` held (see
    /// [`RestartLock`]), the elector records each campaign's holder token in the lock's file
    /// before the request goes out, and when [`run`](Self::run) starts it ends the term the
    /// previous process recorded there (releasing the lease with that process's token), so
    /// this process wins the next term without waiting for the lease to expire. Only a lock
    /// that was free proves the previous process gone; without one, nothing changes.
    ///
    /// Use a directory only this replica's processes see and that outlives them: a pod's
    /// `emptyDir` (a container restart keeps it), a private directory on a host. Two replicas
    /// sharing one directory simply contend for the lock; the second runs without it.
    #[must_use]
    pub fn with_restart_lock(self, lock: RestartLock) -> Self {
        self.with_shared_restart_lock(Arc::new(lock))
    }

    /// [`with_restart_lock`](Self::with_restart_lock) with a lock shared by many electors (a
    /// sharded replica's shards: one record, an entry per shard lease).
    pub(crate) fn with_shared_restart_lock(self, lock: Arc<RestartLock>) -> Self {
        *self
            .inner
            .restart
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(lock);
        self
    }

    /// The restart lock, if one was given.
    pub(super) fn restart_lock(&self) -> Option<Arc<RestartLock>> {
        self.inner
            .restart
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The lease's name.
    #[must_use]
    pub fn lease_name(&self) -> &str {
        &self.inner.name
    }

    /// This candidate's identity.
    #[must_use]
    pub fn identity(&self) -> &str {
        self.inner.locker.identity()
    }

    /// The lease duration, renew deadline and retry period, for the `Election` resource's
    /// spec and the status publisher's default heartbeat ([`crate::crd`]).
    #[cfg(feature = "crd")]
    pub(crate) fn timings(&self) -> (Duration, Duration, Duration) {
        let c = &self.inner.config;
        (c.lease_duration, c.renew_deadline, c.retry_period)
    }

    /// Whether this process leads right now: it holds a term whose lease is valid.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.current_term().is_some_and(|l| l.is_valid())
    }

    /// The current leader as last seen by this candidate (client-go's `OnNewLeader`): updated
    /// while [`run`](Self::run) is campaigning or leading, from the store's holder changes.
    #[must_use]
    pub fn leader(&self) -> watch::Receiver<Option<Leader>> {
        self.inner.leader.subscribe()
    }

    /// Whether this process is healthy as a leader: it fails only when this process believes
    /// it leads but has not renewed within the renew deadline plus `tolerance` (a stuck
    /// runtime). Followers are always healthy.
    #[must_use]
    pub fn health(&self, tolerance: Duration) -> Health {
        let term = self.current_term();
        let since_last_renewal = term.as_ref().map(|lease| lease.since_last_renewal());
        let store_silence = self
            .inner
            .contact
            .silence(self.inner.locker.last_answer(), since_last_renewal);
        Health {
            leading: term.is_some(),
            since_last_renewal,
            healthy: since_last_renewal
                .is_none_or(|since| since <= self.inner.config.renew_deadline + tolerance),
            store_silence,
            store_reachable: store_silence
                .is_none_or(|silence| silence <= self.inner.config.silence_limit()),
        }
    }

    pub(super) fn current_term(&self) -> Option<Arc<LeaseShared>> {
        self.inner
            .term
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set_term(&self, lease: Option<Arc<LeaseShared>>) {
        *self
            .inner
            .term
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = lease;
    }

    #[cfg(feature = "metrics")]
    fn with_metrics_do(&self, f: impl FnOnce(&ElectionMetrics, &str)) {
        if let Some(m) = self
            .inner
            .metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            f(m, &self.inner.name);
        }
    }

    pub(super) fn record_acquired(&self, _token: FencingToken, _latency: Duration, _waited: bool) {
        #[cfg(feature = "metrics")]
        self.with_metrics_do(|m, name| m.acquired(name, _token.get(), _latency, _waited));
    }

    /// Samples the lease for metrics: remaining validity, and the latency of the latest
    /// renewal if one happened since the last sample. Returns the renewal count seen.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn record_sample(&self, lease: &LeaseShared, seen: u32) -> u32 {
        let (renewals, _latency) = lease.renewal_stats();
        #[cfg(feature = "metrics")]
        self.with_metrics_do(|m, name| {
            m.remaining_validity(
                name,
                lease
                    .valid_until()
                    .saturating_duration_since(Instant::now()),
            );
            if renewals != seen {
                m.renewed(name, _latency);
            }
        });
        renewals
    }

    /// Counts a term that ended because its lease was lost.
    pub(super) fn record_term_lost(&self) {
        #[cfg(feature = "metrics")]
        self.with_metrics_do(|m, name| m.term_lost(name));
    }

    pub(super) fn record_leading(&self, _leading: bool) {
        #[cfg(feature = "metrics")]
        self.with_metrics_do(|m, name| m.leading(name, _leading));
    }
}
