//! The watchdog: kills the command's process group when the lease's validity runs out on the
//! monotonic clock, whether or not tenure is still running to do it.
//!
//! Two halves, each enough on its own:
//!
//! - **A thread in tenure** ([`Watchdog`]). After a SIGSTOP/SIGCONT past the lease every task
//!   of the runtime wakes at once, in whatever order the scheduler picks; the thread sleeps on
//!   an *absolute* `CLOCK_MONOTONIC` deadline (`clock_nanosleep(TIMER_ABSTIME)`), which returns
//!   the moment the process resumes, and its first act is the SIGKILL.
//! - **A process beside the command** (`tenure __watchdog`, [`process_main`]). The command runs
//!   in its own process group, so freezing tenure alone (`kill -STOP`, a debugger, a stuck
//!   tenure) does not freeze the command: without help it would keep running while another
//!   replica takes over. The watchdog process joins the command's process group and kills the
//!   group when the deadline passes without an extension, or when its stdin pipe closes
//!   because tenure died. Being in the command's
//!   group, it is frozen or killed exactly when the command is.
//!
//! Both halves read the deadline from the term's [`DeadlineCell`], which tenure moves on
//! every renewal as it records it: neither half can hold a deadline that renewals have
//! already moved, however late a thread runs under CPU load.
//!
//! The command shares its group with the watchdog process, so whatever the command sends its
//! group (`kill -USR1 0` to reopen logs, a stray `kill -ALRM 0`) reaches the watchdog too. The
//! process therefore blocks **every** signal that can be blocked, real-time ones and the two
//! glibc reserves included, from before it joins the group (in the forked child, before
//! `exec`; a blocked mask survives `exec`) until it exits: a signal the command sends the
//! group stays pending and never runs a default action. What still reaches it: SIGKILL, which
//! kills the command's whole group with it, and SIGSTOP, which stops the command with it.
//! A watchdog process killed by its pid alone (`pkill -f __watchdog`) is started again by
//! tenure while tenure runs.
//!
//! The thread guards any number of process groups at once, each with its own deadline (one
//! per shard with `tenure run --shards`), and each group has its own watchdog process.
//!
//! `CLOCK_MONOTONIC` is one clock for every process on the machine and keeps running while a
//! process is stopped, so both halves count the time tenure was frozen.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use crate::error::CliError;
use crate::process::child::{ProcessGroup, signal_group};
use crate::process::deadline::{DeadlineCell, inherit_in_child, now_ns};
use crate::process::reaper;

/// The hidden subcommand that runs [`process_main`].
pub const SUBCOMMAND: &str = "__watchdog";

/// The in-process half: a thread that SIGKILLs each armed process group when its deadline
/// passes, and starts each group's watchdog process.
#[derive(Clone)]
pub struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    /// The armed groups, by process group id.
    armed: Mutex<HashMap<libc::pid_t, Arm>>,
    changed: Condvar,
}

struct Arm {
    /// The pid of the group's watchdog process, to tell its exit from a replacement's.
    process: libc::pid_t,
    /// The group's deadline, moved by renewals; shared with the watchdog process.
    cell: Arc<DeadlineCell>,
    /// The watchdog process's stdin: it kills the group when this closes.
    _feed: File,
}

impl Watchdog {
    /// Starts the watchdog thread (disarmed). The thread lives as long as the process.
    pub fn start() -> io::Result<Self> {
        let shared = Arc::new(Shared {
            armed: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
        });
        let thread_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("tenure-watchdog".into())
            .spawn(move || watch(&thread_shared))?;
        Ok(Self { shared })
    }

    /// Arms the watchdog for `group`: starts the group's watchdog process, and kills the
    /// group once `cell`'s deadline is in the past. Other armed groups are left as they are.
    pub fn arm(&self, group: &ProcessGroup, cell: Arc<DeadlineCell>) -> Result<(), CliError> {
        let (feed, process) = spawn_process(self, group.id(), &cell)?;
        self.lock().insert(
            group.id(),
            Arm {
                process,
                cell,
                _feed: feed,
            },
        );
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Disarms it for `group` (the term ended and the group was dealt with). Closing the
    /// feed makes the watchdog process kill the group, which by then is empty or about to be.
    pub fn disarm(&self, group: libc::pid_t) {
        self.lock().remove(&group);
        self.shared.changed.notify_all();
    }

    /// The watchdog process `process` of `group` exited. While the watchdog is still armed for
    /// that group and the group still has members, something killed the process by its pid
    /// (every group signal but SIGKILL is blocked, and SIGKILL would have taken the group
    /// with it): start another, so that a frozen or killed tenure still cannot leave the
    /// command running.
    fn process_exited(&self, group: libc::pid_t, process: libc::pid_t) {
        let mut armed = self.lock();
        let Some(arm) = armed.get_mut(&group) else {
            return;
        };
        if arm.process != process || !signal_group(group, 0) {
            return;
        }
        match spawn_process(self, group, &arm.cell) {
            Ok((feed, process)) => {
                tracing::warn!(
                    group,
                    "the watchdog process was killed while the command runs; started another"
                );
                arm._feed = feed;
                arm.process = process;
                drop(armed);
                self.shared.changed.notify_all();
            }
            // The group is gone by now (setpgid found no such group), or tenure cannot fork:
            // the watchdog thread still guards the deadline while tenure runs.
            Err(e) => tracing::warn!(group, "cannot restart the watchdog process: {e}"),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<libc::pid_t, Arm>> {
        self.shared
            .armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn watch(shared: &Shared) {
    // Bound each sleep (200 ms) so that a group armed meanwhile is looked at soon: the sleep
    // below is on the clock, not on the condition variable.
    const MAX_SLEEP_NS: u64 = 200_000_000;
    loop {
        let mut armed = shared.armed.lock().unwrap_or_else(PoisonError::into_inner);
        while armed.is_empty() {
            armed = shared
                .changed
                .wait(armed)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let now = now_ns();
        let mut wake = now.saturating_add(MAX_SLEEP_NS);
        armed.retain(|&group, arm| {
            let deadline = arm.cell.deadline_ns();
            if now >= deadline {
                // Reported before the kill, for the supervisor to read once the command is
                // reaped (a store to memory, no delay worth counting).
                arm.cell.report_kill(now, deadline);
                signal_group(group, libc::SIGKILL);
                return false;
            }
            // Renewals move the deadline later: at the wake-up it is read again.
            wake = wake.min(deadline);
            true
        });
        drop(armed);
        sleep_until_ns(wake);
    }
}

/// Starts `tenure __watchdog` in `group`, reading its deadline from `cell`, and returns the
/// pipe whose closing ends it and its pid. When it exits, `watchdog` hears of it (to start
/// another if it was killed).
fn spawn_process(
    watchdog: &Watchdog,
    group: libc::pid_t,
    cell: &DeadlineCell,
) -> Result<(File, libc::pid_t), CliError> {
    let internal = |what: &str, e: io::Error| CliError::Internal {
        message: format!("cannot start the watchdog process: {what}: {e}"),
    };
    // The running binary through /proc/self/exe, not the path it was started from: that path
    // may name another file by now (an upgrade in place replaces it), or none, and every term
    // must be able to start its watchdog. The link reaches the running binary's own inode
    // even when its file was deleted or replaced. argv[0] keeps the readable name.
    let name = std::env::current_exe().map_or_else(|_| "tenure".into(), |p| p.into_os_string());
    let cell_fd = cell.fd();
    let mut command = tokio::process::Command::new("/proc/self/exe");
    command
        .arg0(name)
        .arg(SUBCOMMAND)
        .arg(group.to_string())
        .arg(cell_fd.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        // It needs no environment, and tenure's may hold secrets (a Redis password): the
        // watchdog shares the command's process group and user.
        .env_clear();
    // SAFETY: the closure runs in the forked child before exec, so it may only call
    // async-signal-safe functions: rt_sigprocmask, fcntl and setpgid are system calls, and a
    // raw-errno io::Error does not allocate.
    unsafe {
        command.pre_exec(move || {
            // Block first, join the group second: from the instant it is in the command's
            // group, nothing the command sends the group can end it. (Not
            // `Command::process_group`, which would join before this closure runs.)
            ignore_all_signals();
            block_all_signals();
            // The cell is closed on exec everywhere else (the commands must not see it).
            inherit_in_child(cell_fd)?;
            if libc::setpgid(0, group) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|e| internal("spawn", e))?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| internal("no stdin pipe", io::Error::other("missing")))?;
    let fd: OwnedFd = stdin
        .into_owned_fd()
        .map_err(|e| internal("stdin pipe", e))?;
    let pid = child
        .id()
        .and_then(|p| libc::pid_t::try_from(p).ok())
        .ok_or_else(|| internal("no pid", io::Error::other("missing")))?;
    // No await since the spawn: the reaper (same thread) has not seen it yet.
    reaper::manage(pid);
    let watchdog = watchdog.clone();
    tokio::spawn(async move {
        let _ = child.wait().await;
        reaper::release(pid);
        watchdog.process_exited(group, pid);
    });
    Ok((File::from(fd), pid))
}

/// Blocks every signal that can be blocked (the kernel leaves SIGKILL and SIGSTOP alone),
/// real-time ones included. A raw system call, because glibc's `sigprocmask` silently keeps
/// the two signals it reserves (32 and 33) unblocked, and their default action is to
/// terminate. Async-signal-safe.
fn block_all_signals() {
    let all: u64 = u64::MAX;
    // SAFETY: rt_sigprocmask reads an 8-byte mask we own (the kernel's sigset size on Linux)
    // and writes no old mask (null).
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            &raw const all,
            std::ptr::null_mut::<u64>(),
            std::mem::size_of::<u64>(),
        );
    }
}

/// The kernel's `struct sigaction` (x86-64 and arm64 layout), for [`ignore_all_signals`].
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// Sets every signal's disposition to "ignore" (SIGKILL and SIGSTOP refuse), again with raw
/// system calls so that 32 and 33 are included. Blocking alone is not enough across `exec`:
/// glibc's start-up unblocks 32 and 33 in the new program, and a 32 the command sent the
/// group while it was blocked would then be delivered with its default action (terminate).
/// An ignored disposition survives `exec`, and setting it discards what is pending.
/// Async-signal-safe.
fn ignore_all_signals() {
    let ignore = KernelSigaction {
        handler: libc::SIG_IGN,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for signo in 1..=64 {
        if signo == libc::SIGKILL || signo == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction reads the struct we own; SIG_IGN installs no handler code, and
        // no old action is written (null).
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signo,
                &raw const ignore,
                std::ptr::null_mut::<KernelSigaction>(),
                std::mem::size_of::<u64>(),
            );
        }
    }
}

/// `tenure __watchdog GROUP CELL_FD`: the process half. Kills `GROUP` when the deadline in
/// the [`DeadlineCell`] behind descriptor `CELL_FD` passes, or when stdin closes (tenure died,
/// or the term is over). Returns the exit code.
pub fn process_main(args: &[String]) -> u8 {
    let (Some(group), Some(fd)) = (
        args.first().and_then(|g| g.parse::<libc::pid_t>().ok()),
        args.get(1).and_then(|d| d.parse::<i32>().ok()),
    ) else {
        eprintln!("tenure: usage: tenure {SUBCOMMAND} GROUP CELL_FD (internal)");
        return 2;
    };
    // The supervisor signals the whole group (SIGTERM first, then the grace period), and the
    // command may signal its own group with anything: the watchdog must outlive all of it,
    // so only SIGKILL ends it. Already ignored and blocked before exec when tenure started
    // it; again here for a watchdog started some other way. One thread, on purpose: glibc's
    // first `pthread_create` unblocks 32 and 33 and installs a handler for 33.
    ignore_all_signals();
    block_all_signals();
    let cell = match DeadlineCell::open(fd) {
        Ok(cell) => cell,
        Err(e) => {
            // Nothing to judge by: the command must not run unguarded.
            signal_group(group, libc::SIGKILL);
            eprintln!(
                "tenure: watchdog: cannot map the deadline cell (fd {fd}): {e}; killed the group"
            );
            return 2;
        }
    };
    loop {
        let now = now_ns();
        let deadline = cell.deadline_ns();
        if now >= deadline {
            // The report first: this process is in the group and dies with it. A store to
            // memory, which cannot block as a write to stderr could.
            cell.report_kill(now, deadline);
            signal_group(group, libc::SIGKILL);
            return 0;
        }
        if stdin_closed(poll_wait_ms(deadline, now)) {
            // tenure is gone or the term is over: nothing may run on without it.
            signal_group(group, libc::SIGKILL);
            return 0;
        }
    }
}

/// How long the process half waits for stdin before it looks at the clock and the cell again:
/// until just past `deadline_ns` (rounded up to the millisecond, so it wakes after the
/// deadline, not spinning just before it), and at most 100 ms, so that a stop of this process
/// cannot stretch a wait past the deadline by more, and a deadline moved *earlier* is no
/// concern (deadlines only move later).
fn poll_wait_ms(deadline_ns: u64, now_ns: u64) -> i32 {
    let left_ms = deadline_ns.saturating_sub(now_ns) / 1_000_000;
    i32::try_from((left_ms + 1).min(100)).unwrap_or(100)
}

/// Waits up to `wait_ms` for stdin to close (tenure writes nothing to it). True at end of
/// file or on a read error; whatever else arrives is read and dropped.
fn stdin_closed(wait_ms: i32) -> bool {
    let mut fds = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll reads and writes the one pollfd we own.
    let ready = unsafe { libc::poll(&raw mut fds, 1, wait_ms) };
    if ready <= 0 {
        return false;
    }
    let mut buf = [0u8; 64];
    // SAFETY: read writes at most buf.len() bytes into the buffer we own.
    let n = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
    match usize::try_from(n) {
        Ok(0) => true,
        Ok(_) => false,
        Err(_) => io::Error::last_os_error().kind() != io::ErrorKind::Interrupted,
    }
}

/// Sleeps until `target` (absolute `CLOCK_MONOTONIC` nanoseconds), so that a SIGSTOP in
/// between cannot stretch the sleep past that instant.
fn sleep_until_ns(target: u64) {
    let ts = timespec_of(target);
    loop {
        // SAFETY: clock_nanosleep reads the timespec we own; with TIMER_ABSTIME the remainder
        // argument is unused and may be null.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &raw const ts,
                std::ptr::null_mut(),
            )
        };
        // Interrupted by a signal handler: sleep again to the same absolute instant.
        if rc != libc::EINTR {
            return;
        }
    }
}

/// Absolute nanoseconds as the seconds and nanoseconds of a `timespec`.
fn timespec_of(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: i64::try_from(ns / 1_000_000_000).unwrap_or(i64::MAX),
        tv_nsec: i64::try_from(ns % 1_000_000_000).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_splits_into_seconds_and_nanoseconds() {
        let ts = timespec_of(56_751_907_095_784);
        assert_eq!((ts.tv_sec, ts.tv_nsec), (56_751, 907_095_784));
        let ts = timespec_of(u64::MAX);
        assert_eq!((ts.tv_sec, ts.tv_nsec), (18_446_744_073, 709_551_615));
    }

    #[test]
    fn the_process_half_waits_just_past_the_deadline_and_at_most_100_ms() {
        let now = 7_000_000_000;
        let ms = 1_000_000;
        assert_eq!(poll_wait_ms(now + 5 * ms + ms / 2, now), 6);
        assert_eq!(
            poll_wait_ms(now + ms / 5, now),
            1,
            "under a millisecond left"
        );
        assert_eq!(poll_wait_ms(now + 99 * ms, now), 100);
        assert_eq!(poll_wait_ms(now + 10_000 * ms, now), 100);
        assert_eq!(poll_wait_ms(now, now + ms), 1, "past: look again at once");
    }

    #[test]
    fn the_process_half_rejects_bad_arguments() {
        assert_eq!(process_main(&["x".into()]), 2);
    }
}
