//! Keeps the probe endpoint answering: the accept loop (backoff on errors, a cap on open
//! connections that closes the oldest rather than turn a newcomer away) and one hyper
//! HTTP/1.1 connection per client, closed when it stops making progress.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ProbeServer;

/// The first pause after a failed `accept`; each further failure in a row doubles it.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest pause between two `accept` attempts that fail.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// While `accept` keeps failing, a warning at most this often (the first failure is logged
/// at once).
const WARN_EVERY: Duration = Duration::from_secs(10);

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
    let open = Arc::new(Open::new(limits.max_connections));
    let mut failures = Failures::default();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => {
                failures.recovered();
                stream
            }
            Err(e) => {
                tokio::time::sleep(failures.failed(&e)).await;
                continue;
            }
        };
        let (id, closed) = open.admit();
        let app = Arc::clone(&app);
        let open = Arc::clone(&open);
        tokio::spawn(async move {
            tokio::select! {
                () = connection(app, stream, limits) => {}
                () = closed.cancelled() => {
                    tracing::debug!("probe connection closed: the oldest at the connection cap");
                }
            }
            open.remove(id);
        });
    }
}

/// The open connections, oldest first, each with the token that closes it.
///
/// At the cap a new connection closes the oldest instead of waiting for a slot: a probe
/// opens a fresh connection and must be answered within the kubelet's timeout (1 s by
/// default), while the connections that fill the cap are, in the cases that matter, idle or
/// slow clients that would hold their slots until a timeout ends them. A keep-alive scraper
/// that loses its connection opens another.
#[derive(Debug)]
struct Open {
    cap: usize,
    conns: Mutex<(u64, BTreeMap<u64, CancellationToken>)>,
}

impl Open {
    fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            conns: Mutex::new((0, BTreeMap::new())),
        }
    }

    /// Registers a new connection, closing the oldest ones above the cap; its id and the
    /// token that closes it.
    fn admit(&self) -> (u64, CancellationToken) {
        let mut guard = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        let (next, conns) = &mut *guard;
        while conns.len() >= self.cap {
            match conns.pop_first() {
                Some((_, oldest)) => oldest.cancel(),
                None => break,
            }
        }
        let id = *next;
        *next += 1;
        let token = CancellationToken::new();
        conns.insert(id, token.clone());
        (id, token)
    }

    fn remove(&self, id: u64) {
        let mut guard = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        guard.1.remove(&id);
    }
}

/// A run of failed `accept` calls: how long to pause next, and what to log.
#[derive(Debug, Default)]
struct Failures {
    /// Failures in a row; 0 while accepting works.
    count: u64,
    /// Failures since the last warning.
    unreported: u64,
    last_warning: Option<Instant>,
}

impl Failures {
    /// Records a failure; returns how long to pause before accepting again.
    fn failed(&mut self, error: &std::io::Error) -> Duration {
        self.count += 1;
        self.unreported += 1;
        let now = Instant::now();
        if self
            .last_warning
            .is_none_or(|at| now.duration_since(at) >= WARN_EVERY)
        {
            tracing::warn!(
                error = %error,
                failures = self.unreported,
                "the probe endpoint cannot accept connections; pausing, then retrying"
            );
            self.last_warning = Some(now);
            self.unreported = 0;
        }
        let doublings = u32::try_from(self.count - 1).unwrap_or(u32::MAX).min(16);
        FIRST_BACKOFF
            .saturating_mul(1 << doublings)
            .min(MAX_BACKOFF)
    }

    /// Records a successful `accept`, ending a run of failures.
    fn recovered(&mut self) {
        if self.count > 0 {
            tracing::info!(
                failures = self.count,
                "the probe endpoint accepts connections again"
            );
            *self = Self::default();
        }
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

    #[test]
    fn the_cap_closes_the_oldest_connections_first() {
        let open = Open::new(2);
        let (a, ta) = open.admit();
        let (_, tb) = open.admit();
        assert!(!ta.is_cancelled() && !tb.is_cancelled());
        let (_, tc) = open.admit();
        assert!(ta.is_cancelled(), "the oldest is closed at the cap");
        assert!(!tb.is_cancelled() && !tc.is_cancelled());
        open.remove(a);
        let (_, td) = open.admit();
        assert!(tb.is_cancelled(), "then the next oldest");
        assert!(!tc.is_cancelled() && !td.is_cancelled());
    }

    #[test]
    fn a_closed_connection_frees_its_place() {
        let open = Open::new(2);
        let (a, ta) = open.admit();
        let (_, tb) = open.admit();
        open.remove(a);
        let (_, tc) = open.admit();
        assert!(!ta.is_cancelled() && !tb.is_cancelled() && !tc.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_from_10ms_to_1s_and_reset_on_success() {
        let mut f = Failures::default();
        let e = std::io::Error::other("EMFILE");
        let pauses: Vec<_> = (0..10).map(|_| f.failed(&e).as_millis()).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        f.recovered();
        assert_eq!(f.failed(&e), FIRST_BACKOFF);
        for _ in 0..1_000 {
            assert!(f.failed(&e) <= MAX_BACKOFF);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failures_warn_at_most_every_10s() {
        let mut f = Failures::default();
        let e = std::io::Error::other("EMFILE");
        f.failed(&e);
        assert_eq!(f.unreported, 0, "the first failure is reported at once");
        f.failed(&e);
        f.failed(&e);
        assert_eq!(f.unreported, 2, "then no warning within 10 s");
        tokio::time::advance(WARN_EVERY).await;
        f.failed(&e);
        assert_eq!(
            f.unreported, 0,
            "a warning again after 10 s, counting the silent ones"
        );
    }

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
