//! Probe endpoints for an elector (feature `healthz`): `/healthz` for a kubelet liveness
//! probe, `/readyz` for readiness and, with the `metrics` feature, `/metrics`, served over
//! HTTP/1.1 by hyper.
//!
//! One [`ProbeServer`] reports on one [`LeaderElector`] ([`ProbeServer::new`]) or on a replica
//! of sharded leadership ([`ProbeServer::sharded`]). It sits above [`election`](crate::election)
//! and [`shard`](crate::shard): it reads their state, and neither of them knows it exists.
//! [`ProbeServer::serve`] serves them.

mod elector;
mod server;
mod sharded;

use std::time::Duration;

use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;

use crate::election::LeaderElector;
use crate::shard::ShardedElector;

/// The content type of every answer but `/metrics`.
const TEXT: &str = "text/plain; charset=utf-8";

/// An answer before it becomes a response: status, content type, body.
type Answer = (StatusCode, &'static str, String);

/// HTTP endpoints for probes and scraping, answering `GET` and `HEAD`:
///
/// | path | answer |
/// |---|---|
/// | `/healthz` | `200 ok` while [`LeaderElector::health`] is healthy with the tolerance; `503` with the reason when this process leads but has not renewed for longer than the renew deadline + tolerance (a stuck process: restart it) — and, only with [`store_liveness`](Self::store_liveness), when a follower has not heard from the store for longer than [`store_unreachable_after`](crate::election::ElectionConfig::store_unreachable_after) |
/// | `/readyz` | `200` while the elector takes part in the election: it leads, or knows who does and hears from the store; `503` before it knows, and while the store has been silent towards it for longer than [`store_unreachable_after`](crate::election::ElectionConfig::store_unreachable_after) |
/// | `/metrics` | the registry in Prometheus text format (feature `metrics`, when [`metrics`](Self::metrics) was given) |
/// | other | `404` |
///
/// Routing looks at the path only: `/healthz?verbose=1` is `/healthz`. A `HEAD` request gets
/// the status and headers of the `GET` without its body; other methods get `405`.
///
/// Followers are live and ready: readiness does not follow leadership, so a rolling update of
/// a Deployment of candidates never waits for a follower to lead. A follower cut off from the
/// store turns unready (it could not take over if the leader died; controller-runtime users
/// ask for this signal) but stays live by default: restarting it would not bring the store
/// back, and restarting every replica during a store outage only adds load when it returns.
///
/// `/readyz` prints the leader's identity as read from the store, where any client may have
/// written it: control characters (ESC, CR, LF, …), backslashes and quotes come out escaped as
/// by [`str::escape_debug`] (`\u{1b}`, `\n`), so an identity cannot forge lines or terminal
/// sequences in a log or a terminal that shows the answer.
///
/// # The server
///
/// HTTP/1.1 with keep-alive, served by hyper, one task per connection, with these limits
/// (each has a builder method):
///
/// - at most [`max_connections`](Self::max_connections) connections at once (default
///   [`DEFAULT_MAX_CONNECTIONS`](Self::DEFAULT_MAX_CONNECTIONS), 64), and never more than a
///   sixteenth of the process's open-file limit (`RLIMIT_NOFILE`: 64 of the usual 1,024), so
///   clients cannot take the descriptors the rest of the process needs. At the cap a new
///   connection closes the oldest open one: a probe always gets a connection of its own at
///   once, however many idle or slow clients (slowloris) hold the others.
/// - a request's headers must arrive within [`header_timeout`](Self::header_timeout)
///   (default 10 s, against slowloris clients). The clock starts when the connection waits
///   for a request, so it also closes a connection that sends nothing, and a keep-alive
///   connection idle between requests for that long.
/// - headers larger than [`MAX_HEADER_BYTES`](Self::MAX_HEADER_BYTES) (16 KiB) get `431` and
///   the connection is closed.
/// - a connection on which no byte moves either way for
///   [`idle_timeout`](Self::idle_timeout) (default 30 s) is closed: a client that stops
///   reading an answer, or stops sending in the middle of a request body, cannot hold its
///   slot.
///
/// NB: a connection stays open after an answer unless the request says `connection: close`
/// (kubelet's probes do) or is HTTP/1.0; a hand-written client that reads until the end of
/// the stream without saying so waits for the header timeout.
///
/// If accepting fails (`EMFILE`, out of file descriptors, is the usual cause) the server logs
/// a warning (the first at once, then at most one every 10 s), pauses (10 ms, doubling up to
/// 1 s) and accepts again: a passing shortage never stops the probes for good.
///
/// # Example
///
/// ```no_run
/// # async fn demo(elector: tenure::election::LeaderElector) -> std::io::Result<()> {
/// use tenure::probe::ProbeServer;
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:9090").await?;
/// tokio::spawn(ProbeServer::new(elector).serve(listener));
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use]
pub struct ProbeServer {
    probed: Probed,
    tolerance: Duration,
    store_liveness: bool,
    limits: server::Limits,
    #[cfg(feature = "metrics")]
    registry: Option<SharedRegistry>,
    /// Extra readiness conditions: `Some(reason)` makes `/readyz` answer `503` with it.
    readiness: Vec<ReadinessCheck>,
}

/// An extra readiness condition ([`ProbeServer::readiness_check`]).
struct ReadinessCheck(Box<dyn Fn() -> Option<String> + Send + Sync>);

impl std::fmt::Debug for ReadinessCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadinessCheck")
    }
}

/// What the endpoints report on.
#[derive(Debug)]
enum Probed {
    Elector(LeaderElector),
    Sharded(ShardedElector),
}

/// A metrics registry the application and the probe server share: the application keeps
/// registering (and updating) its own metrics in it while `/metrics` serves them all. Needs
/// the `metrics` feature.
#[cfg(feature = "metrics")]
pub type SharedRegistry = std::sync::Arc<std::sync::Mutex<prometheus_client::registry::Registry>>;

impl ProbeServer {
    /// How many connections are served at once unless [`max_connections`](Self::max_connections)
    /// says otherwise.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
    /// How long a request's headers may take unless [`header_timeout`](Self::header_timeout)
    /// says otherwise.
    pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
    /// How long a connection may go without moving a byte unless
    /// [`idle_timeout`](Self::idle_timeout) says otherwise.
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
    /// The largest request head (request line and headers) served; a larger one gets `431`.
    pub const MAX_HEADER_BYTES: usize = 16 * 1024;

    /// Endpoints for `elector`, with a liveness tolerance of 20 s and the default limits.
    pub fn new(elector: LeaderElector) -> Self {
        Self::for_probed(Probed::Elector(elector))
    }

    /// Endpoints for a replica of sharded leadership ([`crate::shard`]): `/healthz` answers
    /// `503` when a shard term this replica holds has outlived its lease by more than the
    /// [`tolerance`](Self::tolerance) without being ended — its elector would have ended it at
    /// the renew deadline, so the runtime is stuck (restart it) — and `200` otherwise;
    /// `/readyz` answers `200` once the replica is a live member of its group in the latest
    /// assignment (naming how many shards it holds), `503` before; `/metrics` as for
    /// [`new`](Self::new).
    pub fn sharded(elector: ShardedElector) -> Self {
        Self::for_probed(Probed::Sharded(elector))
    }

    fn for_probed(probed: Probed) -> Self {
        Self {
            probed,
            tolerance: Duration::from_secs(20),
            store_liveness: false,
            limits: server::Limits {
                max_connections: Self::DEFAULT_MAX_CONNECTIONS,
                header_timeout: Self::DEFAULT_HEADER_TIMEOUT,
                idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
                max_header_bytes: Self::MAX_HEADER_BYTES,
            },
            #[cfg(feature = "metrics")]
            registry: None,
            readiness: Vec::new(),
        }
    }

    /// Adds a readiness condition: while `check` returns `Some(reason)`, `/readyz` answers
    /// `503` with that reason, whatever else holds. For conditions the elector cannot see,
    /// such as a Kubernetes fence that is not enforced (`move || fencer.open_fence()` with a
    /// `tenure::fence::kube::Fencer`):
    ///
    /// ```no_run
    /// # fn demo(elector: tenure::election::LeaderElector) {
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use tenure::probe::ProbeServer;
    /// let migrating = Arc::new(AtomicBool::new(false));
    /// let flag = migrating.clone();
    /// let probes = ProbeServer::new(elector).readiness_check(move || {
    ///     flag.load(Ordering::Relaxed).then(|| "migrating".to_owned())
    /// });
    /// # let _ = probes; }
    /// ```
    ///
    /// Readiness, not liveness: a restart of the replica cannot fix what such a check
    /// reports, while an unready pod shows in `kubectl get pods` and stalls a rollout.
    pub fn readiness_check(
        mut self,
        check: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.readiness.push(ReadinessCheck(Box::new(check)));
        self
    }

    /// How long past the renew deadline a leader without a renewal still counts as live.
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Whether `/healthz` also fails while the store has been silent towards this candidate
    /// for longer than
    /// [`store_unreachable_after`](crate::election::ElectionConfig::store_unreachable_after)
    /// (default `false`: then only `/readyz` reports it). Turn it on when a restart is what
    /// mends a lost connection in your deployment (a stale DNS entry, a wedged client).
    pub fn store_liveness(mut self, on: bool) -> Self {
        self.store_liveness = on;
        self
    }

    /// How many connections are served at once (default 64; at least 1; at most a sixteenth
    /// of the process's open-file limit whatever is set here). A connection above it closes
    /// the oldest open one.
    pub fn max_connections(mut self, max: usize) -> Self {
        self.limits.max_connections = max.max(1);
        self
    }

    /// How long a client has to send a request's headers (default 10 s), counted from when
    /// the connection waits for a request: it also bounds how long a keep-alive connection
    /// may sit idle between requests.
    pub fn header_timeout(mut self, timeout: Duration) -> Self {
        self.limits.header_timeout = timeout;
        self
    }

    /// How long a connection may go without reading or writing a byte before it is closed
    /// (default 30 s).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.limits.idle_timeout = timeout;
        self
    }

    /// Serves `registry` on `/metrics` (feature `metrics`). The registry is shared: metrics
    /// the application registers in it later, even while the server runs, appear on
    /// `/metrics` too. A registry nothing else needs is wrapped once:
    /// `Arc::new(Mutex::new(registry))`.
    ///
    /// ```
    /// # use std::sync::{Arc, Mutex};
    /// use prometheus_client::metrics::counter::Counter;
    /// use prometheus_client::registry::Registry;
    /// use tenure::election::{ElectionConfig, ElectionMetrics, LeaderElector};
    /// use tenure::probe::ProbeServer;
    /// # use tenure::{Locker, backend::memory::MemoryBackend};
    /// # let elector = LeaderElector::new(Locker::new(MemoryBackend::new()), "jobs", ElectionConfig::new()).unwrap();
    ///
    /// let registry = Arc::new(Mutex::new(Registry::default()));
    /// let elector = elector.with_metrics(ElectionMetrics::register(&mut registry.lock().unwrap()));
    /// let server = ProbeServer::new(elector).metrics(registry.clone());
    /// // The application's own metrics, on the same /metrics:
    /// let jobs = Counter::<u64>::default();
    /// registry.lock().unwrap().register("jobs_done", "Jobs finished", jobs.clone());
    /// # drop(server);
    /// ```
    #[cfg(feature = "metrics")]
    pub fn metrics(mut self, registry: SharedRegistry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Accepts connections on `listener` until the future is dropped.
    ///
    /// # Errors
    ///
    /// None at present: a failed `accept` is logged and retried after a pause (see
    /// [the server](Self#the-server)), and a misbehaving client only loses its own
    /// connection. The `Result` stays so that callers handling an error keep compiling.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops accepting; connections in flight finish on their own tasks.
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        server::run(self, listener).await;
        Ok(())
    }

    /// The answer to one request.
    fn respond<B>(&self, req: &Request<B>) -> Response<String> {
        let (status, content_type, body) =
            if req.method() == Method::GET || req.method() == Method::HEAD {
                self.answer(req.uri().path())
            } else {
                (
                    StatusCode::METHOD_NOT_ALLOWED,
                    TEXT,
                    "only GET and HEAD\n".to_owned(),
                )
            };
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if status == StatusCode::METHOD_NOT_ALLOWED {
            headers.insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        }
        // hyper sends the length of the body and, for `HEAD`, leaves the body out.
        response
    }

    fn answer(&self, path: &str) -> Answer {
        if path == "/readyz"
            && let Some(reason) = self.readiness.iter().find_map(|c| (c.0)())
        {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                format!("{}\n", reason.escape_debug()),
            );
        }
        match (&self.probed, path) {
            (Probed::Elector(e), "/healthz") => {
                elector::liveness(e, self.tolerance, self.store_liveness)
            }
            (Probed::Elector(e), "/readyz") => elector::readiness(e, self.tolerance),
            (Probed::Sharded(s), "/healthz") => sharded::liveness(s, self.tolerance),
            (Probed::Sharded(s), "/readyz") => sharded::readiness(s),
            _ => self.others(path),
        }
    }

    /// `/metrics` and everything that is not a probe.
    fn others(&self, path: &str) -> Answer {
        match path {
            #[cfg(feature = "metrics")]
            "/metrics" if self.registry.is_some() => {
                let mut body = String::new();
                let encoded = self.registry.as_ref().map_or(Ok(()), |r| {
                    let registry = r.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    prometheus_client::encoding::text::encode(&mut body, &registry)
                });
                match encoded {
                    Ok(()) => (
                        StatusCode::OK,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        body,
                    ),
                    Err(e) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        TEXT,
                        format!("cannot encode metrics: {e}\n"),
                    ),
                }
            }
            _ => (StatusCode::NOT_FOUND, TEXT, "not found\n".to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Locker;
    use crate::backend::memory::MemoryBackend;
    use crate::election::ElectionConfig;

    fn server() -> ProbeServer {
        let locker = Locker::with_identity(MemoryBackend::new(), "me").expect("valid identity");
        let elector =
            LeaderElector::new(locker, "probe", ElectionConfig::new()).expect("valid config");
        ProbeServer::new(elector)
    }

    /// A request without a body, as the probes' tests send them.
    pub(super) fn request(method: Method, uri: &str) -> Request<()> {
        let mut req = Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = uri.parse().expect("valid uri");
        req
    }

    #[tokio::test]
    async fn healthz_routes_by_path_and_ignores_the_query() {
        let s = server();
        for uri in [
            "/healthz",
            "/healthz?verbose=1",
            "http://host:8080/healthz?x",
        ] {
            let r = s.respond(&request(Method::GET, uri));
            assert_eq!(r.status(), StatusCode::OK, "{uri}");
            assert_eq!(r.body(), "ok\n", "{uri}");
        }
        for uri in ["/healthz/", "/healthzz", "/", "/metrics"] {
            assert_eq!(
                s.respond(&request(Method::GET, uri)).status(),
                StatusCode::NOT_FOUND,
                "{uri}"
            );
        }
    }

    #[tokio::test]
    async fn other_methods_get_405_with_allow() {
        let r = server().respond(&request(Method::POST, "/healthz"));
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(
            r.headers().get(ALLOW).map(HeaderValue::as_bytes),
            Some(&b"GET, HEAD"[..])
        );
    }
    #[tokio::test(start_paused = true)]
    async fn a_failing_readiness_check_makes_even_the_leader_unready_and_keeps_it_live() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let locker = Locker::with_identity(MemoryBackend::new(), "me").expect("valid identity");
        let elector =
            LeaderElector::new(locker, "checked", ElectionConfig::new()).expect("valid config");
        let campaign = {
            let elector = elector.clone();
            tokio::spawn(async move { elector.run(|_term| std::future::pending::<()>()).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let open = Arc::new(AtomicBool::new(false));
        let flag = open.clone();
        let probes = ProbeServer::new(elector).readiness_check(move || {
            flag.load(Ordering::Relaxed)
                .then(|| "fence open on lease ns/checked: \u{1b}[2J".to_owned())
        });
        let ready = probes.respond(&request(Method::GET, "/readyz"));
        assert_eq!(ready.status(), StatusCode::OK, "{}", ready.body());
        assert_eq!(ready.body(), "leading\n");
        open.store(true, Ordering::Relaxed);
        let ready = probes.respond(&request(Method::GET, "/readyz"));
        assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            ready.body(),
            "fence open on lease ns/checked: \\u{1b}[2J\n",
            "the reason is escaped"
        );
        let live = probes.respond(&request(Method::GET, "/healthz"));
        assert_eq!(live.status(), StatusCode::OK, "liveness does not follow it");
        open.store(false, Ordering::Relaxed);
        let ready = probes.respond(&request(Method::GET, "/readyz"));
        assert_eq!(ready.status(), StatusCode::OK);
        campaign.abort();
    }
}
