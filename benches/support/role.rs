//! The bench that re-executes itself (`BENCH --role …`) for its child processes: the role's
//! arguments, its runtime, and the event lines it prints for the orchestrator (see
//! [`crate::support::proc::read_events`]).

use std::future::Future;
use std::io::Write;
use std::process::ExitCode;
use std::time::SystemTime;

/// A command that runs this bench again as `role` (`BENCH --role ROLE`).
pub fn command(role: &str) -> std::process::Command {
    let mut c = std::process::Command::new(std::env::current_exe().expect("current_exe"));
    c.arg("--role").arg(role);
    c
}

/// The words after `--role`, when this process is a child.
pub fn args() -> Option<Vec<String>> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == "--role")?;
    Some(args[i + 1..].to_vec())
}

/// A multi-thread runtime with `workers` workers; `None` (said on stderr) if it cannot be
/// built.
pub fn runtime(workers: usize) -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("runtime: {e}");
            None
        }
    }
}

/// Runs the role `run` on a runtime of `workers` workers; its error is printed after `what`.
pub fn run<F>(workers: usize, what: &str, run: impl FnOnce() -> F) -> ExitCode
where
    F: Future<Output = Result<(), String>>,
{
    let Some(rt) = runtime(workers) else {
        return ExitCode::FAILURE;
    };
    match rt.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{what}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Wall-clock nanoseconds (comparable across the processes of this machine).
pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Prints `line NOW_NS` on stdout at once.
pub fn emit(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line} {}", now_ns());
    let _ = out.flush();
}

/// Prints `EVENT IDENTITY NOW_NS` on stdout at once.
pub fn event(event: &str, identity: &str) {
    emit(format_args!("{event} {identity}"));
}
