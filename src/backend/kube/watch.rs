//! One watch per observed Lease, shared by every observer: keeps the local view current and
//! tells observers about holder changes (grants and releases), never about renewals.

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
enum TermKey {
    Free,
    Held {
        holder: String,
        token: Option<HolderToken>,
        acquired: Option<MicroTime>,
        transitions: i32,
    },
}

fn term_of(current: &Current) -> (TermKey, HolderChange) {
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
        match &st.watch {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(None);
                let tx = Arc::new(tx);
                st.watch = Some(tx.clone());
                rt.spawn(run(inner.clone(), name.clone(), tx));
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

/// The task behind one Lease's notices; ends when the last observer is gone.
struct Task {
    inner: Arc<Inner>,
    name: Arc<str>,
    tx: Notices,
    /// The term last announced; `None` after a failure, so the next sync is announced.
    term: Option<TermKey>,
    backoff: Duration,
}

async fn run(inner: Arc<Inner>, name: Arc<str>, tx: Notices) {
    let mut task = Task {
        inner,
        name,
        tx,
        term: None,
        backoff: BACKOFF_FIRST,
    };
    task.run().await;
    tracing::debug!(lock = %task.name, "lease watch stopped: no observers left");
}

enum Next {
    /// Start over with a fresh list.
    Relist,
    /// Pause, then start over.
    Backoff(BackendError),
    /// No observers left.
    Stop,
}

impl Task {
    async fn run(&mut self) {
        loop {
            match self.session().await {
                Next::Relist => {}
                Next::Stop => return,
                Next::Backoff(e) => {
                    self.failed(e);
                    let pause = self.backoff;
                    self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = self.tx.closed() => {}
                    }
                }
            }
            if self.finished() {
                return;
            }
        }
    }

    /// One list, then watches from its resourceVersion until something breaks.
    async fn session(&mut self) -> Next {
        let sent = Instant::now();
        let listed = tokio::select! {
            r = self.inner.list_one(&self.name) => r,
            () = self.tx.closed() => return self.stop_or(Next::Relist),
        };
        let (lease, mut rv) = match listed {
            Ok(l) => l,
            Err(e) => return Next::Backoff(e),
        };
        let current = match self
            .inner
            .note(&self.name, lease, None, Source::Answer(sent))
        {
            Ok(c) => c,
            Err(e) => return Next::Backoff(e),
        };
        self.set_live(true);
        self.announce(&current);
        loop {
            let opened = tokio::select! {
                r = self.inner.watch_from(&self.name, &rv) => r,
                () = self.tx.closed() => return self.stop_or(Next::Relist),
            };
            let mut events = match opened {
                Ok(s) => s,
                Err(e) => return Next::Backoff(e),
            };
            loop {
                let event = tokio::select! {
                    e = tokio::time::timeout(IDLE_LIMIT, events.next()) => e,
                    () = self.tx.closed() => {
                        if self.finished() {
                            return Next::Stop;
                        }
                        continue;
                    }
                };
                let event = match event {
                    Err(_) => {
                        tracing::debug!(lock = %self.name, "lease watch idle too long; restarting it");
                        return Next::Relist;
                    }
                    // The server closed the watch (its timeout): resume where it ended.
                    Ok(None) => break,
                    Ok(Some(Ok(event))) => event,
                    Ok(Some(Err(e))) => {
                        return Next::Backoff(super::error::map(
                            e,
                            self.inner.op("watch", &self.name),
                        ));
                    }
                };
                match event {
                    WatchEvent::Added(lease) | WatchEvent::Modified(lease) => {
                        if let Some(v) = lease.metadata.resource_version.clone() {
                            rv = v;
                        }
                        match self
                            .inner
                            .note(&self.name, Some(lease), None, Source::Watch)
                        {
                            Ok(current) => self.announce(&current),
                            Err(e) => return Next::Backoff(e),
                        }
                        self.backoff = BACKOFF_FIRST;
                    }
                    WatchEvent::Deleted(lease) => {
                        let deleted = record::parse_resource_version(&lease).ok();
                        if let Some(v) = lease.metadata.resource_version.clone() {
                            rv = v;
                        }
                        match self.inner.note(&self.name, None, deleted, Source::Watch) {
                            Ok(current) => self.announce(&current),
                            Err(e) => return Next::Backoff(e),
                        }
                    }
                    WatchEvent::Bookmark(b) => rv = b.metadata.resource_version,
                    WatchEvent::Error(status) if status.code == 410 => {
                        // Our resourceVersion is too old to resume from: list again.
                        return Next::Relist;
                    }
                    WatchEvent::Error(status) => {
                        let e = kube::Error::Api(status);
                        return Next::Backoff(super::error::map(
                            e,
                            self.inner.op("watch", &self.name),
                        ));
                    }
                }
            }
        }
    }

    fn stop_or(&self, next: Next) -> Next {
        if self.finished() { Next::Stop } else { next }
    }

    /// Whether no observer is left; if so, unregisters the watch (under the state lock, so
    /// that no observer can subscribe to a task that is ending).
    fn finished(&self) -> bool {
        let mut locks = self.inner.locks();
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

    fn set_live(&self, live: bool) {
        if let Some(st) = self.inner.locks().get_mut(&self.name) {
            st.live = live;
        }
    }

    /// Tells observers about `current` if its term differs from the last one announced.
    fn announce(&mut self, current: &Current) {
        let (key, change) = term_of(current);
        if self.term.as_ref() != Some(&key) {
            self.term = Some(key);
            self.tx.send_replace(Some(Ok(change)));
        }
    }

    /// The watch broke: reads go to the server again, and observers hear of it once.
    fn failed(&mut self, e: BackendError) {
        tracing::debug!(lock = %self.name, error = %e, "lease watch failed; retrying");
        self.set_live(false);
        self.term = None;
        self.tx.send_if_modified(|v| {
            if matches!(v, Some(Err(_))) {
                false
            } else {
                *v = Some(Err(e));
                true
            }
        });
    }
}

/// The (at most one) Lease a field-selected list returned, with the list's resourceVersion.
pub type Listed = (Option<Lease>, String);

impl Inner {
    /// The Lease `name` (if any) and a resourceVersion to watch from.
    async fn list_one(&self, name: &str) -> Result<Listed, BackendError> {
        let op = self.op("list", name);
        let params = ListParams::default().fields(&format!("metadata.name={name}"));
        let list = match self.call(op, self.reads.list(&params)).await {
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
            list.items
                .into_iter()
                .find(|l| l.lease.metadata.name.as_deref() == Some(name))
                .map(ReadLease::into_lease),
            rv,
        ))
    }

    /// Opens a watch of the Lease `name` from resourceVersion `rv`.
    async fn watch_from(
        &self,
        name: &str,
        rv: &str,
    ) -> Result<BoxStream<'static, kube::Result<WatchEvent<Lease>>>, BackendError> {
        let op = self.op("watch", name);
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(WATCH_TIMEOUT_SECS);
        match self.call(op, self.reads.watch(&params, rv)).await {
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
