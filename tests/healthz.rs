//! The probe endpoint (`ProbeServer`) over real TCP on 127.0.0.1 with hand-written clients:
//! keep-alive, `HEAD`, query strings, 404/405, escaped identities in `/readyz`, slowloris and
//! silent clients, oversized headers, and the connection cap (probes answered beside 80 idle
//! and slow clients).

use std::net::SocketAddr;
use std::time::Duration;

use tenure::Locker;
use tenure::backend::memory::MemoryBackend;
use tenure::backend::{AcquireRequest, Backend, HolderToken};
use tenure::election::{ElectionConfig, LeaderElector};
use tenure::probe::ProbeServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

/// Bounds on waits that succeed at once on a healthy machine: generous, for a loaded one.
const PATIENCE: Duration = Duration::from_secs(20);

fn elector(store: MemoryBackend) -> LeaderElector {
    let locker = Locker::with_identity(store, "me").expect("valid identity");
    LeaderElector::new(locker, "probe", ElectionConfig::new()).expect("valid config")
}

/// A probe server for an elector that does not campaign: live, not ready.
fn idle_server() -> ProbeServer {
    ProbeServer::new(elector(MemoryBackend::new()))
}

async fn start(server: ProbeServer) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("bound address");
    tokio::spawn(server.serve(listener));
    addr
}

/// One parsed response.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then_some(v.trim())
        })
    }
}

/// A client connection that reads responses one at a time (keep-alive).
struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.expect("connect");
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, method: &str, target: &str) {
        let req = format!("{method} {target} HTTP/1.1\r\nhost: probe\r\n\r\n");
        self.stream
            .write_all(req.as_bytes())
            .await
            .expect("send request");
    }

    /// Reads more bytes; false at end of stream.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk).await.expect("read");
        self.buf.extend_from_slice(&chunk[..n]);
        n > 0
    }

    /// Reads one response to a request made with `method`.
    async fn answer(&mut self, method: &str) -> Answer {
        timeout(PATIENCE, async {
            let end = loop {
                if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                assert!(
                    self.fill().await,
                    "connection closed before a response; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                );
            };
            let head = String::from_utf8(self.buf.drain(..end).collect()).expect("ASCII head");
            let status = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .expect("a status code");
            let mut answer = Answer {
                status,
                head,
                body: String::new(),
            };
            let len: usize = if method == "HEAD" {
                0
            } else {
                answer
                    .header("content-length")
                    .expect("content-length")
                    .parse()
                    .expect("a length")
            };
            while self.buf.len() < len {
                assert!(self.fill().await, "connection closed inside a body");
            }
            answer.body = String::from_utf8(self.buf.drain(..len).collect()).expect("UTF-8");
            answer
        })
        .await
        .expect("a response in time")
    }

    async fn get(&mut self, target: &str) -> Answer {
        self.send("GET", target).await;
        self.answer("GET").await
    }

    /// Waits until the server closes the connection (end of stream or reset), at most
    /// `within`; returns the bytes received meanwhile, or `None` if it stayed open.
    async fn closed_within(&mut self, within: Duration) -> Option<Vec<u8>> {
        let closed = timeout(within, async {
            let mut chunk = [0u8; 4096];
            loop {
                match self.stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await;
        closed.ok().map(|()| std::mem::take(&mut self.buf))
    }
}

#[tokio::test]
async fn keep_alive_serves_two_requests_on_one_connection() {
    let addr = start(idle_server()).await;
    let mut c = Client::connect(addr).await;
    let first = c.get("/healthz").await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (200, "ok\n"),
        "{first:?}"
    );
    let second = c.get("/readyz").await;
    assert_eq!(
        (second.status, second.body.as_str()),
        (503, "no leader known yet\n"),
        "{second:?}"
    );
    let third = c.get("/healthz").await;
    assert_eq!(third.status, 200, "{third:?}");
}

#[tokio::test]
async fn head_healthz_returns_the_status_and_length_without_a_body() {
    let addr = start(idle_server()).await;
    let mut c = Client::connect(addr).await;
    c.stream
        .write_all(b"HEAD /healthz HTTP/1.1\r\nhost: probe\r\nconnection: close\r\n\r\n")
        .await
        .expect("send");
    let all = c
        .closed_within(PATIENCE)
        .await
        .expect("closed after the answer");
    let text = String::from_utf8(all).expect("ASCII");
    assert!(text.starts_with("HTTP/1.1 200 "), "{text:?}");
    assert!(
        text.ends_with("\r\n\r\n"),
        "nothing may follow the head of a HEAD answer: {text:?}"
    );
    assert!(
        text.to_ascii_lowercase()
            .contains("\r\ncontent-length: 3\r\n"),
        "the length of the GET body: {text:?}"
    );
}

#[tokio::test]
async fn head_answers_leave_a_keep_alive_connection_in_step() {
    let addr = start(idle_server()).await;
    let mut c = Client::connect(addr).await;
    c.send("HEAD", "/readyz").await;
    let head = c.answer("HEAD").await;
    assert_eq!(head.status, 503, "{head:?}");
    // Were a body sent after the HEAD answer, it would be read here as the next status line.
    let next = c.get("/healthz").await;
    assert_eq!((next.status, next.body.as_str()), (200, "ok\n"), "{next:?}");
}

#[tokio::test]
async fn query_strings_are_ignored_for_routing() {
    let addr = start(idle_server()).await;
    let mut c = Client::connect(addr).await;
    let h = c.get("/healthz?verbose=1").await;
    assert_eq!((h.status, h.body.as_str()), (200, "ok\n"), "{h:?}");
    let r = c.get("/readyz?x=1&y").await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (503, "no leader known yet\n"),
        "{r:?}"
    );
}

#[tokio::test]
async fn unknown_paths_get_a_complete_404_and_the_connection_stays_usable() {
    let addr = start(idle_server()).await;
    let mut c = Client::connect(addr).await;
    // `/metrics` without a registry, a near miss, and a path some application might add.
    for target in ["/metrics", "/healthz/", "/healthzz", "/debug/pprof"] {
        let a = c.get(target).await;
        assert_eq!(
            (a.status, a.body.as_str()),
            (404, "not found\n"),
            "{target}: {a:?}"
        );
        assert_eq!(a.header("content-length"), Some("10"), "{target}: {a:?}");
    }
    c.send("POST", "/healthz").await;
    let post = c.answer("POST").await;
    assert_eq!(post.status, 405, "{post:?}");
    assert_eq!(post.header("allow"), Some("GET, HEAD"), "{post:?}");
    assert_eq!(c.get("/healthz").await.status, 200);
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_are_served_when_a_registry_is_given() {
    let mut registry = prometheus_client::registry::Registry::default();
    let e = elector(MemoryBackend::new());
    let e = e.with_metrics(tenure::election::ElectionMetrics::register(&mut registry));
    let addr =
        start(ProbeServer::new(e).metrics(std::sync::Arc::new(std::sync::Mutex::new(registry))))
            .await;
    let mut c = Client::connect(addr).await;
    for _ in 0..2 {
        let m = c.get("/metrics?name[]=x").await;
        assert_eq!(m.status, 200, "{m:?}");
        assert!(m.body.ends_with("# EOF\n"), "{m:?}");
    }
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn the_applications_own_metrics_share_the_endpoint() {
    use prometheus_client::metrics::counter::Counter;
    let registry: tenure::probe::SharedRegistry = Default::default();
    let e = elector(MemoryBackend::new());
    let e = e.with_metrics(tenure::election::ElectionMetrics::register(
        &mut registry.lock().expect("registry"),
    ));
    let addr = start(ProbeServer::new(e).metrics(registry.clone())).await;
    // Registered after the server started, and updated by the application.
    let jobs = Counter::<u64>::default();
    registry.lock().expect("registry").register(
        "app_jobs_done",
        "Jobs the application finished",
        jobs.clone(),
    );
    jobs.inc_by(3);
    let mut c = Client::connect(addr).await;
    let m = c.get("/metrics").await;
    assert_eq!(m.status, 200, "{m:?}");
    assert!(m.body.contains("app_jobs_done_total 3"), "{}", m.body);
}

#[tokio::test]
async fn readyz_escapes_control_characters_in_a_stored_identity() {
    // Another client of the store wrote an identity with a terminal escape and a line break.
    let store = MemoryBackend::new();
    let evil = "pod\u{1b}[31m\r\nready: forged";
    let req = AcquireRequest {
        name: "probe".into(),
        holder: HolderToken::random(),
        identity: evil.into(),
        ttl: Duration::from_secs(3600),
    };
    store.try_acquire(&req).await.expect("memory never fails");
    let e = elector(store);
    let mut leader = e.leader();
    let campaign = tokio::spawn({
        let e = e.clone();
        async move { e.run(|_term| std::future::pending::<()>()).await }
    });
    timeout(
        PATIENCE,
        leader.wait_for(|l| l.as_ref().is_some_and(|l| l.identity == evil)),
    )
    .await
    .expect("the campaign sees the holder")
    .expect("the elector lives");
    let addr = start(ProbeServer::new(e)).await;
    let a = Client::connect(addr).await.get("/readyz").await;
    campaign.abort();
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, "following pod\\u{1b}[31m\\r\\nready: forged\n");
}

#[tokio::test]
async fn a_slowloris_client_blocks_no_probe_and_is_cut_off_after_the_header_timeout() {
    let header_timeout = Duration::from_secs(1);
    let addr = start(idle_server().header_timeout(header_timeout)).await;
    let mut slow = Client::connect(addr).await;
    let began = Instant::now();
    slow.stream
        .write_all(b"GET /healthz HTTP/1.1\r\nx-slow: ")
        .await
        .expect("send");
    // Meanwhile other probes are answered at once.
    let other = Client::connect(addr).await.get("/healthz").await;
    assert_eq!(other.status, 200, "{other:?}");
    // One more header byte a second, never the end of the headers: only the header timeout
    // can end this (each byte keeps the connection from being idle).
    let cut = timeout(PATIENCE, async {
        let mut chunk = [0u8; 512];
        loop {
            tokio::select! {
                read = slow.stream.read(&mut chunk) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => panic!("an answer to unfinished headers: {:?}", String::from_utf8_lossy(&chunk[..n])),
                },
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if slow.stream.write_all(b"a").await.is_err() {
                        return;
                    }
                }
            }
        }
    })
    .await;
    assert!(
        cut.is_ok(),
        "a client trickling headers was still connected after {PATIENCE:?}"
    );
    assert!(
        began.elapsed() >= header_timeout,
        "cut after {:?}, before the header timeout",
        began.elapsed()
    );
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_idle_timeout() {
    let addr = start(
        idle_server()
            .header_timeout(Duration::from_secs(3600))
            .idle_timeout(Duration::from_secs(1)),
    )
    .await;
    let mut c = Client::connect(addr).await;
    // Half a request, then nothing: the header timeout is an hour away.
    c.stream
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .expect("send");
    let got = c.closed_within(PATIENCE).await;
    assert_eq!(
        got.as_deref(),
        Some(&b""[..]),
        "closed without an answer within {PATIENCE:?}"
    );
}

#[tokio::test]
async fn a_keep_alive_connection_idle_between_requests_is_closed_after_the_header_timeout() {
    let addr = start(
        idle_server()
            .header_timeout(Duration::from_secs(1))
            .idle_timeout(Duration::from_secs(3600)),
    )
    .await;
    let mut c = Client::connect(addr).await;
    assert_eq!(c.get("/healthz").await.status, 200);
    let got = c.closed_within(PATIENCE).await;
    assert_eq!(got.as_deref(), Some(&b""[..]), "closed within {PATIENCE:?}");
}

#[tokio::test]
async fn headers_of_100_kb_get_431_or_a_close_and_the_server_lives_on() {
    let addr = start(idle_server()).await;
    let c = Client::connect(addr).await;
    let (mut rd, mut wr) = c.stream.into_split();
    let mut request = b"GET /healthz HTTP/1.1\r\nhost: probe\r\nx-big: ".to_vec();
    request.resize(request.len() + 100 * 1024, b'a');
    request.extend_from_slice(b"\r\n\r\n");
    // The server may close while this is still being written: ignore write errors.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        wr
    });
    let mut got = Vec::new();
    let read = timeout(PATIENCE, async {
        let mut chunk = [0u8; 4096];
        loop {
            match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "neither an answer nor a close within {PATIENCE:?}"
    );
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 431 "),
        "oversized headers must get 431 or a close: {text:?}"
    );
    drop(writer.await);
    let after = Client::connect(addr).await.get("/healthz").await;
    assert_eq!(after.status, 200, "{after:?}");
}

#[tokio::test]
async fn headers_under_the_limit_are_served() {
    let addr = start(idle_server()).await;
    let mut c = Client::connect(addr).await;
    let filler = "c".repeat(ProbeServer::MAX_HEADER_BYTES / 2);
    let req = format!("GET /healthz HTTP/1.1\r\nhost: probe\r\ncookie: {filler}\r\n\r\n");
    c.stream.write_all(req.as_bytes()).await.expect("send");
    let a = c.answer("GET").await;
    assert_eq!(a.status, 200, "{a:?}");
}

#[tokio::test]
async fn a_connection_above_the_cap_closes_the_oldest() {
    let addr = start(
        idle_server()
            .max_connections(2)
            .header_timeout(Duration::from_secs(3600))
            .idle_timeout(Duration::from_secs(3600)),
    )
    .await;
    // Two kept-alive connections, each answered once: both hold a place.
    let mut first = Client::connect(addr).await;
    assert_eq!(first.get("/healthz").await.status, 200);
    let mut second = Client::connect(addr).await;
    assert_eq!(second.get("/healthz").await.status, 200);
    // A third is served at once, and the oldest is closed to make room.
    let mut third = Client::connect(addr).await;
    let a = third.get("/healthz").await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        first.closed_within(PATIENCE).await.is_some(),
        "the oldest connection stayed open above the cap"
    );
    assert_eq!(second.get("/healthz").await.status, 200);
    assert_eq!(third.get("/healthz").await.status, 200);
}

/// 80 clients that hold connections open — 40 silent, 40 trickling a header byte every
/// 200 ms (slowloris) — against the default limits (64 connections, 10 s header timeout):
/// a probe polling every 100 ms meanwhile is answered within a second, every time.
#[tokio::test]
async fn probes_are_answered_within_a_second_beside_80_idle_and_slow_clients() {
    let addr = start(idle_server()).await;
    let mut hogs = Vec::new();
    for i in 0..80 {
        let mut c = Client::connect(addr).await;
        if i % 2 == 1 {
            c.stream
                .write_all(b"GET /healthz HTTP/1.1\r\nx-slow: ")
                .await
                .expect("send");
        }
        hogs.push(c);
    }
    let trickle = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            for c in hogs.iter_mut().skip(1).step_by(2) {
                // A hog the server closed stays closed; the rest keep trickling.
                let _ = c.stream.write_all(b"a").await;
            }
        }
    });
    let mut slowest = Duration::ZERO;
    for _ in 0..30 {
        let began = Instant::now();
        let answered = timeout(Duration::from_secs(1), async {
            let mut c = Client::connect(addr).await;
            c.get("/healthz").await
        })
        .await;
        let a = answered.unwrap_or_else(|_| {
            panic!("a probe was not answered within 1 s beside 80 idle and slow clients")
        });
        assert_eq!(a.status, 200, "{a:?}");
        slowest = slowest.max(began.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    trickle.abort();
    eprintln!("slowest probe: {slowest:?}");
}
