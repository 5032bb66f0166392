//! Probe endpoints for an elector (feature `healthz`): `/healthz` for a kubelet liveness
//! probe, `/readyz` for readiness and, with the `metrics` feature, `/metrics` — with no HTTP
//! framework behind them.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::LeaderElector;

/// Serves `GET /healthz` on `listener` until the future is dropped; shorthand for
/// [`ProbeServer::new(elector).tolerance(tolerance).serve(listener)`](ProbeServer).
///
/// # Errors
///
/// Only if accepting connections fails; a misbehaving client just gets its connection closed.
///
/// # Example
///
/// ```no_run
/// # async fn demo(elector: tenure::election::LeaderElector) -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
/// tokio::spawn(tenure::election::serve_healthz(listener, elector, std::time::Duration::from_secs(20)));
/// # Ok(()) }
/// ```
pub async fn serve_healthz(
    listener: TcpListener,
    elector: LeaderElector,
    tolerance: Duration,
) -> std::io::Result<()> {
    ProbeServer::new(elector)
        .tolerance(tolerance)
        .serve(listener)
        .await
}

/// HTTP endpoints for probes and scraping, answering `GET`:
///
/// | path | answer |
/// |---|---|
/// | `/healthz` | `200 ok` while [`LeaderElector::health`] is healthy with the tolerance; `503` with the reason when this process leads but has not renewed for longer than the renew deadline + tolerance (a stuck process: restart it) |
/// | `/readyz` | `200` once the elector takes part in the election (it leads, or knows who does); `503` before |
/// | `/metrics` | the registry in Prometheus text format (feature `metrics`, when [`metrics`](Self::metrics) was given) |
/// | other | `404` |
///
/// Followers are live and ready: readiness does not follow leadership, so a rolling update of
/// a Deployment of candidates never waits for a follower to lead.
///
/// One short-lived task per connection; requests are read up to 4 KiB and must arrive within
/// a second.
///
/// # Example
///
/// ```no_run
/// # async fn demo(elector: tenure::election::LeaderElector) -> std::io::Result<()> {
/// use tenure::election::ProbeServer;
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:9090").await?;
/// tokio::spawn(ProbeServer::new(elector).serve(listener));
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use]
pub struct ProbeServer {
    elector: LeaderElector,
    tolerance: Duration,
    #[cfg(feature = "metrics")]
    registry: Option<std::sync::Arc<prometheus_client::registry::Registry>>,
}

impl ProbeServer {
    /// Endpoints for `elector`, with a liveness tolerance of 20 s.
    pub fn new(elector: LeaderElector) -> Self {
        Self {
            elector,
            tolerance: Duration::from_secs(20),
            #[cfg(feature = "metrics")]
            registry: None,
        }
    }

    /// How long past the renew deadline a leader without a renewal still counts as live.
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Serves `registry` on `/metrics` (feature `metrics`).
    #[cfg(feature = "metrics")]
    pub fn metrics(mut self, registry: prometheus_client::registry::Registry) -> Self {
        self.registry = Some(std::sync::Arc::new(registry));
        self
    }

    /// Accepts connections on `listener` until the future is dropped.
    ///
    /// # Errors
    ///
    /// Only if accepting connections fails; a misbehaving client just gets its connection
    /// closed.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops accepting; connections in flight finish on their own tasks.
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        let server = std::sync::Arc::new(self);
        loop {
            let (mut conn, _) = listener.accept().await?;
            let server = std::sync::Arc::clone(&server);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut len = 0;
                let read = tokio::time::timeout(Duration::from_secs(1), async {
                    while len < buf.len() {
                        let n = conn.read(&mut buf[len..]).await?;
                        len += n;
                        if n == 0 || buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                    Ok::<_, std::io::Error>(())
                })
                .await;
                if !matches!(read, Ok(Ok(()))) {
                    return;
                }
                let request = String::from_utf8_lossy(&buf[..len]);
                let path = request.split_whitespace().nth(1).unwrap_or("");
                let (status, content_type, body) = server.answer(path);
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    }

    fn answer(&self, path: &str) -> (&'static str, &'static str, String) {
        const TEXT: &str = "text/plain; charset=utf-8";
        const UNAVAILABLE: &str = "503 Service Unavailable";
        match path {
            "/healthz" => {
                let h = self.elector.health(self.tolerance);
                if h.healthy {
                    ("200 OK", TEXT, "ok\n".to_owned())
                } else {
                    (
                        UNAVAILABLE,
                        TEXT,
                        format!(
                            "leader without a renewal for {:?} (renew deadline + tolerance exceeded)\n",
                            h.since_last_renewal.unwrap_or_default()
                        ),
                    )
                }
            }
            "/readyz" => {
                if self.elector.is_leader() {
                    ("200 OK", TEXT, "leading\n".to_owned())
                } else if let Some(leader) = self.elector.leader().borrow().as_ref() {
                    ("200 OK", TEXT, format!("following {}\n", leader.identity))
                } else {
                    (UNAVAILABLE, TEXT, "no leader known yet\n".to_owned())
                }
            }
            #[cfg(feature = "metrics")]
            "/metrics" if self.registry.is_some() => {
                let mut body = String::new();
                let encoded = self.registry.as_ref().map_or(Ok(()), |r| {
                    prometheus_client::encoding::text::encode(&mut body, r)
                });
                match encoded {
                    Ok(()) => (
                        "200 OK",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        body,
                    ),
                    Err(e) => (
                        "500 Internal Server Error",
                        TEXT,
                        format!("cannot encode metrics: {e}\n"),
                    ),
                }
            }
            _ => ("404 Not Found", TEXT, "not found\n".to_owned()),
        }
    }
}
