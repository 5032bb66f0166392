//! `Controller`: kube-runtime's controller builder, under leadership. The same builder
//! methods, reconciler and error policy; `run` takes the elector, campaigns, and reconciles
//! only during this replica's terms, with every watched kind kept warm on followers.

use std::fmt::Debug;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt, TryFuture};
use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::{self, Action, Config};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::ControllerError;
use super::cache::{Cache, CacheMode, Primary, Settings, StandbyView};
use super::context::TermContext;
use super::feed::{CHANGES_BUFFER, CacheState, start};
use super::reconcile::reconcile_fn;
use super::triggers::{self, Source, Trigger};
use crate::election::LeaderElector;
use crate::shard::ShardedElector;
use tokio_util::task::AbortOnDropHandle;

/// Reconciles at once unless [`Controller::with_config`] says otherwise; see there.
const DEFAULT_CONCURRENCY: u16 = 256;

/// Items the output stream may fall behind a term's controller before it waits.
const OUTPUT_BUFFER: usize = 256;

/// What [`Controller::run`] and [`run_sharded`](Controller::run_sharded) yield: kube-runtime's
/// items, with [`ControllerError`] where kube-runtime has its watch error.
pub type RunItem<K, E> = Result<(ObjectRef<K>, Action), controller::Error<E, ControllerError>>;

/// A kube-runtime [`Controller`](kube::runtime::Controller) that reconciles only while this
/// replica leads: the same builder (`owns`, `watches`, `reconcile_all_on`, `reconcile_on`,
/// `with_config`, `shutdown_on_signal`, `graceful_shutdown_on`), the same reconciler and
/// error policy and [`Action`]s; [`run`](Self::run) takes a [`LeaderElector`] besides.
/// Porting a kube-rs controller means changing the `Controller` import and passing the
/// elector to `run`.
///
/// What leadership adds:
///
/// - **Reconciles run only during a term**, each as a task of it: none starts after the term
///   ends, the ones in flight finish before the lease is released, and the elector's stop
///   deadline bounds one that hangs. A term ends at the renew deadline, at a shutdown, or
///   when the lease is lost; [`run`](Self::run) then campaigns again (with
///   [`ElectionConfig::rejoin`](crate::election::ElectionConfig::rejoin)) or ends with the
///   election's error.
/// - **Every watched kind is warm on followers** ([`CacheMode::Warm`], the default): the
///   primary kind's watch and store, the owned and watched kinds' watches and the triggers
///   run on every replica from the start of `run`, and a follower keeps the next term's
///   controller ready, every object's key collected for the grant (see
///   [`standby`](Self::standby)). A new leader's first reconcile starts at once, without a
///   list request.
/// - **Each term can have its own context**: pass [`per_term`](super::per_term) where
///   kube-runtime takes an `Arc<Ctx>`, and each term's reconciles get a context made from
///   the term (its [`FencedApi`](crate::fence::kube::FencedApi)s, its token) — in
///   [`run_sharded`](Self::run_sharded) too, per shard term.
///
/// Like kube-runtime's, the builder is inert: nothing is watched or spawned until the stream
/// `run` returns is polled.
///
/// # Example
///
/// kube-rs's `configmapgen_controller`, leader-elected (the complete program is
/// `examples/configmapgen.rs`):
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use futures::StreamExt;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::api::Api;
/// use kube::runtime::controller::Action;
/// use kube::runtime::watcher;
/// use tenure::controller::Controller; // was: kube::runtime::Controller
/// # type ConfigMapGenerator = ConfigMap;
/// # #[derive(Debug, thiserror::Error)] #[error("x")] struct Error;
/// # struct Data;
/// # async fn reconcile(_: Arc<ConfigMapGenerator>, _: Arc<Data>) -> Result<Action, Error> { Ok(Action::await_change()) }
/// # fn error_policy(_: Arc<ConfigMapGenerator>, _: &Error, _: Arc<Data>) -> Action { Action::requeue(Duration::from_secs(1)) }
///
/// # async fn demo(client: kube::Client, elector: tenure::LeaderElector) {
/// let cmgs = Api::<ConfigMapGenerator>::all(client.clone());
/// let cms = Api::<ConfigMap>::all(client.clone());
/// Controller::new(cmgs, watcher::Config::default())
///     .owns(cms, watcher::Config::default())
///     .shutdown_on_signal()
///     .run(&elector, reconcile, error_policy, Arc::new(Data)) // was: .run(reconcile, …)
///     .for_each(|res| async move {
///         match res {
///             Ok(o) => println!("reconciled {o:?}"),
///             Err(e) => println!("reconcile failed: {e}"),
///         }
///     })
///     .await;
/// # }
/// ```
///
/// Requires the `kube` feature.
pub struct Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    primary: Primary<K>,
    mode: CacheMode,
    config: Config,
    standby: bool,
    sources: Vec<Source<K>>,
    graceful: Vec<BoxFuture<'static, ()>>,
    /// Set by `shutdown_on_signal`: a second signal ends the run at once.
    signals: bool,
    status: Status<K>,
}

impl<K> Debug for Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("kind", &K::kind(&()))
            .field("mode", &self.mode)
            .field("config", &self.config)
            .field("standby", &self.standby)
            .field("triggers", &self.sources.len())
            .field("shutdown_on_signal", &self.signals)
            .finish_non_exhaustive()
    }
}

impl<K> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// A controller of the objects `api` and `wc` select (kube-runtime's `Controller::new`).
    /// Nothing runs until [`run`](Self::run)'s stream is polled.
    #[must_use]
    pub fn new(api: Api<K>, wc: watcher::Config) -> Self {
        let (running, watching) = start(api.clone(), wc.clone());
        let status = Status {
            store: running.store.clone(),
            state: running.state.clone(),
            standby: Arc::new(OnceLock::new()),
            cold: false,
        };
        Self {
            primary: Primary {
                api,
                config: wc,
                warm: Some((running, watching.boxed())),
            },
            mode: CacheMode::Warm,
            config: Config::default().concurrency(DEFAULT_CONCURRENCY),
            standby: true,
            sources: Vec::new(),
            graceful: Vec::new(),
            signals: false,
            status,
        }
    }

    /// The applier's settings (kube-runtime's `with_config`: concurrency, debounce). The
    /// default is kube-runtime's with at most 256 reconciles at once (kube-runtime's own is
    /// unbounded): its runner polls every reconcile in flight at each wake-up, so 100,000 at
    /// once cost a pass over all of them per completion. The bound holds for the
    /// [`standby`](Self::standby)'s first pass at the grant and the applier together.
    #[must_use]
    pub fn with_config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Where the watches run: [`CacheMode::Warm`] (the default) on every replica from the
    /// start of the run, [`CacheMode::Cold`] only during a term (the primary kind's).
    #[must_use]
    pub fn cache_mode(mut self, mode: CacheMode) -> Self {
        self.mode = mode;
        self.status.cold = mode == CacheMode::Cold;
        self
    }

    /// Whether a follower keeps the next term's controller ready (warm mode; on by default):
    /// every object's key collected before the grant — the warm store's snapshot, then each
    /// change and trigger, once each — as controller-runtime's `EnableWarmup` keeps its work
    /// queue filled. At the grant a first pass reconciles them in that order, beside
    /// kube-runtime's applier, which takes the changes, triggers and requeues from the grant
    /// on; the first reconcile starts at once, whatever the number of objects. Without it, a
    /// new leader first queues every object in the applier (milliseconds per thousand).
    ///
    /// Nothing the reconciler does runs before the grant: the follower holds keys, and each
    /// reconcile reads the object as the store has it when it starts (one deleted meanwhile is
    /// not reconciled), polled by the term's workload. The pass and the applier never
    /// reconcile one object at once (a change during the pass's reconcile of an object is
    /// reconciled after it, as kube-runtime does for a change during a reconcile), share the
    /// concurrency of [`with_config`](Self::with_config), and the pass's requeues go to the
    /// applier. The cost, on each follower: one key per object, the CPU to collect each
    /// change (measured by `benches/kube_controller.rs`). [`run_sharded`](Self::run_sharded)
    /// keeps no standby.
    #[must_use]
    pub fn standby(mut self, on: bool) -> Self {
        self.standby = on;
        self
    }

    /// Reconciles the owner of a `Child` (kind `K`, by the child's owner references) when the
    /// child changes or is deleted, as kube-runtime's `owns`: a child deleted or edited by
    /// hand is repaired. The watch is metadata-only and runs on every replica.
    #[must_use]
    pub fn owns<Child>(mut self, api: Api<Child>, wc: watcher::Config) -> Self
    where
        Child:
            Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.sources.push(triggers::owns::<K, Child>(api, wc));
        self
    }

    /// [`owns`](Self::owns) over a stream of child objects of your own (filtered, shared with
    /// another controller): kube-runtime's `owns_stream`. Give it `touched_objects()` of a
    /// watcher, so deletions trigger too.
    #[must_use]
    pub fn owns_stream<Child>(
        mut self,
        trigger: impl Stream<Item = Result<Child, watcher::Error>> + Send + 'static,
    ) -> Self
    where
        Child: Resource<DynamicType = ()> + Send + 'static,
    {
        self.sources
            .push(triggers::owns_stream::<K, Child>(trigger));
        self
    }

    /// Reconciles the objects `mapper` names when an `Other` changes or is deleted, as
    /// kube-runtime's `watches`.
    #[must_use]
    pub fn watches<Other, I>(
        mut self,
        api: Api<Other>,
        wc: watcher::Config,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other:
            Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        self.sources.push(triggers::watches(api, wc, mapper));
        self
    }

    /// [`watches`](Self::watches) over a stream of related objects of your own:
    /// kube-runtime's `watches_stream`.
    #[must_use]
    pub fn watches_stream<Other, I>(
        mut self,
        trigger: impl Stream<Item = Result<Other, watcher::Error>> + Send + 'static,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other: Resource<DynamicType = ()> + Send + 'static,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        self.sources.push(triggers::watches_stream(trigger, mapper));
        self
    }

    /// Reconciles every object whenever `trigger` yields, as kube-runtime's
    /// `reconcile_all_on`: while leading (a trigger while following changes nothing — every
    /// object is reconciled at the grant anyway). Additive; a stream that ends stops being
    /// polled.
    #[must_use]
    pub fn reconcile_all_on(mut self, trigger: impl Stream<Item = ()> + Send + 'static) -> Self {
        self.sources.push(triggers::all_on(trigger));
        self
    }

    /// Reconciles the object each item of `trigger` names, as kube-runtime's
    /// `reconcile_on`: while leading.
    #[must_use]
    pub fn reconcile_on(
        mut self,
        trigger: impl Stream<Item = ObjectRef<K>> + Send + 'static,
    ) -> Self {
        self.sources.push(triggers::on(trigger));
        self
    }

    /// Shuts down gracefully when `trigger` completes, as kube-runtime's
    /// `graceful_shutdown_on`: the term (if this replica leads) is cancelled, no reconcile
    /// starts, the ones in flight finish, the lease is released at once (a follower takes
    /// over without waiting for it to expire), and the stream ends. Additive: the first
    /// trigger to complete counts.
    #[must_use]
    pub fn graceful_shutdown_on(
        mut self,
        trigger: impl Future<Output = ()> + Send + Sync + 'static,
    ) -> Self {
        self.graceful.push(trigger.boxed());
        self
    }

    /// Shuts down gracefully on SIGINT (Ctrl+C) or SIGTERM (how Kubernetes stops a pod), as
    /// kube-runtime's `shutdown_on_signal`; a second signal ends the stream at once
    /// (reconciles in flight are dropped; the lease is released in the background).
    ///
    /// NB: as with kube-runtime, the default handlers of both signals stay replaced after the
    /// controller has stopped.
    #[must_use]
    pub fn shutdown_on_signal(mut self) -> Self {
        self.signals = true;
        self
    }

    /// The primary kind's warm store (`None` in [`CacheMode::Cold`]): current on every
    /// replica once the run started (kube-runtime's `store`). Read it anywhere — an always-on
    /// status endpoint, say — but write only while leading.
    #[must_use]
    pub fn store(&self) -> Option<Store<K>> {
        self.status.store()
    }

    /// A handle on the controller's cache that outlives the builder: its store, how its
    /// watch is doing, whether a standby is ready.
    #[must_use]
    pub fn status(&self) -> Status<K> {
        self.status.clone()
    }

    /// Campaigns with `elector` and reconciles during each of its terms, like kube-runtime's
    /// `Controller::run`: the same `reconciler` and `error_policy`, called with the context
    /// `context` gives the term — an `Arc<Ctx>` as kube-runtime takes it, or
    /// [`per_term`](super::per_term).
    ///
    /// The stream yields every reconcile's result, across terms. It ends after a graceful
    /// shutdown (the last term's reconciles finished and its lease released), or with an item
    /// [`ControllerError::Election`] when the election ends — a lost term without
    /// [`rejoin`](crate::election::ElectionConfig::rejoin) (the default: a lost term is an
    /// error, as with client-go; with `rejoin(true)` the replica campaigns again, as
    /// kube-lease-manager and kubert do), or a store that refuses the election for good. A
    /// term whose controller cannot run (the API server refuses the watch) yields that
    /// [`ControllerError`] and ends the run. Polling it drives the election; dropping it ends
    /// the term (the lease is released in the background) and every watch.
    ///
    /// # Panics
    ///
    /// A reconcile's panic resumes here (and ends the term), as kube-runtime's.
    pub fn run<R, RFut, EP, Ctx, C>(
        mut self,
        elector: &LeaderElector,
        reconciler: R,
        error_policy: EP,
        context: C,
    ) -> impl Stream<Item = RunItem<K, RFut::Error>> + Send + use<K, R, RFut, EP, Ctx, C>
    where
        R: FnMut(Arc<K>, Arc<Ctx>) -> RFut + Send + 'static,
        RFut: TryFuture<Ok = Action> + Send + 'static,
        RFut::Error: std::error::Error + Send + 'static,
        EP: Fn(Arc<K>, &RFut::Error, Arc<Ctx>) -> Action + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
        C: TermContext<Ctx>,
    {
        let elector = elector.clone();
        let (tx, rx) = mpsc::channel(OUTPUT_BUFFER);
        let forced = CancellationToken::new();
        let (shutdown, listener) = self.shutdown(&forced);
        let run = async move {
            let runner = self.runner(reconciler, error_policy, context);
            let elected = elector
                .run_until(shutdown, move |term| {
                    let results = runner.term(&term);
                    let tx = tx.clone();
                    async move {
                        let mut results = std::pin::pin!(results);
                        while let Some(item) = results.next().await {
                            if tx.send(item).await.is_err() {
                                break;
                            }
                        }
                    }
                })
                .await;
            elected.err().map(ControllerError::Election)
        };
        output(rx, with_listener(run, listener), forced)
    }

    /// Campaigns for the shards of `sharded` and reconciles each object during its shard's
    /// term on this replica ([`shard_of`](crate::shard::shard_of) of
    /// [`object_key`](super::object_key)): the same builder, reconciler and error policy as
    /// [`run`](Self::run), with `context` asked once per shard term.
    ///
    /// Every object of a shard is reconciled as soon as the shard's term begins here — from
    /// the warm store, with no list request when shards move — and again on each change and
    /// trigger of it. Each reconcile runs as a task of its shard's term: when the shard moves
    /// away, its reconciles in flight are aborted before its lease is released. The stream
    /// ends after a graceful shutdown, or with [`ControllerError::Sharded`] when the sharded
    /// election ends.
    ///
    /// # Panics
    ///
    /// A reconcile's panic resumes here.
    pub fn run_sharded<R, RFut, EP, Ctx, C>(
        mut self,
        sharded: &ShardedElector,
        reconciler: R,
        error_policy: EP,
        context: C,
    ) -> impl Stream<Item = RunItem<K, RFut::Error>> + Send + use<K, R, RFut, EP, Ctx, C>
    where
        R: FnMut(Arc<K>, Arc<Ctx>) -> RFut + Send + 'static,
        RFut: TryFuture<Ok = Action> + Send + 'static,
        RFut::Error: std::error::Error + Send + 'static,
        EP: Fn(Arc<K>, &RFut::Error, Arc<Ctx>) -> Action + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
        C: TermContext<Ctx>,
    {
        let sharded = sharded.clone();
        let (tx, rx) = mpsc::channel(OUTPUT_BUFFER);
        let forced = CancellationToken::new();
        let (shutdown, listener) = self.shutdown(&forced);
        let run = async move {
            let runner = self.runner(reconciler, error_policy, context);
            let stop = CancellationToken::new();
            let results = runner.sharded(&sharded, stop.clone().cancelled_owned());
            let forward = async move {
                let mut results = std::pin::pin!(results);
                while let Some(item) = results.next().await {
                    if tx.send(item).await.is_err() {
                        break;
                    }
                }
            };
            let elected = sharded.run_until(shutdown, |_, term| async move {
                // The shard's reconciles are its tasks (see `Runner::sharded`): the workload
                // holds the term until it ends.
                term.cancellation().cancelled().await;
            });
            let mut forward = std::pin::pin!(forward);
            let elected = tokio::select! {
                elected = elected => elected,
                // The queue ended by itself (a refused watch): the run ends with it.
                () = &mut forward => Ok(()),
            };
            // Every shard term has ended (shutdown) or the election failed: no more requests.
            stop.cancel();
            forward.await;
            elected.err().map(ControllerError::Sharded)
        };
        output(rx, with_listener(run, listener), forced)
    }

    /// Starts the controller's watches and triggers now, with its reconciler, and returns a
    /// [`Runner`] that reconciles during the terms you give it: for an election loop of your
    /// own (a [`Replica`](super::Replica) with always-on parts, say), where [`run`](Self::run)
    /// would drive the elector itself. Graceful shutdown and signals are then yours too
    /// (`shutdown_on_signal` and `graceful_shutdown_on` do nothing here).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it spawns the watches).
    pub fn runner<R, RFut, EP, Ctx, C>(
        self,
        reconciler: R,
        error_policy: EP,
        context: C,
    ) -> Runner<K, Ctx, RFut::Error>
    where
        R: FnMut(Arc<K>, Arc<Ctx>) -> RFut + Send + 'static,
        RFut: TryFuture<Ok = Action> + Send + 'static,
        RFut::Error: std::error::Error + Send + 'static,
        EP: Fn(Arc<K>, &RFut::Error, Arc<Ctx>) -> Action + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
        C: TermContext<Ctx>,
    {
        let Self {
            mut primary,
            config,
            standby,
            sources,
            status,
            mode,
            ..
        } = self;
        if mode == CacheMode::Cold {
            primary.warm = None;
        }
        let (triggers, _) = broadcast::channel::<Trigger<K>>(CHANGES_BUFFER);
        let sources =
            AbortOnDropHandle::new(tokio::spawn(triggers::drive(sources, triggers.clone())));
        let cache = Cache::start(
            primary,
            Settings { config, standby },
            triggers,
            reconcile_fn(reconciler, error_policy),
        );
        let _ = status.standby.set(cache.view());
        Runner {
            cache,
            context: Arc::new(Mutex::new(Box::new(context))),
            sources: Arc::new(sources),
            status,
        }
    }

    /// The graceful shutdown future of `graceful_shutdown_on` and `shutdown_on_signal`, and the
    /// signal listener to drive beside the run.
    fn shutdown(
        &mut self,
        forced: &CancellationToken,
    ) -> (
        impl Future<Output = ()> + Send + use<K>,
        Option<BoxFuture<'static, ()>>,
    ) {
        let mut graceful = std::mem::take(&mut self.graceful);
        let listener = self.signals.then(|| {
            let (first, listener) = signal_shutdown(forced.clone());
            graceful.push(first);
            listener
        });
        let shutdown = async move {
            if graceful.is_empty() {
                std::future::pending::<()>().await;
            } else {
                futures::future::select_all(graceful).await;
            }
        };
        (shutdown, listener)
    }
}

/// A started controller ([`Controller::runner`]): its watches and triggers run, and it
/// reconciles during each term it is given. Clones share it; the watches stop when the last
/// clone is dropped.
pub struct Runner<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
    E: 'static,
{
    cache: Cache<K, Ctx, E>,
    context: Arc<Mutex<Box<dyn TermContext<Ctx>>>>,
    sources: Arc<AbortOnDropHandle<()>>,
    status: Status<K>,
}

impl<K, Ctx, E> Clone for Runner<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
    E: 'static,
{
    fn clone(&self) -> Self {
        Self {
            cache: self.cache.clone(),
            context: self.context.clone(),
            sources: self.sources.clone(),
            status: self.status.clone(),
        }
    }
}

impl<K, Ctx, E> Debug for Runner<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
    E: 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl<K, Ctx, E> Runner<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
{
    /// Reconciles for as long as `term` lasts, with the context made for it: the standby
    /// made ready before the grant (warm mode), or a controller built now.
    ///
    /// Every object is reconciled once at the start (from the warm store: no list request),
    /// then again on each change of it, each trigger and each requeue. When the term ends, no
    /// new reconcile starts, the ones in flight finish (kube-runtime's graceful shutdown), and
    /// the stream ends; the elector drops it at the term's stop deadline if one hangs. The
    /// first item is a [`ControllerError`] if the watch cannot be served.
    pub fn term(
        &self,
        term: &crate::election::Term,
    ) -> impl Stream<Item = RunItem<K, E>> + Send + use<K, Ctx, E> {
        let ctx = self
            .context
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .for_term(term);
        // The triggers run as long as any term's stream does.
        let sources = self.sources.clone();
        self.cache.term(term, ctx).map(move |item| {
            let _ = &sources;
            item
        })
    }

    /// Reconciles the objects of the shards `sharded` holds here, each during its shard's
    /// term, until `shutdown` completes (see [`Controller::run_sharded`]); run
    /// [`ShardedElector::run_until`] beside it.
    pub fn sharded<S>(
        &self,
        sharded: &ShardedElector,
        shutdown: S,
    ) -> impl Stream<Item = RunItem<K, E>> + Send + use<K, Ctx, E, S>
    where
        S: Future<Output = ()> + Send + 'static,
    {
        let sources = self.sources.clone();
        self.cache
            .sharded(sharded, shutdown, self.context.clone())
            .map(move |item| {
                let _ = &sources;
                item
            })
    }

    /// The cache's status (as [`Controller::status`]).
    #[must_use]
    pub fn status(&self) -> &Status<K> {
        &self.status
    }
}

/// The stream of a run: every item sent to `rx` while `run` drives the election, then the
/// error `run` ends with, if any; ended at once when `forced` fires.
fn output<K, E>(
    rx: mpsc::Receiver<RunItem<K, E>>,
    run: impl Future<Output = Option<ControllerError>> + Send + 'static,
    forced: CancellationToken,
) -> impl Stream<Item = RunItem<K, E>> + Send
where
    K: Resource<DynamicType = ()> + 'static,
    E: Send + 'static,
{
    struct State<K: Resource<DynamicType = ()> + 'static, E: 'static> {
        rx: mpsc::Receiver<RunItem<K, E>>,
        run: Option<Pin<Box<dyn Future<Output = Option<ControllerError>> + Send>>>,
        /// The run's error, yielded once its items are drained.
        ended: Option<ControllerError>,
    }
    let state = State {
        rx,
        run: Some(Box::pin(run)),
        ended: None,
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(run) = state.run.as_mut() {
                tokio::select! {
                    // Items first: a term's results are yielded before the run's end.
                    biased;
                    item = state.rx.recv() => {
                        if let Some(item) = item {
                            return Some((item, state));
                        }
                    }
                    ended = run => {
                        state.run = None;
                        state.ended = ended;
                    }
                }
            } else {
                // The run is over and every sender with it: drain, then its error.
                if let Some(item) = state.rx.recv().await {
                    return Some((item, state));
                }
                let e = state.ended.take()?;
                return Some((Err(controller::Error::QueueError(e)), state));
            }
        }
    })
    .take_until(forced.cancelled_owned())
}

/// The signal handling of `shutdown_on_signal`: a future that completes on the first SIGINT or
/// SIGTERM (the graceful shutdown), and the listener that must be driven for as long as the
/// run lasts, which fires `forced` on the second.
fn signal_shutdown(forced: CancellationToken) -> (BoxFuture<'static, ()>, BoxFuture<'static, ()>) {
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    let listener = async move {
        let signal = || async {
            use tokio::signal::unix::{SignalKind, signal};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl+C only");
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        };
        signal().await;
        tracing::info!("shutdown signal: handing leadership over; send it again to stop at once");
        let _ = first_tx.send(());
        signal().await;
        tracing::info!("second shutdown signal: stopping at once");
        forced.cancel();
    };
    let first = async move {
        // A dropped sender (the listener gone with the run) is no signal.
        if first_rx.await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    (first.boxed(), listener.boxed())
}

/// `run` with the signal `listener` driven beside it for as long as it lasts.
async fn with_listener(
    run: impl Future<Output = Option<ControllerError>>,
    listener: Option<BoxFuture<'static, ()>>,
) -> Option<ControllerError> {
    let Some(listener) = listener else {
        return run.await;
    };
    let mut run = std::pin::pin!(run);
    tokio::select! {
        ended = &mut run => ended,
        // The second signal: `forced` ends the output at once; nothing more to report.
        () = listener => None,
    }
}

/// A handle on a controller's cache: its store, its watch's state, whether a standby is
/// ready. Cheap to clone; taken from [`Controller::status`] before `run`.
pub struct Status<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    state: tokio::sync::watch::Receiver<CacheState>,
    standby: Arc<OnceLock<Weak<dyn StandbyView>>>,
    cold: bool,
}

impl<K> Clone for Status<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            state: self.state.clone(),
            standby: self.standby.clone(),
            cold: self.cold,
        }
    }
}

impl<K> Debug for Status<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Status")
            .field("state", &self.state())
            .field("standby_ready", &self.standby_ready())
            .finish_non_exhaustive()
    }
}

impl<K> Status<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// The primary kind's warm store (`None` in cold mode).
    #[must_use]
    pub fn store(&self) -> Option<Store<K>> {
        (!self.cold).then(|| self.store.clone())
    }

    /// How the primary kind's warm watch is doing; [`CacheState::Starting`] before the run
    /// and in cold mode.
    #[must_use]
    pub fn state(&self) -> CacheState {
        if self.cold {
            return CacheState::Starting;
        }
        self.state.borrow().clone()
    }

    /// Whether a controller stands ready for this replica's next term (see
    /// [`Controller::standby`]): the store has listed and every object's key is collected for
    /// the grant. False before the run, in cold mode, with the standby off, while a term uses it,
    /// and until the next is ready after that term.
    #[must_use]
    pub fn standby_ready(&self) -> bool {
        self.standby
            .get()
            .and_then(Weak::upgrade)
            .is_some_and(|s| s.standby_ready())
    }
}
