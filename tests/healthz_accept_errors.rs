//! The probe endpoint outlives `accept` failing with `EMFILE`: this process runs out of file
//! descriptors while a client waits, and the client is still answered once some are free.
//! A test binary of its own, with a single test, because it lowers `RLIMIT_NOFILE` and uses
//! up every descriptor of the process.

#[path = "support/open_files.rs"]
mod open_files;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use open_files::limit_open_files;
use tenure::Locker;
use tenure::backend::memory::MemoryBackend;
use tenure::election::{ElectionConfig, LeaderElector};
use tenure::probe::ProbeServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the server logged.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }
}

/// Opens files until the process has no descriptor left.
fn exhaust_descriptors() -> Vec<std::fs::File> {
    let mut files = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => files.push(f),
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => return files,
            Err(e) => panic!("opening /dev/null: {e}"),
        }
    }
}

#[tokio::test]
async fn the_endpoint_keeps_accepting_after_running_out_of_file_descriptors() {
    let log = Log::default();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer({
                let log = log.clone();
                move || log.clone()
            })
            .finish(),
    )
    .expect("the only subscriber of this test binary");
    limit_open_files(256);

    let locker = Locker::with_identity(MemoryBackend::new(), "me").expect("valid identity");
    let elector = LeaderElector::new(locker, "probe", ElectionConfig::new()).expect("valid");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("bound address");
    let serving = tokio::spawn(ProbeServer::new(elector).serve(listener));

    // Every descriptor but one in use; the client takes the last, so the server's `accept`
    // fails with EMFILE while the connection waits in the backlog.
    let mut files = exhaust_descriptors();
    drop(files.pop());
    let mut client = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect with the last descriptor");
    client
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: probe\r\nconnection: close\r\n\r\n")
        .await
        .expect("send");
    // Long enough for several failed attempts (10, 20, 40, 80, 160 ms apart).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let starved = log.text();
    assert!(
        !serving.is_finished(),
        "serve returned on an accept error: {:?}",
        serving.await
    );
    drop(files);

    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(20),
        client.read_to_string(&mut response),
    )
    .await
    .expect("answered once descriptors are free")
    .expect("read the answer");
    assert!(response.starts_with("HTTP/1.1 200 "), "{response:?}");
    assert!(response.ends_with("\r\n\r\nok\n"), "{response:?}");

    let log = log.text();
    let warnings: Vec<_> = starved
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("cannot accept"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning, then silence for 10 s: {starved}"
    );
    assert!(
        warnings[0].contains("Too many open files"),
        "the cause is logged: {starved}"
    );
    // The number of failed attempts, reported on recovery, shows the pauses between them: a
    // retry loop without a pause would fail thousands of times in half a second.
    let failures: u64 = log
        .lines()
        .find(|l| l.contains("accepts connections again"))
        .and_then(|l| l.split("failures=").nth(1))
        .and_then(|n| n.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("recovery is logged with a count: {log}"));
    assert!(
        (2..=50).contains(&failures),
        "{failures} failed accepts while starved for about 0.5 s; expected a backoff from 10 ms: {log}"
    );
}
