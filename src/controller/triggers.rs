//! What makes a controller reconcile besides its own kind's changes: owned objects
//! (`owns`), related objects through a mapper (`watches`), `reconcile_all_on` and
//! `reconcile_on` — each a source whose requests go to one channel that every term's queue
//! (and a follower's standby) reads.
//!
//! The sources run for the controller's whole run, on every replica: a change seen while
//! following reaches the standby, which keeps its object for the grant like every object, and a new
//! leader's watches need no new list. A source's watch errors are retried with backoff and
//! logged; they never end the controller.

use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{ReconcileReason, ReconcileRequest, trigger_owners, trigger_with};
#[allow(deprecated)]
use kube::runtime::metadata_watcher;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

/// One trigger: a request for one object, or for every object in the store.
#[derive(Clone, Debug)]
pub(super) enum Trigger<K: Resource<DynamicType = ()>> {
    /// Reconcile this object (for this reason).
    One(ReconcileRequest<K>),
    /// Reconcile every object (`reconcile_all_on`).
    All,
}

/// A source of triggers; an `Err` item is a failure of its watch (retried by it).
pub(super) type Source<K> = BoxStream<'static, Result<Trigger<K>, watcher::Error>>;

/// `owns`: a change or deletion of a `Child` triggers the owners of kind `K` its owner
/// references name (kube-runtime's `trigger_owners`, over a metadata-only watch: owner
/// references are all it needs).
pub(super) fn owns<K, Child>(api: Api<Child>, config: watcher::Config) -> Source<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    Child: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    // kube-runtime's own `owns` uses it too (the replacement needs an `Api` of
    // `PartialObjectMeta`, which cannot be made from an `Api<Child>`).
    #[allow(deprecated)]
    let children = metadata_watcher(api, config);
    owns_stream::<K, _>(children.default_backoff().touched_objects())
}

/// `owns_stream`: as [`owns`], over the caller's stream of child objects.
pub(super) fn owns_stream<K, Child>(
    children: impl Stream<Item = Result<Child, watcher::Error>> + Send + 'static,
) -> Source<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    Child: Resource<DynamicType = ()> + Send + 'static,
{
    trigger_owners::<K, _>(children, (), ())
        .map(|r| r.map(Trigger::One))
        .boxed()
}

/// `watches`: a change or deletion of an `Other` triggers the objects `mapper` names.
pub(super) fn watches<K, Other, I>(
    api: Api<Other>,
    config: watcher::Config,
    mapper: impl Fn(Other) -> I + Send + Sync + 'static,
) -> Source<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    Other: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    I: IntoIterator<Item = ObjectRef<K>> + 'static,
    I::IntoIter: Send,
{
    watches_stream(
        watcher(api, config).default_backoff().touched_objects(),
        mapper,
    )
}

/// `watches_stream`: as [`watches`], over the caller's stream of related objects.
pub(super) fn watches_stream<K, Other, I>(
    others: impl Stream<Item = Result<Other, watcher::Error>> + Send + 'static,
    mapper: impl Fn(Other) -> I + Send + Sync + 'static,
) -> Source<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    Other: Resource<DynamicType = ()> + Send + 'static,
    I: IntoIterator<Item = ObjectRef<K>> + 'static,
    I::IntoIter: Send,
{
    trigger_with(others, move |other: Other| {
        let related = ObjectRef::from_obj(&other).erase();
        mapper(other)
            .into_iter()
            .map(move |obj_ref| ReconcileRequest {
                obj_ref,
                reason: ReconcileReason::RelatedObjectUpdated {
                    obj_ref: Box::new(related.clone()),
                },
            })
    })
    .map(|r| r.map(Trigger::One))
    .boxed()
}

/// `reconcile_all_on`: every item reconciles every object.
pub(super) fn all_on<K>(trigger: impl Stream<Item = ()> + Send + 'static) -> Source<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    trigger.map(|()| Ok(Trigger::All)).boxed()
}

/// `reconcile_on`: every item reconciles that object.
pub(super) fn on<K>(trigger: impl Stream<Item = ObjectRef<K>> + Send + 'static) -> Source<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    trigger
        .map(|obj_ref| {
            Ok(Trigger::One(ReconcileRequest {
                obj_ref,
                reason: ReconcileReason::Unknown,
            }))
        })
        .boxed()
}

/// Drives every source into `tx` until they all end (or the task is aborted with its
/// controller). A failure of a source's watch is logged; the watch retries with backoff.
pub(super) async fn drive<K>(sources: Vec<Source<K>>, tx: broadcast::Sender<Trigger<K>>)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let mut all = futures::stream::select_all(sources);
    while let Some(item) = all.next().await {
        match item {
            // No receiver: no term and no standby queue runs now; the next one starts with
            // every object anyway.
            Ok(trigger) => {
                let _ = tx.send(trigger);
            }
            Err(e) => {
                tracing::warn!(kind = %K::kind(&()), error = %e, "a watch that triggers reconciles failed; retrying with backoff");
            }
        }
    }
}
