//! `--restart-dir`: the [`RestartLock`] of `tenure run`, held by tenure, its watchdog and the
//! command alike, so that a restarted tenure finds it free only once all three are gone.

use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use tenure::election::RestartLock;

use crate::args::RunArgs;
use crate::error::CliError;

/// How long a restarted tenure waits for the lock: enough for the previous run's watchdog to
/// kill its command and exit (milliseconds), short enough not to delay a normal start much.
const WAIT: Duration = Duration::from_secs(1);

/// Takes the lock in `args.restart_dir` named after `lease` (a sharded replica's: its group),
/// made inheritable; `None` without `--restart-dir`, or while a live or frozen process of the
/// previous run holds it (then nothing changes: the leases expire as usual).
pub async fn take(args: &RunArgs, lease: &str) -> Result<Option<RestartLock>, CliError> {
    let Some(dir) = &args.restart_dir else {
        return Ok(None);
    };
    if args.identity.is_none() && std::env::var_os("POD_NAME").is_none_or(|p| p.is_empty()) {
        // The record names the identity that campaigned; the next process must have the same.
        tracing::warn!(
            "--restart-dir without --identity or $POD_NAME: the default identity \
             (<hostname>-<pid>) changes with every process, so a restart can never match its \
             record and always waits for the lease; set --identity to this replica's stable name"
        );
    }
    let lock = RestartLock::take(dir, lease, WAIT)
        .await
        .map_err(|e| CliError::Config {
            message: format!("--restart-dir: {e}"),
        })?;
    let Some(lock) = lock else {
        tracing::info!(
            dir = %dir.display(),
            "another process of this replica still holds the restart lock (alive or frozen): waiting for the lease as usual"
        );
        return Ok(None);
    };
    inherit(&lock).map_err(|e| CliError::Config {
        message: format!("--restart-dir: {}: {e}", lock.path().display()),
    })?;
    Ok(Some(lock))
}

/// Lets every process tenure starts (the command, the watchdog) inherit the lock file's
/// descriptor, so that the lock is held until the last of them is gone: a command whose
/// tenure was killed still holds it until the watchdog or the parent-death signal has killed
/// it. (A command that closes the descriptor or passes it to a daemon changes only how long
/// the lock stays held, never that a live tenure or watchdog holds it.)
fn inherit(lock: &RestartLock) -> std::io::Result<()> {
    let fd = lock.as_fd().as_raw_fd();
    // SAFETY: fcntl on a descriptor we own (borrowed from the lock, which outlives the call)
    // only reads and sets its descriptor flags; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
