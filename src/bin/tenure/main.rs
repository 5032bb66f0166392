//! `tenure`: run any command as a singleton, fenced by a lease on Kubernetes, Redis or local
//! files. See `tenure --help` and docs/singleton.md.
//!
//! This file parses the command line, dispatches and turns the result into the exit code. The
//! modules are layers, each importing only those below it: `args` (the command line) → the
//! commands (`run/`, `status`, `policy`, `drain`, `install`) → `run/supervisor.rs` (the
//! command of one term) → `process/` (its process group, the watchdog, the reaper). `backend`
//! (`--backend` → a store) and `error` (exit codes) serve every layer.

mod args;
mod backend;
mod drain;
mod error;
mod handoff;
mod install;
mod policy;
mod process;
mod run;
mod status;

use std::process::ExitCode;

use clap::FromArgMatches;

use crate::args::{Cli, Command};

fn main() -> ExitCode {
    protect_environment();
    // The watchdog process is tenure re-executed; it needs neither clap nor a runtime.
    let mut args = std::env::args_os().skip(1);
    if args
        .next()
        .is_some_and(|a| a == process::watchdog::SUBCOMMAND)
    {
        let rest: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
        return ExitCode::from(process::watchdog::process_main(&rest));
    }
    let cli = parse();
    init_tracing();
    // One thread runs everything but the watchdog: the command is forked from this thread,
    // and its parent-death signal fires when the forking *thread* exits.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tenure: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(*args).await,
            Command::Status(args) => status::status(args).await,
            Command::Crd => {
                print!("{}", tenure::crd::crd_yaml());
                Ok(0)
            }
            Command::Policy(args) => policy::policy(&args).await,
            Command::Install { dir } => install::install(&dir),
            Command::Drain(args) => drain::drain(args).await,
            Command::Handoff(args) => handoff::handoff(args).await,
        }
    });
    // Background tasks (watches, the probe server) must not hold the exit.
    runtime.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("tenure: {}", error::printable(&e.to_string()));
            ExitCode::from(e.exit_code())
        }
    }
}

/// The command line, as `Cli::parse` would return it, also noting where `--backend` came from
/// (its password warning names the place).
fn parse() -> Cli {
    let matches = args::command()
        .try_get_matches()
        .unwrap_or_else(|e| usage_error(&e));
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| usage_error(&e));
    let (name, backend) = match &mut cli.command {
        Command::Run(args) => ("run", &mut args.backend),
        Command::Status(args) => ("status", &mut args.backend),
        Command::Handoff(args) => ("handoff", &mut args.backend),
        Command::Crd | Command::Policy(_) | Command::Install { .. } | Command::Drain(_) => {
            return cli;
        }
    };
    backend.backend_from_env = matches
        .subcommand_matches(name)
        .and_then(|m| m.value_source("backend"))
        == Some(clap::parser::ValueSource::EnvVariable);
    cli
}

/// Exits on a command-line error: help and version as clap prints them (exit 0), anything
/// else as one `tenure: …` line with clap's tip and where to read more (exit 2), like every
/// other error of tenure's, so a pod's log or a script's stderr holds one line per failure.
fn usage_error(e: &clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    // Lossy: an argument need not be UTF-8 (`args()` would panic on it), and these are only
    // looked up.
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let command = args::command();
    let subcommand = argv
        .first()
        .filter(|a| command.find_subcommand(a).is_some());
    let rendered = e.render().to_string();
    let sources = args::set_by_env(
        &command,
        subcommand.map(String::as_str),
        &rendered,
        argv.get(1..).unwrap_or_default(),
    );
    let line = args::one_line(&rendered, subcommand.map(String::as_str), &sources);
    // The line quotes the arguments as given: escape what a terminal would interpret.
    eprintln!("tenure: {}", error::printable(&line));
    std::process::exit(2);
}

/// With a Redis password in its environment, tenure makes itself non-dumpable, as ssh-agent
/// does: `/proc/PID/environ` (and `mem`, and ptrace) of a non-dumpable process are closed to
/// every process without `CAP_SYS_PTRACE`, the command and other processes of the same user
/// included. Removing the variable (`unsetenv`) would not do: `/proc/PID/environ` shows the
/// environment block the process started with, which `unsetenv` leaves as it is. Run first
/// thing, so the password is readable for microseconds at most; the command, `exec`'d, is
/// dumpable again (and gets no password: see `backend::secret_env_vars`).
fn protect_environment() {
    if !backend::environment_holds_secret() {
        return;
    }
    // SAFETY: prctl(PR_SET_DUMPABLE) takes integers only and changes a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        eprintln!(
            "tenure: warning: cannot make this process non-dumpable ({}): processes of the same user can read the Redis password in /proc/{}/environ",
            std::io::Error::last_os_error(),
            std::process::id()
        );
    }
}

/// Logs to stderr; `TENURE_LOG` takes a tracing filter (default `info`). Colours only on a
/// terminal, so `kubectl logs` shows no escape codes.
fn init_tracing() {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("TENURE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
