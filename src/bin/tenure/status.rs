//! `tenure status`: who holds a lease, as the store sees it.

use std::io::Write;

use crate::args::{Output, StatusArgs};
use crate::backend;
use crate::error::CliError;

/// Prints the lease's holder; exit code 0 whether or not it is held.
pub async fn status(args: StatusArgs) -> Result<u8, CliError> {
    let connected = backend::connect(&args.backend, false).await?;
    connected
        .backend
        .validate_name(&args.lease)
        .map_err(|e| CliError::Config {
            message: format!("--lease: {e}"),
        })?;
    let record = connected
        .backend
        .inspect(&args.lease)
        .await
        .map_err(|e| CliError::backend(&format!("cannot read lease {:?}", args.lease), &e))?;
    let text = match args.output {
        Output::Json => {
            let value = serde_json::json!({
                "lease": args.lease,
                "backend": connected.description,
                "held": record.is_some(),
                "holder": record.as_ref().map(|r| r.identity.clone()),
                "fencingToken": record.as_ref().map(|r| r.fencing.get()),
                "expiresInMs": record.as_ref().and_then(|r| r.remaining).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                "transitions": record.as_ref().and_then(|r| r.transitions),
            });
            format!("{value}\n")
        }
        Output::Table => {
            let dash = || "-".to_owned();
            let (holder, token, expires, transitions) = match &record {
                // The identity comes from the store: anyone who can write there chooses it.
                Some(r) => (
                    crate::error::printable(&r.identity).into_owned(),
                    r.fencing.to_string(),
                    r.remaining
                        .map_or_else(dash, |d| format!("{:.1}s", d.as_secs_f64())),
                    r.transitions.map_or_else(dash, |t| t.to_string()),
                ),
                None => ("<none>".to_owned(), dash(), dash(), dash()),
            };
            let rows = [
                [
                    "LEASE",
                    "HOLDER",
                    "FENCING TOKEN",
                    "EXPIRES IN",
                    "TRANSITIONS",
                ]
                .map(str::to_owned),
                [
                    crate::error::printable(&args.lease).into_owned(),
                    holder,
                    token,
                    expires,
                    transitions,
                ],
            ];
            let widths: Vec<usize> = (0..5)
                .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
                .collect();
            let mut out = String::new();
            for row in &rows {
                let cells: Vec<String> = row
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect();
                out.push_str(cells.join("   ").trim_end());
                out.push('\n');
            }
            out
        }
    };
    // A closed pipe (`tenure status | head -0`) is not an error worth a message.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(0)
}
