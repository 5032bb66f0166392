//! The Lease watches: one per observed Lease, shared by every observer (or one per sharded
//! group, [`super::shard_watch`]), on one list-then-watch task. A watch keeps the local view
//! current and tells observers about holder changes (grants and releases), never about
//! renewals.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ListParams, WatchEvent, WatchParams};
use tokio::sync::watch;
use tokio::time::Instant;

use super::inner::{Fail, Inner};
use super::read::ReadLease;
use super::record::{self, View};
use super::slots::Traffic;
use super::state::{Current, Notices, Source};
use crate::backend::{BackendError, BackendErrorKind, HolderChange, HolderToken};

/// How long the API server keeps one watch request open (kube's default, below the server's
/// 5-minute minimum request timeout); the task then resumes from the last resourceVersion.
pub const WATCH_TIMEOUT_SECS: u32 = 290;
/// A watch that delivers nothing for this long is presumed dead (a silently dropped
/// connection) and restarted; the server ends healthy ones before.
const IDLE_LIMIT: Duration = Duration::from_secs(WATCH_TIMEOUT_SECS as u64 + 30);
/// Retry pauses after a failure: doubling from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Identifies a term: a change of any of these is a change of holder.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum TermKey {
    Free,
    Held {
        holder: String,
        token: Option<HolderToken>,
        acquired: Option<MicroTime>,
        transitions: i32,
    },
}

pub(super) fn term_of(current: &Current) -> (TermKey, HolderChange) {
    let Current::Present(seen) = current else {
        return (TermKey::Free, HolderChange::free());
    };
    let view = View::of(&seen.lease);
    let Some(holder) = view.holder.clone() else {
        return (TermKey::Free, HolderChange::free());
    };
    let key = TermKey::Held {
        holder: holder.clone(),
        token: view.token,
        acquired: seen
            .lease
            .spec
            .as_ref()
            .and_then(|s| s.acquire_time.clone()),
        transitions: view.transitions,
    };
    let change = HolderChange {
        holder: Some(holder),
        fencing: Some(view.term_fencing(seen.rv)),
    };
    (key, change)
}

/// A stream of holder changes of `name`, starting with the state once the watch is synced.
///
/// A Lease that a sharded group's joint watch follows ([`super::shard_watch`]) is fed by
/// that watch; any other gets a watch of its own, shared by every observer of the name.
pub fn observe(
    inner: &Arc<Inner>,
    name: &str,
) -> BoxStream<'static, Result<HolderChange, BackendError>> {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        let e = BackendError::new(
            crate::backend::BackendErrorKind::Config,
            "observe needs a tokio runtime to run its watch",
        );
        return Box::pin(futures::stream::iter([Err(e)]));
    };
    let name: Arc<str> = Arc::from(name);
    let mut rx = {
        let mut locks = inner.locks();
        let st = locks.entry(name.clone()).or_default();
        match (&st.watch, &mut st.joint) {
            (Some(tx), _) => tx.subscribe(),
            (None, Some(joint)) => {
                // The joint watch announces the next change; until then, what it has seen.
                let now = joint
                    .live
                    .then(|| st.known.as_ref().map(|k| Ok(term_of(k).1)))
                    .flatten();
                joint.feeds = true;
                let (tx, rx) = watch::channel(now);
                st.watch = Some(Arc::new(tx));
                rx
            }
            (None, None) => {
                let (tx, rx) = watch::channel(None);
                let tx = Arc::new(tx);
                st.watch = Some(tx.clone());
                let scope = OneLease {
                    name: name.clone(),
                    tx,
                    term: None,
                };
                rt.spawn(run(inner.clone(), scope));
                rx
            }
        }
    };
    rx.mark_changed();
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            let notice = rx.borrow_and_update().clone();
            if let Some(notice) = notice {
                return Some((notice, rx));
            }
        }
    }))
}

/// What one watch task follows, and what it does with what it sees: one Lease by name
/// ([`OneLease`]), or every shard Lease of a sharded group by label
/// ([`super::shard_watch`]). The task itself — list, watch from the list's version, resume,
/// list again on 410, back off on failure — is the same for both.
pub(super) trait Scope: Send + 'static {
    /// Names what is watched, in messages.
    fn what(&self) -> &str;
    /// The list that starts a session.
    fn list_params(&self) -> ListParams;
    /// The watch that continues it.
    fn watch_params(&self) -> WatchParams;
    /// Applies a list of every Lease in scope, sent at `sent`.
    fn listed(
        &mut self,
        inner: &Inner,
        leases: Vec<Lease>,
        sent: Instant,
    ) -> Result<(), BackendError>;
    /// Applies one watch event: `lease` changed (`Some`), or was deleted at `deleted_rv`.
    fn changed(
        &mut self,
        inner: &Inner,
        name: &str,
        lease: Option<Lease>,
        deleted_rv: Option<u64>,
    ) -> Result<(), BackendError>;
    /// The watch broke: reads go to the server again until the next list.
    fn failed(&mut self, inner: &Inner, e: BackendError);
    /// Resolves when nobody may need the watch any more (then [`finished`](Self::finished)
    /// decides).
    fn closed(&self) -> impl Future<Output = ()> + Send + '_;
    /// Whether nobody needs the watch; if so, unregisters it.
    fn finished(&self, inner: &Inner) -> bool;
}

/// The watch of one Lease, by name: its observers' notices.
struct OneLease {
    name: Arc<str>,
    tx: Notices,
    /// The term last announced; `None` after a failure, so the next sync is announced.
    term: Option<TermKey>,
}

impl Scope for OneLease {
    fn what(&self) -> &str {
        &self.name
    }

    fn list_params(&self) -> ListParams {
        ListParams::default().fields(&format!("metadata.name={}", self.name))
    }

    fn watch_params(&self) -> WatchParams {
        WatchParams::default().fields(&format!("metadata.name={}", self.name))
    }

    fn listed(
        &mut self,
        inner: &Inner,
        leases: Vec<Lease>,
        sent: Instant,
    ) -> Result<(), BackendError> {
        let lease = leases
            .into_iter()
            .find(|l| l.metadata.name.as_deref() == Some(&*self.name));
        let current = inner.note(&self.name, lease, None, Source::Answer(sent))?;
        if let Some(st) = inner.locks().get_mut(&self.name) {
            st.live = true;
        }
        announce(&self.tx, &mut self.term, &current);
        Ok(())
    }

    fn changed(
        &mut self,
        inner: &Inner,
        _name: &str,
        lease: Option<Lease>,
        deleted_rv: Option<u64>,
    ) -> Result<(), BackendError> {
        let current = inner.note(&self.name, lease, deleted_rv, Source::Watch)?;
        announce(&self.tx, &mut self.term, &current);
        Ok(())
    }

    fn failed(&mut self, inner: &Inner, e: BackendError) {
        tracing::debug!(lock = %self.name, error = %e, "lease watch failed; retrying");
        if let Some(st) = inner.locks().get_mut(&self.name) {
            st.live = false;
        }
        self.term = None;
        fail(&self.tx, e);
    }

    fn closed(&self) -> impl Future<Output = ()> + Send + '_ {
        self.tx.closed()
    }

    /// Unregisters the watch under the state lock, so that no observer can subscribe to a
    /// task that is ending.
    fn finished(&self, inner: &Inner) -> bool {
        let mut locks = inner.locks();
        if self.tx.receiver_count() > 0 {
            return false;
        }
        if let Some(st) = locks.get_mut(&self.name)
            && st.watch.as_ref().is_some_and(|w| Arc::ptr_eq(w, &self.tx))
        {
            st.watch = None;
            st.live = false;
            if st.is_idle() {
                locks.remove(&self.name);
            }
        }
        true
    }
}

/// Tells observers about `current` if its term differs from `last` announced.
pub(super) fn announce(tx: &Notices, last: &mut Option<TermKey>, current: &Current) {
    let (key, change) = term_of(current);
    if last.as_ref() != Some(&key) {
        *last = Some(key);
        tx.send_replace(Some(Ok(change)));
    }
}

/// Tells observers of a broken watch once.
pub(super) fn fail(tx: &Notices, e: BackendError) {
    tx.send_if_modified(|v| {
        if matches!(v, Some(Err(_))) {
            false
        } else {
            *v = Some(Err(e));
            true
        }
    });
}

/// The task behind one watch; ends when nobody needs it any more.
struct Task<S> {
    inner: Arc<Inner>,
    scope: S,
    backoff: Duration,
}

pub(super) async fn run<S: Scope>(inner: Arc<Inner>, scope: S) {
    let mut task = Task {
        inner,
        scope,
        backoff: BACKOFF_FIRST,
    };
    task.run().await;
    tracing::debug!(watch = %task.scope.what(), "lease watch stopped: nobody needs it");
}

enum Next {
    /// Start over with a fresh list.
    Relist,
    /// Pause, then start over.
    Backoff(BackendError),
    /// Nobody needs the watch any more.
    Stop,
}

impl<S: Scope> Task<S> {
    async fn run(&mut self) {
        loop {
            match self.session().await {
                Next::Relist => {}
                Next::Stop => return,
                Next::Backoff(e) => {
                    self.scope.failed(&self.inner, e);
                    let pause = self.backoff;
                    self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = self.scope.closed() => {}
                    }
                }
            }
            if self.scope.finished(&self.inner) {
                return;
            }
        }
    }

    /// One list, then watches from its resourceVersion until something breaks.
    async fn session(&mut self) -> Next {
        let sent = Instant::now();
        let params = self.scope.list_params();
        let listed = tokio::select! {
            r = self.inner.list_leases(self.scope.what(), &params) => r,
            () = self.scope.closed() => return self.stop_or(Next::Relist),
        };
        let (leases, mut rv) = match listed {
            Ok(l) => l,
            Err(e) => return Next::Backoff(e),
        };
        if let Err(e) = self.scope.listed(&self.inner, leases, sent) {
            return Next::Backoff(e);
        }
        let params = self.scope.watch_params();
        loop {
            let opened = tokio::select! {
                r = self.inner.watch_from(self.scope.what(), &params, &rv) => r,
                () = self.scope.closed() => return self.stop_or(Next::Relist),
            };
            let mut events = match opened {
                Ok(s) => s,
                Err(e) => return Next::Backoff(e),
            };
            loop {
                let event = tokio::select! {
                    e = tokio::time::timeout(IDLE_LIMIT, events.next()) => e,
                    () = self.scope.closed() => {
                        if self.scope.finished(&self.inner) {
                            return Next::Stop;
                        }
                        continue;
                    }
                };
                let event = match event {
                    Err(_) => {
                        tracing::debug!(watch = %self.scope.what(), "lease watch idle too long; restarting it");
                        return Next::Relist;
                    }
                    // The server closed the watch (its timeout): resume where it ended.
                    Ok(None) => break,
                    Ok(Some(Ok(event))) => event,
                    Ok(Some(Err(e))) => {
                        return Next::Backoff(super::error::map(
                            e,
                            self.inner.op("watch", self.scope.what()),
                        ));
                    }
                };
                let applied = match event {
                    WatchEvent::Added(lease) | WatchEvent::Modified(lease) => {
                        if let Some(v) = lease.metadata.resource_version.clone() {
                            rv = v;
                        }
                        let name = lease.metadata.name.clone().unwrap_or_default();
                        self.backoff = BACKOFF_FIRST;
                        self.scope.changed(&self.inner, &name, Some(lease), None)
                    }
                    WatchEvent::Deleted(lease) => {
                        let deleted = record::parse_resource_version(&lease).ok();
                        if let Some(v) = lease.metadata.resource_version.clone() {
                            rv = v;
                        }
                        let name = lease.metadata.name.clone().unwrap_or_default();
                        self.scope.changed(&self.inner, &name, None, deleted)
                    }
                    WatchEvent::Bookmark(b) => {
                        rv = b.metadata.resource_version;
                        Ok(())
                    }
                    WatchEvent::Error(status) if status.code == 410 => {
                        // Our resourceVersion is too old to resume from: list again.
                        return Next::Relist;
                    }
                    WatchEvent::Error(status) => {
                        let e = kube::Error::Api(status);
                        return Next::Backoff(super::error::map(
                            e,
                            self.inner.op("watch", self.scope.what()),
                        ));
                    }
                };
                if let Err(e) = applied {
                    return Next::Backoff(e);
                }
            }
        }
    }

    fn stop_or(&self, next: Next) -> Next {
        if self.scope.finished(&self.inner) {
            Next::Stop
        } else {
            next
        }
    }
}

impl Inner {
    /// The Leases `params` select, and a resourceVersion to watch from.
    async fn list_leases(
        &self,
        what: &str,
        params: &ListParams,
    ) -> Result<(Vec<Lease>, String), BackendError> {
        let op = self.op("list", what);
        let list = match self
            .call(op, Traffic::Ordinary, self.reads.list(params))
            .await
        {
            Ok(l) => l,
            Err(Fail::Error(e)) => return Err(e),
            Err(Fail::NotFound | Fail::Conflict) => {
                return Err(BackendError::new(
                    BackendErrorKind::Config,
                    format!("{op}: not found (404); does the namespace exist?"),
                ));
            }
        };
        let rv = list.metadata.resource_version.clone().unwrap_or_default();
        Ok((
            list.items.into_iter().map(ReadLease::into_lease).collect(),
            rv,
        ))
    }

    /// Opens a watch of the Leases `params` select, from resourceVersion `rv`.
    async fn watch_from(
        &self,
        what: &str,
        params: &WatchParams,
        rv: &str,
    ) -> Result<BoxStream<'static, kube::Result<WatchEvent<Lease>>>, BackendError> {
        let op = self.op("watch", what);
        let params = params.clone().timeout(WATCH_TIMEOUT_SECS);
        match self
            .call(op, Traffic::Ordinary, self.reads.watch(&params, rv))
            .await
        {
            Ok(s) => Ok(boxed(s.map(|event| event.map(typed)))),
            Err(Fail::Error(e)) => Err(e),
            Err(Fail::NotFound | Fail::Conflict) => Err(BackendError::new(
                BackendErrorKind::Unavailable,
                format!("{op}: the watch could not start"),
            )),
        }
    }
}

/// A watch event of a Lease read field by field, as the typed event the view takes.
fn typed(event: WatchEvent<ReadLease>) -> WatchEvent<Lease> {
    match event {
        WatchEvent::Added(l) => WatchEvent::Added(l.into_lease()),
        WatchEvent::Modified(l) => WatchEvent::Modified(l.into_lease()),
        WatchEvent::Deleted(l) => WatchEvent::Deleted(l.into_lease()),
        WatchEvent::Bookmark(b) => WatchEvent::Bookmark(b),
        WatchEvent::Error(e) => WatchEvent::Error(e),
    }
}

fn boxed<S>(s: S) -> BoxStream<'static, kube::Result<WatchEvent<Lease>>>
where
    S: Stream<Item = kube::Result<WatchEvent<Lease>>> + Send + 'static,
{
    s.boxed()
}
