//! The watched objects of one kind for a controller under leadership: the watch kept warm on
//! every replica (or started per term, in cold mode), a standby controller for the next term,
//! and `Cache::run`, which hands a term its controller.

use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use futures::{Stream, StreamExt, TryFuture};
use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::{Action, Config, ReconcileRequest};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::ControllerError;
use super::feed::{CacheState, Running, requests, start, warm_or_refused};
use super::standby::{Session, Standby};
use crate::election::Term;

/// Reconciles at once unless [`Cache::controller_config`] says otherwise; see there.
const DEFAULT_CONCURRENCY: u16 = 256;

/// Whether the cache's watch runs on every replica or only during a term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMode {
    /// The watch and the store start once, on every replica, and stay current: a new leader's
    /// first reconcile needs no list. Costs each follower the store's memory and one watch.
    Warm,
    /// The watch starts when a term begins and stops when it ends: followers hold nothing,
    /// and every new leader lists everything before its first reconcile.
    Cold,
}

/// The watched objects of one kind for a controller that runs only while leading.
///
/// Objects are stored without their `managedFields` (as controller-runtime's cache keeps
/// them): the API server's record of field owners, and most of a small object's size.
///
/// Build it once per process, beside the elector. In [`CacheMode::Warm`] (the default) the
/// watch and its store start at once and stay current on every replica, leader or not; a new
/// leader's [`run`](Self::run) reconciles from the store without listing anything. In
/// [`CacheMode::Cold`] nothing runs outside a term.
///
/// Clones share the cache.
///
/// # Example
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use futures::StreamExt;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::runtime::{controller::Action, watcher};
/// use tenure::controller::Cache;
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("reconcile failed")]
/// struct Failed;
///
/// async fn reconcile(cm: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, Failed> {
///     Ok(Action::requeue(Duration::from_secs(300)))
/// }
///
/// # async fn demo(client: kube::Client, elector: tenure::LeaderElector) -> Result<(), tenure::ElectionError> {
/// let cache = Cache::new(kube::Api::<ConfigMap>::default_namespaced(client), watcher::Config::default());
/// elector
///     .run(|term| {
///         let cache = cache.clone();
///         async move {
///             cache
///                 .run(&term, reconcile, |_, _, _| Action::requeue(Duration::from_secs(5)), Arc::new(()))
///                 .for_each(|_| async {})
///                 .await
///         }
///     })
///     .await
/// # }
/// ```
pub struct Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K> Debug for Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("kind", &K::kind(&()))
            .field("mode", &self.inner.mode)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

struct Inner<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    api: Api<K>,
    watch_config: watcher::Config,
    mode: CacheMode,
    controller_config: Config,
    /// The always-on watch in warm mode; `None` in cold mode.
    warm: Option<Running<K>>,
    /// Whether followers keep a controller ready for the next term (warm mode only).
    standby_on: bool,
    /// The controller kept ready for the next term (warm mode, between terms).
    standby: Mutex<Option<Standby<K>>>,
    /// Stops the warm watch when the last clone of the cache is dropped.
    stop: CancellationToken,
}

impl<K> Drop for Inner<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// A warm cache of the objects `api` and `config` select: the watch starts now, on the
    /// current tokio runtime, and runs until the last clone of the cache is dropped.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it spawns the watch).
    pub fn new(api: Api<K>, config: watcher::Config) -> Self {
        Self::with_mode(api, config, CacheMode::Warm)
    }

    /// A cache in `mode`: [`CacheMode::Warm`] as [`new`](Self::new), or
    /// [`CacheMode::Cold`], whose watch runs only during a term.
    ///
    /// # Panics
    ///
    /// In warm mode, outside a tokio runtime (it spawns the watch).
    pub fn with_mode(api: Api<K>, config: watcher::Config, mode: CacheMode) -> Self {
        let stop = CancellationToken::new();
        let warm = (mode == CacheMode::Warm).then(|| {
            let (running, watching) = start(api.clone(), config.clone());
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = watching => {}
                    () = stop.cancelled() => {}
                }
            });
            running
        });
        let cache = Self {
            inner: Arc::new(Inner {
                api,
                watch_config: config,
                mode,
                controller_config: Config::default().concurrency(DEFAULT_CONCURRENCY),
                warm,
                standby_on: true,
                standby: Mutex::new(None),
                stop,
            }),
        };
        cache.inner.prepare_standby();
        cache
    }

    /// The kube-runtime controller settings (concurrency, debounce) of [`run`](Self::run) and
    /// [`run_sharded`](Self::run_sharded). The default is kube-runtime's with at most 256
    /// reconciles at once (kube-runtime's own is unbounded): its runner polls every reconcile
    /// in flight at each wake-up, so 100,000 at once cost a pass over all of them per
    /// completion, and the [`standby`](Self::standby) parks one reconcile per slot. Set an
    /// unbounded concurrency (0) with the standby on and every object waits parked in a slot.
    ///
    /// # Panics
    ///
    /// Never; it is a builder method to call before the cache is cloned. On a cache already
    /// shared it leaves the settings unchanged and logs a warning.
    #[must_use]
    pub fn controller_config(self, config: Config) -> Self {
        self.configure("controller_config", |inner| {
            inner.controller_config = config
        })
    }

    /// Whether a follower keeps [`run`](Self::run)'s controller ready for its next term
    /// (warm mode; on by default): kube-runtime's applier built over the warm store and fed
    /// every object before the grant, each reconcile parked until the grant, as
    /// controller-runtime's `EnableWarmup` keeps its work queue filled. The first reconcile
    /// after a grant then starts at once, whatever the number of objects; without it, a new
    /// leader first queues every object (milliseconds per thousand).
    ///
    /// Nothing the reconciler does runs before the grant: a parked reconcile holds the
    /// object's key, reads the object as it is at the grant (one deleted meanwhile is not
    /// reconciled) and runs as a task of the term. An object that changed while parked is
    /// reconciled once more after its first reconcile, as kube-runtime does for a change
    /// during a reconcile. The cost, on each follower: the applier's queue, one parked
    /// future per slot of its concurrency (measured by `benches/kube_controller.rs`), and
    /// the CPU to queue each change. Turn it off for a cache that only [`queue`](Self::queue) or
    /// [`run_sharded`](Self::run_sharded) reads.
    ///
    /// # Panics
    ///
    /// Never; it is a builder method to call before the cache is cloned. On a cache already
    /// shared it leaves the setting unchanged and logs a warning.
    #[must_use]
    pub fn standby(self, on: bool) -> Self {
        self.configure("standby", |inner| inner.standby_on = on)
    }

    /// A builder method's change to a cache not yet shared; the standby, built with the
    /// settings before, is built again. On a shared cache: a warning, nothing changed.
    fn configure(mut self, method: &str, change: impl FnOnce(&mut Inner<K>)) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => {
                change(inner);
                inner.replace_standby();
            }
            None => tracing::warn!("{method} on a shared cache: ignored"),
        }
        self
    }

    /// Warm or cold.
    #[must_use]
    pub fn mode(&self) -> CacheMode {
        self.inner.mode
    }

    /// How the warm watch is doing; [`CacheState::Starting`] in cold mode.
    #[must_use]
    pub fn state(&self) -> CacheState {
        self.inner
            .warm
            .as_ref()
            .map_or(CacheState::Starting, |w| w.state.borrow().clone())
    }

    /// Whether a controller stands ready for this replica's next term (see
    /// [`standby`](Self::standby)): the store has listed and every object waits, parked, for
    /// the grant. False in cold mode, with the standby turned off, while a term's
    /// [`run`](Self::run) uses it, and until the next is ready after that term.
    #[must_use]
    pub fn standby_ready(&self) -> bool {
        self.inner
            .standby
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(Standby::is_armed)
    }

    /// The warm store, current on every replica (`None` in cold mode). Read it anywhere —
    /// an always-on status endpoint, say — but write only while leading.
    #[must_use]
    pub fn store(&self) -> Option<Store<K>> {
        self.inner.warm.as_ref().map(|w| w.store.clone())
    }

    /// Reconciles the cache's objects with kube-runtime's [`applier`](kube::runtime::controller::applier) for as long as `term`
    /// lasts, like [`Controller::run`](kube::runtime::Controller::run).
    ///
    /// Every object is reconciled once at the start (from the warm store: no list request),
    /// then again on each change (a deletion is not one: the object is gone from the store)
    /// and each requeue. With the [`standby`](Self::standby) (the default in warm mode), the
    /// applier was built on this follower before the grant and every object is already
    /// queued: the first reconcile starts at once. When the term ends, no new reconcile
    /// starts, the ones in flight finish (kube-runtime's graceful shutdown), and the stream
    /// ends; the elector drops it at the term's stop deadline if one hangs.
    ///
    /// The first item is a [`ControllerError`] if the watch cannot be served: the API server
    /// refuses it (RBAC), or it has not listed by the end of the term's validity and is failing.
    pub fn run<R, RFut, EP, Ctx>(
        &self,
        term: &Term,
        reconciler: R,
        error_policy: EP,
        context: Arc<Ctx>,
    ) -> impl Stream<
        Item = Result<
            (ObjectRef<K>, Action),
            kube::runtime::controller::Error<RFut::Error, ControllerError>,
        >,
    > + Send
    + use<K, R, RFut, EP, Ctx>
    where
        R: FnMut(Arc<K>, Arc<Ctx>) -> RFut + Send + 'static,
        RFut: TryFuture<Ok = Action> + Send + 'static,
        RFut::Error: std::error::Error + Send + 'static,
        EP: Fn(Arc<K>, &RFut::Error, Arc<Ctx>) -> Action + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
    {
        // Each reconcile runs as a task of the term, as `Controller::run` spawns them: they
        // run in parallel, a panic resurfaces here (and ends the term), and any still running
        // when the term's workload is dropped are aborted and awaited before the release.
        let session = Session::new(term, reconciler, error_policy, context);
        let standby = match self.take_standby() {
            Some(standby) => {
                standby.open(session);
                standby
            }
            None => {
                let running = self.for_term(term);
                let valid = term.clone();
                let ready = warm_or_refused(running.state.clone(), move || valid.valid_until());
                Standby::prepare(running, ready, self.applier_config(), Some(session))
            }
        };
        // When the term's controller is gone (ended, or dropped at the stop deadline), the
        // next one is made ready.
        let next = NextStandby(Arc::downgrade(&self.inner));
        standby.results().map(move |item| {
            let _ = &next;
            item
        })
    }

    /// The standby made ready for this term, if one is and no other term took it.
    fn take_standby(&self) -> Option<Standby<K>> {
        let mut slot = self
            .inner
            .standby
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // One that is not ready (the store never listed, or its applier ended) is dropped:
        // the term builds its own and reports why it cannot run.
        slot.take().filter(Standby::is_armed)
    }

    /// The warm watch, or in cold mode a new one and the future that drives it.
    pub(super) fn watch_for_run(
        &self,
    ) -> (Running<K>, Option<impl Future<Output = ()> + Send + use<K>>) {
        match &self.inner.warm {
            Some(warm) => (warm.clone(), None),
            None => {
                let (running, watching) =
                    start(self.inner.api.clone(), self.inner.watch_config.clone());
                (running, Some(watching))
            }
        }
    }

    pub(super) fn applier_config(&self) -> Config {
        self.inner.controller_config.clone()
    }

    /// The running watch for `term`: the warm one, or in cold mode one bound to the term.
    fn for_term(&self, term: &Term) -> Running<K> {
        let (running, watching) = self.watch_for_run();
        if let Some(watching) = watching {
            drop(term.spawn(watching));
        }
        running
    }

    /// The reconcile requests for `term`, for wiring an [`applier`](kube::runtime::controller::applier) by hand (several kinds
    /// into one reconciler, say): every object once the cache is current, then each change
    /// (not deletions), ending when the term ends. A queue that falls more than 4,096 changes behind resyncs:
    /// it requests every object again.
    pub fn queue(
        &self,
        term: &Term,
    ) -> impl Stream<Item = Result<ReconcileRequest<K>, ControllerError>> + Send + use<K> {
        let running = self.for_term(term);
        let valid = term.clone();
        let ready = warm_or_refused(running.state.clone(), move || valid.valid_until());
        requests(
            running,
            ready,
            term.cancellation().clone().cancelled_owned(),
        )
    }
}

impl<K> Inner<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Makes a controller ready for the next term, unless one is or none is wanted.
    fn prepare_standby(&self) {
        let (Some(warm), true) = (&self.warm, self.standby_on) else {
            return;
        };
        let mut slot = self.standby.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            let mut state = warm.state.clone();
            // Armed once the store has listed; a refused watch leaves it unarmed and the
            // term reports the refusal.
            let ready = async move {
                state
                    .wait_for(|s| *s == CacheState::Warm)
                    .await
                    .map(|_| ())
                    .map_err(|_| ControllerError::WatchStopped)
            };
            *slot = Some(Standby::prepare(
                warm.clone(),
                ready,
                self.controller_config.clone(),
                None,
            ));
        }
    }

    fn replace_standby(&mut self) {
        *self
            .standby
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.prepare_standby();
    }
}

/// Makes the next term's controller ready when dropped with the current one's stream.
struct NextStandby<K>(Weak<Inner<K>>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static;

impl<K> Drop for NextStandby<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn drop(&mut self) {
        // Preparing spawns the applier's driver: only inside a runtime (the stream is
        // dropped in the workload's, except by a caller that moved it out of any).
        if let (Some(inner), Ok(_)) = (self.0.upgrade(), tokio::runtime::Handle::try_current()) {
            inner.prepare_standby();
        }
    }
}
