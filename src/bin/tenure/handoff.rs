//! `tenure handoff`: ask a lease's holder, through the store, to hand leadership over, and
//! wait until it has.

use std::io::Write as _;
use std::time::Duration;

use tenure::backend::Handoff;
use tenure::lock::MAX_IDENTITY_LEN;

use crate::args::HandoffArgs;
use crate::backend;
use crate::error::{CliError, printable};

/// How often the lease is read while the hand-over happens.
const POLL: Duration = Duration::from_millis(20);

/// Records the request and waits for a new holder: 0 moved (to `--to` when given), 1 not
/// moved within `--wait`, 6 the lease is not held.
pub async fn handoff(args: HandoffArgs) -> Result<u8, CliError> {
    let target = match &args.to {
        None => Handoff::Anyone,
        Some(to)
            if to.is_empty() || to.len() > MAX_IDENTITY_LEN || to.contains(char::is_control) =>
        {
            return Err(CliError::Config {
                message: format!(
                    "--to: {:?} is not an identity (1 to {MAX_IDENTITY_LEN} bytes, no control characters)",
                    printable(to)
                ),
            });
        }
        Some(to) => Handoff::To(to.clone()),
    };
    if args.window.is_zero() {
        return Err(CliError::Config {
            message: "--window must be positive".to_owned(),
        });
    }
    let connected = backend::connect(&args.backend, false).await?;
    let store = &connected.backend;
    store
        .validate_name(&args.lease)
        .map_err(|e| CliError::Config {
            message: format!("--lease: {e}"),
        })?;
    let read_error = |e| CliError::backend(&format!("cannot read lease {:?}", args.lease), &e);
    let Some(before) = store.inspect(&args.lease).await.map_err(read_error)? else {
        return Err(not_held(&args.lease));
    };
    if target.target() == Some(before.identity.as_str()) {
        say(&format!(
            "lease {} is already held by {}",
            args.lease,
            printable(&before.identity)
        ));
        return Ok(0);
    }
    let asked = store
        .request_handoff(&args.lease, &target, args.window)
        .await
        .map_err(|e| CliError::backend(&format!("cannot ask for lease {:?}", args.lease), &e))?;
    if !asked {
        return Err(not_held(&args.lease));
    }
    tracing::info!(lease = %args.lease, holder = %before.identity, to = ?target.target(), "asked the holder to hand over");
    let deadline = tokio::time::Instant::now() + args.wait;
    loop {
        match store.inspect(&args.lease).await {
            Ok(Some(now)) if now.fencing != before.fencing => {
                let moved = target.target().is_none_or(|to| to == now.identity);
                say(&format!(
                    "lease {} handed over: {} -> {} (fencing token {} -> {}){}",
                    args.lease,
                    printable(&before.identity),
                    printable(&now.identity),
                    before.fencing,
                    now.fencing,
                    if moved { "" } else { ", not to --to" }
                ));
                return Ok(if moved { 0 } else { 1 });
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the lease; retrying"),
        }
        if tokio::time::Instant::now() >= deadline {
            say(&format!(
                "lease {} is still held by {} after --wait {:?}",
                args.lease,
                printable(&before.identity),
                args.wait
            ));
            return Ok(1);
        }
        tokio::time::sleep(POLL).await;
    }
}

fn not_held(lease: &str) -> CliError {
    CliError::NotAcquired {
        message: format!("lease {lease} is not held: nobody to hand over from"),
    }
}

fn say(line: &str) {
    // A closed pipe is not an error worth a message.
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}
