//! The core conformance suite, unchanged, against a real `redis-server` (started per test), on
//! real time with a multi-thread runtime.

mod support;

use std::time::Duration;

use support::RedisServer;
use tenure::conformance::Suite;

/// The suite's time scale. Every wait and bound is a multiple of it (each request's bound a
/// quarter): at one second a loaded machine (two cores, a busy loop each beside the tests)
/// missed the 250 ms bound of an acquire (#42); three leave room for it.
const TTL: Duration = Duration::from_secs(3);

async fn setup() -> (RedisServer, Suite) {
    let server = RedisServer::start();
    let suite = Suite::new(support::backend(&server).await).ttl(TTL);
    (server, suite)
}

tenure::conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    setup()
);

/// The whole suite on one server with coalescing off: one script call per lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_suite_without_coalescing() {
    use tenure::backend::redis::{RedisBackend, RedisConfig};
    let server = RedisServer::start();
    let config = RedisConfig::new(&server.url())
        .unwrap_or_else(|e| panic!("{e}"))
        .coalesce(false);
    let backend = RedisBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    Suite::new(backend).ttl(TTL).run_all().await;
}

/// Membership as the user the docs describe: the membership scripts' commands and the group's
/// channel are all within the documented ACL rules; without the sorted-set commands an
/// announcement is refused as a permission problem, not a hiccup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_works_with_exactly_the_documented_acl() {
    use futures::StreamExt;
    use tenure::backend::redis::{RedisBackend, RedisConfig};
    use tenure::backend::{Backend, BackendErrorKind, Member};
    const PW: &str = "members-Pw-5d21";
    let old_rules = support::DOCUMENTED_ACL_RULES
        .split(" +zadd")
        .next()
        .unwrap_or_default();
    let server = RedisServer::options()
        .acl_user(&support::documented_acl_user("tenure", PW))
        .acl_user(&format!("locksonly on >{PW} {old_rules}"))
        .start();
    let connect = async |user: &str| {
        let config = RedisConfig::new(&server.url_as(user, PW)).unwrap_or_else(|e| panic!("{e}"));
        RedisBackend::connect(config)
            .await
            .unwrap_or_else(|e| panic!("connect as {user}: {e}"))
    };
    let suite = Suite::new(connect("tenure").await).ttl(TTL);
    suite.check_membership().await;
    suite.check_group_record().await;
    // Hand-overs use only the documented commands too.
    suite.check_release_to_prefers_the_target().await;
    suite.check_handoff_request().await;
    let refused = connect("locksonly").await;
    let me = Member {
        identity: "pod-a".into(),
        shards: 4,
        joined_ms: 1,
        holds: vec![],
    };
    let e = refused
        .announce_member("acl-group", &me, TTL)
        .await
        .expect_err("no sorted-set commands");
    assert_eq!(e.kind(), BackendErrorKind::PermissionDenied, "{e}");
    let mut sets = refused.members("acl-group");
    let first = tokio::time::timeout(TTL * 5, sets.next()).await;
    assert!(
        matches!(&first, Ok(Some(Err(e))) if e.kind() == BackendErrorKind::PermissionDenied),
        "{first:?}"
    );
}

/// A member record another process planted — 5 MiB, more than one read may carry — is skipped
/// with a warning: the group's other members are still read (it failed every read before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_member_record_is_skipped_and_the_group_still_read() {
    use futures::StreamExt;
    use tenure::backend::{Backend, Member};
    let server = RedisServer::start();
    let backend = support::backend(&server).await;
    let me = Member {
        identity: "pod-a".into(),
        shards: 4,
        joined_ms: 1,
        holds: vec![],
    };
    backend
        .announce_member("g", &me, Duration::from_secs(30))
        .await
        .expect("announce");
    // The admin's blocking connection: it has no response timeout, which a 5 MiB write on a
    // loaded machine can outlast (the async connection's default failed it in CI's load).
    let mut admin = server.admin();
    let huge = format!("m1:4:1:{}", "9".repeat(5 << 20));
    let expires = 4_000_000_000_000u64;
    let _: () = redis::pipe()
        .zadd("tenure:{g}:members", "ghost", expires)
        .hset("tenure:{g}:member-records", "ghost", &huge)
        .zadd("tenure:{g}:members", "x".repeat(10_000), expires)
        .hset("tenure:{g}:member-records", "x".repeat(10_000), "m1:4:1:")
        .query(&mut admin)
        .unwrap_or_else(|e| panic!("plant: {e}"));
    let mut members = backend.members("g");
    let first = tokio::time::timeout(Duration::from_secs(10), members.next())
        .await
        .expect("a read in time")
        .expect("a read");
    let list = first.expect("the read does not fail on the planted records");
    let ids: Vec<&str> = list.iter().map(|m| m.identity.as_str()).collect();
    assert_eq!(ids, ["pod-a"], "the planted records are skipped");
}

/// A group record key holding what tenure never writes (a 5 MiB string, a hash) reads as
/// damaged, quickly and without an error, and a first record is never written over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_group_record_is_damaged_not_an_error() {
    use tenure::backend::{Backend, GroupRead, GroupRecord};
    let server = RedisServer::start();
    let backend = support::backend(&server).await;
    let mut admin = server.admin();
    let big = "g".repeat(5 << 20);
    let plants: [(&str, Vec<&str>); 2] = [
        ("SET", vec!["tenure:{big}:group-record", &big]),
        ("HSET", vec!["tenure:{hash}:group-record", "f", "v"]),
    ];
    for (cmd, args) in plants {
        let _: () = redis::cmd(cmd).arg(&args).query(&mut admin).expect("plant");
        let group = if cmd == "SET" { "big" } else { "hash" };
        let read = tokio::time::timeout(Duration::from_secs(2), backend.group_record(group))
            .await
            .expect("a bounded read")
            .expect("a damaged record is no error");
        assert!(
            matches!(read, GroupRead::Damaged { .. }),
            "{group}: {read:?}"
        );
        assert!(
            !backend
                .swap_group_record(group, None, &GroupRecord::first(4))
                .await
                .expect("no error"),
            "{group}: a first record is never written over what is there"
        );
    }
}
