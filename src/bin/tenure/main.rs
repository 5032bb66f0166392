//! `tenure`: run any command as a singleton, fenced by a lease on Kubernetes, Redis or local
//! files. See `tenure --help` and the README's "Run any command as a singleton".

mod args;
mod backend;
mod child;
mod drain;
mod error;
mod publish;
mod reaper;
mod run;
mod shard_probe;
mod sharded;
mod status;
mod watchdog;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use crate::args::{Cli, Command};
use crate::error::CliError;

fn main() -> ExitCode {
    protect_environment();
    // The watchdog process is tenure re-executed; it needs neither clap nor a runtime.
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == watchdog::SUBCOMMAND) {
        let rest: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
        return ExitCode::from(watchdog::process_main(&rest));
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
            Command::Run(args) => run::run(args).await,
            Command::Status(args) => status::status(args).await,
            Command::Crd => {
                print!("{}", tenure::crd::crd_yaml());
                Ok(0)
            }
            Command::Policy(args) => policy(&args).await,
            Command::Install { dir } => install(&dir),
            Command::Drain(args) => drain::drain(args).await,
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
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let (name, backend) = match &mut cli.command {
        Command::Run(args) => ("run", &mut args.backend),
        Command::Status(args) => ("status", &mut args.backend),
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

/// `tenure policy`: prints the anchor, the election's Lease, fencing policy and binding; with
/// `--check`, proves the API server enforces them.
async fn policy(args: &args::PolicyArgs) -> Result<u8, CliError> {
    use tenure::fence::kube::{FencingPolicy, PolicyError};
    let flag = |flag: &str, e: PolicyError| CliError::Config {
        message: format!("{flag}: {e}"),
    };
    let mut spec = FencingPolicy::new(&args.namespace, &args.lease).map_err(|e| {
        let namespace = matches!(
            &e,
            PolicyError::Invalid {
                what: "namespace",
                ..
            }
        );
        flag(if namespace { "--namespace" } else { "--lease" }, e)
    })?;
    let default_sa = ["tenure".to_owned()];
    let service_accounts = if args.service_accounts.is_empty() && args.users.is_empty() {
        &default_sa[..]
    } else {
        &args.service_accounts[..]
    };
    for sa in service_accounts {
        let (ns, name) = sa.split_once('/').unwrap_or((&args.namespace, sa));
        spec = spec
            .service_account(ns, name)
            .map_err(|e| flag("--service-account", e))?;
    }
    for user in &args.users {
        spec = spec.user(user).map_err(|e| flag("--user", e))?;
    }
    for resource in &args.resources {
        spec = spec.resource(resource).map_err(|e| flag("--resource", e))?;
    }
    if !args.check {
        print!("{}", spec.to_yaml());
        return Ok(0);
    }
    // The first participant speaks for all: the policy matches them alike.
    let participant = service_accounts
        .first()
        .map(|sa| {
            let (ns, name) = sa.split_once('/').unwrap_or((&args.namespace, sa));
            format!("system:serviceaccount:{ns}:{name}")
        })
        .or_else(|| args.users.first().cloned())
        .unwrap_or_default();
    let client = backend::kube_client("tenure policy --check").await?;
    let lease = format!("{}/{}", args.namespace, args.lease);
    match tenure::fence::kube::check(&client, &spec, &participant).await {
        Ok(tenure::fence::kube::CheckVerdict::Enforced { floor }) => {
            println!(
                "fence on lease {lease} enforced by the API server (floor {floor}, checked as \
                 {participant})"
            );
            Ok(0)
        }
        Ok(tenure::fence::kube::CheckVerdict::Open { message, .. }) => Err(CliError::FenceOpen {
            message: format!("fence on lease {lease} is not enforced: {message}"),
        }),
        Ok(other) => Err(CliError::Internal {
            message: format!("unexpected verdict {other:?}"),
        }),
        Err(kube::Error::Api(s)) => Err(CliError::Backend {
            message: format!(
                "cannot check the fence on lease {lease}: {} ({}){}",
                s.message,
                s.code,
                if s.code == 403 {
                    "; the check impersonates the participant: it needs `impersonate` on it and on userextras/tenure.dev/fencing-token, and the participant `create` on leases"
                } else {
                    ""
                }
            ),
        }),
        Err(e) => Err(CliError::Backend {
            message: format!("cannot check the fence on lease {lease}: {e}"),
        }),
    }
}

/// `tenure install DIR`: copies this executable to `DIR/tenure`.
///
/// The copy is written to a new temporary file in DIR (`O_EXCL` and `O_NOFOLLOW`: never
/// through a link someone placed there), made executable, synced, and renamed over
/// `DIR/tenure`. A rename replaces a symbolic link itself, never its target, and whoever runs
/// `DIR/tenure` meanwhile gets the old file or the whole new one.
fn install(dir: &std::path::Path) -> Result<u8, CliError> {
    use std::fs::{File, OpenOptions, Permissions};
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let fail = |what: &str, e: std::io::Error| CliError::Config {
        message: format!("install into {}: {what}: {e}", dir.display()),
    };
    let me = std::env::current_exe().map_err(|e| fail("cannot find this executable", e))?;
    let target = dir.join("tenure");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let temp = dir.join(format!(".tenure.{}.{nanos}.tmp", std::process::id()));
    let written = (|| {
        let mut source = File::open(&me).map_err(|e| fail("cannot read this executable", e))?;
        let mut copy = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp)
            .map_err(|e| fail("cannot create a temporary file", e))?;
        std::io::copy(&mut source, &mut copy).map_err(|e| fail("cannot copy", e))?;
        // Not subject to the umask, unlike the mode given at creation.
        copy.set_permissions(Permissions::from_mode(0o755))
            .map_err(|e| fail("cannot make it executable", e))?;
        copy.sync_all()
            .map_err(|e| fail("cannot sync the copy", e))?;
        drop(copy);
        std::fs::rename(&temp, &target).map_err(|e| fail("cannot move the copy into place", e))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    // The rename itself survives a crash once the directory is synced; best effort.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    println!("{}", target.display());
    Ok(0)
}
