//! Opening a restart record so that nobody but this user can have put it there: in a
//! directory only this user can write, never through a symbolic link, only a regular file, and
//! without ever blocking.
//!
//! The record decides which lease a restarted process releases, and the file is created and
//! written by tenure: in a directory another user can write, a planted symbolic link would
//! make tenure truncate and overwrite the file it points to (any file, as root), and a planted
//! record would name a token of the planter's choosing. So:
//!
//! - The directory given is used when it is *private*: owned by this process's effective user
//!   and writable by nobody else (no group or other write bit). A missing one is created 0700.
//! - A directory that is not private (a Kubernetes `emptyDir` is 0777) gets a private
//!   subdirectory, `tenure-<uid>`, made 0700 and used instead; one that exists and is not
//!   private (someone else made it, or opened it up) is refused.
//! - Everything below the directory is reached through its descriptor (`openat`), so a
//!   directory renamed or replaced after it was checked changes nothing.
//! - The record is opened with `O_NOFOLLOW` (a symbolic link is refused, never followed) and
//!   `O_NONBLOCK` (a FIFO cannot hang the open), and must be a regular file owned by this
//!   user.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Why a record could not be opened: the path it concerns and what was wrong.
#[derive(Debug)]
pub(super) struct OpenError {
    pub(super) path: PathBuf,
    pub(super) message: String,
}

/// The record file `name` in `dir` (or in its private subdirectory), opened for reading and
/// writing, created 0600 if missing; and the path it was found at.
pub(super) fn open_record(dir: &Path, name: &str) -> Result<(File, PathBuf), OpenError> {
    let fail = |path: &Path, message: String| OpenError {
        path: path.to_owned(),
        message,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| fail(dir, format!("cannot create its directory: {e}")))?;
    // The directory the user named may be reached through symbolic links (their choice of
    // path); what counts is what it is once opened.
    let given = open_dir(None, dir.as_os_str().as_bytes(), false)
        .map_err(|e| fail(dir, format!("cannot open the directory: {e}")))?;
    let euid = effective_uid();
    let (dir_fd, dir_path) = match check_private(&given, euid) {
        Ok(()) => (given, dir.to_owned()),
        Err(why) => {
            let sub = format!("tenure-{euid}");
            let sub_path = dir.join(&sub);
            if let Err(e) = make_dir(&given, &sub)
                && e.kind() != io::ErrorKind::AlreadyExists
            {
                return Err(fail(
                    &sub_path,
                    format!(
                        "the directory is not private ({why}) and a private subdirectory \
                         cannot be made in it: {e}"
                    ),
                ));
            }
            let sub_fd = open_dir(Some(&given), sub.as_bytes(), true)
                .map_err(|e| fail(&sub_path, format!("cannot open it: {e}")))?;
            check_private(&sub_fd, euid).map_err(|why| {
                fail(
                    &sub_path,
                    format!(
                        "refused: the restart record's directory must be owned by uid {euid} \
                         and writable by nobody else, and this one is {why} (remove it, or \
                         give --restart-dir a private directory)"
                    ),
                )
            })?;
            tracing::debug!(
                dir = %dir.display(),
                reason = %why,
                "restart directory not private: using its private subdirectory"
            );
            (sub_fd, sub_path)
        }
    };
    let path = dir_path.join(name);
    let file = open_file(&dir_fd, name).map_err(|e| {
        let message = if e.raw_os_error() == Some(libc::ELOOP) {
            "refused: it is a symbolic link (a restart record must be a regular file)".to_owned()
        } else {
            format!("cannot open it: {e}")
        };
        fail(&path, message)
    })?;
    let meta = file
        .metadata()
        .map_err(|e| fail(&path, format!("cannot stat it: {e}")))?;
    if !meta.file_type().is_file() {
        return Err(fail(
            &path,
            format!(
                "refused: it is a {}, not a regular file",
                kind(meta.file_type())
            ),
        ));
    }
    if std::os::unix::fs::MetadataExt::uid(&meta) != euid {
        return Err(fail(
            &path,
            format!(
                "refused: it is owned by uid {}, not by this process's uid {euid}",
                std::os::unix::fs::MetadataExt::uid(&meta)
            ),
        ));
    }
    Ok((file, path))
}

/// Whether the open directory `dir` is owned by `euid` and writable by nobody else; if not,
/// what it is instead.
fn check_private(dir: &OwnedFd, euid: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = File::from(dir.try_clone().map_err(|e| e.to_string())?)
        .metadata()
        .map_err(|e| format!("not readable ({e})"))?;
    let (uid, mode) = (meta.uid(), meta.mode() & 0o7777);
    if uid != euid {
        return Err(format!("owned by uid {uid}, mode {mode:04o}"));
    }
    if mode & 0o022 != 0 {
        return Err(format!("writable by group or others (mode {mode:04o})"));
    }
    Ok(())
}

fn kind(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

fn c_path(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))
}

/// Makes the directory `name` (mode 0700) in the directory `at`.
fn make_dir(at: &OwnedFd, name: &str) -> io::Result<()> {
    let c = c_path(name.as_bytes())?;
    // SAFETY: `at` is an open directory descriptor borrowed for the call and `c` a
    // NUL-terminated string that outlives it; mkdirat only reads them.
    if unsafe { libc::mkdirat(at.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Opens the directory `name` (relative to `at`, or as a path), refusing a symbolic link as
/// its last component when `no_follow`.
fn open_dir(at: Option<&OwnedFd>, name: &[u8], no_follow: bool) -> io::Result<OwnedFd> {
    let c = c_path(name)?;
    let mut flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    if no_follow {
        flags |= libc::O_NOFOLLOW;
    }
    let at = at.map_or(libc::AT_FDCWD, AsRawFd::as_raw_fd);
    // SAFETY: `at` is AT_FDCWD or an open descriptor borrowed for the call, `c` a
    // NUL-terminated string that outlives it; openat returns a new descriptor or -1.
    let fd = unsafe { libc::openat(at, c.as_ptr(), flags) };
    owned(fd)
}

/// Opens (or creates, 0600) the regular file `name` in the directory `dir`: never through a
/// symbolic link, never blocking (a FIFO opens at once and is refused by the caller).
fn open_file(dir: &OwnedFd, name: &str) -> io::Result<File> {
    let c = c_path(name.as_bytes())?;
    let flags =
        libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: `dir` is an open descriptor borrowed for the call, `c` a NUL-terminated string
    // that outlives it; the mode is passed as the variadic argument O_CREAT requires.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, 0o600 as libc::c_uint) };
    owned(fd).map(File::from)
}

/// Takes ownership of a descriptor a system call just returned (or reports the call's error).
fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by a successful openat that created it; nothing else
    // owns it, so the OwnedFd becomes its only owner and closes it once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The effective user id: the owner of the files this process creates.
fn effective_uid() -> u32 {
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}
