//! `tenure run`: campaign for the lease (or, with `--shards`, a share of the group's shards)
//! and run the command for each term won.
//!
//! The files import downwards only: `single` and `sharded` (the two ways to run, with
//! `publish`, `restart` and `shard_probe` beside them) use `setup` (what both do before campaigning) and
//! `supervisor` (the command of one term, and tenure's own signals, for both), and `single`
//! uses `once` (`--once-per`: the completion check and record around the term); `supervisor`
//! drives `crate::process` and, with `--fence`, `fence` (the term's fenced Kubernetes endpoint);
//! `check` (`--check`: the pre-flight, instead of campaigning) uses `setup`. Nothing here
//! imports this file.

mod check;
mod fence;
mod health;
mod once;
mod publish;
mod restart;
mod setup;
mod shard_probe;
mod sharded;
mod single;
mod supervisor;

use crate::args::RunArgs;
use crate::error::CliError;

/// Runs `tenure run`; the result is the process exit code.
pub async fn run(args: RunArgs) -> Result<u8, CliError> {
    setup::check_durations(&args)?;
    if args.check {
        return check::run(&args).await;
    }
    match args.shards {
        Some(shards) => sharded::run(args, shards).await,
        None => single::run(args).await,
    }
}
