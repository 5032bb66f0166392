//! Same-replica restart: the proof that this replica's previous process is gone, so that the
//! term it may still hold is ended at once instead of after a whole lease.
//!
//! The proof is an exclusive lock (`flock`) on a file in a directory only this replica's
//! processes see — a pod's `emptyDir`, a host's private directory. The kernel drops the lock
//! when the last process holding the file open has exited, and not before: a frozen process,
//! or one still running, keeps it. While a process holds the lock it records in the file the
//! holder token of each campaign *before* the request goes out. So a later process that takes
//! the lock knows that no process of the previous run is alive, and which holder token may
//! still hold the lease: it releases the lease with that token (the store checks the token, so
//! a record naming anything else releases nothing) and campaigns at once. The fencing token
//! rises with the new term, as with any term.
//!
//! Without the lock — another process has it — nothing is released and the lease is won the
//! usual way, after it expires. A record that does not parse, or names another lease or
//! identity, is ignored the same way. A record is a file and may have been tampered with: the
//! release is a compare-and-delete on the holder token *and* this replica's identity
//! ([`Backend::release_as`]), so a token copied from another replica's lease ends nothing, and
//! the file lives only where nobody else can write ([`private`]: a private directory,
//! never through a symbolic link, only a regular file).
//!
//! One file serves every lease of a process: a sharded replica campaigns on many shard leases,
//! each term with its own holder token, so the record is a log of entries (`holder TOKEN LEN
//! LEASE IDENTITY`), the last entry of a lease winning, appended before each campaign and
//! rewritten with only the latest entries when it has grown. Each entry is parsed alone and a
//! bad one skipped. The file is never synced: the record has to survive the process, not the
//! machine — after a machine crash an older record names tokens that no longer hold anything,
//! which costs only the fast restart.

use std::collections::BTreeMap;
mod private;

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;

use crate::backend::{Backend, HolderToken, Released};

/// The most of a record file that is read; entries past it are not.
const MAX_RECORD: u64 = 1 << 20;

/// The longest entry (a lease name and an identity are far shorter); a longer line is skipped.
const MAX_ENTRY: usize = 1024;

/// The first line of a record of entries.
const MAGIC: &str = "tenure-restart v2";

/// The file is rewritten with only the latest entry of each lease once it is larger than this
/// and than twice those entries.
const COMPACT_AT: u64 = 64 * 1024;

/// How often [`RestartLock::take`] tries the lock while another process holds it.
const POLL: Duration = Duration::from_millis(10);

/// Why a [`RestartLock`] could not be taken.
#[derive(Debug, thiserror::Error)]
#[error("restart lock {}: {message}", path.display())]
pub struct RestartLockError {
    path: PathBuf,
    message: String,
}

impl RestartLockError {
    /// The lock file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The lock that proves this replica's previous process is gone (see
/// [`LeaderElector::with_restart_lock`](super::LeaderElector::with_restart_lock) and
/// [`ShardedElector::with_restart_lock`](crate::shard::ShardedElector::with_restart_lock)).
///
/// Hold it for the life of the process: dropping it releases the lock, and a process started
/// meanwhile would take this one for gone.
///
/// # Example
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tenure::election::{ElectionConfig, LeaderElector, RestartLock};
/// use tenure::Locker;
/// use tenure::backend::memory::MemoryBackend;
///
/// # let dir = std::env::temp_dir().join(format!("tenure-restart-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// // A directory only this replica's processes see, e.g. a pod's emptyDir.
/// let mut elector = LeaderElector::new(
///     Locker::with_identity(MemoryBackend::new(), "pod-a")?,
///     "reports",
///     ElectionConfig::new(),
/// )?;
/// if let Some(lock) = RestartLock::take(&dir, "reports", Duration::from_secs(1)).await? {
///     elector = elector.with_restart_lock(lock);
/// }
/// # let _ = elector;
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct RestartLock {
    file: File,
    path: PathBuf,
    /// What the previous process recorded, by lease: each handed out once.
    previous: Mutex<BTreeMap<String, Recorded>>,
    /// What the file holds, for appending and compacting.
    written: Mutex<Written>,
}

/// What a process recorded before it campaigned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Recorded {
    pub(crate) identity: String,
    pub(crate) holder: HolderToken,
}

#[derive(Debug)]
struct Written {
    /// The latest entry of each lease, as its line.
    latest: BTreeMap<String, String>,
    /// The file's length.
    len: u64,
    /// Whether the file starts with [`MAGIC`] (not empty, not an earlier version's record).
    current: bool,
}

impl RestartLock {
    /// Takes the lock named after `lease` in `dir`, waiting up to `wait` while another
    /// process holds it — e.g. a watchdog still killing the previous run's command. `Ok(None)`
    /// if it is still held then: some process of a previous run is alive (or frozen), and only
    /// the leases' expiry may end its terms. A sharded replica takes one lock, named after its
    /// group, for all its shards.
    ///
    /// The record decides which lease the next process releases, so it is kept where only
    /// this user can write: `dir` itself when it is owned by this process's effective user and
    /// writable by nobody else (created 0700 if missing), else a private subdirectory
    /// `tenure-<uid>` made in it (a Kubernetes `emptyDir` is 0777). The file (0600) is never
    /// opened through a symbolic link, and must be a regular file of this user's; the opening
    /// and reading happen off the runtime thread, bounded to 1 MiB.
    ///
    /// # Errors
    ///
    /// [`RestartLockError`] naming the path if the directory or file cannot be made, opened or
    /// locked (a read-only file system, no permission), if a subdirectory `tenure-<uid>` exists
    /// that is not private, or if the record is a symbolic link, a FIFO or anything but a
    /// regular file owned by this user.
    pub async fn take(
        dir: impl AsRef<Path>,
        lease: &str,
        wait: Duration,
    ) -> Result<Option<Self>, RestartLockError> {
        let dir = dir.as_ref().to_owned();
        let name = file_name(lease);
        // Off the runtime thread: file system calls can block (a slow or hung mount).
        let opened = tokio::task::spawn_blocking(move || private::open_record(&dir, &name))
            .await
            .map_err(|e| RestartLockError {
                path: PathBuf::new(),
                message: format!("the task opening it failed: {e}"),
            })?;
        let (file, path) = opened.map_err(|e| RestartLockError {
            path: e.path,
            message: e.message,
        })?;
        let give_up = tokio::time::Instant::now() + wait;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if tokio::time::Instant::now() < give_up => {
                    tokio::time::sleep(POLL).await;
                }
                Err(TryLockError::WouldBlock) => return Ok(None),
                Err(TryLockError::Error(e)) => {
                    return Err(RestartLockError {
                        path,
                        message: format!("cannot lock it: {e}"),
                    });
                }
            }
        }
        let read_path = path.clone();
        let (file, previous, current, len) = tokio::task::spawn_blocking(move || {
            let mut file = file;
            let (previous, current) = read_record(&mut file, &read_path);
            let len = file.metadata().map_or(u64::MAX, |m| m.len());
            (file, previous, current, len)
        })
        .await
        .map_err(|e| RestartLockError {
            path: path.clone(),
            message: format!("the task reading it failed: {e}"),
        })?;
        let latest = previous
            .iter()
            .map(|(lease, r)| (lease.clone(), entry(lease, &r.identity, r.holder)))
            .collect();
        Ok(Some(Self {
            file,
            path,
            previous: Mutex::new(previous),
            written: Mutex::new(Written {
                latest,
                len,
                current,
            }),
        }))
    }

    /// The lock file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The holder token the previous process recorded for `lease` under `identity`, once: a
    /// second call for the lease gets `None`.
    pub(crate) fn take_previous(&self, lease: &str, identity: &str) -> Option<HolderToken> {
        let mut previous = self.previous.lock().unwrap_or_else(PoisonError::into_inner);
        if previous.get(lease)?.identity != identity {
            return None;
        }
        previous.remove(lease).map(|r| r.holder)
    }

    /// Every lease the previous process recorded under `identity` that `ours` accepts, with
    /// its holder token, each handed out once.
    pub(crate) fn take_previous_all(
        &self,
        identity: &str,
        ours: impl Fn(&str) -> bool,
    ) -> Vec<(String, HolderToken)> {
        let mut previous = self.previous.lock().unwrap_or_else(PoisonError::into_inner);
        let leases: Vec<String> = previous
            .iter()
            .filter(|(lease, r)| r.identity == identity && ours(lease))
            .map(|(lease, _)| lease.clone())
            .collect();
        leases
            .into_iter()
            .filter_map(|lease| previous.remove(&lease).map(|r| (lease, r.holder)))
            .collect()
    }

    /// Records `holder` as the token this process is about to campaign on `lease` with, before
    /// the request goes out: if the process dies after sending it, the next one must know it.
    pub(crate) fn record(
        &self,
        lease: &str,
        identity: &str,
        holder: HolderToken,
    ) -> std::io::Result<()> {
        if lease.contains('\n') || identity.contains('\n') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a lease name or identity with a line break cannot be recorded",
            ));
        }
        let line = entry(lease, identity, holder);
        if line.len() > MAX_ENTRY {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("an entry of {} bytes is over {MAX_ENTRY}", line.len()),
            ));
        }
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        written.latest.insert(lease.to_owned(), line.clone());
        let live: u64 = written.latest.values().map(|l| l.len() as u64).sum();
        let mut file = &self.file;
        if !written.current || written.len > COMPACT_AT.max(2 * live) {
            // Rewritten in place (a rename would replace the locked file): a crash in between
            // leaves a short record, whose missing entries only cost their fast restart.
            let text: String = std::iter::once(format!("{MAGIC}\n"))
                .chain(written.latest.values().cloned())
                .collect();
            written.current = false;
            file.set_len(0)?;
            file.seek(SeekFrom::Start(0))?;
            file.write_all(text.as_bytes())?;
            written.len = text.len() as u64;
            written.current = true;
        } else {
            file.seek(SeekFrom::End(0))?;
            file.write_all(line.as_bytes())?;
            written.len += line.len() as u64;
        }
        Ok(())
    }
}

/// Releases sent at once by [`end_recorded_terms`].
const ENDING_IN_FLIGHT: usize = 32;

/// Ends the terms a previous process recorded — each lease released with the holder token
/// recorded for it, and only if the store names this replica's `identity` as its holder
/// ([`Backend::release_as`]): a record is a file, and a holder token copied into it from
/// another replica's lease must not end that replica's term — and returns how many it ended.
/// A store error or a timeout is logged and leaves that lease to expire, as without the lock.
pub(crate) async fn end_recorded_terms(
    backend: &dyn Backend,
    identity: &str,
    terms: Vec<(String, HolderToken)>,
    timeout: Duration,
) -> usize {
    futures::stream::iter(terms)
        .map(|(lease, holder)| async move {
            let released = crate::lock::within(
                backend,
                "release",
                timeout,
                backend.release_as(&lease, &holder, identity),
            )
            .await;
            match released {
                Ok(Released::Released) => true,
                Ok(Released::NotHeld) => {
                    tracing::debug!(%lease, "no term held under this identity with the recorded token (it had already ended)");
                    false
                }
                Err(e) => {
                    tracing::warn!(%lease, error = %e, "could not end the previous process's term; waiting for its lease to expire");
                    false
                }
            }
        })
        .buffer_unordered(ENDING_IN_FLIGHT)
        .filter(|ended| std::future::ready(*ended))
        .count()
        .await
}

impl std::os::fd::AsFd for RestartLock {
    /// The lock file's descriptor: `tenure run` lets its command and watchdog inherit it, so
    /// that the lock outlives tenure until they are gone too.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// One entry's line: the token, then the lease by its length (so either may hold spaces),
/// then the identity to the end of the line.
fn entry(lease: &str, identity: &str, holder: HolderToken) -> String {
    format!(
        "holder {} {} {lease} {identity}\n",
        holder.to_hex(),
        lease.len()
    )
}

/// The entries in `file` (the last of each lease), and whether it is a current record; bad
/// entries are logged and skipped, an unreadable file is logged and read as empty.
fn read_record(file: &mut File, path: &Path) -> (BTreeMap<String, Recorded>, bool) {
    let mut bytes = Vec::new();
    if let Err(e) = file.take(MAX_RECORD).read_to_end(&mut bytes) {
        tracing::warn!(path = %path.display(), error = %e, "restart record unreadable; ignored");
        return (BTreeMap::new(), false);
    }
    let text = String::from_utf8_lossy(&bytes);
    let (entries, skipped, current) = parse_record(&text);
    if skipped > 0 {
        tracing::warn!(path = %path.display(), skipped, "restart record entries that do not parse; ignored");
    }
    (entries, current)
}

/// The entries of a record (the last of each lease), how many lines were skipped, and whether
/// it is a current record.
fn parse_record(text: &str) -> (BTreeMap<String, Recorded>, usize, bool) {
    let mut entries = BTreeMap::new();
    if text.is_empty() {
        return (entries, 0, false);
    }
    let mut lines = text.split_inclusive('\n');
    if lines.next() != Some(&format!("{MAGIC}\n")[..]) {
        return (entries, 1, false);
    }
    let mut skipped = 0;
    for line in lines {
        match parse_entry(line) {
            Some((lease, r)) => {
                entries.insert(lease, r);
            }
            None => skipped += 1,
        }
    }
    (entries, skipped, true)
}

/// One entry line, whole (with its line break) and at most [`MAX_ENTRY`] bytes.
fn parse_entry(line: &str) -> Option<(String, Recorded)> {
    if line.len() > MAX_ENTRY {
        return None;
    }
    let rest = line.strip_suffix('\n')?.strip_prefix("holder ")?;
    let (hex, rest) = rest.split_once(' ')?;
    let holder = HolderToken::from_hex(hex)?;
    let (len, rest) = rest.split_once(' ')?;
    let len: usize = len.parse().ok()?;
    let lease = rest.get(..len)?;
    let identity = rest.get(len..)?.strip_prefix(' ')?;
    if lease.is_empty() || identity.is_empty() {
        return None;
    }
    Some((
        lease.to_owned(),
        Recorded {
            identity: identity.to_owned(),
            holder,
        },
    ))
}

/// The record file's name for `lease`: the name itself when it is a safe file name, else a
/// hash of it (two leases sharing a file share its lock too, which only costs the second one
/// its fast restart).
fn file_name(lease: &str) -> String {
    let safe = !lease.is_empty()
        && lease.len() <= 200
        && !lease.starts_with('.')
        && lease
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if safe {
        return format!("{lease}.restart");
    }
    // FNV-1a: stable across versions and platforms, unlike std's hasher.
    let hash = crate::util::fnv1a64(lease.as_bytes());
    format!("x-{hash:016x}.restart")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lock of lease `jobs` in `d`, which must be free.
    async fn free_lock(d: &Path) -> RestartLock {
        RestartLock::take(d, "jobs", Duration::ZERO)
            .await
            .expect("takes")
            .expect("free")
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tenure-restart-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[tokio::test]
    async fn a_record_is_read_by_the_next_holder_of_the_lock_once() {
        let d = dir("next");
        let first = free_lock(&d).await;
        assert_eq!(
            first.take_previous("jobs", "a"),
            None,
            "nothing recorded yet"
        );
        let token = HolderToken::random();
        first.record("jobs", "a", token).expect("records");
        // Held: a second taker gets nothing, after waiting its window.
        let started = std::time::Instant::now();
        let second = RestartLock::take(&d, "jobs", Duration::from_millis(50))
            .await
            .expect("no error");
        assert!(second.is_none(), "the lock is held");
        assert!(started.elapsed() >= Duration::from_millis(50));
        drop(first);
        let third = free_lock(&d).await;
        assert_eq!(third.take_previous("jobs", "b"), None, "another identity");
        assert_eq!(third.take_previous("other", "a"), None, "another lease");
        assert_eq!(third.take_previous("jobs", "a"), Some(token));
        assert_eq!(third.take_previous("jobs", "a"), None, "handed out once");
        let mode = |p: &Path| {
            std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(p).expect("stat").permissions(),
            ) & 0o777
        };
        assert_eq!(mode(third.path()), 0o600);
        assert_eq!(mode(&d), 0o700);
        std::fs::remove_dir_all(&d).expect("cleanup");
    }

    /// A held lock is given up when the wait ends, not a poll later and not never (the
    /// clock is paused, so the times are exact and cost nothing).
    #[tokio::test(start_paused = true)]
    async fn a_held_lock_is_given_up_exactly_when_the_wait_ends() {
        let d = dir("bound");
        let first = free_lock(&d).await;
        for wait in [Duration::ZERO, POLL * 3] {
            let started = tokio::time::Instant::now();
            let second = tokio::time::timeout(
                wait + Duration::from_secs(10),
                RestartLock::take(&d, "jobs", wait),
            )
            .await
            .expect("gives up")
            .expect("no error");
            assert!(second.is_none(), "the lock is held");
            assert_eq!(started.elapsed(), wait, "gave up at the end of {wait:?}");
        }
        drop(first);
        std::fs::remove_dir_all(&d).expect("cleanup");
    }

    #[tokio::test]
    async fn a_lock_freed_while_waiting_is_taken() {
        let d = dir("wait");
        let first = free_lock(&d).await;
        let freer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(first);
        });
        let second = RestartLock::take(&d, "jobs", Duration::from_secs(5))
            .await
            .expect("no error");
        assert!(second.is_some(), "taken once freed");
        freer.await.expect("joins");
        std::fs::remove_dir_all(&d).expect("cleanup");
    }

    #[tokio::test]
    async fn many_leases_share_one_record_the_last_entry_of_each_winning() {
        let d = dir("many");
        let first = free_lock(&d).await;
        let mut last = BTreeMap::new();
        // Enough campaigns to compact the file several times over.
        for round in 0..400 {
            for shard in 0..8 {
                let lease = format!("jobs-{shard}");
                let token = HolderToken::random();
                first.record(&lease, "pod a", token).expect("records");
                last.insert(lease, (round, token));
            }
        }
        // Another identity's entry and another group's are not handed out below.
        first
            .record("jobs-9", "pod b", HolderToken::random())
            .expect("records");
        first
            .record("other-1", "pod a", HolderToken::random())
            .expect("records");
        let len = std::fs::metadata(first.path()).expect("stat").len();
        assert!(
            len <= COMPACT_AT + MAX_ENTRY as u64,
            "compacted: {len} bytes"
        );
        drop(first);
        let second = free_lock(&d).await;
        let mut all = second.take_previous_all("pod a", |l| l.starts_with("jobs-"));
        assert_eq!(all.len(), 8, "neither pod b's nor another group's: {all:?}");
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let want: Vec<(String, HolderToken)> = last.into_iter().map(|(l, (_, t))| (l, t)).collect();
        assert_eq!(all, want);
        assert!(
            second
                .take_previous_all("pod a", |l| l.starts_with("jobs-"))
                .is_empty(),
            "handed out once"
        );
        // Until this process records, the next one would still see the previous entries.
        second
            .record("jobs-0", "pod a", HolderToken::random())
            .expect("records");
        drop(second);
        let third = free_lock(&d).await;
        assert_eq!(
            third.take_previous_all("pod a", |_| true).len(),
            9,
            "the previous process's entries are kept until replaced"
        );
        std::fs::remove_dir_all(&d).expect("cleanup");
    }

    #[test]
    fn each_entry_parses_alone_and_a_bad_one_is_skipped() {
        let token = HolderToken::random();
        let good = entry("jobs 1", "pod a", token);
        assert_eq!(
            parse_entry(&good),
            Some((
                "jobs 1".into(),
                Recorded {
                    identity: "pod a".into(),
                    holder: token
                }
            ))
        );
        for bad in [
            String::new(),
            good[..good.len() - 1].to_owned(),
            good[..good.len() / 2].to_owned(),
            good.replace("holder ", "holder x"),
            good.replace(" 6 ", " 60 "),
            good.replace(" 6 ", " 7 "),
            entry("", "a", token),
            entry("jobs", "", token),
            entry("jobs", &"a".repeat(MAX_ENTRY), token),
        ] {
            assert_eq!(parse_entry(&bad), None, "{bad:?}");
        }
        let record = format!(
            "{MAGIC}\n{}garbage\n{}",
            entry("a", "x", token),
            entry("b", "y", token)
        );
        let (entries, skipped, current) = parse_record(&record);
        assert_eq!(entries.len(), 2);
        assert_eq!((skipped, current), (1, true));
        assert_eq!(parse_record("not a record\n").1, 1);
        assert!(parse_record("").0.is_empty());
    }

    /// A record in any other format (such as an unreleased "v1") is not read: the restart
    /// then waits for the lease, as without a record.
    #[test]
    fn a_record_of_another_format_is_not_read() {
        let token = HolderToken::random();
        let other = format!(
            "tenure-restart v1\nlease jobs\nidentity a\nholder {}\n",
            token.to_hex()
        );
        let (entries, skipped, current) = parse_record(&other);
        assert!(entries.is_empty());
        assert_eq!((skipped, current), (1, false));
    }

    #[test]
    fn file_names_are_safe() {
        assert_eq!(file_name("jobs-1.a_b"), "jobs-1.a_b.restart");
        for odd in ["a/b", "../x", ".hidden", "", "ä", &"a".repeat(201)] {
            let name = file_name(odd);
            assert!(
                name.starts_with("x-") && name.len() == 26,
                "{odd:?} → {name}"
            );
        }
        assert_ne!(file_name("a/b"), file_name("a/c"));
        // FNV-1a 64, stable across versions: a restart after an upgrade finds the same file.
        assert_eq!(file_name("a/b"), "x-e620c3190468cf61.restart");
    }

    fn mode(p: &Path) -> u32 {
        std::os::unix::fs::PermissionsExt::mode(
            &std::fs::symlink_metadata(p).expect("stat").permissions(),
        ) & 0o7777
    }

    fn set_mode(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod");
    }

    fn euid() -> u32 {
        // SAFETY: geteuid takes no arguments and cannot fail.
        unsafe { libc::geteuid() }
    }

    #[tokio::test]
    async fn a_directory_others_can_write_is_not_used_but_a_private_subdirectory_of_it() {
        let d = dir("open");
        std::fs::create_dir_all(&d).expect("mkdir");
        set_mode(&d, 0o777);
        // What a planter would leave: a record pointing elsewhere.
        let target =
            std::env::temp_dir().join(format!("tenure-restart-target-{}", std::process::id()));
        std::fs::write(&target, "precious\n").expect("write");
        std::os::unix::fs::symlink(&target, d.join(file_name("jobs"))).expect("symlink");
        let lock = free_lock(&d).await;
        let sub = d.join(format!("tenure-{}", euid()));
        assert_eq!(lock.path(), sub.join(file_name("jobs")));
        assert_eq!(mode(&sub), 0o700);
        assert_eq!(mode(lock.path()), 0o600);
        lock.record("jobs", "a", HolderToken::random())
            .expect("records");
        assert_eq!(
            std::fs::read_to_string(&target).expect("read"),
            "precious\n",
            "the planted link's target is untouched"
        );
        drop(lock);
        // The next process finds the same record.
        let again = free_lock(&d).await;
        assert!(again.take_previous("jobs", "a").is_some());
        drop(again);
        // A subdirectory that is not private is refused, naming why.
        set_mode(&sub, 0o777);
        let e = RestartLock::take(&d, "jobs", Duration::ZERO)
            .await
            .expect_err("an open subdirectory");
        assert_eq!(e.path(), sub);
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        std::fs::remove_dir_all(&d).expect("cleanup");
        std::fs::remove_file(&target).expect("cleanup");
    }

    #[tokio::test]
    async fn a_private_directory_is_used_as_it_is() {
        let d = dir("private");
        std::fs::create_dir_all(&d).expect("mkdir");
        set_mode(&d, 0o750);
        let lock = free_lock(&d).await;
        assert_eq!(lock.path(), d.join(file_name("jobs")));
        assert_eq!(mode(&d), 0o750, "left as it was");
        drop(lock);
        std::fs::remove_dir_all(&d).expect("cleanup");
    }

    #[tokio::test]
    async fn a_record_that_is_a_link_a_fifo_or_a_directory_is_refused_at_once() {
        let d = dir("special");
        std::fs::create_dir_all(&d).expect("mkdir");
        let target = d.join("target");
        std::fs::write(&target, "precious\n").expect("write");
        let record = d.join(file_name("jobs"));
        std::os::unix::fs::symlink(&target, &record).expect("symlink");
        let e = free_lock_err(&d).await;
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(
            std::fs::read_to_string(&target).expect("read"),
            "precious\n"
        );
        std::fs::remove_file(&record).expect("rm");
        let fifo = std::ffi::CString::new(record.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
        // A blocking open or read of a FIFO never returns: bounded here so the test fails.
        let e = tokio::time::timeout(Duration::from_secs(10), free_lock_err(&d))
            .await
            .expect("a FIFO must not hang the start");
        assert!(e.to_string().contains("FIFO"), "{e}");
        std::fs::remove_file(&record).expect("rm");
        std::fs::create_dir(&record).expect("mkdir");
        let e = free_lock_err(&d).await;
        assert!(e.to_string().contains("directory"), "{e}");
        std::fs::remove_dir_all(&d).expect("cleanup");
    }

    async fn free_lock_err(d: &Path) -> RestartLockError {
        RestartLock::take(d, "jobs", Duration::ZERO)
            .await
            .expect_err("refused")
    }

    #[tokio::test]
    async fn a_record_is_read_up_to_its_bound() {
        let d = dir("size");
        std::fs::create_dir_all(&d).expect("mkdir");
        let token = HolderToken::random();
        // Entries up to the bound are read; one that crosses it is cut, so skipped.
        let mut text = format!("{MAGIC}\n");
        let mut n = 0;
        loop {
            let line = entry(&format!("jobs-{n}"), "a", token);
            if (text.len() + line.len()) as u64 > MAX_RECORD {
                text.push_str(&line);
                break;
            }
            text.push_str(&line);
            n += 1;
        }
        std::fs::write(d.join(file_name("jobs")), &text).expect("write");
        let lock = free_lock(&d).await;
        let read = lock.take_previous_all("a", |_| true).len();
        assert_eq!(read, n, "every whole entry within {MAX_RECORD} bytes");
        std::fs::remove_dir_all(&d).expect("cleanup");
    }

    #[tokio::test]
    async fn an_entry_that_cannot_be_read_back_is_refused() {
        let d = dir("refused");
        let lock = free_lock(&d).await;
        let token = HolderToken::random();
        for (lease, identity) in [("jobs\n", "a"), ("jobs", "a\nb")] {
            let e = lock
                .record(lease, identity, token)
                .expect_err("a line break");
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        }
        // An entry of exactly MAX_ENTRY bytes is written; one byte more is refused.
        let fixed = entry("jobs", "", token).len();
        let longest = "i".repeat(MAX_ENTRY - fixed);
        lock.record("jobs", &longest, token)
            .expect("the longest entry");
        assert!(lock.record("jobs", &format!("{longest}i"), token).is_err());
        drop(lock);
        let next = free_lock(&d).await;
        assert_eq!(next.take_previous("jobs", &longest), Some(token));
        std::fs::remove_dir_all(&d).expect("cleanup");
    }
}
