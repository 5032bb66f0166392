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
//!     +get +set +setrange +incr +pexpire +pttl +publish +time
//!     +zadd +zrem +zscore +zrangebyscore +zremrangebyscore +hset +hdel +hmget
//! ```
//!
//! (`+get … +hmget` are the commands the scripts call: Redis checks them against the caller's
//! permissions too; the `z…` and `h…` commands only group membership uses.) A denied command surfaces as [`BackendErrorKind::PermissionDenied`], a
//! refused password as [`BackendErrorKind::Unauthenticated`]. In a cluster the client also
//! discovers the topology with `CLUSTER SLOTS` (`+cluster|slots`).
//!
//! # Caveats
//!
//! - Redis Cluster ([`RedisConfig::cluster`]): one script call per lock, no group commit, so a
//!   cluster serves fewer locks per second per node than a single server does. The subscriber
//!   connection goes to the seed node only; if that node is down, waiters fall back to their
//!   timers until it is back.
//! - Expiry follows the server's clock (PX); a server clock that jumps forward ends leases early.
//!   Keep NTP slewing.
//! - One reply may hold at most [`MAX_REPLY_BYTES`]: a bigger or malformed one (a broken or
//!   hostile server) fails the request with [`BackendErrorKind::Protocol`] and closes the
//!   connection, before the reply's bytes are read. That holds over TCP, Unix sockets and TLS,
//!   for the command connection and the subscriber connection, on a cluster too. The exception
//!   is a Redis Cluster's command connections: the redis crate's cluster client opens them, and
//!   tenure cannot bound their replies. It takes a caller's connection type only through
//!   `ClusterClient::get_async_generic_connection`, which is `#[doc(hidden)]` (outside its
//!   semver), and that type is built by `cluster_async::Connect::connect_with_config`, a
//!   function without a receiver: it gets a node's address and an `AsyncConnectionConfig` whose
//!   fields are private, so a connection tenure made there could not know the backend's CA or
//!   connect timeout except through process-wide state.

mod batch;
mod conn;
mod engine;
mod error;
mod expiry;
mod keys;
mod limit;
mod members;
mod observe;
mod tls;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ::redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;

use self::batch::Coalescer;
use self::conn::{Conn, Connector, Managed};
use self::engine::{AcquireEntry, Engine, ReleaseEntry, RenewEntry, hex, millis};
use self::error::{Scrubber, from_redis};
use self::observe::Hub;
use super::{
    AcquireRequest, Acquired, Backend, BackendError, BackendErrorKind, HolderChange, HolderToken,
    InvalidName, LeaseRecord, Member, Released, RenewRequest, Renewed,
};

pub use self::keys::MAX_NAME_LEN;
pub use self::limit::MAX_REPLY_BYTES;

/// The key prefix used unless [`RedisConfig::key_prefix`] says otherwise.
pub const DEFAULT_KEY_PREFIX: &str = "tenure:";

/// How to reach the Redis server and lay out the keys: the input of [`RedisBackend::connect`].
///
/// | option | default |
/// |---|---|
/// | [`key_prefix`](Self::key_prefix) | `tenure:` |
/// | [`request_timeout`](Self::request_timeout) | 1 s |
/// | [`connect_timeout`](Self::connect_timeout) | 2 s |
/// | [`release_ack_ttl`](Self::release_ack_ttl) | 5 s |
/// | [`coalesce`](Self::coalesce) | on |
/// | [`max_batch`](Self::max_batch) | 256 locks per script call |
/// | [`cluster`](Self::cluster) | off: a single server |
///
/// Its `Debug` output shows the URL with the password replaced by `***`.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tenure::backend::redis::RedisConfig;
///
/// let config = RedisConfig::new("rediss://tenure:hunter2@redis.internal:6380/2")?
///     .key_prefix("myapp:locks:")
///     .request_timeout(Duration::from_millis(500));
/// assert_eq!(config.redacted_url(), "rediss://tenure:***@redis.internal:6380/2");
/// assert!(!format!("{config:?}").contains("hunter2"));
/// # Ok::<(), tenure::backend::BackendError>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct RedisConfig {
    info: ConnectionInfo,
    ca_pem: Option<Vec<u8>>,
    prefix: String,
    request_timeout: Duration,
    connect_timeout: Duration,
    release_ack_ttl: Duration,
    coalesce: bool,
    max_batch: usize,
    cluster: bool,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url())
            .field("ca_certificate", &self.ca_pem.as_ref().map(|_| "set"))
            .field("key_prefix", &self.prefix)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("release_ack_ttl", &self.release_ack_ttl)
            .field("coalesce", &self.coalesce)
            .field("max_batch", &self.max_batch)
            .field("cluster", &self.cluster)
            .finish()
    }
}

fn config_error(message: impl Into<String>) -> BackendError {
    BackendError::new(BackendErrorKind::Config, message)
}

impl RedisConfig {
    /// Parses a `redis://`, `rediss://` or `redis+unix://` URL (see the
    /// [module docs](self#connection-urls)); every other option at its default.
    ///
    /// # Errors
    ///
    /// [`BackendErrorKind::Config`] if the URL does not parse or asks for `#insecure` TLS. The
    /// message never repeats the URL's password.
    pub fn new(url: &str) -> Result<Self, BackendError> {
        let info = url.into_connection_info().map_err(|e| {
            config_error(format!(
                "invalid redis URL: {}",
                e.detail().map_or_else(
                    || e.category().to_owned(),
                    |d| {
                        // Details name the part that failed (a hostname, a scheme), never the
                        // password, but scrub to be sure.
                        Scrubber::new(password_in(url).as_deref()).scrub(d.to_owned())
                    }
                )
            ))
        })?;
        if let ConnectionAddr::TcpTls { insecure: true, .. } = info.addr() {
            return Err(config_error(
                "redis URL asks for #insecure TLS; tenure always verifies the server's host name (give a private CA with ca_certificate_pem instead)",
            ));
        }
        Ok(Self {
            info,
            ca_pem: None,
            prefix: DEFAULT_KEY_PREFIX.to_owned(),
            request_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
            release_ack_ttl: Duration::from_secs(5),
            coalesce: true,
            max_batch: 256,
            cluster: false,
        })
    }

    /// Authenticates as this ACL user (overrides the URL's user).
    pub fn username(mut self, username: &str) -> Self {
        let redis = self.info.redis_settings().clone().set_username(username);
        self.info = self.info.set_redis_settings(redis);
        self
    }

    /// Authenticates with this password (overrides the URL's), keeping it out of the URL.
    pub fn password(mut self, password: &str) -> Self {
        let redis = self.info.redis_settings().clone().set_password(password);
        self.info = self.info.set_redis_settings(redis);
        self
    }

    /// Trusts only this CA (PEM: one certificate, or a bundle) for `rediss://`, instead of the
    /// system's roots. A PEM without a certificate, or one that does not parse, fails
    /// [`RedisBackend::connect`] with [`BackendErrorKind::Config`].
    pub fn ca_certificate_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// The prefix of every key (default `tenure:`). Must not contain `{`, `}` or control
    /// characters (checked by [`RedisBackend::connect`]).
    pub fn key_prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// The bound on every request to the server (default 1 s); keep it below the retry period
    /// of what runs on top. A request that takes longer fails with
    /// [`BackendErrorKind::Timeout`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The bound on establishing a connection, TLS and AUTH included (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a released lock's tombstone (its release acknowledgement) lives at least, so
    /// that a replayed release still reports success (default 5 s).
    ///
    /// The tombstone keeps what remained of the lease's ttl; only a release that this backend
    /// cannot show to come at least this long before the lease's expiry raises it to this ttl
    /// (one more command in the script). Replays come from request retries, within seconds.
    pub fn release_ack_ttl(mut self, ttl: Duration) -> Self {
        self.release_ack_ttl = ttl;
        self
    }

    /// Whether to coalesce concurrent acquires, renewals and releases into shared script calls
    /// (default on). Off, every request is its own call.
    pub fn coalesce(mut self, on: bool) -> Self {
        self.coalesce = on;
        self
    }

    /// The most locks one script call carries (default 256); bigger batches become several
    /// calls in the same round trip, so no single script blocks the server for long.
    pub fn max_batch(mut self, max: usize) -> Self {
        self.max_batch = max;
        self
    }

    /// The URL with the password replaced by `***`, for logs.
    #[must_use]
    pub fn redacted_url(&self) -> String {
        let redis = self.info.redis_settings();
        let user = redis.username().unwrap_or("");
        let auth = match (user.is_empty(), redis.password().is_some()) {
            (true, false) => String::new(),
            (false, false) => format!("{user}@"),
            (_, true) => format!("{user}:***@"),
        };
        match self.info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                format!("redis://{auth}{}:{port}/{}", bracket(host), redis.db())
            }
            ConnectionAddr::TcpTls { host, port, .. } => {
                format!("rediss://{auth}{}:{port}/{}", bracket(host), redis.db())
            }
            ConnectionAddr::Unix(path) => {
                format!("redis+unix://{auth}{}?db={}", path.display(), redis.db())
            }
            _ => "redis://<unsupported address>".to_owned(),
        }
    }

    fn validate(&self) -> Result<(), BackendError> {
        keys::validate_prefix(&self.prefix).map_err(config_error)?;
        if self.request_timeout.is_zero() {
            return Err(config_error("request_timeout must be positive"));
        }
        if self.connect_timeout.is_zero() {
            return Err(config_error("connect_timeout must be positive"));
        }
        if self.release_ack_ttl < Duration::from_millis(1) {
            return Err(config_error("release_ack_ttl must be at least 1 ms"));
        }
        if self.max_batch == 0 {
            return Err(config_error("max_batch must be positive"));
        }
        if self.cluster {
            if matches!(self.info.addr(), ConnectionAddr::Unix(_)) {
                return Err(config_error(
                    "a Redis Cluster is reached over TCP, not a Unix socket",
                ));
            }
            if self.info.redis_settings().db() != 0 {
                return Err(config_error(
                    "a Redis Cluster has only database 0; drop the database from the URL",
                ));
            }
        }
        if self.ca_pem.is_some() && !matches!(self.info.addr(), ConnectionAddr::TcpTls { .. }) {
            return Err(config_error(
                "a CA certificate was given but the URL is not rediss://",
            ));
        }
        Ok(())
    }

    /// Treats the URL's server as a seed node of a Redis Cluster: the backend discovers the
    /// other nodes and sends each call to the node serving the lock's slot. Redirects and
    /// topology changes (resharding, failover) are followed by the redis crate's cluster
    /// client; tenure's tests run a stable three-master cluster and do not exercise them.
    ///
    /// In a cluster every script call carries one lock (the keys of different locks hash to
    /// different slots), so concurrent operations are not coalesced and
    /// [`max_batch`](Self::max_batch) does not apply; [`renew_many`](crate::Backend::renew_many)
    /// sends its renewals concurrently. Notifications come over one subscriber connection to
    /// the seed node (a cluster forwards every PUBLISH to every node). A cluster has only
    /// database 0.
    ///
    /// The same caveat as for a single server's replica applies to every shard: a failover to
    /// a replica that missed the latest writes can lose a lease, and only the fencing token,
    /// checked where you write, makes that safe.
    ///
    /// # Example
    ///
    /// ```
    /// use tenure::backend::redis::RedisConfig;
    ///
    /// let config = RedisConfig::new("redis://10.0.0.5:7000")?.cluster();
    /// # Ok::<(), tenure::backend::BackendError>(())
    /// ```
    pub fn cluster(mut self) -> Self {
        self.cluster = true;
        self
    }

    fn cluster_client(&self) -> Result<::redis::cluster::ClusterClient, BackendError> {
        let scrub = self.scrubber();
        let mut builder = ::redis::cluster::ClusterClient::builder(vec![self.info.clone()])
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.request_timeout);
        if let Some(pem) = &self.ca_pem {
            builder = builder.certs(::redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            });
        }
        builder
            .build()
            .map_err(|e| from_redis(&e, "cluster client", &scrub))
    }

    fn scrubber(&self) -> Scrubber {
        Scrubber::new(self.info.redis_settings().password())
    }
}

fn bracket(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// The password part of a URL's user info, to scrub it from parse errors.
fn password_in(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let userinfo = authority.rsplit_once('@')?.0;
    Some(userinfo.split_once(':')?.1.to_owned())
}

/// Counts of what a [`RedisBackend`] sent, from [`RedisBackend::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Round trips on the shared connection: each pipeline of script calls is one.
    pub round_trips: u64,
    /// Script calls (EVALSHA) sent.
    pub script_calls: u64,
    /// Lock operations those calls carried (acquires, renewals, releases, inspects).
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
    /// Connects (TLS and AUTH included) and loads the scripts.
    ///
    /// # Errors
    ///
    /// - [`BackendErrorKind::Config`] for an invalid option, or a server certificate the
    ///   configured CA does not vouch for;
    /// - [`BackendErrorKind::Unauthenticated`] if the server refuses the credentials;
    /// - [`BackendErrorKind::PermissionDenied`] if the user may not load scripts;
    /// - [`BackendErrorKind::Unavailable`] or [`BackendErrorKind::Timeout`] if the server cannot
    ///   be reached within the connect timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the half-made connection.
    pub async fn connect(config: RedisConfig) -> Result<Self, BackendError> {
        config.validate()?;
        let scrub = config.scrubber();
        let connector = Connector::new(
            config.info.clone(),
            config.ca_pem.as_deref(),
            config.connect_timeout,
            config.request_timeout,
        )
        .map_err(|e| config_error(scrub.scrub(format!("redis TLS: {e}"))))?;
        let connecting = async {
            if config.cluster {
                config
                    .cluster_client()?
                    .get_async_connection()
                    .await
                    .map(Conn::Cluster)
                    .map_err(|e| from_redis(&e, "connect", &scrub))
            } else {
                Managed::connect(connector.clone())
                    .await
                    .map(Conn::Single)
                    .map_err(|e| from_redis(&e, "connect", &scrub))
            }
        };
        let conn = tokio::time::timeout(config.connect_timeout * 2, connecting)
            .await
            .map_err(|_| BackendError::timeout("redis connect", config.connect_timeout * 2))??;
        let batches = conn.batches();
        let engine = Arc::new(Engine {
            conn,
            keys: keys::Keys::new(&config.prefix),
            scrub,
            counters: engine::Counters::default(),
            max_entries: config.max_batch,
            ack_ttl: config.release_ack_ttl,
        });
        tokio::time::timeout(config.request_timeout, engine.load_scripts())
            .await
            .map_err(|_| BackendError::timeout("redis script load", config.request_timeout))??;
        let in_flight = if config.coalesce && batches {
            1
        } else {
            usize::MAX
        };
        let shutdown = CancellationToken::new();
        let timeout = config.request_timeout;
        let e = engine.clone();
        let acquire = Coalescer::new(
            Arc::new(move |v| {
                let e = e.clone();
                Box::pin(async move { e.acquire(v).await })
            }),
            in_flight,
            timeout,
        );
        let e = engine.clone();
        let renew = Coalescer::new(
            Arc::new(move |v| {
                let e = e.clone();
                Box::pin(async move { e.renew(v).await })
            }),
            in_flight,
            timeout,
        );
        let e = engine.clone();
        let release = Coalescer::new(
            Arc::new(move |v| {
                let e = e.clone();
                Box::pin(async move { e.release(v).await })
            }),
            in_flight,
            timeout,
        );
        let hub = Arc::new(Hub::new(
            connector,
            shutdown.clone(),
            config.connect_timeout,
            config.request_timeout,
        ));
        tracing::debug!(url = %config.redacted_url(), "redis backend connected");
        Ok(Self {
            inner: Arc::new(Inner {
                engine,
                expiries: expiry::Expiries::default(),
                hub,
                acquire,
                renew,
                release,
                request_timeout: config.request_timeout,
                url: config.redacted_url(),
                shutdown,
            }),
        })
    }

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

    /// Keeps the expiry table in step with a renewal's answer.
    fn renewed(
        &self,
        holder: &HolderToken,
        sent: Instant,
        ttl: Duration,
        answer: &Result<Renewed, BackendError>,
    ) {
        match answer {
            Ok(Renewed::Held) => self.inner.expiries.extended(holder, sent, ttl),
            Ok(Renewed::NotHeld) => self.inner.expiries.forget(holder),
            Err(_) => {}
        }
    }

    /// Bounds `fut` by the request timeout.
    async fn bounded<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        let t = self.inner.request_timeout;
        tokio::time::timeout(t, fut)
            .await
            .map_err(|_| BackendError::timeout(what, t))?
    }
}

fn name_error(e: InvalidName) -> BackendError {
    config_error(e.to_string())
}

/// A ttl in whole milliseconds, rounded up: the server must never hold a lease for less than
/// the ttl the client's validity estimate assumes.
fn ttl_ms(ttl: Duration) -> u64 {
    let ms = millis(ttl);
    let rounded = if Duration::from_millis(ms) < ttl {
        ms.saturating_add(1)
    } else {
        ms
    };
    rounded.max(1)
}

impl Backend for RedisBackend {
    fn validate_name(&self, name: &str) -> Result<(), InvalidName> {
        keys::validate_name(name)
    }

    fn try_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquired, BackendError>> {
        Box::pin(async move {
            keys::validate_name(&req.name).map_err(name_error)?;
            let keys = &self.inner.engine.keys;
            let entry = AcquireEntry {
                lock: keys.lock(&req.name),
                fence: keys.fence(&req.name),
                holder: hex(&req.holder),
                identity: req.identity.clone(),
                ttl_ms: ttl_ms(req.ttl),
            };
            let sent = Instant::now();
            let answer = self
                .bounded("redis acquire", self.inner.acquire.call(entry, true))
                .await;
            if let Ok(Acquired::Granted { .. }) = answer {
                self.inner.expiries.extended(&req.holder, sent, req.ttl);
            }
            answer
        })
    }

    fn renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Renewed, BackendError>> {
        Box::pin(async move {
            keys::validate_name(name).map_err(name_error)?;
            let entry = RenewEntry {
                lock: self.inner.engine.keys.lock(name),
                holder: hex(holder),
                ttl_ms: ttl_ms(ttl),
            };
            let sent = Instant::now();
            let answer = self
                .bounded("redis renew", self.inner.renew.call(entry, true))
                .await;
            self.renewed(holder, sent, ttl, &answer);
            answer
        })
    }

    fn renew_many<'a>(
        &'a self,
        batch: &'a [RenewRequest],
    ) -> BoxFuture<'a, Vec<Result<Renewed, BackendError>>> {
        Box::pin(async move {
            let mut out: Vec<Option<Result<Renewed, BackendError>>> = vec![None; batch.len()];
            let mut entries = Vec::with_capacity(batch.len());
            let mut slots = Vec::with_capacity(batch.len());
            for (i, r) in batch.iter().enumerate() {
                match keys::validate_name(&r.name) {
                    Ok(()) => {
                        entries.push(RenewEntry {
                            lock: self.inner.engine.keys.lock(&r.name),
                            holder: hex(&r.holder),
                            ttl_ms: ttl_ms(r.ttl),
                        });
                        slots.push(i);
                    }
                    Err(e) => out[i] = Some(Err(name_error(e))),
                }
            }
            let t = self.inner.request_timeout;
            let sent = Instant::now();
            let answers = tokio::time::timeout(t, self.inner.engine.renew_slice(&entries))
                .await
                .unwrap_or_else(|_| {
                    let e = BackendError::timeout("redis renew batch", t);
                    engine::errors(&e, slots.len()).collect()
                });
            for (slot, answer) in slots.into_iter().zip(answers) {
                let r = &batch[slot];
                self.renewed(&r.holder, sent, r.ttl, &answer);
                out[slot] = Some(answer);
            }
            out.into_iter()
                .map(|a| {
                    a.unwrap_or_else(|| {
                        Err(BackendError::new(
                            BackendErrorKind::Protocol,
                            "redis renew batch: missing answer",
                        ))
                    })
                })
                .collect()
        })
    }

    fn release<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        Box::pin(async move {
            keys::validate_name(name).map_err(name_error)?;
            let keys = &self.inner.engine.keys;
            let entry = ReleaseEntry {
                lock: keys.lock(name),
                holder: hex(holder),
                short: self
                    .inner
                    .expiries
                    .take_ends_within(holder, self.inner.engine.ack_ttl),
            };
            self.bounded("redis release", self.inner.release.call(entry, false))
                .await
        })
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseRecord>, BackendError>> {
        Box::pin(async move {
            keys::validate_name(name).map_err(name_error)?;
            self.bounded("redis inspect", self.inner.engine.inspect(name, false))
                .await
                .map(|s| s.record)
        })
    }

    fn announce_member<'a>(
        &'a self,
        group: &'a str,
        member: &'a Member,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            keys::validate_name(group).map_err(name_error)?;
            let record = members::record_of(member)?;
            let announce =
                self.inner
                    .engine
                    .announce_member(group, &member.identity, &record, ttl_ms(ttl));
            self.bounded("redis announce member", announce)
                .await
                .map(|_| ())
        })
    }

    fn withdraw_member<'a>(
        &'a self,
        group: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            keys::validate_name(group).map_err(name_error)?;
            let withdraw = self.inner.engine.withdraw_member(group, identity);
            self.bounded("redis withdraw member", withdraw)
                .await
                .map(|_| ())
        })
    }

    fn members(&self, group: &str) -> BoxStream<'static, Result<Vec<Member>, BackendError>> {
        if let Err(e) = keys::validate_name(group) {
            let e = name_error(e);
            return Box::pin(futures::stream::once(async move { Err(e) }));
        }
        members::stream(&self.inner.hub, self.inner.engine.clone(), group)
    }

    fn observe(&self, name: &str) -> BoxStream<'static, Result<HolderChange, BackendError>> {
        if let Err(e) = keys::validate_name(name) {
            let e = name_error(e);
            return Box::pin(futures::stream::once(async move { Err(e) }));
        }
        let channel = self.inner.engine.keys.channel(name);
        self.inner
            .hub
            .observe(self.inner.engine.clone(), name, channel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_redacts_the_password_everywhere() {
        let c = RedisConfig::new("redis://alice:hunter2@127.0.0.1:6379/3").expect("parses");
        assert_eq!(c.redacted_url(), "redis://alice:***@127.0.0.1:6379/3");
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
        let c = c.password("s3cr3t!").username("bob");
        assert_eq!(c.redacted_url(), "redis://bob:***@127.0.0.1:6379/3");
        assert!(!format!("{c:?}").contains("s3cr3t"));
        let plain = RedisConfig::new("redis://127.0.0.1").expect("parses");
        assert_eq!(plain.redacted_url(), "redis://127.0.0.1:6379/0");
    }

    #[test]
    fn config_rejects_bad_input_without_echoing_secrets() {
        let e = RedisConfig::new("redis://u:hunter2@").expect_err("no host");
        assert_eq!(e.kind(), BackendErrorKind::Config);
        assert!(!e.to_string().contains("hunter2"), "{e}");
        let e = RedisConfig::new("rediss://127.0.0.1/#insecure").expect_err("insecure");
        assert!(e.to_string().contains("insecure"));
        let bad_prefix = RedisConfig::new("redis://127.0.0.1")
            .expect("parses")
            .key_prefix("a{b");
        assert!(bad_prefix.validate().is_err());
        let ca_without_tls = RedisConfig::new("redis://127.0.0.1")
            .expect("parses")
            .ca_certificate_pem(b"x".to_vec());
        assert!(ca_without_tls.validate().is_err());
        assert_eq!(
            password_in("redis://u:p%40ss@h:1/0").as_deref(),
            Some("p%40ss")
        );
        assert_eq!(password_in("redis://h:1/0"), None);
    }

    #[test]
    fn ttl_rounds_up_to_whole_milliseconds() {
        assert_eq!(ttl_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(ttl_ms(Duration::from_micros(1500)), 2);
        assert_eq!(ttl_ms(Duration::from_micros(1)), 1);
        assert_eq!(ttl_ms(Duration::ZERO), 1);
    }
}
