//! A minimal `/healthz` endpoint for an elector (feature `healthz`): liveness for a kubelet
//! probe, with no HTTP framework behind it.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::LeaderElector;

/// Serves `GET /healthz` on `listener` until the future is dropped: `200 ok` while
/// [`LeaderElector::health`] is healthy with `tolerance`, `503` with the reason otherwise, and
/// `404` for any other path. One short-lived task per connection; requests are read up to
/// 4 KiB and must arrive within a second.
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
    loop {
        let (mut conn, _) = listener.accept().await?;
        let elector = elector.clone();
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
            let (status, body) = if path == "/healthz" {
                let h = elector.health(tolerance);
                if h.healthy {
                    ("200 OK", "ok\n".to_owned())
                } else {
                    (
                        "503 Service Unavailable",
                        format!(
                            "leader without a renewal for {:?} (renew deadline + tolerance exceeded)\n",
                            h.since_last_renewal.unwrap_or_default()
                        ),
                    )
                }
            } else {
                ("404 Not Found", "not found\n".to_owned())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(response.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}
