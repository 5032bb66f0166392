//! `--listen` with `--shards`: `/healthz`, `/readyz` and `/metrics` for a [`ShardedElector`].
//!
//! The library's `ProbeServer` serves one `LeaderElector`; a sharded replica runs one per
//! shard, inside the `ShardedElector`. This small server answers one request per connection
//! (`Connection: close`), at most [`MAX_CONNECTIONS`] at once, each within [`DEADLINE`]:
//!
//! - `/healthz`: 200 while tenure answers (each shard's command is guarded by its own
//!   watchdog, whatever the probe says).
//! - `/readyz`: 200 once this replica is a live member of the group as the store shows it,
//!   503 before.
//! - `/metrics`: `tenure_shards`, `tenure_shards_assigned`, `tenure_shards_owned` and
//!   `tenure_shard_group_members` (OpenMetrics text).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tenure::shard::ShardedElector;
use tokio::net::{TcpListener, TcpStream};

/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;
/// How long one connection may take, request and answer.
const DEADLINE: Duration = Duration::from_secs(10);
/// The largest request head read.
const MAX_HEAD: usize = 16 * 1024;

/// What the endpoints report, read at each request.
struct State {
    elector: ShardedElector,
    identity: String,
    registry: Registry,
    shards: Gauge,
    assigned: Gauge,
    owned: Gauge,
    members: Gauge,
}

impl State {
    fn new(elector: ShardedElector, identity: String) -> Self {
        let mut registry = Registry::default();
        let (shards, assigned, owned, members) = (
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
        );
        registry.register("tenure_shards", "The group's shard count", shards.clone());
        registry.register(
            "tenure_shards_assigned",
            "Shards the latest assignment gives this replica",
            assigned.clone(),
        );
        registry.register(
            "tenure_shards_owned",
            "Shards whose term runs on this replica",
            owned.clone(),
        );
        registry.register(
            "tenure_shard_group_members",
            "Live members of the group in the latest assignment",
            members.clone(),
        );
        Self {
            elector,
            identity,
            registry,
            shards,
            assigned,
            owned,
            members,
        }
    }

    fn ready(&self) -> bool {
        self.elector
            .assignment()
            .borrow()
            .members
            .iter()
            .any(|m| m.identity == self.identity)
    }

    fn metrics(&self) -> String {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        {
            let assignment = self.elector.assignment();
            let assignment = assignment.borrow();
            let mine = assignment
                .owners
                .iter()
                .filter(|o| o.as_deref() == Some(self.identity.as_str()))
                .count();
            self.assigned.set(count(mine));
            self.members.set(count(assignment.members.len()));
        }
        self.shards.set(i64::from(self.elector.shards()));
        self.owned.set(count(self.elector.owned().borrow().len()));
        let mut text = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!(error = %e, "cannot encode the metrics");
        }
        text
    }
}

/// Serves the endpoints on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, elector: ShardedElector, identity: String) {
    let state = Arc::new(State::new(elector, identity));
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&limit).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "the probe endpoint cannot accept; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(DEADLINE, answer(stream, &state)).await;
        });
    }
}

/// Reads one request head and answers it.
async fn answer(mut stream: TcpStream, state: &State) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return respond(
                &mut stream,
                431,
                "text/plain",
                "request head too large\n",
                true,
            )
            .await;
        }
        let n = read(&stream, &mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let method = parts.next().unwrap_or_default();
    let target = parts.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default();
    let body = method != "HEAD";
    if method != "GET" && method != "HEAD" {
        return respond(&mut stream, 405, "text/plain", "method not allowed\n", body).await;
    }
    match path {
        "/healthz" => respond(&mut stream, 200, "text/plain", "ok\n", body).await,
        "/readyz" if state.ready() => {
            respond(&mut stream, 200, "text/plain", "ready\n", body).await
        }
        "/readyz" => {
            let text = "not a member of the group yet\n";
            respond(&mut stream, 503, "text/plain", text, body).await
        }
        "/metrics" => {
            let text = state.metrics();
            let kind = "application/openmetrics-text; version=1.0.0; charset=utf-8";
            respond(&mut stream, 200, kind, &text, body).await
        }
        _ => respond(&mut stream, 404, "text/plain", "not found\n", body).await,
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    text: &str,
    body: bool,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        text.len()
    );
    if body {
        out.push_str(text);
    }
    let mut rest = out.as_bytes();
    while !rest.is_empty() {
        stream.writable().await?;
        match stream.try_write(rest) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads what is there (tokio's `io-util` is not among tenure's features).
async fn read(stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        stream.readable().await?;
        match stream.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => return other,
        }
    }
}
