//! client-go interoperability: a Go candidate using client-go's `leaderelection` with a
//! `LeaseLock` (`e2e/kube-testenv/cmd/clientgo-candidate`, `ReleaseOnCancel` on) and tenure
//! candidates contend for one Lease, in both directions. Both append to one timeline (the Go
//! candidate's events carry its wall-clock time); no two leadership intervals may overlap.
//! Each takes over after the other releases or dies, and each reads the other's record.

mod kube_support;

use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use kube_support::{candidate, shared, unique};
use tenure::backend::Backend;
use tenure::{LockOptions, Locker};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

const NS: &str = "default";
const LEASE: Duration = Duration::from_secs(4);
const RENEW_DEADLINE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);

/// The wall-clock time of a monotonic instant (the Go side reports wall-clock times).
fn wall(i: Instant) -> SystemTime {
    let (now_i, now_w) = (Instant::now(), SystemTime::now());
    if i >= now_i {
        now_w + (i - now_i)
    } else {
        now_w - (now_i - i)
    }
}

#[derive(Debug, Clone)]
struct Event {
    kind: String,
    who: String,
    at: SystemTime,
}

/// A running client-go candidate.
struct GoCandidate {
    child: Child,
    events: mpsc::UnboundedReceiver<Event>,
    seen: Vec<Event>,
    /// client-go's own log (klog, on stderr): why it did what it did.
    log: Arc<Mutex<Vec<String>>>,
}

impl GoCandidate {
    fn spawn(lease: &str, identity: &str) -> Self {
        Self::spawn_leasing(lease, identity, LEASE, RENEW_DEADLINE)
    }

    /// A candidate whose own terms last `duration`, renewed within `renew_deadline`.
    fn spawn_leasing(
        lease: &str,
        identity: &str,
        duration: Duration,
        renew_deadline: Duration,
    ) -> Self {
        let mut child = Command::new(candidate())
            .arg("--kubeconfig")
            .arg(shared().admin_kubeconfig())
            .args(["--namespace", NS, "--lease", lease, "--identity", identity])
            .arg(format!("--lease-duration={}s", duration.as_secs()))
            .arg(format!("--renew-deadline={}s", renew_deadline.as_secs()))
            .arg(format!("--retry-period={}s", RETRY.as_secs()))
            .arg("--timestamps")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the client-go candidate: {e}"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let kept = log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                kept.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
            }
        });
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, events) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut words: Vec<&str> = line.split_whitespace().collect();
                let Some(ns) = words.pop().and_then(|w| w.parse::<u64>().ok()) else {
                    continue;
                };
                let kind = words.first().map(|w| (*w).to_owned()).unwrap_or_default();
                let who = words.get(1..).map(|w| w.join(" ")).unwrap_or_default();
                let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(ns);
                if tx.send(Event { kind, who, at }).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            events,
            seen: Vec::new(),
            log,
        }
    }

    /// What client-go logged so far, one line each.
    fn log(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .join("\n")
    }

    /// client-go's own word that its release on SIGTERM failed, if it said so.
    ///
    /// Its release is best effort: one read and one write under its renew deadline, never
    /// retried (client-go 0.36 `LeaderElector::release`). The signal cancels a renewal that
    /// may be in flight; if the API server applies that renewal after the release's read,
    /// the release's write conflicts and the lease stays its holder's until it runs out. A
    /// loaded API server, whose renewals take longer, makes that more likely. The tests judge
    /// tenure against what client-go did, so they read this rather than assume the release.
    fn failed_release(&self) -> Option<String> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|l| {
                l.contains("Failed to release lease")
                    || l.contains("error retrieving resource lock")
            })
            .cloned()
    }

    /// Waits up to `within` for an event of `kind` (from `who`, if given).
    async fn wait_for(&mut self, kind: &str, who: Option<&str>, within: Duration) -> Event {
        let deadline = Instant::now() + within;
        loop {
            if let Some(e) = self
                .seen
                .iter()
                .find(|e| e.kind == kind && who.is_none_or(|w| e.who == w))
            {
                return e.clone();
            }
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(e)) => self.seen.push(e),
                Ok(None) => panic!(
                    "the candidate exited before {kind} {who:?}: {:?}\nclient-go's log:\n{}",
                    self.seen,
                    self.log()
                ),
                Err(_) => panic!(
                    "no {kind} {who:?} within {within:?}: {:?}\nclient-go's log:\n{}",
                    self.seen,
                    self.log()
                ),
            }
        }
    }

    /// Whether an event of `kind` has arrived by now.
    fn has(&mut self, kind: &str) -> bool {
        while let Ok(e) = self.events.try_recv() {
            self.seen.push(e);
        }
        self.seen.iter().any(|e| e.kind == kind)
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("running").to_string();
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid} failed");
    }

    async fn exited(&mut self) {
        tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("the candidate must exit")
            .expect("wait");
    }
}

/// Leadership intervals on one wall-clock timeline.
#[derive(Default)]
struct Timeline(Vec<(String, SystemTime, SystemTime)>);

impl Timeline {
    fn led(&mut self, who: &str, from: SystemTime, to: SystemTime) {
        assert!(from <= to, "{who}: interval ends before it starts");
        self.0.push((who.to_owned(), from, to));
    }

    fn assert_disjoint(&self) {
        let mut v = self.0.clone();
        v.sort_by_key(|(_, from, _)| *from);
        for w in v.windows(2) {
            let ((a, _, a_end), (b, b_start, _)) = (&w[0], &w[1]);
            assert!(
                a_end < b_start,
                "{a} and {b} led at once: {b} started {:?} before {a} ended",
                a_end.duration_since(*b_start).unwrap_or_default()
            );
        }
    }
}

/// client-go's durations; like client-go, a renewal may take until the renew deadline (an
/// 800 ms bound gave each renewal one attempt, which a loaded API server could miss, #42).
fn tenure_opts() -> LockOptions {
    LockOptions::new()
        .ttl(LEASE)
        .auto_renew(true)
        .renew_deadline(RENEW_DEADLINE)
        .retry_interval(RETRY)
        .request_timeout(RENEW_DEADLINE)
}

async fn locker(identity: &str) -> Locker {
    Locker::with_identity(shared().backend(NS).await, identity).expect("identity")
}

/// Graceful both ways: tenure releases and client-go takes over; client-go releases on
/// SIGTERM and a tenure waiter takes over, woken by the watch.
///
/// client-go's terms here last `GO_LEASE`: a waiter that missed the release would only look
/// again when the lease it last saw runs out, so its take-over soon after the SIGTERM can
/// only be the release notification's doing, with seconds to spare for a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_handoffs_both_ways() {
    const GO_LEASE: Duration = Duration::from_secs(20);
    let name = unique("interop-graceful");
    let mut timeline = Timeline::default();

    let rust1 = locker("rust-1").await;
    let lease1 = rust1
        .try_acquire(&name, &tenure_opts())
        .await
        .expect("free lease");
    let r1_start = SystemTime::now();

    let mut go = GoCandidate::spawn_leasing(&name, "go-1", GO_LEASE, GO_LEASE / 2);
    // client-go reads tenure's record: it sees rust-1 as the leader and waits.
    go.wait_for("NEWLEADER", Some("rust-1"), Duration::from_secs(10))
        .await;
    tokio::time::sleep(LEASE + RETRY).await;
    assert!(
        !go.has("STARTED"),
        "client-go took over a lease tenure renews"
    );

    let r1_end = SystemTime::now();
    lease1.release().await.expect("release");
    // client-go's next retry (every RETRY, jittered) reads the release and takes the Lease:
    // two requests, on an API server that may be slow on a loaded machine.
    let started = go
        .wait_for("STARTED", Some("go-1"), Duration::from_secs(10))
        .await;
    timeline.led("rust-1", r1_start, r1_end);
    eprintln!(
        "tenure → client-go hand-off: {:?}",
        started.at.duration_since(r1_end).unwrap_or_default()
    );

    // tenure reads client-go's record.
    let observer = shared().backend(NS).await;
    let record = observer
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held by go-1");
    assert_eq!(record.identity, "go-1");
    assert_eq!(
        record.transitions,
        Some(1),
        "rust-1 → go-1 is one transition"
    );

    // The waiter's own retries never come before the lease it saw runs out.
    let rust2 = locker("rust-2").await;
    let (n, o) = (
        name.clone(),
        tenure_opts()
            .retry_interval(GO_LEASE * 3)
            .wait(GO_LEASE * 6),
    );
    let waiting = tokio::spawn(async move {
        let lease = rust2.acquire(&n, &o).await;
        (lease, SystemTime::now())
    });
    // Past one lease since the waiter first looked: it looked again, and client-go's
    // renewals kept it out.
    tokio::time::sleep(GO_LEASE + RETRY * 2).await;
    assert!(
        !waiting.is_finished(),
        "tenure took over a lease client-go renews"
    );

    let sigterm = SystemTime::now();
    go.signal("-TERM");
    let ended = go
        .wait_for("ENDED", Some("go-1"), Duration::from_secs(5))
        .await;
    go.wait_for("STOPPED", Some("go-1"), Duration::from_secs(5))
        .await;
    go.exited().await;
    let (lease2, r2_start) = waiting.await.expect("waiter task");
    let lease2 = lease2.expect("tenure takes over after client-go's release");
    timeline.led("go-1", started.at, ended.at);
    let handoff = r2_start.duration_since(sigterm).unwrap_or_default();
    eprintln!("client-go → tenure hand-off (from SIGTERM): {handoff:?}");
    if let Some(said) = go.failed_release() {
        // Nothing was released to wake the waiter: it took the lease at a later look, once
        // client-go's record had run out (the take itself is judged by the timeline).
        eprintln!("client-go's release failed, so the hand-off waited for its lease: {said}");
    } else {
        // Its next look would come a lease after its last one, some 15 s after the SIGTERM.
        assert!(
            handoff < GO_LEASE / 2,
            "the waiter must be woken by the release, not by its next look: {handoff:?}\n\
             client-go's log:\n{}",
            go.log()
        );
    }
    assert!(lease2.fencing_token() > lease1.fencing_token());
    let raw = shared().lease(NS, &name).await.expect("lease");
    assert_eq!(
        raw.spec.and_then(|s| s.lease_transitions),
        Some(2),
        "go-1 → rust-2 is one more transition"
    );
    let r2_end = SystemTime::now();
    lease2.release().await.expect("release");
    timeline.led("rust-2", r2_start, r2_end);
    timeline.assert_disjoint();
}

/// Crashes both ways: client-go killed with SIGKILL, tenure takes over after the lease
/// duration on its own clock; tenure stops renewing (as a crashed process would), client-go
/// takes over only after tenure's validity has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_failover_both_ways() {
    let name = unique("interop-crash");
    let mut timeline = Timeline::default();

    let mut go1 = GoCandidate::spawn(&name, "go-1");
    let started = go1
        .wait_for("STARTED", Some("go-1"), Duration::from_secs(10))
        .await;

    let rust = locker("rust-1").await;
    let (n, o) = (name.clone(), tenure_opts().wait(Duration::from_secs(60)));
    let waiting = tokio::spawn(async move {
        let lease = rust.acquire(&n, &o).await;
        (lease, SystemTime::now())
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !waiting.is_finished(),
        "tenure took over a lease client-go renews"
    );

    let killed = SystemTime::now();
    go1.signal("-KILL");
    go1.exited().await;
    timeline.led("go-1", started.at, killed);
    let (lease, r_start) = waiting.await.expect("waiter task");
    let lease = lease.expect("tenure takes over a dead client-go leader's lease");
    let failover = r_start.duration_since(killed).unwrap_or_default();
    eprintln!("client-go killed → tenure leads: {failover:?}");
    // client-go renewed every second; tenure waits the full duration since it last saw it.
    assert!(
        failover >= LEASE - RETRY - Duration::from_millis(500),
        "tenure took over {failover:?} after the kill: before the lease duration"
    );
    // Liveness, with room for the watch's lag and the take-over's writes (and a retry) on a
    // loaded API server.
    assert!(
        failover <= LEASE * 2 + RETRY * 2,
        "failover took {failover:?}"
    );

    let mut go2 = GoCandidate::spawn(&name, "go-2");
    go2.wait_for("NEWLEADER", Some("rust-1"), Duration::from_secs(10))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !go2.has("STARTED"),
        "client-go took over a lease tenure renews"
    );
    // tenure "crashes": it stops renewing and never releases.
    let crashed = SystemTime::now();
    let valid_until = wall(lease.valid_until());
    lease.orphan();
    timeline.led("rust-1", r_start, crashed);
    let go2_started = go2
        .wait_for("STARTED", Some("go-2"), LEASE * 2 + RETRY * 2)
        .await;
    assert!(
        go2_started.at > valid_until,
        "client-go started leading {:?} before tenure's validity ended",
        valid_until
            .duration_since(go2_started.at)
            .unwrap_or_default()
    );
    eprintln!(
        "tenure stopped renewing → client-go leads: {:?}",
        go2_started.at.duration_since(crashed).unwrap_or_default()
    );
    go2.signal("-TERM");
    let ended = go2
        .wait_for("ENDED", Some("go-2"), Duration::from_secs(5))
        .await;
    go2.exited().await;
    timeline.led("go-2", go2_started.at, ended.at);
    timeline.assert_disjoint();
    let raw = shared().lease(NS, &name).await.expect("lease");
    let spec = raw.spec.expect("spec");
    if let Some(said) = go2.failed_release() {
        // The record is then its last renewal's, left to run out.
        eprintln!("client-go's release failed: {said}");
        assert_eq!(spec.holder_identity.as_deref(), Some("go-2"));
        assert_eq!(spec.lease_duration_seconds, Some(LEASE.as_secs() as i32));
    } else {
        assert_eq!(
            spec.holder_identity.as_deref(),
            Some(""),
            "client-go released; its log:\n{}",
            go2.log()
        );
        assert_eq!(spec.lease_duration_seconds, Some(1));
    }
}
