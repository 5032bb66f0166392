//! Faults against a real `redis-server`: a restart without persistence, FLUSHALL, CLIENT PAUSE
//! longer than the ttl, and a holder process frozen with SIGSTOP past its ttl writing to a
//! fenced register.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use support::RedisServer;
use tenure::backend::redis::{RedisBackend, RedisConfig};
use tenure::backend::{Backend, FencingToken};
use tenure::{LeaseEnd, LockOptions, Locker, LostReason};
use tokio::time::Instant;

fn locker(backend: &RedisBackend, identity: &str) -> Locker {
    Locker::with_identity(backend.clone(), identity).unwrap_or_else(|e| panic!("{e}"))
}

/// Acquires and releases `name` a few times; returns the highest token issued.
async fn churn(locker: &Locker, name: &str) -> FencingToken {
    let mut highest = FencingToken::new(0);
    for _ in 0..5 {
        let lease = locker
            .try_acquire(name, &LockOptions::new().ttl(Duration::from_secs(5)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        highest = highest.max(lease.fencing_token());
        lease.release().await.unwrap_or_else(|e| panic!("{e}"));
    }
    highest
}

/// Auto-renewed, ttl 3 s: renewals every second.
fn renewed_opts() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(3))
        .auto_renew(true)
        .retry_interval(Duration::from_millis(50))
}
const RENEW_INTERVAL: Duration = Duration::from_secs(1);

/// Lost data ends the lease at its next renewal, with NotHeld, and tokens keep rising.
async fn wipe_ends_the_lease_and_tokens_keep_rising(
    wipe: impl FnOnce(&mut RedisServer),
    server: &mut RedisServer,
) {
    let backend = support::backend(server).await;
    let holder = locker(&backend, "holder");
    let mut highest = churn(&holder, "wiped").await;
    let lease = holder
        .try_acquire("wiped", &renewed_opts())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    highest = highest.max(lease.fencing_token());
    // Let one renewal succeed first.
    tokio::time::sleep(RENEW_INTERVAL + Duration::from_millis(200)).await;
    assert!(lease.end().is_none(), "{:?}", lease.end());
    tokio::task::block_in_place(|| wipe(server));
    let wiped_at = Instant::now();
    let end = tokio::time::timeout(RENEW_INTERVAL + Duration::from_millis(500), lease.lost())
        .await
        .unwrap_or_else(|_| {
            panic!("the lease did not notice the lost data within one renew interval")
        });
    assert!(
        matches!(end, LeaseEnd::Lost(LostReason::NotHeld)),
        "ended with {end:?} after {:?}",
        wiped_at.elapsed()
    );
    let next = locker(&backend, "next")
        .try_acquire("wiped", &LockOptions::new().ttl(Duration::from_secs(5)))
        .await
        .unwrap_or_else(|e| panic!("the wiped lock must be free: {e}"));
    assert!(
        next.fencing_token() > highest,
        "token {} after a wipe must exceed every earlier token ({highest})",
        next.fencing_token()
    );
    next.release().await.unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_ends_the_lease_and_tokens_keep_rising() {
    let mut server = RedisServer::start();
    wipe_ends_the_lease_and_tokens_keep_rising(RedisServer::restart, &mut server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_while_held_ends_the_lease_and_tokens_keep_rising() {
    let mut server = RedisServer::start();
    wipe_ends_the_lease_and_tokens_keep_rising(
        |s| {
            s.cmd(&["FLUSHALL"]);
        },
        &mut server,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_longer_than_the_ttl_never_makes_two_believers() {
    const PAUSE: Duration = Duration::from_millis(2500);
    let server = RedisServer::start();
    // Two processes' worth: separate connections.
    let a_backend = support::backend(&server).await;
    let b_backend = support::backend(&server).await;
    let ttl = Duration::from_secs(1);
    let opts = LockOptions::new()
        .ttl(ttl)
        .auto_renew(true)
        .request_timeout(Duration::from_millis(200))
        .retry_interval(Duration::from_millis(50));
    let a = locker(&a_backend, "a")
        .try_acquire("paused", &opts)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let a = Arc::new(a);
    let a_lost = {
        let a = a.clone();
        tokio::spawn(async move {
            let end = a.lost().await;
            (end, Instant::now())
        })
    };
    let b_task = {
        let b = locker(&b_backend, "b");
        let opts = opts.clone().wait(Duration::from_secs(10));
        let a = a.clone();
        tokio::spawn(async move {
            let lease = b.acquire("paused", &opts).await;
            let at = Instant::now();
            // The instant B believes, A must not.
            (lease, at, a.is_valid(), a.valid_until())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let paused_at = Instant::now();
    server.cmd(&["CLIENT", "PAUSE", &PAUSE.as_millis().to_string(), "WRITE"]);
    let (end, lost_at) = a_lost.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        matches!(end, LeaseEnd::Lost(LostReason::RenewDeadline)),
        "A ended with {end:?}"
    );
    // A gives up on its own renew deadline (within the ttl), not when the store answers again:
    // its loss is seen while the store is still paused. Seen by this task, which a loaded
    // machine schedules late (1.08 s after the pause once), so judged against the pause.
    assert!(
        lost_at < paused_at + PAUSE,
        "A must give up while the store is paused, by its renew deadline ({:?} after the pause)",
        lost_at - paused_at
    );
    let (b_lease, b_at, a_valid_then, a_valid_until) =
        b_task.await.unwrap_or_else(|e| panic!("{e}"));
    let b_lease = b_lease.unwrap_or_else(|e| panic!("B never acquired: {e}"));
    assert!(
        !a_valid_then,
        "A still believed it held the lock when B got it"
    );
    assert!(
        lost_at <= b_at,
        "A lost at {lost_at:?}, B acquired at {b_at:?}"
    );
    assert!(a_valid_until <= b_at);
    assert!(
        b_at >= paused_at + Duration::from_millis(2400),
        "B cannot win during the pause"
    );
    assert!(b_lease.fencing_token() > a.fencing_token());
    b_lease.release().await.unwrap_or_else(|e| panic!("{e}"));
}

/// A fenced register: accepts a write only with a token at least as high as any it has seen.
const REGISTER: &str = r"
local seen = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
if tonumber(ARGV[1]) < seen then
  redis.call('RPUSH', KEYS[2], 'rejected:' .. ARGV[2] .. ':' .. ARGV[1])
  return 0
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'writer', ARGV[2])
redis.call('RPUSH', KEYS[2], 'accepted:' .. ARGV[2] .. ':' .. ARGV[1])
return 1
";

async fn write_register(
    conn: &mut redis::aio::MultiplexedConnection,
    token: FencingToken,
    writer: &str,
) -> bool {
    let accepted: i64 = redis::Script::new(REGISTER)
        .key("register")
        .key("register:log")
        .arg(token.get().to_string())
        .arg(writer)
        .invoke_async(conn)
        .await
        .unwrap_or_else(|e| panic!("register write failed: {e}"));
    accepted == 1
}

const CHILD_ENV: &str = "TENURE_FENCED_CHILD_URL";

/// The register's connection: no response timeout (redis-rs defaults to 500 ms, which a
/// loaded test machine can outlast, failing a write that would have been judged).
fn register_connection() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new().set_response_timeout(None)
}

/// The child's side: hold the lock, write when told to (without checking the lease, as a
/// process that checked just before it froze would), report on stdout.
async fn child(url: String) {
    let backend = RedisBackend::connect(RedisConfig::new(&url).unwrap_or_else(|e| panic!("{e}")))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = redis::Client::open(url.as_str()).unwrap_or_else(|e| panic!("{e}"));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&register_connection())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let lease = locker(&backend, "frozen-child")
        .try_acquire(
            "fenced",
            &LockOptions::new()
                .ttl(Duration::from_secs(1))
                .auto_renew(true),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let token = lease.fencing_token();
    let first = write_register(&mut conn, token, "child").await;
    println!("CHILD acquired {token} first-write={first}");
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
    while let Ok(Some(line)) = lines.next_line().await {
        match line.trim() {
            "write" => {
                let ok = write_register(&mut conn, token, "child").await;
                println!("CHILD write {}", if ok { "accepted" } else { "rejected" });
            }
            "exit" => {
                let released = lease.release().await;
                println!(
                    "CHILD exit release={}",
                    if released.is_ok() { "ok" } else { "refused" }
                );
                return;
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_holder_process_is_fenced_and_never_deletes_the_successor() {
    if let Ok(url) = std::env::var(CHILD_ENV) {
        // This test binary, re-run as the holder process by the test below.
        child(url).await;
        return;
    }
    let server = RedisServer::start();
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let mut proc = Command::new(exe)
        .args([
            "--exact",
            "frozen_holder_process_is_fenced_and_never_deletes_the_successor",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, server.url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn the holder process: {e}"));
    let pid = proc.id();
    let mut stdin = proc.stdin.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = proc.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest may print "test <name> ... " on the same line first.
            if let Some(at) = line.find("CHILD ") {
                let _ = tx.send(line[at + "CHILD ".len()..].to_owned());
            }
        }
    });
    let recv = |what: &str| {
        rx.recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the holder process did not report {what}"))
    };
    let acquired = recv("its grant");
    let child_token: u64 = acquired
        .strip_prefix("acquired ")
        .and_then(|r| r.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("unexpected report {acquired:?}"));
    assert!(acquired.ends_with("first-write=true"), "{acquired}");

    support::signal(pid, "STOP");
    let backend = support::backend(&server).await;
    let me = locker(&backend, "successor");
    let lease = me
        .acquire(
            "fenced",
            &LockOptions::new()
                .ttl(Duration::from_secs(5))
                .auto_renew(true)
                .wait(Duration::from_secs(10)),
        )
        .await
        .unwrap_or_else(|e| panic!("the frozen holder's lease never expired: {e}"));
    assert!(lease.fencing_token().get() > child_token);
    let client = redis::Client::open(server.url().as_str()).unwrap_or_else(|e| panic!("{e}"));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&register_connection())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(write_register(&mut conn, lease.fencing_token(), "successor").await);

    support::signal(pid, "CONT");
    writeln!(stdin, "write").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        recv("its late write"),
        "write rejected",
        "the stale write must be refused"
    );
    writeln!(stdin, "exit").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        recv("its exit"),
        "exit release=refused",
        "the woken holder's release must find the lock no longer its own"
    );
    let status = proc.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "holder process failed: {status}");

    let record = backend
        .inspect("fenced")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("the successor still holds the lock");
    assert_eq!(record.identity, "successor");
    assert_eq!(record.fencing, lease.fencing_token());
    lease.refresh().await.unwrap_or_else(|e| panic!("{e}"));
    let log: Vec<String> = redis::AsyncCommands::lrange(&mut conn, "register:log", 0, -1)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        log,
        vec![
            format!("accepted:child:{child_token}"),
            format!("accepted:successor:{}", lease.fencing_token()),
            format!("rejected:child:{child_token}"),
        ]
    );
    lease.release().await.unwrap_or_else(|e| panic!("{e}"));
}
