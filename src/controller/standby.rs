//! A term's controller made ready before the grant: kube-runtime's applier built over the
//! warm store on a follower and fed every object, each reconcile parked at a gate that the
//! grant opens. The first reconcile after a grant then waits for no queueing, whatever the
//! number of objects (controller-runtime's `EnableWarmup` does the same with its work queue).
//!
//! Nothing the user wrote runs before the grant: a parked reconcile holds only the object's
//! key, and once the gate opens it reads the object as the store has it then (an object
//! deleted meanwhile is not reconciled) and spawns the user's reconcile as a task of the term.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt, TryFuture, TryFutureExt};
use kube::Resource;
use kube::runtime::controller::{self, Action, Config, applier};
use kube::runtime::reflector::{ObjectRef, Store};
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::ControllerError;
use super::feed::{Reconcile, Running, requests};
use super::triggers::Trigger;
use crate::election::Term;
use crate::util::AbortOnDrop;

/// What the applier of a standby reports, its reconcile errors carrying the error policy's
/// action.
pub(super) type Item<K, E> =
    Result<(ObjectRef<K>, Action), controller::Error<Failed<E>, ControllerError>>;

/// Items a term's stream may fall behind its applier before the applier waits.
const ITEMS: usize = 256;

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
    state: Mutex<GateState<Ctx>>,
    /// The term's cancellation once open: the applier's queue ends when it fires.
    opened: watch::Sender<Option<CancellationToken>>,
}

struct GateState<Ctx> {
    session: Option<Arc<Session<Ctx>>>,
    /// One waker per parked reconcile, by the slot it registered in. kube-runtime's runner
    /// polls every reconcile in flight at each of its wake-ups, so a parked one is polled
    /// again and again: it replaces its waker, never adds one.
    parked: Vec<Waker>,
    /// The driver's polls of the applier, counted: each is one pass over the parked.
    round: u64,
    /// The round `budget` was granted for.
    budget_round: u64,
    /// How many more may pass in this round.
    budget: usize,
    /// The next round's budget: 1, then doubling up to [`MAX_BUDGET`].
    next_budget: usize,
}

/// The most parked reconciles released in one round. The first round releases one: the
/// runner polls all of its slots before the driver yields and the released reconciles (tasks
/// of the term) get to run, so releasing 256 at once delayed the first by ~0.5 ms.
const MAX_BUDGET: usize = 64;

impl<Ctx> Gate<Ctx> {
    fn new() -> Self {
        Self {
            state: Mutex::new(GateState {
                session: None,
                parked: Vec::new(),
                round: 0,
                // Not a round yet: the first poll after the opening grants a budget.
                budget_round: u64::MAX,
                budget: 0,
                next_budget: 1,
            }),
            opened: watch::Sender::new(None),
        }
    }

    /// The driver is about to poll the applier again.
    fn new_round(&self) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .round += 1;
    }

    fn open(&self, session: Arc<Session<Ctx>>) {
        let token = session.term.cancellation().clone();
        let parked = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.session = Some(session);
            std::mem::take(&mut state.parked)
        };
        self.opened.send_replace(Some(token));
        parked.into_iter().for_each(Waker::wake);
    }

    fn is_open(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .session
            .is_some()
    }

    fn pass(self: &Arc<Self>) -> Pass<Ctx> {
        Pass {
            gate: self.clone(),
            slot: None,
        }
    }
}

/// Waits at the gate. Polled by the standby's driver, which counts a round per poll of the
/// applier (a budget not spent in one round is not carried over; one not granted in a round
/// waits for the next).
struct Pass<Ctx> {
    gate: Arc<Gate<Ctx>>,
    /// Where this one's waker is, once it has waited.
    slot: Option<usize>,
}

impl<Ctx> Future for Pass<Ctx> {
    type Output = Arc<Session<Ctx>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let gate = self.gate.clone();
        let mut state = gate.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(session) = state.session.clone() {
            if state.budget_round != state.round {
                state.budget_round = state.round;
                state.budget = state.next_budget;
                state.next_budget = (state.next_budget * 2).min(MAX_BUDGET);
            }
            if state.budget > 0 {
                state.budget -= 1;
                return Poll::Ready(session);
            }
            // Next round: the driver yields first, so the ones released run.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        match self.slot {
            Some(slot) => {
                if let Some(waker) = state.parked.get_mut(slot)
                    && !waker.will_wake(cx.waker())
                {
                    waker.clone_from(cx.waker());
                }
            }
            None => {
                self.slot = Some(state.parked.len());
                state.parked.push(cx.waker().clone());
            }
        }
        Poll::Pending
    }
}

/// A controller ready for a term: an applier driven by a task of its own, its reconciles
/// parked at the gate until [`open`](Self::open).
pub(super) struct Standby<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
    E: 'static,
{
    gate: Arc<Gate<Ctx>>,
    items: mpsc::Receiver<Item<K, E>>,
    driver: AbortOnDrop<()>,
    /// Set once the store was current and the queue began requesting every object.
    armed: Arc<AtomicBool>,
}

impl<K, Ctx, E> Standby<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
{
    /// Builds the applier over `running` and `triggers` and starts driving it. Its queue waits
    /// for `ready`, then requests every object, each change and each trigger. With a
    /// `session` the gate is open from the start (nothing prepared ahead: the term's
    /// controller built at its grant).
    pub(super) fn prepare(
        running: Running<K>,
        triggers: &broadcast::Sender<Trigger<K>>,
        ready: impl Future<Output = Result<(), ControllerError>> + Send + 'static,
        config: Config,
        reconcile: ReconcileFn<K, Ctx, E>,
        session: Option<Arc<Session<Ctx>>>,
    ) -> Self {
        let gate = Arc::new(Gate::new());
        if let Some(session) = session {
            // Open before the driver starts, so an error from `ready` reaches the term.
            gate.open(session);
        }
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
        let applier = applier(
            move |obj: Arc<K>, _: Arc<()>| {
                parked(
                    parked_gate.clone(),
                    parked_store.clone(),
                    reconcile.clone(),
                    obj,
                )
                .boxed()
            },
            |_, failed: &Failed<E>, _| failed.action.clone(),
            Arc::new(()),
            store,
            queue,
            config,
        );
        let (tx, items) = mpsc::channel(ITEMS);
        let driver = AbortOnDrop(tokio::spawn(drive(applier, gate.clone(), tx)));
        Self {
            gate,
            items,
            driver,
            armed,
        }
    }

    /// Whether a term can use this standby at once: its store has listed (the queue is
    /// requesting every object) and its applier still runs.
    pub(super) fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Acquire) && !self.driver.0.is_finished()
    }

    /// The grant: parked reconciles start, with `session`'s term and context.
    pub(super) fn open(&self, session: Arc<Session<Ctx>>) {
        self.gate.open(session);
    }

    /// The term's results, each reconcile error as the reconciler returned it. Ends when the
    /// applier does (the term ended and its reconciles finished); a reconcile's panic
    /// resumes here.
    pub(super) fn results(
        self,
    ) -> impl Stream<Item = Result<(ObjectRef<K>, Action), controller::Error<E, ControllerError>>>
    + Send
    + use<K, Ctx, E> {
        futures::stream::unfold(Some(self), |standby| async move {
            let mut standby = standby?;
            match standby.items.recv().await {
                Some(item) => Some((unwrap_failed(item), Some(standby))),
                None => {
                    // The driver ended; if a reconcile's panic ended it, resume it here.
                    if let Err(e) = (&mut standby.driver.0).await
                        && e.is_panic()
                    {
                        std::panic::resume_unwind(e.into_panic());
                    }
                    None
                }
            }
        })
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
/// of the object as it is now, with the term's context, as a task of the term.
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
    let work = reconcile(now, session.ctx.clone());
    Reconcile(session.term.spawn(work)).await
}

/// Drives the applier, handing its results to the term once the gate is open. Before that,
/// nothing has reconciled and what comes concerns no term (an object deleted before its
/// turn): dropped.
async fn drive<K, Ctx, E>(
    applier: impl Stream<Item = Item<K, E>> + Send,
    gate: Arc<Gate<Ctx>>,
    tx: mpsc::Sender<Item<K, E>>,
) where
    K: Resource<DynamicType = ()> + Clone + 'static,
    E: 'static,
{
    let mut applier = std::pin::pin!(applier);
    let mut rounds = futures::stream::poll_fn(|cx| {
        gate.new_round();
        applier.as_mut().poll_next(cx)
    });
    while let Some(item) = rounds.next().await {
        if gate.is_open() && tx.send(item).await.is_err() {
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
        assert_eq!(gate.state.lock().expect("not poisoned").parked.len(), 4);
        // While parked: one object changes, one is deleted.
        writer.apply_watcher_event(&Event::Apply(cm("a", "1")));
        writer.apply_watcher_event(&Event::Delete(cm("gone", "0")));

        let term = TestTerm::begin("standby", "pod-a").await.expect("term");
        let seen: Arc<Seen> = Arc::default();
        gate.open(session(&term.term(), &seen));
        // The rounds the driver would count.
        while !parked.iter().all(tokio::task::JoinHandle::is_finished) {
            gate.new_round();
            tokio::task::yield_now().await;
        }
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
        assert_eq!(gate.state.lock().expect("not poisoned").parked.len(), 1);
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
        assert_eq!(gate.state.lock().expect("not poisoned").parked.len(), 1);
        let term = TestTerm::begin("gate", "pod-a").await.expect("term");
        gate.open(session(&term.term(), &Arc::default()));
        assert_eq!(
            count.0.load(Ordering::Relaxed),
            1,
            "the latest waker is woken"
        );
        assert!(pass.as_mut().poll(&mut cx).is_ready());
        assert!(gate.is_open());
    }

    #[tokio::test]
    async fn the_grant_releases_one_then_twice_as_many_each_round() {
        let gate: Arc<Gate<Seen>> = Arc::new(Gate::new());
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut passes: Vec<_> = (0..200).map(|_| Box::pin(gate.pass())).collect();
        for p in &mut passes {
            assert!(p.as_mut().poll(&mut cx).is_pending());
        }
        let term = TestTerm::begin("gate", "pod-a").await.expect("term");
        gate.open(session(&term.term(), &Arc::default()));
        let mut per_round = Vec::new();
        while !passes.is_empty() {
            gate.new_round();
            let before = passes.len();
            passes.retain_mut(|p| p.as_mut().poll(&mut cx).is_pending());
            per_round.push(before - passes.len());
        }
        assert_eq!(per_round, [1, 2, 4, 8, 16, 32, 64, 64, 9]);
    }
}
