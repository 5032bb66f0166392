//! `RedisConfig`: the backend's options with their defaults and checks, connection URLs
//! (parsed, refused when they ask for `#insecure` TLS, shown with the password replaced by
//! `***`), and the password's scrubber for error messages.

use std::time::Duration;

use ::redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

#[cfg(doc)]
use super::RedisBackend;
use super::error::{Scrubber, config_error};
use super::keys;
use crate::backend::BackendError;
#[cfg(doc)]
use crate::backend::BackendErrorKind;

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
    pub(super) info: ConnectionInfo,
    pub(super) ca_pem: Option<Vec<u8>>,
    pub(super) prefix: String,
    pub(super) request_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) release_ack_ttl: Duration,
    pub(super) coalesce: bool,
    pub(super) max_batch: usize,
    pub(super) cluster: bool,
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

impl RedisConfig {
    /// Parses a `redis://`, `rediss://` or `redis+unix://` URL (see the
    /// [module docs](super#connection-urls)); every other option at its default.
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

    pub(super) fn validate(&self) -> Result<(), BackendError> {
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

    /// Treats the URL's server as a seed node of a Redis Cluster: the backend reads the slot
    /// map (`CLUSTER SLOTS`), opens one connection per master (replies bounded by
    /// [`MAX_REPLY_BYTES`](super::MAX_REPLY_BYTES), TLS verifying each node's announced host)
    /// and sends each call to the master serving the lock's slot. A slot being migrated is
    /// followed through `ASK`, a moved slot through `MOVED` (the map is then read again), and
    /// a master that cannot be reached, or does not answer within the request timeout (a
    /// frozen one), makes the next call read the map again — asking the nodes that answer
    /// first, and the next node as well whenever one has not answered within a quarter of the
    /// request timeout — so a failover is followed at the first call after the cluster has
    /// promoted a replica. A master that does not answer is logged as a warning (again every
    /// 10 s while calls still find it silent), and so is a change of the masters. A slot map
    /// entry that does not parse is skipped with a warning. The tests move a held lock's slot
    /// between masters (`ASK`, then `MOVED`), and freeze (SIGSTOP) or kill a master with a
    /// replica: a waiting follower is granted the lease by its first call sent after the
    /// promotion.
    ///
    /// # Credentials
    ///
    /// Every node connection authenticates with this config's user and password, and the
    /// nodes are the ones the cluster names — in its slot map and in `MOVED`/`ASK` redirects —
    /// not only the seed. With `redis://` the password crosses the network in the clear to
    /// each of them, so [`RedisBackend::connect`] logs a warning when a cluster is reached
    /// with a password over plain TCP; with `rediss://` each node's certificate is verified
    /// for the host the cluster names, so only hosts your CA vouches for receive it. A slot
    /// map naming more than [`MAX_CLUSTER_MASTERS`](super::MAX_CLUSTER_MASTERS) masters (no
    /// real cluster does) is refused with [`BackendErrorKind::Protocol`] before any of them is
    /// contacted, and one backend holds at most that many node connections, plus a few for
    /// the seed and redirect targets.
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

    pub(super) fn scrubber(&self) -> Scrubber {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendErrorKind;

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
}
