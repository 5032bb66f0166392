//! The core conformance suite, unchanged, against the local backend: real files in a private
//! temporary directory per check, on real time with a multi-thread runtime.

#[path = "support/tempdir.rs"]
mod tempdir;

use std::time::Duration;

use tempdir::TempDir;
use tenure::backend::local::LocalBackend;
use tenure::conformance::Suite;

/// The suite's time scale. Every wait and bound is a multiple of it (each request's bound a
/// quarter), with room for disk syncs on grants: at one second the Redis suite missed a
/// 250 ms bound on a loaded machine (two cores, a busy loop each beside the tests, #42);
/// three leave room for it here too.
const TTL: Duration = Duration::from_secs(3);

async fn setup() -> (TempDir, Suite) {
    let dir = TempDir::reserve("local-conformance-check");
    let backend = LocalBackend::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    (dir, Suite::new(backend).ttl(TTL))
}

tenure::conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    setup()
);

/// The whole suite in one directory, one check after another, each finding the files the
/// earlier ones left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_suite_on_one_directory() {
    let dir = TempDir::reserve("local-conformance-whole");
    let backend = LocalBackend::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    Suite::new(backend).ttl(TTL).run_all().await;
}

/// Membership beyond the suite: another open of the directory (another process) sees an
/// announcement and a withdrawal at once through inotify, not at the next expiry; files that
/// are not member records (garbage, a symbolic link, a FIFO) are skipped, never an error of
/// the whole group; a group directory that is a symbolic link is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_across_opens_skips_foreign_files_and_refuses_links() {
    use futures::StreamExt;
    use tenure::backend::{Backend, BackendErrorKind, Member};
    let dir = TempDir::reserve("local-membership");
    let a = LocalBackend::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let b = LocalBackend::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let member = |identity: &str| Member {
        identity: identity.to_owned(),
        shards: 4,
        joined_ms: 1_700_000_000_000,
        holds: vec![0, 2],
    };
    let long = Duration::from_secs(60);
    let mut sets = b.members("web");
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(2), sets.next())
            .await
            .unwrap_or_else(|_| panic!("no set within 2 s (ttl {long:?})"))
            .unwrap_or_else(|| panic!("the stream ended"))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(next().await, Vec::new());
    a.announce_member("web", &member("pod-b"), long)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(next().await, vec![member("pod-b")]);
    // Renewals with the same record change nothing a reader sees.
    a.announce_member("web", &member("pod-b"), long)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let groups = dir.path().join("groups").join("web");
    std::fs::write(groups.join("junk.member"), "garbage\n").unwrap_or_else(|e| panic!("{e}"));
    let real = std::fs::read_dir(&groups)
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "member") && !p.ends_with("junk.member"))
        .unwrap_or_else(|| panic!("no member file"));
    let copy = dir.path().join("elsewhere");
    std::fs::copy(&real, &copy).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(&copy, groups.join("link.member")).unwrap_or_else(|e| panic!("{e}"));
    let fifo = groups.join("fifo.member");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap_or_else(|e| panic!("mkfifo: {e}"));
    assert!(made.success());
    a.announce_member("web", &member("pod-a"), long)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(next().await, vec![member("pod-a"), member("pod-b")]);
    a.withdraw_member("web", "pod-b")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(next().await, vec![member("pod-a")]);
    assert!(fifo.exists(), "foreign files are left alone");
    // A group directory that is a link (someone could re-point it) is refused.
    let target = dir.path().join("target");
    std::fs::create_dir(&target).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(&target, dir.path().join("groups").join("linked"))
        .unwrap_or_else(|e| panic!("{e}"));
    let e = a
        .announce_member("linked", &member("pod-a"), long)
        .await
        .expect_err("a linked group directory");
    assert_eq!(e.kind(), BackendErrorKind::PermissionDenied, "{e}");
    assert!(
        std::fs::read_dir(&target).map_or(0, Iterator::count) == 0,
        "nothing written through the link"
    );
}
