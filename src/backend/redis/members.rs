//! Group membership on Redis, for sharded leadership ([`crate::shard`]): the three scripts
//! (`announce.lua`, `withdraw.lua`, `members.lua`), the encoding of a member's record, and the
//! members stream.
//!
//! A group `g` is two keys in one hash slot (`{g}`, like a lock's keys): the sorted set
//! `<prefix>{g}:members` scores each identity by the server time (ms, from `TIME` inside the
//! script) at which its announcement runs out, and the hash `<prefix>{g}:member-records` maps
//! each identity to its record. Announcements that change what readers see and withdrawals
//! are published on the channel `<prefix>{g}:members`, which the backend's one subscriber
//! connection serves with the locks' channels ([`GroupSubscription`]).
//!
//! A members stream subscribes, then reads the live set (pruning the expired members in the
//! same script), emits it, and reads again on every notification and when the earliest
//! announcement runs out (the server says how long from now), emitting only a set that
//! differs from the last one emitted. A record that does not decode is skipped with a warning
//! (once per identity and reason), never an error of the whole set.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ::redis::Value;
use futures::stream::BoxStream;
use tokio::time::Instant;

use super::engine::{Engine, Lua, as_i64, protocol};
use super::limit::MAX_REPLY_BYTES;
use super::observe::{GroupNote, GroupSubscription, Hub};
use crate::backend::{BackendError, BackendErrorKind, Member};

/// Announces or renews one member (its own text: it never reads a lock value, so no
/// `value.lua` before it).
static ANNOUNCE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("announce", include_str!("announce.lua")));
/// Removes one member.
static WITHDRAW: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("withdraw", include_str!("withdraw.lua")));
/// Reads the live members, pruning the expired ones.
static MEMBERS: LazyLock<Lua> = LazyLock::new(|| Lua::new("members", include_str!("members.lua")));

/// The membership scripts, for loading them up front with the lock scripts.
pub(crate) fn scripts() -> [&'static Lua; 3] {
    [&*ANNOUNCE, &*WITHDRAW, &*MEMBERS]
}

/// The longest member identity accepted, in bytes (a [`Locker`](crate::Locker)'s identity is
/// far shorter).
const MAX_IDENTITY: usize = 4096;
/// The longest encoded record accepted (`members.lua` marks a longer one unread).
const MAX_RECORD: usize = crate::backend::MAX_MEMBER_RECORD;
/// What one read of a group may return, identities and records with their framing: half of
/// [`MAX_REPLY_BYTES`], so a read never trips the reply limit that would cut the connection
/// every lease shares.
const READ_BUDGET: usize = MAX_REPLY_BYTES / 2;
/// The first and the longest pause before reading again after a failed read.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// The record of `member`, or why it cannot be announced.
pub(super) fn record_of(member: &Member) -> Result<String, BackendError> {
    if member.identity.len() > MAX_IDENTITY {
        return Err(BackendError::new(
            BackendErrorKind::Config,
            format!(
                "a member identity may have at most {MAX_IDENTITY} bytes, this one has {}",
                member.identity.len()
            ),
        ));
    }
    member.record()
}

/// One read of a group.
struct GroupRead {
    /// The live members with a valid record, sorted by identity.
    members: Vec<Member>,
    /// When the earliest live announcement runs out, from the read.
    next_expiry: Option<Duration>,
    /// Entries skipped: (identity, why).
    skipped: Vec<(String, &'static str)>,
}

/// One call of `script` on a group's two keys; its reply.
async fn group_call(
    engine: &Engine,
    script: &'static Lua,
    what: &str,
    group: &str,
    args: &[&[u8]],
) -> Result<Value, BackendError> {
    let (members, records) = (
        engine.keys.members(group),
        engine.keys.member_records(group),
    );
    engine.call(script, what, &[&members, &records], args).await
}

/// Announces `identity` with `record` for `ttl_ms`; whether readers were told.
pub(super) async fn announce_member(
    engine: &Engine,
    group: &str,
    identity: &str,
    record: &str,
    ttl_ms: u64,
) -> Result<bool, BackendError> {
    let ttl = ttl_ms.to_string();
    let args: [&[u8]; 3] = [identity.as_bytes(), record.as_bytes(), ttl.as_bytes()];
    let reply = group_call(engine, &ANNOUNCE, "announce member", group, &args).await?;
    match as_i64(&reply) {
        Some(1) => Ok(true),
        Some(0) => Ok(false),
        _ => Err(protocol("announce member", &reply)),
    }
}

/// Withdraws `identity`; whether it was there.
pub(super) async fn withdraw_member(
    engine: &Engine,
    group: &str,
    identity: &str,
) -> Result<bool, BackendError> {
    let reply = group_call(
        engine,
        &WITHDRAW,
        "withdraw member",
        group,
        &[identity.as_bytes()],
    )
    .await?;
    match as_i64(&reply) {
        Some(1) => Ok(true),
        Some(0) => Ok(false),
        _ => Err(protocol("withdraw member", &reply)),
    }
}

/// Reads the live members of `group` (and prunes the expired ones).
async fn read_members(engine: &Engine, group: &str) -> Result<GroupRead, BackendError> {
    let (budget, max_id, max_rec) = (
        READ_BUDGET.to_string(),
        MAX_IDENTITY.to_string(),
        MAX_RECORD.to_string(),
    );
    let reply = group_call(
        engine,
        &MEMBERS,
        "read members",
        group,
        &[budget.as_bytes(), max_id.as_bytes(), max_rec.as_bytes()],
    )
    .await?;
    parse_read(&reply).unwrap_or_else(|| Err(protocol("read members", &reply)))
}

/// Parses `members.lua`'s reply; `None` when it is not of that shape.
fn parse_read(reply: &Value) -> Option<Result<GroupRead, BackendError>> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let [now, earliest, complete, entries @ ..] = parts.as_slice() else {
        return None;
    };
    let (now, earliest) = (as_i64(now)?, as_i64(earliest)?);
    match as_i64(complete)? {
        1 => {}
        0 => {
            return Some(Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!(
                    "redis read members: the group's records are larger than one read may carry ({READ_BUDGET} bytes)"
                ),
            )));
        }
        _ => return None,
    }
    if entries.len() % 2 != 0 {
        return None;
    }
    let next_expiry = (earliest >= 0).then(|| {
        let ms = u64::try_from(earliest.saturating_sub(now)).unwrap_or(0);
        // A member is live while its score is above the server's now: read again just after.
        Duration::from_millis(ms.saturating_add(1))
    });
    let mut members = Vec::with_capacity(entries.len() / 2);
    let mut skipped = Vec::new();
    for pair in entries.chunks_exact(2) {
        let Value::BulkString(id) = &pair[0] else {
            return None;
        };
        let Ok(identity) = String::from_utf8(id.clone()) else {
            skipped.push((
                String::from_utf8_lossy(id).into_owned(),
                "identity not UTF-8",
            ));
            continue;
        };
        let decoded = match &pair[1] {
            Value::BulkString(record) => Member::decode(identity.as_str(), record),
            Value::Nil => Err("no record"),
            // members.lua's mark for an identity or record over its bound.
            Value::Int(-1) => Err("identity or record too large (its first 64 bytes shown)"),
            _ => return None,
        };
        match decoded {
            Ok(member) => members.push(member),
            Err(why) => skipped.push((identity, why)),
        }
    }
    members.sort_by(|a, b| a.identity.cmp(&b.identity));
    Some(Ok(GroupRead {
        members,
        next_expiry,
        skipped,
    }))
}

/// The members stream of `group` (valid) on `hub`'s subscriber connection.
pub(super) fn stream(
    hub: &Arc<Hub>,
    engine: Arc<Engine>,
    group: &str,
) -> BoxStream<'static, Result<Vec<Member>, BackendError>> {
    let sub = match hub.subscribe_group(engine.keys.members(group)) {
        Ok(sub) => sub,
        Err(e) => return Box::pin(futures::stream::once(async move { Err(e) })),
    };
    let watch = Watch {
        sub,
        engine,
        group: group.to_owned(),
        last: None,
        epoch: None,
        stale: true,
        next_expiry: None,
        backoff: None,
        skipped: Vec::new(),
    };
    Box::pin(futures::stream::unfold(watch, |mut w| async move {
        let item = w.next().await;
        Some((item, w))
    }))
}

/// The state behind one members stream.
struct Watch {
    sub: GroupSubscription,
    engine: Arc<Engine>,
    group: String,
    /// The set emitted last; `None` before the first.
    last: Option<Vec<Member>>,
    /// The subscriber connection's epoch when the channel was last confirmed; `None` until it
    /// is (again).
    epoch: Option<u64>,
    /// The group must be read again.
    stale: bool,
    /// When the earliest live announcement runs out.
    next_expiry: Option<Instant>,
    /// After a failed read, when to try again (and the pause used).
    backoff: Option<(Instant, Duration)>,
    /// What the last read skipped, so each is warned about once.
    skipped: Vec<(String, &'static str)>,
}

impl Watch {
    async fn next(&mut self) -> Result<Vec<Member>, BackendError> {
        loop {
            if self.stale {
                if let Some((at, _)) = self.backoff {
                    tokio::time::sleep_until(at).await;
                }
                match self.refresh().await {
                    Ok(Some(set)) => return Ok(set),
                    Ok(None) => {}
                    Err(e) => {
                        let pause = self
                            .backoff
                            .map_or(RETRY_MIN, |(_, p)| (p * 2).min(RETRY_MAX));
                        self.backoff = Some((Instant::now() + pause, pause));
                        return Err(e);
                    }
                }
            }
            let expiry = async {
                match self.next_expiry {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                note = self.sub.next() => match note {
                    GroupNote::Changed => self.stale = true,
                    GroupNote::Lost(epoch) if self.epoch.is_some_and(|e| epoch >= e) => {
                        self.epoch = None;
                        self.stale = true;
                        return Err(BackendError::new(
                            BackendErrorKind::Unavailable,
                            "redis notification connection dropped; membership changes may have been missed",
                        ));
                    }
                    GroupNote::Lost(_) => {}
                },
                () = expiry => self.stale = true,
            }
        }
    }

    /// Subscribes (if not yet) and reads the group; the set if it differs from the last one
    /// emitted.
    async fn refresh(&mut self) -> Result<Option<Vec<Member>>, BackendError> {
        if self.epoch.is_none() {
            self.epoch = Some(self.sub.confirmed().await?);
        }
        let t = self.sub.request_timeout();
        let read = tokio::time::timeout(t, read_members(&self.engine, &self.group))
            .await
            .map_err(|_| BackendError::timeout("redis read members", t))??;
        self.stale = false;
        self.backoff = None;
        self.next_expiry = read.next_expiry.map(|d| Instant::now() + d);
        for (identity, why) in &read.skipped {
            if !self.skipped.iter().any(|(i, w)| i == identity && w == why) {
                tracing::warn!(
                    group = %self.group,
                    identity = ?identity,
                    reason = why,
                    "skipping a malformed group membership record"
                );
            }
        }
        self.skipped = read.skipped;
        if self.last.as_ref() == Some(&read.members) {
            return Ok(None);
        }
        self.last = Some(read.members.clone());
        Ok(Some(read.members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn member(identity: &str, holds: Vec<u32>) -> Member {
        Member {
            identity: identity.to_owned(),
            shards: 8,
            joined_ms: 1_700_000_000_000,
            holds,
        }
    }

    #[test]
    fn oversized_members_are_refused_before_sending() {
        assert!(record_of(&member("ok", vec![1])).is_ok());
        let e = record_of(&member(&"x".repeat(MAX_IDENTITY + 1), vec![])).expect_err("long");
        assert_eq!(e.kind(), BackendErrorKind::Config);
        let e = record_of(&member("many", (0..20_000).collect())).expect_err("large");
        assert_eq!(e.kind(), BackendErrorKind::Config);
    }

    #[test]
    fn reads_parse_sorted_and_skip_malformed_entries() {
        let reply = Value::Array(vec![
            Value::Int(1_000),
            Value::Int(1_250),
            Value::Int(1),
            bulk("pod-b"),
            bulk("m1:8:5:"),
            bulk("pod-x"),
            bulk("garbage"),
            bulk("pod-a"),
            bulk("m1:8:4:1,5"),
            bulk("pod-y"),
            Value::Nil,
            Value::BulkString(vec![0xff]),
            bulk("m1:8:4:"),
            bulk("pod-huge"),
            Value::Int(-1),
        ]);
        let read = parse_read(&reply).expect("shape").expect("complete");
        let ids: Vec<&str> = read.members.iter().map(|m| m.identity.as_str()).collect();
        assert_eq!(ids, ["pod-a", "pod-b"]);
        assert_eq!(read.members[0].holds, vec![1, 5]);
        assert_eq!(read.next_expiry, Some(Duration::from_millis(251)));
        assert_eq!(read.skipped.len(), 4);
        let empty = Value::Array(vec![Value::Int(1_000), Value::Int(-1), Value::Int(1)]);
        let read = parse_read(&empty).expect("shape").expect("complete");
        assert!(read.members.is_empty());
        assert_eq!(read.next_expiry, None);
        let cut = Value::Array(vec![Value::Int(1_000), Value::Int(1_001), Value::Int(0)]);
        let e = parse_read(&cut).expect("shape").err().expect("incomplete");
        assert_eq!(e.kind(), BackendErrorKind::Protocol);
        assert!(parse_read(&Value::Nil).is_none());
        assert!(
            parse_read(&Value::Array(vec![
                Value::Int(1),
                Value::Int(2),
                Value::Int(1),
                bulk("odd")
            ]))
            .is_none()
        );
    }
}
