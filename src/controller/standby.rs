//! A term's controller made ready before the grant: kube-runtime's applier built over the
//! warm store on a follower and fed every object, each reconcile parked at a gate that the
//! grant opens. The first reconcile after a grant then waits for no queueing, whatever the
//! number of objects (controller-runtime's `EnableWarmup` does the same with its work queue).
//!
//! Nothing the user wrote runs before the grant: a parked reconcile holds only the object's
//! key, and once the gate opens it reads the object as the store has it then (an object
//! deleted meanwhile is not reconciled) and runs the user's reconcile. The grant hands the
//! applier from the follower's task to the term's stream, so every reconcile is polled by the
//! term's workload, as kube-runtime's applier polls its own: none outlives the workload, which
//! the elector drops at the term's stop deadline, and the grant's burst costs no task, no
//! `JoinHandle` and no channel per object.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt, TryFuture, TryFutureExt};
use kube::Resource;
use kube::runtime::controller::{self, Action, Config, applier};
use kube::runtime::reflector::{ObjectRef, Store};
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::ControllerError;
use super::feed::{Running, requests};
use super::triggers::Trigger;
use crate::election::Term;
use tokio_util::task::AbortOnDropHandle;

/// What the applier of a standby reports, its reconcile errors carrying the error policy's
/// action.
pub(super) type Item<K, E> =
    Result<(ObjectRef<K>, Action), controller::Error<Failed<E>, ControllerError>>;

/// A reconcile's error with the action the error policy chose for it (the policy needs the
/// term's context, which only the reconcile has; the applier's own policy reads the action).
pub(super) struct Failed<E> {
    pub(super) error: E,
    pub(super) action: Action,
}

impl<E: fmt::Debug> fmt::Debug for Failed<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failed")
            .field("error", &self.error)
            .field("action", &self.action)
            .finish()
    }
}

impl<E: fmt::Display> fmt::Display for Failed<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<E: std::error::Error> std::error::Error for Failed<E> {}

/// The user's reconciler with its error policy, as one function of the object and the term's
/// context: built once per controller ([`reconcile_fn`]), shared by every term's applier.
pub(super) type ReconcileFn<K, Ctx, E> =
    Arc<dyn Fn(Arc<K>, Arc<Ctx>) -> BoxFuture<'static, Result<Action, Failed<E>>> + Send + Sync>;

/// The reconciler (called one at a time: kube-runtime's takes `FnMut`) and error policy as a
/// [`ReconcileFn`].
pub(super) fn reconcile_fn<K, R, RFut, EP, Ctx>(
    reconciler: R,
    error_policy: EP,
) -> ReconcileFn<K, Ctx, RFut::Error>
where
    K: Send + Sync + 'static,
    R: FnMut(Arc<K>, Arc<Ctx>) -> RFut + Send + 'static,
    RFut: TryFuture<Ok = Action> + Send + 'static,
    RFut::Error: Send + 'static,
    EP: Fn(Arc<K>, &RFut::Error, Arc<Ctx>) -> Action + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
{
    let reconciler = Mutex::new(reconciler);
    let error_policy = Arc::new(error_policy);
    Arc::new(move |obj: Arc<K>, ctx: Arc<Ctx>| {
        let work = {
            let mut reconcile = reconciler.lock().unwrap_or_else(PoisonError::into_inner);
            TryFutureExt::into_future(reconcile(obj.clone(), ctx.clone()))
        };
        let error_policy = error_policy.clone();
        async move {
            work.await.map_err(|error| Failed {
                action: error_policy(obj, &error, ctx),
                error,
            })
        }
        .boxed()
    })
}

/// What the grant hands the parked reconciles: the term and its context.
pub(super) struct Session<Ctx> {
    pub(super) term: Term,
    pub(super) ctx: Arc<Ctx>,
}

/// Where reconciles wait for the grant.
struct Gate<Ctx> {
    /// Set once, by the grant: read without the lock by every reconcile after it.
    session: OnceLock<Arc<Session<Ctx>>>,
    /// One waker per parked reconcile, by the slot it registered in. kube-runtime's runner
    /// polls every reconcile in flight at each of its wake-ups, so a parked one is polled
    /// again and again: it replaces its waker, never adds one.
    parked: Mutex<Vec<Waker>>,
    /// The term's cancellation once open: the applier's queue ends when it fires.
    opened: watch::Sender<Option<CancellationToken>>,
}

impl<Ctx> Gate<Ctx> {
    fn new() -> Self {
        Self {
            session: OnceLock::new(),
            parked: Mutex::new(Vec::new()),
            opened: watch::Sender::new(None),
        }
    }

    fn open(&self, session: Arc<Session<Ctx>>) {
        let token = session.term.cancellation().clone();
        // A gate opens once (a standby serves one term).
        let _ = self.session.set(session);
        let parked =
            std::mem::take(&mut *self.parked.lock().unwrap_or_else(PoisonError::into_inner));
        self.opened.send_replace(Some(token));
        parked.into_iter().for_each(Waker::wake);
    }

    fn pass(self: &Arc<Self>) -> Pass<Ctx> {
        Pass {
            gate: self.clone(),
            slot: None,
        }
    }
}

/// Waits at the gate.
struct Pass<Ctx> {
    gate: Arc<Gate<Ctx>>,
    /// Where this one's waker is, once it has waited.
    slot: Option<usize>,
}

impl<Ctx> Future for Pass<Ctx> {
    type Output = Arc<Session<Ctx>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(session) = self.gate.session.get() {
            return Poll::Ready(session.clone());
        }
        let gate = self.gate.clone();
        let mut parked = gate.parked.lock().unwrap_or_else(PoisonError::into_inner);
        // Read again under the lock: the grant sets the session before it takes the wakers.
        if let Some(session) = gate.session.get() {
            return Poll::Ready(session.clone());
        }
        match self.slot {
            Some(slot) => {
                if let Some(waker) = parked.get_mut(slot)
                    && !waker.will_wake(cx.waker())
                {
                    waker.clone_from(cx.waker());
                }
            }
            None => {
                self.slot = Some(parked.len());
                parked.push(cx.waker().clone());
            }
        }
        Poll::Pending
    }
}

/// A standby's applier, boxed so that it can move from the follower's driver to the term.
type Applier<K, E> = Pin<Box<dyn Stream<Item = Item<K, E>> + Send>>;

/// A controller ready for a term: an applier, driven by a task of its own until the grant
/// hands it to the term, its reconciles parked at the gate until then.
pub(super) struct Standby<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
    E: 'static,
{
    gate: Arc<Gate<Ctx>>,
    /// The applier while the follower's driver polls it: taken out at the grant.
    driven: Arc<Mutex<Option<Applier<K, E>>>>,
    /// The applier once the term has it.
    applier: Option<Applier<K, E>>,
    /// Drives the applier until the grant (`None` once the term has it, or when built for a
    /// term that had begun).
    driver: Option<AbortOnDropHandle<()>>,
    /// Set once the store was current and the queue began requesting every object.
    armed: Arc<AtomicBool>,
}

impl<K, Ctx, E> Standby<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
{
    /// Builds the applier over `running` and `triggers`. Its queue waits for `ready`, then
    /// requests every object, each change and each trigger. Without a `session` a task of its
    /// own drives it until [`open`](Self::open); with one the gate is open from the start and
    /// the term's stream drives it (nothing prepared ahead: the term's controller built at
    /// its grant).
    pub(super) fn prepare(
        running: Running<K>,
        triggers: &broadcast::Sender<Trigger<K>>,
        ready: impl Future<Output = Result<(), ControllerError>> + Send + 'static,
        config: Config,
        reconcile: ReconcileFn<K, Ctx, E>,
        session: Option<Arc<Session<Ctx>>>,
    ) -> Self {
        let gate = Arc::new(Gate::new());
        let armed = Arc::new(AtomicBool::new(false));
        let ready = {
            let armed = armed.clone();
            ready.inspect(move |r| armed.store(r.is_ok(), Ordering::Release))
        };
        let mut opened = gate.opened.subscribe();
        let ended = async move {
            let token = match opened.wait_for(Option::is_some).await {
                Ok(token) => token.clone(),
                // The gate is gone with its standby: so is this queue.
                Err(_) => None,
            };
            match token {
                Some(token) => token.cancelled_owned().await,
                None => std::future::pending().await,
            }
        };
        let store = running.store.clone();
        let queue = requests(running, triggers.clone(), ready, ended);
        let parked_gate = gate.clone();
        let parked_store = store.clone();
        let applier: Applier<K, E> = Box::pin(applier(
            move |obj: Arc<K>, _: Arc<()>| match parked_gate.session.get() {
                // Requested after the grant: the object as the applier read it just now.
                Some(session) => granted(session, &reconcile, obj),
                None => parked(
                    parked_gate.clone(),
                    parked_store.clone(),
                    reconcile.clone(),
                    obj,
                )
                .boxed(),
            },
            |_, failed: &Failed<E>, _| failed.action.clone(),
            Arc::new(()),
            store,
            queue,
            config,
        ));
        let mut standby = Self {
            gate,
            driven: Arc::new(Mutex::new(None)),
            applier: None,
            driver: None,
            armed,
        };
        match session {
            Some(session) => {
                standby.applier = Some(applier);
                standby.gate.open(session);
            }
            None => {
                *standby
                    .driven
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(applier);
                let driver = tokio::spawn(drive(standby.driven.clone()));
                standby.driver = Some(AbortOnDropHandle::new(driver));
            }
        }
        standby
    }

    /// Whether a term can use this standby at once: its store has listed (the queue is
    /// requesting every object) and its applier still runs.
    pub(super) fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Acquire) && self.driver.as_ref().is_some_and(|d| !d.is_finished())
    }

    /// The grant: the term takes the applier over from the follower's driver, and the parked
    /// reconciles start with `session`'s term and context.
    pub(super) fn open(&mut self, session: Arc<Session<Ctx>>) {
        // Taken before the gate opens: no reconcile runs in the driver, which finds the
        // applier gone (or is aborted here first).
        self.applier = self
            .driven
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.driver = None;
        self.gate.open(session);
    }

    /// The term's results, each reconcile error as the reconciler returned it: the applier
    /// polled by the term's own stream, each reconcile with it (as kube-runtime's applier
    /// polls its reconciles), so the term's workload holds every reconcile in flight. Ends
    /// when the applier does (the term ended and its reconciles finished); a reconcile's
    /// panic resumes here.
    pub(super) fn results(
        self,
    ) -> impl Stream<Item = Result<(ObjectRef<K>, Action), controller::Error<E, ControllerError>>>
    + Send
    + use<K, Ctx, E> {
        futures::stream::iter(self.applier)
            .flatten()
            .map(unwrap_failed)
    }
}

/// An applier's item with the reconcile error as the reconciler returned it.
pub(super) fn unwrap_failed<K, E>(
    item: Item<K, E>,
) -> Result<(ObjectRef<K>, Action), controller::Error<E, ControllerError>>
where
    K: Resource<DynamicType = ()> + 'static,
    E: 'static,
{
    use controller::Error as E2;
    item.map_err(|e| match e {
        E2::ReconcilerFailed(failed, obj) => E2::ReconcilerFailed(failed.error, obj),
        E2::ObjectNotFound(obj) => E2::ObjectNotFound(obj),
        E2::QueueError(e) => E2::QueueError(e),
        E2::RunnerError(e) => E2::RunnerError(e),
    })
}

/// One reconcile of the standby's applier: parked until the grant, then the user's reconcile
/// of the object as it is now, with the term's context, polled by the term's stream.
async fn parked<K, Ctx, E>(
    gate: Arc<Gate<Ctx>>,
    store: Store<K>,
    reconcile: ReconcileFn<K, Ctx, E>,
    obj: Arc<K>,
) -> Result<Action, Failed<E>>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: Send + 'static,
{
    // Only the key is kept: the object the store replaces meanwhile is not held alive here.
    let meta = obj.meta();
    let key = ObjectRef::<K>::new(meta.name.as_deref().unwrap_or_default());
    let key = match meta.namespace.as_deref() {
        Some(ns) => key.within(ns),
        None => key,
    };
    drop(obj);
    let session = gate.pass().await;
    // Every parked reconcile counts as in flight to the applier, which lets those finish when
    // the term ends: one not started by then must not start at all.
    if session.term.cancellation().is_cancelled() {
        return Ok(Action::await_change());
    }
    // Parked since before the grant: reconcile what the store holds now, and nothing for an
    // object deleted meanwhile.
    let Some(now) = store.get(&key) else {
        return Ok(Action::await_change());
    };
    granted(&session, &reconcile, now).await
}

/// One reconcile of the term: the user's reconcile of `obj` with the term's context, unless
/// the term has ended.
fn granted<K, Ctx, E>(
    session: &Session<Ctx>,
    reconcile: &ReconcileFn<K, Ctx, E>,
    obj: Arc<K>,
) -> BoxFuture<'static, Result<Action, Failed<E>>>
where
    K: Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: Send + 'static,
{
    if session.term.cancellation().is_cancelled() {
        return futures::future::ready(Ok(Action::await_change())).boxed();
    }
    reconcile(obj, session.ctx.clone())
}

/// Drives a standby's applier on a follower until the grant takes it out of `slot`: its
/// queue takes in every object and its reconciles park. What it yields before the grant
/// concerns no term (an object deleted before its turn): dropped.
async fn drive<K, E>(slot: Arc<Mutex<Option<Applier<K, E>>>>)
where
    K: Resource<DynamicType = ()> + 'static,
    E: 'static,
{
    loop {
        let more = futures::future::poll_fn(|cx| {
            let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(applier) = slot.as_mut() else {
                return Poll::Ready(false);
            };
            match applier.as_mut().poll_next(cx) {
                Poll::Ready(Some(_)) => Poll::Ready(true),
                Poll::Ready(None) => {
                    *slot = None;
                    Poll::Ready(false)
                }
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        if !more {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::election::TestTerm;

    #[derive(Debug, thiserror::Error)]
    #[error("bad object")]
    struct Bad;

    fn cm(name: &str, v: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("ns".into());
        cm.data = Some(BTreeMap::from([("v".to_owned(), v.to_owned())]));
        cm
    }

    fn version(cm: &ConfigMap) -> String {
        cm.data
            .as_ref()
            .and_then(|d| d.get("v"))
            .cloned()
            .unwrap_or_default()
    }

    type Seen = Mutex<Vec<(String, String)>>;

    /// A reconciler that records what it sees, (name, version), in its context; `bad` fails.
    fn reconciler() -> ReconcileFn<ConfigMap, Seen, Bad> {
        reconcile_fn(
            |cm: Arc<ConfigMap>, seen: Arc<Seen>| async move {
                let name = cm.metadata.name.clone().unwrap_or_default();
                seen.lock()
                    .expect("not poisoned")
                    .push((name.clone(), version(&cm)));
                if name == "bad" {
                    Err(Bad)
                } else {
                    Ok(Action::await_change())
                }
            },
            |_, _: &Bad, _| Action::requeue(std::time::Duration::from_secs(7)),
        )
    }

    /// The grant of `term` with `seen` as its reconciles' context.
    fn session(term: &Term, seen: &Arc<Seen>) -> Arc<Session<Seen>> {
        Arc::new(Session {
            term: term.clone(),
            ctx: seen.clone(),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn parked_reconciles_wait_for_the_grant_and_reconcile_the_object_as_it_is_then() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&Event::Init);
        for name in ["a", "b", "gone", "bad"] {
            writer.apply_watcher_event(&Event::InitApply(cm(name, "0")));
        }
        writer.apply_watcher_event(&Event::InitDone);
        let gate = Arc::new(Gate::new());
        let parked: Vec<_> = store
            .state()
            .into_iter()
            .map(|obj| tokio::spawn(parked(gate.clone(), store.clone(), reconciler(), obj)))
            .collect();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(
            parked.iter().all(|p| !p.is_finished()),
            "parked until the grant"
        );
        assert_eq!(gate.parked.lock().expect("not poisoned").len(), 4);
        // While parked: one object changes, one is deleted.
        writer.apply_watcher_event(&Event::Apply(cm("a", "1")));
        writer.apply_watcher_event(&Event::Delete(cm("gone", "0")));

        let term = TestTerm::begin("standby", "pod-a").await.expect("term");
        let seen: Arc<Seen> = Arc::default();
        gate.open(session(&term.term(), &seen));
        let mut results = BTreeMap::new();
        for p in parked {
            match p.await.expect("no panic") {
                Ok(action) => results.insert("ok", action),
                Err(failed) => {
                    assert_eq!(failed.error.to_string(), "bad object");
                    results.insert("failed", failed.action)
                }
            };
        }
        let mut seen = seen.lock().expect("not poisoned").clone();
        seen.sort();
        assert_eq!(
            seen,
            [("a", "1"), ("b", "0"), ("bad", "0")].map(|(n, v)| (n.to_owned(), v.to_owned())),
            "each object as it is at the grant, and none deleted meanwhile"
        );
        assert_eq!(results.get("ok"), Some(&Action::await_change()));
        assert_eq!(
            results.get("failed"),
            Some(&Action::requeue(std::time::Duration::from_secs(7))),
            "the error policy's action"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_parked_reconcile_released_after_the_term_ended_does_not_start() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&Event::Apply(cm("a", "0")));
        let gate = Arc::new(Gate::new());
        let obj = store.state().pop().expect("one object");
        let waiting = tokio::spawn(parked(gate.clone(), store.clone(), reconciler(), obj));
        tokio::task::yield_now().await;
        let term = TestTerm::begin("standby", "pod-a").await.expect("term");
        term.term().cancellation().cancel();
        let seen: Arc<Seen> = Arc::default();
        gate.open(session(&term.term(), &seen));
        assert_eq!(
            waiting.await.expect("no panic").expect("ok"),
            Action::await_change()
        );
        assert!(seen.lock().expect("not poisoned").is_empty());
    }

    #[tokio::test]
    async fn a_parked_reconcile_polled_again_keeps_one_waker() {
        let gate: Arc<Gate<Seen>> = Arc::new(Gate::new());
        let mut pass = std::pin::pin!(gate.pass());
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        for _ in 0..1000 {
            assert!(pass.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(gate.parked.lock().expect("not poisoned").len(), 1);
        struct Count(std::sync::atomic::AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let count = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        let woken = Waker::from(count.clone());
        let mut cx = Context::from_waker(&woken);
        assert!(pass.as_mut().poll(&mut cx).is_pending());
        assert_eq!(gate.parked.lock().expect("not poisoned").len(), 1);
        let term = TestTerm::begin("gate", "pod-a").await.expect("term");
        gate.open(session(&term.term(), &Arc::default()));
        assert_eq!(
            count.0.load(Ordering::Relaxed),
            1,
            "the latest waker is woken"
        );
        assert!(pass.as_mut().poll(&mut cx).is_ready());
        assert!(gate.session.get().is_some());
    }

    #[tokio::test]
    async fn after_the_grant_reconciles_run_only_where_the_term_polls_its_results() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&Event::Init);
        for name in ["a", "b", "c"] {
            writer.apply_watcher_event(&Event::InitApply(cm(name, "0")));
        }
        writer.apply_watcher_event(&Event::InitDone);
        let (changes, _) = broadcast::channel(8);
        let (triggers, _) = broadcast::channel(8);
        let running = Running {
            store,
            changes,
            state: watch::channel(super::super::CacheState::Warm).1,
        };
        let mut standby = Standby::prepare(
            running,
            &triggers,
            async { Ok(()) },
            Config::default(),
            reconciler(),
            None,
        );
        while !(standby.is_armed() && standby.gate.parked.lock().expect("not poisoned").len() == 3)
        {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let term = TestTerm::begin("standby", "pod-a").await.expect("term");
        let seen: Arc<Seen> = Arc::default();
        standby.open(session(&term.term(), &seen));
        // The follower's driver no longer runs anything: the grant's reconciles are the
        // term's to poll (the elector drops them with its workload at the stop deadline).
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            seen.lock().expect("not poisoned").is_empty(),
            "no reconcile ran before the term polled its results"
        );
        let results = standby.results();
        let mut done: Vec<String> = results
            .take(3)
            .map(|r| r.expect("reconciled").0.name)
            .collect()
            .await;
        done.sort();
        assert_eq!(done, ["a", "b", "c"]);
        assert_eq!(seen.lock().expect("not poisoned").len(), 3);
    }
}
