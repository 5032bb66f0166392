//! The Redis backend's own behaviour against a real `redis-server`: replays, key layout, the
//! scripts' guarantees, round trips per operation, batching, and the shared subscriber.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use support::{RedisServer, granted, req};
use tenure::backend::redis::{RedisBackend, RedisConfig};
use tenure::backend::{
    Acquired, Backend, BackendErrorKind, FencingToken, HolderToken, Released, RenewRequest, Renewed,
};

fn int(v: &redis::Value) -> i64 {
    match v {
        redis::Value::Int(i) => *i,
        other => panic!("expected an integer, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_acquire_returns_the_original_token_and_restarts_the_ttl() {
    let server = RedisServer::start();
    let b = support::backend(&server).await;
    let r = req("replay-acquire", "me", Duration::from_secs(2));
    let first = granted(&b, &r).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = int(&server.cmd(&["PTTL", "tenure:{replay-acquire}"]));
    assert!(before <= 1400, "pttl {before}");
    assert_eq!(
        granted(&b, &r).await,
        first,
        "a replay returns the original token"
    );
    let after = int(&server.cmd(&["PTTL", "tenure:{replay-acquire}"]));
    assert!(
        after > 1800,
        "the replay must restart the ttl, pttl {after}"
    );
    // The counter did not move: the next holder gets the very next token.
    assert_eq!(
        b.release(&r.name, &r.holder).await.ok(),
        Some(Released::Released)
    );
    let next = granted(&b, &req("replay-acquire", "next", Duration::from_secs(2))).await;
    assert_eq!(next.get(), first.get() + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_release_reports_success_and_spares_the_successor() {
    let server = RedisServer::start();
    let b = support::backend(&server).await;
    let a = req("replay-release", "a", Duration::from_secs(5));
    granted(&b, &a).await;
    let intruder = HolderToken::random();
    assert_eq!(
        b.release(&a.name, &intruder).await.ok(),
        Some(Released::NotHeld)
    );
    assert_eq!(
        b.release(&a.name, &a.holder).await.ok(),
        Some(Released::Released)
    );
    assert_eq!(
        b.release(&a.name, &a.holder).await.ok(),
        Some(Released::Released),
        "a release sent twice reports success both times"
    );
    let s = req("replay-release", "successor", Duration::from_secs(5));
    granted(&b, &s).await;
    assert_eq!(
        b.release(&a.name, &a.holder).await.ok(),
        Some(Released::Released),
        "the ack outlives a successor's grant"
    );
    let record = b.inspect(&s.name).await.ok().flatten();
    assert_eq!(record.map(|r| r.identity).as_deref(), Some("successor"));
    assert_eq!(
        b.renew(&s.name, &s.holder, s.ttl).await.ok(),
        Some(Renewed::Held)
    );
    // Acks expire: a release is remembered for what remained of the lease or the ack ttl,
    // whichever is longer; a later replay is answered NotHeld (conservative).
    let url = server.url();
    let with_ack_ttl = |ttl: Duration| {
        let config = RedisConfig::new(&url)
            .unwrap_or_else(|e| panic!("{e}"))
            .release_ack_ttl(ttl);
        async move {
            RedisBackend::connect(config)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        }
    };
    let short = with_ack_ttl(Duration::from_millis(100)).await;
    let c = req("short-ack", "c", Duration::from_millis(400));
    granted(&short, &c).await;
    assert_eq!(
        short.release(&c.name, &c.holder).await.ok(),
        Some(Released::Released)
    );
    let tombstone_ttl = int(&server.cmd(&["PTTL", "tenure:{short-ack}"]));
    assert!(
        (100..=400).contains(&tombstone_ttl),
        "the tombstone keeps the lease's remaining ttl ({tombstone_ttl} ms)"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        short.release(&c.name, &c.holder).await.ok(),
        Some(Released::NotHeld)
    );
    // A release close to the lease's end still leaves the ack for the ack ttl.
    let long = with_ack_ttl(Duration::from_secs(5)).await;
    let d = req("late-release", "d", Duration::from_millis(600));
    granted(&long, &d).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        long.release(&d.name, &d.holder).await.ok(),
        Some(Released::Released)
    );
    let tombstone_ttl = int(&server.cmd(&["PTTL", "tenure:{late-release}"]));
    assert!(
        tombstone_ttl > 4000,
        "raised to the ack ttl ({tombstone_ttl} ms)"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        long.release(&d.name, &d.holder).await.ok(),
        Some(Released::Released),
        "a replay after the lease would have expired still finds the ack"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_never_recreates_a_missing_key() {
    let server = RedisServer::start();
    let b = support::backend(&server).await;
    let r = req("no-resurrection", "me", Duration::from_secs(5));
    granted(&b, &r).await;
    assert_eq!(int(&server.cmd(&["DEL", "tenure:{no-resurrection}"])), 1);
    assert_eq!(
        b.renew(&r.name, &r.holder, r.ttl).await.ok(),
        Some(Renewed::NotHeld)
    );
    assert_eq!(int(&server.cmd(&["EXISTS", "tenure:{no-resurrection}"])), 0);
    // Someone else's key is not extended either.
    let other = req("no-resurrection", "other", Duration::from_millis(1500));
    granted(&b, &other).await;
    assert_eq!(
        b.renew(&r.name, &r.holder, Duration::from_secs(60))
            .await
            .ok(),
        Some(Renewed::NotHeld)
    );
    assert!(int(&server.cmd(&["PTTL", "tenure:{no-resurrection}"])) <= 1500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_layout_and_fencing_counter_seeded_from_server_time() {
    let server = RedisServer::start();
    let b = support::backend(&server).await;
    let r = req("layout", "pod-7", Duration::from_secs(5));
    let token = granted(&b, &r).await;
    let now_us = match server.cmd(&["TIME"]) {
        redis::Value::Array(parts) => {
            let n = |v: &redis::Value| match v {
                redis::Value::BulkString(b) => {
                    String::from_utf8_lossy(b).parse::<u64>().unwrap_or(0)
                }
                _ => 0,
            };
            n(&parts[0]) * 1_000_000 + n(&parts[1])
        }
        other => panic!("TIME answered {other:?}"),
    };
    assert!(
        token.get() <= now_us && token.get() + 10_000_000 > now_us,
        "the first token {token} is the server's TIME in µs (now {now_us})"
    );
    assert_eq!(b.lock_key("layout"), "tenure:{layout}");
    let value = server.cmd(&["GET", "tenure:{layout}"]);
    let value = match value {
        redis::Value::BulkString(v) => String::from_utf8_lossy(&v).into_owned(),
        other => panic!("lock key holds {other:?}"),
    };
    // '+' held, holder token, '0' nobody watches, no previous release, token, identity.
    assert_eq!(
        value,
        format!("+{}0{}{token}:pod-7", r.holder.to_hex(), "-".repeat(32))
    );
    let counter = server.cmd(&["GET", "tenure:{layout}:fence"]);
    assert_eq!(
        counter,
        redis::Value::BulkString(token.to_string().into_bytes())
    );
    assert_eq!(
        int(&server.cmd(&["PTTL", "tenure:{layout}:fence"])),
        -1,
        "the counter never expires"
    );
    let record = b.inspect("layout").await.ok().flatten().expect("held");
    assert_eq!(record.identity, "pod-7");
    assert_eq!(record.fencing, token);
    assert!(
        record
            .remaining
            .is_some_and(|r| r <= Duration::from_secs(5))
    );
    assert!(b.inspect("never-used").await.ok().flatten().is_none());
    // A custom prefix moves every key.
    let custom = RedisBackend::connect(
        RedisConfig::new(&server.url())
            .unwrap_or_else(|e| panic!("{e}"))
            .key_prefix("app:locks:"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    granted(&custom, &req("layout", "x", Duration::from_secs(5))).await;
    assert_eq!(
        int(&server.cmd(&["EXISTS", "app:locks:{layout}", "app:locks:{layout}:fence"])),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_break_the_key_layout_are_rejected() {
    let server = RedisServer::start();
    let b = support::backend(&server).await;
    for bad in ["", "a{b", "a}b", "tab\there", &"x".repeat(257)] {
        let err = b.validate_name(bad).expect_err(bad);
        assert!(!err.rule.is_empty());
        assert_eq!(
            b.try_acquire(&req(bad, "me", Duration::from_secs(1)))
                .await
                .err()
                .map(|e| e.kind()),
            Some(BackendErrorKind::Config)
        );
    }
    assert!(b.validate_name("ok name/with:colons.é").is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_is_one_round_trip() {
    let server = RedisServer::start();
    let b = support::backend(&server).await;
    let r = req("round-trips", "me", Duration::from_secs(5));
    let busy = req("round-trips", "other", Duration::from_secs(5));
    server.cmd(&["CONFIG", "RESETSTAT"]);
    let stats = b.stats();
    let mut expected_evalsha = 0;
    for (what, op) in [
        ("acquire", 0),
        ("acquire (busy)", 1),
        ("acquire (replay)", 0),
        ("renew", 2),
        ("release", 3),
        ("release (replay)", 3),
    ] {
        let before = server.top_level_calls();
        match op {
            0 => drop(granted(&b, &r).await),
            1 => assert!(matches!(
                b.try_acquire(&busy).await,
                Ok(Acquired::Busy { .. })
            )),
            2 => assert_eq!(
                b.renew(&r.name, &r.holder, r.ttl).await.ok(),
                Some(Renewed::Held)
            ),
            _ => assert_eq!(
                b.release(&r.name, &r.holder).await.ok(),
                Some(Released::Released)
            ),
        }
        let after = server.top_level_calls();
        expected_evalsha += 1;
        let mut sent: BTreeMap<String, u64> = after.clone();
        for (cmd, n) in &before {
            *sent.entry(cmd.clone()).or_default() -= n;
        }
        sent.retain(|_, n| *n > 0);
        assert_eq!(
            sent,
            BTreeMap::from([("evalsha".to_owned(), 1)]),
            "{what}: exactly one EVALSHA and nothing else"
        );
    }
    assert_eq!(server.command_calls("evalsha"), expected_evalsha);
    assert_eq!(b.stats().round_trips - stats.round_trips, expected_evalsha);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_the_server_forgets_them() {
    let server = RedisServer::start();
    let b = support::backend(&server).await;
    let r = req("noscript", "me", Duration::from_secs(5));
    granted(&b, &r).await;
    server.cmd(&["SCRIPT", "FLUSH"]);
    assert_eq!(
        b.renew(&r.name, &r.holder, r.ttl).await.ok(),
        Some(Renewed::Held)
    );
    assert_eq!(b.stats().script_reloads, 1);
    // A batch of several calls reloads once and retries them together.
    server.cmd(&["SCRIPT", "FLUSH"]);
    let batch: Vec<RenewRequest> = (0..3)
        .map(|_| RenewRequest {
            name: r.name.clone(),
            holder: r.holder,
            ttl: r.ttl,
        })
        .collect();
    let small = RedisBackend::connect(
        RedisConfig::new(&server.url())
            .unwrap_or_else(|e| panic!("{e}"))
            .max_batch(1),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    server.cmd(&["SCRIPT", "FLUSH"]);
    let answers = small.renew_many(&batch).await;
    assert!(
        answers.iter().all(|a| matches!(a, Ok(Renewed::Held))),
        "{answers:?}"
    );
    assert_eq!(small.stats().script_reloads, 1);
    assert_eq!(
        b.release(&r.name, &r.holder).await.ok(),
        Some(Released::Released)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_many_is_one_round_trip() {
    let server = RedisServer::start();
    let b = support::backend(&server).await;
    let mut batch = Vec::new();
    for i in 0..1000 {
        let r = req(&format!("many-{i}"), "me", Duration::from_secs(30));
        granted(&b, &r).await;
        batch.push(RenewRequest {
            name: r.name.clone(),
            holder: r.holder,
            ttl: r.ttl,
        });
    }
    // One lease was lost meanwhile, one key is not even a string.
    server.cmd(&["DEL", "tenure:{many-3}"]);
    server.cmd(&["DEL", "tenure:{many-4}"]);
    server.cmd(&["HSET", "tenure:{many-4}", "f", "v"]);
    let before = b.stats();
    let evalsha = server.command_calls("evalsha");
    let answers = b.renew_many(&batch).await;
    assert_eq!(answers.len(), 1000);
    for (i, a) in answers.iter().enumerate() {
        match i {
            3 => assert!(matches!(a, Ok(Renewed::NotHeld)), "{a:?}"),
            4 => assert_eq!(
                a.as_ref().err().map(|e| e.kind()),
                Some(BackendErrorKind::Protocol)
            ),
            _ => assert!(matches!(a, Ok(Renewed::Held)), "{i}: {a:?}"),
        }
    }
    assert_eq!(
        b.stats().round_trips - before.round_trips,
        1,
        "one round trip"
    );
    assert_eq!(
        server.command_calls("evalsha") - evalsha,
        4,
        "1000 renewals in script calls of at most 256"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_are_coalesced_into_shared_script_calls() {
    let server = RedisServer::start();
    let b = Arc::new(support::backend(&server).await);
    let before = b.stats();
    let mut tasks = Vec::new();
    for t in 0..64 {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            let mut last = None::<FencingToken>;
            for _ in 0..20 {
                let r = req(&format!("co-{t}"), "me", Duration::from_secs(5));
                let token = granted(&b, &r).await;
                assert!(last.is_none_or(|l| token > l));
                last = Some(token);
                assert_eq!(
                    b.renew(&r.name, &r.holder, r.ttl).await.ok(),
                    Some(Renewed::Held)
                );
                assert_eq!(
                    b.release(&r.name, &r.holder).await.ok(),
                    Some(Released::Released)
                );
            }
        }));
    }
    for t in tasks {
        t.await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    }
    let s = b.stats();
    let ops = s.operations - before.operations;
    let calls = s.script_calls - before.script_calls;
    assert_eq!(ops, 64 * 20 * 3);
    assert!(
        calls * 2 < ops,
        "{ops} operations should share far fewer script calls, got {calls}"
    );
    // Coalescing off: one call per operation.
    let single = RedisBackend::connect(
        RedisConfig::new(&server.url())
            .unwrap_or_else(|e| panic!("{e}"))
            .coalesce(false),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let single = Arc::new(single);
    let mut tasks = Vec::new();
    for t in 0..16 {
        let b = single.clone();
        tasks.push(tokio::spawn(async move {
            let r = req(&format!("single-{t}"), "me", Duration::from_secs(5));
            granted(&b, &r).await;
            b.release(&r.name, &r.holder).await.ok()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.ok().flatten(), Some(Released::Released));
    }
    assert_eq!(single.stats().script_calls, single.stats().operations);
}

/// Two acquires of the same lock in one coalesced call behave like two calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contenders_in_one_batch_get_one_grant() {
    let server = RedisServer::start();
    let b = Arc::new(support::backend(&server).await);
    for round in 0..20 {
        let name = format!("contended-{round}");
        let mut tasks = Vec::new();
        for w in 0..16 {
            let (b, name) = (b.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                b.try_acquire(&req(&name, &format!("w{w}"), Duration::from_secs(5)))
                    .await
            }));
        }
        let mut grants = 0;
        for t in tasks {
            match t.await.ok() {
                Some(Ok(Acquired::Granted { .. })) => grants += 1,
                Some(Ok(Acquired::Busy { holder, .. })) => assert!(holder.is_some()),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(grants, 1, "round {round}");
    }
}

type Changes = futures::stream::BoxStream<
    'static,
    Result<tenure::backend::HolderChange, tenure::backend::BackendError>,
>;

async fn next(
    s: &mut Changes,
) -> Result<tenure::backend::HolderChange, tenure::backend::BackendError> {
    tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .unwrap_or_else(|_| panic!("no notification within 5 s"))
        .expect("the stream ended")
}

async fn expect_free(s: &mut Changes) {
    let change = next(s).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(change.is_free(), "{change:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_starts_with_the_state_and_reports_grants_and_releases_but_not_renewals() {
    let server = RedisServer::start();
    let b = support::backend(&server).await;
    let holder = req("observed", "first", Duration::from_secs(5));
    let t1 = granted(&b, &holder).await;
    let mut s = b.observe("observed");
    let first = next(&mut s).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        first.holder.as_deref(),
        Some("first"),
        "the first item is the current state"
    );
    assert_eq!(first.fencing, Some(t1));
    for _ in 0..3 {
        assert_eq!(
            b.renew(&holder.name, &holder.holder, holder.ttl).await.ok(),
            Some(Renewed::Held)
        );
    }
    assert_eq!(
        b.release(&holder.name, &holder.holder).await.ok(),
        Some(Released::Released)
    );
    let released = next(&mut s).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        released.is_free(),
        "renewals are not reported; the release is: {released:?}"
    );
    let second = req("observed", "second", Duration::from_secs(5));
    let t2 = granted(&b, &second).await;
    let grant = next(&mut s).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(grant.holder.as_deref(), Some("second"));
    assert_eq!(grant.fencing, Some(t2));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), s.next())
            .await
            .is_err(),
        "nothing else happened"
    );
    // A stream opened on a free lock starts with "free".
    let mut fresh = b.observe("never-held");
    expect_free(&mut fresh).await;
}

/// The watch mark: a lock nobody waits for or observes publishes nothing; a waiter told "busy"
/// or an observer marks it, and from then on releases and grants are published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_published_once_someone_watches() {
    let server = RedisServer::start();
    let b = support::backend(&server).await;
    let publishes = || server.command_calls("publish");
    let cycle = |who: &'static str| {
        let b = b.clone();
        async move {
            let r = req("watched", who, Duration::from_secs(5));
            let token = granted(&b, &r).await;
            assert_eq!(
                b.release(&r.name, &r.holder).await.ok(),
                Some(Released::Released)
            );
            token
        }
    };
    cycle("alone").await;
    let before = publishes();
    for _ in 0..5 {
        cycle("alone").await;
    }
    assert_eq!(publishes() - before, 0, "unwatched: nobody to tell");

    // A waiter told "busy" marks the lock: the holder's release and the next grant publish.
    let holder = req("watched", "holder", Duration::from_secs(5));
    granted(&b, &holder).await;
    assert!(matches!(
        b.try_acquire(&req("watched", "waiter", Duration::from_secs(5)))
            .await,
        Ok(Acquired::Busy { .. })
    ));
    let before = publishes();
    assert_eq!(
        b.release(&holder.name, &holder.holder).await.ok(),
        Some(Released::Released)
    );
    cycle("next").await;
    assert_eq!(publishes() - before, 3, "release, grant, release");

    // An observer of a lock that was never held hears the first grant (the key was missing, so
    // nobody could mark it), marks the lock, and then hears every later grant too.
    let mut s = b.observe("fresh");
    expect_free(&mut s).await;
    for who in ["one", "two", "three"] {
        let r = req("fresh", who, Duration::from_secs(5));
        let token = granted(&b, &r).await;
        let grant = next(&mut s).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (grant.holder.as_deref(), grant.fencing),
            (Some(who), Some(token))
        );
        assert_eq!(
            b.release(&r.name, &r.holder).await.ok(),
            Some(Released::Released)
        );
        expect_free(&mut s).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_share_one_subscriber_connection() {
    let server = RedisServer::start();
    let b = support::backend(&server).await;
    let mut streams = Vec::new();
    for i in 0..60 {
        let mut s = b.observe(&format!("shared-{}", i % 10));
        // Wait for the first item: the subscription is confirmed by then.
        let first = tokio::time::timeout(Duration::from_secs(5), s.next()).await;
        assert!(matches!(first, Ok(Some(Ok(_)))), "{first:?}");
        streams.push(s);
    }
    let stats = b.stats();
    assert_eq!((stats.subscribed_channels, stats.observers), (10, 60));
    let clients = match server.cmd(&["CLIENT", "LIST"]) {
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("CLIENT LIST answered {other:?}"),
    };
    let subscribers = clients
        .lines()
        .filter(|l| l.split(' ').any(|f| f.starts_with("sub=") && f != "sub=0"))
        .count();
    assert_eq!(
        subscribers, 1,
        "one subscriber connection for 60 observers:\n{clients}"
    );
    let channels = match server.cmd(&["PUBSUB", "CHANNELS", "tenure:*"]) {
        redis::Value::Array(c) => c.len(),
        other => panic!("{other:?}"),
    };
    assert_eq!(channels, 10);
    // Every observer of a lock hears its release.
    let r = req("shared-3", "h", Duration::from_secs(5));
    granted(&b, &r).await;
    b.release(&r.name, &r.holder).await.ok();
    for (i, s) in streams.iter_mut().enumerate().filter(|(i, _)| i % 10 == 3) {
        let mut saw_free = false;
        while let Ok(Some(Ok(change))) =
            tokio::time::timeout(Duration::from_secs(2), s.next()).await
        {
            if change.is_free() {
                saw_free = true;
                break;
            }
        }
        assert!(saw_free, "observer {i} missed the release");
    }
    drop(streams);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let left = match server.cmd(&["PUBSUB", "CHANNELS", "tenure:*"]) {
            redis::Value::Array(c) => c.len(),
            other => panic!("{other:?}"),
        };
        if left == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{left} channels still subscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(b.stats().observers, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_transient_error() {
    let mut server = RedisServer::start();
    let b = support::backend(&server).await;
    server.stop();
    let err = b
        .try_acquire(&req("down", "me", Duration::from_secs(1)))
        .await
        .expect_err("the server is down");
    assert!(err.is_transient(), "{err}");
    let port = server.port();
    drop(server);
    let err = RedisBackend::connect(
        RedisConfig::new(&format!("redis://127.0.0.1:{port}/"))
            .unwrap_or_else(|e| panic!("{e}"))
            .connect_timeout(Duration::from_millis(300)),
    )
    .await
    .expect_err("nobody listens");
    assert!(err.is_transient(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_does_not_answer_in_time_is_a_timeout() {
    let server = RedisServer::start();
    let b = RedisBackend::connect(
        RedisConfig::new(&server.url())
            .unwrap_or_else(|e| panic!("{e}"))
            .request_timeout(Duration::from_millis(200)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let r = req("paused", "me", Duration::from_secs(5));
    granted(&b, &r).await;
    server.cmd(&["CLIENT", "PAUSE", "1500", "ALL"]);
    let started = tokio::time::Instant::now();
    let err = b
        .renew(&r.name, &r.holder, r.ttl)
        .await
        .expect_err("a paused server does not answer");
    assert_eq!(err.kind(), BackendErrorKind::Timeout, "{err}");
    assert!(err.is_transient());
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "bounded by the request timeout"
    );
    // Once the server answers again, so does the backend (the connection recovers by itself).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match b.renew(&r.name, &r.holder, r.ttl).await {
            Ok(Renewed::Held) => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "the backend did not recover: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Values under a lock key that are not tenure's, however close they come to its layout (see
/// acquire.lua): `holder` is the token of the test's own requests, so that a script that only
/// compared the token would take, extend or release the value.
fn foreign_values(holder: &str) -> Vec<(&'static str, Vec<u8>)> {
    let none = "-".repeat(32);
    let mut binary = b"~\x00\xff\r\n".to_vec();
    binary.extend((0..=255u8).rev());
    vec![
        ("a bare tombstone marker", b"~".to_vec()),
        ("a marker and garbage", b"~garbage".to_vec()),
        (
            "a token one digit short",
            format!("+{}", &holder[..31]).into_bytes(),
        ),
        (
            "a non-hex token",
            format!("~z{}0{none}12:pod", &holder[1..]).into_bytes(),
        ),
        (
            "an uppercase token",
            format!("~{}0{none}12:pod", holder.to_uppercase()).into_bytes(),
        ),
        (
            "a wrong watch mark",
            format!("+{holder}x{none}12:pod").into_bytes(),
        ),
        (
            "a wrong separator",
            format!("~{holder}0{none}12;pod").into_bytes(),
        ),
        (
            "a mixed previous token",
            format!("~{holder}0{}-12:pod", &holder[..31]).into_bytes(),
        ),
        (
            "a fencing token that is not a number",
            format!("+{holder}0{none}1x:pod").into_bytes(),
        ),
        ("binary data", binary),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_are_never_taken_changed_or_reported_as_tenures() {
    let server = RedisServer::start();
    let b = support::backend(&server).await;
    let mut admin = server.admin();
    let holder = HolderToken::random();
    for (i, (what, value)) in foreign_values(&holder.to_hex()).into_iter().enumerate() {
        let name = format!("foreign-{i}");
        let key = b.lock_key(&name);
        // One of them never expires.
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(&value);
        if i != 0 {
            set.arg("PX").arg(60_000);
        }
        set.query::<()>(&mut admin)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let unchanged = |admin: &mut redis::Connection, step: &str| {
            let now: Vec<u8> = redis::cmd("GET")
                .arg(&key)
                .query(admin)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(now, value, "{what}: {step} changed the value");
            let pttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query(admin)
                .unwrap_or_else(|e| panic!("{e}"));
            if i == 0 {
                assert_eq!(pttl, -1, "{what}: {step} set a ttl");
            } else {
                assert!(
                    (50_000..=60_000).contains(&pttl),
                    "{what}: {step}: pttl {pttl}"
                );
            }
        };
        let r = tenure::backend::AcquireRequest {
            name: name.as_str().into(),
            holder,
            identity: "me".into(),
            ttl: Duration::from_secs(600),
        };
        match b.try_acquire(&r).await {
            Ok(Acquired::Busy { holder, remaining }) => {
                assert_eq!(holder, None, "{what}: a foreign value names nobody");
                assert_eq!(remaining.is_none(), i == 0, "{what}: {remaining:?}");
            }
            other => panic!("{what}: a foreign value must be busy, got {other:?}"),
        }
        unchanged(&mut admin, "acquire");
        assert_eq!(
            b.renew(&name, &holder, r.ttl).await.ok(),
            Some(Renewed::NotHeld),
            "{what}"
        );
        unchanged(&mut admin, "renew");
        assert_eq!(
            b.release(&name, &holder).await.ok(),
            Some(Released::NotHeld),
            "{what}"
        );
        unchanged(&mut admin, "release");
        let err = b.inspect(&name).await.expect_err(what);
        assert_eq!(err.kind(), BackendErrorKind::Protocol, "{what}: {err}");
        assert!(
            err.to_string().contains("not a tenure lock"),
            "{what}: {err}"
        );
        unchanged(&mut admin, "inspect");
        // An observer's first read marks tenure's values watched, never a foreign one.
        let first = tokio::time::timeout(Duration::from_secs(5), b.observe(&name).next())
            .await
            .unwrap_or_else(|_| panic!("{what}: observe did not answer"));
        assert!(matches!(first, Some(Err(_))), "{what}: {first:?}");
        unchanged(&mut admin, "observe");
        assert_eq!(
            int(&server.cmd(&["EXISTS", &format!("{key}:fence")])),
            0,
            "{what}: no token was issued"
        );
    }
}

/// On Redis, a plain election named like a sharded group's shard is refused once the group's
/// record exists: the name is checked against the store, not against this process's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_election_named_like_a_groups_shard_is_refused() {
    use tenure::backend::GroupRecord;
    use tenure::election::{ElectionConfig, ElectionError, LeaderElector};
    let server = RedisServer::start();
    let group_owner = support::backend(&server).await;
    assert!(
        group_owner
            .swap_group_record("jobs", None, &GroupRecord::first(3))
            .await
            .expect("redis answers")
    );
    let other = support::backend(&server).await;
    let locker = tenure::Locker::with_identity(other.clone(), "plain").expect("valid identity");
    let refused = LeaderElector::new(locker.clone(), "jobs-1", ElectionConfig::default())
        .expect("valid config")
        .run(|_| async {})
        .await;
    assert!(
        matches!(&refused, Err(ElectionError::ShardLease { group, shard: 1, .. }) if group == "jobs"),
        "{refused:?}"
    );
    assert_eq!(other.inspect("jobs-1").await.expect("redis answers"), None);
    let free = LeaderElector::new(locker, "jobs-one", ElectionConfig::default())
        .expect("valid config")
        .run(|term| async move { term.fencing_token() })
        .await;
    assert!(free.is_ok(), "{free:?}");
}
