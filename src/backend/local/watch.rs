//! One watcher thread per backend instance, turning changes of the state directory into holder
//! changes for every local observer.
//!
//! The thread waits on an inotify watch of the directory. Every change of a record is a
//! `rename` into the directory (or a deletion), so an `IN_MOVED_TO`/`IN_DELETE` naming
//! `N.lease` means "read `N` again": the thread reads the record (no file lock needed, records
//! are replaced atomically) and publishes the result to `N`'s watch channel when it differs from
//! what was published last — renewals change nothing an observer sees, so they wake nobody.
//!
//! Events can be lost (the kernel queue overflows) and the directory can disappear (a wipe);
//! then the thread re-reads every observed lock. While it has no watch (inotify unavailable,
//! the directory gone) it falls back to re-reading every [`FALLBACK_POLL`].
//!
//! Observed membership groups (`members.rs`) get a watch of their directory on the same
//! inotify instance, added by their readers ([`Hub::watch_group`]) before each read; the thread
//! bumps the group's channel on every event there that names a member file (or the directory
//! going away, after which the next read watches it again). A reader without a watch re-reads
//! every [`FALLBACK_POLL`] by itself.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use super::store::Store;
use super::sys;
use crate::backend::{BackendError, BackendErrorKind, HolderChange};

/// How often the thread re-reads observed locks while it has no inotify watch (and a members
/// stream its group, while the group has none).
pub(super) const FALLBACK_POLL: Duration = Duration::from_millis(100);

/// The directory events that can change what an observer sees.
const MASK: u32 = libc::IN_MOVED_TO
    | libc::IN_MOVED_FROM
    | libc::IN_DELETE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;

/// The observed locks: one watch channel per name, created by the first observer.
#[derive(Debug, Default)]
pub(super) struct Hub {
    observed: Mutex<HashMap<String, watch::Sender<HolderChange>>>,
    /// Held from reading a record to publishing what was read, so that publications happen in
    /// the order of the reads: the watcher thread and a new observer's first read both
    /// publish, and an older read published after a newer one would leave observers on a
    /// stale state (a release nobody is woken for).
    reading: Mutex<()>,
    /// The observed membership groups.
    groups: Mutex<HashMap<String, GroupWatch>>,
    /// The thread's inotify instance, shared so that readers can watch their group directory
    /// themselves before reading it.
    inotify: Option<Arc<File>>,
}

/// One observed group: a counter bumped on every change of its directory, and its watch.
#[derive(Debug)]
struct GroupWatch {
    changed: watch::Sender<u64>,
    wd: Option<i32>,
}

impl Hub {
    fn locked(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<HolderChange>>> {
        // Nothing below panics while holding the lock; recover the map if something did.
        self.observed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A receiver of `name`'s changes, and its channel.
    pub(super) fn subscribe(
        &self,
        name: &str,
    ) -> (watch::Sender<HolderChange>, watch::Receiver<HolderChange>) {
        let mut observed = self.locked();
        observed.retain(|_, tx| tx.receiver_count() > 0);
        let tx = observed
            .entry(name.to_owned())
            .or_insert_with(|| watch::channel(HolderChange::free()).0)
            .clone();
        let rx = tx.subscribe();
        (tx, rx)
    }

    fn groups(&self) -> MutexGuard<'_, HashMap<String, GroupWatch>> {
        // As `locked`: nothing panics while this lock is held.
        self.groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A receiver that changes whenever `group`'s directory may have changed (watched once
    /// [`watch_group`](Self::watch_group) succeeded).
    pub(super) fn subscribe_group(&self, group: &str) -> watch::Receiver<u64> {
        let mut groups = self.groups();
        groups.retain(|_, g| {
            let observed = g.changed.receiver_count() > 0;
            if !observed && let (Some(fd), Some(wd)) = (&self.inotify, g.wd) {
                sys::inotify_rm_watch(fd, wd);
            }
            observed
        });
        groups
            .entry(group.to_owned())
            .or_insert_with(|| GroupWatch {
                changed: watch::channel(0).0,
                wd: None,
            })
            .changed
            .subscribe()
    }

    /// Makes sure `group`'s directory `dir` is watched; whether it is. Called before each read
    /// of the group, so a change after the read wakes its readers. Blocking (a system call).
    pub(super) fn watch_group(&self, group: &str, dir: &Path) -> bool {
        let mut groups = self.groups();
        let Some(g) = groups.get_mut(group) else {
            return false;
        };
        if g.wd.is_some() {
            return true;
        }
        let Some(fd) = &self.inotify else {
            return false;
        };
        g.wd = sys::inotify_add_watch(fd, dir, MASK).ok();
        g.wd.is_some()
    }

    /// Handles an event of watch `wd` if it is a group's: wakes the group's readers when it
    /// names a member file or the directory went away. Whether `wd` was a group's.
    fn group_event(&self, wd: i32, mask: u32, name: &[u8]) -> bool {
        let mut groups = self.groups();
        let Some(g) = groups.values_mut().find(|g| g.wd == Some(wd)) else {
            return false;
        };
        let gone = mask & (libc::IN_IGNORED | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0;
        if gone {
            if mask & libc::IN_IGNORED == 0
                && let Some(fd) = &self.inotify
            {
                sys::inotify_rm_watch(fd, wd);
            }
            g.wd = None;
        }
        if gone || (name.ends_with(b".member") && !name.starts_with(b".")) {
            g.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
        true
    }

    /// Wakes the readers of every group (events were lost).
    fn poke_groups(&self) {
        for g in self.groups().values() {
            g.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn names(&self) -> Vec<String> {
        self.locked().keys().cloned().collect()
    }

    /// Reads `name`'s record and publishes its state to `tx` if it changed, serialised with
    /// every other read-and-publish of this hub. Blocking (file I/O).
    pub(super) fn read_and_publish(
        &self,
        store: &Store,
        name: &str,
        tx: &watch::Sender<HolderChange>,
    ) -> Result<(), BackendError> {
        let _serial = self
            .reading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        publish(tx, store.holder_change(name)?);
        Ok(())
    }

    /// Reads `name` and publishes its state if it changed.
    fn refresh(&self, store: &Store, name: &str) {
        let Some(tx) = self.locked().get(name).cloned() else {
            return;
        };
        // An unreadable record is reported by the operations themselves; observers keep the
        // last known state (and waiters their timed fallback).
        let _ = self.read_and_publish(store, name, &tx);
    }

    fn refresh_all(&self, store: &Store) {
        self.locked().retain(|_, tx| tx.receiver_count() > 0);
        for name in self.names() {
            self.refresh(store, &name);
        }
    }
}

/// Sends `change` unless it is what the channel already holds.
fn publish(tx: &watch::Sender<HolderChange>, change: HolderChange) {
    tx.send_if_modified(|cur| {
        if *cur == change {
            false
        } else {
            *cur = change;
            true
        }
    });
}

/// The running watcher thread; dropping it stops the thread.
#[derive(Debug)]
pub(super) struct Watcher {
    hub: Arc<Hub>,
    stop: File,
}

impl Watcher {
    /// Starts the thread. The inotify watch is in place when this returns (if inotify is
    /// available and the directory exists), so a change after this call is never missed.
    pub(super) fn start(store: Arc<Store>) -> Result<Self, BackendError> {
        let failed = |what: &str, e: io::Error| {
            BackendError::new(
                BackendErrorKind::Unavailable,
                format!("cannot start the local backend's watcher ({what}): {e}"),
            )
        };
        let stop = sys::eventfd().map_err(|e| failed("eventfd", e))?;
        let stop_reader = stop.try_clone().map_err(|e| failed("eventfd", e))?;
        let inotify = match sys::inotify_init() {
            Ok(fd) => Some(Arc::new(fd)),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "inotify unavailable; the local backend polls for releases every {FALLBACK_POLL:?}"
                );
                None
            }
        };
        let _ = store.ensure_dir();
        let wd = inotify
            .as_ref()
            .and_then(|fd| sys::inotify_add_watch(fd, store.dir(), MASK).ok());
        let hub = Arc::new(Hub {
            inotify: inotify.clone(),
            ..Hub::default()
        });
        let thread = Thread {
            hub: hub.clone(),
            store,
            inotify,
            wd,
            stop: stop_reader,
        };
        std::thread::Builder::new()
            .name("tenure-local-watch".into())
            .spawn(move || thread.run())
            .map_err(|e| failed("thread", e))?;
        Ok(Self { hub, stop })
    }

    pub(super) fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // Wakes the thread, which sees the stop signal and exits.
        let _ = (&self.stop).write_all(&1u64.to_ne_bytes());
    }
}

struct Thread {
    hub: Arc<Hub>,
    store: Arc<Store>,
    inotify: Option<Arc<File>>,
    wd: Option<i32>,
    stop: File,
}

impl Thread {
    fn run(mut self) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if self.wd.is_none()
                && let Some(fd) = &self.inotify
                && let Ok(wd) = sys::inotify_add_watch(fd, self.store.dir(), MASK)
            {
                // Changes while there was no watch went unseen.
                self.wd = Some(wd);
                self.hub.refresh_all(&self.store);
            }
            let timeout = if self.wd.is_some() {
                -1
            } else {
                i32::try_from(FALLBACK_POLL.as_millis()).unwrap_or(100)
            };
            let ready = match sys::poll2(self.inotify.as_deref(), &self.stop, timeout) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "local backend watcher: poll failed");
                    std::thread::sleep(FALLBACK_POLL);
                    sys::Ready::default()
                }
            };
            if ready.second {
                return;
            }
            if !ready.first {
                self.hub.refresh_all(&self.store);
                continue;
            }
            self.drain(&mut buf);
        }
    }

    /// Reads every queued event and refreshes what they touched.
    fn drain(&mut self, buf: &mut [u8]) {
        let Some(inotify) = &self.inotify else {
            return;
        };
        let mut names = Vec::new();
        let mut everything = false;
        loop {
            let n = match (&**inotify).read(buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!(error = %e, "local backend watcher: reading inotify failed");
                    everything = true;
                    break;
                }
            };
            for event in Events(&buf[..n]) {
                if event.mask & libc::IN_Q_OVERFLOW != 0 {
                    everything = true;
                } else if self.wd != Some(event.wd)
                    && self.hub.group_event(event.wd, event.mask, event.name)
                {
                    // A membership group's directory.
                } else if event.mask
                    & (libc::IN_IGNORED | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF)
                    != 0
                {
                    // The directory went away (or moved): watch it again once it is back. An
                    // IN_IGNORED of a watch removed earlier must not drop its successor.
                    if self.wd == Some(event.wd) {
                        if let Some(wd) = self.wd.take() {
                            sys::inotify_rm_watch(inotify, wd);
                        }
                        everything = true;
                    }
                } else if let Some(name) = std::str::from_utf8(event.name)
                    .ok()
                    .and_then(|f| f.strip_suffix(".lease"))
                    .filter(|n| !n.starts_with('.'))
                    && !names.iter().any(|n: &String| n == name)
                {
                    names.push(name.to_owned());
                }
            }
        }
        if everything {
            self.hub.refresh_all(&self.store);
            self.hub.poke_groups();
        } else {
            for name in &names {
                self.hub.refresh(&self.store, name);
            }
        }
    }
}

/// One inotify event.
struct Event<'a> {
    /// The watch descriptor the event belongs to (-1 for a queue overflow).
    wd: i32,
    mask: u32,
    name: &'a [u8],
}

/// The events in a buffer filled by `read` on an inotify descriptor: each a `struct
/// inotify_event` header (wd, mask, cookie, len: four 32-bit integers) and `len` bytes of
/// NUL-padded name.
struct Events<'a>(&'a [u8]);

impl<'a> Iterator for Events<'a> {
    type Item = Event<'a>;

    fn next(&mut self) -> Option<Event<'a>> {
        const HEADER: usize = 16;
        let header = self.0.get(..HEADER)?;
        let word = |i: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&header[i * 4..i * 4 + 4]);
            u32::from_ne_bytes(b)
        };
        let wd = i32::from_ne_bytes(word(0).to_ne_bytes());
        let mask = word(1);
        let len = usize::try_from(word(3)).ok()?;
        let name = self.0.get(HEADER..HEADER + len)?;
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        self.0 = &self.0[HEADER + len..];
        Some(Event {
            wd,
            mask,
            name: &name[..end],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_should_parse_headers_and_padded_names() {
        let mut buf = Vec::new();
        for (mask, name) in [
            (libc::IN_MOVED_TO, &b"job.lease\0\0\0\0\0\0\0"[..]),
            (libc::IN_Q_OVERFLOW, b""),
        ] {
            for w in [1u32, mask, 0, u32::try_from(name.len()).unwrap_or(0)] {
                buf.extend_from_slice(&w.to_ne_bytes());
            }
            buf.extend_from_slice(name);
        }
        let events: Vec<_> = Events(&buf)
            .map(|e| (e.wd, e.mask, e.name.to_vec()))
            .collect();
        assert_eq!(
            events,
            vec![
                (1, libc::IN_MOVED_TO, b"job.lease".to_vec()),
                (1, libc::IN_Q_OVERFLOW, Vec::new())
            ]
        );
        // A torn buffer ends the iteration instead of reading past it.
        assert_eq!(Events(&buf[..20]).count(), 0);
    }
}
