//! A controller under sharded leadership: one applier per replica over the warm cache, fed
//! only the objects whose shard this replica holds, each reconcile a task of its shard's term.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;

use futures::future::Either;
use futures::{Stream, StreamExt, TryFuture, TryFutureExt};
use kube::Resource;
use kube::runtime::controller::{Action, ReconcileRequest, applier};
use kube::runtime::reflector::{ObjectRef, Store};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

use super::ControllerError;
use super::cache::Cache;
use super::feed::{Reconcile, Running, warm_or_refused};
use crate::election::Term;
use crate::shard::{ShardedElector, shard_of};
use crate::util::AbortOnDrop;

/// The key an object is sharded by: `namespace/name`, or `name` for a cluster-scoped object
/// ([`shard_of`] of it gives the shard, in any language).
#[must_use]
pub fn object_key<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    }
}

fn ref_key<K: Resource<DynamicType = ()>>(r: &ObjectRef<K>) -> String {
    match r.namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", r.name),
        None => r.name.clone(),
    }
}

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Reconciles the objects whose shard ([`shard_of`] of [`object_key`]) has a term on this
    /// replica, until `shutdown` completes: run it beside
    /// [`ShardedElector::run_until`](crate::shard::ShardedElector::run_until).
    ///
    /// Every object of a shard is reconciled as soon as the shard's term begins here — from
    /// the warm store, with no list request when shards move — and again on each change. The
    /// reconciler gets the shard's [`Term`] (its fencing token for writes) and runs as a task
    /// of that term: when the shard moves away, its reconciles in flight are aborted before
    /// its lease is released, and changes to its objects are no longer reconciled here.
    ///
    /// The first item is a [`ControllerError`] if the watch cannot be served.
    pub fn run_sharded<R, RFut, EP, Ctx, S>(
        &self,
        sharded: &ShardedElector,
        shutdown: S,
        reconciler: R,
        error_policy: EP,
        context: Arc<Ctx>,
    ) -> impl Stream<
        Item = Result<
            (ObjectRef<K>, Action),
            kube::runtime::controller::Error<RFut::Error, ControllerError>,
        >,
    > + Send
    + use<K, R, RFut, EP, Ctx, S>
    where
        R: Fn(Arc<K>, Term, Arc<Ctx>) -> RFut + Send + Sync + 'static,
        RFut: TryFuture<Ok = Action> + Send + 'static,
        RFut::Error: std::error::Error + Send + 'static,
        EP: Fn(Arc<K>, &RFut::Error, Arc<Ctx>) -> Action + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
        S: Future<Output = ()> + Send + 'static,
    {
        let (running, watching) = self.watch_for_run();
        let store = running.store.clone();
        let terms = sharded.clone();
        let queue = sharded_queue(running, sharded.clone(), watching).take_until(shutdown);
        applier(
            move |obj: Arc<K>, ctx| {
                let shard = shard_of(&object_key(&*obj), terms.shards());
                match terms.term(shard) {
                    Some(term) => {
                        let work = TryFutureExt::into_future(reconciler(obj, term.clone(), ctx));
                        Either::Left(Reconcile(term.spawn(work)))
                    }
                    // The shard moved away since the request was queued.
                    None => Either::Right(std::future::ready(Ok(Action::await_change()))),
                }
            },
            error_policy,
            context,
            store,
            queue,
            self.applier_config(),
        )
    }
}

/// The requests of one replica: once the cache is current, the objects of each shard whose
/// term begins here, and every change to an object of a shard held here.
fn sharded_queue<K>(
    running: Running<K>,
    sharded: ShardedElector,
    watching: Option<impl Future<Output = ()> + Send + 'static>,
) -> impl Stream<Item = Result<ReconcileRequest<K>, ControllerError>> + Send
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    // In cold mode the watch lives as long as this queue.
    let watch_task = watching.map(|w| AbortOnDrop(tokio::spawn(w)));
    let changes = running.changes.subscribe();
    let store = running.store.clone();
    let shards = sharded.shards();
    let far = tokio::time::Instant::now() + std::time::Duration::from_secs(365 * 24 * 3600);
    futures::stream::once(warm_or_refused(running.state.clone(), move || far)).flat_map(
        move |ready| -> futures::stream::BoxStream<'static, _> {
            match ready {
                Err(e) => Box::pin(futures::stream::iter([Err(e)])),
                Ok(()) => {
                    let state = State {
                        changes: changes.resubscribe(),
                        owned: sharded.owned(),
                        held: BTreeSet::new(),
                        store: store.clone(),
                        shards,
                    };
                    // The closure (and with it the cold watch) lives as long as the stream.
                    let _ = &watch_task;
                    Box::pin(
                        futures::stream::unfold(state, State::next)
                            .flat_map(futures::stream::iter)
                            .map(|r| Ok(ReconcileRequest::from(r))),
                    )
                }
            }
        },
    )
}

struct State<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    changes: broadcast::Receiver<ObjectRef<K>>,
    owned: tokio::sync::watch::Receiver<BTreeSet<u32>>,
    /// The shards whose objects were requested already.
    held: BTreeSet<u32>,
    store: Store<K>,
    shards: u32,
}

impl<K> State<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// The objects of `shards` in the store.
    fn objects_of(&self, shards: &BTreeSet<u32>) -> Vec<ObjectRef<K>> {
        self.store
            .state()
            .iter()
            .filter(|o| shards.contains(&shard_of(&object_key(&***o), self.shards)))
            .map(|o| ObjectRef::from_obj(&**o))
            .collect()
    }

    async fn next(mut self) -> Option<(Vec<ObjectRef<K>>, Self)> {
        loop {
            // Shards whose term began since the last look: all their objects, at once.
            let now: BTreeSet<u32> = self.owned.borrow_and_update().clone();
            let new: BTreeSet<u32> = now.difference(&self.held).copied().collect();
            self.held = now;
            if !new.is_empty() {
                let objects = self.objects_of(&new);
                return Some((objects, self));
            }
            tokio::select! {
                changed = self.owned.changed() => changed.ok()?,
                got = self.changes.recv() => match got {
                    Ok(r) => {
                        if self.held.contains(&shard_of(&ref_key(&r), self.shards)) {
                            return Some((vec![r], self));
                        }
                    }
                    // Behind by more than the buffer: request every held shard's objects again.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let objects = self.objects_of(&self.held.clone());
                        return Some((objects, self));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
            }
        }
    }
}
