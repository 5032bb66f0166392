//! The grant's first pass: every object a follower's standby collected before the grant (the
//! store's snapshot and each change and trigger since, once each, in that order), reconciled
//! at the grant outside kube-runtime's applier, beside it.
//!
//! Through the applier, each object cost a scheduler entry, a request clone, a hash-table scan
//! at every pop (kube-runtime 5.0's scheduler finds the next ready entry by iterating a table
//! that never shrinks) and a wait for its timer; at 100,000 objects the grant took twice as
//! long as controller-runtime's warm work queue (`benches/kube_controller.rs`). The pass costs
//! one pop, one store lookup and one cancellation check per object, and the applier gets only
//! what happens from the grant on: changes, triggers and requeues.
//!
//! What holds as with the applier alone: the pass and the applier share one lock over the
//! pass's keys, so no object is reconciled by both at once — the applier's reconcile of an
//! object the pass is reconciling waits for it, and an object the applier reconciled first is
//! skipped by the pass. Both take a permit from one semaphore, so the applier's concurrency
//! bounds them together. No reconcile starts once the term has ended; the ones in flight
//! finish. An object deleted before its turn is not reconciled. A requeue the pass's reconcile
//! (or its error policy) asks for goes into the applier's queue when it is due, unless the
//! applier reconciles the object first (the earlier request wins, as in kube-runtime's
//! scheduler).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use kube::Resource;
use kube::runtime::controller::{self, Action, Config, ReconcileReason, ReconcileRequest};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Instant;
use tokio_util::sync::PollSemaphore;
use tokio_util::time::{DelayQueue, delay_queue};

use super::reconcile::{Failed, Item, ReconcileFn, Session, granted};

/// How many reconciles the pass starts before it polls the ones in flight: the first
/// reconcile of a grant waits for this many to be made (256 of them took 0.4 ms, measured),
/// and with an unbounded concurrency the first results are not held back by the whole
/// snapshot.
const START_BATCH: usize = 16;

/// The pass's keys and their state, shared by the pass, the applier's reconciles and (before
/// the grant) the follower's intake.
pub(super) struct Initial<K>
where
    K: Resource<DynamicType = ()>,
{
    state: Mutex<State<K>>,
    /// Set once the pass has ended and no requeue of it waits: the applier's reconciles
    /// need not look at the pass any more.
    quiet: AtomicBool,
    /// The applier's concurrency, shared by the pass and the applier while the pass runs
    /// (`None`: unbounded).
    permits: Option<Arc<Semaphore>>,
}

struct State<K>
where
    K: Resource<DynamicType = ()>,
{
    /// Every key in the order it came (snapshot first), with its state.
    order: Vec<(Arc<ObjectRef<K>>, Slot)>,
    /// Where each key is in `order`.
    index: HashMap<Arc<ObjectRef<K>>, usize>,
    /// The first entry of `order` the pass has not taken.
    next: usize,
    /// The pass has ended: it starts nothing more and has nothing in flight.
    over: bool,
    /// The pass's requeues, until due.
    requeues: DelayQueue<ObjectRef<K>>,
    requeued: HashMap<ObjectRef<K>, delay_queue::Key>,
}

enum Slot {
    /// Not reconciled yet: the pass will.
    Todo,
    /// The pass reconciles it now; the applier's reconciles of it wait for these.
    Running(Vec<oneshot::Sender<()>>),
    /// Reconciled by the pass or taken by the applier, or deleted: the pass skips it.
    Done,
}

impl<K> Initial<K>
where
    K: Resource<DynamicType = ()>,
{
    /// An empty pass whose reconciles and the applier's share `concurrency` (0: unbounded).
    pub(super) fn new(concurrency: u16) -> Self {
        Self {
            state: Mutex::new(State {
                order: Vec::new(),
                index: HashMap::new(),
                next: 0,
                over: false,
                requeues: DelayQueue::new(),
                requeued: HashMap::new(),
            }),
            quiet: AtomicBool::new(false),
            permits: (concurrency > 0).then(|| Arc::new(Semaphore::new(usize::from(concurrency)))),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `keys` to the pass, each once (before the grant: the snapshot, then each change
    /// and trigger).
    pub(super) fn add(&self, keys: impl IntoIterator<Item = ObjectRef<K>>) {
        let mut state = self.lock();
        for key in keys {
            if state.index.contains_key(&key) {
                continue;
            }
            let key = Arc::new(key);
            let at = state.order.len();
            state.order.push((key.clone(), Slot::Todo));
            state.index.insert(key, at);
        }
    }

    /// How many keys the pass holds (taken or not).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().order.len()
    }

    /// The next key for the pass, marked running; `None` once every key was taken.
    fn pop(&self) -> Option<(usize, ObjectRef<K>)> {
        let mut state = self.lock();
        while state.next < state.order.len() {
            let at = state.next;
            state.next += 1;
            let (key, slot) = &mut state.order[at];
            if matches!(slot, Slot::Todo) {
                *slot = Slot::Running(Vec::new());
                return Some((at, ObjectRef::clone(key)));
            }
        }
        None
    }

    /// The pass is done with entry `at`: the applier's reconciles waiting for it go on, and
    /// `requeue` (if any) is queued for the applier.
    fn finish(&self, at: usize, requeue: Option<(ObjectRef<K>, Instant)>) {
        let waiting = {
            let mut state = self.lock();
            let waiting = match state.order.get_mut(at) {
                Some((_, slot)) => std::mem::replace(slot, Slot::Done),
                None => Slot::Done,
            };
            if let Some((key, due)) = requeue {
                // The pass reconciles each object once: it has no requeue of it yet.
                let queued = state.requeues.insert_at(key.clone(), due);
                state.requeued.insert(key, queued);
            }
            waiting
        };
        // Dropped outside the lock: each waiting reconcile wakes on its closed channel.
        drop(waiting);
    }

    /// The pass has ended: its keys are let go of.
    fn end(&self) {
        let mut state = self.lock();
        state.over = true;
        state.order = Vec::new();
        state.index = HashMap::new();
        self.update_quiet(&state);
    }

    fn update_quiet(&self, state: &State<K>) {
        self.quiet
            .store(state.over && state.requeued.is_empty(), Ordering::Release);
    }

    /// What the applier's reconcile of `obj` must do first: nothing, wait for the pass's
    /// reconcile of it, or take a permit shared with the pass. Marks the object reconciled for
    /// the pass, and drops the pass's requeue of it (this request is earlier).
    fn claim(&self, obj: &K) -> Claim<K> {
        if self.quiet.load(Ordering::Acquire) {
            return Claim::Free;
        }
        let key = key_of(obj);
        let mut state = self.lock();
        if let Some(queued) = state.requeued.remove(&key) {
            state.requeues.remove(&queued);
            self.update_quiet(&state);
        }
        let permits = if state.over {
            None
        } else {
            self.permits.clone()
        };
        let waits = match state.index.get(&key).copied() {
            Some(at) => match &mut state.order[at].1 {
                slot @ Slot::Todo => {
                    *slot = Slot::Done;
                    None
                }
                Slot::Running(waiting) => {
                    let (tx, rx) = oneshot::channel();
                    waiting.push(tx);
                    Some(rx)
                }
                Slot::Done => None,
            },
            None => None,
        };
        match (waits, permits) {
            (None, None) => Claim::Free,
            (waits, permits) => Claim::First {
                waits,
                permits,
                key,
            },
        }
    }

    /// The pass's requeues as they fall due (never ends: the applier's queue ends with the
    /// term).
    fn poll_requeue(&self, cx: &mut Context<'_>) -> Poll<ObjectRef<K>> {
        let mut state = self.lock();
        match state.requeues.poll_expired(cx) {
            Poll::Ready(Some(due)) => {
                let key = due.into_inner();
                state.requeued.remove(&key);
                self.update_quiet(&state);
                Poll::Ready(key)
            }
            // Empty: the queue keeps the waker and wakes it at the next insert.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

/// What an applier's reconcile waits for before it starts.
enum Claim<K>
where
    K: Resource<DynamicType = ()>,
{
    /// Nothing: the pass is over, or does not hold the object and shares no permits.
    Free,
    /// The pass's reconcile of it (`waits`), then a permit.
    First {
        waits: Option<oneshot::Receiver<()>>,
        permits: Option<Arc<Semaphore>>,
        key: ObjectRef<K>,
    },
}

/// The key of `obj`, without the extra fields `ObjectRef::from_obj` copies (they take part in
/// no comparison).
pub(super) fn key_of<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectRef<K> {
    let meta = obj.meta();
    let key = ObjectRef::<K>::new(meta.name.as_deref().unwrap_or_default());
    match meta.namespace.as_deref() {
        Some(ns) => key.within(ns),
        None => key,
    }
}

/// The applier's reconcile of `obj` during the term of `session`, after what the pass asks of
/// it: once the pass's reconcile of the same object has finished (the object read again then:
/// deleted meanwhile, it is not reconciled) and with a permit shared with the pass.
pub(super) fn after_pass<K, Ctx, E>(
    initial: &Arc<Initial<K>>,
    store: &Store<K>,
    session: &Arc<Session<Ctx>>,
    reconcile: &ReconcileFn<K, Ctx, E>,
    obj: Arc<K>,
) -> BoxFuture<'static, Result<Action, Failed<E>>>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: Send + 'static,
{
    let (waits, permits, key) = match initial.claim(&obj) {
        Claim::Free => return granted(session, reconcile, obj),
        Claim::First {
            waits,
            permits,
            key,
        } => (waits, permits, key),
    };
    let (store, session, reconcile) = (store.clone(), session.clone(), reconcile.clone());
    async move {
        let obj = match waits {
            Some(done) => {
                // Closed when the pass's reconcile is done (or dropped with the term).
                let _ = done.await;
                drop(obj);
                match store.get(&key) {
                    Some(now) => now,
                    None => return Ok(Action::await_change()),
                }
            }
            None => obj,
        };
        let _permit = match permits {
            // Never closed: an error would mean no bound to keep.
            Some(permits) => permits.acquire_owned().await.ok(),
            None => None,
        };
        granted(&session, &reconcile, obj).await
    }
    .boxed()
}

/// The pass's requeues as reconcile requests for the applier's queue.
pub(super) fn requeues<K>(
    initial: Arc<Initial<K>>,
) -> impl Stream<Item = ReconcileRequest<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
{
    futures::stream::poll_fn(move |cx| {
        initial.poll_requeue(cx).map(|obj_ref| {
            Some(ReconcileRequest {
                obj_ref,
                reason: ReconcileReason::ReconcilerRequestedRetry,
            })
        })
    })
}

/// The pass of one term: its keys reconciled in order, as many at once as permits allow,
/// polled by the term's stream beside the applier. Ends once every key was taken (or the term
/// ended) and the reconciles in flight finished.
pub(super) struct Pass<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + 'static,
{
    initial: Arc<Initial<K>>,
    session: Arc<Session<Ctx>>,
    store: Store<K>,
    reconcile: ReconcileFn<K, Ctx, E>,
    running: FuturesUnordered<Running<K, E>>,
    permits: Option<PollSemaphore>,
    /// Every key was taken, or the term ended: nothing more starts.
    taken: bool,
    ended: bool,
}

impl<K, Ctx, E> Pass<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: Send + 'static,
{
    pub(super) fn new(
        initial: Arc<Initial<K>>,
        session: Arc<Session<Ctx>>,
        store: Store<K>,
        reconcile: ReconcileFn<K, Ctx, E>,
    ) -> Self {
        let permits = initial.permits.clone().map(PollSemaphore::new);
        Self {
            initial,
            session,
            store,
            reconcile,
            running: FuturesUnordered::new(),
            permits,
            taken: false,
            ended: false,
        }
    }

    /// Nothing more starts: a wait for a permit is given up, or the permit handed to it would
    /// stay unused until the pass ends.
    fn stop_starting(&mut self) {
        self.taken = true;
        self.permits = None;
    }

    /// Starts reconciles while permits allow, at most a batch; whether more could start now.
    fn start(&mut self, cx: &mut Context<'_>) -> bool {
        for _ in 0..START_BATCH {
            if self.session.term.cancellation().is_cancelled() {
                self.stop_starting();
                return false;
            }
            let permit = match self.permits.as_mut().map(|p| p.poll_acquire(cx)) {
                None => None,
                Some(Poll::Ready(Some(permit))) => Some(permit),
                // Never closed; and pending, the semaphore wakes this stream.
                Some(Poll::Ready(None) | Poll::Pending) => return false,
            };
            let Some((at, key)) = self.initial.pop() else {
                self.stop_starting();
                return false;
            };
            match self.store.get(&key) {
                Some(obj) => self.running.push(Running {
                    at,
                    key: Some(key),
                    _permit: permit,
                    work: (self.reconcile)(obj, self.session.ctx.clone()),
                }),
                // Deleted since it was collected: nothing to reconcile.
                None => self.initial.finish(at, None),
            }
        }
        true
    }
}

impl<K, Ctx, E> Stream for Pass<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: Send + 'static,
{
    type Item = Item<K, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        loop {
            let more = !this.taken && this.start(cx);
            match this.running.poll_next_unpin(cx) {
                Poll::Ready(Some((at, key, result, permit))) => {
                    let action = match &result {
                        Ok(action) => action,
                        Err(failed) => &failed.action,
                    };
                    let requeue = requeue_after(action)
                        .map(|after| (key.clone(), Instant::now() + after.min(FAR)));
                    this.initial.finish(at, requeue);
                    drop(permit);
                    return Poll::Ready(Some(match result {
                        Ok(action) => Ok((key, action)),
                        Err(failed) => Err(controller::Error::ReconcilerFailed(
                            failed,
                            Box::new(key.erase()),
                        )),
                    }));
                }
                Poll::Ready(None) if this.taken => {
                    this.ended = true;
                    this.initial.end();
                    return Poll::Ready(None);
                }
                Poll::Ready(None) | Poll::Pending => {
                    if !more {
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}

/// How many of the pass's results the term's stream yields before it polls the applier while
/// the pass keeps producing.
const APPLIER_EVERY: usize = 64;

/// The pass's results and the applier's as one stream, the pass polled first: polling the
/// idle applier (its queue, scheduler and runner) for each of the pass's results cost about as
/// much as the reconcile itself. The applier is still polled at least once every
/// [`APPLIER_EVERY`] results of the pass, and whenever the pass has none ready. Ends when both
/// have.
pub(super) struct Beside<P, A> {
    pass: Option<P>,
    applier: Option<A>,
    /// The pass's results yielded since the applier was last polled.
    since: usize,
}

impl<P, A> Beside<P, A> {
    pub(super) fn new(pass: P, applier: A) -> Self {
        Self {
            pass: Some(pass),
            applier: Some(applier),
            since: 0,
        }
    }
}

/// The next item of `side`, if one is ready; `side` is emptied when it ends.
fn poll_side<S: Stream + Unpin>(side: &mut Option<S>, cx: &mut Context<'_>) -> Option<S::Item> {
    let stream = side.as_mut()?;
    match stream.poll_next_unpin(cx) {
        Poll::Ready(Some(item)) => Some(item),
        Poll::Ready(None) => {
            *side = None;
            None
        }
        Poll::Pending => None,
    }
}

impl<T, P, A> Stream for Beside<P, A>
where
    P: Stream<Item = T> + Unpin,
    A: Stream<Item = T> + Unpin,
{
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = self.get_mut();
        let pass_first = this.since < APPLIER_EVERY;
        if pass_first && let Some(item) = poll_side(&mut this.pass, cx) {
            this.since += 1;
            return Poll::Ready(Some(item));
        }
        this.since = 0;
        if let Some(item) = poll_side(&mut this.applier, cx) {
            return Poll::Ready(Some(item));
        }
        if !pass_first && let Some(item) = poll_side(&mut this.pass, cx) {
            this.since = 1;
            return Poll::Ready(Some(item));
        }
        if this.pass.is_none() && this.applier.is_none() {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }
}

/// The longest requeue queued (as kube-runtime's scheduler: about a year).
const FAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// One reconcile of the pass, with its entry and its permit.
struct Running<K, E>
where
    K: Resource<DynamicType = ()>,
{
    at: usize,
    key: Option<ObjectRef<K>>,
    _permit: Option<OwnedSemaphorePermit>,
    work: BoxFuture<'static, Result<Action, Failed<E>>>,
}

impl<K, E> Future for Running<K, E>
where
    K: Resource<DynamicType = ()>,
{
    type Output = (
        usize,
        ObjectRef<K>,
        Result<Action, Failed<E>>,
        Option<OwnedSemaphorePermit>,
    );

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let result = std::task::ready!(this.work.poll_unpin(cx));
        // Taken once: FuturesUnordered drops a future that completed, never polls it again.
        let key = this
            .key
            .take()
            .expect("a completed reconcile is not polled again");
        Poll::Ready((this.at, key, result, this._permit.take()))
    }
}

/// When `action` asks to reconcile again. kube-runtime's `Action` keeps its duration to
/// itself; its `Debug` (`Action { requeue_after: Some(5s) }`) shows it, and the duration read
/// back is checked against the action, so a changed format cannot go unnoticed: it is
/// reported, and the object requeued at once.
pub(super) fn requeue_after(action: &Action) -> Option<Duration> {
    if *action == Action::await_change() {
        return None;
    }
    let shown = format!("{action:?}");
    let parsed = shown
        .strip_prefix("Action { requeue_after: Some(")
        .and_then(|rest| rest.strip_suffix(") }"))
        .and_then(parse_duration)
        .filter(|after| Action::requeue(*after) == *action);
    if parsed.is_none() {
        tracing::warn!(action = %shown, "cannot read the requeue's delay; requeueing at once");
    }
    Some(parsed.unwrap_or_default())
}

/// A `Duration` as its `Debug` shows it (`1.5s`, `250ms`, `3µs`, `10ns`), exactly.
fn parse_duration(shown: &str) -> Option<Duration> {
    let (number, nanos_per_unit) = [
        ("ns", 1u128),
        ("µs", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
    ]
    .into_iter()
    .find_map(|(unit, scale)| shown.strip_suffix(unit).map(|n| (n, scale)))?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit()) || fraction.len() > 9 {
        return None;
    }
    let mut nanos = whole.parse::<u128>().ok()?.checked_mul(nanos_per_unit)?;
    if !fraction.is_empty() {
        let digits = u32::try_from(fraction.len()).ok()?;
        let frac = fraction.parse::<u128>().ok()?;
        nanos = nanos.checked_add(frac.checked_mul(nanos_per_unit)? / 10u128.pow(digits))?;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    let sub = u32::try_from(nanos % 1_000_000_000).ok()?;
    Some(Duration::new(secs, sub))
}

/// The concurrency of an applier's `Config` (kube-runtime keeps it to itself; its `Debug`,
/// `Config { debounce: 0ns, concurrency: 256 }`, shows it). `None` if that format changed.
pub(super) fn concurrency_of(config: &Config) -> Option<u16> {
    let shown = format!("{config:?}");
    let (_, rest) = shown.split_once("concurrency: ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requeue_s_delay_is_read_back_exactly() {
        assert_eq!(requeue_after(&Action::await_change()), None);
        for after in [
            Duration::ZERO,
            Duration::from_nanos(7),
            Duration::from_micros(1500),
            Duration::from_millis(250),
            Duration::from_secs(1),
            Duration::new(3600, 1),
            Duration::new(5, 123_456_789),
            FAR,
        ] {
            assert_eq!(
                requeue_after(&Action::requeue(after)),
                Some(after),
                "{after:?}"
            );
        }
    }

    #[test]
    fn durations_are_parsed_as_debug_shows_them_and_nothing_else() {
        assert_eq!(parse_duration("1.5ms"), Some(Duration::from_micros(1500)));
        assert_eq!(parse_duration("2µs"), Some(Duration::from_micros(2)));
        assert_eq!(parse_duration("10ns"), Some(Duration::from_nanos(10)));
        assert_eq!(
            parse_duration("0.000000001s"),
            Some(Duration::from_nanos(1))
        );
        for bad in [
            "",
            "s",
            ".5s",
            "1.s5",
            "-1s",
            "1h",
            "1.0000000001s",
            "1e3s",
            "x1ms",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_applier_s_concurrency_is_read_from_its_config() {
        assert_eq!(concurrency_of(&Config::default()), Some(0));
        assert_eq!(
            concurrency_of(&Config::default().concurrency(256)),
            Some(256)
        );
        assert_eq!(
            concurrency_of(
                &Config::default()
                    .debounce(Duration::from_secs(3))
                    .concurrency(7)
            ),
            Some(7)
        );
    }

    fn key(name: &str) -> ObjectRef<k8s_openapi::api::core::v1::ConfigMap> {
        ObjectRef::new(name).within("ns")
    }

    fn obj(name: &str) -> k8s_openapi::api::core::v1::ConfigMap {
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("ns".into());
        cm
    }

    #[test]
    fn keys_are_kept_once_in_the_order_they_came_and_popped_once() {
        let initial = Initial::new(2);
        initial.add([key("b"), key("a"), key("b")]);
        initial.add([key("c"), key("a")]);
        assert_eq!(initial.len(), 3);
        let popped: Vec<String> =
            std::iter::from_fn(|| initial.pop().map(|(_, k)| k.name)).collect();
        assert_eq!(popped, ["b", "a", "c"]);
        assert!(initial.pop().is_none());
    }

    #[tokio::test]
    async fn the_applier_takes_what_the_pass_has_not_and_waits_for_what_it_runs() {
        let initial = Initial::new(0);
        initial.add([key("a"), key("b")]);
        let (at, _) = initial.pop().expect("a");
        // "a" runs in the pass: the applier waits; "b" is not started: the applier takes it.
        let Claim::First {
            waits: Some(mut done),
            permits: None,
            ..
        } = initial.claim(&obj("a"))
        else {
            panic!("the applier waits for the pass's reconcile");
        };
        assert!(matches!(initial.claim(&obj("b")), Claim::Free));
        assert!(initial.pop().is_none(), "b was taken by the applier");
        assert!(done.try_recv().is_err());
        initial.finish(at, None);
        assert!(matches!(
            done.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
        initial.end();
        assert!(initial.quiet.load(Ordering::Acquire));
        assert!(matches!(initial.claim(&obj("a")), Claim::Free));
    }

    #[tokio::test]
    async fn while_the_pass_runs_the_applier_takes_its_permits() {
        let initial = Initial::new(3);
        initial.add([key("a")]);
        let Claim::First {
            waits: None,
            permits: Some(permits),
            ..
        } = initial.claim(&obj("x"))
        else {
            panic!("a permit while the pass runs");
        };
        assert_eq!(permits.available_permits(), 3);
        initial.end();
        assert!(matches!(initial.claim(&obj("x")), Claim::Free));
    }

    #[tokio::test]
    async fn beside_a_busy_pass_the_applier_is_still_polled_and_both_end() {
        let pass = futures::stream::iter((0..1000).map(|i| format!("pass {i}")));
        let applier = futures::stream::iter(["applier".to_owned()]);
        let all: Vec<String> = Beside::new(pass, applier).collect().await;
        assert_eq!(all.len(), 1001);
        let at = all
            .iter()
            .position(|i| i == "applier")
            .expect("the applier's item");
        assert_eq!(at, APPLIER_EVERY, "polled after a round of the pass");
        assert_eq!(all[0], "pass 0");
    }
}
