//! The Redis backend against a hostile or broken server: a RESP server in this test answers the
//! handshake and script loads properly and then the scripts' calls with what no Redis should
//! send (a 4 GB string, wrong types, deep nesting, negative tokens, a 50 MB identity). Every
//! case must end in a typed error (or a foreign "busy") within the request timeout, without a
//! panic, and without growing the process by more than a few MiB. The same over TLS, where
//! tenure does the handshake itself to bound the decrypted replies, and where a server whose
//! certificate the configured CA does not vouch for is refused before it can send anything.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rustls::pki_types::pem::PemObject;
use tenure::backend::redis::{MAX_REPLY_BYTES, RedisBackend, RedisConfig};
use tenure::backend::{AcquireRequest, Acquired, Backend, BackendErrorKind, HolderToken};
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// How the server answers the scripts' calls (EVALSHA; SUBSCRIBE for observers).
#[derive(Clone, Copy, Debug)]
enum Hostile {
    /// Declares a 4,000,000,000-byte string, then sends bytes as fast as the client takes them.
    HugeString,
    /// Declares the string, then trickles a byte every few milliseconds.
    TrickledString,
    /// A string of 50 MB, sent whole: the identity of a "busy" holder.
    HugeIdentity,
    /// An array of 100,000 nested arrays.
    DeepNesting,
    /// An array of a million elements, sent in full.
    WideArray,
    /// An integer where an array is expected.
    IntegerForArray,
    /// An array where a string is expected (the value inspect reads).
    ArrayForString,
    /// A granted fencing token of -5, and the same in inspect's value and counter.
    NegativeFencing,
    /// `!-1`: a blob error of negative length (the parser would wait forever).
    NegativeBlob,
    /// Scripts answer "free"; the subscriber connection gets a message declaring a 4 GB
    /// payload right after its subscription is confirmed, then a flood.
    HugeNotification,
    /// `CLUSTER SLOTS` declares a 4 GB string, then floods (scripts are never reached).
    HugeSlotMap,
}

/// What the server sends for one call: `head`, then `fill` repeated `times` times (written in
/// chunks, so that the server itself allocates little), then `tail`.
struct Answer {
    head: Vec<u8>,
    fill: &'static [u8],
    times: usize,
    tail: Vec<u8>,
}

impl Answer {
    fn bytes(head: impl Into<Vec<u8>>) -> Self {
        Self {
            head: head.into(),
            fill: b"",
            times: 0,
            tail: Vec::new(),
        }
    }
}

/// What the server answers to one call of `script` (`acquire`, `inspect`…).
fn answer(how: Hostile, script: &str) -> Answer {
    let token = "0123456789abcdef".repeat(2);
    let none = "-".repeat(32);
    match how {
        Hostile::HugeString | Hostile::TrickledString | Hostile::HugeSlotMap => {
            Answer::bytes("*1\r\n$4000000000\r\n")
        }
        Hostile::HugeIdentity if script == "inspect" => {
            let value = format!("+{token}0{none}7:");
            Answer {
                head: format!("*3\r\n${}\r\n{value}", value.len() + IDENTITY).into_bytes(),
                fill: b"x",
                times: IDENTITY,
                tail: b"\r\n:1000\r\n$1\r\n7\r\n".to_vec(),
            }
        }
        Hostile::HugeIdentity => Answer {
            head: format!("*1\r\n*3\r\n:0\r\n:1000\r\n${IDENTITY}\r\n").into_bytes(),
            fill: b"x",
            times: IDENTITY,
            tail: b"\r\n".to_vec(),
        },
        Hostile::DeepNesting => Answer {
            head: Vec::new(),
            fill: b"*1\r\n",
            times: 100_000,
            tail: b":1\r\n".to_vec(),
        },
        Hostile::WideArray => Answer {
            head: b"*1\r\n*1000000\r\n".to_vec(),
            fill: b":0\r\n",
            times: 1_000_000,
            tail: Vec::new(),
        },
        Hostile::IntegerForArray => Answer::bytes(":1\r\n"),
        Hostile::ArrayForString if script == "inspect" => {
            Answer::bytes("*3\r\n*2\r\n:1\r\n:2\r\n:1000\r\n$1\r\n7\r\n")
        }
        Hostile::ArrayForString => Answer::bytes("*1\r\n*3\r\n:0\r\n*1\r\n:5\r\n*1\r\n:5\r\n"),
        Hostile::NegativeFencing if script == "inspect" => {
            let value = format!("+{token}0{none}-5:pod");
            Answer::bytes(format!(
                "*3\r\n${}\r\n{value}\r\n:1000\r\n$2\r\n-5\r\n",
                value.len()
            ))
        }
        Hostile::NegativeFencing => Answer::bytes("*1\r\n:-5\r\n"),
        Hostile::NegativeBlob => Answer::bytes("!-1\r\n"),
        Hostile::HugeNotification => Answer::bytes("*3\r\n$-1\r\n:-2\r\n$-1\r\n"),
    }
}

/// The size of the huge identity: 50 MiB.
const IDENTITY: usize = 50 << 20;

/// Writes `a`; false when the client went away.
async fn send(w: &mut (impl AsyncWriteExt + Unpin), a: &Answer) -> bool {
    if w.write_all(&a.head).await.is_err() {
        return false;
    }
    let per_chunk = (64 << 10) / a.fill.len().max(1);
    let chunk = a.fill.repeat(per_chunk);
    let mut left = a.times;
    while left > 0 {
        let n = left.min(per_chunk);
        if w.write_all(&chunk[..n * a.fill.len()]).await.is_err() {
            return false;
        }
        left -= n;
    }
    w.write_all(&a.tail).await.is_ok()
}

/// Reads one command (an array of bulk strings), as clients send them.
async fn read_command(r: &mut (impl AsyncBufRead + Unpin)) -> Option<Vec<Vec<u8>>> {
    let mut line = String::new();
    if r.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let n: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).await.ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut arg = vec![0; len + 2];
        r.read_exact(&mut arg).await.ok()?;
        arg.truncate(len);
        args.push(arg);
    }
    Some(args)
}

/// A server on 127.0.0.1 that speaks RESP2 properly until a script runs; over TLS if started
/// with [`Server::start_tls`].
struct Server {
    port: u16,
    /// The test CA's PEM, for a TLS server.
    ca_pem: Option<Vec<u8>>,
    /// The socket's path, for a server on a Unix socket (`port` is then 0).
    socket: Option<std::path::PathBuf>,
    /// Connections accepted (over TLS: whose handshake completed).
    accepted: Arc<AtomicU64>,
    /// Commands received.
    commands: Arc<AtomicU64>,
    /// Holds the certificates of a TLS server.
    _dir: Option<support::TempDir>,
    /// Bytes written after hostile headers (to show that the client stopped reading).
    flooded: Arc<AtomicU64>,
    /// SUBSCRIBE commands received.
    subscribes: Arc<AtomicU64>,
    /// Reached as a Redis Cluster (the server answers `CLUSTER SLOTS` with itself).
    cluster: bool,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(how: Hostile) -> Self {
        Self::listen(how, "127.0.0.1", None).await
    }

    /// The server behind TLS, with a certificate for 127.0.0.1 and localhost from a test CA
    /// (made with the `openssl` CLI), listening on `ip`.
    async fn start_tls(how: Hostile, ip: &str) -> Self {
        let (acceptor, ca_pem, dir) = test_tls();
        let mut server = Self::listen(how, ip, Some(acceptor)).await;
        server.ca_pem = Some(ca_pem);
        server._dir = Some(dir);
        server
    }

    /// The server on a Unix socket.
    async fn start_unix(how: Hostile) -> Self {
        let dir = support::TempDir::new("hostile-unix");
        let path = dir.path().join("redis.sock");
        let listener =
            tokio::net::UnixListener::bind(&path).unwrap_or_else(|e| panic!("bind: {e}"));
        let counters = Counters::default();
        let c = counters.clone();
        let task = tokio::spawn(async move {
            let scripts = Scripts::default();
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((socket, _)) = listener.accept().await {
                c.accepted.fetch_add(1, Ordering::Relaxed);
                connections.spawn(serve(socket, how, scripts.clone(), c.clone()));
            }
        });
        Self {
            port: 0,
            ca_pem: None,
            socket: Some(path),
            accepted: counters.accepted,
            commands: counters.commands,
            _dir: Some(dir),
            flooded: counters.flooded,
            subscribes: counters.subscribes,
            cluster: false,
            task,
        }
    }

    async fn listen(how: Hostile, ip: &str, tls: Option<TlsAcceptor>) -> Self {
        let listener = TcpListener::bind((ip, 0))
            .await
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("{e}"))
            .port();
        let counters = Counters {
            port,
            ..Counters::default()
        };
        let c = counters.clone();
        let task = tokio::spawn(async move {
            let scripts = Scripts::default();
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((socket, _)) = listener.accept().await {
                let (c, scripts, tls) = (c.clone(), scripts.clone(), tls.clone());
                connections.spawn(async move {
                    match tls {
                        None => {
                            c.accepted.fetch_add(1, Ordering::Relaxed);
                            serve(socket, how, scripts, c).await;
                        }
                        Some(tls) => {
                            if let Ok(stream) = tls.accept(socket).await {
                                c.accepted.fetch_add(1, Ordering::Relaxed);
                                serve(stream, how, scripts, c).await;
                            }
                        }
                    }
                });
            }
        });
        Self {
            port,
            ca_pem: None,
            socket: None,
            accepted: counters.accepted,
            commands: counters.commands,
            _dir: None,
            flooded: counters.flooded,
            subscribes: counters.subscribes,
            cluster: false,
            task,
        }
    }

    fn url(&self) -> String {
        if let Some(path) = &self.socket {
            return format!("redis+unix://{}", path.display());
        }
        let scheme = if self.ca_pem.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// The config to reach it (over TLS, trusting the test CA).
    fn config(&self) -> RedisConfig {
        let mut config = RedisConfig::new(&self.url())
            .unwrap_or_else(|e| panic!("{e}"))
            .request_timeout(REQUEST_TIMEOUT);
        if self.cluster {
            config = config.cluster();
        }
        match &self.ca_pem {
            Some(pem) => config.ca_certificate_pem(pem.clone()),
            None => config,
        }
    }
}

/// A TLS acceptor with a certificate for 127.0.0.1 and localhost from a test CA (made with the
/// `openssl` CLI), the CA's PEM, and the directory holding them.
fn test_tls() -> (TlsAcceptor, Vec<u8>, support::TempDir) {
    let dir = support::TempDir::new("hostile-tls");
    let certs = support::make_tls(dir.path());
    let read = |p: &std::path::Path| std::fs::read(p).unwrap_or_else(|e| panic!("{e}"));
    let chain = rustls::pki_types::CertificateDer::pem_slice_iter(&read(&certs.server_cert))
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| panic!("{e}"));
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(&read(&certs.server_key))
        .unwrap_or_else(|e| panic!("{e}"));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
    .unwrap_or_else(|e| panic!("{e}"));
    (
        TlsAcceptor::from(Arc::new(config)),
        read(&certs.ca_cert),
        dir,
    )
}

/// What the server counts, shared by its connections.
#[derive(Clone, Default)]
struct Counters {
    accepted: Arc<AtomicU64>,
    commands: Arc<AtomicU64>,
    flooded: Arc<AtomicU64>,
    subscribes: Arc<AtomicU64>,
    /// The server's own port, which `CLUSTER SLOTS` names as every slot's master.
    port: u16,
}

/// SHA1 → script name, from the SCRIPT LOADs (a server's script cache outlives connections).
type Scripts = Arc<std::sync::Mutex<Vec<(String, &'static str)>>>;

async fn serve(
    socket: impl AsyncRead + AsyncWrite + Send + 'static,
    how: Hostile,
    scripts: Scripts,
    counters: Counters,
) {
    let Counters {
        commands,
        flooded,
        subscribes,
        ..
    } = counters.clone();
    let (r, mut w) = tokio::io::split(socket);
    let mut r = BufReader::new(r);
    while let Some(cmd) = read_command(&mut r).await {
        commands.fetch_add(1, Ordering::Relaxed);
        let name = String::from_utf8_lossy(&cmd[0]).to_ascii_uppercase();
        let reply = match name.as_str() {
            "SCRIPT" => {
                let src = String::from_utf8_lossy(&cmd[2]).into_owned();
                let sha = redis::Script::new(&src).get_hash().to_owned();
                let script = ["acquire", "renew", "release", "inspect"]
                    .into_iter()
                    // Each script's own file starts with this line (after value.lua).
                    .find(|s| src.contains(&format!("\n-- {s}.lua:")))
                    .unwrap_or("unknown");
                scripts
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((sha.clone(), script));
                Answer::bytes(format!("$40\r\n{sha}\r\n"))
            }
            "EVALSHA" => {
                let sha = String::from_utf8_lossy(&cmd[1]).into_owned();
                let script = scripts
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .iter()
                    .find(|(s, _)| *s == sha)
                    .map_or("unknown", |(_, n)| *n);
                answer(how, script)
            }
            "SUBSCRIBE" => {
                subscribes.fetch_add(1, Ordering::Relaxed);
                let channel = String::from_utf8_lossy(&cmd[1]).into_owned();
                Answer::bytes(format!(
                    "*3\r\n$9\r\nsubscribe\r\n${}\r\n{channel}\r\n:1\r\n",
                    channel.len()
                ))
            }
            "PING" => Answer::bytes("+PONG\r\n"),
            // A one-node cluster: every slot's master is this server.
            "CLUSTER" if matches!(how, Hostile::HugeSlotMap) => Answer::bytes("$4000000000\r\n"),
            "CLUSTER" => Answer::bytes(format!(
                "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:{}\r\n$40\r\n{}\r\n",
                counters.port,
                "f".repeat(40)
            )),
            _ => Answer::bytes("+OK\r\n"),
        };
        if !send(&mut w, &reply).await {
            return;
        }
        if name == "SUBSCRIBE" && matches!(how, Hostile::HugeNotification) {
            let channel = String::from_utf8_lossy(&cmd[1]).into_owned();
            let header = format!(
                "*3\r\n$7\r\nmessage\r\n${}\r\n{channel}\r\n$4000000000\r\n",
                channel.len()
            );
            if w.write_all(header.as_bytes()).await.is_err() {
                return;
            }
            let chunk = vec![b'x'; 1 << 16];
            while w.write_all(&chunk).await.is_ok() {
                flooded.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            return;
        }
        if name != "EVALSHA" && !(name == "CLUSTER" && matches!(how, Hostile::HugeSlotMap)) {
            continue;
        }
        match how {
            Hostile::HugeString | Hostile::HugeSlotMap => {
                let chunk = vec![b'x'; 1 << 16];
                while w.write_all(&chunk).await.is_ok() {
                    flooded.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
                return;
            }
            Hostile::TrickledString => loop {
                if w.write_all(b"x").await.is_err() {
                    return;
                }
                flooded.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            },
            _ => {}
        }
    }
}

/// The resident set size of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_else(|e| panic!("{e}"));
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("statm: {statm}"));
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

async fn connect(server: &Server) -> RedisBackend {
    RedisBackend::connect(server.config())
        .await
        .unwrap_or_else(|e| panic!("the handshake is proper: {e}"))
}

fn req() -> AcquireRequest {
    AcquireRequest {
        name: "hostile".into(),
        holder: HolderToken::random(),
        identity: "me".into(),
        ttl: Duration::from_secs(5),
    }
}

/// Runs every operation against a server answering `how`; each must fail (or be busy) in time.
/// Returns the errors' messages, and how much the process grew meanwhile.
async fn run(how: Hostile) -> (Vec<String>, u64) {
    let _serial = SERIAL.lock().await;
    run_on(how, Server::start(how).await).await
}

/// [`run`] against `server`, which answers `how`.
async fn run_on(how: Hostile, server: Server) -> (Vec<String>, u64) {
    let b = connect(&server).await;
    let before = rss();
    let mut messages = Vec::new();
    let r = req();
    let bound = REQUEST_TIMEOUT + Duration::from_millis(500);
    let timed = |started: Instant, what: &str| {
        assert!(
            started.elapsed() < bound,
            "{how:?}: {what} took {:?}",
            started.elapsed()
        );
    };
    let started = Instant::now();
    match b.try_acquire(&r).await {
        Err(e) => messages.push(format!("acquire: {:?} {e}", e.kind())),
        Ok(Acquired::Busy { holder, .. }) => {
            assert!(
                holder.as_ref().is_none_or(|h| h.len() < 1 << 20),
                "{how:?}: busy with a huge holder"
            );
            messages.push("acquire: busy".into());
        }
        Ok(granted) => panic!("{how:?}: acquire must not be granted: {granted:?}"),
    }
    timed(started, "acquire");
    let started = Instant::now();
    let e = b
        .renew(&r.name, &r.holder, r.ttl)
        .await
        .expect_err("renew must fail");
    messages.push(format!("renew: {:?} {e}", e.kind()));
    timed(started, "renew");
    let started = Instant::now();
    let e = b
        .release(&r.name, &r.holder)
        .await
        .expect_err("release must fail");
    messages.push(format!("release: {:?} {e}", e.kind()));
    timed(started, "release");
    let started = Instant::now();
    let e = b.inspect(&r.name).await.expect_err("inspect must fail");
    messages.push(format!("inspect: {:?} {e}", e.kind()));
    timed(started, "inspect");
    // The observer's first read is an inspect, after its subscription.
    let first = tokio::time::timeout(Duration::from_secs(5), b.observe(&r.name).next())
        .await
        .unwrap_or_else(|_| panic!("{how:?}: observe hung"));
    assert!(matches!(first, Some(Err(_))), "{how:?}: observe: {first:?}");
    // Whatever the server still sends must not be read into memory.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = rss().saturating_sub(before);
    drop(b);
    let flooded = server.flooded.load(Ordering::Relaxed);
    eprintln!(
        "{how:?}: grew {} KiB; the server flooded {} KiB; {messages:#?}",
        grown >> 10,
        flooded >> 10
    );
    (messages, grown)
}

const GROWTH_BOUND: u64 = 64 << 20;

/// One test at a time: they share the process whose growth they measure.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn assert_refused(how: Hostile, messages: &[String], grown: u64, expected: &str) {
    assert!(
        grown < GROWTH_BOUND,
        "{how:?}: the process grew by {} MiB",
        grown >> 20
    );
    for m in messages {
        assert!(m.contains("Protocol"), "{how:?}: {m}");
        assert!(m.contains(expected), "{how:?}: {m} should say {expected:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4gb_string_is_refused_at_its_header() {
    let (messages, grown) = run(Hostile::HugeString).await;
    assert_refused(
        Hostile::HugeString,
        &messages,
        grown,
        "declares a 4000000000-byte string",
    );
    assert!(
        messages
            .iter()
            .all(|m| m.contains(&MAX_REPLY_BYTES.to_string())),
        "the message names the limit: {messages:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_4gb_string_is_refused_without_waiting_for_it() {
    let (messages, grown) = run(Hostile::TrickledString).await;
    assert_refused(
        Hostile::TrickledString,
        &messages,
        grown,
        "declares a 4000000000-byte string",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50mb_identity_is_refused() {
    let (messages, grown) = run(Hostile::HugeIdentity).await;
    assert_refused(
        Hostile::HugeIdentity,
        &messages,
        grown,
        "-byte string; tenure accepts at most",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_nesting_is_refused() {
    let (messages, grown) = run(Hostile::DeepNesting).await;
    assert_refused(Hostile::DeepNesting, &messages, grown, "nests aggregates");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_element_array_is_refused_at_its_header() {
    let (messages, grown) = run(Hostile::WideArray).await;
    assert_refused(
        Hostile::WideArray,
        &messages,
        grown,
        "declares 1000000 elements",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_length_blob_is_refused() {
    let (messages, grown) = run(Hostile::NegativeBlob).await;
    assert_refused(
        Hostile::NegativeBlob,
        &messages,
        grown,
        "declares a length of -1",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_types_and_negative_tokens_are_protocol_errors() {
    for how in [
        Hostile::IntegerForArray,
        Hostile::ArrayForString,
        Hostile::NegativeFencing,
    ] {
        let (messages, grown) = run(how).await;
        assert!(grown < GROWTH_BOUND, "{how:?}: grew {} MiB", grown >> 20);
        for m in &messages {
            if matches!(how, Hostile::ArrayForString) && m == "acquire: busy" {
                // {0, {5}, {5}}: busy, with no usable ttl or holder.
                continue;
            }
            assert!(m.contains("Protocol"), "{how:?}: {m}");
            assert!(
                !m.contains("MAX_REPLY_BYTES"),
                "{how:?}: small replies pass: {m}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_loads_answered_with_the_wrong_thing_fail_the_connect() {
    // A server that answers SCRIPT LOAD with OK instead of the script's SHA1 is not Redis.
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("{e}"))
        .port();
    let task = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (r, mut w) = socket.into_split();
                let mut r = BufReader::new(r);
                while read_command(&mut r).await.is_some() {
                    if w.write_all(b"*1\r\n:1\r\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let err = RedisBackend::connect(
        RedisConfig::new(&format!("redis://127.0.0.1:{port}/"))
            .unwrap_or_else(|e| panic!("{e}"))
            .request_timeout(REQUEST_TIMEOUT),
    )
    .await
    .expect_err("not a Redis");
    assert_eq!(err.kind(), BackendErrorKind::Protocol, "{err}");
    assert!(err.to_string().contains("script load"), "{err}");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4gb_notification_is_refused_and_the_subscriber_reconnects() {
    let _serial = SERIAL.lock().await;
    notification_refused(Server::start(Hostile::HugeNotification).await).await;
}

/// A 4 GB notification from `server` is refused; the subscriber reconnects.
async fn notification_refused(server: Server) {
    let b = connect(&server).await;
    let before = rss();
    let mut stream = b.observe("hostile");
    // The first item is the state read after the subscription (free), or an error if the
    // connection was cut first; either way it comes, and the process does not balloon.
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap_or_else(|_| panic!("observe hung"));
    assert!(first.is_some(), "{first:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let grown = rss().saturating_sub(before);
    eprintln!(
        "notification: grew {} KiB; the server flooded {} KiB",
        grown >> 10,
        server.flooded.load(Ordering::Relaxed) >> 10
    );
    assert!(
        grown < GROWTH_BOUND,
        "the process grew by {} MiB",
        grown >> 20
    );
    // The subscriber connection was cut and made again (each time refused again).
    let subscribes = server.subscribes.load(Ordering::Relaxed);
    assert!(subscribes >= 2, "{subscribes} subscriptions");
    drop(stream);
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4gb_string_over_tls_is_refused_at_its_header() {
    let _serial = SERIAL.lock().await;
    let how = Hostile::HugeString;
    let server = Server::start_tls(how, "127.0.0.1").await;
    let (accepted, commands) = (server.accepted.clone(), server.commands.clone());
    let (messages, grown) = run_on(how, server).await;
    assert_refused(how, &messages, grown, "declares a 4000000000-byte string");
    assert!(
        messages
            .iter()
            .all(|m| m.contains(&MAX_REPLY_BYTES.to_string())),
        "the message names the limit: {messages:?}"
    );
    // It was TLS all along: handshakes completed and the commands came through them.
    assert!(
        accepted.load(Ordering::Relaxed) >= 2,
        "a command connection and a subscriber"
    );
    assert!(
        commands.load(Ordering::Relaxed) >= 5,
        "script loads and calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4gb_notification_over_tls_is_refused_and_the_subscriber_reconnects() {
    let _serial = SERIAL.lock().await;
    notification_refused(Server::start_tls(Hostile::HugeNotification, "127.0.0.1").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_server_the_ca_does_not_vouch_for_gets_nothing() {
    // A certificate from another CA.
    let server = Server::start_tls(Hostile::HugeString, "127.0.0.1").await;
    let dir = support::TempDir::new("hostile-wrong-ca");
    let wrong =
        std::fs::read(support::make_ca(dir.path(), "wrong")).unwrap_or_else(|e| panic!("{e}"));
    let err = RedisBackend::connect(
        server
            .config()
            .password("secret-Pw-1")
            .ca_certificate_pem(wrong),
    )
    .await
    .expect_err("a certificate from another CA");
    assert_eq!(err.kind(), BackendErrorKind::Config, "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
    assert!(!err.to_string().contains("secret-Pw-1"), "{err}");
    // A certificate from the right CA, for another name (it names 127.0.0.1 and localhost).
    let elsewhere = Server::start_tls(Hostile::HugeString, "127.0.0.2").await;
    let url = format!("rediss://127.0.0.2:{}/", elsewhere.port);
    let err = RedisBackend::connect(
        RedisConfig::new(&url)
            .unwrap_or_else(|e| panic!("{e}"))
            .password("secret-Pw-1")
            .ca_certificate_pem(elsewhere.ca_pem.clone().unwrap_or_default()),
    )
    .await
    .expect_err("a certificate for another name");
    assert_eq!(err.kind(), BackendErrorKind::Config, "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
    // Neither server completed a handshake, so neither saw a byte of AUTH or anything else.
    for s in [&server, &elsewhere] {
        assert_eq!(s.accepted.load(Ordering::Relaxed), 0);
        assert_eq!(s.commands.load(Ordering::Relaxed), 0);
    }
    // The same CA and name do connect (the refusals above were the certificate's doing).
    let ok = RedisBackend::connect(server.config()).await;
    assert!(ok.is_ok(), "{ok:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connect_timeout_covers_the_tls_handshake_and_auth() {
    let (acceptor, ca_pem, _dir) = test_tls();
    // One server never answers the ClientHello; the other completes the handshake and then
    // never answers AUTH.
    let silent = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mute = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ports = [&silent, &mute].map(|l| l.local_addr().unwrap_or_else(|e| panic!("{e}")).port());
    let handshakes = Arc::new(AtomicU64::new(0));
    let h = handshakes.clone();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            tokio::select! {
                Ok((socket, _)) = silent.accept() => held.push(tokio::spawn(async move {
                    let _socket = socket;
                    std::future::pending::<()>().await;
                })),
                Ok((socket, _)) = mute.accept() => {
                    let (acceptor, h) = (acceptor.clone(), h.clone());
                    held.push(tokio::spawn(async move {
                        let Ok(mut stream) = acceptor.accept(socket).await else { return };
                        h.fetch_add(1, Ordering::Relaxed);
                        // Read what comes (AUTH), answer nothing.
                        let mut buf = [0; 1024];
                        while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
                    }));
                }
            }
        }
    });
    // Only the connect timeout can end the attempt within `ended_by`: the request timeout is
    // far past it (a handshake or AUTH left to it would take 30 s), and the servers never
    // answer. The margin is a loaded machine's (a 300 ms one failed at 812 ms under load).
    let connect_timeout = Duration::from_millis(400);
    let request_timeout = Duration::from_secs(30);
    let ended_by = Duration::from_secs(5);
    for port in ports {
        let started = Instant::now();
        let err = tokio::time::timeout(
            request_timeout * 2,
            RedisBackend::connect(
                RedisConfig::new(&format!("rediss://127.0.0.1:{port}/"))
                    .unwrap_or_else(|e| panic!("{e}"))
                    .password("secret-Pw-1")
                    .ca_certificate_pem(ca_pem.clone())
                    .connect_timeout(connect_timeout)
                    .request_timeout(request_timeout),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("port {port}: the connect timeout never ended the attempt"))
        .expect_err("the server never answers");
        let took = started.elapsed();
        assert_eq!(err.kind(), BackendErrorKind::Timeout, "{err}");
        assert!(
            took >= connect_timeout && took < ended_by,
            "took {took:?}: not ended by the {connect_timeout:?} connect timeout"
        );
    }
    assert!(
        handshakes.load(Ordering::Relaxed) >= 1,
        "the second server's handshake completed"
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4gb_string_over_a_unix_socket_is_refused_at_its_header() {
    let _serial = SERIAL.lock().await;
    let how = Hostile::HugeString;
    let server = Server::start_unix(how).await;
    let accepted = server.accepted.clone();
    let (messages, grown) = run_on(how, server).await;
    assert_refused(how, &messages, grown, "declares a 4000000000-byte string");
    assert!(
        accepted.load(Ordering::Relaxed) >= 2,
        "it was the Unix socket"
    );
}

/// A Redis Cluster's node (plain and over TLS) declares a 4 GB string: refused at its header,
/// like a single server's. tenure opens every node connection itself (the redis crate's
/// cluster client opened them over streams tenure could not bound, and read the whole string).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4gb_string_from_a_cluster_node_is_refused_at_its_header() {
    let _serial = SERIAL.lock().await;
    let how = Hostile::HugeString;
    for tls in [false, true] {
        let mut server = if tls {
            Server::start_tls(how, "127.0.0.1").await
        } else {
            Server::start(how).await
        };
        server.cluster = true;
        let commands = server.commands.clone();
        let (messages, grown) = run_on(how, server).await;
        assert_refused(how, &messages, grown, "declares a 4000000000-byte string");
        assert!(
            commands.load(Ordering::Relaxed) > 0,
            "tls {tls}: the node was asked"
        );
    }
}

/// A node whose `CLUSTER SLOTS` reply declares 4 GB: the connect fails at the header, naming
/// the limit, without reading the flood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4gb_slot_map_is_refused_at_its_header() {
    let _serial = SERIAL.lock().await;
    let mut server = Server::start(Hostile::HugeSlotMap).await;
    server.cluster = true;
    let before = rss();
    let started = Instant::now();
    let e = RedisBackend::connect(server.config())
        .await
        .expect_err("no slot map");
    let grown = rss().saturating_sub(before);
    assert_eq!(e.kind(), BackendErrorKind::Protocol, "{e}");
    let text = e.to_string();
    assert!(text.contains("declares a 4000000000-byte string"), "{text}");
    assert!(text.contains(&MAX_REPLY_BYTES.to_string()), "{text}");
    assert!(grown < GROWTH_BOUND, "grew {} MiB", grown >> 20);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}
