//! One running watch of one kind — its reflector store, the changes it applies and how it is
//! doing — and what a term's controller reads from it: the reconcile requests (every object
//! once the store is current, then each change) and the wait for that first list.

use std::fmt::Debug;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::{Action, ReconcileReason, ReconcileRequest};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::runtime::{WatchStreamExt, reflector::store::Writer};
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};

use super::ControllerError;
use super::triggers::Trigger;

/// Changes held for a term's queue while it catches up; a queue further behind resyncs from
/// the store instead (every object is reconciled again, nothing is missed).
pub(super) const CHANGES_BUFFER: usize = 4096;

/// How the controller's primary watch is doing, as [`Status::state`](super::Status::state)
/// reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheState {
    /// Not started (cold mode outside a term), or listing for the first time.
    Starting,
    /// Listed once and watching: the store is current.
    Warm,
    /// The latest list or watch request failed, with this error; the watch retries with
    /// backoff. The store keeps what it had (empty if it never listed).
    Failing {
        /// The watch's error, as text.
        error: String,
        /// Whether the API server refused the request (401/403/404): a retry will not mend
        /// it until RBAC or the resource changes.
        refused: bool,
    },
}

/// One running watch: its store, the changes it applies, and how it is doing.
pub(super) struct Running<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    pub(super) store: Store<K>,
    pub(super) changes: broadcast::Sender<ObjectRef<K>>,
    pub(super) state: watch::Receiver<CacheState>,
}

impl<K> Clone for Running<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            changes: self.changes.clone(),
            state: self.state.clone(),
        }
    }
}

/// One reconcile, spawned on the term: aborted if dropped (the applier was dropped at the
/// term's stop deadline), its panic resumed where it is awaited.
pub(super) struct Reconcile<E>(pub(super) tokio::task::JoinHandle<Result<Action, E>>);

impl<E> Drop for Reconcile<E> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<E> Future for Reconcile<E> {
    type Output = Result<Action, E>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.0.poll_unpin(cx).map(|joined| match joined {
            Ok(out) => out,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Aborted by the end of its term (a shard that moved away, or a term that had
            // ended when it was spawned): nothing to requeue here; the next owner reconciles.
            Err(_) => Ok(Action::await_change()),
        })
    }
}

/// Starts a watch: returns its handles and the future that drives it.
pub(super) fn start<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (Running<K>, impl Future<Output = ()> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer): (Store<K>, Writer<K>) = reflector::store();
    let (changes, _) = broadcast::channel(CHANGES_BUFFER);
    let (state_tx, state) = watch::channel(CacheState::Starting);
    let running = Running {
        store,
        changes: changes.clone(),
        state,
    };
    let kind = K::kind(&()).into_owned();
    let watching = async move {
        // managedFields are the API server's bookkeeping of who set which field, and the
        // larger part of most small objects: dropped before the store, as controller-runtime's
        // cache does by default.
        let mut events = std::pin::pin!(
            watcher(api, config)
                .default_backoff()
                .modify(|obj: &mut K| obj.meta_mut().managed_fields = None)
                .reflect(writer)
        );
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Apply(obj) | Event::InitApply(obj)) => {
                    // No receiver is the common case on a follower without a standby.
                    let _ = changes.send(ObjectRef::from_obj(&obj));
                }
                // Not a change to reconcile: the store no longer has the object, and a
                // request for it would only end in `ObjectNotFound` (kube-runtime's
                // `Controller` does not queue deletions either; finalizers are the way to act
                // on one).
                Ok(Event::Delete(_)) => {}
                Ok(Event::InitDone) => {
                    state_tx.send_replace(CacheState::Warm);
                }
                Ok(Event::Init) => {}
                Err(e) => {
                    let refused = is_refusal(&e);
                    tracing::warn!(kind, error = %e, refused, "watch failed; retrying with backoff");
                    state_tx.send_replace(CacheState::Failing {
                        error: e.to_string(),
                        refused,
                    });
                }
            }
        }
    };
    (running, watching)
}

/// Whether the API server refused the watch outright: retrying will not help.
fn is_refusal(e: &watcher::Error) -> bool {
    let client = match e {
        watcher::Error::InitialListFailed(c)
        | watcher::Error::WatchStartFailed(c)
        | watcher::Error::WatchFailed(c) => c,
        watcher::Error::WatchError(status) => return matches!(status.code, 401 | 403 | 404),
        watcher::Error::NoResourceVersion => return true,
    };
    matches!(client, kube::Error::Api(status) if matches!(status.code, 401 | 403 | 404))
}

/// The reconcile requests over `running` and `triggers`: once `ready` (the store is current),
/// every object, then each change of the primary kind and each trigger (an owned or watched
/// object's change, `reconcile_all_on`, `reconcile_on`), until `until` completes; `ready`'s
/// error instead, as the only item.
pub(super) fn requests<K>(
    running: Running<K>,
    triggers: broadcast::Sender<Trigger<K>>,
    ready: impl Future<Output = Result<(), ControllerError>> + Send + 'static,
    until: impl Future<Output = ()> + Send + 'static,
) -> impl Stream<Item = Result<ReconcileRequest<K>, ControllerError>> + Send
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    // Subscribed before the snapshot is read, so no change between the two is lost (one seen
    // twice is reconciled once: the applier's scheduler merges requests for one object).
    let live = Live::new(&running, &triggers);
    let store = running.store.clone();
    futures::stream::once(ready)
        .flat_map(move |ready| -> futures::stream::BoxStream<'static, _> {
            match ready {
                Err(e) => Box::pin(futures::stream::iter([Err(e)])),
                Ok(()) => {
                    let all = every_object(&store, &ReconcileReason::ObjectUpdated);
                    let live = live.resubscribe();
                    Box::pin(
                        paced(all)
                            .chain(
                                futures::stream::unfold(live, |mut live| async move {
                                    live.next().await.map(|requests| (requests, live))
                                })
                                .flat_map(futures::stream::iter),
                            )
                            .map(Ok),
                    )
                }
            }
        })
        .take_until(until)
}

/// A request for every object in `store`, for `reason`.
pub(super) fn every_object<K>(
    store: &Store<K>,
    reason: &ReconcileReason,
) -> Vec<ReconcileRequest<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .iter()
        .map(|o| ReconcileRequest {
            obj_ref: ObjectRef::from_obj(&**o),
            reason: reason.clone(),
        })
        .collect()
}

/// The live half of a queue: the primary kind's changes and the triggers, each until its
/// sender is gone.
pub(super) struct Live<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    changes: Option<broadcast::Receiver<ObjectRef<K>>>,
    triggers: Option<broadcast::Receiver<Trigger<K>>>,
    store: Store<K>,
}

impl<K> Live<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    pub(super) fn new(running: &Running<K>, triggers: &broadcast::Sender<Trigger<K>>) -> Self {
        Self {
            changes: Some(running.changes.subscribe()),
            triggers: Some(triggers.subscribe()),
            store: running.store.clone(),
        }
    }

    /// The same channels, from where these are now (for a stream built from a closure that
    /// may run more than once).
    fn resubscribe(&self) -> Self {
        Self {
            changes: self.changes.as_ref().map(broadcast::Receiver::resubscribe),
            triggers: self.triggers.as_ref().map(broadcast::Receiver::resubscribe),
            store: self.store.clone(),
        }
    }

    /// The next requests: one for a change or trigger, every object for `reconcile_all_on` or
    /// after falling more than the buffer behind; `None` once both channels are closed.
    ///
    /// Cancel safe: a request received is returned by the call that received it.
    pub(super) async fn next(&mut self) -> Option<Vec<ReconcileRequest<K>>> {
        use broadcast::error::RecvError;
        loop {
            let got = tokio::select! {
                got = recv(self.changes.as_mut()) => match got {
                    Ok(r) => Ok(vec![ReconcileRequest::from(r)]),
                    Err(RecvError::Closed) => Err(Closed::Changes),
                    Err(RecvError::Lagged(_)) => Ok(self.lagged()),
                },
                got = recv(self.triggers.as_mut()) => match got {
                    Ok(Trigger::One(r)) => Ok(vec![r]),
                    Ok(Trigger::All) => {
                        Ok(every_object(&self.store, &ReconcileReason::BulkReconcile))
                    }
                    Err(RecvError::Closed) => Err(Closed::Triggers),
                    Err(RecvError::Lagged(_)) => Ok(self.lagged()),
                },
            };
            match got {
                Ok(requests) => return Some(requests),
                Err(Closed::Changes) => self.changes = None,
                Err(Closed::Triggers) => self.triggers = None,
            }
            if self.changes.is_none() && self.triggers.is_none() {
                return None;
            }
        }
    }

    /// Behind by more than the buffer: every object again, so nothing is missed.
    fn lagged(&self) -> Vec<ReconcileRequest<K>> {
        every_object(&self.store, &ReconcileReason::BulkReconcile)
    }
}

enum Closed {
    Changes,
    Triggers,
}

/// Receives from `rx`, or waits for ever without one (a closed channel already taken out).
async fn recv<T: Clone>(
    rx: Option<&mut broadcast::Receiver<T>>,
) -> Result<T, broadcast::error::RecvError> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// How many requests of a snapshot are queued before the queue lets others run.
const SNAPSHOT_PACE: usize = 64;

/// The snapshot's requests, yielding to the runtime every [`SNAPSHOT_PACE`] of them:
/// kube-runtime's applier takes in every ready request before it starts the first reconcile,
/// so an always-ready snapshot of 10,000 objects delayed the first one by tens of
/// milliseconds (measured by `benches/kube_controller.rs`).
pub(super) fn paced<T: Send + 'static>(items: Vec<T>) -> impl Stream<Item = T> + Send {
    futures::stream::unfold((items.into_iter(), 0usize), |(mut rest, sent)| async move {
        if sent > 0 && sent.is_multiple_of(SNAPSHOT_PACE) {
            tokio::task::yield_now().await;
        }
        rest.next().map(|item| (item, (rest, sent + 1)))
    })
}

/// Waits until the watch has listed once. Fails at once when the API server refuses it, and
/// when the watch is failing at `valid_until` (the term's validity, read again at each
/// deadline: a leader that keeps renewing keeps waiting while its first list is still going —
/// 100,000 objects take longer than a lease — but a watch that keeps failing is reported, not
/// waited on in silence).
pub(super) async fn warm_or_refused(
    mut state: watch::Receiver<CacheState>,
    valid_until: impl Fn() -> tokio::time::Instant,
) -> Result<(), ControllerError> {
    loop {
        let until = valid_until().max(tokio::time::Instant::now() + MIN_WAIT);
        let waited = tokio::time::timeout_at(
            until,
            state.wait_for(|s| {
                matches!(
                    s,
                    CacheState::Warm | CacheState::Failing { refused: true, .. }
                )
            }),
        )
        .await
        .map(|seen| seen.map(|s| s.clone()));
        match waited {
            Ok(Ok(CacheState::Failing { error, .. })) => {
                return Err(ControllerError::Refused { error });
            }
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(_)) => return Err(ControllerError::WatchStopped),
            Err(_) => {
                if let CacheState::Failing { error, .. } = &*state.borrow() {
                    return Err(ControllerError::NotWarm {
                        last: Some(error.clone()),
                    });
                }
                // Still listing, with no error: wait on while the term lasts.
            }
        }
    }
}

/// The least a term's queue waits for its first list, even late in a term.
const MIN_WAIT: Duration = Duration::from_secs(1);
