//! A lease store on a single Redis server (feature `redis`).
//!
//! Every primitive is one Lua script — [`acquire`](#the-scripts), renew, release — run with
//! EVALSHA over one multiplexed connection shared by every lease of the backend, one round trip
//! each (plus one after the server lost its script cache: the script is reloaded and the call
//! retried). Waiters are woken by a release notification on one shared subscriber connection.
//!
//! ```no_run
//! use std::time::Duration;
//! use tenure::backend::redis::{RedisBackend, RedisConfig};
//! use tenure::{LockOptions, Locker};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = RedisConfig::new("redis://tenure@127.0.0.1:6379/0")?.password("s3cret");
//! let locker = Locker::new(RedisBackend::connect(config).await?);
//! let opts = LockOptions::new().ttl(Duration::from_secs(15)).wait(Duration::from_secs(5));
//! locker
//!     .with_lock("nightly-report", &opts, |guard| async move {
//!         // Pass guard.fencing_token() to everything you write.
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Connection URLs
//!
//! - `redis://host:6379/0` — plain TCP, database 0.
//! - `redis://user:password@host:6379` — AUTH as an ACL user (the password may instead be given
//!   with [`RedisConfig::password`], which keeps it out of the URL).
//! - `rediss://host:6380` — TLS, verified against the system's roots (read once, when the
//!   backend connects), or against a private CA given with [`RedisConfig::ca_certificate_pem`].
//!   Host name verification cannot be turned off (`#insecure` is refused). tenure does the
//!   handshake itself (rustls, as the redis crate would), so that replies over TLS are bounded
//!   like plain ones.
//! - `redis+unix:///run/redis.sock` — a Unix socket.
//!
//! Passwords never appear in errors, logs or `Debug` output.
//!
//! # Key layout
//!
//! With the default prefix `tenure:` (see [`RedisConfig::key_prefix`]), lock `jobs` uses:
//!
//! | key | holds | ttl |
//! |---|---|---|
//! | `tenure:{jobs}` while held | `+<holder token><watched><previous holder token><fencing token>:<identity>` | the lease ttl (PX) |
//! | `tenure:{jobs}` once released | the same with `~` first (a tombstone: free) | what remained of the lease, at least [`release_ack_ttl`](RedisConfig::release_ack_ttl) |
//! | `tenure:{jobs}:fence` | the fencing counter | none |
//! | `tenure:{jobs}:next` | a hand-over: `<fencing token of the term handing over>:<target>` (empty target: anyone), written by `handoff.lua`; only that term's holder or tombstone heeds it | the hand-over window |
//! | `tenure:{jobs}:done` | a run-once job's completion record `c1:<token>:<started ms>:<took ms>:<identity>` (`completion.rs`), written only while the writer's token is the counter's value; `DEL` it to let the job run again | none |
//!
//! Holder tokens are 32 hex digits and `<watched>` is one character, so every field but the
//! identity sits at a fixed position: the scripts compare and patch the value in place (a
//! release turns the first byte into `~`) instead of splitting it into new strings, which is
//! what a script's time goes to. The tombstone is the release acknowledgement: a replayed
//! release finds its own holder token in it and reports success again; a successor's grant
//! keeps it as `<previous holder token>` (32 `-` when there was none), so a replay is still
//! recognised after a successor took the lock.
//!
//! A value under a lock key that does not have exactly this shape (every fixed position, a
//! fencing token of 1 to 19 digits) is not tenure's, whatever its first byte: an acquire answers
//! busy with no holder, renew and release answer not held, nothing overwrites or marks it, and
//! [`inspect`](crate::Backend::inspect) fails with [`BackendErrorKind::Protocol`].
//!
//! The channel `tenure:{jobs}` carries `r:<fencing>` for a release, so waiters retry at once,
//! and `g:<fencing>:<identity>` for a grant — when the lock is *watched*: `<watched>` is set to
//! `1` by an acquire answered "busy" (a waiter, which then listens) and by
//! [`observe`](crate::Backend::observe) (an observer, before its first read), and carried from
//! tombstone to grant. A lock nobody waits for or observes publishes nothing: there is no one
//! to tell. A grant on a missing key (first use, or after expiry, which loses the mark)
//! publishes `G:<fencing>:<identity>`; an observer hearing it marks the lock again, reading its
//! state in the same step.
//!
//! All keys of one lock share the hash tag `{jobs}`, so they live in one Redis Cluster slot;
//! lock names therefore may not contain `{` or `}`.
//!
//! # Group membership
//!
//! Sharded leadership ([`crate::shard`]) keeps a group's members here; group `web` (named by
//! the lock rules) uses:
//!
//! | key | holds | ttl |
//! |---|---|---|
//! | `tenure:{web}:members` | a sorted set: each member's identity, scored by the server time (ms, from `TIME`) at which its announcement runs out | the longest announcement's |
//! | `tenure:{web}:member-records` | a hash: identity → `m1:<shards>:<joined_ms>:<held shards, comma-separated>` | the same |
//! | `tenure:{web}:group-record` | a string: the group's record `g1:<shards>:<generation>:<draining from or ->` (`group.rs`), changed only by compare-and-swap | none |
//!
//! [`announce_member`](crate::Backend::announce_member) and
//! [`withdraw_member`](crate::Backend::withdraw_member) are scripts that also PUBLISH `a` or
//! `w` on the channel `tenure:{web}:members` when what readers see changed (a renewal with an
//! unchanged record publishes nothing). [`members`](crate::Backend::members) subscribes to that
//! channel on the backend's one subscriber connection (shared with every lock), then reads the
//! live set with a script that drops expired members in the same step, and reads again on
//! every notification and when the earliest announcement runs out, emitting only a changed
//! set. Records that do not decode are skipped with a warning. One read carries at most half
//! of [`MAX_REPLY_BYTES`] (a bigger group is a [`BackendErrorKind::Protocol`] error item);
//! identities are at most 4 KiB.
//!
//! # The scripts
//!
//! - **acquire**: if the lock key is free, store holder token + identity with PX ttl and return
//!   a new fencing token (INCR of the counter, which is first seeded from the server's `TIME` in
//!   microseconds when it is missing); if the key already holds this holder token (a replayed
//!   attempt), restart its ttl and return the original token; otherwise answer busy with the
//!   holder's identity and remaining PTTL.
//! - **renew**: restart the ttl if the holder token matches; never recreate a missing key.
//! - **release**: if the holder token matches, turn the key into a short-lived tombstone that
//!   acknowledges the release (so that a replayed release reports success again) and publish
//!   the release.
//!
//! Each script takes any number of locks. When many tasks acquire, release or renew at once,
//! the backend sends what queued up while the previous call was in flight as one call (group
//! commit), so that one script call serves many locks; a lone caller's request is sent at once,
//! never delayed. [`renew_many`](crate::Backend::renew_many) sends all due renewals in one round
//! trip. Turn coalescing off with [`RedisConfig::coalesce`] to send one call per lock; on a
//! [Redis Cluster](RedisConfig::cluster) every call carries one lock.
//!
//! # What survives a Redis restart
//!
//! | | without persistence, or after `FLUSHALL` | with AOF `appendfsync always` |
//! |---|---|---|
//! | held leases | lost: holders learn it at their next renewal (`NotHeld`) | kept (expiry by the server clock) |
//! | fencing tokens | keep rising: the counter is reseeded from the server's `TIME` (µs), assuming the server clock did not step back and no lock was granted more than once per µs on average | keep rising |
//! | release acks | lost: a replayed release reports `NotHeld` | kept until their ttl |
//! | loaded scripts | reloaded on NOSCRIPT (one extra round trip) | same |
//!
//! It is one Redis, not Redlock: a failover to a replica that had not received the latest
//! writes can lose a lease (and, with an async replica, the counter may go back until it is
//! reseeded). Only the fencing token, checked where you write, makes that safe.
//!
//! # ACL
//!
//! A user that can do exactly what tenure needs under the default prefix:
//!
//! ```text
//! ACL SETUSER tenure on >password resetkeys ~tenure:* resetchannels &tenure:* -@all
//!     +evalsha +script|load +subscribe +unsubscribe +ping
//!     +get +set +setrange +incr +pexpire +pttl +publish +time +strlen
//!     +zadd +zrem +zscore +zrangebyscore +zremrangebyscore +hset +hdel +hmget
//! ```
//!
//! (`+get … +hmget` are the commands the scripts call: Redis checks them against the caller's
//! permissions too; the `z…` and `h…` commands only group membership uses, `+strlen` only
//! the group record.) A denied command surfaces as [`BackendErrorKind::PermissionDenied`], a
//! refused password as [`BackendErrorKind::Unauthenticated`]. In a cluster the client also
//! discovers the topology with `CLUSTER SLOTS` (`+cluster|slots`) and follows a slot being
//! migrated with `ASKING` (`+asking`).
//!
//! # Caveats
//!
//! - Redis Cluster ([`RedisConfig::cluster`]): one script call per lock, no group commit, so a
//!   cluster serves fewer locks per second per node than a single server does. The subscriber
//!   connection goes to the seed node only; if that node is down, waiters fall back to their
//!   timers until it is back. The credentials go to every node the cluster names (its slot
//!   map, `MOVED`/`ASK` redirects), in the clear over `redis://` — a warning says so at
//!   connect; use `rediss://` (see [`RedisConfig::cluster`]). A map naming more than
//!   [`MAX_CLUSTER_MASTERS`] masters is refused.
//! - Expiry follows the server's clock (PX); a server clock that jumps forward ends leases early.
//!   Keep NTP slewing.
//! - One reply may hold at most [`MAX_REPLY_BYTES`]: a bigger or malformed one (a broken or
//!   hostile server) fails the request with [`BackendErrorKind::Protocol`] and closes the
//!   connection, before the reply's bytes are read. That holds over TCP, Unix sockets and TLS,
//!   for the command connection and the subscriber connection, and for every node connection of
//!   a cluster (tenure opens them itself; see [`RedisConfig::cluster`]).

mod batch;
mod cluster;
mod completion;
mod config;
mod conn;
mod connect;
mod engine;
mod error;
mod expiry;
mod group;
mod keys;
mod limit;
mod members;
mod observe;
mod ops;
mod server;
mod tls;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use self::batch::Coalescer;
use self::engine::{AcquireEntry, Engine, ReleaseEntry, RenewEntry};
use self::observe::Hub;
#[cfg(doc)]
use super::BackendErrorKind;
use super::{Acquired, Released, Renewed};

pub use self::cluster::MAX_CLUSTER_MASTERS;
pub use self::config::{DEFAULT_KEY_PREFIX, RedisConfig};
pub use self::keys::MAX_NAME_LEN;
pub use self::limit::MAX_REPLY_BYTES;

/// Counts of what a [`RedisBackend`] sent, from [`RedisBackend::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Round trips on the shared connection: each pipeline of script calls is one.
    pub round_trips: u64,
    /// Script calls (EVALSHA) sent.
    pub script_calls: u64,
    /// Operations those calls carried: each batched acquire, renewal and release, and each
    /// single call (inspects, hand-overs, member, group and completion records).
    pub operations: u64,
    /// Scripts reloaded after the server answered NOSCRIPT.
    pub script_reloads: u64,
    /// Channels the subscriber connection serves or is about to (locks' and groups').
    pub subscribed_channels: usize,
    /// Live [`observe`](crate::Backend::observe) and [`members`](crate::Backend::members)
    /// streams.
    pub observers: usize,
}

/// A lease store on one Redis server. See the [module docs](self).
///
/// Cheap to clone: clones share the connection, the subscriber and the batching. Dropping the
/// last clone closes the subscriber connection.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Arc<Engine>,
    expiries: expiry::Expiries,
    hub: Arc<Hub>,
    acquire: Coalescer<AcquireEntry, Acquired>,
    renew: Coalescer<RenewEntry, Renewed>,
    release: Coalescer<ReleaseEntry, Released>,
    request_timeout: Duration,
    url: String,
    shutdown: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.inner.url)
            .field("key_prefix", &self.inner.engine.keys.prefix())
            .field("stats", &self.stats())
            .finish()
    }
}

impl RedisBackend {
    /// What the backend has sent so far.
    #[must_use]
    pub fn stats(&self) -> RedisStats {
        let c = &self.inner.engine.counters;
        let (subscribed_channels, observers) = self.inner.hub.counts();
        RedisStats {
            round_trips: c.round_trips.load(Ordering::Relaxed),
            script_calls: c.script_calls.load(Ordering::Relaxed),
            operations: c.entries.load(Ordering::Relaxed),
            script_reloads: c.reloads.load(Ordering::Relaxed),
            subscribed_channels,
            observers,
        }
    }

    /// The key prefix in use.
    #[must_use]
    pub fn key_prefix(&self) -> &str {
        self.inner.engine.keys.prefix()
    }

    /// The lock key of `name` (`<prefix>{<name>}`), e.g. for `redis-cli` inspection.
    #[must_use]
    pub fn lock_key(&self, name: &str) -> String {
        self.inner.engine.keys.lock(name)
    }
}
