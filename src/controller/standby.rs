//! A term's controller made ready before the grant: every object's key collected on a
//! follower for the grant's first pass ([`super::pass`]) — the warm store's snapshot, then each
//! change and trigger — and at the grant that pass beside kube-runtime's applier, which gets
//! what happens from the grant on. The first reconcile after a grant then waits for no
//! queueing, whatever the number of objects (controller-runtime's `EnableWarmup` keeps its
//! work queue filled the same way).
//!
//! Nothing the user wrote runs before the grant: the follower holds only keys, and each
//! reconcile reads the object as the store has it when it starts (an object deleted meanwhile
//! is not reconciled). Every reconcile is polled by the term's stream, as kube-runtime's
//! applier polls its own: none outlives the workload, which the elector drops at the term's
//! stop deadline, and the grant's burst costs no task, no `JoinHandle` and no channel per
//! object.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::controller::{self, Action, Config, ReconcileRequest, applier};
use kube::runtime::reflector::{ObjectRef, ObjectRefExtra, Store};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio_util::task::AbortOnDropHandle;

use super::ControllerError;
use super::feed::{Live, Running, requests};
use super::pass::{Beside, Initial, Pass, after_pass, concurrency_of, key_of, requeues};
use super::reconcile::{Failed, ReconcileFn, Session, granted, unwrap_failed};
use super::triggers::Trigger;

/// The changes and triggers since the snapshot, as requests.
type LiveRequests<K> = Pin<Box<dyn Stream<Item = Vec<ReconcileRequest<K>>> + Send>>;

/// A term's results: kube-runtime's items, each reconcile error as the reconciler returned it.
pub(super) type Results<K, E> =
    BoxStream<'static, Result<(ObjectRef<K>, Action), controller::Error<E, ControllerError>>>;

/// A controller ready for a term: every object's key collected for the grant's first pass
/// ([`Initial`]) — the store's snapshot, then each change and trigger — by an intake task of
/// its own until the grant.
pub(super) struct Standby<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
    E: 'static,
{
    store: Store<K>,
    config: Config,
    reconcile: ReconcileFn<K, Ctx, E>,
    initial: Arc<Initial<K>>,
    /// The changes and triggers: read into `initial` by the intake until the grant takes
    /// them for the applier's queue.
    live: Arc<Mutex<Option<LiveRequests<K>>>>,
    /// Collects the keys until the grant.
    intake: Option<AbortOnDropHandle<()>>,
    /// Set once the snapshot is in `initial`.
    armed: Arc<AtomicBool>,
}

impl<K, Ctx, E> Standby<K, Ctx, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
{
    /// Starts collecting the keys of the next term's first pass over `running` and
    /// `triggers`: once `ready` (the store has listed), every object in the store, then each
    /// change and trigger. Nothing is reconciled before [`grant`](Self::grant).
    pub(super) fn prepare(
        running: Running<K>,
        triggers: &broadcast::Sender<Trigger<K>>,
        ready: impl Future<Output = Result<(), ControllerError>> + Send + 'static,
        config: Config,
        reconcile: ReconcileFn<K, Ctx, E>,
    ) -> Self {
        let concurrency = concurrency_of(&config).unwrap_or_else(|| {
            tracing::warn!(
                ?config,
                "cannot read the applier's concurrency; bounding the grant's pass at 256"
            );
            256
        });
        let initial = Arc::new(Initial::new(concurrency));
        // Subscribed before the snapshot is read, so no change between the two is lost.
        let live: LiveRequests<K> = Box::pin(futures::stream::unfold(
            Live::new(&running, triggers),
            |mut live| async move { live.next().await.map(|requests| (requests, live)) },
        ));
        let live = Arc::new(Mutex::new(Some(live)));
        let armed = Arc::new(AtomicBool::new(false));
        let intake = tokio::spawn(intake(
            initial.clone(),
            running.store.clone(),
            live.clone(),
            ready,
            armed.clone(),
        ));
        Self {
            store: running.store,
            config,
            reconcile,
            initial,
            live,
            intake: Some(AbortOnDropHandle::new(intake)),
            armed,
        }
    }

    /// Whether a term can use this standby at once: the snapshot is collected and the intake
    /// still runs.
    pub(super) fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Acquire) && self.intake.as_ref().is_some_and(|d| !d.is_finished())
    }

    /// The grant: the term's results, polled by the term's own stream — the first pass over
    /// every collected key, and beside it kube-runtime's applier, fed the changes, triggers
    /// and the pass's requeues from now on, with `session`'s term and context. Ends when both
    /// do (the term ended and its reconciles finished); a reconcile's panic resumes here.
    pub(super) fn grant(mut self, session: Arc<Session<Ctx>>) -> Results<K, E> {
        // Taken before the intake stops: the changes it has not read yet go to the applier.
        let live = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.intake = None;
        let ended = session.term.cancellation().clone().cancelled_owned();
        let queue = futures::stream::select(
            futures::stream::iter(live)
                .flatten()
                .flat_map(futures::stream::iter),
            requeues(self.initial.clone()),
        )
        .map(Ok::<_, ControllerError>)
        .take_until(ended);
        let (initial, store, reconcile) = (
            self.initial.clone(),
            self.store.clone(),
            self.reconcile.clone(),
        );
        let in_term = session.clone();
        let applier = applier(
            move |obj: Arc<K>, _: Arc<()>| after_pass(&initial, &store, &in_term, &reconcile, obj),
            |_, failed: &Failed<E>, _| failed.action.clone(),
            Arc::new(()),
            self.store.clone(),
            queue,
            self.config,
        );
        let pass = Pass::new(self.initial, session, self.store, self.reconcile);
        Beside::new(pass, Box::pin(applier))
            .map(unwrap_failed)
            .boxed()
    }
}

/// The results of a term that had no standby ready (cold mode, a store not yet listed, the
/// standby off): kube-runtime's applier over `running` and `triggers`, its queue waiting for
/// `ready`, then every object, each change and each trigger, until the term ends.
pub(super) fn without_standby<K, Ctx, E>(
    running: Running<K>,
    triggers: &broadcast::Sender<Trigger<K>>,
    ready: impl Future<Output = Result<(), ControllerError>> + Send + 'static,
    config: Config,
    reconcile: ReconcileFn<K, Ctx, E>,
    session: Arc<Session<Ctx>>,
) -> Results<K, E>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
{
    let store = running.store.clone();
    let ended = session.term.cancellation().clone().cancelled_owned();
    let queue = requests(running, triggers.clone(), ready, ended);
    applier(
        move |obj: Arc<K>, _: Arc<()>| granted(&session, &reconcile, obj),
        |_, failed: &Failed<E>, _| failed.action.clone(),
        Arc::new(()),
        store,
        queue,
        config,
    )
    .map(unwrap_failed)
    .boxed()
}

/// Collects a standby's keys on a follower until the grant takes `live` out of its slot:
/// once `ready`, the store's snapshot, then each change and trigger (each key once).
async fn intake<K>(
    initial: Arc<Initial<K>>,
    store: Store<K>,
    live: Arc<Mutex<Option<LiveRequests<K>>>>,
    ready: impl Future<Output = Result<(), ControllerError>>,
    armed: Arc<AtomicBool>,
) where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    // Not ready (the watch stopped): the standby stays unarmed, and a term builds its own
    // controller, which reports why.
    if ready.await.is_err() {
        return;
    }
    initial.add(store.state().iter().map(|obj| key_of(&**obj)));
    armed.store(true, Ordering::Release);
    loop {
        let requests = futures::future::poll_fn(|cx| {
            let mut slot = live.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(requests) = slot.as_mut() else {
                return Poll::Ready(None);
            };
            match requests.as_mut().poll_next(cx) {
                Poll::Ready(None) => {
                    *slot = None;
                    Poll::Ready(None)
                }
                other => other,
            }
        })
        .await;
        let Some(requests) = requests else {
            return;
        };
        initial.add(requests.into_iter().map(|mut r| {
            // Compared without them; kept without them.
            r.obj_ref.extra = ObjectRefExtra::default();
            r.obj_ref
        }));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use tokio::sync::{Notify, mpsc, watch};

    use super::*;
    use crate::controller::reconcile::reconcile_fn;
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

    fn name(cm: &ConfigMap) -> String {
        cm.metadata.name.clone().unwrap_or_default()
    }

    /// What the reconciles did, in order: ("start" | "end", name, version).
    #[derive(Default)]
    struct Seen {
        events: Mutex<Vec<(&'static str, String, String)>>,
        /// Reconciles running now, and the most at once.
        running: Mutex<(usize, usize)>,
    }

    impl Seen {
        fn push(&self, what: &'static str, cm: &ConfigMap) {
            self.events
                .lock()
                .expect("not poisoned")
                .push((what, name(cm), version(cm)));
        }

        fn starts(&self) -> Vec<(String, String)> {
            self.events
                .lock()
                .expect("not poisoned")
                .iter()
                .filter(|(what, _, _)| *what == "start")
                .map(|(_, n, v)| (n.clone(), v.clone()))
                .collect()
        }

        fn starts_of(&self, who: &str) -> usize {
            self.starts().iter().filter(|(n, _)| n == who).count()
        }

        fn most_at_once(&self) -> usize {
            self.running.lock().expect("not poisoned").1
        }
    }

    /// A reconciler that records its starts and ends in its context; `bad` fails (its error
    /// policy requeues after 7 s), `held` at version "0" waits for `release` before it ends, and `again`'s
    /// version "0" asks to be requeued after 10 s. Each reconcile takes `work` of (paused)
    /// time.
    fn reconciler(
        held: &'static str,
        release: Arc<Notify>,
        work: Duration,
    ) -> ReconcileFn<ConfigMap, Seen, Bad> {
        reconcile_fn(
            move |cm: Arc<ConfigMap>, seen: Arc<Seen>| {
                let release = release.clone();
                async move {
                    seen.push("start", &cm);
                    {
                        let mut running = seen.running.lock().expect("not poisoned");
                        running.0 += 1;
                        running.1 = running.1.max(running.0);
                    }
                    tokio::time::sleep(work).await;
                    if name(&cm) == held && version(&cm) == "0" {
                        release.notified().await;
                    }
                    seen.running.lock().expect("not poisoned").0 -= 1;
                    seen.push("end", &cm);
                    match (name(&cm).as_str(), version(&cm).as_str()) {
                        ("bad", _) => Err(Bad),
                        ("again", "0") => Ok(Action::requeue(Duration::from_secs(10))),
                        _ => Ok(Action::await_change()),
                    }
                }
            },
            |_, _: &Bad, _| Action::requeue(Duration::from_secs(7)),
        )
    }

    /// A listed store of `names` (version "0"), its writer, and a `Running` over it.
    fn listed(names: &[&str]) -> (Writer<ConfigMap>, Running<ConfigMap>) {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&Event::Init);
        for name in names {
            writer.apply_watcher_event(&Event::InitApply(cm(name, "0")));
        }
        writer.apply_watcher_event(&Event::InitDone);
        let (changes, _) = broadcast::channel(64);
        let running = Running {
            store,
            changes,
            state: watch::channel(super::super::CacheState::Warm).1,
        };
        (writer, running)
    }

    /// Writes `obj` to the store and tells the queues, as the watch does.
    fn apply(writer: &mut Writer<ConfigMap>, running: &Running<ConfigMap>, obj: ConfigMap) {
        writer.apply_watcher_event(&Event::Apply(obj.clone()));
        let _ = running.changes.send(ObjectRef::from_obj(&obj));
    }

    async fn armed(
        running: &Running<ConfigMap>,
        concurrency: u16,
        reconcile: ReconcileFn<ConfigMap, Seen, Bad>,
    ) -> (
        Standby<ConfigMap, Seen, Bad>,
        broadcast::Sender<Trigger<ConfigMap>>,
    ) {
        let (triggers, _) = broadcast::channel(64);
        let standby = Standby::prepare(
            running.clone(),
            &triggers,
            async { Ok(()) },
            Config::default().concurrency(concurrency),
            reconcile,
        );
        while !standby.is_armed() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        (standby, triggers)
    }

    type Out = mpsc::UnboundedReceiver<
        Result<(ObjectRef<ConfigMap>, Action), controller::Error<Bad, ControllerError>>,
    >;

    /// Grants `standby` a term and drives its results in a task of their own.
    async fn grant(standby: Standby<ConfigMap, Seen, Bad>) -> (TestTerm, Arc<Seen>, Out) {
        let term = TestTerm::begin("standby", "pod-a").await.expect("term");
        let seen: Arc<Seen> = Arc::default();
        let mut results = standby.grant(Arc::new(Session {
            term: term.term(),
            ctx: seen.clone(),
        }));
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(item) = results.next().await {
                let _ = tx.send(item);
            }
        });
        (term, seen, rx)
    }

    async fn until(what: &str, ok: impl Fn() -> bool) {
        for _ in 0..100_000 {
            if ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("{what}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_grant_reconciles_each_collected_object_once_as_it_is_then() {
        let (mut writer, running) = listed(&["a", "b", "gone", "bad"]);
        let release = Arc::new(Notify::new());
        let (standby, triggers) = armed(
            &running,
            4,
            reconciler("", release, Duration::from_millis(10)),
        )
        .await;
        // Before the grant: one object changes (twice), one is deleted, one is created, and a
        // trigger names one already collected.
        apply(&mut writer, &running, cm("a", "1"));
        apply(&mut writer, &running, cm("a", "2"));
        writer.apply_watcher_event(&Event::Delete(cm("gone", "0")));
        apply(&mut writer, &running, cm("new", "0"));
        let _ = triggers.send(Trigger::One(ReconcileRequest::from(
            ObjectRef::<ConfigMap>::new("b").within("ns"),
        )));
        until("the intake read the changes", || standby.initial.len() == 5).await;
        tokio::time::sleep(Duration::from_secs(1)).await;

        let (_term, seen, mut out) = grant(standby).await;
        let mut done = BTreeMap::new();
        while done.len() < 4 {
            match out.recv().await.expect("results") {
                Ok((obj, action)) => done.insert(obj.name, Ok(action)),
                Err(controller::Error::ReconcilerFailed(error, obj)) => {
                    done.insert(obj.name, Err(error.to_string()))
                }
                Err(other) => panic!("{other}"),
            };
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mut starts = seen.starts();
        starts.sort();
        assert_eq!(
            starts,
            [("a", "2"), ("b", "0"), ("bad", "0"), ("new", "0")]
                .map(|(n, v)| (n.to_owned(), v.to_owned())),
            "each object once, as it is at its reconcile, and none deleted meanwhile"
        );
        assert_eq!(done.get("a"), Some(&Ok(Action::await_change())));
        assert_eq!(done.get("bad"), Some(&Err("bad object".to_owned())));
        assert!(!done.contains_key("gone"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_during_the_pass_waits_for_its_reconcile_of_the_object() {
        let (mut writer, running) = listed(&["a", "b", "c"]);
        let release = Arc::new(Notify::new());
        let (standby, _triggers) = armed(
            &running,
            4,
            reconciler("a", release.clone(), Duration::ZERO),
        )
        .await;
        let (_term, seen, mut out) = grant(standby).await;
        until("the pass started a", || seen.starts_of("a") == 1).await;
        apply(&mut writer, &running, cm("a", "1"));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            seen.starts_of("a"),
            1,
            "the change waits for the pass's reconcile"
        );
        release.notify_one();
        until("the change is reconciled", || seen.starts_of("a") == 2).await;
        let events = seen.events.lock().expect("not poisoned").clone();
        let of_a: Vec<(&str, &str)> = events
            .iter()
            .filter(|(_, n, _)| n == "a")
            .map(|(what, _, v)| (*what, v.as_str()))
            .take(3)
            .collect();
        assert_eq!(
            of_a,
            [("start", "0"), ("end", "0"), ("start", "1")],
            "the change's reconcile starts after the pass's ended"
        );
        let mut names = Vec::new();
        while names.len() < 4 {
            names.push(out.recv().await.expect("results").expect("ok").0.name);
        }
        names.sort();
        assert_eq!(names, ["a", "a", "b", "c"]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_object_the_applier_reconciled_first_is_skipped_by_the_pass() {
        let names = ["a", "b", "c", "d"];
        let (mut writer, running) = listed(&names);
        let release = Arc::new(Notify::new());
        // One at a time, a second each: the others wait in the pass.
        let (standby, _triggers) =
            armed(&running, 1, reconciler("", release, Duration::from_secs(1))).await;
        let (_term, seen, _out) = grant(standby).await;
        until("the pass started one", || !seen.starts().is_empty()).await;
        let first = seen.starts()[0].0.clone();
        let changed = names.iter().find(|n| **n != first).expect("another");
        apply(&mut writer, &running, cm(changed, "1"));
        until("every object reconciled", || {
            names.iter().all(|n| seen.starts_of(n) >= 1)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        for n in names {
            assert_eq!(seen.starts_of(n), 1, "{n}: {:?}", seen.starts());
        }
        assert!(
            seen.starts()
                .contains(&((*changed).to_owned(), "1".to_owned())),
            "the changed one as changed: {:?}",
            seen.starts()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_pass_s_requeues_reach_the_applier_and_an_earlier_change_wins() {
        let (mut writer, running) = listed(&["again", "bad", "other"]);
        let release = Arc::new(Notify::new());
        let (standby, _triggers) =
            armed(&running, 4, reconciler("", release, Duration::ZERO)).await;
        let (_term, seen, _out) = grant(standby).await;
        until("the pass", || seen.starts().len() == 3).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(seen.starts().len(), 3, "nothing due yet");
        // "bad" was requeued by its error policy (7 s), "again" by its reconcile (10 s).
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(seen.starts_of("bad"), 2, "{:?}", seen.starts());
        assert_eq!(seen.starts_of("again"), 1);
        // A change before the requeue is due: reconciled now, and not again at 10 s.
        apply(&mut writer, &running, cm("again", "1"));
        until("the change", || seen.starts_of("again") == 2).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(seen.starts_of("again"), 2, "{:?}", seen.starts());
        assert_eq!(seen.starts_of("other"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pass_and_the_applier_share_the_concurrency() {
        let names: Vec<String> = (0..12).map(|i| format!("o{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (mut writer, running) = listed(&refs);
        let release = Arc::new(Notify::new());
        let (standby, _triggers) =
            armed(&running, 3, reconciler("", release, Duration::from_secs(1))).await;
        let (_term, seen, _out) = grant(standby).await;
        // Changes during the pass, of objects reconciled and not: the applier runs too.
        for name in &refs {
            until("a reconcile ended", || {
                seen.events
                    .lock()
                    .expect("not poisoned")
                    .iter()
                    .any(|e| e.0 == "end")
            })
            .await;
            apply(&mut writer, &running, cm(name, "1"));
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        until("every change reconciled", || {
            refs.iter()
                .all(|n| seen.starts().contains(&((*n).to_owned(), "1".to_owned())))
        })
        .await;
        assert_eq!(seen.most_at_once(), 3, "the bound, reached and kept");
    }

    #[tokio::test(start_paused = true)]
    async fn the_pass_starts_nothing_after_the_term_ended_and_finishes_what_runs() {
        let (_writer, running) = listed(&["a", "b", "c"]);
        let release = Arc::new(Notify::new());
        let (standby, _triggers) =
            armed(&running, 1, reconciler("", release, Duration::from_secs(1))).await;
        let (term, seen, mut out) = grant(standby).await;
        until("the pass started one", || seen.starts().len() == 1).await;
        term.term().cancellation().cancel();
        let ended = out.recv().await.expect("the reconcile in flight");
        assert!(ended.is_ok());
        assert!(out.recv().await.is_none(), "the results end");
        let events = seen.events.lock().expect("not poisoned").clone();
        assert_eq!(events.len(), 2, "one reconcile, finished: {events:?}");
    }

    #[tokio::test]
    async fn after_the_grant_reconciles_run_only_where_the_term_polls_its_results() {
        let (_writer, running) = listed(&["a", "b", "c"]);
        let release = Arc::new(Notify::new());
        let (standby, _triggers) =
            armed(&running, 4, reconciler("", release, Duration::ZERO)).await;
        let term = TestTerm::begin("standby", "pod-a").await.expect("term");
        let seen: Arc<Seen> = Arc::default();
        let results = standby.grant(Arc::new(Session {
            term: term.term(),
            ctx: seen.clone(),
        }));
        // The follower's intake no longer runs anything: the grant's reconciles are the
        // term's to poll (the elector drops them with its workload at the stop deadline).
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            seen.starts().is_empty(),
            "no reconcile ran before the term polled its results"
        );
        let mut done: Vec<String> = results
            .take(3)
            .map(|r| r.expect("reconciled").0.name)
            .collect()
            .await;
        done.sort();
        assert_eq!(done, ["a", "b", "c"]);
        assert_eq!(seen.starts().len(), 3);
    }
}
