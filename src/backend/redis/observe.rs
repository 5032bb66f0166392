//! One subscriber connection per backend, fanning grant and release notifications out to every
//! local observer, and group membership changes to every local members stream
//! ([`GroupSubscription`], used by `members.rs`): one connection for all the locks and groups
//! of a backend.
//!
//! The hub keeps a table of the channels local observers want. A single task owns the pub/sub
//! connection: it subscribes and unsubscribes (batching channels, one command at a time) as
//! observers come and go, and delivers each message to the mailboxes of that channel's
//! observers: a lock's message parsed into a [`Notification`], a group's as a poke. When the
//! connection drops it tells every observer, reconnects with backoff and subscribes again.
//!
//! An observer's stream starts with the lock's state read *after* its subscription was
//! confirmed, so nothing that happens after that read can go unnoticed; later items are the
//! notifications, filtered by [`Version`] so that one older than what the observer already
//! reported is dropped. After a reconnection the stream yields an error item (a hiccup) and then
//! a fresh read.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, FuturesUnordered};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::engine::{Engine, Snapshot, Version};
use super::error::from_redis;
use super::server::Connector;
use crate::backend::{BackendError, BackendErrorKind, FencingToken, HolderChange};

/// The most notifications queued for one observer; beyond it the queue is replaced by a resync.
const MAILBOX_CAP: usize = 64;
/// The first and the longest pause between reconnection attempts.
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// A parsed notification: what the lock scripts PUBLISH on a lock's channel.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Notification {
    version: Version,
    change: HolderChange,
    /// The lock is not marked watched (a `G` grant), so its next grant and release will not be
    /// published unless an observer marks it.
    unwatched: bool,
}

/// Parses a notification payload: `g:<fencing>:<identity>` or `r:<fencing>` (a watched lock),
/// or `G:…` (a grant on a lock nobody could have marked: its key was missing).
fn parse_notification(payload: &[u8]) -> Option<Notification> {
    let text = std::str::from_utf8(payload).ok()?;
    let (kind, rest) = text.split_once(':')?;
    let unwatched = kind == "G";
    let (version, change) = match kind {
        "g" | "G" => {
            let (f, identity) = rest.split_once(':')?;
            let f: u64 = f.parse().ok()?;
            (
                Version(f, 0),
                HolderChange {
                    holder: Some(identity.to_owned()),
                    fencing: Some(FencingToken::new(f)),
                },
            )
        }
        "r" => (Version(rest.parse().ok()?, 1), HolderChange::free()),
        _ => return None,
    };
    Some(Notification {
        version,
        change,
        unwatched,
    })
}

/// What the hub delivers to an observer.
enum Note {
    Change(Notification),
    /// Something was published on a group's channel: read the group again.
    Poke,
    /// The connection of this epoch dropped: notifications may have been missed.
    Lost(u64),
    /// The mailbox overflowed: read the state afresh.
    Resync,
}

#[derive(Default)]
struct Mailbox {
    queue: Mutex<VecDeque<Note>>,
    ready: Notify,
}

impl Mailbox {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Note>> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn push(&self, note: Note) {
        {
            let mut q = self.lock();
            if q.len() >= MAILBOX_CAP {
                q.clear();
                q.push_back(Note::Resync);
            }
            q.push_back(note);
        }
        self.ready.notify_one();
    }

    /// Queues a [`Note::Poke`] unless one is already last in the queue: a reader re-reads the
    /// whole group, so pokes in a row are one.
    fn poke(&self) {
        {
            let mut q = self.lock();
            if matches!(q.back(), Some(Note::Poke)) {
                return;
            }
            if q.len() >= MAILBOX_CAP {
                q.clear();
                q.push_back(Note::Resync);
            }
            q.push_back(Note::Poke);
        }
        self.ready.notify_one();
    }

    async fn next(&self) -> Note {
        loop {
            if let Some(note) = self.lock().pop_front() {
                return note;
            }
            self.ready.notified().await;
        }
    }
}

/// The shared subscriber of one backend.
pub(crate) struct Hub {
    connector: Connector,
    state: Mutex<HubState>,
    /// Wakes the connection task when the wanted channels change.
    wake: Notify,
    /// Signalled whenever a channel's subscription is confirmed.
    confirmed: Notify,
    shutdown: CancellationToken,
    connect_timeout: Duration,
    request_timeout: Duration,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("Hub")
            .field("channels", &st.channels.len())
            .field("epoch", &st.epoch)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct HubState {
    channels: HashMap<String, Channel>,
    next_id: u64,
    /// The connection task, started by the first observer (and again if the runtime it ran on
    /// went away).
    task: Option<tokio::task::JoinHandle<()>>,
    /// Counts connections; notes about a dropped connection carry its epoch.
    epoch: u64,
    connected: bool,
}

#[derive(Default)]
struct Channel {
    observers: Vec<(u64, Arc<Mailbox>)>,
    confirmed: bool,
    /// A group's channel: any message on it means "read the group again".
    group: bool,
}

impl Hub {
    pub(crate) fn new(
        connector: Connector,
        shutdown: CancellationToken,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Self {
        Self {
            connector,
            state: Mutex::default(),
            wake: Notify::new(),
            confirmed: Notify::new(),
            shutdown,
            connect_timeout,
            request_timeout,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many channels are subscribed or wanted, and how many observers there are.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let st = self.lock();
        let observers = st.channels.values().map(|c| c.observers.len()).sum();
        (st.channels.len(), observers)
    }

    /// A stream of holder changes of the lock `name` on `channel`.
    pub(crate) fn observe(
        self: &Arc<Self>,
        engine: Arc<Engine>,
        name: &str,
        channel: String,
    ) -> BoxStream<'static, Result<HolderChange, BackendError>> {
        let reg = match self.register(channel, false) {
            Ok(reg) => reg,
            Err(e) => return Box::pin(futures::stream::once(async move { Err(e) })),
        };
        let observer = Observer {
            reg,
            engine,
            name: name.to_owned(),
            synced: None,
            epoch: 0,
            unmarked: false,
            backoff: None,
        };
        Box::pin(futures::stream::unfold(observer, |mut o| async move {
            let item = o.next().await;
            Some((item, o))
        }))
    }

    /// A subscription to the group channel `channel`, for a members stream: one more channel
    /// on the backend's one subscriber connection.
    pub(super) fn subscribe_group(
        self: &Arc<Self>,
        channel: String,
    ) -> Result<GroupSubscription, BackendError> {
        self.register(channel, true)
            .map(|reg| GroupSubscription { reg })
    }

    fn register(
        self: &Arc<Self>,
        channel: String,
        group: bool,
    ) -> Result<Registration, BackendError> {
        let mailbox = Arc::new(Mailbox::default());
        let id = {
            let mut st = self.lock();
            if st
                .task
                .as_ref()
                .is_none_or(tokio::task::JoinHandle::is_finished)
            {
                let rt = tokio::runtime::Handle::try_current().map_err(|_| {
                    BackendError::new(
                        BackendErrorKind::Config,
                        "redis observe needs a tokio runtime",
                    )
                })?;
                // A finished task left the channels marked as they were; start clean.
                for ch in st.channels.values_mut() {
                    ch.confirmed = false;
                }
                st.connected = false;
                st.task = Some(rt.spawn(run(self.clone())));
            }
            st.next_id += 1;
            let id = st.next_id;
            let ch = st.channels.entry(channel.clone()).or_default();
            ch.group = group;
            ch.observers.push((id, mailbox.clone()));
            id
        };
        self.wake.notify_one();
        Ok(Registration {
            hub: self.clone(),
            channel,
            id,
            mailbox,
        })
    }

    fn unregister(&self, channel: &str, id: u64) {
        let emptied = {
            let mut st = self.lock();
            let Some(ch) = st.channels.get_mut(channel) else {
                return;
            };
            ch.observers.retain(|(i, _)| *i != id);
            let empty = ch.observers.is_empty();
            if empty {
                st.channels.remove(channel);
            }
            empty
        };
        if emptied {
            self.wake.notify_one();
        }
    }

    /// Waits until `channel` is subscribed; returns the connection's epoch.
    async fn wait_confirmed(&self, channel: &str) -> Result<u64, BackendError> {
        let deadline = Instant::now() + self.request_timeout.max(self.connect_timeout);
        loop {
            let notified = self.confirmed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.lock();
                if st.channels.get(channel).is_some_and(|c| c.confirmed) {
                    return Ok(st.epoch);
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let connected = self.lock().connected;
                return Err(if connected {
                    BackendError::timeout("redis subscribe", self.request_timeout)
                } else {
                    BackendError::new(
                        BackendErrorKind::Unavailable,
                        "redis notification connection is down",
                    )
                });
            }
        }
    }

    /// What to subscribe and unsubscribe so that the server matches the table; marks channels
    /// already on the server confirmed.
    fn diff(&self, on_server: &HashSet<String>) -> (Vec<String>, Vec<String>) {
        let mut newly_confirmed = false;
        let (to_sub, to_unsub) = {
            let mut st = self.lock();
            let mut to_sub = Vec::new();
            for (name, ch) in &mut st.channels {
                if on_server.contains(name) {
                    if !ch.confirmed {
                        ch.confirmed = true;
                        newly_confirmed = true;
                    }
                } else {
                    to_sub.push(name.clone());
                }
            }
            let to_unsub = on_server
                .iter()
                .filter(|c| !st.channels.contains_key(*c))
                .cloned()
                .collect();
            (to_sub, to_unsub)
        };
        if newly_confirmed {
            self.confirmed.notify_waiters();
        }
        (to_sub, to_unsub)
    }

    fn dispatch(&self, msg: &::redis::Msg) {
        {
            let st = self.lock();
            if let Some(ch) = st.channels.get(msg.get_channel_name())
                && ch.group
            {
                for (_, mailbox) in &ch.observers {
                    mailbox.poke();
                }
                return;
            }
        }
        let Some(note) = parse_notification(msg.get_payload_bytes()) else {
            tracing::debug!(
                channel = msg.get_channel_name(),
                "ignoring a malformed tenure notification"
            );
            return;
        };
        let st = self.lock();
        if let Some(ch) = st.channels.get(msg.get_channel_name()) {
            for (_, mailbox) in &ch.observers {
                mailbox.push(Note::Change(note.clone()));
            }
        }
    }

    fn connected(&self) {
        let mut st = self.lock();
        st.epoch += 1;
        st.connected = true;
    }

    fn connection_lost(&self) {
        let mut st = self.lock();
        if !st.connected {
            return;
        }
        st.connected = false;
        let epoch = st.epoch;
        for ch in st.channels.values_mut() {
            ch.confirmed = false;
            for (_, mailbox) in &ch.observers {
                mailbox.push(Note::Lost(epoch));
            }
        }
    }
}

/// The connection task: connect, serve, and reconnect until the backend is dropped.
async fn run(hub: Arc<Hub>) {
    let mut backoff = RECONNECT_MIN;
    loop {
        let connect = tokio::time::timeout(hub.connect_timeout, hub.connector.pubsub());
        let conn = tokio::select! {
            () = hub.shutdown.cancelled() => return,
            conn = connect => conn,
        };
        match conn {
            Ok(Ok(pubsub)) => {
                backoff = RECONNECT_MIN;
                hub.connected();
                tracing::debug!("redis notification connection up");
                serve(&hub, pubsub).await;
                hub.connection_lost();
                if hub.shutdown.is_cancelled() {
                    return;
                }
                tracing::debug!("redis notification connection lost; reconnecting");
            }
            Ok(Err(e)) => {
                let e = from_redis(
                    &e,
                    "subscribe connection",
                    &super::error::Scrubber::default(),
                );
                tracing::debug!(error = %e, "redis notification connection failed");
            }
            Err(_) => tracing::debug!("redis notification connection timed out"),
        }
        tokio::select! {
            () = hub.shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RECONNECT_MAX);
    }
}

enum Op {
    Subscribe(Vec<String>),
    Unsubscribe(Vec<String>),
}

type OpResult = (Op, Result<(), ()>);

/// Serves one connection until it drops or the backend is dropped.
async fn serve(hub: &Hub, pubsub: ::redis::aio::PubSub) {
    let (sink, mut messages) = pubsub.split();
    let mut on_server: HashSet<String> = HashSet::new();
    let mut ops: FuturesUnordered<BoxFuture<'static, OpResult>> = FuturesUnordered::new();
    let timeout = hub.request_timeout;
    loop {
        let wake = hub.wake.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        if ops.is_empty() {
            let (to_sub, to_unsub) = hub.diff(&on_server);
            if !to_sub.is_empty() {
                let mut sink = sink.clone();
                ops.push(Box::pin(async move {
                    let r = tokio::time::timeout(timeout, sink.subscribe(&to_sub)).await;
                    (Op::Subscribe(to_sub), ok(r))
                }));
            } else if !to_unsub.is_empty() {
                let mut sink = sink.clone();
                ops.push(Box::pin(async move {
                    let r = tokio::time::timeout(timeout, sink.unsubscribe(&to_unsub)).await;
                    (Op::Unsubscribe(to_unsub), ok(r))
                }));
            }
        }
        tokio::select! {
            () = hub.shutdown.cancelled() => return,
            msg = messages.next() => match msg {
                Some(msg) => hub.dispatch(&msg),
                None => return,
            },
            () = &mut wake => {}
            Some((op, result)) = ops.next(), if !ops.is_empty() => {
                if result.is_err() {
                    // The connection is in an unknown state: start over on a new one.
                    return;
                }
                match op {
                    Op::Subscribe(chs) => on_server.extend(chs),
                    Op::Unsubscribe(chs) => {
                        for c in &chs {
                            on_server.remove(c);
                        }
                    }
                }
            }
        }
    }
}

fn ok<E>(r: Result<::redis::RedisResult<()>, E>) -> Result<(), ()> {
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::debug!(kind = ?e.kind(), "redis subscribe failed");
            Err(())
        }
        Err(_) => Err(()),
    }
}

/// An observer's place in the hub; leaving it unregisters.
struct Registration {
    hub: Arc<Hub>,
    channel: String,
    id: u64,
    mailbox: Arc<Mailbox>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.hub.unregister(&self.channel, self.id);
    }
}

/// The state behind one observer's stream.
struct Observer {
    reg: Registration,
    engine: Arc<Engine>,
    name: String,
    /// The version of the last state reported; `None` until the first read after a
    /// (re)subscription.
    synced: Option<Version>,
    /// The connection epoch of the last sync; older `Lost` notes are stale.
    epoch: u64,
    /// The last notification reported came from a lock not marked watched.
    unmarked: bool,
    /// After a failed sync, when to try again (and the pause used), so that a dead server does
    /// not turn the stream into a busy loop.
    backoff: Option<(Instant, Duration)>,
}

impl Observer {
    async fn next(&mut self) -> Result<HolderChange, BackendError> {
        loop {
            let Some(last) = self.synced else {
                return self.sync().await;
            };
            if std::mem::take(&mut self.unmarked) {
                // The last notification said the lock is not marked watched, so its next grant
                // would go unannounced: mark it. The same atomic read reports a grant that came
                // before the mark; if it fails, a full sync (which marks too) follows.
                match self.read(true).await {
                    Ok(snapshot) if snapshot.version > last => {
                        self.synced = Some(snapshot.version);
                        return Ok(snapshot.change());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(lock = %self.name, error = %e, "marking a lock watched failed");
                        self.synced = None;
                        continue;
                    }
                }
            }
            match self.reg.mailbox.next().await {
                Note::Change(n) if n.version > last => {
                    self.synced = Some(n.version);
                    self.unmarked = n.unwatched;
                    return Ok(n.change);
                }
                Note::Change(..) => {}
                Note::Lost(epoch) if epoch >= self.epoch => {
                    self.synced = None;
                    return Err(BackendError::new(
                        BackendErrorKind::Unavailable,
                        "redis notification connection dropped; notifications may have been missed",
                    ));
                }
                Note::Lost(_) => {}
                Note::Resync => self.synced = None,
                // Only a group's channel is poked.
                Note::Poke => {}
            }
        }
    }

    /// Reads the lock's state, bounded by the request timeout; with `watch`, marks it watched.
    async fn read(&self, watch: bool) -> Result<Snapshot, BackendError> {
        let t = self.reg.hub.request_timeout;
        tokio::time::timeout(t, self.engine.inspect(&self.name, watch))
            .await
            .map_err(|_| BackendError::timeout("redis inspect", t))?
    }

    /// Subscribes (if not yet) and reads the current state: the stream's first item.
    async fn sync(&mut self) -> Result<HolderChange, BackendError> {
        if let Some((at, _)) = self.backoff {
            tokio::time::sleep_until(at).await;
        }
        let result = async {
            let epoch = self.reg.hub.wait_confirmed(&self.reg.channel).await?;
            // Marks the lock watched too, so that grants are published from now on.
            let snapshot = self.read(true).await?;
            Ok::<_, BackendError>((epoch, snapshot))
        }
        .await;
        match result {
            Ok((epoch, snapshot)) => {
                self.backoff = None;
                self.epoch = epoch;
                self.synced = Some(snapshot.version);
                Ok(snapshot.change())
            }
            Err(e) => {
                let pause = self.backoff.map_or(Duration::from_millis(100), |(_, p)| {
                    (p * 2).min(Duration::from_secs(1))
                });
                self.backoff = Some((Instant::now() + pause, pause));
                Err(e)
            }
        }
    }
}

/// What a group's subscription tells its members stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GroupNote {
    /// The group may have changed (a notification, or too many to keep): read it again.
    Changed,
    /// The subscriber connection of this epoch dropped: notifications may have been missed.
    Lost(u64),
}

/// A members stream's place on the hub: its group's channel on the shared subscriber
/// connection; dropping it unsubscribes (when it was the channel's last).
pub(super) struct GroupSubscription {
    reg: Registration,
}

impl GroupSubscription {
    /// The next thing that happened on the group's channel.
    pub(super) async fn next(&self) -> GroupNote {
        match self.reg.mailbox.next().await {
            Note::Lost(epoch) => GroupNote::Lost(epoch),
            Note::Change(_) | Note::Poke | Note::Resync => GroupNote::Changed,
        }
    }

    /// Waits until the channel is subscribed; returns the connection's epoch.
    pub(super) async fn confirmed(&self) -> Result<u64, BackendError> {
        self.reg.hub.wait_confirmed(&self.reg.channel).await
    }

    /// The bound on each request of the backend.
    pub(super) fn request_timeout(&self) -> Duration {
        self.reg.hub.request_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_parse() {
        let n = parse_notification(b"g:12:host:9").expect("grant");
        assert_eq!(n.version, Version(12, 0));
        assert_eq!(n.change.holder.as_deref(), Some("host:9"));
        assert_eq!(n.change.fencing, Some(FencingToken::new(12)));
        assert!(!n.unwatched);
        let n = parse_notification(b"G:13:host:9").expect("unwatched grant");
        assert_eq!(n.version, Version(13, 0));
        assert!(n.unwatched);
        let n = parse_notification(b"r:12").expect("release");
        assert_eq!(n.version, Version(12, 1));
        assert!(n.change.is_free());
        assert!(!n.unwatched);
        assert!(parse_notification(b"R:12").is_none());
        assert!(parse_notification(b"x").is_none());
        assert!(parse_notification(b"x:1").is_none());
        assert!(parse_notification(b"g:zz:a").is_none());
    }
}
