//! Runs the Lua scripts: batches of entries become EVALSHA calls, sent as one pipeline (one
//! round trip), reloaded on NOSCRIPT in that same retry, and their answers parsed into the
//! backend's values.
//!
//! [`Engine::send`] is the one way a script call reaches the server, and [`Engine::call`] the
//! one way to make a single call of a script; the lock scripts' calls are built here, the
//! membership, group and completion scripts' in their own files on top of `call` (this file
//! knows nothing of them: `connect.rs` hands [`Engine::load_scripts`] every list).

use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::redis::{Pipeline, Value};

use super::conn::Conn;
use super::error::{Scrubber, from_conn, from_redis, from_reply};
use super::keys::Keys;
use crate::backend::{
    Acquired, BackendError, BackendErrorKind, FencingToken, HolderChange, LeaseRecord, Released,
    Renewed,
};

/// One Lua script, with its SHA1 for EVALSHA.
pub(crate) struct Lua {
    pub(crate) name: &'static str,
    pub(crate) src: &'static str,
    pub(crate) sha: String,
}

impl Lua {
    pub(super) fn new(name: &'static str, src: &'static str) -> Self {
        Self {
            name,
            src,
            sha: ::redis::Script::new(src).get_hash().to_owned(),
        }
    }
}

/// A script's source: `value.lua` (the one test of a lock value's layout, `ours`) and then the
/// script's own file.
macro_rules! script {
    ($file:literal) => {
        concat!(include_str!("value.lua"), include_str!($file))
    };
}

pub(crate) static ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("acquire", script!("acquire.lua")));
pub(crate) static RENEW: LazyLock<Lua> = LazyLock::new(|| Lua::new("renew", script!("renew.lua")));
pub(crate) static RELEASE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("release", script!("release.lua")));
pub(crate) static INSPECT: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("inspect", script!("inspect.lua")));
pub(crate) static HANDOFF: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("handoff", script!("handoff.lua")));

/// The lock scripts, for loading them up front (with the other scripts of the backend: see
/// [`Engine::load_scripts`]).
pub(crate) fn lock_scripts() -> [&'static Lua; 6] {
    [
        &*ACQUIRE, &*RENEW, &*RELEASE, &*INSPECT, &*HANDOFF, &*RELEASED,
    ]
}

/// `released.lua`: a released lock's tombstone, for `tenure status`.
static RELEASED: LazyLock<Lua> = LazyLock::new(|| Lua::new("released", script!("released.lua")));

/// Counters of what the engine sent.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) round_trips: AtomicU64,
    pub(crate) script_calls: AtomicU64,
    pub(crate) entries: AtomicU64,
    pub(crate) reloads: AtomicU64,
}

/// One acquire attempt, in the form the script takes.
pub(crate) struct AcquireEntry {
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) next: String,
    pub(crate) holder: String,
    pub(crate) identity: Arc<str>,
    pub(crate) ttl_ms: u64,
}

/// One renewal.
pub(crate) struct RenewEntry {
    pub(crate) lock: String,
    pub(crate) holder: String,
    pub(crate) ttl_ms: u64,
}

/// One release.
pub(crate) struct ReleaseEntry {
    pub(crate) lock: String,
    pub(crate) holder: String,
    /// The identity the lock must also name as its holder (`release_as`), if any.
    pub(crate) identity: Option<String>,
    /// The lease may have less than the release-ack ttl left on the server: the tombstone's
    /// ttl must be raised to it.
    pub(crate) short: bool,
}

/// A lock's state as one atomic read sees it, with its place in the lock's history.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    pub(crate) record: Option<LeaseRecord>,
    pub(crate) version: Version,
}

/// Orders the states of one lock: held by token `f` is `(f, 0)`, freed after token `f` is
/// `(f, 1)`. Fencing tokens only rise, so a later state always has a greater version; this is
/// how observers drop notifications that arrive after a fresher read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Version(pub(crate) u64, pub(crate) u8);

impl Snapshot {
    pub(crate) fn change(&self) -> HolderChange {
        self.record
            .as_ref()
            .map_or_else(HolderChange::free, |r| HolderChange {
                holder: Some(r.identity.clone()),
                fencing: Some(r.fencing),
            })
    }
}

/// Sends script calls over the shared connection.
pub(crate) struct Engine {
    pub(crate) conn: Conn,
    pub(crate) keys: Keys,
    pub(crate) scrub: Scrubber,
    pub(crate) counters: Counters,
    /// The most entries one script call carries on a single server; larger batches become
    /// several calls in one pipeline, so that no single script blocks the server for long. (In
    /// a cluster, `run_batch` sends one call per entry.)
    pub(crate) max_entries: usize,
    pub(crate) ack_ttl: Duration,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("prefix", &self.keys.prefix())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Sends the pipeline `pipe` of EVALSHA calls (`scripts[i]` is the script of call `i`) in one
    /// round trip. Calls answered NOSCRIPT are retried, after loading their scripts, in one more
    /// round trip. Each call's answer is its reply or its own error.
    pub(super) async fn send(
        &self,
        pipe: &Pipeline,
        scripts: &[&'static Lua],
        what: &str,
    ) -> Result<Vec<Result<Value, BackendError>>, BackendError> {
        self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
        self.counters
            .script_calls
            .fetch_add(scripts.len() as u64, Ordering::Relaxed);
        let mut replies = self
            .conn
            .send(pipe, scripts.len())
            .await
            .map_err(|e| from_conn(&e, what, &self.scrub))?;
        if replies.len() != scripts.len() {
            return Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!(
                    "redis {what}: {} replies to {} calls",
                    replies.len(),
                    scripts.len()
                ),
            ));
        }
        let missing: Vec<usize> = replies
            .iter()
            .enumerate()
            .filter(|(_, r)| is_noscript(r))
            .map(|(i, _)| i)
            .collect();
        if !missing.is_empty() {
            let mut retry = ::redis::pipe();
            let mut loaded: Vec<&str> = Vec::new();
            for &i in &missing {
                if !loaded.contains(&scripts[i].name) {
                    loaded.push(scripts[i].name);
                    retry.cmd("SCRIPT").arg("LOAD").arg(scripts[i].src);
                }
            }
            let commands: Vec<_> = pipe.cmd_iter().collect();
            for &i in &missing {
                if let Some(cmd) = commands.get(i) {
                    retry.add_command((*cmd).clone());
                }
            }
            tracing::debug!(scripts = ?loaded, "redis scripts missing (NOSCRIPT); reloading");
            self.counters
                .reloads
                .fetch_add(loaded.len() as u64, Ordering::Relaxed);
            self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            let answers = self
                .conn
                .send(&retry, loaded.len() + missing.len())
                .await
                .map_err(|e| from_conn(&e, what, &self.scrub))?;
            let mut answers = answers.into_iter();
            for _ in 0..loaded.len() {
                if let Some(Value::ServerError(e)) = answers.next() {
                    let e: ::redis::RedisError = e.into();
                    return Err(from_redis(&e, "script load", &self.scrub));
                }
            }
            for &i in &missing {
                replies[i] = answers.next().unwrap_or(Value::Nil);
            }
        }
        Ok(replies
            .into_iter()
            .map(|r| match r {
                Value::ServerError(e) => {
                    let e: ::redis::RedisError = e.into();
                    Err(from_redis(&e, what, &self.scrub))
                }
                other => Ok(other),
            })
            .collect())
    }

    /// Runs `script` over `entries` and parses each entry's answer with `parse`: on a single
    /// server in calls of at most `max_entries`, one round trip; in a cluster one call per
    /// entry, concurrently.
    async fn run_batch<E, T>(
        &self,
        script: &'static Lua,
        what: &str,
        entries: &[E],
        keys_per_entry: usize,
        encode: impl Fn(&mut Pipeline, &[E]),
        parse: impl Fn(&Value) -> Result<T, BackendError>,
    ) -> Vec<Result<T, BackendError>> {
        if self.conn.batches() || entries.len() <= 1 {
            return self
                .run_calls(script, what, entries, keys_per_entry, &encode, &parse)
                .await;
        }
        let calls = entries
            .chunks(1)
            .map(|one| self.run_calls(script, what, one, keys_per_entry, &encode, &parse));
        futures::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// One call of `script` on `keys` with `args`, in a round trip of its own; its reply. It
    /// counts as one operation in [`RedisStats`](super::RedisStats).
    pub(super) async fn call(
        &self,
        script: &'static Lua,
        what: &str,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Value, BackendError> {
        let mut pipe = ::redis::pipe();
        let cmd = pipe.cmd("EVALSHA").arg(&script.sha).arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        for a in args {
            cmd.arg(*a);
        }
        self.counters.entries.fetch_add(1, Ordering::Relaxed);
        self.send(&pipe, &[script], what)
            .await?
            .pop()
            .unwrap_or(Ok(Value::Nil))
    }

    /// Runs `script` over `entries` in calls of at most `max_entries`, one round trip.
    async fn run_calls<E, T>(
        &self,
        script: &'static Lua,
        what: &str,
        entries: &[E],
        keys_per_entry: usize,
        encode: &impl Fn(&mut Pipeline, &[E]),
        parse: &impl Fn(&Value) -> Result<T, BackendError>,
    ) -> Vec<Result<T, BackendError>> {
        if entries.is_empty() {
            return Vec::new();
        }
        let chunks: Vec<&[E]> = entries.chunks(self.max_entries.max(1)).collect();
        let mut pipe = ::redis::pipe();
        for chunk in &chunks {
            pipe.cmd("EVALSHA")
                .arg(&script.sha)
                .arg(chunk.len() * keys_per_entry);
            encode(&mut pipe, chunk);
        }
        self.counters
            .entries
            .fetch_add(entries.len() as u64, Ordering::Relaxed);
        let scripts = vec![script; chunks.len()];
        let replies = match self.send(&pipe, &scripts, what).await {
            Ok(r) => r,
            Err(e) => return errors(&e, entries.len()).collect(),
        };
        let mut out = Vec::with_capacity(entries.len());
        for (chunk, reply) in chunks.iter().zip(replies) {
            match reply {
                Ok(Value::Array(items)) if items.len() == chunk.len() => {
                    out.extend(items.iter().map(|item| match entry_error(item) {
                        Some(msg) => Err(from_reply(&msg, what, &self.scrub)),
                        None => parse(item),
                    }));
                }
                Ok(other) => {
                    out.extend(errors(&protocol(what, &other), chunk.len()));
                }
                Err(e) => out.extend(errors(&e, chunk.len())),
            }
        }
        out
    }

    pub(crate) async fn acquire(
        &self,
        entries: Vec<AcquireEntry>,
    ) -> Vec<Result<Acquired, BackendError>> {
        self.run_batch(
            &ACQUIRE,
            "acquire",
            &entries,
            3,
            |pipe, chunk| {
                for e in chunk {
                    pipe.arg(&e.lock).arg(&e.fence).arg(&e.next);
                }
                for e in chunk {
                    pipe.arg(&e.holder).arg(&*e.identity).arg(e.ttl_ms);
                }
            },
            |item| parse_acquired(item).ok_or_else(|| protocol("acquire", item)),
        )
        .await
    }

    pub(crate) async fn renew(
        &self,
        entries: Vec<RenewEntry>,
    ) -> Vec<Result<Renewed, BackendError>> {
        self.renew_slice(&entries).await
    }

    pub(crate) async fn renew_slice(
        &self,
        entries: &[RenewEntry],
    ) -> Vec<Result<Renewed, BackendError>> {
        self.run_batch(
            &RENEW,
            "renew",
            entries,
            1,
            |pipe, chunk| {
                for e in chunk {
                    pipe.arg(&e.lock);
                }
                for e in chunk {
                    pipe.arg(&e.holder).arg(e.ttl_ms);
                }
            },
            |item| match as_i64(item) {
                Some(1) => Ok(Renewed::Held),
                Some(0) => Ok(Renewed::NotHeld),
                _ => Err(protocol("renew", item)),
            },
        )
        .await
    }

    pub(crate) async fn release(
        &self,
        entries: Vec<ReleaseEntry>,
    ) -> Vec<Result<Released, BackendError>> {
        let ack_ms = millis(self.ack_ttl).max(1);
        self.run_batch(
            &RELEASE,
            "release",
            &entries,
            1,
            |pipe, chunk| {
                for e in chunk {
                    pipe.arg(&e.lock);
                }
                let short: String = chunk
                    .iter()
                    .map(|e| if e.short { '1' } else { '0' })
                    .collect();
                pipe.arg(ack_ms).arg(short);
                for e in chunk {
                    match &e.identity {
                        None => pipe.arg(&e.holder),
                        Some(identity) => pipe.arg(format!("{}{identity}", e.holder)),
                    };
                }
            },
            |item| match as_i64(item) {
                Some(1) => Ok(Released::Released),
                Some(0) => Ok(Released::NotHeld),
                _ => Err(protocol("release", item)),
            },
        )
        .await
    }

    /// Reads a lock's record and its version, atomically; with `watch`, also marks the lock
    /// watched so that its grants and releases are published (what an observer does).
    pub(crate) async fn inspect(&self, name: &str, watch: bool) -> Result<Snapshot, BackendError> {
        let (lock, fence, next) = (
            self.keys.lock(name),
            self.keys.fence(name),
            self.keys.next(name),
        );
        let watch: &[u8] = if watch { b"1" } else { b"0" };
        let reply = self
            .call(&INSPECT, "inspect", &[&lock, &fence, &next], &[watch])
            .await?;
        parse_snapshot(&reply).ok_or_else(|| match &reply {
            // The script returns a value that is not tenure's as it is, and leaves it alone.
            Value::Array(parts) if matches!(parts.first(), Some(Value::BulkString(_))) => {
                BackendError::new(
                    BackendErrorKind::Protocol,
                    format!(
                        "redis inspect: key {} holds a value that is not a tenure lock (tenure never takes or changes it)",
                        self.keys.lock(name)
                    ),
                )
            }
            other => protocol("inspect", other),
        })
    }

    /// Records `to` (`None`: anyone) as the preferred next holder of `name` for `window`
    /// if the lock is held — by `holder` when given (handoff.lua). Answers whether it was.
    pub(crate) async fn hand_over(
        &self,
        name: &str,
        holder: Option<&str>,
        to: Option<&str>,
        window_ms: u64,
    ) -> Result<bool, BackendError> {
        let (lock, next) = (self.keys.lock(name), self.keys.next(name));
        let window = window_ms.max(1).to_string();
        let args: [&[u8]; 3] = [
            holder.unwrap_or("").as_bytes(),
            to.unwrap_or("").as_bytes(),
            window.as_bytes(),
        ];
        let reply = self
            .call(&HANDOFF, "handoff", &[&lock, &next], &args)
            .await?;
        match as_i64(&reply) {
            Some(1) => Ok(true),
            Some(0) => Ok(false),
            _ => Err(protocol("handoff", &reply)),
        }
    }

    /// Who released lock `name` last, while its tombstone lasts (at least the release-ack
    /// ttl): (identity, fencing token). `None` when the lock is held, gone, or not tenure's.
    pub(crate) async fn released_by(
        &self,
        name: &str,
    ) -> Result<Option<(String, FencingToken)>, BackendError> {
        let lock = self.keys.lock(name);
        let reply = self
            .call(&RELEASED, "read the released lock", &[&lock], &[])
            .await?;
        Ok(match reply {
            Value::BulkString(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|v| v.strip_prefix('~'))
                .and_then(|rest| parse_lock_value(&format!("+{rest}")))
                .filter(|(identity, _)| identity.len() <= crate::backend::types::MAX_IDENTITY_LEN),
            _ => None,
        })
    }

    /// Loads `scripts` (on every node of a cluster).
    pub(crate) async fn load_scripts(&self, scripts: &[&'static Lua]) -> Result<(), BackendError> {
        let sources: Vec<&str> = scripts.iter().map(|s| s.src).collect();
        self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
        let replies = self
            .conn
            .load(&sources)
            .await
            .map_err(|e| from_conn(&e, "script load", &self.scrub))?;
        if replies.len() != sources.len() {
            return Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!(
                    "redis script load: {} replies to {} scripts",
                    replies.len(),
                    sources.len()
                ),
            ));
        }
        for (script, r) in scripts.iter().zip(replies) {
            match r {
                Value::ServerError(e) => {
                    let e: ::redis::RedisError = e.into();
                    return Err(from_redis(&e, "script load", &self.scrub));
                }
                // The server names a loaded script by its SHA1; anything else is not a server
                // that runs tenure's scripts.
                other if as_string(&other).as_deref() == Some(&script.sha) => {}
                other => return Err(protocol("script load", &other)),
            }
        }
        Ok(())
    }
}

/// `n` copies of an error, one per entry of a failed call.
pub(crate) fn errors<T>(
    e: &BackendError,
    n: usize,
) -> impl Iterator<Item = Result<T, BackendError>> + '_ {
    (0..n).map(move |_| Err(e.clone()))
}

/// The holder token as 32 lowercase hex digits, the form the scripts compare (the same text as
/// [`HolderToken::to_hex`](crate::backend::HolderToken::to_hex), without its per-byte
/// formatting, which showed in profiles).
pub(crate) fn hex(token: &crate::backend::HolderToken) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(32);
    for b in token.as_bytes() {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

pub(super) fn protocol(what: &str, got: &Value) -> BackendError {
    let mut shown = format!("{got:?}");
    if shown.len() > 200 {
        let mut end = 200;
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        shown.truncate(end);
        shown.push('…');
    }
    BackendError::new(
        BackendErrorKind::Protocol,
        format!("redis {what}: unexpected answer {shown}"),
    )
}

/// `{-1, message}`: a per-entry error reported by a script.
fn entry_error(item: &Value) -> Option<String> {
    match item {
        Value::Array(parts) if parts.len() == 2 && as_i64(&parts[0]) == Some(-1) => {
            Some(as_string(&parts[1]).unwrap_or_else(|| "script error".to_owned()))
        }
        _ => None,
    }
}

pub(super) fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn as_string(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn as_fencing(v: &Value) -> Option<FencingToken> {
    let raw = match v {
        Value::Int(i) => u64::try_from(*i).ok()?,
        other => as_string(other)?.parse().ok()?,
    };
    (raw > 0).then_some(FencingToken::new(raw))
}

fn parse_acquired(item: &Value) -> Option<Acquired> {
    let Value::Array(parts) = item else {
        return Some(Acquired::Granted {
            fencing: as_fencing(item)?,
        });
    };
    match (as_i64(parts.first()?)?, parts.len()) {
        (0, 3) => {
            let pttl = as_i64(&parts[1])?;
            Some(Acquired::Busy {
                holder: as_string(&parts[2]),
                remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            })
        }
        _ => None,
    }
}

/// Splits a held lock's value (`+`, holder token, watch mark, previous releaser's token,
/// `<fencing>:<identity>`; see acquire.lua) into identity and fencing token. `None` for
/// anything else: every fixed position is checked, as the scripts' `ours` does.
fn parse_lock_value(value: &str) -> Option<(String, FencingToken)> {
    let b = value.as_bytes();
    let hex = |field: &[u8]| field.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    if b.len() < 68
        || b[0] != b'+'
        || !hex(&b[1..33])
        || !matches!(b[33], b'0' | b'1')
        || !(hex(&b[34..66]) || b[34..66].iter().all(|&c| c == b'-'))
    {
        return None;
    }
    let (fencing, identity) = value.get(66..)?.split_once(':')?;
    if fencing.is_empty() || fencing.len() > 19 || !fencing.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let fencing: u64 = fencing.parse().ok()?;
    Some((identity.to_owned(), FencingToken::new(fencing)))
}

fn parse_snapshot(reply: &Value) -> Option<Snapshot> {
    let Value::Array(parts) = reply else {
        return None;
    };
    // The hand-over part may be left out (a reply without one has no hand-over).
    let (value, pttl, counter, next) = match parts.as_slice() {
        [value, pttl, counter] => (value, pttl, counter, &Value::Nil),
        [value, pttl, counter, next] => (value, pttl, counter, next),
        _ => return None,
    };
    // '<fencing>:<target>': it concerns the holder only if it names the holder's term.
    let handoff = match next {
        Value::Nil => None,
        other => as_string(other).and_then(|v| {
            let (term, to) = v.split_once(':')?;
            let term: u64 = term.parse().ok()?;
            if to.len() > crate::backend::types::MAX_IDENTITY_LEN {
                tracing::warn!(
                    len = to.len(),
                    "redis: ignoring an oversized hand-over target"
                );
                return None;
            }
            let to = if to.is_empty() {
                crate::backend::Handoff::Anyone
            } else {
                crate::backend::Handoff::To(to.to_owned())
            };
            Some((term, to))
        }),
    };
    let counter = match counter {
        Value::Nil => 0,
        other => as_string(other)?.parse().ok()?,
    };
    match value {
        Value::Nil => Some(Snapshot {
            record: None,
            version: Version(counter, 1),
        }),
        other => {
            let (identity, fencing) = parse_lock_value(&as_string(other)?)?;
            let remaining = u64::try_from(as_i64(pttl)?).ok().map(Duration::from_millis);
            Some(Snapshot {
                record: Some(LeaseRecord {
                    identity,
                    fencing,
                    remaining,
                    transitions: None,
                    handoff: handoff
                        .filter(|(term, _)| *term == fencing.get())
                        .map(|(_, to)| to),
                    preferred_holder: false,
                }),
                version: Version(fencing.get(), 0),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn acquire_answers_parse() {
        assert_eq!(
            parse_acquired(&Value::Int(1_796_003_281_177_730)),
            Some(Acquired::Granted {
                fencing: FencingToken::new(1_796_003_281_177_730)
            })
        );
        let busy = Value::Array(vec![Value::Int(0), Value::Int(9989), bulk("host:1")]);
        assert_eq!(
            parse_acquired(&busy),
            Some(Acquired::Busy {
                holder: Some("host:1".into()),
                remaining: Some(Duration::from_millis(9989))
            })
        );
        let no_ttl = Value::Array(vec![Value::Int(0), Value::Int(-1), Value::Nil]);
        assert_eq!(
            parse_acquired(&no_ttl),
            Some(Acquired::Busy {
                holder: None,
                remaining: None
            })
        );
        assert_eq!(
            parse_acquired(&Value::Array(vec![Value::Int(1), Value::Int(5)])),
            None
        );
        assert_eq!(
            parse_acquired(&Value::Int(0)),
            None,
            "token zero is never issued"
        );
        assert_eq!(parse_acquired(&Value::Nil), None);
        assert_eq!(
            entry_error(&Value::Array(vec![Value::Int(-1), bulk("WRONGTYPE x")])).as_deref(),
            Some("WRONGTYPE x")
        );
    }

    #[test]
    fn snapshots_parse_and_order() {
        let held = Value::Array(vec![
            bulk(&format!("+{}1{}77:pod-a:1", "a".repeat(32), "-".repeat(32))),
            Value::Int(500),
            bulk("77"),
        ]);
        let s = parse_snapshot(&held).expect("parses");
        let r = s.record.clone().expect("held");
        assert_eq!(r.identity, "pod-a:1");
        assert_eq!(r.fencing, FencingToken::new(77));
        assert_eq!(r.remaining, Some(Duration::from_millis(500)));
        assert_eq!(s.version, Version(77, 0));
        let free = Value::Array(vec![Value::Nil, Value::Int(-2), bulk("77")]);
        let f = parse_snapshot(&free).expect("parses");
        assert!(f.record.is_none());
        assert!(
            f.version > s.version,
            "freed after 77 comes after held by 77"
        );
        let old_layout = Value::Array(vec![
            bulk(&format!("{}:77::pod-a", "a".repeat(32))),
            Value::Int(500),
            bulk("77"),
        ]);
        assert!(parse_snapshot(&old_layout).is_none(), "not tenure's layout");
        let token = "0123456789abcdef".repeat(2);
        let none = "-".repeat(32);
        let ours = |v: String| parse_lock_value(&v).map(|(id, f)| (id, f.get()));
        assert_eq!(
            ours(format!("+{token}0{none}7:")),
            Some((String::new(), 7)),
            "the shortest value"
        );
        assert_eq!(
            ours(format!("+{token}1{token}18446744073709551:a:b")),
            Some(("a:b".to_owned(), 18_446_744_073_709_551))
        );
        for foreign in [
            String::new(),
            "+".to_owned(),
            format!("+{}", &token[..31]),
            format!("~{token}0{none}7:pod"),
            format!("+{}0{none}7:pod", token.to_uppercase()),
            format!("+{}g0{none}7:pod", &token[..31]),
            format!("+{token}2{none}7:pod"),
            format!("+{token}0{}x{}7:pod", &none[..16], &none[17..]),
            format!("+{token}0{}-{}7:pod", &token[..16], &token[17..]),
            format!("+{token}0{none}:pod"),
            format!("+{token}0{none}7a:pod"),
            format!("+{token}0{none}7"),
            format!("+{token}0{none}12345678901234567890:pod"),
            format!("+{token}0{none}-7:pod"),
        ] {
            assert_eq!(ours(foreign.clone()), None, "{foreign:?}");
        }
        let fresh = Value::Array(vec![Value::Nil, Value::Int(-2), Value::Nil]);
        assert_eq!(
            parse_snapshot(&fresh).map(|s| s.version),
            Some(Version(0, 1))
        );
    }

    #[test]
    fn hex_matches_the_tokens_own_form() {
        for _ in 0..100 {
            let t = crate::backend::HolderToken::random();
            assert_eq!(hex(&t), t.to_hex());
        }
    }
}
