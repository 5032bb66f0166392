//! The state directory's files and the contract's operations on them, each one critical section
//! under the lock's file lock.
//!
//! Per lock name `N` the directory holds:
//! - `N.lock`: an empty file, never removed, whose `flock` serialises every change of `N`
//!   (across processes, and across threads: each operation opens it anew, and `flock` locks
//!   belong to the open file description).
//! - `N.lease`: the record ([`Record`]), replaced as a whole by `rename` from `.N.tmp`, so a
//!   reader (with or without the lock) sees either the old or the new record, never a mix, and
//!   a writer killed at any point leaves the old record in place.
//! - `N.done`: a run-once job's completion record (`Completion`), replaced the same way from
//!   `.N.done~`, only by the lock's latest term, under `N.lock`.
//!
//! Writes that issue a fencing token, and completion records, are made durable (`fdatasync` of the new record, `rename`,
//! `fsync` of the directory) before the token is returned. Other writes (renewals, replays,
//! releases) are not synced: they matter only until the next boot, which expires every lease
//! anyway, and a killed process cannot lose them (they are in the page cache).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::record::{Holder, Record};
use super::sys;
use crate::backend::completion::MAX_COMPLETION_RECORD;
use crate::backend::{
    AcquireRequest, Acquired, BackendError, BackendErrorKind, Completion, CompletionCheck,
    CompletionRead, EndedTerm, FencingToken, Handoff, HolderChange, HolderToken, LeaseRecord,
    Released, Renewed, TermEnd,
};

/// Where the kernel publishes the id of the current boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// How long an operation waits for another process's critical section (normally microseconds)
/// before giving up with a timeout; only a process stopped in the middle of an update holds it
/// longer.
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// Records are a few hundred bytes; anything far larger is not one. `read` refuses larger
/// files and `write` refuses to write larger records, so the two always agree.
const MAX_RECORD: u64 = 64 * 1024;

/// The state directory and the boot it is used in.
#[derive(Debug)]
pub(super) struct Store {
    dir: PathBuf,
    boot: String,
}

impl Store {
    /// Opens (creating it if needed) the state directory `dir`.
    pub(super) fn open(dir: PathBuf) -> Result<Self, BackendError> {
        let boot = fs::read_to_string(BOOT_ID)
            .map_err(|e| io_error("read the boot id from", Path::new(BOOT_ID), &e))?
            .trim()
            .to_owned();
        if boot.is_empty() || boot.contains(char::is_whitespace) {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                format!("unexpected boot id {boot:?} in {BOOT_ID}"),
            ));
        }
        let store = Self { dir, boot };
        store.ensure_dir()?;
        Ok(store)
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The id of the boot this store runs in.
    pub(super) fn boot(&self) -> &str {
        &self.boot
    }

    pub(super) fn record_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.lease"))
    }

    fn lock_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.lock"))
    }

    fn temp_path(&self, name: &str) -> PathBuf {
        // Lock names never start with a dot, so this cannot be another lock's file.
        self.dir.join(format!(".{name}.tmp"))
    }

    /// Creates the directory (mode 0700) if it is missing, and checks it ([`check_dir`]).
    ///
    /// [`check_dir`]: Self::check_dir
    pub(super) fn ensure_dir(&self) -> Result<(), BackendError> {
        let dir = &self.dir;
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io_error("create the state directory", dir, &e))?;
        self.check_dir()
    }

    /// Checks that the state directory is a directory only this user can write to, reached
    /// through no symbolic link that another user could re-point (a link of its own, or of
    /// root's, is fine). Run by every change, not only at open: a directory removed (a wipe,
    /// `/tmp` cleaning) and recreated by another user must not receive our lock files.
    fn check_dir(&self) -> Result<(), BackendError> {
        let dir = &self.dir;
        let refuse = |why: String| {
            Err(BackendError::new(
                BackendErrorKind::PermissionDenied,
                format!(
                    "refusing the state directory {}: {why}; another user could forge or delete \
                     its lease records (choose a directory of your own, e.g. with \
                     TENURE_STATE_DIR)",
                    dir.display()
                ),
            ))
        };
        let me = sys::effective_uid();
        let inspect = |e: io::Error| io_error("inspect the state directory", dir, &e);
        let link = fs::symlink_metadata(dir).map_err(inspect)?;
        let meta = if link.file_type().is_symlink() {
            if link.uid() != me && link.uid() != 0 {
                return refuse(format!(
                    "it is a symbolic link owned by uid {}, who can re-point it at any time",
                    link.uid()
                ));
            }
            fs::metadata(dir).map_err(inspect)?
        } else {
            link
        };
        if !meta.is_dir() {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                format!("the state directory {} is not a directory", dir.display()),
            ));
        }
        if meta.uid() != me {
            return refuse(format!(
                "it is owned by uid {}, not by uid {me}",
                meta.uid()
            ));
        }
        if meta.mode() & 0o002 != 0 {
            return refuse(format!(
                "it is writable by every user (mode {:o})",
                meta.mode() & 0o7777
            ));
        }
        Ok(())
    }

    /// Takes the file lock of `name`, waiting at most [`LOCK_WAIT`] or until the caller gave
    /// up (`abandoned`). Released when the returned file is dropped.
    fn lock(&self, name: &str, abandoned: &AtomicBool) -> Result<File, BackendError> {
        let path = self.lock_path(name);
        let give_up = Instant::now() + LOCK_WAIT;
        let timed_out = || {
            BackendError::new(
                BackendErrorKind::Timeout,
                format!(
                    "{} stayed locked for {LOCK_WAIT:?}: a process may be stopped in the middle \
                     of an update",
                    path.display()
                ),
            )
        };
        let mut recreated = false;
        loop {
            let file = match OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&path)
            {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound && !recreated => {
                    // The directory was removed (a wipe, a logout cleaning $XDG_RUNTIME_DIR).
                    recreated = true;
                    self.ensure_dir()?;
                    continue;
                }
                Err(e) => return Err(io_error("open the lock file", &path, &e)),
            };
            if let Some(why) = not_regular(&file, &path)? {
                return Err(BackendError::new(
                    BackendErrorKind::Protocol,
                    format!(
                        "refusing the lock file {}: {why} (move it aside; the next operation \
                         creates a new one)",
                        path.display()
                    ),
                ));
            }
            let mut spins = 0u32;
            loop {
                match file.try_lock() {
                    Ok(()) => break,
                    Err(fs::TryLockError::WouldBlock) => {
                        if abandoned.load(Ordering::Relaxed) {
                            return Err(BackendError::new(
                                BackendErrorKind::Timeout,
                                "the request was abandoned before it ran",
                            ));
                        }
                        if Instant::now() >= give_up {
                            return Err(timed_out());
                        }
                        backoff(&mut spins);
                    }
                    Err(fs::TryLockError::Error(e)) => {
                        return Err(io_error("lock", &path, &e));
                    }
                }
            }
            // The lock only counts if the file is still the one at `path`: had the directory
            // been wiped after we opened it, a newcomer would lock a different file.
            let held = file
                .metadata()
                .map_err(|e| io_error("inspect the lock file", &path, &e))?;
            match fs::symlink_metadata(&path) {
                Ok(m) if m.ino() == held.ino() && m.dev() == held.dev() => {
                    self.check_dir()?;
                    return Ok(file);
                }
                _ if Instant::now() >= give_up => return Err(timed_out()),
                _ => {}
            }
        }
    }

    /// The record of `name`, `None` when there is none.
    pub(super) fn read(&self, name: &str) -> Result<Option<Record>, BackendError> {
        let path = self.record_path(name);
        // O_NONBLOCK: opening a FIFO put in place of the record must not wait for a writer
        // (it is refused below); on a regular file the flag changes nothing.
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("open the lease record", &path, &e)),
        };
        if let Some(why) = not_regular(&file, &path)? {
            return Err(corrupt(&path, &why));
        }
        let mut bytes = Vec::with_capacity(512);
        file.take(MAX_RECORD + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error("read the lease record", &path, &e))?;
        if bytes.len() as u64 > MAX_RECORD {
            return Err(corrupt(&path, "larger than any lease record"));
        }
        let text = std::str::from_utf8(&bytes).map_err(|_| corrupt(&path, "not UTF-8 text"))?;
        Record::parse(text)
            .map(Some)
            .map_err(|why| corrupt(&path, &why))
    }

    /// Replaces the record of `name`; `durable` makes it survive a power loss before returning.
    fn write(&self, name: &str, record: &Record, durable: bool) -> Result<(), BackendError> {
        let tmp = self.temp_path(name);
        let path = self.record_path(name);
        let text = record.encode();
        // Never write what `read` would refuse: the lock would be stuck until someone moved
        // the record aside. Only the identity makes a record long.
        if text.len() as u64 > MAX_RECORD {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                format!(
                    "refusing to write the lease record {}: it would be {} bytes, over the \
                     {MAX_RECORD} a record may have, because the holder's identity is {} bytes \
                     long (a Locker accepts at most {})",
                    path.display(),
                    text.len(),
                    record.holder.as_ref().map_or(0, |h| h.identity.len()),
                    crate::backend::types::MAX_IDENTITY_LEN,
                ),
            ));
        }
        self.replace(&tmp, &path, text.as_bytes(), durable, "the lease record")
    }

    /// Replaces `path` with `bytes` through the temporary file `tmp` and a rename, under the
    /// lock's file lock; `durable` makes it survive a power loss before returning.
    fn replace(
        &self,
        tmp: &Path,
        path: &Path,
        bytes: &[u8],
        durable: bool,
        what: &str,
    ) -> Result<(), BackendError> {
        let result = (|| {
            // Only the holder of the file lock writes the temporary file, so one left behind
            // is a killed writer's: remove it, whatever it is, and create ours exclusively
            // (O_EXCL: never through a link, never into a FIFO or a device).
            let _ = fs::remove_file(tmp);
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(tmp)
                .map_err(|e| io_error("create", tmp, &e))?;
            f.write_all(bytes).map_err(|e| io_error("write", tmp, &e))?;
            if durable {
                f.sync_data().map_err(|e| io_error("sync", tmp, &e))?;
            }
            drop(f);
            fs::rename(tmp, path).map_err(|e| io_error(&format!("replace {what}"), path, &e))
        })();
        if result.is_err() {
            let _ = fs::remove_file(tmp);
            return result;
        }
        if durable {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_error("sync the state directory", &self.dir, &e))?;
        }
        Ok(())
    }

    /// `N.done`: lock `N`'s completion record (a run-once job's), one line of
    /// [`Completion::encode`]'s text. Lock files end in `.lease` or `.lock`, so no lock's file
    /// is named like this.
    pub(super) fn completion_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.done"))
    }

    /// The completion record of `name` as stored, bounded: whatever is there (a huge file, a
    /// FIFO, garbage) reads as [`CompletionRead::Damaged`], never as an error of the check.
    fn read_completion(&self, name: &str) -> Result<CompletionRead, BackendError> {
        let path = self.completion_path(name);
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(CompletionRead::Absent),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Ok(CompletionRead::Damaged {
                    reason: format!("{} is a symbolic link", path.display()),
                });
            }
            Err(e) => return Err(io_error("open the completion record", &path, &e)),
        };
        if let Some(why) = not_regular(&file, &path)? {
            return Ok(CompletionRead::Damaged {
                reason: format!("{}: {why}", path.display()),
            });
        }
        let mut bytes = Vec::with_capacity(128);
        file.take(MAX_COMPLETION_RECORD as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error("read the completion record", &path, &e))?;
        Ok(match CompletionRead::parse(&bytes) {
            CompletionRead::Damaged { reason } => CompletionRead::Damaged {
                reason: format!("{}: {reason}", path.display()),
            },
            read => read,
        })
    }

    /// `name`'s completion record, the host's clock (the store's), and whether `token` is the
    /// lock's latest grant: one critical section, so a grant cannot fall between the reads.
    pub(super) fn check_completion(
        &self,
        name: &str,
        token: FencingToken,
        abandoned: &AtomicBool,
    ) -> Result<CompletionCheck, BackendError> {
        let _lock = self.lock(name, abandoned)?;
        let latest = self.read(name)?.is_some_and(|r| r.fencing == token.get());
        let last = self.read_completion(name)?;
        Ok(CompletionCheck {
            now_ms: wall_ms(),
            last,
            latest,
        })
    }

    /// Writes `record` as `name`'s completion record if `record.token` is the lock's latest
    /// grant; durable before it answers, like a grant.
    pub(super) fn record_completion(
        &self,
        name: &str,
        record: &Completion,
        abandoned: &AtomicBool,
    ) -> Result<bool, BackendError> {
        let _lock = self.lock(name, abandoned)?;
        if self
            .read(name)?
            .is_none_or(|r| r.fencing != record.token.get())
        {
            return Ok(false);
        }
        let path = self.completion_path(name);
        // '~' is in no lock name, so no other file of the directory has this name.
        let tmp = self.dir.join(format!(".{name}.done~"));
        let text = record.encode();
        self.replace(&tmp, &path, text.as_bytes(), true, "the completion record")?;
        Ok(true)
    }

    /// One attempt to take `req.name`.
    pub(super) fn try_acquire(
        &self,
        req: &AcquireRequest,
        abandoned: &AtomicBool,
    ) -> Result<Acquired, BackendError> {
        let _lock = self.lock(&req.name, abandoned)?;
        let now = now_ns()?;
        let record = self.read(&req.name)?;
        if let Some(mut r) = record.clone()
            && let Some(h) = r.live(&self.boot, now)
        {
            if h.token != req.holder {
                return Ok(Acquired::Busy {
                    holder: Some(h.identity.clone()),
                    remaining: Some(Duration::from_nanos(h.expires_ns - now)),
                });
            }
            // A replay by the current holder: the original token, the ttl restarted from now.
            if let Some(h) = r.holder.as_mut() {
                h.expires_ns = deadline(now, req.ttl);
            }
            self.write(&req.name, &r, false)?;
            return Ok(Acquired::Granted {
                fencing: FencingToken::new(r.fencing),
            });
        }
        if let Some(r) = &record
            && let Some(h) = r.handoff(&self.boot, now)
            && h.excludes(&req.identity)
        {
            // Free, but handed over to another replica whose window still runs.
            let until = r.handoff.as_ref().map_or(now, |(_, until)| *until);
            return Ok(Acquired::Busy {
                holder: h.target().map(str::to_owned),
                remaining: Some(Duration::from_nanos(until - now)),
            });
        }
        let fencing = next_fencing(record.as_ref(), &self.boot, &self.record_path(&req.name))?;
        let mut r = record.unwrap_or_else(|| Record {
            boot: String::new(),
            fencing: 0,
            grants: 0,
            holder: None,
            acks: Vec::new(),
            handoff: None,
        });
        r.handoff = None;
        r.boot.clone_from(&self.boot);
        r.fencing = fencing;
        r.grants = r.grants.saturating_add(1);
        r.holder = Some(Holder {
            token: req.holder,
            identity: req.identity.to_string(),
            expires_ns: deadline(now, req.ttl),
        });
        self.write(&req.name, &r, true)?;
        Ok(Acquired::Granted {
            fencing: FencingToken::new(fencing),
        })
    }

    /// Extends `name`'s ttl to `ttl` from now if `holder` holds it.
    pub(super) fn renew(
        &self,
        name: &str,
        holder: &HolderToken,
        ttl: Duration,
        abandoned: &AtomicBool,
    ) -> Result<Renewed, BackendError> {
        let _lock = self.lock(name, abandoned)?;
        let now = now_ns()?;
        let Some(mut r) = self.read(name)? else {
            return Ok(Renewed::NotHeld);
        };
        if r.live(&self.boot, now).is_none_or(|h| h.token != *holder) {
            return Ok(Renewed::NotHeld);
        }
        if let Some(h) = r.holder.as_mut() {
            h.expires_ns = deadline(now, ttl);
        }
        self.write(name, &r, false)?;
        Ok(Renewed::Held)
    }

    /// Gives `name` up if `holder` holds it (or already gave it up); with `identity`, only if
    /// the record also names that identity as the holder (`release_as`: a replay then counts
    /// as not held).
    /// With `to`, only that identity may take the lock until the window ends (`release_to`).
    pub(super) fn release(
        &self,
        name: &str,
        holder: &HolderToken,
        identity: Option<&str>,
        to: Option<(&str, Duration)>,
        abandoned: &AtomicBool,
    ) -> Result<Released, BackendError> {
        let _lock = self.lock(name, abandoned)?;
        let now = now_ns()?;
        let Some(mut r) = self.read(name)? else {
            return Ok(Released::NotHeld);
        };
        if identity.is_none() && r.acks.contains(holder) {
            return Ok(Released::Released);
        }
        if r.live(&self.boot, now)
            .is_none_or(|h| h.token != *holder || identity.is_some_and(|i| h.identity != i))
        {
            return Ok(Released::NotHeld);
        }
        let ended = r.holder.take().map(|h| ended_text(r.fencing, &h.identity));
        r.ack(*holder);
        if let Some((to, window)) = to {
            r.handoff = Some((Handoff::To(to.to_owned()), deadline(now, window)));
        }
        self.write(name, &r, false)?;
        if let Some(text) = ended {
            // Only for `tenure status`: a failure loses nothing the lease depends on.
            let tmp = self.dir.join(format!(".{name}.ended~"));
            let _ = self.replace(
                &tmp,
                &self.ended_path(name),
                text.as_bytes(),
                false,
                "the release note",
            );
        }
        Ok(Released::Released)
    }

    /// `N.ended`: who released lock `N` last and when (`e1:<fencing>:<unix ms>:<identity>`),
    /// for `tenure status`; written after the release, not synced.
    fn ended_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.ended"))
    }

    /// How `name`'s latest term ended, while the lock is free: expired (the record still
    /// names its holder) or released (the record's token, and `N.ended` when it names that
    /// token). Reads without the file lock, like `inspect`.
    pub(super) fn last_term(&self, name: &str) -> Result<Option<EndedTerm>, BackendError> {
        let Some(r) = self.read(name)? else {
            return Ok(None);
        };
        let now = now_ns()?;
        if r.live(&self.boot, now).is_some() {
            return Ok(None);
        }
        let fencing = FencingToken::new(r.fencing);
        if let Some(h) = &r.holder {
            // The expiry is on CLOCK_MONOTONIC of the record's boot: a wall time only then.
            let ended_ms = (r.boot == self.boot)
                .then(|| wall_ms().saturating_sub(now.saturating_sub(h.expires_ns) / 1_000_000));
            return Ok(Some(EndedTerm {
                identity: Some(h.identity.clone()),
                fencing: Some(fencing),
                end: TermEnd::Expired,
                ended_ms,
            }));
        }
        let note = self
            .read_small(&self.ended_path(name))
            .ok()
            .flatten()
            .and_then(|bytes| parse_ended(&bytes))
            .filter(|(token, _, _)| *token == r.fencing);
        Ok(Some(EndedTerm {
            identity: note.as_ref().map(|(_, _, identity)| identity.clone()),
            fencing: Some(fencing),
            end: TermEnd::Released,
            ended_ms: note.map(|(_, ms, _)| ms),
        }))
    }

    /// A small file another process may have written: `None` when absent; refused when it is
    /// a link or not a regular file; at most a completion record's size read.
    fn read_small(&self, path: &Path) -> Result<Option<Vec<u8>>, BackendError> {
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("open", path, &e)),
        };
        if let Some(why) = not_regular(&file, path)? {
            return Err(BackendError::new(BackendErrorKind::Protocol, why));
        }
        let mut bytes = Vec::with_capacity(128);
        file.take(MAX_COMPLETION_RECORD as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error("read", path, &e))?;
        Ok(Some(bytes))
    }

    /// Who holds `name` now. Reads without the file lock: a record is replaced atomically.
    pub(super) fn inspect(&self, name: &str) -> Result<Option<LeaseRecord>, BackendError> {
        let Some(r) = self.read(name)? else {
            return Ok(None);
        };
        let now = now_ns()?;
        Ok(r.live(&self.boot, now).map(|h| LeaseRecord {
            identity: h.identity.clone(),
            fencing: FencingToken::new(r.fencing),
            remaining: Some(Duration::from_nanos(h.expires_ns - now)),
            transitions: Some(r.grants.saturating_sub(1)),
            handoff: r.handoff(&self.boot, now).cloned(),
            preferred_holder: false,
        }))
    }

    /// Records a request that the holder of `name` hand it over, if it is held.
    pub(super) fn request_handoff(
        &self,
        name: &str,
        handoff: &Handoff,
        window: Duration,
        abandoned: &AtomicBool,
    ) -> Result<bool, BackendError> {
        let _lock = self.lock(name, abandoned)?;
        let now = now_ns()?;
        let Some(mut r) = self.read(name)? else {
            return Ok(false);
        };
        if r.live(&self.boot, now).is_none() {
            return Ok(false);
        }
        r.handoff = Some((handoff.clone(), deadline(now, window)));
        self.write(name, &r, false)?;
        Ok(true)
    }

    /// The state of `name` as an observer sees it.
    pub(super) fn holder_change(&self, name: &str) -> Result<HolderChange, BackendError> {
        let record = self.read(name)?;
        let now = now_ns()?;
        Ok(record.map_or_else(HolderChange::free, |r| r.change(&self.boot, now)))
    }
}

/// The token of a fresh grant: one more than the last, or, when the counter is missing (a new
/// lock, or a wiped directory), the wall clock in microseconds, as the Redis backend seeds its
/// counter from `TIME`. A record from an earlier boot is also raised to the wall clock, so
/// tokens keep rising even if a power loss lost the latest grants.
fn next_fencing(record: Option<&Record>, boot: &str, path: &Path) -> Result<u64, BackendError> {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    match record {
        None => Ok(seed.max(1)),
        Some(r) => {
            let next = r
                .fencing
                .checked_add(1)
                .ok_or_else(|| corrupt(path, "the fencing counter is exhausted"))?;
            Ok(if r.boot == boot { next } else { next.max(seed) })
        }
    }
}

/// The release note of the term with token `fencing` held by `identity`, released now.
fn ended_text(fencing: u64, identity: &str) -> String {
    format!("e1:{fencing}:{}:{identity}", wall_ms())
}

/// Parses a release note (bounded, each field checked): (token, unix ms, identity).
fn parse_ended(bytes: &[u8]) -> Option<(u64, u64, String)> {
    if bytes.len() > MAX_COMPLETION_RECORD {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let mut f = text.splitn(4, ':');
    if f.next()? != "e1" {
        return None;
    }
    let mut number = || {
        f.next()
            .filter(|s| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok())
    };
    let (token, ms) = (number()?, number()?);
    let identity = f.next()?;
    (!identity.is_empty()
        && identity.len() <= crate::backend::types::MAX_IDENTITY_LEN
        && !identity.chars().any(char::is_control))
    .then(|| (token, ms, identity.to_owned()))
}

/// The host's wall clock in milliseconds since the Unix epoch: the local store's clock for
/// completion records (every process of the host reads the same one).
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(super) fn deadline(now_ns: u64, ttl: Duration) -> u64 {
    now_ns.saturating_add(u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX))
}

pub(super) fn now_ns() -> Result<u64, BackendError> {
    sys::monotonic_ns().map_err(|e| {
        BackendError::new(
            BackendErrorKind::Unavailable,
            format!("cannot read CLOCK_MONOTONIC: {e}"),
        )
    })
}

/// Yields the processor a few times, then sleeps a little longer each time, up to 1 ms:
/// another process's critical section lasts microseconds.
pub(super) fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins <= 8 {
        std::thread::yield_now();
    } else {
        let micros = 20u64 << (*spins - 8).min(6);
        std::thread::sleep(Duration::from_micros(micros.min(1000)));
    }
}

/// An I/O failure on `path`, naming it and the OS error.
pub(super) fn io_error(what: &str, path: &Path, e: &io::Error) -> BackendError {
    let kind = match e.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            BackendErrorKind::PermissionDenied
        }
        _ => BackendErrorKind::Unavailable,
    };
    BackendError::new(kind, format!("cannot {what} {}: {e}", path.display()))
}

/// What is wrong with `file` (opened from `path`) if it is not a regular file — a FIFO, a
/// socket, a device, a directory — naming what it is. Reading a FIFO would wait forever for a
/// writer, so nothing but a regular file is ever read or locked.
pub(super) fn not_regular(file: &File, path: &Path) -> Result<Option<String>, BackendError> {
    use std::os::unix::fs::FileTypeExt as _;
    let kind = file
        .metadata()
        .map_err(|e| io_error("inspect", path, &e))?
        .file_type();
    let found = if kind.is_file() {
        return Ok(None);
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else {
        "something else"
    };
    Ok(Some(format!("not a regular file but {found}")))
}

/// A record that cannot be interpreted: fail closed, naming the file.
fn corrupt(path: &Path, why: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Protocol,
        format!(
            "corrupt lease record {}: {why} (move it aside to reset the lock; the next grant \
             seeds its fencing counter from the clock)",
            path.display()
        ),
    )
}
