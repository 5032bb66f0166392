//! The supervised command: started in its own process group with a parent-death signal,
//! stopped group-wide, and killed by a watchdog thread the moment this process's monotonic
//! clock says the lease's validity is over — even if tenure itself was frozen until then.
//!
//! # Why a thread and not a tokio timer
//!
//! After a SIGSTOP/SIGCONT past the lease, every task in the runtime wakes at once and runs
//! in whatever order the scheduler picks. The watchdog sleeps on an *absolute*
//! `CLOCK_MONOTONIC` deadline (`clock_nanosleep(TIMER_ABSTIME)`), which returns the moment the
//! process resumes when the deadline has passed, and its first act is the SIGKILL. The clock
//! keeps running while the process is stopped, so the frozen time is counted.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::CliError;

/// A started command: its process and its process group.
pub struct Child {
    process: tokio::process::Child,
    group: ProcessGroup,
}

/// A process group id, signalled as a whole. Killed with SIGKILL when dropped, so that no
/// member of the group outlives the term it was started in (the command's own background
/// processes included).
#[derive(Debug)]
pub struct ProcessGroup(libc::pid_t);

impl ProcessGroup {
    /// Sends `signal` to every process of the group; false when none is left.
    pub fn signal(&self, signal: libc::c_int) -> bool {
        signal_group(self.0, signal)
    }

    /// The group id (the command's pid).
    pub fn id(&self) -> libc::pid_t {
        self.0
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

fn signal_group(group: libc::pid_t, signal: libc::c_int) -> bool {
    if group <= 1 {
        // Never signal "every process" (0, -1) or init, whatever went wrong upstream.
        return false;
    }
    // SAFETY: killpg only sends a signal; any pid value is memory-safe to pass.
    unsafe { libc::killpg(group, signal) == 0 }
}

impl Child {
    /// Starts `command` in a new process group, with `env` added to tenure's environment,
    /// the variables named in `secrets` removed from it, and SIGKILL as its parent-death
    /// signal.
    ///
    /// The parent-death signal fires when the *thread* that forked the child exits; tenure
    /// forks from the runtime's main thread, which lives as long as the process.
    pub fn spawn(
        command: &[OsString],
        env: &[(&str, String)],
        secrets: &[&str],
    ) -> Result<Self, CliError> {
        let (program, args) = command.split_first().ok_or_else(|| CliError::Config {
            message: "no command given after --".into(),
        })?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(stdin())
            .process_group(0);
        for name in secrets {
            cmd.env_remove(name);
        }
        let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
        // SAFETY: the closure runs in the forked child before exec, so it may only call
        // async-signal-safe functions: prctl, getppid and a raw-errno io::Error (no
        // allocation) are.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // tenure died between fork and prctl: the signal will never come, so do not
                // start the command at all.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let process = cmd.spawn().map_err(|source| CliError::Spawn {
            program: program.to_string_lossy().into_owned(),
            source,
        })?;
        let pid = process
            .id()
            .and_then(|id| libc::pid_t::try_from(id).ok())
            .ok_or_else(|| CliError::Internal {
                message: "the started command has no pid".into(),
            })?;
        Ok(Self {
            process,
            group: ProcessGroup(pid),
        })
    }

    /// The process group, to signal it or hand it to the [`Watchdog`].
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// Waits for the command to exit.
    ///
    /// Cancel safe: dropping the future leaves the process running (the group is killed when
    /// the `Child` is dropped).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.process.wait().await
    }
}

/// The command's stdin: tenure's, unless that is a terminal. The command runs in its own
/// process group, which is not the terminal's foreground group, so reading the terminal
/// would stop it with SIGTTIN; it reads end-of-file instead.
fn stdin() -> Stdio {
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        Stdio::null()
    } else {
        Stdio::inherit()
    }
}

/// The exit code tenure passes on for the command's `status`: its code, or 128 + the signal
/// that killed it (the shell's convention).
pub fn exit_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code.clamp(0, 255)).unwrap_or(1);
    }
    status
        .signal()
        .and_then(|s| u8::try_from(128 + s).ok())
        .unwrap_or(1)
}

/// A thread that SIGKILLs the armed process group when the armed deadline passes on the
/// monotonic clock.
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

    /// Arms the watchdog: kill `group` once `deadline()` is in the past.
    pub fn arm(&self, group: &ProcessGroup, deadline: impl Fn() -> Instant + Send + 'static) {
        *self.lock() = Some(Arm {
            group: group.id(),
            deadline: Box::new(deadline),
        });
        self.shared.changed.notify_all();
    }

    /// Disarms it (the term ended and the group was dealt with).
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
    // Bound each sleep so a re-arm with an earlier deadline is noticed promptly.
    const MAX_SLEEP: Duration = Duration::from_millis(500);
    loop {
        let mut armed = shared.armed.lock().unwrap_or_else(PoisonError::into_inner);
        while armed.is_none() {
            armed = shared
                .changed
                .wait(armed)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let Some(arm) = armed.as_ref() else { continue };
        let deadline = (arm.deadline)();
        let now = Instant::now();
        if now >= deadline {
            let group = arm.group;
            *armed = None;
            drop(armed);
            // The kill comes first; the report can wait.
            let killed = signal_group(group, libc::SIGKILL);
            if killed {
                eprintln!(
                    "tenure: the lease's validity ran out {:?} ago on the monotonic clock (was this process frozen?); killed the command's process group",
                    now - deadline
                );
            }
            continue;
        }
        drop(armed);
        sleep_until(now, (deadline - now).min(MAX_SLEEP));
    }
}

/// Sleeps until `now + wait` on an absolute CLOCK_MONOTONIC deadline, so that a SIGSTOP in
/// between cannot stretch the sleep past that instant.
fn sleep_until(now: Instant, wait: Duration) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) } != 0 {
        std::thread::sleep(wait);
        return;
    }
    // Account for the time since `now` was read, then add the wait.
    let wait = wait.saturating_sub(now.elapsed());
    let total_ns = i128::from(ts.tv_nsec) + i128::from(wait.subsec_nanos());
    let secs = i64::try_from(wait.as_secs()).unwrap_or(i64::MAX);
    ts.tv_sec = ts
        .tv_sec
        .saturating_add(secs)
        .saturating_add(i64::try_from(total_ns / 1_000_000_000).unwrap_or(0));
    ts.tv_nsec = i64::try_from(total_ns % 1_000_000_000).unwrap_or(0);
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
