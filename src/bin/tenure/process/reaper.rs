//! Reaping adopted orphans: tenure is a child subreaper (and often a container's PID 1), so
//! processes the command leaves behind when their parent exits become tenure's children.
//! Without this module they would stay zombies until tenure exits.
//!
//! tokio reaps the children tenure spawns itself (the command, the watchdog process) and needs
//! their exit statuses, so those are registered here and never touched; every other child is
//! an adopted orphan and is reaped on `SIGCHLD`.
//!
//! Adopted orphans are the command's descendants (a `setsid` daemon, a double fork) that
//! escaped its process group. They may run during the term; when the term ends they are
//! killed ([`end_term`]), and so is every orphan adopted while no term runs (the grandchildren
//! of a killed one, reparented as their parents die).
//!
//! With `--shards`, several terms run at once, one per shard, and an orphan is tied to its
//! term by the environment it carries: it may live while the term named by its
//! `TENURE_LEASE` and `TENURE_FENCING_TOKEN` (read from `/proc/PID/environ`) runs. One whose
//! environment names no running term, or cannot be read, is killed at the next sweep (when a
//! term ends, or any child of tenure exits).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use tokio::signal::unix::{SignalKind, signal};

use crate::process::term_env::{Marker, marker_of};

/// Pids of children tokio waits for.
fn managed() -> &'static Mutex<HashSet<libc::pid_t>> {
    static SET: OnceLock<Mutex<HashSet<libc::pid_t>>> = OnceLock::new();
    SET.get_or_init(|| Mutex::new(HashSet::new()))
}

/// The terms running now.
fn terms() -> &'static Mutex<Vec<Marker>> {
    static TERMS: OnceLock<Mutex<Vec<Marker>>> = OnceLock::new();
    TERMS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Whether orphans are tied to terms by their environment (`--shards`: several terms at
/// once). Otherwise every orphan belongs to the one running term.
static BY_ENVIRONMENT: AtomicBool = AtomicBool::new(false);

/// Several terms may run at once from now on: tie orphans to them by their environment.
pub fn several_terms() {
    BY_ENVIRONMENT.store(true, Ordering::Release);
}

/// A term begins: orphans adopted from now on may belong to its command (the one started
/// with `lease` and `token` in its environment).
pub fn begin_term(lease: &str, token: &str) {
    terms()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((lease.to_owned(), token.to_owned()));
}

/// The term is over: kills every adopted orphan that no running term accounts for now, and
/// any adopted later — including the command's children reparented when its process group is
/// killed right after (their parent's death brings a `SIGCHLD`, hence a sweep).
pub fn end_term(lease: &str, token: &str) {
    {
        let mut terms = terms().lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = terms.iter().position(|(l, t)| l == lease && t == token) {
            terms.swap_remove(i);
        }
    }
    sweep();
}

/// Marks `pid` as a child tokio waits for (until [`release`]).
pub fn manage(pid: libc::pid_t) {
    managed()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(pid);
}

/// `pid` has been waited for; a later child with the same pid is an orphan again.
pub fn release(pid: libc::pid_t) {
    managed()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&pid);
}

/// Makes tenure a child subreaper and reaps adopted orphans in the background. Best effort:
/// failures are logged, never fatal.
pub fn start() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "cannot become a child subreaper; orphans go to init"
        );
    }
    let mut children = match signal(SignalKind::child()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGCHLD; orphaned processes will not be reaped");
            return;
        }
    };
    tokio::spawn(async move {
        while children.recv().await.is_some() {
            sweep();
        }
    });
}

/// Reaps every exited child that tokio does not manage and kills the live ones no running
/// term accounts for (their deaths bring the next `SIGCHLD`, and their own orphans with it).
fn sweep() {
    let running = terms()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let by_environment = BY_ENVIRONMENT.load(Ordering::Acquire);
    for pid in children() {
        if pid <= 1
            || managed()
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(&pid)
        {
            continue;
        }
        let mut status = 0;
        // SAFETY: waitpid on one specific pid with WNOHANG writes only into `status`.
        let reaped = unsafe { libc::waitpid(pid, &raw mut status, libc::WNOHANG) };
        let belongs = if by_environment {
            marker_of(pid).is_some_and(|m| running.contains(&m))
        } else {
            !running.is_empty()
        };
        if reaped == 0 && !belongs {
            // SAFETY: kill only sends a signal, to a child of this process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// This process's children, from `/proc/self/task/*/children`.
fn children() -> Vec<libc::pid_t> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<libc::pid_t>().ok()),
            );
        }
    }
    out
}
