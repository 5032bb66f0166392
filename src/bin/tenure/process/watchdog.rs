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
//!   replica takes over. The watchdog process joins the command's process group, receives each
//!   new deadline over a pipe from the thread, and kills the group when a deadline passes
//!   without an extension, or when the pipe closes because tenure died. Being in the command's
//!   group, it is frozen or killed exactly when the command is.
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
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::CliError;
use crate::process::child::{ProcessGroup, signal_group};
use crate::process::reaper;

/// The hidden subcommand that runs [`process_main`].
pub const SUBCOMMAND: &str = "__watchdog";

/// The in-process half: a thread that SIGKILLs each armed process group when its deadline
/// passes, and feeds every new deadline to the group's watchdog process.
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
    /// Re-read on every wake-up: renewals move the deadline later.
    deadline: Box<dyn Fn() -> Instant + Send>,
    /// The watchdog process's stdin, and the deadline last written to it.
    feed: File,
    fed: Option<Instant>,
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
    /// group once `deadline()` is in the past. Other armed groups are left as they are.
    pub fn arm(
        &self,
        group: &ProcessGroup,
        deadline: impl Fn() -> Instant + Send + 'static,
    ) -> Result<(), CliError> {
        let (feed, process) = spawn_process(self, group.id(), deadline())?;
        self.lock().insert(
            group.id(),
            Arm {
                process,
                deadline: Box::new(deadline),
                feed,
                fed: None,
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
        match spawn_process(self, group, (arm.deadline)()) {
            Ok((feed, process)) => {
                tracing::warn!(
                    group,
                    "the watchdog process was killed while the command runs; started another"
                );
                arm.feed = feed;
                arm.process = process;
                arm.fed = None;
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
    // Bound each sleep so that a re-arm, and each renewal's later deadline, reach the
    // watchdog process well before the deadline it holds.
    const MAX_SLEEP: Duration = Duration::from_millis(200);
    // The shortest wait between two looks at an armed group's deadline.
    const MIN_SLEEP: Duration = Duration::from_millis(1);
    loop {
        let mut armed = shared.armed.lock().unwrap_or_else(PoisonError::into_inner);
        while armed.is_empty() {
            armed = shared
                .changed
                .wait(armed)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let now = Instant::now();
        let mut wake = now + MAX_SLEEP;
        let mut killed = Vec::new();
        armed.retain(|&group, arm| {
            let deadline = (arm.deadline)();
            if now >= deadline {
                // The kill comes first; the report can wait.
                if signal_group(group, libc::SIGKILL) {
                    killed.push(now - deadline);
                }
                return false;
            }
            if arm.fed != Some(deadline) {
                // One write of one short line: atomic on a pipe, and never blocking (the
                // feed is non-blocking), so a frozen watchdog process cannot hold up the
                // other groups. A failed write means the watchdog process is gone (it killed
                // the group, SIGKILL to the group took both, or it was killed alone and
                // `process_exited` starts another, which is fed on the next lap) or its pipe
                // is full (it is frozen with its group).
                let line = format!("{}\n", monotonic_ns(deadline));
                let _ = arm.feed.write(line.as_bytes());
                arm.fed = Some(deadline);
            }
            // Look again after a third of the time left, not at the deadline itself: a
            // renewal moves the deadline later, and the watchdog process holds only what it
            // was fed. Fed at the last instant, a thread a few ms late under CPU load lets
            // the process kill a command whose term was renewed all along (it did, at leases
            // under a second). Fed by a third of the way, the process has the new deadline
            // with two thirds of the old wait to spare.
            let left = deadline - now;
            wake = wake.min(now + (left / 3).max(MIN_SLEEP).min(left));
            true
        });
        drop(armed);
        for late in killed {
            let _ = writeln!(
                io::stderr(),
                "tenure: the lease's validity ran out {late:?} ago on the monotonic clock (was this process frozen?); killed the command's process group",
            );
        }
        sleep_until(now, wake.saturating_duration_since(now));
    }
}

/// Starts `tenure __watchdog` in `group` with `deadline`, and returns the pipe that feeds it
/// and its pid. When it exits, `watchdog` hears of it (to start another if it was killed).
fn spawn_process(
    watchdog: &Watchdog,
    group: libc::pid_t,
    deadline: Instant,
) -> Result<(File, libc::pid_t), CliError> {
    let internal = |what: &str, e: io::Error| CliError::Internal {
        message: format!("cannot start the watchdog process: {what}: {e}"),
    };
    // The running binary through /proc/self/exe, not the path it was started from: that path
    // may name another file by now (an upgrade in place replaces it), or none, and every term
    // must be able to start its watchdog. The link reaches the running binary's own inode
    // even when its file was deleted or replaced. argv[0] keeps the readable name.
    let name = std::env::current_exe().map_or_else(|_| "tenure".into(), |p| p.into_os_string());
    let mut command = tokio::process::Command::new("/proc/self/exe");
    command
        .arg0(name)
        .arg(SUBCOMMAND)
        .arg(group.to_string())
        .arg(monotonic_ns(deadline).to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        // It needs no environment, and tenure's may hold secrets (a Redis password): the
        // watchdog shares the command's process group and user.
        .env_clear();
    // SAFETY: the closure runs in the forked child before exec, so it may only call
    // async-signal-safe functions: rt_sigprocmask and setpgid are system calls, and a
    // raw-errno io::Error does not allocate.
    unsafe {
        command.pre_exec(move || {
            // Block first, join the group second: from the instant it is in the command's
            // group, nothing the command sends the group can end it. (Not
            // `Command::process_group`, which would join before this closure runs.)
            ignore_all_signals();
            block_all_signals();
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
    set_nonblocking(&fd).map_err(|e| internal("stdin pipe", e))?;
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

/// Makes writes to `fd` fail with `EAGAIN` instead of waiting when the pipe is full.
fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, with integer arguments only.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0
        || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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

/// `tenure __watchdog GROUP DEADLINE_NS`: the process half. Reads later deadlines (absolute
/// `CLOCK_MONOTONIC` nanoseconds, one per line) from stdin; kills `GROUP` when the current
/// deadline passes or stdin closes. Returns the exit code.
pub fn process_main(args: &[String]) -> u8 {
    let (Some(group), Some(deadline)) = (
        args.first().and_then(|g| g.parse::<libc::pid_t>().ok()),
        args.get(1).and_then(|d| d.parse::<u64>().ok()),
    ) else {
        eprintln!("tenure: usage: tenure {SUBCOMMAND} GROUP DEADLINE_NS (internal)");
        return 2;
    };
    // The supervisor signals the whole group (SIGTERM first, then the grace period), and the
    // command may signal its own group with anything: the watchdog must outlive all of it,
    // so only SIGKILL ends it. Already ignored and blocked before exec when tenure started
    // it; again here for a watchdog started some other way. One thread, on purpose: glibc's
    // first `pthread_create` unblocks 32 and 33 and installs a handler for 33.
    ignore_all_signals();
    block_all_signals();
    let mut feed = Feed::default();
    let mut deadline = deadline;
    loop {
        let now = now_ns();
        if now >= deadline {
            // A later deadline may be waiting in the pipe, unread because this process was
            // not scheduled in time (a loaded machine): read what is there before judging.
            if let Polled::Deadline(ns) = feed.poll(0) {
                deadline = ns;
                continue;
            }
            // The kill comes first; the report can fail (a closed stderr) without a panic.
            signal_group(group, libc::SIGKILL);
            let _ = writeln!(
                io::stderr(),
                "tenure: watchdog: the lease's validity ran out {} ms ago and tenure did not renew it (frozen or stuck); killed the command's process group",
                (now - deadline) / 1_000_000
            );
            return 0;
        }
        // Re-check the clock at least every 100 ms (so a stop of this process cannot stretch
        // a wait past the deadline by more), and at once when a line or the end arrives.
        let wait_ms = ((deadline - now) / 1_000_000 + 1).min(100);
        match feed.poll(i32::try_from(wait_ms).unwrap_or(100)) {
            Polled::Deadline(ns) => deadline = ns,
            Polled::Nothing => {}
            Polled::Closed => {
                // tenure is gone or the term is over: nothing may run on without it.
                signal_group(group, libc::SIGKILL);
                return 0;
            }
        }
    }
}

/// The pipe from tenure (stdin), read without a thread: deadlines as decimal lines.
#[derive(Default)]
struct Feed {
    partial: Vec<u8>,
}

enum Polled {
    /// The latest complete line: a new deadline.
    Deadline(u64),
    /// Nothing new within the wait (or an interrupted wait).
    Nothing,
    /// End of file or a read error: tenure died or disarmed the watchdog.
    Closed,
}

impl Feed {
    /// The most a line can be; longer input is not tenure's and is dropped.
    const MAX_LINE: usize = 64;

    /// Waits up to `wait_ms` for input on stdin and reads what is there.
    fn poll(&mut self, wait_ms: i32) -> Polled {
        let mut fds = libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll reads and writes the one pollfd we own.
        let ready = unsafe { libc::poll(&raw mut fds, 1, wait_ms) };
        if ready <= 0 {
            return Polled::Nothing;
        }
        let mut buf = [0u8; 512];
        // SAFETY: read writes at most buf.len() bytes into the buffer we own.
        let n = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
        let n = match usize::try_from(n) {
            Ok(0) => return Polled::Closed,
            Ok(n) => n,
            Err(_) if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {
                return Polled::Nothing;
            }
            Err(_) => return Polled::Closed,
        };
        let mut latest = None;
        for &byte in &buf[..n] {
            if byte == b'\n' {
                if let Some(ns) = std::str::from_utf8(&self.partial)
                    .ok()
                    .and_then(|l| l.trim().parse::<u64>().ok())
                {
                    latest = Some(ns);
                }
                self.partial.clear();
            } else if self.partial.len() < Self::MAX_LINE {
                self.partial.push(byte);
            }
        }
        latest.map_or(Polled::Nothing, Polled::Deadline)
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds.
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// `at` as absolute `CLOCK_MONOTONIC` nanoseconds (the clock `Instant` reads on Linux).
fn monotonic_ns(at: Instant) -> u64 {
    let now = Instant::now();
    let base = now_ns();
    match at.checked_duration_since(now) {
        Some(ahead) => base.saturating_add(u64::try_from(ahead.as_nanos()).unwrap_or(u64::MAX)),
        None => base.saturating_sub(u64::try_from((now - at).as_nanos()).unwrap_or(u64::MAX)),
    }
}

/// Sleeps until `now + wait` on an absolute `CLOCK_MONOTONIC` deadline, so that a SIGSTOP in
/// between cannot stretch the sleep past that instant.
fn sleep_until(now: Instant, wait: Duration) {
    let target = monotonic_ns(now + wait);
    let ts = libc::timespec {
        tv_sec: i64::try_from(target / 1_000_000_000).unwrap_or(i64::MAX),
        tv_nsec: i64::try_from(target % 1_000_000_000).unwrap_or(0),
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_ns_matches_the_clock() {
        let now = Instant::now();
        let a = monotonic_ns(now + Duration::from_secs(2));
        let b = now_ns();
        assert!(a > b + 1_900_000_000 && a < b + 2_100_000_000, "{a} vs {b}");
        assert!(monotonic_ns(now) <= now_ns());
    }

    #[test]
    fn the_process_half_rejects_bad_arguments() {
        assert_eq!(process_main(&["x".into()]), 2);
    }
}
