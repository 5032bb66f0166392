//! Group membership in the state directory, for sharded leadership ([`crate::shard`]).
//!
//! Group `G` is the directory `<dir>/groups/G/` (mode 0700), with one file per member,
//! `<h>.member`, where `<h>` is the FNV-1a 128-bit hash of the identity in 32 hex digits (any
//! identity makes a safe file name). A member file is a few `key value` lines, `record` the
//! member record every backend stores ([`Member::encode`]):
//!
//! ```text
//! tenure-local-member v2
//! boot 0c6e1f3a-5b2d-4c47-9d8e-3f1a2b4c5d6e
//! expires 81234567890123
//! identity web-1-4242
//! record m1:8:1767225600123:1,5
//! end
//! ```
//!
//! `expires` is `CLOCK_MONOTONIC` nanoseconds of the boot `boot` (the lease records' clock): a
//! member is live while both hold. Announcements replace the file by `rename` from
//! `.<h>.<random>.tmp`; withdrawals remove it. Every change of a group (announce, withdraw,
//! removing expired files) runs under an exclusive `flock` of `G/.lock`, so a file is never
//! removed as expired just as its member renews it. Readers take no lock (files are replaced
//! atomically); a reader that finds expired files removes them if the lock is free.
//!
//! Anything but a regular file under a `.member` name (a symbolic link, a FIFO) and any file
//! that does not parse is skipped with a warning, never an error of the whole group; the group
//! directories themselves must be real directories (not symbolic links) owned by this user.

use std::fmt::Write as _;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use tokio::sync::watch;

use super::record::{Fields, escape, unescape};
use super::store::{Store, backoff, deadline, io_error, not_regular, now_ns};
use super::sys;
use super::watch::{FALLBACK_POLL, Hub};
use crate::backend::{BackendError, BackendErrorKind, Member};

/// The first line of every member file: the format and its version.
const MAGIC: &str = "tenure-local-member v2";
/// The longest member file read or written: the longest member record, with room for the
/// other lines (an escaped identity of at most `MAX_IDENTITY_LEN` bytes among them).
const MAX_FILE: u64 = crate::backend::MAX_MEMBER_RECORD as u64 + 16 * 1024;
/// How long a change waits for another process's critical section on the same group.
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// The name of a group's lock file (hidden: never taken for a member).
const LOCK_FILE: &str = ".lock";
/// The suffix of member files.
const SUFFIX: &str = ".member";

/// One member file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct MemberFile {
    boot: String,
    expires_ns: u64,
    member: Member,
}

impl MemberFile {
    fn live(&self, boot: &str, now_ns: u64) -> bool {
        self.boot == boot && self.expires_ns > now_ns
    }

    fn encode(&self) -> String {
        let m = &self.member;
        let mut s = String::with_capacity(128);
        // Writing to a String cannot fail.
        let _ = writeln!(s, "{MAGIC}");
        let _ = writeln!(s, "boot {}", self.boot);
        let _ = writeln!(s, "expires {}", self.expires_ns);
        let _ = writeln!(s, "identity {}", escape(&m.identity));
        let _ = writeln!(s, "record {}", m.encode());
        s.push_str("end\n");
        s
    }

    fn parse(text: &str) -> Result<Self, String> {
        let mut fields = Fields::open(text, MAGIC)?;
        fn number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("`{key}` is not an unsigned integer: {v:?}"));
            }
            v.parse()
                .map_err(|_| format!("`{key}` is out of range: {v:?}"))
        }
        let boot = fields.boot()?;
        let expires_ns = number("expires", &fields.next("expires")?)?;
        let identity = unescape(&fields.next("identity")?)?;
        let member = Member::decode(identity, fields.next("record")?.as_bytes())
            .map_err(|why| format!("`record`: {why}"))?;
        fields.finish()?;
        Ok(Self {
            boot,
            expires_ns,
            member,
        })
    }
}

/// The FNV-1a 128-bit hash of `identity`, in 32 hex digits: the stem of its member file.
fn file_stem(identity: &str) -> String {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut h = OFFSET;
    for b in identity.as_bytes() {
        h ^= u128::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    format!("{h:032x}")
}

/// `<dir>/groups/<group>`.
pub(super) fn group_dir(store: &Store, group: &str) -> PathBuf {
    store.dir().join("groups").join(group)
}

/// Creates `<dir>/groups/<group>` if it is missing (mode 0700), and checks that it and
/// `<dir>/groups` are real directories of this user. A reader calls it too, so that there is
/// a directory to watch.
pub(super) fn ensure_group_dir(store: &Store, group: &str) -> Result<PathBuf, BackendError> {
    store.ensure_dir()?;
    let dir = group_dir(store, group);
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| io_error("create the group directory", &dir, &e))?;
    for d in [store.dir().join("groups"), dir.clone()] {
        check_group_dir(&d)?;
    }
    Ok(dir)
}

/// Refuses anything but a directory of this user's that no one else may write to, reached
/// without a symbolic link.
fn check_group_dir(dir: &Path) -> Result<(), BackendError> {
    let meta =
        fs::symlink_metadata(dir).map_err(|e| io_error("inspect the group directory", dir, &e))?;
    let why = if meta.file_type().is_symlink() {
        "it is a symbolic link".to_owned()
    } else if !meta.is_dir() {
        "it is not a directory".to_owned()
    } else if meta.uid() != sys::effective_uid() {
        format!("it is owned by uid {}", meta.uid())
    } else if meta.mode() & 0o002 != 0 {
        "it is writable by every user".to_owned()
    } else {
        return Ok(());
    };
    Err(BackendError::new(
        BackendErrorKind::PermissionDenied,
        format!(
            "refusing the group directory {}: {why} (move it aside; the next announcement \
             creates it anew)",
            dir.display()
        ),
    ))
}

/// Takes the group's file lock (`wait`: up to [`LOCK_WAIT`], unless the caller gave up;
/// otherwise only if it is free at once: `None` when it is not).
pub(super) fn lock_group(
    dir: &Path,
    wait: bool,
    abandoned: &AtomicBool,
) -> Result<Option<File>, BackendError> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| io_error("open the group lock file", &path, &e))?;
    if let Some(why) = not_regular(&file, &path)? {
        return Err(BackendError::new(
            BackendErrorKind::Protocol,
            format!(
                "refusing the group lock file {}: {why} (move it aside)",
                path.display()
            ),
        ));
    }
    let give_up = Instant::now() + LOCK_WAIT;
    let mut spins = 0u32;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Some(file)),
            Err(fs::TryLockError::WouldBlock) if !wait => return Ok(None),
            Err(fs::TryLockError::WouldBlock) => {
                if abandoned.load(Ordering::Relaxed) {
                    return Err(BackendError::new(
                        BackendErrorKind::Timeout,
                        "the request was abandoned before it ran",
                    ));
                }
                if Instant::now() >= give_up {
                    return Err(BackendError::new(
                        BackendErrorKind::Timeout,
                        format!(
                            "{} stayed locked for {LOCK_WAIT:?}: a process may be stopped in \
                             the middle of an update",
                            path.display()
                        ),
                    ));
                }
                backoff(&mut spins);
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_error("lock", &path, &e)),
        }
    }
}

/// What one file in a group directory turned out to be.
enum Entry {
    Member(MemberFile),
    /// Not a member file of ours: why (warned about by the reader).
    Skipped(String),
}

/// Reads the member file `path`, refusing anything but a regular file (a symbolic link fails
/// to open with `O_NOFOLLOW`; a FIFO must not block the reader).
fn read_file(path: &Path) -> Result<Option<Entry>, BackendError> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Ok(Some(Entry::Skipped("a symbolic link".to_owned())));
        }
        Err(e) => return Err(io_error("open the member file", path, &e)),
    };
    if let Some(why) = not_regular(&file, path)? {
        return Ok(Some(Entry::Skipped(why)));
    }
    let mut bytes = Vec::with_capacity(256);
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error("read the member file", path, &e))?;
    if bytes.len() as u64 > MAX_FILE {
        return Ok(Some(Entry::Skipped(
            "larger than any member file".to_owned(),
        )));
    }
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return Ok(Some(Entry::Skipped("not UTF-8 text".to_owned())));
    };
    Ok(Some(match MemberFile::parse(text) {
        Ok(m) => Entry::Member(m),
        Err(why) => Entry::Skipped(why),
    }))
}

/// The member files of a group directory: (file name, path) of every `<h>.member`.
fn member_paths(dir: &Path) -> Result<Vec<(String, PathBuf)>, BackendError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("list the group directory", dir, &e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error("list the group directory", dir, &e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.starts_with('.') || !name.ends_with(SUFFIX) {
            continue;
        }
        out.push((name, entry.path()));
    }
    Ok(out)
}

/// Removes the expired member files of a group; the caller holds the group's lock.
fn prune(store: &Store, dir: &Path, now: u64) -> Result<(), BackendError> {
    for (_, path) in member_paths(dir)? {
        if let Some(Entry::Member(m)) = read_file(&path)?
            && !m.live(store.boot(), now)
        {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("remove the expired member file", &path, &e)),
            }
        }
    }
    Ok(())
}

/// Announces `member` in `group` until `ttl` from now on `CLOCK_MONOTONIC`.
pub(super) fn announce(
    store: &Store,
    group: &str,
    member: &Member,
    ttl: Duration,
    abandoned: &AtomicBool,
) -> Result<(), BackendError> {
    // The record's own bound, checked before anything is written.
    member.record()?;
    let dir = ensure_group_dir(store, group)?;
    let _lock = lock_group(&dir, true, abandoned)?;
    let now = now_ns()?;
    let file = MemberFile {
        boot: store.boot().to_owned(),
        expires_ns: deadline(now, ttl),
        member: member.clone(),
    };
    let text = file.encode();
    let stem = file_stem(&member.identity);
    let path = dir.join(format!("{stem}{SUFFIX}"));
    if text.len() as u64 > MAX_FILE {
        return Err(BackendError::new(
            BackendErrorKind::Config,
            format!(
                "refusing to write the member file {}: it would be {} bytes, over the \
                 {MAX_FILE} a member file may have",
                path.display(),
                text.len()
            ),
        ));
    }
    let tmp = dir.join(format!(".{stem}.{:016x}.tmp", crate::util::random_u64()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| io_error("create", &tmp, &e))?;
        f.write_all(text.as_bytes())
            .map_err(|e| io_error("write", &tmp, &e))?;
        drop(f);
        fs::rename(&tmp, &path).map_err(|e| io_error("replace the member file", &path, &e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    // Announcements come every third of a lease from every live member: the expired files
    // of members that stopped go with them.
    prune(store, &dir, now)
}

/// Removes `identity` from `group`; nothing to do when it is not there.
pub(super) fn withdraw(
    store: &Store,
    group: &str,
    identity: &str,
    abandoned: &AtomicBool,
) -> Result<(), BackendError> {
    let dir = group_dir(store, group);
    match fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error("inspect the group directory", &dir, &e)),
        Ok(_) => {}
    }
    store.ensure_dir()?;
    check_group_dir(&store.dir().join("groups"))?;
    check_group_dir(&dir)?;
    let _lock = lock_group(&dir, true, abandoned)?;
    let path = dir.join(format!("{}{SUFFIX}", file_stem(identity)));
    // Only this identity's own file goes (never another's that happens to share its hash).
    let ours = match read_file(&path)? {
        None => return Ok(()),
        Some(Entry::Member(m)) => m.member.identity == identity,
        Some(Entry::Skipped(_)) => true,
    };
    if ours {
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error("remove the member file", &path, &e)),
        }
    }
    Ok(())
}

/// One read of a group.
#[derive(Debug)]
pub(super) struct GroupRead {
    /// The live members, sorted by identity.
    pub(super) members: Vec<Member>,
    /// How long until the earliest live announcement runs out.
    pub(super) next_expiry: Option<Duration>,
    /// Files skipped: (file name, why).
    pub(super) skipped: Vec<(String, String)>,
}

/// Reads the live members of `group`; removes expired files if nobody is changing the group.
pub(super) fn read(store: &Store, group: &str) -> Result<GroupRead, BackendError> {
    let dir = group_dir(store, group);
    match fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error("inspect the group directory", &dir, &e)),
        Ok(_) => {
            check_group_dir(&store.dir().join("groups"))?;
            check_group_dir(&dir)?;
        }
    }
    let paths = member_paths(&dir)?;
    let now = now_ns()?;
    let mut members: Vec<(Member, u64)> = Vec::with_capacity(paths.len());
    let mut skipped = Vec::new();
    let mut expired = false;
    for (name, path) in paths {
        match read_file(&path)? {
            None => {}
            Some(Entry::Skipped(why)) => skipped.push((name, why)),
            Some(Entry::Member(m)) if m.live(store.boot(), now) => {
                members.push((m.member, m.expires_ns));
            }
            Some(Entry::Member(_)) => expired = true,
        }
    }
    if expired {
        // Best effort: a busy lock means someone is changing the group, and pruning with it.
        let tidy = lock_group(&dir, false, &AtomicBool::new(false))
            .and_then(|lock| lock.map_or(Ok(()), |_lock| prune(store, &dir, now)));
        if let Err(e) = tidy {
            tracing::debug!(group, error = %e, "could not remove expired member files");
        }
    }
    members.sort_by(|a, b| a.0.identity.cmp(&b.0.identity).then(b.1.cmp(&a.1)));
    // The same identity twice (two files hashing apart cannot hold one identity, but a copied
    // file can): the later expiry wins.
    members.dedup_by(|later, kept| later.0.identity == kept.0.identity);
    let next_expiry = members
        .iter()
        .map(|(_, until)| until - now)
        .min()
        .map(Duration::from_nanos);
    Ok(GroupRead {
        members: members.into_iter().map(|(m, _)| m).collect(),
        next_expiry,
        skipped,
    })
}

/// The members stream of `group` (a valid name): the live set, then the set again whenever
/// it changed, read on every change of the group's directory (inotify) and when the earliest
/// announcement runs out.
pub(super) fn stream(
    hub: Arc<Hub>,
    store: Arc<Store>,
    group: &str,
) -> BoxStream<'static, Result<Vec<Member>, BackendError>> {
    let changed = hub.subscribe_group(group);
    let follow = Follow {
        hub,
        store,
        group: group.to_owned(),
        changed,
        notified: true,
        last: None,
        stale: true,
        watched: false,
        next_expiry: None,
        backoff: None,
        skipped: Vec::new(),
    };
    Box::pin(futures::stream::unfold(follow, |mut f| async move {
        let item = f.next().await;
        Some((item, f))
    }))
}

/// The state behind one members stream.
struct Follow {
    hub: Arc<Hub>,
    store: Arc<Store>,
    group: String,
    /// Bumped by the watcher thread on every change of the group's directory.
    changed: watch::Receiver<u64>,
    /// `changed` still has a sender (the hub keeps it while this stream lives).
    notified: bool,
    /// The set emitted last; `None` before the first.
    last: Option<Vec<Member>>,
    /// The group must be read again.
    stale: bool,
    /// The group's directory was watched at the last read; without a watch, poll.
    watched: bool,
    /// When the earliest live announcement runs out.
    next_expiry: Option<tokio::time::Instant>,
    /// After a failed read, when to try again (and the pause used).
    backoff: Option<(tokio::time::Instant, Duration)>,
    /// What the last read skipped, so each is warned about once.
    skipped: Vec<(String, String)>,
}

impl Follow {
    async fn next(&mut self) -> Result<Vec<Member>, BackendError> {
        loop {
            if self.stale {
                if let Some((at, _)) = self.backoff {
                    tokio::time::sleep_until(at).await;
                }
                match self.refresh().await {
                    Ok(Some(set)) => return Ok(set),
                    Ok(None) => {}
                    Err(e) => {
                        let pause = self
                            .backoff
                            .map_or(FALLBACK_POLL, |(_, p)| (p * 2).min(Duration::from_secs(1)));
                        self.backoff = Some((tokio::time::Instant::now() + pause, pause));
                        return Err(e);
                    }
                }
            }
            let (next_expiry, watched) = (self.next_expiry, self.watched && self.notified);
            let expiry = async {
                match next_expiry {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let poll = async {
                if watched {
                    std::future::pending().await
                } else {
                    tokio::time::sleep(FALLBACK_POLL).await;
                }
            };
            tokio::select! {
                changed = self.changed.changed(), if self.notified => {
                    self.notified = changed.is_ok();
                }
                () = expiry => {}
                () = poll => {}
            }
            self.stale = true;
        }
    }

    /// Reads the group (watching its directory first); the set if it differs from the last
    /// one emitted.
    async fn refresh(&mut self) -> Result<Option<Vec<Member>>, BackendError> {
        // Seen before the read: a change after this point wakes the stream again.
        self.changed.borrow_and_update();
        let (hub, store, group) = (self.hub.clone(), self.store.clone(), self.group.clone());
        let (read, watched) = tokio::task::spawn_blocking(move || {
            let dir = ensure_group_dir(&store, &group)?;
            let watched = hub.watch_group(&group, &dir);
            read(&store, &group).map(|r| (r, watched))
        })
        .await
        .unwrap_or_else(|e| {
            Err(BackendError::new(
                BackendErrorKind::Unavailable,
                format!("reading a local membership group did not complete: {e}"),
            ))
        })?;
        self.stale = false;
        self.backoff = None;
        self.watched = watched;
        self.next_expiry = read.next_expiry.map(|d| tokio::time::Instant::now() + d);
        for (file, why) in &read.skipped {
            if !self.skipped.iter().any(|(f, w)| f == file && w == why) {
                tracing::warn!(
                    group = %self.group,
                    file = %group_dir(&self.store, &self.group).join(file).display(),
                    reason = %why,
                    "skipping a malformed group member file"
                );
            }
        }
        self.skipped = read.skipped;
        if self.last.as_ref() == Some(&read.members) {
            return Ok(None);
        }
        self.last = Some(read.members.clone());
        Ok(Some(read.members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> MemberFile {
        MemberFile {
            boot: "0c6e1f3a-5b2d-4c47-9d8e-3f1a2b4c5d6e".into(),
            expires_ns: 81_234_567_890_123,
            member: Member {
                identity: "we\\ird\nname é".into(),
                shards: 8,
                joined_ms: 1_767_225_600_123,
                holds: vec![1, 5],
            },
        }
    }

    #[test]
    fn member_files_should_round_trip_and_reject_truncations() {
        let f = sample();
        let text = f.encode();
        assert_eq!(MemberFile::parse(&text), Ok(f.clone()));
        let mut none = f.clone();
        none.member.holds.clear();
        assert_eq!(MemberFile::parse(&none.encode()), Ok(none));
        for cut in 0..text.len() {
            if text.is_char_boundary(cut) {
                assert!(MemberFile::parse(&text[..cut]).is_err(), "accepted {cut}");
            }
        }
        for (from, to) in [
            ("record m1:8:", "record m1:-8:"),
            ("record m1:8:", "record m1:+8:"),
            (":1,5", ":1,x"),
            (":1767225600123:", "::"),
            ("record m1:8:", "record m1:4294967296:"),
            ("record m1", "record m2"),
            ("expires 8", "expires -8"),
        ] {
            assert!(
                MemberFile::parse(&text.replace(from, to)).is_err(),
                "{to:?} accepted"
            );
        }
        assert!(MemberFile::parse(&text.replace("record", "bogus 1\nrecord")).is_err());
    }

    #[test]
    fn member_files_should_be_live_only_in_their_boot_and_before_expiry() {
        let f = sample();
        assert!(f.live(&f.boot, f.expires_ns - 1));
        assert!(!f.live(&f.boot, f.expires_ns));
        assert!(!f.live("another-boot", 0));
    }

    #[test]
    fn file_stems_should_be_32_hex_digits_and_differ() {
        let a = file_stem("pod-a");
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, file_stem("pod-b"));
        assert_eq!(a, file_stem("pod-a"));
        // The published FNV-1a 128 test vector of the empty string is the offset basis.
        assert_eq!(file_stem(""), "6c62272e07bb014262b821756295c58d");
    }
}
