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
//! `CLOCK_MONOTONIC` is one clock for every process on the machine and keeps running while a
//! process is stopped, so both halves count the time tenure was frozen.

use std::fs::File;
use std::io::{self, BufRead, Write};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::child::{ProcessGroup, signal_group};
use crate::error::CliError;

/// The hidden subcommand that runs [`process_main`].
pub const SUBCOMMAND: &str = "__watchdog";

/// The in-process half: a thread that SIGKILLs the armed process group when the armed
/// deadline passes, and feeds every new deadline to the group's watchdog process.
#[derive(Clone)]
pub struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    armed: Mutex<Option<Arm>>,
    changed: Condvar,
}

struct Arm {
    group: libc::pid_t,
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
            armed: Mutex::new(None),
            changed: Condvar::new(),
        });
        let thread_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("tenure-watchdog".into())
            .spawn(move || watch(&thread_shared))?;
        Ok(Self { shared })
    }

    /// Arms the watchdog for `group`: starts the group's watchdog process, and kills the
    /// group once `deadline()` is in the past.
    pub fn arm(
        &self,
        group: &ProcessGroup,
        deadline: impl Fn() -> Instant + Send + 'static,
    ) -> Result<(), CliError> {
        let feed = spawn_process(group, deadline())?;
        *self.lock() = Some(Arm {
            group: group.id(),
            deadline: Box::new(deadline),
            feed,
            fed: None,
        });
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Disarms it (the term ended and the group was dealt with). Closing the feed makes the
    /// watchdog process kill the group, which by then is empty or about to be.
    pub fn disarm(&self) {
        *self.lock() = None;
        self.shared.changed.notify_all();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arm>> {
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
    loop {
        let mut armed = shared.armed.lock().unwrap_or_else(PoisonError::into_inner);
        while armed.is_none() {
            armed = shared
                .changed
                .wait(armed)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let Some(arm) = armed.as_mut() else { continue };
        let deadline = (arm.deadline)();
        let now = Instant::now();
        if now >= deadline {
            let group = arm.group;
            *armed = None;
            drop(armed);
            // The kill comes first; the report can wait.
            if signal_group(group, libc::SIGKILL) {
                eprintln!(
                    "tenure: the lease's validity ran out {:?} ago on the monotonic clock (was this process frozen?); killed the command's process group",
                    now - deadline
                );
            }
            continue;
        }
        if arm.fed != Some(deadline) {
            // A failed write means the watchdog process is gone: so is the group (it killed
            // it), or the group killed it; either way nothing is left to guard.
            let _ = writeln!(arm.feed, "{}", monotonic_ns(deadline));
            arm.fed = Some(deadline);
        }
        drop(armed);
        sleep_until(now, (deadline - now).min(MAX_SLEEP));
    }
}

/// Starts `tenure __watchdog` in `group` with `deadline`, and returns the pipe that feeds it.
fn spawn_process(group: &ProcessGroup, deadline: Instant) -> Result<File, CliError> {
    let internal = |what: &str, e: io::Error| CliError::Internal {
        message: format!("cannot start the watchdog process: {what}: {e}"),
    };
    let exe = std::env::current_exe().map_err(|e| internal("cannot find this executable", e))?;
    let mut child = tokio::process::Command::new(exe)
        .arg(SUBCOMMAND)
        .arg(group.id().to_string())
        .arg(monotonic_ns(deadline).to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .process_group(group.id())
        .spawn()
        .map_err(|e| internal("spawn", e))?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| internal("no stdin pipe", io::Error::other("missing")))?;
    let fd: OwnedFd = stdin
        .into_owned_fd()
        .map_err(|e| internal("stdin pipe", e))?;
    if let Some(pid) = child.id().and_then(|p| libc::pid_t::try_from(p).ok()) {
        // No await since the spawn: the reaper (same thread) has not seen it yet.
        crate::reaper::manage(pid);
        tokio::spawn(async move {
            let _ = child.wait().await;
            crate::reaper::release(pid);
        });
    }
    Ok(File::from(fd))
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
    // The supervisor signals the whole group (SIGTERM first, then the grace period): the
    // watchdog must outlive that, so only SIGKILL ends it.
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: setting a signal's disposition to "ignore" installs no handler code.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
    // Lines arrive from a thread of tenure; a reader thread turns them into updates so the
    // main thread can sleep on an absolute deadline.
    let state = Arc::new((Mutex::new((deadline, false)), Condvar::new()));
    let reader = Arc::clone(&state);
    let spawned = std::thread::Builder::new()
        .name("feed".into())
        .spawn(move || {
            let (lock, cvar) = &*reader;
            for line in io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if let Ok(ns) = line.trim().parse::<u64>() {
                    lock.lock().unwrap_or_else(PoisonError::into_inner).0 = ns;
                }
            }
            lock.lock().unwrap_or_else(PoisonError::into_inner).1 = true;
            cvar.notify_all();
        });
    if spawned.is_err() {
        signal_group(group, libc::SIGKILL);
        return 1;
    }
    let (lock, cvar) = &*state;
    loop {
        let (deadline, closed) = *lock.lock().unwrap_or_else(PoisonError::into_inner);
        if closed {
            // tenure is gone or the term is over: nothing may run on without it.
            signal_group(group, libc::SIGKILL);
            return 0;
        }
        let now = now_ns();
        if now >= deadline {
            eprintln!(
                "tenure: watchdog: the lease's validity ran out {} ms ago and tenure did not renew it (frozen or stuck); killing the command's process group",
                (now - deadline) / 1_000_000
            );
            signal_group(group, libc::SIGKILL);
            return 0;
        }
        // Re-check the clock at least every 100 ms (so a stop of this process cannot stretch
        // a wait past the deadline by more), and at once when the feed closes; later
        // deadlines are picked up on the next lap.
        let wait = Duration::from_nanos(deadline - now).min(Duration::from_millis(100));
        let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.1 {
            continue;
        }
        let _ = cvar
            .wait_timeout(guard, wait)
            .unwrap_or_else(PoisonError::into_inner);
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
