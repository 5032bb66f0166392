//! Leader election: run a workload only while this replica holds a lease.
//!
//! [`LeaderElector::run`] campaigns for the lease, calls the workload with a [`Term`] for each
//! term it wins, and stops the workload in time when the term ends. It is built on the lock
//! runtime ([`crate::lock`]) and works with every backend; electors built from clones of one
//! [`Locker`] share its single renewal scheduler.
//!
//! # The timeline of a term
//!
//! ```text
//!  acquire ──renew──renew──renew── … ──✗──✗── renew deadline ──────── valid_until − margin ── valid_until
//!     │      (every lease/3;          (failures retried      │                    │
//!     │       failures retried         every retry period)   cancellation fires   workload future dropped
//!     │       every retry period)                            (the term is over)   if still running
//!  workload starts                                                                │
//!                                                                      release, then campaign again or return
//! ```
//!
//! The workload future never runs past `valid_until − stop_margin`, the instant before which
//! no other candidate can have been granted the lease; when the store says outright that the
//! lease is no longer ours it is dropped at once. The lease is released only after the
//! workload has stopped.

mod error;
#[cfg(feature = "healthz")]
mod healthz;
#[cfg(feature = "metrics")]
mod metrics;
mod term;
mod testing;

use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::FusedFuture;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use error::ElectionError;
#[cfg(all(feature = "healthz", feature = "metrics"))]
pub use healthz::SharedRegistry;
#[cfg(feature = "healthz")]
pub use healthz::{ProbeServer, serve_healthz};
#[cfg(feature = "metrics")]
pub use metrics::ElectionMetrics;
pub use term::Term;
pub use testing::TestTerm;

use crate::backend::{BackendError, FencingToken, HolderChange, LeadershipEvent};
use crate::lock::LeaseShared;
use crate::{Lease, LeaseEnd, LockError, LockOptions, Locker, LostReason};

/// The store's holder changes for one lease, as the elector follows them.
type HolderChanges = futures::stream::BoxStream<'static, Result<HolderChange, BackendError>>;

/// The least time aborted term tasks get to end, even when the term's deadline has passed.
const TASKS_MIN_WAIT: Duration = Duration::from_millis(100);

/// Durations and policies of a [`LeaderElector`], with client-go's names and defaults.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`lease_duration`](Self::lease_duration) | 15 s | how long a lease lasts without renewal; candidates wait this long for a silent leader |
/// | [`renew_deadline`](Self::renew_deadline) | 10 s | a leader that has not renewed for this long steps down |
/// | [`retry_period`](Self::retry_period) | 2 s | pause between retries of a failed renewal or campaign request |
/// | [`request_timeout`](Self::request_timeout) | retry period / 2 | bound on each store request |
/// | [`stop_margin`](Self::stop_margin) | 1 s | the workload is dropped this long before the lease could be won by another |
/// | [`grace`](Self::grace) | 5 s | on shutdown, how long the workload may take to stop after cancellation |
/// | [`rejoin`](Self::rejoin) | false | after a lost term, campaign again instead of returning an error |
/// | [`store_unreachable_after`](Self::store_unreachable_after) | 2 × lease duration + retry period | [`Health::store_reachable`] turns false when the store has not answered this candidate for longer |
///
/// The leader renews every `lease_duration / 3` (5 s with the defaults), so it writes 40% as
/// often as client-go's leader, which renews every retry period (2 s).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tenure::election::ElectionConfig;
///
/// let config = ElectionConfig::new()
///     .lease_duration(Duration::from_secs(30))
///     .renew_deadline(Duration::from_secs(20))
///     .retry_period(Duration::from_secs(4))
///     .rejoin(true);
/// # let _ = config;
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct ElectionConfig {
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    request_timeout: Option<Duration>,
    stop_margin: Duration,
    grace: Duration,
    rejoin: bool,
    store_unreachable_after: Option<Duration>,
}

impl Default for ElectionConfig {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            request_timeout: None,
            stop_margin: Duration::from_secs(1),
            grace: Duration::from_secs(5),
            rejoin: false,
            store_unreachable_after: None,
        }
    }
}

macro_rules! duration_setter {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub fn $name(mut self, value: Duration) -> Self {
            self.$name = value;
            self
        }
    };
}

impl ElectionConfig {
    /// The defaults in the table above: controller-runtime's (client-go's `leaderelection`
    /// has no defaults of its own).
    pub fn new() -> Self {
        Self::default()
    }

    duration_setter!(
        /// How long a lease lasts without renewal.
        lease_duration
    );
    duration_setter!(
        /// How long a leader keeps trying to renew before it steps down.
        renew_deadline
    );
    duration_setter!(
        /// The pause between retries of failed requests.
        retry_period
    );
    duration_setter!(
        /// How long before the end of the lease's validity the workload is dropped.
        stop_margin
    );
    duration_setter!(
        /// How long the workload may take to stop on shutdown.
        grace
    );

    /// The bound on each store request; must be shorter than the retry period.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Whether to campaign again after a lost term (`true`) or return
    /// [`ElectionError::Lost`] (`false`, the default, like client-go).
    pub fn rejoin(mut self, on: bool) -> Self {
        self.rejoin = on;
        self
    }

    /// How long the store may stay silent towards this candidate before
    /// [`Health::store_reachable`] turns false.
    ///
    /// A follower hears from the store at least once a lease duration while the leader is
    /// alive (it retries when the leader's lease would run out, and sees every change of
    /// holder), a leader at every renewal; the default, `2 × lease_duration + retry_period`,
    /// leaves room for one missed round.
    pub fn store_unreachable_after(mut self, limit: Duration) -> Self {
        self.store_unreachable_after = Some(limit);
        self
    }

    /// The lease duration and the retry period, for electors built on this one's timing
    /// ([`crate::shard`]'s membership heartbeat).
    pub(crate) fn timings(&self) -> (Duration, Duration) {
        (self.lease_duration, self.retry_period)
    }

    fn silence_limit(&self) -> Duration {
        self.store_unreachable_after
            .unwrap_or(self.lease_duration.saturating_mul(2) + self.retry_period)
    }

    /// Checks the rules and derives the lease options.
    fn lease_options(&self) -> Result<LockOptions, ElectionError> {
        let invalid = |rule: &str| Err(ElectionError::InvalidConfig { rule: rule.into() });
        for (name, value) in [
            ("lease_duration", Some(self.lease_duration)),
            ("renew_deadline", Some(self.renew_deadline)),
            ("retry_period", Some(self.retry_period)),
            ("stop_margin", Some(self.stop_margin)),
            ("grace", Some(self.grace)),
            ("request_timeout", self.request_timeout),
            ("store_unreachable_after", self.store_unreachable_after),
        ] {
            if value.is_some_and(|v| v > crate::lock::MAX_DURATION) {
                return invalid(&format!("{name} must be at most 365 days"));
            }
        }
        if self.store_unreachable_after.is_some_and(|d| d.is_zero()) {
            return invalid("store_unreachable_after must be positive");
        }
        if self.retry_period.is_zero() {
            return invalid("retry_period must be positive");
        }
        if self.renew_deadline <= self.retry_period.mul_f64(1.2) {
            return invalid("renew_deadline must be greater than 1.2 × retry_period");
        }
        if self.lease_duration <= self.renew_deadline {
            return invalid("lease_duration must be greater than renew_deadline");
        }
        if self.renew_deadline + self.stop_margin >= self.lease_duration {
            return invalid("lease_duration must be greater than renew_deadline + stop_margin");
        }
        let request_timeout = self.request_timeout.unwrap_or(self.retry_period / 2);
        if request_timeout.is_zero() || request_timeout >= self.retry_period {
            return invalid("request_timeout must be positive and shorter than retry_period");
        }
        let opts = LockOptions::new()
            .ttl(self.lease_duration)
            .auto_renew(true)
            .renew_fraction(1.0 / 3.0)
            .renew_deadline(self.renew_deadline)
            .retry_interval(self.retry_period)
            .request_timeout(request_timeout)
            .follow_expiry(true);
        opts.plan(true).map_err(|e| match e {
            LockError::InvalidConfig { rule } => ElectionError::InvalidConfig { rule },
            other => ElectionError::Lock(other),
        })?;
        Ok(opts)
    }
}

/// Who leads, as seen by any candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's identity.
    pub identity: String,
    /// The fencing token of its term, when the store reports it.
    pub fencing: Option<FencingToken>,
}

/// The result of [`LeaderElector::health`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Whether this process believes it leads.
    pub leading: bool,
    /// Time since the last successful renewal was sent, when leading.
    pub since_last_renewal: Option<Duration>,
    /// False when leading without a renewal for longer than the renew deadline plus the
    /// tolerance: the process is stuck and should be restarted (client-go's healthz adaptor).
    /// Followers are healthy whatever the store does: restarting them would not bring it back.
    pub healthy: bool,
    /// Time since the store last answered this candidate (an acquire attempt, a change of
    /// holder it reported, a renewal), or since [`run`](LeaderElector::run) began if it never
    /// has; `None` while the elector is not running.
    pub store_silence: Option<Duration>,
    /// False when [`store_silence`](Self::store_silence) exceeds
    /// [`ElectionConfig::store_unreachable_after`]: this candidate cannot tell who leads, and
    /// could not take over if the leader died. A readiness signal, not a liveness one.
    pub store_reachable: bool,
}

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
    inner: Arc<Inner>,
}

struct Inner {
    locker: Locker,
    name: Arc<str>,
    config: ElectionConfig,
    lease_opts: LockOptions,
    leader: watch::Sender<Option<Leader>>,
    /// The lease of the current term while this process leads.
    term: Mutex<Option<Arc<LeaseShared>>>,
    running: AtomicBool,
    /// What tells whether the store answers this candidate, for [`Health`].
    contact: Mutex<StoreContact>,
    #[cfg(feature = "metrics")]
    metrics: Mutex<Option<metrics::ElectionMetrics>>,
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

/// When this candidate's run began (`None` while not running) and when the store last
/// reported a holder change to it. Acquire answers are the locker's; renewals the lease's.
#[derive(Default)]
struct StoreContact {
    run_started: Option<Instant>,
    answered: Option<Instant>,
}

/// How a term ended.
enum TermEnd<T> {
    /// The workload returned while the term was intact (or during a shutdown's grace).
    Returned(T),
    /// The workload panicked.
    Panicked(String),
    /// The lease was lost.
    Lost(FencingToken, LostReason),
    /// Shutdown was requested and the workload has stopped.
    Shutdown,
}

/// Why the term is being wound down.
enum Stopping {
    Lost(LostReason),
    Shutdown,
}

impl LeaderElector {
    /// An elector for the lease `name`, campaigning as `locker`'s identity.
    ///
    /// # Errors
    ///
    /// [`ElectionError::InvalidConfig`] naming the broken rule (`lease_duration >
    /// renew_deadline > 1.2 × retry_period`, `request_timeout < retry_period`, ...);
    /// [`ElectionError::Lock`] with [`LockError::InvalidName`] if the backend rejects the name.
    pub fn new(locker: Locker, name: &str, config: ElectionConfig) -> Result<Self, ElectionError> {
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
                leader: watch::channel(None).0,
                term: Mutex::new(None),
                running: AtomicBool::new(false),
                contact: Mutex::new(StoreContact::default()),
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
        let store_silence = self.store_silence(since_last_renewal);
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

    /// How long the store has been silent towards this candidate: since its latest answer to
    /// an acquire attempt, a holder change or (leading) a renewal; since the run began if none.
    fn store_silence(&self, since_last_renewal: Option<Duration>) -> Option<Duration> {
        let contact = self.contact();
        let began = contact.run_started?;
        let now = Instant::now();
        let latest = [
            Some(began),
            contact.answered,
            self.inner.locker.last_answer(),
            since_last_renewal.and_then(|since| now.checked_sub(since)),
        ]
        .into_iter()
        .flatten()
        .max()?;
        Some(now.saturating_duration_since(latest))
    }

    fn contact(&self) -> std::sync::MutexGuard<'_, StoreContact> {
        self.inner
            .contact
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn note_run_start(&self) {
        self.contact().run_started = Some(Instant::now());
    }

    fn note_store_answer(&self) {
        self.contact().answered = Some(Instant::now());
    }

    fn current_term(&self) -> Option<Arc<LeaseShared>> {
        self.inner
            .term
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_term(&self, lease: Option<Arc<LeaseShared>>) {
        *self
            .inner
            .term
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = lease;
    }

    /// Campaigns and runs `workload` for each term won, until the workload returns.
    ///
    /// Equivalent to [`run_until`](Self::run_until) with a shutdown signal that never fires.
    ///
    /// # Errors
    ///
    /// As [`run_until`](Self::run_until).
    pub async fn run<F, Fut, T>(&self, workload: F) -> Result<T, ElectionError>
    where
        F: FnMut(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        match self.run_until(std::future::pending(), workload).await {
            Ok(Some(out)) => Ok(out),
            // `pending()` never completes, so a shutdown never happens.
            Ok(None) => Err(ElectionError::Internal {
                message: "run stopped for a shutdown that has no signal".into(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Campaigns and runs `workload` for each term won, until the workload returns or
    /// `shutdown` completes.
    ///
    /// On shutdown: the term's cancellation fires, the workload gets up to the grace period
    /// (never past `valid_until − stop_margin`) to stop, then the lease is released at once so
    /// a waiting candidate takes over without waiting for the ttl. Returns `Ok(None)` then, or
    /// `Ok(Some(output))` if the workload returned an output while stopping.
    ///
    /// # Errors
    ///
    /// - [`ElectionError::Lost`]: a term was lost and [`rejoin`](ElectionConfig::rejoin) is
    ///   off. The workload has stopped and the lease was released.
    /// - [`ElectionError::WorkloadPanicked`]: the workload panicked; the lease was released.
    /// - [`ElectionError::Lock`]: campaigning failed permanently (credentials, permissions).
    ///   Transient store failures are retried every retry period.
    /// - [`ElectionError::AlreadyRunning`]: this elector is already running.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the workload at once and releases the lease in the
    /// background.
    pub async fn run_until<S, F, Fut, T>(
        &self,
        shutdown: S,
        mut workload: F,
    ) -> Result<Option<T>, ElectionError>
    where
        S: Future<Output = ()>,
        F: FnMut(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        if self.inner.running.swap(true, Ordering::AcqRel) {
            return Err(ElectionError::AlreadyRunning);
        }
        let _running = RunningGuard(self);
        self.note_run_start();
        let mut shutdown = pin!(shutdown.fuse());
        // One stream of holder changes for the whole run: campaigning and leading follow the
        // same watch, so a won campaign does not close it and open another (two requests per
        // term on Kubernetes, where the last observer's leaving stops the shared watch).
        let mut changes = self.inner.locker.backend().observe(&self.inner.name);
        loop {
            let lease = tokio::select! {
                lease = self.campaign(&mut changes) => lease?,
                () = &mut shutdown => return Ok(None),
            };
            match self
                .serve(lease, &mut workload, shutdown.as_mut(), &mut changes)
                .await
            {
                TermEnd::Returned(out) => return Ok(Some(out)),
                TermEnd::Shutdown => return Ok(None),
                TermEnd::Panicked(message) => {
                    return Err(ElectionError::WorkloadPanicked { message });
                }
                TermEnd::Lost(fencing, reason) => {
                    if !self.inner.config.rejoin {
                        return Err(ElectionError::Lost {
                            name: self.inner.name.to_string(),
                            fencing,
                            reason,
                        });
                    }
                    if shutdown.is_terminated() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Tries until the lease is ours, following the leader meanwhile.
    async fn campaign(&self, changes: &mut HolderChanges) -> Result<Lease, ElectionError> {
        let span =
            tracing::info_span!("campaign", lease = %self.inner.name, identity = %self.identity());
        let inner = &self.inner;
        let window = inner.config.lease_duration.saturating_mul(4);
        let opts = inner.lease_opts.clone().wait(window);
        let attempt = async {
            let started = Instant::now();
            let mut waited = false;
            loop {
                match inner.locker.acquire(&inner.name, &opts).await {
                    Ok(lease) => {
                        self.record_acquired(started.elapsed(), waited);
                        return Ok(lease);
                    }
                    Err(LockError::NotAcquired { .. }) => waited = true,
                    Err(LockError::Backend(e)) if e.is_transient() => {
                        tracing::warn!(error = %e, "campaign request failed; retrying");
                        waited = true;
                        tokio::time::sleep(inner.config.retry_period).await;
                    }
                    Err(e) => return Err(ElectionError::Lock(e)),
                }
            }
        };
        async {
            tokio::select! {
                result = attempt => result,
                never = self.follow_leader(changes) => match never {},
            }
        }
        .instrument(span)
        .await
    }

    /// Keeps [`leader`](Self::leader) current from the store's holder changes. Never returns.
    async fn follow_leader(&self, changes: &mut HolderChanges) -> std::convert::Infallible {
        while let Some(change) = changes.next().await {
            if let Ok(change) = change {
                self.note_store_answer();
                self.publish_leader(&change);
            }
        }
        std::future::pending().await
    }

    /// Clears [`leader`](Self::leader) if it names this replica (in the term with `fencing`,
    /// when given): its term is over, and who leads next is unknown until the store says.
    fn forget_own_leadership(&self, fencing: Option<FencingToken>) {
        self.inner.leader.send_if_modified(|current| {
            let own = current.as_ref().is_some_and(|l| {
                l.identity == self.identity() && fencing.is_none_or(|f| l.fencing == Some(f))
            });
            if own {
                *current = None;
            }
            own
        });
    }

    fn publish_leader(&self, change: &HolderChange) {
        let leader = change.holder.as_ref().map(|identity| Leader {
            identity: identity.clone(),
            fencing: change.fencing,
        });
        self.inner.leader.send_if_modified(|current| {
            if *current == leader {
                return false;
            }
            current.clone_from(&leader);
            true
        });
    }

    /// Serves one term: runs the workload, stops it in time, releases the lease.
    async fn serve<S, F, Fut, T>(
        &self,
        lease: Lease,
        workload: &mut F,
        mut shutdown: std::pin::Pin<&mut futures::future::Fuse<S>>,
        changes: &mut HolderChanges,
    ) -> TermEnd<T>
    where
        S: Future<Output = ()>,
        F: FnMut(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        let shared = lease.shared().clone();
        let fencing = shared.fencing;
        let span = tracing::info_span!("term", lease = %self.inner.name, identity = %self.identity(), %fencing);
        let cancel = CancellationToken::new();
        let (term, tasks) = Term::begin(shared.clone(), self.identity(), cancel.clone());
        self.set_term(Some(shared.clone()));
        self.publish_leader(&HolderChange {
            holder: Some(self.identity().to_owned()),
            fencing: Some(fencing),
        });
        self.record_leading(true);
        tracing::info!(parent: &span, "became leader");
        self.announce(LeadershipEvent::BecameLeader {
            identity: self.identity().to_owned(),
            fencing,
        })
        .await;

        let config = &self.inner.config;
        let mut stopping: Option<Stopping> = None;
        let mut drop_at: Option<Instant> = None;
        let finished = {
            let mut work = pin!(AssertUnwindSafe(workload(term)).catch_unwind());
            let mut follow = pin!(self.follow_leader(changes));
            let mut sample = tokio::time::interval(config.lease_duration / 3);
            let mut renewals_seen = 0;
            loop {
                let deadline = drop_at;
                tokio::select! {
                    biased;
                    out = &mut work => break Some(out),
                    end = shared.wait_end(), if stopping.is_none() => {
                        cancel.cancel();
                        self.set_term(None);
                        self.record_leading(false);
                        let reason = match end {
                            LeaseEnd::Lost(reason) => reason,
                            // Only this function releases or orphans the term's lease.
                            LeaseEnd::Released | LeaseEnd::Orphaned => LostReason::NotHeld,
                        };
                        tracing::warn!(parent: &span, %reason, "stopped leading: lease lost");
                        // Told outright that the lease is gone: someone else may hold it now.
                        drop_at = Some(if matches!(reason, LostReason::NotHeld) {
                            Instant::now()
                        } else {
                            shared.valid_until() - config.stop_margin
                        });
                        stopping = Some(Stopping::Lost(reason));
                    }
                    () = &mut shutdown, if stopping.is_none() && !shutdown.is_terminated() => {
                        cancel.cancel();
                        tracing::info!(parent: &span, "shutting down: workload cancelled");
                        drop_at = Some((Instant::now() + config.grace).min(shared.valid_until() - config.stop_margin));
                        stopping = Some(Stopping::Shutdown);
                    }
                    () = sleep_until_opt(deadline) => {
                        tracing::warn!(parent: &span, "workload ignored cancellation: dropped");
                        break None;
                    }
                    never = &mut follow => match never {},
                    _ = sample.tick(), if stopping.is_none() => {
                        renewals_seen = self.record_sample(&shared, renewals_seen);
                    }
                }
            }
            // `work` is dropped here, before the release below.
        };
        // The term's tasks end before the release too, within the workload's bound: a lost
        // term's drop deadline, or the instant before anyone else can hold the lease.
        // Aborted tasks end at their next poll: leave them a moment even when the deadline
        // has passed (the store said the lease is gone), so that only a task stuck in
        // blocking code is reported.
        let tasks_deadline = drop_at
            .unwrap_or_else(|| shared.valid_until() - config.stop_margin)
            .max(Instant::now() + TASKS_MIN_WAIT);
        if !tasks.stop(tasks_deadline).await {
            tracing::error!(parent: &span, "a task of the term ignored its abort (blocking code?); releasing the lease anyway");
        }
        // A workload can finish at an instant its lease had already run out (the process was
        // frozen, say): then the term was lost, whatever the workload returned.
        if stopping.is_none()
            && let Some(LeaseEnd::Lost(reason)) = shared.end_cause()
        {
            stopping = Some(Stopping::Lost(reason));
        }
        self.set_term(None);
        self.record_leading(false);
        cancel.cancel();
        let released = lease.release().await;
        if let Err(e) = &released {
            tracing::debug!(parent: &span, error = %e, "release after the term");
        }
        // `leader()` must not keep naming this replica for a term that is over; the next
        // campaign's watch reports whoever leads next.
        self.forget_own_leadership(Some(fencing));
        tracing::info!(parent: &span, "stopped leading");
        let reason = match &stopping {
            Some(Stopping::Lost(reason)) => format!("lease lost: {reason}"),
            Some(Stopping::Shutdown) => "shut down: released".to_owned(),
            None => "workload finished: released".to_owned(),
        };
        self.announce(LeadershipEvent::StoppedLeading {
            identity: self.identity().to_owned(),
            fencing,
            reason,
        })
        .await;
        match (finished, stopping) {
            (Some(Err(panic)), _) => TermEnd::Panicked(panic_message(panic.as_ref())),
            (_, Some(Stopping::Lost(reason))) => TermEnd::Lost(fencing, reason),
            (Some(Ok(out)), _) => TermEnd::Returned(out),
            (None, _) => TermEnd::Shutdown,
        }
    }

    /// Records the event through the backend (a Kubernetes Event), bounded by the request
    /// timeout so that a slow store never delays a term by more than that.
    async fn announce(&self, event: LeadershipEvent) {
        let backend = self.inner.locker.backend();
        let timeout = self
            .inner
            .config
            .request_timeout
            .unwrap_or(self.inner.config.retry_period / 2);
        let _ = tokio::time::timeout(timeout, backend.announce(&self.inner.name, &event)).await;
    }

    #[cfg(feature = "metrics")]
    fn with_metrics_do(&self, f: impl FnOnce(&metrics::ElectionMetrics, &str)) {
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

    fn record_acquired(&self, _latency: Duration, _waited: bool) {
        #[cfg(feature = "metrics")]
        self.with_metrics_do(|m, name| m.acquired(name, _latency, _waited));
    }

    /// Samples the lease for metrics: remaining validity, and the latency of the latest
    /// renewal if one happened since the last sample. Returns the renewal count seen.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn record_sample(&self, lease: &LeaseShared, seen: u32) -> u32 {
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

    fn record_leading(&self, _leading: bool) {
        #[cfg(feature = "metrics")]
        self.with_metrics_do(|m, name| m.leading(name, _leading));
    }
}

/// Clears the "running" flag however `run_until` ends.
struct RunningGuard<'a>(&'a LeaderElector);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.set_term(None);
        // Also when `run_until` was dropped in the middle of a term.
        self.0.forget_own_leadership(None);
        self.0.contact().run_started = None;
        self.0.inner.running.store(false, Ordering::Release);
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned())
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
