//! The probe endpoint's connection cap follows the process's open-file limit: with
//! `RLIMIT_NOFILE` lowered to 256 it holds at most 16 connections (a sixteenth), not its
//! configured 64, so idle clients cannot take the descriptors the rest of the process needs.
//! A test binary of its own, with a single test, because it lowers the limit for the whole
//! process.

#[path = "support/open_files.rs"]
mod open_files;

use std::time::Duration;

use open_files::limit_open_files;
use tenure::Locker;
use tenure::backend::memory::MemoryBackend;
use tenure::election::{ElectionConfig, LeaderElector};
use tenure::probe::ProbeServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Whether the server closes `stream` (end of stream, no answer) within 10 s.
async fn closed_by_server(stream: &mut tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn the_cap_is_a_sixteenth_of_the_open_file_limit() {
    const OPEN_FILES: usize = 256;
    const CAP: usize = OPEN_FILES / 16;
    limit_open_files(OPEN_FILES as libc::rlim_t);
    let locker = Locker::with_identity(MemoryBackend::new(), "me").expect("valid identity");
    let elector = LeaderElector::new(locker, "probe", ElectionConfig::new()).expect("valid");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("bound address");
    // Only the cap may close a connection here: no timeout would within the test.
    tokio::spawn(
        ProbeServer::new(elector)
            .max_connections(64)
            .header_timeout(Duration::from_secs(3600))
            .idle_timeout(Duration::from_secs(3600))
            .serve(listener),
    );

    let mut idle = Vec::new();
    for _ in 0..3 * CAP {
        idle.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    for (i, stream) in idle.iter_mut().take(2 * CAP).enumerate() {
        assert!(
            closed_by_server(stream).await,
            "connection {i} of {} stayed open: the cap is above {CAP}",
            3 * CAP
        );
    }
    // A probe is answered beside a full cap of idle clients.
    let mut probe = tokio::net::TcpStream::connect(addr).await.expect("connect");
    probe
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: probe\r\nconnection: close\r\n\r\n")
        .await
        .expect("send");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), probe.read_to_string(&mut answer))
        .await
        .expect("answered")
        .expect("read");
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
}
