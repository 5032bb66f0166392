//! The supervised command: started in its own process group with a parent-death signal, and
//! stopped group-wide. [`crate::process::watchdog`] makes sure it never outlives the lease.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};

use crate::error::CliError;
use crate::process::reaper;

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

pub(crate) fn signal_group(group: libc::pid_t, signal: libc::c_int) -> bool {
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
        // No await between the spawn and this: the reaper (same thread) cannot run first.
        reaper::manage(pid);
        Ok(Self {
            process,
            group: ProcessGroup(pid),
        })
    }

    /// The process group, to signal it or hand it to the watchdog.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// Waits for the command to exit.
    ///
    /// Cancel safe: dropping the future leaves the process running (the group is killed when
    /// the `Child` is dropped).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.process.wait().await;
        if status.is_ok() {
            reaper::release(self.group.0);
        }
        status
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
