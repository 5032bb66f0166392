//! The local backend beyond the conformance suite: real files, and real processes contending
//! through them (this test binary re-runs itself as the child processes, selected by
//! `TENURE_LOCAL_CHILD`), SIGKILL of a holder, reopened and wiped directories, corrupted
//! records, names, and notification-driven hand-off.

#[path = "support/tempdir.rs"]
mod tempdir;

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use futures::StreamExt as _;
use tempdir::TempDir;
use tenure::backend::local::{LocalBackend, MAX_NAME_LEN, default_state_dir};
use tenure::backend::{
    AcquireRequest, Acquired, Backend, BackendErrorKind, FencingToken, HolderToken, Released,
    Renewed,
};
use tenure::{LockError, LockOptions, Locker};
use tokio::time::{Instant, timeout};

/// Selects the child role when this binary is re-run as a child process.
const CHILD_ROLE: &str = "TENURE_LOCAL_CHILD";
/// The state directory of a child process.
const CHILD_DIR: &str = "TENURE_LOCAL_CHILD_DIR";
/// A second directory for a child's bookkeeping (the overlap marker and the token log).
const CHILD_WORK: &str = "TENURE_LOCAL_CHILD_WORK";
/// The ttl, in seconds, of the holding child's lease.
const CHILD_TTL: &str = "TENURE_LOCAL_CHILD_TTL";
/// The lock every child contends for.
const LOCK: &str = "job";

fn open(dir: &Path) -> LocalBackend {
    LocalBackend::open(dir).unwrap_or_else(|e| panic!("cannot open {}: {e}", dir.display()))
}

fn locker(backend: &LocalBackend, identity: &str) -> Locker {
    Locker::with_identity(backend.clone(), identity).unwrap_or_else(|e| panic!("{e}"))
}

fn request(identity: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        name: LOCK.into(),
        holder: HolderToken::random(),
        identity: identity.into(),
        ttl,
    }
}

async fn granted(backend: &LocalBackend, req: &AcquireRequest) -> FencingToken {
    match backend.try_acquire(req).await {
        Ok(Acquired::Granted { fencing }) => fencing,
        other => panic!("expected a grant for {}, got {other:?}", req.identity),
    }
}

// ---------------------------------------------------------------------------------------------
// Child processes

/// A child process running one role of this binary, with its `CHILD ` lines on a channel.
struct ChildProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl ChildProc {
    /// Re-runs this binary as `test` in role `role` on state directory `dir`.
    fn spawn(test: &str, role: &str, dir: &Path, work: &Path, identity: &str) -> Self {
        Self::spawn_with_ttl(test, role, dir, work, identity, 3)
    }

    fn spawn_with_ttl(
        test: &str,
        role: &str,
        dir: &Path,
        work: &Path,
        identity: &str,
        ttl_secs: u64,
    ) -> Self {
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
        let mut child = Command::new(exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ROLE, role)
            .env(CHILD_TTL, ttl_secs.to_string())
            .env(CHILD_DIR, dir)
            .env(CHILD_WORK, work)
            .env("POD_NAME", identity)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn a child process: {e}"));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("piped"));
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest may print "test <name> ... " on the same line first.
                if let Some(at) = line.find("CHILD ") {
                    let _ = tx.send(line[at + "CHILD ".len()..].to_owned());
                }
            }
        });
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// The next `CHILD ` line, waiting up to 60 s.
    fn recv(&self, what: &str) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the child process did not report {what}"))
    }

    fn tell(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().unwrap_or_else(|| panic!("stdin taken"));
        writeln!(stdin, "{command}").unwrap_or_else(|e| panic!("cannot talk to the child: {e}"));
    }

    /// Waits for the child to exit by itself and asserts that it succeeded.
    fn join(mut self) {
        let status = self
            .child
            .wait()
            .unwrap_or_else(|e| panic!("cannot wait for the child: {e}"));
        assert!(status.success(), "the child process failed: {status}");
    }

    fn kill9(&mut self) {
        self.child
            .kill()
            .unwrap_or_else(|e| panic!("cannot SIGKILL the child: {e}"));
        let _ = self.child.wait();
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn child_env(key: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(key).unwrap_or_else(|| panic!("{key} is not set")))
}

/// Runs this process's child role, if it is a child. Returns whether it was.
async fn run_child_role() -> bool {
    let Ok(role) = std::env::var(CHILD_ROLE) else {
        return false;
    };
    match role.as_str() {
        "contend" => child_contend().await,
        "hold" => child_hold().await,
        "churn" => child_churn().await,
        "default-dir" => println!("CHILD {}", default_state_dir().display()),
        other => panic!("unknown child role {other}"),
    }
    true
}

/// Takes the lock 15 times; inside, proves nobody else is inside (an O_EXCL marker file) and
/// appends its token to a shared log.
async fn child_contend() {
    let (dir, work) = (child_env(CHILD_DIR), child_env(CHILD_WORK));
    let locker = Locker::new(open(&dir));
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .retry_interval(Duration::from_millis(200))
        .wait(Duration::from_secs(120));
    for _ in 0..15 {
        let work = work.clone();
        let ran = locker
            .with_lock(LOCK, &opts, |guard| async move {
                let marker = work.join("inside");
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&marker)
                    .unwrap_or_else(|e| panic!("mutual exclusion broken: {e}"));
                let mut log = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(work.join("log"))
                    .unwrap_or_else(|e| panic!("{e}"));
                writeln!(log, "{} {}", guard.fencing_token(), std::process::id())
                    .unwrap_or_else(|e| panic!("{e}"));
                tokio::time::sleep(Duration::from_millis(5)).await;
                std::fs::remove_file(&marker).unwrap_or_else(|e| panic!("{e}"));
            })
            .await;
        ran.unwrap_or_else(|e| panic!("with_lock failed: {e}"));
        // Give the other process a chance to win the next round.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    println!("CHILD done");
}

/// Takes the lock (auto-renewed, ttl from `CHILD_TTL`), reports its token, and releases it
/// when told to on stdin (or is killed before that).
async fn child_hold() {
    let ttl: u64 = std::env::var(CHILD_TTL)
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{CHILD_TTL} is not set"));
    let locker = Locker::new(open(&child_env(CHILD_DIR)));
    let lease = locker
        .try_acquire(
            LOCK,
            &LockOptions::new()
                .ttl(Duration::from_secs(ttl))
                .auto_renew(true),
        )
        .await
        .unwrap_or_else(|e| panic!("the free lock was not granted: {e}"));
    println!("CHILD acquired {}", lease.fencing_token());
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        line
    })
    .await
    .unwrap_or_default();
    if line.trim() == "release" {
        lease
            .release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
        println!("CHILD released");
    }
}

/// Acquires, renews and releases as fast as it can, reporting every token, until killed.
async fn child_churn() {
    let backend = open(&child_env(CHILD_DIR));
    loop {
        let req = request("churner", Duration::from_millis(300));
        let fencing = granted(&backend, &req).await;
        println!("CHILD token {fencing}");
        assert_eq!(
            backend.renew(LOCK, &req.holder, req.ttl).await.ok(),
            Some(Renewed::Held)
        );
        assert_eq!(
            backend.release(LOCK, &req.holder).await.ok(),
            Some(Released::Released)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_never_hold_at_once_and_tokens_rise() {
    if run_child_role().await {
        return;
    }
    let (dir, work) = (
        TempDir::reserve("local-backend-contend"),
        TempDir::reserve("local-backend-contend-work"),
    );
    std::fs::create_dir_all(work.path()).unwrap_or_else(|e| panic!("{e}"));
    let children: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|id| {
            ChildProc::spawn(
                "two_processes_never_hold_at_once_and_tokens_rise",
                "contend",
                dir.path(),
                work.path(),
                id,
            )
        })
        .collect();
    for c in &children {
        assert_eq!(c.recv("the end of its rounds"), "done");
    }
    for c in children {
        c.join();
    }
    let log = std::fs::read_to_string(work.path().join("log")).unwrap_or_else(|e| panic!("{e}"));
    let entries: Vec<(u64, u32)> = log
        .lines()
        .map(|l| {
            let (t, pid) = l.split_once(' ').unwrap_or_else(|| panic!("bad line {l}"));
            (
                t.parse().unwrap_or_else(|e| panic!("{e}")),
                pid.parse().unwrap_or_else(|e| panic!("{e}")),
            )
        })
        .collect();
    assert_eq!(entries.len(), 30, "every section ran once: {log}");
    assert!(
        entries.windows(2).all(|w| w[1].0 > w[0].0),
        "tokens must rise from term to term, in the order the terms ran: {log}"
    );
    let pids: std::collections::HashSet<_> = entries.iter().map(|e| e.1).collect();
    assert_eq!(pids.len(), 2, "both processes held the lock: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_is_succeeded_after_its_ttl_with_a_higher_token() {
    if run_child_role().await {
        return;
    }
    let dir = TempDir::reserve("local-backend-kill");
    let mut child = ChildProc::spawn(
        "killed_holder_process_is_succeeded_after_its_ttl_with_a_higher_token",
        "hold",
        dir.path(),
        dir.path(),
        "doomed",
    );
    let acquired = child.recv("its grant");
    let child_token: u64 = acquired
        .strip_prefix("acquired ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("unexpected report {acquired:?}"));
    child.kill9();

    let backend = open(dir.path());
    let record = backend
        .inspect(LOCK)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("the killed holder's lease must outlive it until its ttl"));
    assert_eq!(record.identity, "doomed");
    assert_eq!(record.fencing.get(), child_token);
    let me = locker(&backend, "successor");
    let opts = LockOptions::new().ttl(Duration::from_secs(3));
    let sent = Instant::now();
    let remaining = match me.try_acquire(LOCK, &opts).await {
        Err(LockError::NotAcquired {
            holder,
            remaining: Some(r),
            ..
        }) => {
            assert_eq!(holder.as_deref(), Some("doomed"));
            assert!(r <= Duration::from_secs(3), "remaining {r:?}");
            r
        }
        other => panic!("the dead holder's lease must still be busy, got {other:?}"),
    };
    let lease = me
        .acquire(LOCK, &opts.clone().wait(Duration::from_secs(20)))
        .await
        .unwrap_or_else(|e| panic!("the dead holder's lease never expired: {e}"));
    assert!(
        sent.elapsed() >= remaining,
        "granted {:?} after the busy answer, before the {remaining:?} it reported had passed",
        sent.elapsed()
    );
    assert!(lease.fencing_token().get() > child_token);
    lease
        .release()
        .await
        .unwrap_or_else(|e| panic!("release failed: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_killed_mid_update_never_corrupt_the_record() {
    if run_child_role().await {
        return;
    }
    let dir = TempDir::reserve("local-backend-churn");
    let mut highest = 0u64;
    for round in 0..5u64 {
        let mut child = ChildProc::spawn(
            "processes_killed_mid_update_never_corrupt_the_record",
            "churn",
            dir.path(),
            dir.path(),
            "churner",
        );
        // Let it run through a few (at least one) cycles, then kill it wherever it is.
        let first = child.recv("a token");
        std::thread::sleep(Duration::from_millis(20 + 37 * round));
        child.kill9();
        // Every line the child wrote before it died (the reader ends at the pipe's EOF).
        let reported = std::iter::once(first)
            .chain(child.lines.iter())
            .filter_map(|l| l.strip_prefix("token ").and_then(|t| t.parse::<u64>().ok()));
        highest = highest.max(reported.max().unwrap_or(0));

        let backend = open(dir.path());
        // The record parses whatever the child was doing (a half-written temporary file is
        // never the record), and the file lock died with the child.
        let inspected = timeout(Duration::from_secs(10), backend.inspect(LOCK)).await;
        assert!(
            matches!(inspected, Ok(Ok(_))),
            "round {round}: {inspected:?}"
        );
        // Killed between a grant and its release, the child leaves a lease that runs out
        // after its 300 ms ttl.
        let req = request("checker", Duration::from_secs(1));
        let deadline = Instant::now() + Duration::from_secs(10);
        let fencing = loop {
            match backend.try_acquire(&req).await {
                Ok(Acquired::Granted { fencing }) => break fencing,
                Ok(Acquired::Busy { holder, .. }) if Instant::now() < deadline => {
                    assert_eq!(holder.as_deref(), Some("churner"), "round {round}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => panic!("round {round}: {other:?}"),
            }
        };
        assert!(
            fencing.get() > highest,
            "round {round}: token {fencing} after {highest}"
        );
        highest = fencing.get();
        let _ = backend.release(LOCK, &req.holder).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_a_waiting_process_long_before_its_retry_interval() {
    if run_child_role().await {
        return;
    }
    let dir = TempDir::reserve("local-backend-handoff");
    // A long ttl, so that the holder's remaining ttl never ends the waiter's pause early.
    let mut child = ChildProc::spawn_with_ttl(
        "release_wakes_a_waiting_process_long_before_its_retry_interval",
        "hold",
        dir.path(),
        dir.path(),
        "holder",
        120,
    );
    let acquired = child.recv("its grant");
    let child_token: u64 = acquired
        .strip_prefix("acquired ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("unexpected report {acquired:?}"));
    // Without the notification the waiter would retry after 10 s ± 20 % (its retry interval;
    // the holder's remaining ttl, about 120 s, is longer).
    let retry = Duration::from_secs(10);
    let backend = open(dir.path());
    let waiter = locker(&backend, "waiter");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .retry_interval(retry)
        .wait(Duration::from_secs(60));
    let waiting = tokio::spawn(async move {
        let lease = waiter.acquire(LOCK, &opts).await;
        (lease, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter must be waiting while the other process holds the lock"
    );
    let told = Instant::now();
    child.tell("release");
    let (lease, granted_at) = waiting
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let lease = lease.unwrap_or_else(|e| panic!("the waiter never acquired: {e}"));
    assert_eq!(child.recv("its release"), "released");
    let handoff = granted_at.duration_since(told);
    assert!(
        handoff < retry / 2,
        "hand-off took {handoff:?}: the waiter was not woken by the release notification \
         (its timed retry would come after {:?})",
        retry * 4 / 5
    );
    assert!(lease.fencing_token().get() > child_token);
    lease
        .release()
        .await
        .unwrap_or_else(|e| panic!("release failed: {e}"));
    child.join();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopened_directory_keeps_the_counter_and_transitions() {
    let dir = TempDir::reserve("local-backend-reopen");
    let first = open(dir.path());
    let mut last = None;
    for i in 0..3 {
        let req = request(&format!("run-{i}"), Duration::from_secs(5));
        let t = granted(&first, &req).await;
        assert!(last.is_none_or(|l| t > l));
        last = Some(t);
        let _ = first.release(LOCK, &req.holder).await;
    }
    drop(first);
    let reopened = open(dir.path());
    let req = request("after-reopen", Duration::from_secs(5));
    let t = granted(&reopened, &req).await;
    let last = last.unwrap_or_else(|| panic!("three grants"));
    assert_eq!(
        t.get(),
        last.get() + 1,
        "the counter is read back from the record, not seeded afresh"
    );
    let record = reopened
        .inspect(LOCK)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("held"));
    assert_eq!(record.identity, "after-reopen");
    assert_eq!(record.fencing, t);
    assert_eq!(record.transitions, Some(3), "four terms, three hand-overs");
    assert!(
        record
            .remaining
            .is_some_and(|r| r > Duration::ZERO && r <= Duration::from_secs(5)),
        "{record:?}"
    );
    // The record is plain text an operator can read.
    let text =
        std::fs::read_to_string(reopened.record_path(LOCK)).unwrap_or_else(|e| panic!("{e}"));
    assert!(text.contains(&format!("fencing {t}")), "{text}");
    assert!(text.contains("identity after-reopen"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_directory_frees_locks_and_tokens_keep_rising() {
    let dir = TempDir::reserve("local-backend-wipe");
    let backend = open(dir.path());
    let mut highest = FencingToken::new(0);
    for _ in 0..20 {
        let req = request("before", Duration::from_secs(5));
        highest = granted(&backend, &req).await;
        let _ = backend.release(LOCK, &req.holder).await;
    }
    let held = request("held", Duration::from_secs(60));
    assert!(granted(&backend, &held).await > highest);
    std::fs::remove_dir_all(dir.path()).unwrap_or_else(|e| panic!("{e}"));

    // The same instance recreates the directory; the held lease is gone with the files.
    assert_eq!(
        backend.renew(LOCK, &held.holder, held.ttl).await.ok(),
        Some(Renewed::NotHeld)
    );
    assert!(dir.path().is_dir(), "the directory is recreated");
    let req = request("after-wipe", Duration::from_secs(5));
    let after = granted(&backend, &req).await;
    assert!(
        after > highest,
        "{after} after a wipe must exceed {highest}"
    );
    let _ = backend.release(LOCK, &req.holder).await;

    // And so does a fresh instance after a second wipe.
    std::fs::remove_dir_all(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let fresh = open(dir.path());
    let again = granted(&fresh, &request("fresh", Duration::from_secs(5))).await;
    assert!(
        again > after,
        "{again} after a second wipe must exceed {after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_record_is_a_typed_error_naming_the_file() {
    let dir = TempDir::reserve("local-backend-corrupt");
    let backend = open(dir.path());
    let req = request("victim", Duration::from_secs(5));
    let before = granted(&backend, &req).await;
    let path = backend.record_path(LOCK);
    let valid = std::fs::read(&path).unwrap_or_else(|e| panic!("{e}"));
    let garbage: [&[u8]; 4] = [
        b"garbage",
        &valid[..valid.len() / 2],
        b"",
        &[0xff, 0xfe, 0x00],
    ];
    for bad in garbage {
        std::fs::write(&path, bad).unwrap_or_else(|e| panic!("{e}"));
        let check = |what: &str, err: Option<tenure::backend::BackendError>| {
            let err = err.unwrap_or_else(|| panic!("{what} accepted a corrupt record"));
            assert_eq!(err.kind(), BackendErrorKind::Protocol, "{what}: {err}");
            assert!(!err.is_transient());
            assert!(
                err.to_string().contains(&path.display().to_string()),
                "{what}: the error must name the file: {err}"
            );
        };
        check("try_acquire", backend.try_acquire(&req).await.err());
        check(
            "renew",
            backend.renew(LOCK, &req.holder, req.ttl).await.err(),
        );
        check("release", backend.release(LOCK, &req.holder).await.err());
        check("inspect", backend.inspect(LOCK).await.err());
        let first = timeout(Duration::from_secs(5), backend.observe(LOCK).next()).await;
        check("observe", first.ok().flatten().and_then(Result::err));
        let via_locker = locker(&backend, "other")
            .try_acquire(LOCK, &LockOptions::new())
            .await;
        assert!(
            matches!(&via_locker, Err(LockError::Backend(e)) if e.kind() == BackendErrorKind::Protocol),
            "{via_locker:?}"
        );
    }
    // Other locks are unaffected, and moving the record aside resets the lock with a token
    // that is still higher.
    let other = AcquireRequest {
        name: "other".into(),
        ..request("other", Duration::from_secs(5))
    };
    granted(&backend, &other).await;
    std::fs::remove_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let after = granted(&backend, &request("after", Duration::from_secs(5))).await;
    assert!(after > before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_from_an_earlier_boot_counts_as_expired() {
    let dir = TempDir::reserve("local-backend-boot");
    let backend = open(dir.path());
    let old = request("before-reboot", Duration::from_secs(3600));
    let before = granted(&backend, &old).await;
    let path = backend.record_path(LOCK);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let rebooted: String = text
        .lines()
        .map(|l| {
            if l.starts_with("boot ") {
                "boot 00000000-0000-0000-0000-000000000000\n".to_owned()
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert_ne!(rebooted, text);
    std::fs::write(&path, rebooted).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(backend.inspect(LOCK).await.ok(), Some(None));
    assert_eq!(
        backend.renew(LOCK, &old.holder, old.ttl).await.ok(),
        Some(Renewed::NotHeld)
    );
    let after = granted(&backend, &request("after-reboot", Duration::from_secs(5))).await;
    assert!(after > before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_starts_with_the_state_then_reports_grants_and_releases_only() {
    let dir = TempDir::reserve("local-backend-observe");
    let (a, b) = (open(dir.path()), open(dir.path()));
    let req = request("first", Duration::from_secs(30));
    let fencing = granted(&a, &req).await;
    let mut changes = b.observe(LOCK);
    let mut next = async || {
        timeout(Duration::from_secs(10), changes.next())
            .await
            .unwrap_or_else(|_| panic!("no notification within 10 s"))
            .unwrap_or_else(|| panic!("the stream ended"))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let now = next().await;
    assert_eq!(
        now.holder.as_deref(),
        Some("first"),
        "the state at subscription"
    );
    assert_eq!(now.fencing, Some(fencing));
    // Renewals change nothing an observer sees.
    for _ in 0..3 {
        assert_eq!(
            a.renew(LOCK, &req.holder, req.ttl).await.ok(),
            Some(Renewed::Held)
        );
    }
    assert_eq!(
        a.release(LOCK, &req.holder).await.ok(),
        Some(Released::Released)
    );
    let released = next().await;
    assert!(released.is_free(), "{released:?}");
    let second = request("second", Duration::from_secs(30));
    let t2 = granted(&a, &second).await;
    let grant = next().await;
    assert_eq!(
        (grant.holder.as_deref(), grant.fencing),
        (Some("second"), Some(t2))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_names_are_rejected_with_the_rule() {
    let dir = TempDir::reserve("local-backend-names");
    let backend = open(dir.path());
    for ok in ["job", "a.b_c-9", "X"] {
        assert_eq!(backend.validate_name(ok), Ok(()));
    }
    let long = "n".repeat(MAX_NAME_LEN + 1);
    for (bad, rule) in [
        ("", "empty"),
        (".job", "'.'"),
        ("..", "'.'"),
        ("../escape", "'.'"),
        ("a/b", "letters"),
        ("a b", "letters"),
        ("tab\tname", "control"),
        ("ünï", "letters"),
        (long.as_str(), "at most"),
    ] {
        let err = backend
            .validate_name(bad)
            .err()
            .unwrap_or_else(|| panic!("{bad:?} was accepted"));
        assert!(err.rule.contains(rule), "{bad:?}: {err}");
        assert_eq!(err.name, bad);
    }
    let via_locker = locker(&backend, "me")
        .try_acquire("a/b", &LockOptions::new())
        .await;
    assert!(
        matches!(via_locker, Err(LockError::InvalidName(_))),
        "{via_locker:?}"
    );
    let entries = std::fs::read_dir(dir.path()).map_or(0, Iterator::count);
    assert_eq!(entries, 0, "a rejected name must not create files");
}

#[test]
fn open_creates_a_private_directory_and_refuses_unsafe_ones() {
    let dir = TempDir::reserve("local-backend-open");
    let nested = dir.path().join("a/b");
    let backend = open(&nested);
    let mode = std::fs::metadata(&nested)
        .unwrap_or_else(|e| panic!("{e}"))
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "mode {mode:o}: private to the user");
    assert_eq!(mode & 0o700, 0o700, "mode {mode:o}");
    assert_eq!(backend.dir(), nested);

    std::fs::set_permissions(&nested, std::fs::Permissions::from_mode(0o777))
        .unwrap_or_else(|e| panic!("{e}"));
    let err = LocalBackend::open(&nested)
        .err()
        .unwrap_or_else(|| panic!("accepted o+w"));
    assert_eq!(err.kind(), BackendErrorKind::PermissionDenied, "{err}");
    assert!(
        err.to_string().contains(&nested.display().to_string()),
        "{err}"
    );

    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap_or_else(|e| panic!("{e}"));
    let err = LocalBackend::open(&file)
        .err()
        .unwrap_or_else(|| panic!("accepted a file"));
    assert!(
        err.to_string().contains(&file.display().to_string()),
        "{err}"
    );
    let under_file = file.join("sub");
    let err = LocalBackend::open(&under_file)
        .err()
        .unwrap_or_else(|| panic!("accepted a path under a file"));
    let text = err.to_string();
    assert!(text.contains(&under_file.display().to_string()), "{text}");
    assert!(text.contains("os error"), "the OS error is named: {text}");
}

/// A symbolic link another user could re-point is refused as the state directory, and a
/// directory that is replaced after `open` by one anybody can write to is refused by the next
/// change (it would otherwise receive our lock files).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_of_other_users_and_replaced_directories_are_refused() {
    let base = TempDir::reserve("local-backend-symlink");
    let target = base.path().join("target");
    let backend = open(&target);

    // A link of our own is fine, and so is (below) a link of root's.
    let mine = base.path().join("mine");
    std::os::unix::fs::symlink(&target, &mine).unwrap_or_else(|e| panic!("{e}"));
    open(&mine);
    // SAFETY: getuid and geteuid take no arguments and cannot fail.
    let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
    if euid == 0 {
        let foreign = base.path().join("foreign");
        std::os::unix::fs::symlink(&target, &foreign).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::lchown(&foreign, Some(uid.max(1) + 4242), None)
            .unwrap_or_else(|e| panic!("{e}"));
        let err = LocalBackend::open(&foreign)
            .err()
            .unwrap_or_else(|| panic!("accepted another user's symbolic link"));
        assert_eq!(err.kind(), BackendErrorKind::PermissionDenied, "{err}");
        assert!(err.to_string().contains("symbolic link"), "{err}");
    }

    // The directory is replaced behind the open backend's back by a world-writable one.
    let req = request("before", Duration::from_secs(5));
    granted(&backend, &req).await;
    std::fs::remove_dir_all(&target).unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir(&target).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o777))
        .unwrap_or_else(|e| panic!("{e}"));
    let err = backend
        .try_acquire(&request("after", Duration::from_secs(5)))
        .await
        .err()
        .unwrap_or_else(|| panic!("granted a lock in a world-writable directory"));
    assert_eq!(err.kind(), BackendErrorKind::PermissionDenied, "{err}");
    assert!(!err.is_transient());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_state_dir_follows_the_documented_order() {
    if run_child_role().await {
        return;
    }
    let run = |vars: &[(&str, Option<&str>)]| {
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
        let mut cmd = Command::new(exe);
        cmd.args([
            "--exact",
            "default_state_dir_follows_the_documented_order",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ROLE, "default-dir");
        for (k, v) in vars {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        let out = cmd.output().unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success());
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let at = stdout
            .find("CHILD ")
            .unwrap_or_else(|| panic!("no report: {stdout}"));
        stdout[at + 6..]
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    // SAFETY: getuid takes no arguments and cannot fail.
    let uid = unsafe { libc::getuid() };
    let (t, x) = ("TENURE_STATE_DIR", "XDG_RUNTIME_DIR");
    assert_eq!(
        run(&[(t, Some("/srv/state")), (x, Some("/run/user/7"))]),
        "/srv/state"
    );
    assert_eq!(
        run(&[(t, Some("")), (x, Some("/run/user/7"))]),
        "/run/user/7/tenure"
    );
    assert_eq!(
        run(&[(t, None), (x, Some("/run/user/7"))]),
        "/run/user/7/tenure"
    );
    assert_eq!(
        run(&[(t, None), (x, Some("relative"))]),
        format!("/tmp/tenure-{uid}")
    );
    assert_eq!(run(&[(t, None), (x, None)]), format!("/tmp/tenure-{uid}"));
}

/// Holder tokens are per acquisition: two lockers in one process on one directory exclude
/// each other exactly as two processes do (the file lock is per open, not per process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_tasks_on_separate_opens_exclude_each_other() {
    let dir = TempDir::reserve("local-backend-tasks");
    let register = Arc::new(tenure::conformance::FencedRegister::default());
    let mut tasks = Vec::new();
    for i in 0..4 {
        let me = locker(&open(dir.path()), &format!("task-{i}"));
        let register = register.clone();
        tasks.push(tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(60));
            for _ in 0..5 {
                let r = register.clone();
                me.with_lock(LOCK, &opts, |g| async move {
                    r.enter(g.fencing_token());
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    r.leave(g.fencing_token());
                })
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            }
        }));
    }
    for t in tasks {
        t.await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    }
    assert_eq!(register.accepted(), 20);
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(
        rc,
        0,
        "mkfifo {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// When a test fails, opens the FIFOs for writing a while, so that a reader or writer stuck on
/// one (the bug under test) finishes and the runtime can shut down.
struct Unblock(Vec<PathBuf>);

impl Drop for Unblock {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for _ in 0..50 {
            for p in &self.0 {
                use std::os::unix::fs::OpenOptionsExt as _;
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(p);
                let _ = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(p);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_place_of_a_file_is_a_typed_error_not_a_hang() {
    let dir = TempDir::reserve("local-backend-fifo");
    let backend = open(dir.path());
    let record = backend.record_path(LOCK);
    let lock_file = dir.path().join("locked.lock");
    let temp = dir.path().join(".staged.tmp");
    mkfifo(&record);
    mkfifo(&lock_file);
    mkfifo(&temp);
    let _unblock = Unblock(vec![record.clone(), lock_file.clone(), temp.clone()]);
    let limit = Duration::from_secs(3);
    let refused = |what: &str, path: &Path, err: Option<tenure::backend::BackendError>| {
        let err = err.unwrap_or_else(|| panic!("{what} accepted a FIFO"));
        assert_eq!(err.kind(), BackendErrorKind::Protocol, "{what}: {err}");
        let text = err.to_string();
        assert!(
            text.contains(&path.display().to_string()) && text.contains("not a regular file"),
            "{what}: {text}"
        );
    };
    // The record: every operation that reads it.
    let req = request("fifo", Duration::from_secs(5));
    let answer = timeout(limit, backend.inspect(LOCK)).await;
    refused(
        "inspect",
        &record,
        answer.expect("inspect hung on a FIFO").err(),
    );
    let answer = timeout(limit, backend.try_acquire(&req)).await;
    refused(
        "try_acquire",
        &record,
        answer.expect("try_acquire hung on a FIFO").err(),
    );
    let answer = timeout(limit, backend.observe(LOCK).next()).await;
    refused(
        "observe",
        &record,
        answer
            .expect("observe hung on a FIFO")
            .and_then(Result::err),
    );
    // The lock file.
    let locked = AcquireRequest {
        name: "locked".into(),
        ..request("fifo", Duration::from_secs(5))
    };
    let answer = timeout(limit, backend.try_acquire(&locked)).await;
    refused(
        "lock",
        &lock_file,
        answer.expect("locking hung on a FIFO").err(),
    );
    // A stale temporary file is ours to replace, whatever it is.
    let staged = AcquireRequest {
        name: "staged".into(),
        ..request("fifo", Duration::from_secs(5))
    };
    let answer = timeout(limit, backend.try_acquire(&staged)).await;
    assert!(
        matches!(answer, Ok(Ok(Acquired::Granted { .. }))),
        "a FIFO as the temporary file: {answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_too_long_for_a_record_is_refused_and_never_written() {
    let dir = TempDir::reserve("local-backend-identity");
    let backend = open(dir.path());
    // Over the 64 KiB a record may have: as is, and once control characters are escaped.
    for identity in ["x".repeat(70_000), "\u{1}".repeat(20_000)] {
        let req = request(&identity, Duration::from_secs(5));
        let err = backend
            .try_acquire(&req)
            .await
            .expect_err("an identity the reader would refuse was granted");
        assert_eq!(err.kind(), BackendErrorKind::Config, "{err}");
        assert!(err.to_string().contains("identity"), "{err}");
        // Nothing was written: the lock is free and readable.
        assert_eq!(
            backend.inspect(LOCK).await.map_err(|e| e.to_string()),
            Ok(None)
        );
    }
    granted(&backend, &request("short", Duration::from_secs(5))).await;
}

/// The group record (sharded leadership) is `groups/G/record`: a planted file too long to be a
/// record, one that does not parse, or a FIFO is reported as damaged (never an error, never a
/// blocked or unbounded read) and is never swapped; the record is not a member and survives
/// the pruning of expired members.
#[tokio::test]
async fn a_group_record_tenure_cannot_read_is_damaged_and_never_a_member() {
    use tenure::backend::{GroupRead, GroupRecord, Member};
    let dir = TempDir::new("local-group-record");
    let backend = open(dir.path());
    let record = dir.path().join("groups/g/record");
    let member = Member {
        identity: "a".to_owned(),
        shards: 4,
        joined_ms: 0,
        holds: Vec::new(),
    };
    backend
        .announce_member("g", &member, Duration::from_millis(50))
        .await
        .expect("announce");
    assert!(
        backend
            .swap_group_record("g", None, &GroupRecord::first(4))
            .await
            .expect("create")
    );
    // The member expires and is pruned by the next announcement; the record stays.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let other = Member {
        identity: "b".to_owned(),
        ..member
    };
    backend
        .announce_member("g", &other, Duration::from_secs(30))
        .await
        .expect("announce");
    let listed = backend
        .members("g")
        .next()
        .await
        .expect("a set")
        .expect("read");
    assert_eq!(listed, vec![other]);
    assert!(matches!(
        backend.group_record("g").await.expect("read"),
        GroupRead::Present { record, .. } if record == GroupRecord::first(4)
    ));
    for (what, plant) in [
        ("5 MiB", vec![b'g'; 5 << 20]),
        ("garbage", b"g1:four:1:-".to_vec()),
    ] {
        std::fs::write(&record, plant).expect("plant");
        let read = timeout(Duration::from_secs(5), backend.group_record("g"))
            .await
            .expect("bounded")
            .expect("a damaged record is no error");
        assert!(
            matches!(read, GroupRead::Damaged { .. }),
            "{what}: {read:?}"
        );
        assert!(
            !backend
                .swap_group_record("g", None, &GroupRecord::first(4))
                .await
                .expect("swap"),
            "{what}: a damaged record is never replaced"
        );
    }
    std::fs::remove_file(&record).expect("remove");
    let fifo = std::ffi::CString::new(record.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: `fifo` is a valid NUL-terminated path; mkfifo reads it and nothing else.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let read = timeout(Duration::from_secs(5), backend.group_record("g"))
        .await
        .expect("a FIFO never blocks the read")
        .expect("no error");
    assert!(matches!(read, GroupRead::Damaged { .. }), "{read:?}");
}
