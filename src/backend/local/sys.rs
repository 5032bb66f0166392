//! The few Linux system calls the local backend needs that std does not wrap, each wrapped once
//! with its safety argument.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// Nanoseconds of `CLOCK_MONOTONIC`: the clock std's and tokio's `Instant` read on Linux, the
/// same for every process on the host (within one time namespace), paused during suspend.
pub(super) fn monotonic_ns() -> io::Result<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec that outlives the call; clock_gettime writes
    // only into it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let secs = u64::try_from(ts.tv_sec).map_err(|_| io::Error::other("negative monotonic time"))?;
    let nanos =
        u64::try_from(ts.tv_nsec).map_err(|_| io::Error::other("negative monotonic time"))?;
    Ok(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
}

/// The real user id of this process (for the per-user default directory).
pub(super) fn real_uid() -> u32 {
    // SAFETY: getuid takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::getuid() }
}

/// The effective user id: the owner of the files this process creates.
pub(super) fn effective_uid() -> u32 {
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// Takes ownership of a descriptor a system call just returned (or reports the call's error).
fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by a successful system call that created it; nothing
    // else owns it, so the OwnedFd becomes its only owner and closes it once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A non-blocking inotify instance.
pub(super) fn inotify_init() -> io::Result<File> {
    // SAFETY: inotify_init1 takes only flags and returns a new descriptor or -1.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    owned(fd).map(File::from)
}

/// Watches directory `dir` for `mask`; returns the watch descriptor.
pub(super) fn inotify_add_watch(inotify: &File, dir: &Path, mask: u32) -> io::Result<i32> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: `path` is a NUL-terminated string that outlives the call; the descriptor is
    // kept open by `inotify` for the duration of the call.
    let wd = unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), path.as_ptr(), mask) };
    if wd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(wd)
}

/// Removes a watch; errors (the watch is already gone) are ignored.
pub(super) fn inotify_rm_watch(inotify: &File, wd: i32) {
    // SAFETY: only integers are passed; the descriptor is kept open by `inotify`.
    let _ = unsafe { libc::inotify_rm_watch(inotify.as_raw_fd(), wd) };
}

/// A non-blocking eventfd, used to wake (and stop) the watcher thread.
pub(super) fn eventfd() -> io::Result<File> {
    // SAFETY: eventfd takes only an initial value and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    owned(fd).map(File::from)
}

/// Which descriptors [`poll2`] found readable.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Ready {
    pub(super) first: bool,
    pub(super) second: bool,
}

/// Waits until `first` (optional) or `second` is readable, or `timeout_ms` passed (-1: no
/// timeout). Interrupted waits are retried.
pub(super) fn poll2(first: Option<&File>, second: &File, timeout_ms: i32) -> io::Result<Ready> {
    let mut fds = [
        libc::pollfd {
            // A negative descriptor is ignored by poll.
            fd: first.map_or(-1, AsRawFd::as_raw_fd),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: second.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfd structs that outlives the call, and the
        // length passed matches it; the descriptors are kept open by the borrowed files.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if rc >= 0 {
            let readable = |p: &libc::pollfd| p.revents & (libc::POLLIN | libc::POLLERR) != 0;
            return Ok(Ready {
                first: readable(&fds[0]),
                second: readable(&fds[1]),
            });
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}
