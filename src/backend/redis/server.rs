//! Connections to one server: the [`Connector`] that opens every connection tenure makes (a
//! single server's, each node's of a cluster, the subscriber's) over streams whose replies are
//! bounded (see [`limit`](super::limit)), TLS included; and [`Managed`], a command connection
//! replaced when it drops.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use ::redis::aio::{MultiplexedConnection, PubSub};
use ::redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, Pipeline, RedisError, RedisResult, Value,
};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio::io::{AsyncRead, AsyncWrite};

use super::limit::{Limited, ReplyRefused, Tripwire};
use super::tls::Tls;
use tokio_util::task::AbortOnDropHandle;

/// Why a call on a connection failed.
#[derive(Debug)]
pub(crate) enum ConnError {
    /// The redis crate's error.
    Redis(RedisError),
    /// The connection was cut because a reply broke the size limit.
    Refused(ReplyRefused),
}

impl From<RedisError> for ConnError {
    fn from(e: RedisError) -> Self {
        Self::Redis(e)
    }
}

/// A byte stream to a server.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// Opens connections to one server, the stream always its own, wrapped in [`Limited`] so that
/// no reply can make tenure allocate more than [`MAX_REPLY_BYTES`](super::MAX_REPLY_BYTES):
/// over TCP, over a Unix socket, and over TLS, where it does the handshake itself (see
/// [`tls`](super::tls)) and bounds the decrypted stream.
#[derive(Clone)]
pub(crate) struct Connector {
    info: ConnectionInfo,
    /// Set for a `rediss://` URL.
    tls: Option<Tls>,
    connect_timeout: Duration,
    request_timeout: Duration,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").finish_non_exhaustive()
    }
}

impl Connector {
    /// A connector to `info`'s server; for TLS, trusting only `ca_pem` if given, else the
    /// system's roots. The error says what is wrong with the TLS settings.
    pub(crate) fn new(
        info: ConnectionInfo,
        ca_pem: Option<&[u8]>,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<Self, String> {
        let tls = match info.addr() {
            ConnectionAddr::TcpTls { insecure: true, .. } => {
                return Err("tenure always verifies the server's host name".to_owned());
            }
            ConnectionAddr::TcpTls { host, .. } => Some(Tls::new(host, ca_pem)?),
            _ => None,
        };
        Ok(Self {
            info,
            tls,
            connect_timeout,
            request_timeout,
        })
    }

    /// The server's host and port, if it is reached over TCP.
    pub(crate) fn host_port(&self) -> Option<(String, u16)> {
        match self.info.addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                Some((host.clone(), *port))
            }
            _ => None,
        }
    }

    /// The bound on each request's answer.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Whether AUTH sends a password that only the network protects (no TLS).
    pub(crate) fn password_in_clear(&self) -> bool {
        self.tls.is_none() && self.info.redis_settings().password().is_some()
    }

    /// A connector to another node of the same cluster: the same credentials, timeouts and
    /// trust, TLS verifying `host`.
    pub(crate) fn for_node(&self, host: &str, port: u16) -> Result<Self, String> {
        let addr = match self.info.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        Ok(Self {
            info: self.info.clone().set_addr(addr),
            tls: self.tls.as_ref().map(|t| t.for_host(host)).transpose()?,
            connect_timeout: self.connect_timeout,
            request_timeout: self.request_timeout,
        })
    }

    /// A bounded stream to the server (TLS set up) and its tripwire.
    async fn open(&self) -> RedisResult<(Limited<Box<dyn Io>>, Tripwire)> {
        let io: Box<dyn Io> = match (self.info.addr(), &self.tls) {
            (ConnectionAddr::Tcp(host, port), None) => {
                Box::new(tokio::net::TcpStream::connect((host.as_str(), *port)).await?)
            }
            (ConnectionAddr::TcpTls { host, port, .. }, Some(tls)) => {
                let tcp = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                Box::new(tls.handshake(tcp).await?)
            }
            #[cfg(unix)]
            (ConnectionAddr::Unix(path), None) => {
                Box::new(tokio::net::UnixStream::connect(path).await?)
            }
            _ => {
                return Err(RedisError::from((
                    ::redis::ErrorKind::InvalidClientConfig,
                    "tenure cannot reach this kind of address",
                )));
            }
        };
        let tripwire = Tripwire::default();
        Ok((Limited::new(io, tripwire.clone()), tripwire))
    }

    fn config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.request_timeout))
    }

    /// A new command connection (TLS, AUTH and SELECT done), within the connect timeout.
    /// `closed` runs when the connection ends.
    async fn command(&self, closed: impl FnOnce() + Send + 'static) -> RedisResult<Live> {
        let connecting = async {
            let (stream, tripwire) = self.open().await?;
            let (conn, driver) = MultiplexedConnection::new_with_config(
                self.info.redis_settings(),
                stream,
                self.config(),
            )
            .await?;
            let task = tokio::spawn(async move {
                driver.await;
                closed();
            });
            Ok(Live {
                conn,
                tripwire,
                _driver: Arc::new(AbortOnDropHandle::new(task)),
            })
        };
        tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| RedisError::from(io::Error::from(io::ErrorKind::TimedOut)))?
    }

    /// A new subscriber connection, TLS and AUTH done (the caller bounds the time it takes).
    pub(crate) async fn pubsub(&self) -> RedisResult<PubSub> {
        let (stream, _) = self.open().await?;
        PubSub::new(self.info.redis_settings(), stream).await
    }
}

/// One established command connection.
#[derive(Clone)]
struct Live {
    conn: MultiplexedConnection,
    tripwire: Tripwire,
    /// The task reading the connection; ends with the last handle.
    _driver: Arc<AbortOnDropHandle<()>>,
}

type Connecting = Shared<BoxFuture<'static, Result<Live, RedisError>>>;

/// A single server's command connection, replaced after it drops: the next request after a
/// connection failed or was closed opens a new one, and every request waiting meanwhile shares
/// it. (The redis crate's `ConnectionManager` does the same, but over a stream it opens itself,
/// which tenure could not bound.)
pub(crate) struct Managed {
    connector: Connector,
    slot: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    /// Counts connections, so that news about an old one never discards a newer one.
    generation: u64,
    live: Option<Connecting>,
}

impl Managed {
    /// Connects once (failing if that fails); later connections are made as needed.
    pub(crate) async fn connect(connector: Connector) -> RedisResult<Arc<Self>> {
        let managed = Self::new(connector);
        let (_, live) = managed.current();
        live.await?;
        Ok(managed)
    }

    /// Connects at the first request.
    pub(crate) fn new(connector: Connector) -> Arc<Self> {
        Arc::new(Self {
            connector,
            slot: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current connection (made or being made), starting a new one if there is none.
    fn current(self: &Arc<Self>) -> (u64, Connecting) {
        let mut slot = self.lock();
        let generation = slot.generation;
        if let Some(live) = &slot.live {
            return (generation, live.clone());
        }
        let weak: Weak<Self> = Arc::downgrade(self);
        let connector = self.connector.clone();
        // A task, so that the connection is made even if every request waiting for it gives up.
        let task = tokio::spawn(async move {
            connector
                .command(move || {
                    if let Some(m) = weak.upgrade() {
                        m.reset(generation);
                    }
                })
                .await
        });
        let live: Connecting = async move {
            task.await
                .unwrap_or_else(|e| Err(io::Error::other(e.to_string()).into()))
        }
        .boxed()
        .shared();
        slot.live = Some(live.clone());
        (generation, live)
    }

    /// Forgets connection `generation` (if it is still the current one).
    fn reset(&self, generation: u64) {
        let mut slot = self.lock();
        if slot.generation == generation {
            slot.generation += 1;
            slot.live = None;
        }
    }

    pub(crate) async fn send(
        self: &Arc<Self>,
        pipe: &Pipeline,
        count: usize,
    ) -> Result<Vec<Value>, ConnError> {
        let (generation, live) = self.current();
        let live = live.await.inspect_err(|_| self.reset(generation))?;
        let answer = live.conn.clone().send_packed_commands(pipe, 0, count).await;
        answer.map_err(|e| {
            if let Some(why) = live.tripwire.get() {
                self.reset(generation);
                return ConnError::Refused(why.clone());
            }
            if e.is_unrecoverable_error() {
                self.reset(generation);
            }
            ConnError::Redis(e)
        })
    }
}
