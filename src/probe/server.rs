//! Keeps the probe endpoint answering: the accept loop of [`crate::net`] (backoff on errors,
//! a cap on open connections that closes the oldest rather than turn a newcomer away) and one
//! hyper HTTP/1.1 connection per client, closed when it stops making progress.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::ProbeServer;
use crate::net::{Acceptor, Open, descriptor_share};

/// The probe endpoint holds at most this fraction of the process's open-file limit in
/// connections (1/16: 64 of the usual 1,024), whatever its configured cap.
pub(super) const DESCRIPTOR_SHARE: u64 = 16;

/// The limits a connection runs under, copied out of the [`ProbeServer`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub(super) max_connections: usize,
    pub(super) header_timeout: Duration,
    pub(super) idle_timeout: Duration,
    pub(super) max_header_bytes: usize,
}

/// Accepts connections on `listener` forever; see [`ProbeServer::serve`].
pub(super) async fn run(app: ProbeServer, listener: TcpListener) {
    let limits = app.limits;
    let app = Arc::new(app);
    let cap = descriptor_share(DESCRIPTOR_SHARE).map_or(limits.max_connections, |share| {
        share.min(limits.max_connections)
    });
    let mut acceptor = Acceptor::new(listener, Arc::new(Open::new(cap)), "the probe endpoint");
    loop {
        let (stream, slot) = acceptor.accept().await;
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            tokio::select! {
                () = connection(app, stream, limits) => {}
                () = slot.evicted() => {
                    tracing::debug!("probe connection closed: the oldest at the connection cap");
                }
            }
            // The socket is closed by now; `slot` goes last and frees its place.
            drop(slot);
        });
    }
}

/// Serves one client until it closes, breaks the protocol, times out or stops making progress.
async fn connection(app: Arc<ProbeServer>, stream: TcpStream, limits: Limits) {
    // Answers are one small write each: no reason to wait for an ACK before sending them.
    let _ = stream.set_nodelay(true);
    let progress = Arc::new(Progress::new());
    let io = TokioIo::new(Watched {
        inner: stream,
        progress: Arc::clone(&progress),
    });
    let service = service_fn(move |req| {
        let app = Arc::clone(&app);
        async move { Ok::<_, Infallible>(app.respond(&req)) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.max_header_bytes)
        .serve_connection(io, service);
    tokio::select! {
        done = conn => {
            if let Err(e) = done {
                tracing::debug!(error = %e, "probe connection closed");
            }
        }
        () = progress.stalled(limits.idle_timeout) => {
            tracing::debug!(idle = ?limits.idle_timeout, "probe connection closed: no progress");
        }
    }
}

/// When a connection last read or wrote a byte.
#[derive(Debug)]
struct Progress {
    start: Instant,
    /// Nanoseconds from `start` to the last read or write that moved bytes.
    last: AtomicU64,
}

impl Progress {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let nanos = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.fetch_max(nanos, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }

    /// Completes once no byte has moved either way for `idle`.
    async fn stalled(&self, idle: Duration) {
        loop {
            let deadline = self.last() + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A TCP stream that records progress in each direction.
#[derive(Debug)]
struct Watched {
    inner: TcpStream,
    progress: Arc<Progress>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.progress.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.progress.touch();
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.progress.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn progress_stalls_only_after_idle_without_bytes() {
        let p = Progress::new();
        let idle = Duration::from_secs(5);
        tokio::time::advance(Duration::from_secs(4)).await;
        p.touch();
        let began = Instant::now();
        p.stalled(idle).await;
        assert_eq!(began.elapsed(), idle, "measured from the last touch");
    }
}
