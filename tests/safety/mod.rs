//! The end-to-end safety run shared by the Redis and Kubernetes suites: five candidate
//! *processes* (this test binary, re-run as a child) campaign for one lease; the leader writes
//! its fencing token to a fenced register while leading; the parent repeatedly kills the leader
//! with SIGKILL or freezes it with SIGSTOP past its lease and resumes it.
//!
//! Every child logs START / WRITE / STOP lines with CLOCK_MONOTONIC timestamps, which are
//! comparable across processes on one machine. The register is a file updated under an
//! exclusive file lock: it refuses tokens lower than the highest accepted and records every
//! attempt. Invariants checked afterwards:
//! - the register never accepted a token lower than one it had accepted before;
//! - no two terms' acting intervals overlap: a term acts from its START until its STOP, or
//!   until the instant its process was frozen or killed (a frozen process cannot act; what it
//!   does after it wakes is the fence's business);
//! - after each kill, a new leader's workload starts within the suite's failover bound
//!   (liveness, not speed: each suite sets it for its store and prints the failovers measured).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tenure::election::{ElectionConfig, LeaderElector};
use tenure::{Backend, FencingToken, Locker};

#[path = "../support/clock.rs"]
mod clock;
pub use clock::mono_ns;

/// The durations every candidate uses: short, so that many rounds fit in a test.
pub const LEASE: Duration = Duration::from_secs(2);
pub const RENEW_DEADLINE: Duration = Duration::from_millis(1300);
pub const RETRY: Duration = Duration::from_millis(500);

pub fn config() -> ElectionConfig {
    ElectionConfig::new()
        .lease_duration(LEASE)
        .renew_deadline(RENEW_DEADLINE)
        .retry_period(RETRY)
        .stop_margin(Duration::from_millis(300))
        .rejoin(true)
}

/// The durations of tests on the kube-apiserver whose claims need one uninterrupted term: a
/// follower that never acts, a hand-off at a moment the test chooses, every write of a term
/// landing. With [`config`]'s 2 s lease a renewal has 1.3 s − 2 s / 3 ≈ 633 ms, one attempt,
/// and an API server sharing two cores with one busy loop per core answers a Lease write in
/// 0.5–2 s: terms ended at random (#42). Here a renewal is sent every 2 s and may take until
/// the renew deadline 2 s later, room for one slow write and a retry.
pub const KUBE_LEASE: Duration = Duration::from_secs(6);
pub const KUBE_RENEW_DEADLINE: Duration = Duration::from_secs(4);
pub const KUBE_RETRY: Duration = Duration::from_secs(1);

pub fn kube_config() -> ElectionConfig {
    ElectionConfig::new()
        .lease_duration(KUBE_LEASE)
        .renew_deadline(KUBE_RENEW_DEADLINE)
        .retry_period(KUBE_RETRY)
        .stop_margin(Duration::from_secs(1))
        .rejoin(true)
}

/// How long a takeover on the kube-apiserver may take at most, for an election of `lease`,
/// `renew_deadline` and `retry`: liveness, not speed (the benches and the tests' printed
/// figures measure speed). A follower takes over once the dead or cut-off leader's lease has
/// lapsed on its own clock (up to one lease after the last renewal it saw), a retry later,
/// after two writes (the grant and the token stamp), each of which may take until the renew
/// deadline. Three more leases are room for a loaded two-core machine: there the follower
/// sees the last renewal late (its watch is served late) and its writes wait on the API
/// server beside everyone else's (#42: beside one busy loop per core, lease + retry left
/// ~0.5 s and failed; a partitioned leader's successor led 6.6–7.1 s after the cut on a 2 s
/// lease, 9.3–12.96 s on a 6 s lease).
pub fn kube_takeover_bound(lease: Duration, renew_deadline: Duration, retry: Duration) -> Duration {
    lease * 4 + renew_deadline + retry * 2
}

/// A file-backed fenced register: `highest` holds the highest accepted token, `log` every
/// attempt, both updated under an exclusive lock on `highest`.
pub struct Register {
    dir: PathBuf,
}

impl Register {
    pub fn new(dir: &Path) -> Self {
        std::fs::write(dir.join("highest"), "0").expect("create register");
        std::fs::write(dir.join("log"), "").expect("create register log");
        Self {
            dir: dir.to_owned(),
        }
    }

    pub fn at(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
        }
    }

    /// Writes `token` if it is at least the highest accepted; returns whether it was accepted.
    ///
    /// The check and the update happen under an exclusive lock on `lock`; the new value is
    /// written to a temporary file and renamed over `highest`, so a writer killed half-way
    /// leaves the old value or the new one, never a torn one.
    pub fn write(&self, token: FencingToken, writer: &str) -> bool {
        let lock = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("lock"))
            .expect("open register lock");
        lock.lock().expect("lock register");
        let current = std::fs::read_to_string(self.dir.join("highest")).expect("read register");
        let highest: u64 = current.trim().parse().expect("register holds a number");
        let accepted = token.get() >= highest;
        if accepted {
            let tmp = self.dir.join(format!("highest.{}", std::process::id()));
            std::fs::write(&tmp, token.get().to_string()).expect("write register");
            std::fs::rename(&tmp, self.dir.join("highest")).expect("replace register");
        }
        let mut log = OpenOptions::new()
            .append(true)
            .open(self.dir.join("log"))
            .expect("open register log");
        // One short write with O_APPEND: a killed writer leaves a whole line or none.
        log.write_all(
            format!(
                "{} {} {} {writer}\n",
                if accepted { "accepted" } else { "refused" },
                token.get(),
                mono_ns()
            )
            .as_bytes(),
        )
        .expect("append register log");
        accepted
    }

    /// Every attempt in order: (accepted, token, writer).
    pub fn history(&self) -> Vec<(bool, u64, String)> {
        let text = std::fs::read_to_string(self.dir.join("log")).expect("read register log");
        text.lines()
            .filter_map(|l| {
                let mut p = l.split_whitespace();
                let verdict = p.next()? == "accepted";
                let token = p.next()?.parse().ok()?;
                let _at = p.next()?;
                Some((verdict, token, p.next()?.to_owned()))
            })
            .collect()
    }
}

/// The child's side: campaign forever on `backend`; while leading, write the term's token to
/// the register every 50 ms; log every step to `log`.
pub async fn candidate(backend: impl Backend, identity: &str, dir: &Path) {
    let log_path = dir.join(format!("{identity}.log"));
    let register = Register::at(dir);
    let locker = Locker::with_identity(backend, identity).expect("valid identity");
    let elector = LeaderElector::new(locker, "safety", config()).expect("valid config");
    let log = std::sync::Arc::new(std::sync::Mutex::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("open candidate log"),
    ));
    let note = move |line: String| {
        let mut f = log.lock().expect("log lock");
        // One write per line: a process killed mid-log leaves whole lines only.
        f.write_all(format!("{line}\n").as_bytes())
            .expect("write candidate log");
        f.flush().expect("flush candidate log");
    };
    let id = identity.to_owned();
    let result = elector
        .run(|term| {
            let note = note.clone();
            let id = id.clone();
            let register = Register::at(&register.dir);
            async move {
                let token = term.fencing_token();
                note(format!("START {} {}", token.get(), mono_ns()));
                loop {
                    // Write without re-checking the lease, as a process that checked just
                    // before it froze would: the fence must catch what the lease cannot.
                    let accepted = register.write(token, &id);
                    note(format!("WRITE {} {} {accepted}", token.get(), mono_ns()));
                    tokio::select! {
                        () = term.cancellation().cancelled() => break,
                        () = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                }
                note(format!("STOP {} {}", token.get(), mono_ns()));
            }
        })
        .await;
    panic!("the candidate's run ended: {result:?}");
}

/// A candidate process, killed on drop.
pub struct Candidate {
    pub identity: String,
    child: Child,
}

impl Candidate {
    /// Re-runs this test binary as candidate `identity`: `test_name` is the test that turns
    /// into a candidate when `env` is set.
    pub fn spawn(test_name: &str, env: &[(&str, String)], identity: &str) -> Self {
        let exe = std::env::current_exe().expect("current exe");
        let mut cmd = Command::new(exe);
        cmd.args(["--exact", test_name, "--nocapture", "--test-threads=1"])
            .env("TENURE_SAFETY_IDENTITY", identity)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self {
            identity: identity.to_owned(),
            child: cmd.spawn().expect("spawn candidate"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for the process to exit on its own; whether it did.
    pub fn exited_within(&mut self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{sig} {} failed", self.pid());
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One term as the candidate logs tell it.
#[derive(Debug, Clone)]
pub struct TermLog {
    pub identity: String,
    pub token: u64,
    pub start: u64,
    pub stop: Option<u64>,
}

/// Every term from every candidate log in `dir`, by token.
pub fn terms(dir: &Path) -> BTreeMap<u64, TermLog> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("log")
            || path.file_name().and_then(|n| n.to_str()) == Some("log")
        {
            continue;
        }
        let identity = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("?")
            .to_owned();
        for line in BufReader::new(File::open(&path).expect("open log")).lines() {
            let line = line.expect("read log line");
            let mut p = line.split_whitespace();
            let (Some(kind), Some(token), Some(at)) = (p.next(), p.next(), p.next()) else {
                continue;
            };
            let (Ok(token), Ok(at)) = (token.parse::<u64>(), at.parse::<u64>()) else {
                continue;
            };
            match kind {
                "START" => {
                    out.insert(
                        token,
                        TermLog {
                            identity: identity.clone(),
                            token,
                            start: at,
                            stop: None,
                        },
                    );
                }
                "STOP" => {
                    if let Some(t) = out.get_mut(&token) {
                        t.stop = Some(at);
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// What the parent did to a candidate, and when.
#[derive(Debug, Clone)]
pub struct Disturbance {
    pub identity: String,
    pub kind: &'static str,
    pub at: u64,
}

/// The leader right now, by the latest START without a STOP, if any.
pub fn current_leader(dir: &Path) -> Option<TermLog> {
    terms(dir).into_values().rev().find(|t| t.stop.is_none())
}

/// Runs `rounds` rounds of kill / freeze against candidates spawned by `spawn` and checks the
/// invariants. After each kill a new leader's workload must start within `failover_bound`:
/// liveness (someone takes over), which the suite sizes for its store on a loaded machine; how
/// fast is what the summary's measured failovers show. Returns a one-line summary for the log.
pub fn run_rounds(
    dir: &Path,
    rounds: usize,
    failover_bound: Duration,
    spawn: &dyn Fn(&str) -> Candidate,
) -> String {
    let _register = Register::new(dir);
    let mut candidates: Vec<Candidate> = (0..5).map(|i| spawn(&format!("c{i}"))).collect();
    let mut next_id = 5;
    let mut disturbances = Vec::new();
    let mut failovers = Vec::new();
    for round in 0..rounds {
        let leader = wait_for(Duration::from_secs(30), || current_leader(dir))
            .unwrap_or_else(|| panic!("round {round}: no leader within 30 s"));
        // Let the leader work a little.
        std::thread::sleep(Duration::from_millis(400));
        let idx = candidates
            .iter()
            .position(|c| c.identity == leader.identity)
            .unwrap_or_else(|| panic!("leader {} is not a live candidate", leader.identity));
        let at = mono_ns();
        if round % 2 == 0 {
            candidates[idx].signal("KILL");
            disturbances.push(Disturbance {
                identity: leader.identity.clone(),
                kind: "KILL",
                at,
            });
            candidates.remove(idx);
            candidates.push(spawn(&format!("c{next_id}")));
            next_id += 1;
            let next = wait_for(Duration::from_secs(30), || {
                terms(dir).into_values().find(|t| t.token > leader.token)
            })
            .unwrap_or_else(|| panic!("round {round}: nobody took over after the kill"));
            let took = Duration::from_nanos(next.start.saturating_sub(at));
            assert!(
                took <= failover_bound,
                "round {round}: a new leader started {took:?} after the kill; the bound is \
                 {failover_bound:?} (failovers before: {failovers:?})"
            );
            failovers.push(took);
        } else {
            candidates[idx].signal("STOP");
            disturbances.push(Disturbance {
                identity: leader.identity.clone(),
                kind: "STOP",
                at,
            });
            // Frozen past its lease: someone else takes over meanwhile.
            std::thread::sleep(LEASE + Duration::from_secs(1));
            candidates[idx].signal("CONT");
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    drop(candidates);
    check(dir, &disturbances);
    let refused = Register::at(dir).history().iter().filter(|h| !h.0).count();
    format!(
        "{rounds} rounds, {} terms, failovers after kill {failovers:?} (bound {failover_bound:?}), \
         stale writes refused by the fence: {refused}",
        terms(dir).len(),
    )
}

/// The parent's side, from an async test: runs [`run_rounds`] on a blocking thread with
/// candidates that re-run `test_name` of this binary with `env`, and returns its summary.
pub async fn run_parent(
    test_name: &'static str,
    env: Vec<(&'static str, String)>,
    dir: PathBuf,
    rounds: usize,
    failover_bound: Duration,
) -> String {
    tokio::task::spawn_blocking(move || {
        run_rounds(&dir, rounds, failover_bound, &|identity| {
            Candidate::spawn(test_name, &env, identity)
        })
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = std::time::Instant::now() + limit;
    while std::time::Instant::now() < end {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Checks the invariants over the logs.
pub fn check(dir: &Path, disturbances: &[Disturbance]) {
    // The register never accepted a token lower than one it had accepted.
    let mut highest = 0;
    for (accepted, token, writer) in Register::at(dir).history() {
        if accepted {
            assert!(
                token >= highest,
                "register accepted {token} from {writer} after {highest}"
            );
            highest = token;
        } else {
            assert!(
                token < highest,
                "register refused {token} from {writer} though the highest was {highest}"
            );
        }
    }
    // Acting intervals do not overlap.
    let terms: Vec<TermLog> = terms(dir).into_values().collect();
    assert!(terms.len() >= 2, "too few terms to check: {terms:?}");
    for pair in terms.windows(2) {
        let (earlier, later) = (&pair[0], &pair[1]);
        let disturbed = disturbances
            .iter()
            .filter(|d| d.identity == earlier.identity && d.at >= earlier.start)
            .map(|d| d.at)
            .min();
        let acted_until = match (earlier.stop, disturbed) {
            (Some(stop), Some(d)) => stop.min(d),
            (Some(stop), None) => stop,
            (None, Some(d)) => d,
            (None, None) => panic!(
                "term {} of {} never stopped and was not disturbed",
                earlier.token, earlier.identity
            ),
        };
        assert!(
            acted_until <= later.start,
            "term {} ({}) acted until {acted_until}, after term {} ({}) started at {}",
            earlier.token,
            earlier.identity,
            later.token,
            later.identity,
            later.start
        );
    }
}

/// The path of example `name`, built first if `cargo test` did not build it already (as it
/// does when run without a `--test` filter).
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("examples")
        .join(name);
    if !path.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--all-features", "--example", name])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building example {name} failed");
    }
    path
}
