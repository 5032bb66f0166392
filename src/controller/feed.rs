//! One running watch of one kind — its reflector store, the changes it applies and how it is
//! doing — and what a term's controller reads from it: the reconcile requests (every object
//! once the store is current, then each change) and the wait for that first list.

use std::fmt::Debug;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::{Action, ReconcileRequest};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::runtime::{WatchStreamExt, reflector::store::Writer};
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};

use super::ControllerError;

/// Changes held for a term's queue while it catches up; a queue further behind resyncs from
/// the store instead (every object is reconciled again, nothing is missed).
const CHANGES_BUFFER: usize = 4096;

/// How the cache's watch is doing, as [`Cache::state`](super::Cache::state) reports it.
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

/// The reconcile requests over `running`: once `ready` (the store is current), every object,
/// then each change, until `until` completes; `ready`'s error instead, as the only item.
pub(super) fn requests<K>(
    running: Running<K>,
    ready: impl Future<Output = Result<(), ControllerError>> + Send + 'static,
    until: impl Future<Output = ()> + Send + 'static,
) -> impl Stream<Item = Result<ReconcileRequest<K>, ControllerError>> + Send
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    // Subscribed before the snapshot is read, so no change between the two is lost (one seen
    // twice is reconciled once: the applier's scheduler merges requests for one object).
    let changes = running.changes.subscribe();
    let store = running.store.clone();
    futures::stream::once(ready)
        .flat_map(move |ready| -> futures::stream::BoxStream<'static, _> {
            match ready {
                Err(e) => Box::pin(futures::stream::iter([Err(e)])),
                Ok(()) => {
                    let all: Vec<ObjectRef<K>> = store
                        .state()
                        .iter()
                        .map(|o| ObjectRef::from_obj(&**o))
                        .collect();
                    let store = store.clone();
                    let live = futures::stream::unfold(changes.resubscribe(), move |mut rx| {
                        let store = store.clone();
                        async move {
                            match rx.recv().await {
                                Ok(r) => Some((vec![r], rx)),
                                // Behind by more than the buffer: request everything again.
                                Err(broadcast::error::RecvError::Lagged(_)) => {
                                    let all = store
                                        .state()
                                        .iter()
                                        .map(|o| ObjectRef::from_obj(&**o))
                                        .collect();
                                    Some((all, rx))
                                }
                                Err(broadcast::error::RecvError::Closed) => None,
                            }
                        }
                    })
                    .flat_map(futures::stream::iter);
                    Box::pin(
                        paced(all)
                            .chain(live)
                            .map(|r| Ok(ReconcileRequest::from(r))),
                    )
                }
            }
        })
        .take_until(until)
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
