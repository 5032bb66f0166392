//! Supervision of a term's command, one place for `tenure run` with and without `--shards`:
//! the command started with the term's environment, the watchdog armed on the term's validity,
//! the signal and `--grace` when the term ends, SIGKILL after, and the reaping of what escaped;
//! and tenure's own SIGTERM and SIGINT, which end the run and reach every running command.

use std::ffi::OsString;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use tenure::Term;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::backend;
use crate::error::CliError;
use crate::process::child::{Child, exit_code};
use crate::process::deadline::{DeadlineCell, KillReport};
use crate::process::reaper;
use crate::process::term_env::{ENV_FENCING_TOKEN, ENV_IDENTITY, ENV_LEASE};
use crate::process::watchdog::Watchdog;
use crate::run::fence::{Begun, CommandFence};

/// Runs the command for one term and stops it when the term ends. With `--shards`, the
/// workload of every shard's term: any number of terms may run at once. Clones share the
/// watchdog, the signals and the fence.
#[derive(Clone)]
pub struct Supervisor {
    command: Vec<OsString>,
    grace: Duration,
    stop_margin: Duration,
    watchdog: Watchdog,
    /// The signal tenure received, forwarded to the command on shutdown (0: none).
    received: Arc<AtomicI32>,
    /// Cancelled by a second signal: skip the rest of the grace period.
    hurry: CancellationToken,
    /// `--fence`: each term's command gets a fenced Kubernetes endpoint.
    fence: Option<Arc<CommandFence>>,
}

/// How many terms a supervisor runs at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Terms {
    /// One at a time (`tenure run`): every adopted orphan belongs to the running term.
    One,
    /// Several (`--shards`): orphans are tied to their terms by their environment.
    Several,
}

impl Supervisor {
    /// Readies tenure to supervise `command`: makes it a child subreaper that reaps adopted
    /// orphans, starts the watchdog thread and handles SIGTERM and SIGINT. The future
    /// completes on the first of those signals (the run's shutdown), which is forwarded to
    /// the command when its term ends; a second cuts the grace period short.
    pub fn start(
        command: Vec<OsString>,
        grace: Duration,
        stop_margin: Duration,
        terms: Terms,
    ) -> Result<(Self, impl Future<Output = ()> + use<>), CliError> {
        if terms == Terms::Several {
            reaper::several_terms();
        }
        reaper::start();
        let watchdog = Watchdog::start().map_err(|e| CliError::Internal {
            message: format!("cannot start the watchdog thread: {e}"),
        })?;
        let received = Arc::new(AtomicI32::new(0));
        let hurry = CancellationToken::new();
        let shutdown = shutdown_signal(Arc::clone(&received), hurry.clone())?;
        let supervisor = Self {
            command,
            grace,
            stop_margin,
            watchdog,
            received,
            hurry,
            fence: None,
        };
        Ok((supervisor, shutdown))
    }

    /// Gives every term's command a fenced Kubernetes endpoint (`--fence`), started after the
    /// term's fence proof.
    pub fn with_fence(mut self, fence: CommandFence) -> Self {
        self.fence = Some(Arc::new(fence));
        self
    }

    /// The signal tenure received (SIGTERM or SIGINT), 0 while none has come.
    pub fn received_signal(&self) -> i32 {
        self.received.load(Ordering::Acquire)
    }

    /// The workload of one term, the command started with `extra` in its environment besides
    /// the term's own variables. Dropping the future (the elector does so at
    /// `valid_until − stop_margin`) kills the command's process group.
    pub fn term(
        &self,
        term: Term,
        extra: Vec<(&'static str, String)>,
    ) -> impl Future<Output = Result<u8, CliError>> + Send + use<> {
        let command = self.command.clone();
        let grace = self.grace;
        let stop_margin = self.stop_margin;
        let watchdog = self.watchdog.clone();
        let received = Arc::clone(&self.received);
        let hurry = self.hurry.clone();
        let fence = self.fence.clone();
        async move {
            let token = term.fencing_token().to_string();
            let mut env = vec![
                (ENV_FENCING_TOKEN, token.clone()),
                (ENV_LEASE, term.lease_name().to_owned()),
                (ENV_IDENTITY, term.identity().to_owned()),
            ];
            env.extend(extra);
            // Held until the command is gone: the endpoint stops and its files go with it.
            let _fenced = match &fence {
                Some(fence) => match fence.begin(&term).await? {
                    Begun::Fenced(guard, vars) => {
                        env.extend(vars);
                        Some(guard)
                    }
                    Begun::Ended => return Ok(not_started(&term, &received)),
                    // Logged by the fence; this shard's copy "exits" with the code a replica
                    // would for an unproven fence (8), and its term ends.
                    Begun::Unproven => {
                        return Ok(CliError::Unfenced {
                            message: String::new(),
                        }
                        .exit_code());
                    }
                },
                None => None,
            };
            // A term that ended while it was being prepared (a signal during the fence's
            // proof) starts nothing: its command would only be signalled at once.
            if term.cancellation().is_cancelled() {
                return Ok(not_started(&term, &received));
            }
            // The kill deadline, moved by each renewal as the lease records it (the listener
            // is told the current validity at once, before the watchdog is armed).
            let cell = Arc::new(DeadlineCell::create().map_err(|e| CliError::Internal {
                message: format!("cannot create the watchdog's deadline cell: {e}"),
            })?);
            let mirror = Arc::clone(&cell);
            term.on_renewal(move |until| {
                let until = until.into_std();
                mirror.extend(until.checked_sub(stop_margin).unwrap_or(until));
            });
            // tenure's own credentials are not the command's business.
            let mut child = Child::spawn(&command, &env, &backend::secret_env_vars())?;
            watchdog.arm(child.group(), Arc::clone(&cell))?;
            let _disarm = Disarm {
                watchdog: &watchdog,
                cell: &cell,
                group: child.group().id(),
                lease: term.lease_name(),
                token: &token,
            };
            reaper::begin_term(term.lease_name(), &token);
            tracing::info!(
                lease = %term.lease_name(),
                fencing_token = %term.fencing_token(),
                pid = child.group().id(),
                "leading: started the command"
            );
            let status = tokio::select! {
                status = child.wait() => status,
                () = term.cancellation().cancelled() => {
                    let signo = match received.load(Ordering::Acquire) {
                        0 => libc::SIGTERM,
                        s => s,
                    };
                    tracing::info!(signal = signo, ?grace, "term ending: signalling the command");
                    child.group().signal(signo);
                    tokio::select! {
                        status = child.wait() => status,
                        () = tokio::time::sleep(grace) => {
                            tracing::warn!(?grace, "the command outlived the grace period: SIGKILL");
                            child.group().signal(libc::SIGKILL);
                            child.wait().await
                        }
                        () = hurry.cancelled() => {
                            child.group().signal(libc::SIGKILL);
                            child.wait().await
                        }
                    }
                }
            };
            let status = status.map_err(|e| CliError::Internal {
                message: format!("cannot wait for the command: {e}"),
            })?;
            tracing::info!(lease = %term.lease_name(), %status, "the command exited");
            Ok(exit_code(status))
        }
    }
}

/// The outcome of a term whose command was never started because the term ended first: the
/// code of a stop by that signal (a lost lease is reported by the elector, whatever this is).
fn not_started(term: &Term, received: &AtomicI32) -> u8 {
    tracing::info!(
        lease = %term.lease_name(),
        fencing_token = %term.fencing_token(),
        "the term ended before its command started: not starting it"
    );
    match received.load(Ordering::Acquire) {
        0 => 1,
        signo => u8::try_from(128 + signo).unwrap_or(1),
    }
}

/// Completes on the first SIGTERM or SIGINT, recording which; a second one cancels `hurry`
/// (every running command is killed at once instead of after the grace period).
fn shutdown_signal(
    received: Arc<AtomicI32>,
    hurry: CancellationToken,
) -> Result<impl Future<Output = ()> + use<>, CliError> {
    let install = |kind: SignalKind| {
        signal(kind).map_err(|e| CliError::Internal {
            message: format!("cannot install a signal handler: {e}"),
        })
    };
    let mut term = install(SignalKind::terminate())?;
    let mut int = install(SignalKind::interrupt())?;
    Ok(async move {
        let signo = tokio::select! {
            _ = term.recv() => libc::SIGTERM,
            _ = int.recv() => libc::SIGINT,
        };
        received.store(signo, Ordering::Release);
        tracing::info!(signal = signo, "shutting down");
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::warn!("second signal: killing the command now");
            // Stays cancelled: it counts even if a supervisor is not waiting yet.
            hurry.cancel();
        });
    })
}

/// Disarms the watchdog for the term's group when the term's workload ends, however it
/// ends (the elector drops a workload at once when it finds the term over: after a freeze,
/// say), reports a kill by the watchdog, and kills what the command left behind outside its
/// process group.
struct Disarm<'a> {
    watchdog: &'a Watchdog,
    cell: &'a DeadlineCell,
    group: libc::pid_t,
    lease: &'a str,
    token: &'a str,
}

impl Drop for Disarm<'_> {
    fn drop(&mut self) {
        self.watchdog.disarm(self.group);
        match self.cell.kill_report() {
            Some(KillReport::Late(late)) => tracing::warn!(
                lease = %self.lease,
                ?late,
                "the watchdog killed the command: the term's validity ran out before a renewal moved it (tenure frozen, or starved of CPU past its renew deadline)"
            ),
            Some(KillReport::NoDeadline) => tracing::warn!(
                lease = %self.lease,
                "the watchdog killed the command: the term had ended before the command was guarded"
            ),
            None => {}
        }
        reaper::end_term(self.lease, self.token);
    }
}
