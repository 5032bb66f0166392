//! The local backend: lease state in files under a directory, for processes on one host.
//!
//! Processes (and threads, and [`Locker`](crate::Locker)s) on **one machine** coordinate
//! through a state directory: one record per lock name, changed atomically under a file lock.
//! It is what `tenure run` uses when no backend is configured, and what to reach for when the
//! replicas that must not overlap all run on the same host (cron jobs, systemd units, a
//! developer's terminals). It has the semantics of the other backends — ttl expiry, holder-token
//! ownership, a fencing token that only rises, replayed acquires and releases, release
//! notifications — and passes the same conformance suite. Linux only.
//!
//! ```
//! use std::time::Duration;
//! use tenure::backend::local::LocalBackend;
//! use tenure::{LockOptions, Locker};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = std::env::temp_dir().join(format!("tenure-doc-mod-{}", std::process::id()));
//! let backend = LocalBackend::open(&dir)?; // e.g. tenure::backend::local::default_state_dir()
//! let locker = Locker::new(backend);
//! let opts = LockOptions::new().ttl(Duration::from_secs(15)).wait(Duration::from_secs(5));
//! let token = locker
//!     .with_lock("nightly-report", &opts, |guard| async move { guard.fencing_token() })
//!     .await?;
//! println!("ran under fencing token {token}");
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//!
//! - **Atomic changes.** Every acquire, renew and release of a lock `N` is one critical section
//!   under an exclusive `flock` of `N.lock`; the record `N.lease` is replaced as a whole by
//!   writing a temporary file and renaming it over the old one. A process killed at any point
//!   (`kill -9` mid-write included) leaves either the old or the new record, and the kernel
//!   drops its file lock. A record that cannot be parsed is reported as a
//!   [`BackendError`] of kind [`Protocol`](crate::backend::BackendErrorKind::Protocol) naming
//!   the file — never a panic, never a silent reset.
//! - **One clock for the host.** Expiry is measured on `CLOCK_MONOTONIC`, read inside the
//!   critical section, so a ttl starts when the store *processed* the request (never earlier
//!   than the client sent it). It is the clock that std's and tokio's `Instant` read on Linux,
//!   so the store and every holder measure validity on the *same* clock: wall-clock jumps
//!   change nothing, and a suspend pauses the store and the holders alike. (`CLOCK_BOOTTIME`
//!   would keep counting during a suspend, so after a resume the store would free a lease
//!   that its holder, measuring on `CLOCK_MONOTONIC`, still believes valid: two holders.)
//!   Each record carries the kernel's boot id (`/proc/sys/kernel/random/boot_id`); a record
//!   written in an earlier boot counts as expired.
//! - **Fencing.** Each lock has a persisted counter that never goes down. A grant increments
//!   it and is made durable (`fdatasync`, `rename`, `fsync` of the directory) before the token
//!   is returned. When the record is missing — a new lock, or a wiped directory — the counter
//!   is seeded from the wall clock in microseconds, as the Redis backend seeds from `TIME`, so
//!   tokens keep rising after a wipe; a record from an earlier boot is also raised to the wall
//!   clock. A replayed acquire by the current holder token returns the original token; a
//!   replayed release reports [`Released::Released`] (the last 8 releasing holder tokens are
//!   kept in the record).
//! - **Notifications.** One watcher thread per backend instance (started by the first
//!   [`observe`](Backend::observe)) waits on an inotify watch of the directory and wakes the
//!   observers of a lock when its record changes holder, so a waiter retries within
//!   milliseconds of a release, also when the holder is another process. Renewals wake nobody.
//!   Without inotify, or while the directory is missing, it re-reads observed locks every
//!   100 ms.
//!
//! # Caveats
//!
//! - **No mutual exclusion across hosts.** Two machines never see each other's leases, even
//!   through a shared directory: do not put the state directory on NFS or another network
//!   filesystem (its `flock`, `rename` and inotify semantics differ, and the records' clocks
//!   are per host). Use the Redis or Kubernetes backend for replicas on several machines.
//! - **One time namespace.** Processes in different Linux time namespaces (whose
//!   `CLOCK_MONOTONIC` is offset) must not share a directory.
//! - **After a reboot** every lease has expired (the boot id changed). Counters survive where
//!   the directory does: the default under `$XDG_RUNTIME_DIR` is a tmpfs, emptied at reboot and
//!   at the user's last logout, after which tokens restart from the wall clock — still above
//!   every earlier token as long as the wall clock did not go back.
//! - **A wiped directory** frees every lock at once (as a Redis `FLUSHALL` would) and is
//!   recreated by the next operation; tokens keep rising.
//! - **A stopped process** (SIGSTOP) in the middle of an update holds that lock's file lock;
//!   other operations on the lock wait up to 5 s and then fail with a timeout. Updates last
//!   microseconds, so this takes a very unlucky stop.
//! - **File operations run on tokio's blocking pool** (`spawn_blocking`): a disk-backed
//!   directory makes every change cost a `rename` (and every grant two syncs, milliseconds on a
//!   disk); a tmpfs directory makes them cost microseconds.
//! - **The directory must belong to you.** [`LocalBackend::open`] refuses a directory owned by
//!   another user or writable by everyone, and a symbolic link to it owned by another user
//!   (who could re-point it): anybody who can write to it can forge or delete leases. Every
//!   change checks this again, so a directory that was removed and recreated by someone else
//!   is refused too. Files are opened with `O_NOFOLLOW` and `O_NONBLOCK`, and anything but a
//!   regular file where a record or a lock file should be (a FIFO, which would block a
//!   reader forever; a device; a directory) is refused with a
//!   [`Protocol`](crate::backend::BackendErrorKind::Protocol) error naming it; a stale
//!   temporary file is removed and created anew with `O_EXCL`. A directory writable by its
//!   *group* is accepted (a user-private group under umask 002 is common); keep other users
//!   out of that group.
//! - **Records are at most 64 KiB**, and none larger is ever written: a grant whose identity
//!   would not fit fails with a [`Config`](crate::backend::BackendErrorKind::Config) error
//!   and changes nothing. A [`Locker`](crate::Locker) never asks for one: it accepts
//!   identities of at most [`MAX_IDENTITY_LEN`](crate::lock::MAX_IDENTITY_LEN) bytes.
//! - **A power loss** can leave a renewal or a release unwritten, which does not matter (the
//!   boot id changes); on filesystems that do not order a rename after its data (ext4, XFS and
//!   btrfs all do), it could also leave an empty record, which is then reported as corrupt.
//!
//! # Layout
//!
//! For a lock `N` the directory holds `N.lock` (the file lock, never removed), `N.lease` (the
//! record: a few `key value` lines, readable with `cat`), `N.done` (a run-once job's
//! completion record, one line; deleting it lets the job run again), `N.ended` (who released
//! the lock last and when, `e1:<token>:<unix ms>:<identity>`, for `tenure status`) and,
//! briefly, `.N.tmp`, `.N.done~` or `.N.ended~`. Names are
//! restricted to `[A-Za-z0-9._-]`, without a leading dot, at most [`MAX_NAME_LEN`] bytes, so
//! they are safe file names.

#[cfg(not(target_os = "linux"))]
compile_error!("the `local` backend needs Linux (flock, inotify, CLOCK_MONOTONIC, boot_id)");

mod group;
mod members;
mod record;
mod store;
mod sys;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;

use super::{
    AcquireRequest, Acquired, Backend, BackendError, BackendErrorKind, Completion, CompletionCheck,
    FencingToken, GroupRead, GroupRecord, GroupVersion, Handoff, HolderChange, HolderToken,
    InvalidName, LeaseRecord, Member, Released, Renewed,
};
use store::Store;
use watch::{Hub, Watcher};

/// The longest lock name accepted, in bytes: the record and temporary file names
/// (`.NAME.tmp`, `NAME.lease`) stay well below the usual 255-byte file name limit.
///
/// # Example
///
/// ```
/// use tenure::Backend;
/// use tenure::backend::local::{LocalBackend, MAX_NAME_LEN};
///
/// # let dir = std::env::temp_dir().join(format!("tenure-doc-max-{}", std::process::id()));
/// let backend = LocalBackend::open(&dir)?;
/// assert!(backend.validate_name(&"a".repeat(MAX_NAME_LEN)).is_ok());
/// assert!(backend.validate_name(&"a".repeat(MAX_NAME_LEN + 1)).is_err());
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const MAX_NAME_LEN: usize = 200;

/// The state directory `tenure run` uses when none is configured.
///
/// In order:
/// 1. `$TENURE_STATE_DIR`, when set and not empty;
/// 2. `$XDG_RUNTIME_DIR/tenure`, when `$XDG_RUNTIME_DIR` is set to an absolute path (relative
///    values are ignored, as the XDG base directory specification requires);
/// 3. `/tmp/tenure-<uid>`, with this process's real user id.
///
/// `$XDG_RUNTIME_DIR` (`/run/user/<uid>` under systemd) is the recommended place: private to
/// the user, on a tmpfs (fast: no disk syncs), and emptied at reboot, when every lease has
/// expired anyway; tokens then restart from the wall clock and keep rising. The `/tmp`
/// fallback is per user, and [`LocalBackend::open`] refuses it if another user created it
/// first. Set `$TENURE_STATE_DIR` to a directory on a local disk to keep the fencing counters
/// themselves across reboots.
///
/// # Example
///
/// ```
/// let dir = tenure::backend::local::default_state_dir();
/// assert!(dir.is_absolute() || std::env::var_os("TENURE_STATE_DIR").is_some());
/// ```
#[must_use]
pub fn default_state_dir() -> PathBuf {
    let var = |key: &str| std::env::var_os(key).filter(|v| !v.is_empty());
    if let Some(dir) = var("TENURE_STATE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(run) = var("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        return run.join("tenure");
    }
    PathBuf::from(format!("/tmp/tenure-{}", sys::real_uid()))
}

/// A lease store in a local directory, shared by every process on this host that opens it.
///
/// Clones share one watcher thread (started by the first [`observe`](Backend::observe));
/// separate [`open`](Self::open)s of the same directory coordinate through the files, exactly
/// as separate processes do. See the [module documentation](self) for the guarantees and
/// caveats.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tenure::backend::local::LocalBackend;
/// use tenure::{LockOptions, Locker};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("tenure-doc-struct-{}", std::process::id()));
/// // Two lockers on separate opens of one directory, as two processes would be.
/// let a = Locker::new(LocalBackend::open(&dir)?);
/// let b = Locker::new(LocalBackend::open(&dir)?);
/// let opts = LockOptions::new().ttl(Duration::from_secs(10));
/// let lease = a.try_acquire("migrate", &opts).await?;
/// assert!(b.try_acquire("migrate", &opts).await.is_err());
/// let first = lease.fencing_token();
/// lease.release().await?;
/// let next = b.try_acquire("migrate", &opts).await?;
/// assert!(next.fencing_token() > first);
/// next.release().await?;
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LocalBackend {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<Store>,
    /// Started by the first `observe`; dropped (and the thread stopped) with the last clone.
    watcher: Mutex<Option<Watcher>>,
}

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBackend")
            .field("dir", &self.inner.store.dir())
            .finish_non_exhaustive()
    }
}

impl LocalBackend {
    /// Opens the state directory `dir`, creating it (and its parents) with mode 0700 if it is
    /// missing. A relative path is made absolute against the current directory now.
    ///
    /// # Errors
    ///
    /// A [`BackendError`] naming the path and the OS error when the directory cannot be
    /// created or read, when it is not a directory, when it belongs to another user or is
    /// writable by everyone ([`PermissionDenied`](BackendErrorKind::PermissionDenied)), or when
    /// the boot id cannot be read.
    ///
    /// # Example
    ///
    /// ```
    /// use tenure::backend::local::LocalBackend;
    ///
    /// # let dir = std::env::temp_dir().join(format!("tenure-doc-open-{}", std::process::id()));
    /// let backend = LocalBackend::open(dir.join("nested"))?;
    /// assert!(backend.dir().is_dir());
    /// // A file is not a state directory; the error names it.
    /// std::fs::write(dir.join("file"), b"")?;
    /// let err = LocalBackend::open(dir.join("file")).unwrap_err();
    /// assert!(err.to_string().contains("file"));
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, BackendError> {
        let dir = dir.as_ref();
        let dir = std::path::absolute(dir).map_err(|e| {
            BackendError::new(
                BackendErrorKind::Config,
                format!("invalid state directory {:?}: {e}", dir.display()),
            )
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                store: Arc::new(Store::open(dir)?),
                watcher: Mutex::new(None),
            }),
        })
    }

    /// The state directory (absolute).
    ///
    /// # Example
    ///
    /// ```
    /// use tenure::backend::local::LocalBackend;
    ///
    /// # let dir = std::env::temp_dir().join(format!("tenure-doc-dir-{}", std::process::id()));
    /// let backend = LocalBackend::open(&dir)?;
    /// assert_eq!(backend.dir(), dir);
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.inner.store.dir()
    }

    /// The file that holds lock `name`'s record (`<dir>/<name>.lease`), for operators: it is
    /// plain text, and moving it aside resets the lock (the next grant seeds the fencing
    /// counter from the clock). `name` should be valid
    /// ([`validate_name`](Backend::validate_name)).
    ///
    /// # Example
    ///
    /// ```
    /// use tenure::backend::local::LocalBackend;
    ///
    /// # let dir = std::env::temp_dir().join(format!("tenure-doc-record-{}", std::process::id()));
    /// let backend = LocalBackend::open(&dir)?;
    /// assert_eq!(backend.record_path("nightly"), dir.join("nightly.lease"));
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn record_path(&self, name: &str) -> PathBuf {
        self.inner.store.record_path(name)
    }

    /// Runs `op` on tokio's blocking pool. If this future is dropped before `op` took the
    /// lock's file lock, `op` gives up; once inside, it completes.
    async fn blocking<T, F>(&self, op: F) -> Result<T, BackendError>
    where
        T: Send + 'static,
        F: FnOnce(&Store, &AtomicBool) -> Result<T, BackendError> + Send + 'static,
    {
        struct Abandon(Arc<AtomicBool>);
        impl Drop for Abandon {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let abandoned = Arc::new(AtomicBool::new(false));
        let _abandon = Abandon(abandoned.clone());
        let store = self.inner.store.clone();
        tokio::task::spawn_blocking(move || op(&store, &abandoned))
            .await
            .unwrap_or_else(|e| {
                Err(BackendError::new(
                    BackendErrorKind::Unavailable,
                    format!("a local backend file operation did not complete: {e}"),
                ))
            })
    }

    /// The watcher's hub, starting the watcher if this is the first observer.
    fn hub(&self) -> Result<Arc<Hub>, BackendError> {
        let mut slot = self
            .inner
            .watcher
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = &*slot {
            return Ok(w.hub().clone());
        }
        let started = Watcher::start(self.inner.store.clone())?;
        let hub = started.hub().clone();
        *slot = Some(started);
        Ok(hub)
    }
}

/// A name the local backend refuses, as a request's error.
fn name_error(e: InvalidName) -> BackendError {
    BackendError::new(BackendErrorKind::Config, e.to_string())
}

/// The local backend's naming rules, on top of the common ones: names become file names.
fn validate(name: &str) -> Result<(), InvalidName> {
    super::check_common_name_rules(name, MAX_NAME_LEN)?;
    if name.starts_with('.') {
        return Err(InvalidName::new(
            name,
            "must not start with '.' (lock names become file names)",
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(InvalidName::new(
            name,
            format!(
                "may contain only ASCII letters, digits, '.', '_' and '-' (lock names become \
                 file names), found {c:?}"
            ),
        ));
    }
    Ok(())
}

impl Backend for LocalBackend {
    fn validate_name(&self, name: &str) -> Result<(), InvalidName> {
        validate(name)
    }

    fn try_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquired, BackendError>> {
        let req = req.clone();
        Box::pin(self.blocking(move |store, abandoned| store.try_acquire(&req, abandoned)))
    }

    fn renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Renewed, BackendError>> {
        let (name, holder) = (name.to_owned(), *holder);
        Box::pin(self.blocking(move |store, abandoned| store.renew(&name, &holder, ttl, abandoned)))
    }

    fn release<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        let (name, holder) = (name.to_owned(), *holder);
        Box::pin(
            self.blocking(move |store, abandoned| {
                store.release(&name, &holder, None, None, abandoned)
            }),
        )
    }

    fn release_as<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        let (name, holder, identity) = (name.to_owned(), *holder, identity.to_owned());
        Box::pin(self.blocking(move |store, abandoned| {
            store.release(&name, &holder, Some(&identity), None, abandoned)
        }))
    }

    fn release_to<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        to: &'a str,
        window: Duration,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        let (name, holder, to) = (name.to_owned(), *holder, to.to_owned());
        Box::pin(self.blocking(move |store, abandoned| {
            store.release(&name, &holder, None, Some((&to, window)), abandoned)
        }))
    }

    fn request_handoff<'a>(
        &'a self,
        name: &'a str,
        handoff: &'a Handoff,
        window: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let (name, handoff) = (name.to_owned(), handoff.clone());
        Box::pin(self.blocking(move |store, abandoned| {
            store.request_handoff(&name, &handoff, window, abandoned)
        }))
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseRecord>, BackendError>> {
        let name = name.to_owned();
        Box::pin(self.blocking(move |store, _| store.inspect(&name)))
    }

    fn last_term<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<super::EndedTerm>, BackendError>> {
        let name = name.to_owned();
        Box::pin(self.blocking(move |store, _| store.last_term(&name)))
    }

    fn check_completion<'a>(
        &'a self,
        name: &'a str,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<CompletionCheck, BackendError>> {
        Box::pin(async move {
            validate(name).map_err(name_error)?;
            let name = name.to_owned();
            self.blocking(move |store, abandoned| store.check_completion(&name, token, abandoned))
                .await
        })
    }

    fn record_completion<'a>(
        &'a self,
        name: &'a str,
        record: &'a Completion,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            validate(name).map_err(name_error)?;
            let (name, record) = (name.to_owned(), record.clone());
            self.blocking(move |store, abandoned| {
                store.record_completion(&name, &record, abandoned)
            })
            .await
        })
    }

    fn announce_member<'a>(
        &'a self,
        group: &'a str,
        member: &'a Member,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            validate(group).map_err(name_error)?;
            let (group, member) = (group.to_owned(), member.clone());
            self.blocking(move |store, abandoned| {
                members::announce(store, &group, &member, ttl, abandoned)
            })
            .await
        })
    }

    fn withdraw_member<'a>(
        &'a self,
        group: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            validate(group).map_err(name_error)?;
            let (group, identity) = (group.to_owned(), identity.to_owned());
            self.blocking(move |store, abandoned| {
                members::withdraw(store, &group, &identity, abandoned)
            })
            .await
        })
    }

    fn group_record<'a>(
        &'a self,
        group: &'a str,
    ) -> BoxFuture<'a, Result<GroupRead, BackendError>> {
        Box::pin(async move {
            validate(group).map_err(name_error)?;
            let group = group.to_owned();
            self.blocking(move |store, _| group::read(store, &group))
                .await
        })
    }

    fn swap_group_record<'a>(
        &'a self,
        group: &'a str,
        expected: Option<&'a GroupVersion>,
        record: &'a GroupRecord,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            validate(group).map_err(name_error)?;
            let (group, expected, record) = (group.to_owned(), expected.cloned(), *record);
            self.blocking(move |store, abandoned| {
                group::swap(store, &group, expected.as_ref(), &record, abandoned)
            })
            .await
        })
    }

    fn members(&self, group: &str) -> BoxStream<'static, Result<Vec<Member>, BackendError>> {
        if let Err(e) = validate(group) {
            return Box::pin(futures::stream::iter([Err(name_error(e))]));
        }
        match self.hub() {
            Ok(hub) => members::stream(hub, self.inner.store.clone(), group),
            Err(e) => Box::pin(futures::stream::iter([Err(e)])),
        }
    }

    fn observe(&self, name: &str) -> BoxStream<'static, Result<HolderChange, BackendError>> {
        let hub = match self.hub() {
            Ok(hub) => hub,
            Err(e) => return Box::pin(futures::stream::iter([Err(e)])),
        };
        let (tx, rx) = hub.subscribe(name);
        let store = self.inner.store.clone();
        let name = name.to_owned();
        // The watch is in place and `name` registered before the first read, so a change after
        // that read is published to `rx`. The read runs on the blocking pool (file I/O) and is
        // published in the hub's read order (`Hub::read_and_publish`), so it never overwrites
        // a newer state the watcher published meanwhile; marking it seen right after the
        // publication does not skip a newer one either.
        let first = futures::stream::once(async move {
            let read = tokio::task::spawn_blocking(move || {
                let mut rx = rx;
                let item = hub
                    .read_and_publish(&store, &name, &tx)
                    .map(|()| rx.borrow_and_update().clone());
                (item, rx)
            })
            .await;
            match read {
                Ok((item, rx)) => (item, Some(rx)),
                Err(e) => (
                    Err(BackendError::new(
                        BackendErrorKind::Unavailable,
                        format!("reading a local lease record did not complete: {e}"),
                    )),
                    None,
                ),
            }
        });
        Box::pin(futures::StreamExt::flat_map(first, |(item, rx)| {
            let rest = futures::stream::unfold(rx, |rx| async move {
                let mut rx = rx?;
                rx.changed().await.ok()?;
                let change = rx.borrow_and_update().clone();
                Some((Ok(change), Some(rx)))
            });
            futures::StreamExt::chain(futures::stream::iter([item]), rest)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_should_accept_file_safe_names_only() {
        for ok in [
            "a",
            "job-1",
            "my.job_v2",
            "A-Z.0-9",
            &"x".repeat(MAX_NAME_LEN),
        ] {
            assert_eq!(validate(ok), Ok(()), "{ok}");
        }
        for (bad, rule) in [
            ("", "empty"),
            (".hidden", "'.'"),
            ("..", "'.'"),
            ("a/b", "letters"),
            ("a b", "letters"),
            ("é", "letters"),
            ("a\nb", "control"),
            (&"x".repeat(MAX_NAME_LEN + 1), "at most"),
        ] {
            let err = validate(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(err.rule.contains(rule), "{bad:?}: {}", err.rule);
        }
    }
}
