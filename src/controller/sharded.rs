//! A controller under sharded leadership: one applier per replica over the warm cache, fed
//! only the objects whose shard this replica holds, each reconcile a task of its shard's term.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::Either;
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::controller::{self, Action, ReconcileReason, ReconcileRequest, applier};
use kube::runtime::reflector::{ObjectRef, Store};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

use super::ControllerError;
use super::cache::Cache;
use super::context::TermContext;
use super::feed::{Live, Reconcile, Running, every_object, warm_or_refused};
use super::reconcile::{Failed, unwrap_failed};
use super::triggers::Trigger;
use crate::election::Term;
use crate::shard::{ShardedElector, shard_of};
use tokio_util::task::AbortOnDropHandle;

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

impl<K, Ctx, E> Cache<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
{
    /// Reconciles the objects whose shard ([`shard_of`] of [`object_key`]) has a term on this
    /// replica, until `shutdown` completes, beside `sharded`'s run.
    ///
    /// Every object of a shard is reconciled as soon as the shard's term begins here — from
    /// the warm store, with no list request when shards move — and again on each change and
    /// trigger of it. Each reconcile gets its shard term's context (`context`, asked once per
    /// shard term) and runs as a task of that term: when the shard moves away, its reconciles
    /// in flight are aborted before its lease is released, and its objects are no longer
    /// reconciled here.
    ///
    /// The first item is a [`ControllerError`] if the watch cannot be served.
    pub(super) fn sharded<S>(
        &self,
        sharded: &ShardedElector,
        shutdown: S,
        context: Arc<Mutex<Box<dyn TermContext<Ctx>>>>,
    ) -> impl Stream<Item = Result<(ObjectRef<K>, Action), controller::Error<E, ControllerError>>>
    + Send
    + use<K, Ctx, E, S>
    where
        S: Future<Output = ()> + Send + 'static,
    {
        let (running, watching) = self.watch_for_run();
        let store = running.store.clone();
        let terms = sharded.clone();
        let queue = sharded_queue(running, self.triggers().clone(), sharded.clone(), watching)
            .take_until(shutdown);
        let reconcile = self.reconcile().clone();
        let contexts = ShardContexts {
            make: context,
            made: Mutex::new(HashMap::new()),
        };
        let applier = applier(
            move |obj: Arc<K>, _: Arc<()>| {
                let shard = shard_of(&object_key(&*obj), terms.shards());
                match terms.term(shard) {
                    Some(term) => {
                        let ctx = contexts.of(shard, &term);
                        Either::Left(Reconcile(term.spawn(reconcile(obj, ctx))))
                    }
                    // The shard moved away since the request was queued.
                    None => Either::Right(std::future::ready(Ok(Action::await_change()))),
                }
            },
            |_, failed: &Failed<E>, _| failed.action.clone(),
            Arc::new(()),
            store,
            queue,
            self.applier_config(),
        );
        super::cache::ends_at_queue_error(applier.map(unwrap_failed))
    }
}

/// Each shard term's context, made once per term.
struct ShardContexts<Ctx: 'static> {
    make: Arc<Mutex<Box<dyn TermContext<Ctx>>>>,
    /// By shard: the term's token and its context.
    made: Mutex<HashMap<u32, (crate::FencingToken, Arc<Ctx>)>>,
}

impl<Ctx: 'static> ShardContexts<Ctx> {
    fn of(&self, shard: u32, term: &Term) -> Arc<Ctx> {
        let mut made = self.made.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((token, ctx)) = made.get(&shard)
            && *token == term.fencing_token()
        {
            return ctx.clone();
        }
        let ctx = self
            .make
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .for_term(term);
        made.insert(shard, (term.fencing_token(), ctx.clone()));
        ctx
    }
}

/// The requests of one replica: once the cache is current, the objects of each shard whose
/// term begins here, and every change and trigger of an object of a shard held here.
fn sharded_queue<K>(
    running: Running<K>,
    triggers: broadcast::Sender<Trigger<K>>,
    sharded: ShardedElector,
    watching: Option<impl Future<Output = ()> + Send + 'static>,
) -> impl Stream<Item = Result<ReconcileRequest<K>, ControllerError>> + Send
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    // In cold mode the watch lives as long as this queue.
    let watch_task = watching.map(|w| AbortOnDropHandle::new(tokio::spawn(w)));
    let live = Live::new(&running, &triggers);
    let store = running.store.clone();
    let shards = sharded.shards();
    let far = tokio::time::Instant::now() + std::time::Duration::from_secs(365 * 24 * 3600);
    let mut live = Some(live);
    futures::stream::once(warm_or_refused(running.state.clone(), move || far)).flat_map(
        move |ready| -> futures::stream::BoxStream<'static, _> {
            match (ready, live.take()) {
                (Err(e), _) => Box::pin(futures::stream::iter([Err(e)])),
                (Ok(()), None) => Box::pin(futures::stream::empty()),
                (Ok(()), Some(live)) => {
                    let state = State {
                        live: Some(live),
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
                            .map(Ok),
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
    /// The kind's changes and the triggers; `None` once both have ended.
    live: Option<Live<K>>,
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
    fn objects_of(&self, shards: &BTreeSet<u32>) -> Vec<ReconcileRequest<K>> {
        every_object(&self.store, &ReconcileReason::BulkReconcile)
            .into_iter()
            .filter(|r| shards.contains(&shard_of(&ref_key(&r.obj_ref), self.shards)))
            .collect()
    }

    async fn next(mut self) -> Option<(Vec<ReconcileRequest<K>>, Self)> {
        loop {
            // Shards whose term began since the last look: all their objects, at once.
            let now: BTreeSet<u32> = self.owned.borrow_and_update().clone();
            let new: BTreeSet<u32> = now.difference(&self.held).copied().collect();
            self.held = now;
            if !new.is_empty() {
                let objects = self.objects_of(&new);
                return Some((objects, self));
            }
            let live = self.live.as_mut()?;
            tokio::select! {
                changed = self.owned.changed() => changed.ok()?,
                got = live.next() => {
                    let Some(requests) = got else {
                        self.live = None;
                        return None;
                    };
                    let ours: Vec<ReconcileRequest<K>> = requests
                        .into_iter()
                        .filter(|r| self.held.contains(&shard_of(&ref_key(&r.obj_ref), self.shards)))
                        .collect();
                    if !ours.is_empty() {
                        return Some((ours, self));
                    }
                }
            }
        }
    }
}
