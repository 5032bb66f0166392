//! The primary kind's watched objects under a running controller: the watch kept warm on
//! every replica (or started per term, in cold mode), the standby made ready for the next
//! term, and each term's controller.

use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::{self, Action, Config};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

use super::ControllerError;
use super::feed::{CacheState, Running, start, warm_or_refused};
use super::reconcile::{ReconcileFn, Session};
use super::standby::{Standby, without_standby};
use super::triggers::Trigger;
use crate::election::Term;
use tokio_util::task::AbortOnDropHandle;

/// Whether the controller's watches run on every replica or only during a term.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheMode {
    /// The watch and the store start with the controller's run, on every replica, and stay
    /// current: a new leader's first reconcile needs no list. Costs each follower the
    /// store's memory and one watch per kind.
    #[default]
    Warm,
    /// The primary kind's watch starts when a term begins and stops when it ends: followers
    /// hold no objects, and every new leader lists everything before its first reconcile.
    /// (Owned and watched kinds keep their watches, which hold no objects.)
    Cold,
}

/// The primary kind's watch as the builder made it: not running until the controller runs.
pub(super) struct Primary<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    pub(super) api: Api<K>,
    pub(super) config: watcher::Config,
    /// In warm mode, the watch's handles and the future that drives it, not yet polled.
    pub(super) warm: Option<(Running<K>, futures::future::BoxFuture<'static, ()>)>,
}

/// What a running controller's primary cache needs besides its watch.
pub(super) struct Settings {
    pub(super) config: Config,
    pub(super) standby: bool,
}

/// The primary cache of a running controller. Clones share it.
pub(super) struct Cache<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
    E: 'static,
{
    inner: Arc<Inner<K, Ctx, E>>,
}

impl<K, Ctx, E> Clone for Cache<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
    E: 'static,
{
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
    E: 'static,
{
    api: Api<K>,
    watch_config: watcher::Config,
    controller_config: Config,
    /// The always-on watch in warm mode; `None` in cold mode.
    warm: Option<Running<K>>,
    /// Drives the warm watch for as long as the cache lives.
    _watching: Option<AbortOnDropHandle<()>>,
    /// Owned and watched objects' triggers, and `reconcile_all_on` / `reconcile_on`.
    triggers: broadcast::Sender<Trigger<K>>,
    reconcile: ReconcileFn<K, Ctx, E>,
    /// Whether followers keep a controller ready for the next term (warm mode only).
    standby_on: bool,
    /// The controller kept ready for the next term (warm mode, between terms).
    standby: Mutex<Option<Standby<K, Ctx, E>>>,
}

/// Whether a running cache has a controller ready for the next term, seen from a handle
/// that does not know its reconciler's types.
pub(super) trait StandbyView: Send + Sync {
    fn standby_ready(&self) -> bool;
}

impl<K, Ctx, E> StandbyView for Inner<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
{
    fn standby_ready(&self) -> bool {
        self.standby
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(Standby::is_armed)
    }
}

impl<K, Ctx, E> Cache<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
{
    /// Starts the primary cache: the warm watch (if any) on the current runtime, and a
    /// standby for the first term.
    pub(super) fn start(
        primary: Primary<K>,
        settings: Settings,
        triggers: broadcast::Sender<Trigger<K>>,
        reconcile: ReconcileFn<K, Ctx, E>,
    ) -> Self {
        let (warm, watching) = match primary.warm {
            Some((running, watching)) => (
                Some(running),
                Some(AbortOnDropHandle::new(tokio::spawn(watching))),
            ),
            None => (None, None),
        };
        let cache = Self {
            inner: Arc::new(Inner {
                api: primary.api,
                watch_config: primary.config,
                controller_config: settings.config,
                warm,
                _watching: watching,
                triggers,
                reconcile,
                standby_on: settings.standby,
                standby: Mutex::new(None),
            }),
        };
        cache.inner.prepare_standby();
        cache
    }

    /// A view of the standby for a handle that outlives nothing.
    pub(super) fn view(&self) -> Weak<dyn StandbyView> {
        let inner: Arc<dyn StandbyView> = self.inner.clone();
        Arc::downgrade(&inner)
    }

    /// Reconciles for as long as `term` lasts, with `ctx` as the reconciles' context: the
    /// standby made ready before the grant (warm mode), or a controller built now.
    ///
    /// Every object is reconciled once at the start (from the warm store: no list request),
    /// then again on each change of it, each trigger and each requeue. When the term ends, no
    /// new reconcile starts, the ones in flight finish (kube-runtime's graceful shutdown), and
    /// the stream ends; the elector drops it at the term's stop deadline if one hangs. The
    /// first item is a [`ControllerError`] if the watch cannot be served.
    pub(super) fn term(
        &self,
        term: &Term,
        ctx: Arc<Ctx>,
    ) -> impl Stream<Item = Result<(ObjectRef<K>, Action), controller::Error<E, ControllerError>>>
    + Send
    + use<K, Ctx, E> {
        let session = Arc::new(Session {
            term: term.clone(),
            ctx,
        });
        let results = match self.take_standby() {
            Some(standby) => standby.grant(session),
            None => {
                let running = self.for_term(term);
                let valid = term.clone();
                let ready = warm_or_refused(running.state.clone(), move || valid.valid_until());
                without_standby(
                    running,
                    &self.inner.triggers,
                    ready,
                    self.inner.controller_config.clone(),
                    self.inner.reconcile.clone(),
                    session,
                )
            }
        };
        // When the term's controller is gone (ended, or dropped at the stop deadline), the
        // next one is made ready.
        let next = NextStandby(Arc::downgrade(&self.inner));
        ends_at_queue_error(results).map(move |item| {
            let _ = &next;
            item
        })
    }

    /// The standby made ready for this term, if one is and no other term took it.
    fn take_standby(&self) -> Option<Standby<K, Ctx, E>> {
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
    ) -> (
        Running<K>,
        Option<impl Future<Output = ()> + Send + use<K, Ctx, E>>,
    ) {
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

    pub(super) fn triggers(&self) -> &broadcast::Sender<Trigger<K>> {
        &self.inner.triggers
    }

    pub(super) fn reconcile(&self) -> &ReconcileFn<K, Ctx, E> {
        &self.inner.reconcile
    }

    /// The running watch for `term`: the warm one, or in cold mode one bound to the term.
    fn for_term(&self, term: &Term) -> Running<K> {
        let (running, watching) = self.watch_for_run();
        if let Some(watching) = watching {
            drop(term.spawn(watching));
        }
        running
    }
}

impl<K, Ctx, E> Inner<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
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
                &self.triggers,
                ready,
                self.controller_config.clone(),
                self.reconcile.clone(),
            ));
        }
    }
}

/// Makes the next term's controller ready when dropped with the current one's stream.
struct NextStandby<K, Ctx, E>(Weak<Inner<K, Ctx, E>>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static;

impl<K, Ctx, E> Drop for NextStandby<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
{
    fn drop(&mut self) {
        // Preparing spawns the applier's driver: only inside a runtime (the stream is
        // dropped in the workload's, except by a caller that moved it out of any).
        if let (Some(inner), Ok(_)) = (self.0.upgrade(), tokio::runtime::Handle::try_current()) {
            inner.prepare_standby();
        }
    }
}

/// `items` up to and including the first queue error (the watch cannot be served): the
/// applier would wait for its store for ever, so the term's controller ends there and the
/// caller hears why.
pub(super) fn ends_at_queue_error<K, E>(
    items: impl Stream<Item = Result<(ObjectRef<K>, Action), controller::Error<E, ControllerError>>>
    + Send,
) -> impl Stream<Item = Result<(ObjectRef<K>, Action), controller::Error<E, ControllerError>>> + Send
where
    K: Resource<DynamicType = ()> + 'static,
    E: 'static,
{
    futures::stream::unfold(Some(Box::pin(items)), |items| async move {
        let mut items = items?;
        let item = items.next().await?;
        let next = (!matches!(item, Err(controller::Error::QueueError(_)))).then_some(items);
        Some((item, next))
    })
}
