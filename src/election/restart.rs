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
//! identity, is ignored the same way.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backend::HolderToken;

/// The most a record may hold; a longer file is not ours.
const MAX_RECORD: u64 = 4096;

/// The record's first line.
const MAGIC: &str = "tenure-restart v1";

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
/// [`LeaderElector::with_restart_lock`](super::LeaderElector::with_restart_lock)).
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
    /// The holder token the previous process recorded for this lease.
    previous: Option<Recorded>,
}

/// What a process recorded before it campaigned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Recorded {
    pub(crate) lease: String,
    pub(crate) identity: String,
    pub(crate) holder: HolderToken,
}

impl RestartLock {
    /// Takes the lock of `lease`'s record in `dir` (created if missing, mode 0700; the file
    /// 0600), waiting up to `wait` while another process holds it — e.g. a watchdog still
    /// killing the previous run's command. `Ok(None)` if it is still held then: some process
    /// of a previous run is alive (or frozen), and only the lease's expiry may end its term.
    ///
    /// # Errors
    ///
    /// [`RestartLockError`] naming the file if the directory or file cannot be made, opened or
    /// locked (a read-only file system, no permission).
    pub async fn take(
        dir: impl AsRef<Path>,
        lease: &str,
        wait: Duration,
    ) -> Result<Option<Self>, RestartLockError> {
        let dir = dir.as_ref();
        let path = dir.join(file_name(lease));
        let fail = |what: &str, e: std::io::Error| RestartLockError {
            path: path.clone(),
            message: format!("{what}: {e}"),
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| fail("cannot create its directory", e))?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| fail("cannot open it", e))?;
        let give_up = tokio::time::Instant::now() + wait;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if tokio::time::Instant::now() < give_up => {
                    tokio::time::sleep(POLL).await;
                }
                Err(TryLockError::WouldBlock) => return Ok(None),
                Err(TryLockError::Error(e)) => return Err(fail("cannot lock it", e)),
            }
        }
        let previous = read_record(&mut file, &path);
        Ok(Some(Self {
            file,
            path,
            previous,
        }))
    }

    /// The lock file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The previous process's last record, if it was for `lease` under `identity`.
    pub(crate) fn previous(&self, lease: &str, identity: &str) -> Option<HolderToken> {
        self.previous
            .as_ref()
            .filter(|r| r.lease == lease && r.identity == identity)
            .map(|r| r.holder)
    }

    /// Records `holder` as the token this process is about to campaign with, durably, before
    /// the request goes out: if the process dies after sending it, the next one must know it.
    pub(crate) fn record(
        &self,
        lease: &str,
        identity: &str,
        holder: HolderToken,
    ) -> std::io::Result<()> {
        let text = format!(
            "{MAGIC}\nlease {lease}\nidentity {identity}\nholder {}\n",
            holder.to_hex()
        );
        // One write of a few hundred bytes at offset 0 after truncating: a crash in between
        // leaves an empty or short record, which parses as nothing.
        let mut file = &self.file;
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(text.as_bytes())?;
        file.sync_data()
    }
}

impl std::os::fd::AsFd for RestartLock {
    /// The lock file's descriptor: `tenure run` lets its command and watchdog inherit it, so
    /// that the lock outlives tenure until they are gone too.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// The record in `file`, if one parses; a bad one is logged and ignored.
fn read_record(file: &mut File, path: &Path) -> Option<Recorded> {
    let mut text = String::new();
    if let Err(e) = file.take(MAX_RECORD + 1).read_to_string(&mut text) {
        tracing::warn!(path = %path.display(), error = %e, "restart record unreadable; ignored");
        return None;
    }
    if text.is_empty() {
        return None;
    }
    let parsed = parse_record(&text);
    if parsed.is_none() {
        tracing::warn!(path = %path.display(), "restart record does not parse; ignored");
    }
    parsed
}

fn parse_record(text: &str) -> Option<Recorded> {
    if text.len() as u64 > MAX_RECORD {
        return None;
    }
    let mut lines = text.strip_suffix('\n')?.split('\n');
    if lines.next()? != MAGIC {
        return None;
    }
    let lease = lines.next()?.strip_prefix("lease ")?.to_owned();
    let identity = lines.next()?.strip_prefix("identity ")?.to_owned();
    let holder = HolderToken::from_hex(lines.next()?.strip_prefix("holder ")?)?;
    if lines.next().is_some() {
        return None;
    }
    Some(Recorded {
        lease,
        identity,
        holder,
    })
}

/// The record file's name for `lease`: the name itself when it is a safe file name, else a
/// hash of it (two leases sharing a file share its lock too, which only costs the second one
/// its fast restart: the record names its lease).
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
    let hash = lease.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
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
    async fn a_record_is_read_by_the_next_holder_of_the_lock() {
        let d = dir("next");
        let first = free_lock(&d).await;
        assert_eq!(first.previous("jobs", "a"), None, "nothing recorded yet");
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
        assert_eq!(third.previous("jobs", "a"), Some(token));
        assert_eq!(third.previous("jobs", "b"), None, "another identity");
        assert_eq!(third.previous("other", "a"), None, "another lease");
        let mode = |p: &Path| {
            std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(p).expect("stat").permissions(),
            ) & 0o777
        };
        assert_eq!(mode(third.path()), 0o600);
        assert_eq!(mode(&d), 0o700);
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

    #[test]
    fn only_a_whole_record_parses() {
        let token = HolderToken::random();
        let good = format!(
            "{MAGIC}\nlease jobs\nidentity a\nholder {}\n",
            token.to_hex()
        );
        assert_eq!(
            parse_record(&good),
            Some(Recorded {
                lease: "jobs".into(),
                identity: "a".into(),
                holder: token
            })
        );
        for bad in [
            String::new(),
            good[..good.len() - 1].to_owned(),
            good[..good.len() / 2].to_owned(),
            good.replace("v1", "v2"),
            good.replace("holder ", "holder x"),
            format!("{good}extra\n"),
            format!(
                "{MAGIC}\nlease jobs\nidentity {}\nholder {}\n",
                "a".repeat(5000),
                token.to_hex()
            ),
        ] {
            assert_eq!(parse_record(&bad), None, "{bad:?}");
        }
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

    #[tokio::test]
    async fn a_record_of_the_largest_size_is_read_and_a_larger_one_is_not() {
        let d = dir("size");
        std::fs::create_dir_all(&d).expect("mkdir");
        let token = HolderToken::random();
        let record = |identity_len: usize| {
            format!(
                "{MAGIC}\nlease jobs\nidentity {}\nholder {}\n",
                "i".repeat(identity_len),
                token.to_hex()
            )
        };
        let fixed = record(0).len();
        for (len, read) in [
            (MAX_RECORD as usize, true),
            (MAX_RECORD as usize + 1, false),
        ] {
            let text = record(len - fixed);
            assert_eq!(text.len(), len);
            std::fs::write(d.join(file_name("jobs")), &text).expect("write");
            let lock = RestartLock::take(&d, "jobs", Duration::ZERO)
                .await
                .expect("takes")
                .expect("free");
            let identity = "i".repeat(len - fixed);
            assert_eq!(
                lock.previous("jobs", &identity).is_some(),
                read,
                "{len} bytes"
            );
        }
        std::fs::remove_dir_all(&d).expect("cleanup");
    }
}
