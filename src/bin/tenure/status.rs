//! `tenure status`: who holds a lease, as the store sees it; with `--shards`, every shard's
//! lease and the group's live members.

use std::io::Write;
use std::time::Duration;

use futures::StreamExt;
use tenure::backend::{EndedTerm, GroupRead, LeaseRecord, Member, TermEnd};

use crate::args::{Output, StatusArgs};
use crate::backend::{self, Connected};
use crate::error::{CliError, chain, printable};

/// How many shard leases are read at once.
const CONCURRENT_READS: usize = 16;

/// How long the group's members may take to read before `status` shows them as unknown.
const MEMBERS_TIMEOUT: Duration = Duration::from_secs(3);

/// Prints the lease's holder; exit code 0 whether or not it is held, unless
/// `--require-leader` (then [`CliError::Leaderless`] when it is free, after the print).
pub async fn status(args: StatusArgs) -> Result<u8, CliError> {
    let connected = backend::connect(&args.backend, false).await?;
    connected
        .backend
        .validate_name(&args.lease)
        .map_err(|e| CliError::Config {
            message: format!("--lease: {e}"),
        })?;
    let (text, free) = match args.shards {
        None => {
            let record = inspect(&connected, &args.lease).await?;
            let free = record
                .is_none()
                .then(|| format!("nobody holds lease {:?}", printable(&args.lease)));
            let ended = if record.is_none() {
                // Only shown, never decided on: a store that cannot say is not an error.
                connected
                    .backend
                    .last_term(&args.lease)
                    .await
                    .unwrap_or_else(|e| {
                        eprintln!(
                            "tenure: warning: cannot read how the last term of {:?} ended: {}",
                            printable(&args.lease),
                            chain(&e)
                        );
                        None
                    })
            } else {
                None
            };
            (
                single(&args, &connected, record.as_ref(), ended.as_ref()),
                free,
            )
        }
        Some(shards) => sharded(&args, &connected, shards).await?,
    };
    // A closed pipe (`tenure status | head -0`) is not an error worth a message.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    match free {
        Some(message) if args.require_leader => Err(CliError::Leaderless { message }),
        _ => Ok(0),
    }
}

/// What `--require-leader` refuses in a group: the shards whose lease nobody holds.
fn free_shards(group: &str, records: &[Option<LeaseRecord>]) -> Option<String> {
    let free: Vec<String> = (0u32..)
        .zip(records)
        .filter(|(_, r)| r.is_none())
        .map(|(shard, _)| shard.to_string())
        .collect();
    (!free.is_empty()).then(|| {
        format!(
            "nobody holds the lease of {} of the {} shards of {:?}: shard {}",
            free.len(),
            records.len(),
            printable(group),
            free.join(", ")
        )
    })
}

async fn inspect(connected: &Connected, lease: &str) -> Result<Option<LeaseRecord>, CliError> {
    connected
        .backend
        .inspect(lease)
        .await
        .map_err(|e| CliError::backend(&format!("cannot read lease {lease:?}"), &e))
}

fn expires_ms(r: &LeaseRecord) -> Option<u64> {
    r.remaining
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The JSON fields of one lease.
fn lease_json(
    lease: &str,
    record: Option<&LeaseRecord>,
) -> serde_json::Map<String, serde_json::Value> {
    let value = serde_json::json!({
        "lease": lease,
        "held": record.is_some(),
        "holder": record.map(|r| r.identity.clone()),
        "fencingToken": record.map(|r| r.fencing.get()),
        "expiresInMs": record.and_then(expires_ms),
        "transitions": record.and_then(|r| r.transitions),
    });
    match value {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

/// The table cells of one lease: lease, holder, token, expires in, transitions.
fn lease_cells(lease: &str, record: Option<&LeaseRecord>) -> Vec<String> {
    let dash = || "-".to_owned();
    let (holder, token, expires, transitions) = match record {
        // The identity comes from the store: anyone who can write there chooses it.
        Some(r) => (
            printable(&r.identity).into_owned(),
            r.fencing.to_string(),
            r.remaining
                .map_or_else(dash, |d| format!("{:.1}s", d.as_secs_f64())),
            r.transitions.map_or_else(dash, |t| t.to_string()),
        ),
        None => ("<none>".to_owned(), dash(), dash(), dash()),
    };
    vec![
        printable(lease).into_owned(),
        holder,
        token,
        expires,
        transitions,
    ]
}

/// The wall clock in milliseconds since the Unix epoch.
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `ms` since the Unix epoch as RFC 3339 UTC.
fn rfc3339(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| k8s_openapi::jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(|| format!("{ms} ms"), |t| t.to_string())
}

/// The JSON of how the last term ended.
fn ended_json(ended: &EndedTerm) -> serde_json::Value {
    serde_json::json!({
        "holder": ended.identity,
        "fencingToken": ended.fencing.map(|f| f.get()),
        "ended": match ended.end { TermEnd::Released => "released", TermEnd::Expired => "expired" },
        "endedAt": ended.ended_ms.map(rfc3339),
        "endedAgoMs": ended.ended_ms.map(|ms| wall_ms().saturating_sub(ms)),
    })
}

/// The line under the table of a free lease: who held it last, and when and how that ended.
fn ended_line(ended: &EndedTerm) -> String {
    let who = ended.identity.as_deref().map_or_else(
        || "an elector that left no name (client-go)".to_owned(),
        |i| printable(i).into_owned(),
    );
    let token = ended
        .fencing
        .map(|f| format!(" (fencing token {f})"))
        .unwrap_or_default();
    let how = match ended.end {
        TermEnd::Released => "released",
        TermEnd::Expired => "expired without renewal",
    };
    let when = ended.ended_ms.map_or_else(
        || ", time not kept by this store".to_owned(),
        |ms| {
            let ago = wall_ms().saturating_sub(ms);
            #[allow(clippy::cast_precision_loss)] // Display only.
            let secs = ago as f64 / 1000.0;
            format!(" at {} ({secs:.1}s ago)", rfc3339(ms))
        },
    );
    format!("last holder: {who}{token}, {how}{when}\n")
}

fn single(
    args: &StatusArgs,
    connected: &Connected,
    record: Option<&LeaseRecord>,
    ended: Option<&EndedTerm>,
) -> String {
    match args.output {
        Output::Json => {
            let mut map = lease_json(&args.lease, record);
            map.insert("backend".into(), connected.description.clone().into());
            if let Some(ended) = ended {
                map.insert("lastTerm".into(), ended_json(ended));
            }
            format!("{}\n", serde_json::Value::Object(map))
        }
        Output::Table => {
            let header = [
                "LEASE",
                "HOLDER",
                "FENCING TOKEN",
                "EXPIRES IN",
                "TRANSITIONS",
            ];
            let mut text = table(&header, &[lease_cells(&args.lease, record)]);
            if let Some(ended) = ended {
                text.push_str(&ended_line(ended));
            }
            text
        }
    }
}

/// A warning when the group's live members run another shard count than `--shards`: the
/// table then shows only part of the group (or leases nobody runs).
fn count_warning(group: &str, shards: u32, members: &[tenure::backend::Member]) -> Option<String> {
    let mut others: Vec<(u32, Vec<&str>)> = Vec::new();
    for m in members.iter().filter(|m| m.shards != shards) {
        match others.iter_mut().find(|(n, _)| *n == m.shards) {
            Some((_, who)) => who.push(&m.identity),
            None => others.push((m.shards, vec![&m.identity])),
        }
    }
    if others.is_empty() {
        return None;
    }
    let runs: Vec<String> = others
        .iter()
        .map(|(n, who)| {
            format!(
                "{n} shards ({})",
                who.iter()
                    .map(|w| printable(w).into_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
        .collect();
    Some(format!(
        "members of {:?} run {}, not the {shards} given with --shards: the table shows the leases of {shards} shards",
        printable(group),
        runs.join(" and ")
    ))
}

/// The group's table or JSON, and which shards nobody holds ([`free_shards`]).
async fn sharded(
    args: &StatusArgs,
    connected: &Connected,
    shards: u32,
) -> Result<(String, Option<String>), CliError> {
    let names: Vec<String> = (0..shards)
        .map(|s| tenure::shard::lease_name(&args.lease, s))
        .collect();
    let records: Vec<Option<LeaseRecord>> = futures::stream::iter(names.iter())
        .map(|name| inspect(connected, name))
        .buffered(CONCURRENT_READS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let members = members(connected, &args.lease).await;
    if let Ok(list) = &members
        && let Some(warning) = count_warning(&args.lease, shards, list)
    {
        eprintln!("tenure: warning: {warning}");
    }
    let record = connected
        .backend
        .group_record(&args.lease)
        .await
        .map_err(|e| chain(&e));
    if let Ok(GroupRead::Present { record, .. }) = &record
        && record.shards != shards
    {
        eprintln!(
            "tenure: warning: the group record of {:?} says {record}, not the {shards} given with --shards",
            args.lease
        );
    }
    let record_text = match &record {
        Ok(GroupRead::Present { record, .. }) => record.to_string(),
        Ok(GroupRead::Damaged { reason }) => format!("damaged ({reason})"),
        Ok(_) => "none".to_owned(),
        Err(e) => format!("unknown ({e})"),
    };
    let free = free_shards(&args.lease, &records);
    let text = match args.output {
        Output::Json => {
            let leases: Vec<serde_json::Value> = names
                .iter()
                .zip(&records)
                .zip(0u32..)
                .map(|((name, record), shard)| {
                    let mut map = lease_json(name, record.as_ref());
                    map.insert("shard".into(), shard.into());
                    serde_json::Value::Object(map)
                })
                .collect();
            let (members, members_error) = match &members {
                Ok(list) => (
                    Some(
                        list.iter()
                            .map(|m| {
                                serde_json::json!({
                                    "identity": m.identity,
                                    "shards": m.shards,
                                    "joinedMs": m.joined_ms,
                                    "holds": m.holds,
                                })
                            })
                            .collect::<Vec<_>>(),
                    ),
                    None,
                ),
                Err(e) => (None, Some(e.clone())),
            };
            let value = serde_json::json!({
                "lease": args.lease,
                "backend": connected.description,
                "shards": shards,
                "shardLeases": leases,
                "members": members,
                "membersError": members_error,
                "groupRecord": match &record {
                    Ok(GroupRead::Present { record, .. }) => serde_json::json!({
                        "shards": record.shards,
                        "generation": record.generation,
                        "drainingFrom": record.draining_from,
                    }),
                    _ => serde_json::Value::Null,
                },
                "groupRecordState": printable(&record_text),
            });
            format!("{value}\n")
        }
        Output::Table => {
            let rows: Vec<Vec<String>> = names
                .iter()
                .zip(&records)
                .zip(0u32..)
                .map(|((name, record), shard)| {
                    let mut row = vec![shard.to_string()];
                    row.extend(lease_cells(name, record.as_ref()));
                    row
                })
                .collect();
            let header = [
                "SHARD",
                "LEASE",
                "HOLDER",
                "FENCING TOKEN",
                "EXPIRES IN",
                "TRANSITIONS",
            ];
            let mut out = table(&header, &rows);
            out.push('\n');
            out.push_str(&format!("GROUP RECORD: {}\n", printable(&record_text)));
            match members {
                Ok(list) => {
                    let rows: Vec<Vec<String>> = list
                        .iter()
                        .map(|m| {
                            let holds: Vec<String> = m.holds.iter().map(u32::to_string).collect();
                            vec![
                                printable(&m.identity).into_owned(),
                                m.shards.to_string(),
                                if holds.is_empty() {
                                    "-".to_owned()
                                } else {
                                    holds.join(",")
                                },
                            ]
                        })
                        .collect();
                    if rows.is_empty() {
                        out.push_str("MEMBERS: none\n");
                    } else {
                        out.push_str(&table(&["MEMBER", "SHARDS", "HOLDS"], &rows));
                    }
                }
                Err(e) => {
                    out.push_str(&format!("MEMBERS: unknown ({})\n", printable(&e)));
                }
            }
            out
        }
    };
    Ok((text, free))
}

/// The group's live members, or why they could not be read.
async fn members(connected: &Connected, group: &str) -> Result<Vec<Member>, String> {
    let mut stream = connected.backend.members(group);
    match tokio::time::timeout(MEMBERS_TIMEOUT, stream.next()).await {
        Ok(Some(Ok(list))) => Ok(list),
        Ok(Some(Err(e))) => Err(crate::error::chain(&e)),
        Ok(None) => Err("the membership stream ended".into()),
        Err(_) => Err(format!("no answer within {MEMBERS_TIMEOUT:?}")),
    }
}

/// Aligned columns, three spaces apart, trailing spaces trimmed.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    let all: Vec<&Vec<String>> = std::iter::once(&header).chain(rows).collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            all.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in all {
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

#[cfg(test)]
mod tests {
    use super::*;
    use tenure::backend::Member;

    fn member(identity: &str, shards: u32) -> Member {
        Member {
            identity: identity.into(),
            shards,
            joined_ms: 0,
            holds: Vec::new(),
        }
    }

    fn held() -> Option<LeaseRecord> {
        Some(LeaseRecord {
            identity: "a".into(),
            fencing: tenure::FencingToken::new(1),
            remaining: None,
            transitions: None,
            handoff: None,
            preferred_holder: false,
        })
    }

    #[test]
    fn require_leader_names_the_free_shards() {
        assert_eq!(free_shards("g", &[held(), held()]), None);
        assert_eq!(
            free_shards("g", &[None, held(), None]).as_deref(),
            Some("nobody holds the lease of 2 of the 3 shards of \"g\": shard 0, 2")
        );
    }

    #[test]
    fn a_count_other_than_the_groups_is_warned_about() {
        assert_eq!(
            count_warning("g", 4, &[member("a", 4), member("b", 4)]),
            None
        );
        assert_eq!(count_warning("g", 4, &[]), None);
        let w = count_warning("g", 2, &[member("a", 4), member("b", 4), member("c", 8)])
            .expect("a warning");
        assert_eq!(
            w,
            "members of \"g\" run 4 shards (a, b) and 8 shards (c), not the 2 given with --shards: the table shows the leases of 2 shards"
        );
    }
}
