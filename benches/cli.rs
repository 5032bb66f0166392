//! The `tenure` CLI against real backends, side by side with a peer, reported as ratios.
//!
//! Every replica is a real process: `tenure run … -- bash -c SCRIPT` (or the peer,
//! `flock -x LOCKFILE bash -c SCRIPT`, util-linux's single-host singleton wrapper), whose command
//! appends `start <pid> <t>` when it begins and `end <pid> <t>` just before `exit 0`, with `t`
//! from bash's `$EPOCHREALTIME` (a builtin: no fork between the event and its time stamp). The
//! command blocks on a FIFO until the bench lets it finish, so "A's command exits" happens when
//! the bench says so, and a command that is never let go runs until it is killed. Measured:
//!
//! 1. hand-off on exit: A leads, B waits; A's command exits; from A's `end` to B's `start`.
//!    Local backend on tmpfs (`/dev/shm`) and on the temp dir, vs `flock(1)` on the same
//!    filesystem; Redis (a real `redis-server`) and Kubernetes (a real kube-apiserver) against
//!    the lease duration, the wait of a follower that simply polls for expiry;
//! 2. failover after `kill -9` of the leading tenure (lease 3 s, renew deadline 2 s, retry
//!    500 ms; the kill lands at spread-out points of the 1 s renewal cycle): SIGKILL → B's
//!    `start`, bounded by lease + retry = 3.5 s; and SIGKILL → A's command gone (its
//!    parent-death signal). Peer: `kill -9` of `flock(1)`, whose child keeps the locked file
//!    descriptor (the lock stays held until the orphaned command exits), and `flock -o`, whose
//!    child does not (the lock goes at once, while the orphan still runs);
//! 3. SIGSTOP of the leading tenure for lease + 1 s, then SIGCONT: SIGCONT → A's command gone,
//!    and how long A's command (not frozen: it runs in its own process group) overlapped with
//!    B's, which took over during the freeze;
//! 4. the wrapper's cost: VmRSS of an idle leading tenure (and of the waiting one) per backend
//!    vs `flock(1)`'s, and the start-up time from spawning the wrapper to the command's `start`
//!    with a free lease, vs `flock(1)` and a bare `bash -c` (the floor).
//!
//! Prints one table and writes `target/bench/cli.json`. Only loopback servers are used; every
//! process started is killed on drop (commands through a pidfd, wrappers through their process
//! group).
//!
//! `cargo bench --features cli --bench cli`
//!
//! The binary: cargo builds the `tenure` bin target with the bench's own profile and features
//! before running a bench, and sets `CARGO_BIN_EXE_tenure` for bench targets as it does for
//! integration tests (cargo 1.95 does; read at compile time with `option_env!`). Without it the
//! bench looks next to its own executable (`target/<profile>/deps/cli-HASH` →
//! `target/<profile>/tenure`, the same profile and target dir, whatever `CARGO_TARGET_DIR`
//! says), and as a last resort runs `cargo build [--release] --features cli --bin tenure` into
//! that target dir. `TENURE_BIN=/path/to/tenure` overrides all of this. Under `cargo bench`
//! the profile is `bench` (release settings, `target/release/tenure`).

#[path = "support/mod.rs"]
mod support;

use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use support::kube_harness;
use support::out::{Say, save_json};
use support::proc::{FAST, tenure_bin};
use support::redis_harness::RedisServer;
use support::scratch::Scratch;
use support::stats::Stats;
use support::table;

/// The elector settings of every run: lease 3 s, renew deadline 2 s, retry period 500 ms.
const LEASE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(500);
/// A leader renews every lease / 3.
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// Repetitions per measurement (the whole bench takes about 4–5 minutes on 2 cores).
const STARTUP_REPS: usize = 20;
const HANDOFF_REPS: usize = 15;
const FAILOVER_REPS: usize = 6;
const FREEZE_REPS: usize = 4;
const FLOCK_KILL_REPS: usize = 2;

/// The repetitions to run: `full`, or 2 with `TENURE_BENCH_QUICK=1` (a smoke run).
fn reps(full: usize) -> usize {
    static QUICK: OnceLock<bool> = OnceLock::new();
    if *QUICK.get_or_init(|| std::env::var_os("TENURE_BENCH_QUICK").is_some_and(|v| v == "1")) {
        full.min(2)
    } else {
        full
    }
}

/// How long B gets, after it says it is campaigning, to settle into waiting.
const SETTLE: Duration = Duration::from_millis(300);
/// How long A leads before a kill or a freeze (at least one renewal), plus a phase spread
/// over one renewal period.
const LEAD: Duration = Duration::from_millis(1200);
/// Generous bounds on things that should take milliseconds or one lease.
const SHORT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------
// Time, statistics

/// Wall-clock nanoseconds, comparable with the commands' `$EPOCHREALTIME` stamps.
fn now_ns() -> i128 {
    i128::try_from(support::role::now_ns()).unwrap_or(0)
}

/// `1732950000.123456` (either decimal separator) → nanoseconds.
fn parse_epoch(s: &str) -> Option<i128> {
    let (secs, frac) = s.split_once(['.', ',']).unwrap_or((s, "0"));
    let secs: i128 = secs.parse().ok()?;
    let digits = frac.len().min(9);
    let frac: i128 = frac.get(..digits)?.parse().ok()?;
    Some(secs * 1_000_000_000 + frac * 10i128.pow(u32::try_from(9 - digits).ok()?))
}

fn ms(ns: i128) -> f64 {
    ns as f64 / 1e6
}

/// Summary of samples in milliseconds (or KiB, for memory); its p50 is the median.
fn stats(samples: &[f64]) -> Option<Stats> {
    Stats::of(samples.iter().copied())
}

fn stats_json(s: &Stats, unit: &str) -> Value {
    json!({"unit": unit, "n": s.n, "median": s.p50, "p90": s.p90, "min": s.min, "max": s.max})
}

/// `12.3 ms` / `2.51 s`.
fn fmt_ms(v: f64) -> String {
    table::fmt_ms(v, 1, 2)
}

fn cell_ms(s: &Stats) -> String {
    format!("{} (p90 {}, n={})", fmt_ms(s.p50), fmt_ms(s.p90), s.n)
}

fn cell_kib(s: &Stats) -> String {
    format!("{:.1} MiB", s.p50 / 1024.0)
}

// ---------------------------------------------------------------------------------------
// Processes

/// A pidfd: signals and waits for one exact process, immune to pid reuse, child or not.
struct Pidfd(OwnedFd);

impl Pidfd {
    fn open(pid: i32) -> Option<Self> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Some(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Whether the process exited within `limit` (a pidfd polls readable on exit).
    fn wait_exit(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut p = libc::pollfd {
                fd: self.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let timeout = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd that we own, count 1.
            let rc = unsafe { libc::poll(&raw mut p, 1, timeout) };
            if rc > 0 {
                return true;
            }
            if rc == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
            {
                return false;
            }
        }
    }

    fn exited(&self) -> bool {
        self.wait_exit(Duration::ZERO)
    }

    fn kill(&self) {
        // SAFETY: pidfd_send_signal on a descriptor we own; a null siginfo is allowed.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
    }
}

/// What wraps the command.
#[derive(Clone, Debug)]
enum Wrapper {
    /// `tenure run --lease … --identity … <args> <FAST> -- bash -c SCRIPT`.
    Tenure {
        args: Vec<String>,
        env: Vec<(String, String)>,
    },
    /// `flock -x [-o] LOCKFILE bash -c SCRIPT`.
    Flock { lockfile: PathBuf, close: bool },
    /// `bash -c SCRIPT`.
    Bare,
}

/// One wrapped command (or a bare one), with its stamp log, stderr and FIFO; everything it
/// started is killed on drop.
struct Replica {
    child: Child,
    status: Option<ExitStatus>,
    /// The command itself (for tenure and flock: the wrapper's child), once it has started.
    command: Option<Pidfd>,
    log: PathBuf,
    stderr: PathBuf,
    fifo: PathBuf,
    tenure: bool,
}

impl Replica {
    /// Starts `w` around a command that logs `start`, then, when `wait` is set, blocks until
    /// the bench writes its FIFO and logs `end`; it exits 0.
    fn spawn(w: &Wrapper, lease: &str, identity: &str, dir: &Path, tag: &str, wait: bool) -> Self {
        let log = dir.join(format!("{tag}.log"));
        let stderr = dir.join(format!("{tag}.err"));
        let fifo = dir.join(format!("{tag}.fifo"));
        let _ = std::fs::remove_file(&log);
        let script = if wait {
            let _ = std::fs::remove_file(&fifo);
            let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes())
                .unwrap_or_else(|e| panic!("{e}"));
            // SAFETY: mkfifo reads a NUL-terminated path we own.
            let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
            assert_eq!(rc, 0, "mkfifo {}", fifo.display());
            format!(
                "echo \"start $$ $EPOCHREALTIME\" >> {l}; read -r _ < {f}; echo \"end $$ $EPOCHREALTIME\" >> {l}; exit 0",
                l = log.display(),
                f = fifo.display()
            )
        } else {
            format!(
                "echo \"start $$ $EPOCHREALTIME\" >> {}; exit 0",
                log.display()
            )
        };
        let bash = ["bash".to_owned(), "-c".to_owned(), script];
        let mut cmd = match w {
            Wrapper::Tenure { args, env } => {
                let mut c = Command::new(tenure_bin());
                c.args(["run", "--lease", lease, "--identity", identity])
                    .args(args)
                    .args(FAST)
                    .arg("--")
                    .args(&bash)
                    .env("TENURE_LOG", "info");
                for (k, v) in env {
                    c.env(k, v);
                }
                c
            }
            Wrapper::Flock { lockfile, close } => {
                let mut c = Command::new("flock");
                c.arg("-x");
                if *close {
                    c.arg("-o");
                }
                c.arg(lockfile).args(&bash);
                c
            }
            Wrapper::Bare => {
                let mut c = Command::new(&bash[0]);
                c.args(&bash[1..]);
                c
            }
        };
        let err = std::fs::File::create(&stderr).unwrap_or_else(|e| panic!("{e}"));
        let child = cmd
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {w:?}: {e}"));
        Self {
            child,
            status: None,
            command: None,
            log,
            stderr,
            fifo,
            tenure: matches!(w, Wrapper::Tenure { .. }),
        }
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(0)
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The first `kind` stamp in the log: (pid, ns).
    fn stamp(&self, kind: &str) -> Option<(i32, i128)> {
        let text = std::fs::read_to_string(&self.log).ok()?;
        text.split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == kind).then_some(())?;
                let pid = f.next()?.parse().ok()?;
                Some((pid, parse_epoch(f.next()?)?))
            })
    }

    /// Waits for the `kind` stamp (remembering the command's pidfd at `start`).
    fn wait_stamp(&mut self, kind: &str, limit: Duration) -> i128 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some((pid, at)) = self.stamp(kind) {
                if kind == "start" && self.command.is_none() {
                    self.command = Pidfd::open(pid);
                }
                return at;
            }
            let exited = self.status.is_some() || matches!(self.child.try_wait(), Ok(Some(_)));
            assert!(
                !exited && Instant::now() < deadline,
                "no `{kind}` from {} within {limit:?} (exited: {exited}); stderr:\n{}",
                self.log.display(),
                self.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Polls for the `kind` stamp for up to `limit`, without failing.
    fn poll_stamp(&self, kind: &str, limit: Duration) -> Option<i128> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some((_, at)) = self.stamp(kind) {
                return Some(at);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Ready to contend: tenure has logged `campaigning`; a peer is ready once started.
    fn wait_campaigning(&self) {
        let deadline = Instant::now() + SHORT;
        while self.tenure && !self.stderr_text().contains("campaigning") {
            assert!(
                Instant::now() < deadline,
                "tenure did not campaign; stderr:\n{}",
                self.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Lets the command finish (it is blocked opening its FIFO).
    fn release(&self) {
        let deadline = Instant::now() + SHORT;
        loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&self.fifo)
            {
                Ok(mut f) => {
                    let _ = f.write_all(b"go\n");
                    return;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                    assert!(Instant::now() < deadline, "nobody reads {:?}", self.fifo);
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("open {}: {e}", self.fifo.display()),
            }
        }
    }

    fn signal(&self, sig: libc::c_int) {
        assert!(self.status.is_none(), "signal to a reaped process");
        // SAFETY: a signal to our own unreaped child (its pid cannot have been reused).
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill({}, {sig})", self.pid());
    }

    fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.status {
                return s;
            }
            if let Some(s) = self.child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
                self.status = Some(s);
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {limit:?}; stderr:\n{}",
                self.pid(),
                self.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits for it to exit, which it must do with status 0.
    fn exits_ok(&mut self) {
        let s = self.wait_exit(SHORT);
        assert!(s.success(), "{s}: {}", self.stderr_text());
    }

    /// (VmRSS KiB, threads) of the wrapper process.
    fn rss(&self) -> (f64, f64) {
        let status = support::proc::status(self.child.id());
        let field =
            |name: &str| support::proc::status_field(&status, name).map_or(f64::NAN, |v| v as f64);
        (field("VmRSS:"), field("Threads:"))
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(c) = &self.command {
            c.kill();
        }
        if self.status.is_none() {
            // The wrapper is unreaped, so its pid still names its process group.
            // SAFETY: killpg only sends a signal; the group is the one we created.
            unsafe { libc::killpg(self.pid(), libc::SIGKILL) };
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.fifo);
    }
}

/// A directory of this run under `base`, removed on drop.
fn scratch_dir(base: &Path, label: &str) -> Scratch {
    Scratch::new(base.join(format!("tenure-bench-cli-{}-{label}", std::process::id())))
}

// ---------------------------------------------------------------------------------------
// Measurements

/// Spawn → the command's `start` with a free lease, and spawn → the wrapper's exit.
fn startup(w: &Wrapper, dir: &Path, tag: &str) -> (Vec<f64>, Vec<f64>) {
    let (mut to_start, mut to_exit) = (Vec::new(), Vec::new());
    for i in 0..reps(STARTUP_REPS) {
        let t0 = now_ns();
        let mut r = Replica::spawn(w, "startup", "a", dir, &format!("{tag}-st{i}"), false);
        let started = r.wait_stamp("start", SHORT);
        let status = r.wait_exit(SHORT);
        let exited = now_ns();
        assert!(status.success(), "{status}: {}", r.stderr_text());
        to_start.push(ms(started - t0));
        to_exit.push(ms(exited - t0));
    }
    (to_start, to_exit)
}

/// A's command exits → B's command starts; also counts overlaps (B before A's end).
fn handoff(w: &Wrapper, dir: &Path, tag: &str) -> (Vec<f64>, usize) {
    let (mut samples, mut overlaps) = (Vec::new(), 0);
    for i in 0..reps(HANDOFF_REPS) {
        let lease = format!("handoff-{i}");
        let mut a = Replica::spawn(w, &lease, "a", dir, &format!("{tag}-ho{i}-a"), true);
        a.wait_stamp("start", SHORT);
        let mut b = Replica::spawn(w, &lease, "b", dir, &format!("{tag}-ho{i}-b"), true);
        b.wait_campaigning();
        std::thread::sleep(SETTLE);
        assert!(b.stamp("start").is_none(), "B started while A led");
        a.release();
        let a_end = a.wait_stamp("end", SHORT);
        let b_start = b.wait_stamp("start", LEASE * 3);
        b.release();
        a.exits_ok();
        b.exits_ok();
        if b_start < a_end {
            overlaps += 1;
        }
        samples.push(ms(b_start - a_end));
    }
    (samples, overlaps)
}

/// A leading (its command never let go) and B waiting, `i` of `reps` into A's renewal cycle.
fn leader_and_follower(
    w: &Wrapper,
    dir: &Path,
    tag: &str,
    i: usize,
    reps: usize,
) -> (Replica, Replica) {
    let lease = format!("{tag}-{i}");
    let mut a = Replica::spawn(w, &lease, "a", dir, &format!("{tag}{i}-a"), true);
    a.wait_stamp("start", SHORT);
    let led_from = Instant::now();
    let b = Replica::spawn(w, &lease, "b", dir, &format!("{tag}{i}-b"), true);
    b.wait_campaigning();
    std::thread::sleep(SETTLE);
    let phase = RENEW_EVERY.mul_f64((i as f64 + 0.5) / reps as f64);
    let until = led_from + LEAD + phase;
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    assert!(b.stamp("start").is_none(), "B started while A led");
    (a, b)
}

#[derive(Default)]
struct Failover {
    takeover: Vec<f64>,
    command_gone: Vec<f64>,
    leader_rss: Vec<f64>,
    leader_threads: Vec<f64>,
    follower_rss: Vec<f64>,
}

/// SIGKILL of the leading tenure → B's `start`, and → A's command gone.
fn failover(w: &Wrapper, dir: &Path, tag: &str) -> Failover {
    let mut out = Failover::default();
    for i in 0..reps(FAILOVER_REPS) {
        let (mut a, mut b) =
            leader_and_follower(w, dir, &format!("{tag}-fo"), i, reps(FAILOVER_REPS));
        let (rss, threads) = a.rss();
        out.leader_rss.push(rss);
        out.leader_threads.push(threads);
        out.follower_rss.push(b.rss().0);
        let killed = now_ns();
        a.signal(libc::SIGKILL);
        let command = a.command.as_ref().unwrap_or_else(|| panic!("no pidfd"));
        assert!(
            command.wait_exit(SHORT),
            "A's command outlived its killed tenure"
        );
        out.command_gone.push(ms(now_ns() - killed));
        let b_start = b.wait_stamp("start", LEASE * 4);
        out.takeover.push(ms(b_start - killed));
        b.release();
        b.exits_ok();
        a.wait_exit(SHORT);
    }
    out
}

#[derive(Default)]
struct FlockKill {
    /// SIGKILL → B's start, when B started within lease + retry.
    started_within: Vec<f64>,
    /// Reps in which A's orphaned command was still running at the end of that window.
    orphan_alive: usize,
    /// Reps in which B started while A's orphan was still running.
    overlapped: usize,
    /// A's orphan let go → B's start, when B had not started before.
    after_orphan_exit: Vec<f64>,
    flock_rss: Vec<f64>,
}

/// `kill -9` of a leading `flock(1)` (`-o`: it does not pass the lock to its child).
fn flock_kill(lockfile: &Path, close: bool, dir: &Path, tag: &str) -> FlockKill {
    let w = Wrapper::Flock {
        lockfile: lockfile.to_owned(),
        close,
    };
    let window = LEASE + RETRY;
    let mut out = FlockKill::default();
    for i in 0..reps(FLOCK_KILL_REPS) {
        let (mut a, mut b) = leader_and_follower(&w, dir, tag, i, reps(FLOCK_KILL_REPS));
        out.flock_rss.push(a.rss().0);
        let killed = now_ns();
        a.signal(libc::SIGKILL);
        let started = b.poll_stamp("start", window);
        let orphan = a.command.as_ref().unwrap_or_else(|| panic!("no pidfd"));
        let alive = !orphan.exited();
        out.orphan_alive += usize::from(alive);
        if let Some(at) = started {
            out.started_within.push(ms(at - killed));
            out.overlapped += usize::from(alive);
        }
        a.release();
        // The wrapper is dead; its orphaned command logs the end.
        let orphan_end = a
            .poll_stamp("end", SHORT)
            .unwrap_or_else(|| panic!("A's orphaned command did not end"));
        if started.is_none() {
            let at = b.wait_stamp("start", SHORT);
            out.after_orphan_exit.push(ms(at - orphan_end));
        }
        b.release();
        b.wait_exit(SHORT);
        a.wait_exit(SHORT);
    }
    out
}

#[derive(Default)]
struct Freeze {
    /// SIGSTOP → A's command gone (the watchdog process kills it while tenure is frozen).
    stop_to_gone: Vec<f64>,
    /// SIGCONT → A's command gone (0 when it was gone before the SIGCONT).
    resume_to_gone: Vec<f64>,
    /// SIGSTOP → B's start.
    takeover: Vec<f64>,
    /// B's start → A's command gone (both ran).
    overlap: Vec<f64>,
    exit_codes: Vec<i32>,
}

/// SIGSTOP of the leading tenure for lease + 1 s, then SIGCONT.
fn freeze(w: &Wrapper, dir: &Path, tag: &str) -> Freeze {
    let mut out = Freeze::default();
    for i in 0..reps(FREEZE_REPS) {
        let (mut a, mut b) =
            leader_and_follower(w, dir, &format!("{tag}-fz"), i, reps(FREEZE_REPS));
        let stopped = now_ns();
        let frozen_at = Instant::now();
        a.signal(libc::SIGSTOP);
        let freeze_for = LEASE + Duration::from_secs(1);
        let command = a.command.as_ref().unwrap_or_else(|| panic!("no pidfd"));
        // Watch the command during the freeze: it may be killed before tenure resumes.
        let gone_while_frozen = command.wait_exit(freeze_for);
        let gone_frozen_at = now_ns();
        std::thread::sleep(freeze_for.saturating_sub(frozen_at.elapsed()));
        let resumed = now_ns();
        a.signal(libc::SIGCONT);
        let gone = if gone_while_frozen {
            gone_frozen_at
        } else {
            assert!(
                command.wait_exit(SHORT),
                "A's command survived the resume; stderr:\n{}",
                a.stderr_text()
            );
            now_ns()
        };
        out.stop_to_gone.push(ms(gone - stopped));
        out.resume_to_gone.push(ms((gone - resumed).max(0)));
        let b_start = b.wait_stamp("start", SHORT);
        out.takeover.push(ms(b_start - stopped));
        out.overlap.push(ms(gone - b_start).max(0.0));
        out.exit_codes.push(a.wait_exit(SHORT).code().unwrap_or(-1));
        b.release();
        b.exits_ok();
    }
    out
}

// ---------------------------------------------------------------------------------------
// Report

const HANDOFF: &str = "hand-off on exit: A's `end` → B's `start`";
const FAILOVER: &str = "failover: `kill -9` of the leading wrapper → B's `start`";
const PDEATH: &str = "`kill -9` of the leading tenure → A's command gone";
const FROZEN_KILL: &str = "SIGSTOP of the leading tenure for 4 s (lease + 1 s) → A's command gone";
const RESUME: &str =
    "SIGSTOP of the leading tenure for 4 s (lease + 1 s), SIGCONT → A's command gone (0: before)";
const FROZEN_OVERLAP: &str = "SIGSTOP'd tenure: A's command still running after B's `start`";
const STARTUP: &str = "start-up: spawn → the command's `start`, free lease";

struct Row {
    measure: String,
    backend: String,
    tenure: String,
    peer: String,
    ratio: String,
    json: Value,
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        let r = a / b;
        if r >= 0.1 {
            format!("{r:.2}×")
        } else {
            format!("{r:.4}×")
        }
    } else {
        "—".into()
    }
}

struct Report {
    rows: Vec<Row>,
    raw: serde_json::Map<String, Value>,
}

impl Report {
    /// A row comparing two sample sets (ms).
    fn versus(
        &mut self,
        measure: &str,
        backend: &str,
        ours: &[f64],
        peer_name: &str,
        theirs: &[f64],
    ) {
        let (Some(o), Some(t)) = (stats(ours), stats(theirs)) else {
            return;
        };
        self.rows.push(Row {
            measure: measure.into(),
            backend: backend.into(),
            tenure: cell_ms(&o),
            peer: format!("{peer_name}: {}", cell_ms(&t)),
            ratio: ratio(o.p50, t.p50),
            json: json!({"measure": measure, "backend": backend, "tenure": stats_json(&o, "ms"),
                         "peer": {"name": peer_name, "stats": stats_json(&t, "ms")},
                         "ratio": o.p50 / t.p50}),
        });
    }

    /// A row comparing samples (ms) with a fixed figure (ms).
    fn against(&mut self, measure: &str, backend: &str, ours: &[f64], what: &str, value: f64) {
        let Some(o) = stats(ours) else { return };
        self.rows.push(Row {
            measure: measure.into(),
            backend: backend.into(),
            tenure: cell_ms(&o),
            peer: format!("{what} {}", fmt_ms(value)),
            ratio: ratio(o.p50, value),
            json: json!({"measure": measure, "backend": backend, "tenure": stats_json(&o, "ms"),
                         "peer": {"name": what, "value_ms": value}, "ratio": o.p50 / value}),
        });
    }

    /// A row with a textual peer and no ratio; `note` follows tenure's figure.
    fn text(&mut self, measure: &str, backend: &str, ours: &[f64], note: &str, peer: String) {
        let o = stats(ours);
        let mut tenure = o.as_ref().map_or_else(|| "—".into(), cell_ms);
        if !note.is_empty() {
            tenure = format!("{tenure}; {note}");
        }
        self.rows.push(Row {
            measure: measure.into(),
            backend: backend.into(),
            tenure,
            peer: peer.clone(),
            ratio: "—".into(),
            json: json!({"measure": measure, "backend": backend,
                         "tenure": o.map(|o| stats_json(&o, "ms")), "note": note, "peer": peer}),
        });
    }

    /// Memory: KiB samples vs a peer's.
    fn memory(&mut self, backend: &str, ours: &[f64], threads: &[f64], theirs: Option<&[f64]>) {
        let Some(o) = stats(ours) else { return };
        let th = stats(threads).map_or(f64::NAN, |t| t.p50);
        let measure = "VmRSS of the idle leading wrapper";
        let (peer, r, pj) = match theirs.and_then(stats) {
            Some(t) => (
                format!("flock(1): {}", cell_kib(&t)),
                ratio(o.p50, t.p50),
                stats_json(&t, "KiB"),
            ),
            None => ("—".into(), "—".into(), Value::Null),
        };
        self.rows.push(Row {
            measure: measure.into(),
            backend: backend.into(),
            tenure: format!("{} ({th:.0} threads)", cell_kib(&o)),
            peer,
            ratio: r,
            json: json!({"measure": measure, "backend": backend, "tenure": stats_json(&o, "KiB"),
                         "threads": th, "peer": pj}),
        });
    }

    fn raw(&mut self, key: &str, samples: &[f64]) {
        self.raw.insert(key.into(), json!(samples));
    }

    fn print(&self) {
        println!(
            "{}",
            table::header(&["measure", "backend", "tenure", "peer", "ratio"], 1)
        );
        for r in &self.rows {
            println!(
                "{}",
                table::row(&[&r.measure, &r.backend, &r.tenure, &r.peer, &r.ratio])
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// The run

fn local_wrapper(state: &Path) -> Wrapper {
    Wrapper::Tenure {
        args: vec![
            "--backend".into(),
            "local".into(),
            "--state-dir".into(),
            state.display().to_string(),
        ],
        env: Vec::new(),
    }
}

/// Everything measured for tenure on one backend.
struct Results {
    label: String,
    startup: Vec<f64>,
    handoff: Vec<f64>,
    /// Failover and freeze are measured on tmpfs, Redis and Kubernetes (not on the temp dir).
    failover: Option<Failover>,
    freeze: Option<Freeze>,
}

fn measure(label: &str, w: &Wrapper, dir: &Path, full: bool, report: &mut Report) -> Results {
    let tag: String = label.chars().filter(char::is_ascii_alphanumeric).collect();
    eprintln!("[{label}] tenure start-up ×{}", reps(STARTUP_REPS));
    let (startup, to_exit) = startup(w, dir, &tag);
    report.raw(&format!("{label}: tenure start-up, ms"), &startup);
    report.raw(&format!("{label}: tenure spawn → exit, ms"), &to_exit);
    eprintln!("[{label}] tenure hand-off ×{}", reps(HANDOFF_REPS));
    let (handoff, overlaps) = handoff(w, dir, &tag);
    assert_eq!(overlaps, 0, "B's command started before A's ended");
    report.raw(&format!("{label}: tenure hand-off, ms"), &handoff);
    let (mut fo, mut fz) = (None, None);
    if full {
        eprintln!(
            "[{label}] tenure failover after kill -9 ×{}",
            reps(FAILOVER_REPS)
        );
        let f = failover(w, dir, &tag);
        report.raw(&format!("{label}: failover, ms"), &f.takeover);
        report.raw(
            &format!("{label}: kill -9 → command gone, ms"),
            &f.command_gone,
        );
        report.raw(&format!("{label}: leader VmRSS, KiB"), &f.leader_rss);
        report.raw(&format!("{label}: follower VmRSS, KiB"), &f.follower_rss);
        fo = Some(f);
        eprintln!(
            "[{label}] tenure SIGSTOP past the lease ×{}",
            reps(FREEZE_REPS)
        );
        let z = freeze(w, dir, &tag);
        report.raw(
            &format!("{label}: SIGSTOP → command gone, ms"),
            &z.stop_to_gone,
        );
        report.raw(
            &format!("{label}: SIGCONT → command gone, ms"),
            &z.resume_to_gone,
        );
        report.raw(&format!("{label}: SIGSTOP → B's start, ms"), &z.takeover);
        report.raw(&format!("{label}: frozen overlap, ms"), &z.overlap);
        report.raw.insert(
            format!("{label}: frozen tenure's exit codes"),
            json!(z.exit_codes),
        );
        fz = Some(z);
    }
    Results {
        label: label.into(),
        startup,
        handoff,
        failover: fo,
        freeze: fz,
    }
}

/// flock(1)'s side of the local backend on one filesystem.
struct FlockResults {
    startup: Vec<f64>,
    handoff: Vec<f64>,
    /// `kill -9` of flock and of `flock -o` (measured once, on the first filesystem).
    kills: Option<(FlockKill, FlockKill)>,
}

fn main() {
    let bin = tenure_bin();
    let profile = bin
        .parent()
        .and_then(Path::file_name)
        .map_or_else(|| "?".into(), |n| n.to_string_lossy().into_owned());
    eprintln!("tenure binary: {} (target/{profile})", bin.display());
    let begun = Instant::now();
    let tmpfs = Path::new("/dev/shm")
        .is_dir()
        .then(|| PathBuf::from("/dev/shm"));
    let temp = std::env::temp_dir();
    // Logs and FIFOs on tmpfs when there is one.
    let scratch = scratch_dir(tmpfs.as_deref().unwrap_or(&temp), "run");
    let dir = scratch.0.as_path();
    let mut report = Report {
        rows: Vec::new(),
        raw: serde_json::Map::new(),
    };

    eprintln!("[floor] bare bash -c ×{}", reps(STARTUP_REPS));
    let (floor, _) = startup(&Wrapper::Bare, dir, "bare");
    report.raw("bare bash -c start-up, ms", &floor);

    // The local backend and flock(1), on tmpfs and on the temp dir.
    let mut places = Vec::new();
    if let Some(t) = &tmpfs {
        places.push((format!("local, tmpfs {}", t.display()), t.clone()));
    }
    places.push((format!("local, temp dir {}", temp.display()), temp.clone()));
    let mut locals = Vec::new();
    for (i, (label, base)) in places.iter().enumerate() {
        let place = scratch_dir(base, "state");
        let lockfile = place.0.join("flock.lock");
        let flock = Wrapper::Flock {
            lockfile: lockfile.clone(),
            close: false,
        };
        eprintln!(
            "[{label}] flock(1) start-up ×{}, hand-off ×{}",
            reps(STARTUP_REPS),
            reps(HANDOFF_REPS)
        );
        let (fst, _) = startup(&flock, dir, "flockst");
        let (fho, overlaps) = handoff(&flock, dir, "flockho");
        assert_eq!(overlaps, 0, "flock let B start before A's command ended");
        report.raw(&format!("{label}: flock start-up, ms"), &fst);
        report.raw(&format!("{label}: flock hand-off, ms"), &fho);
        let results = measure(
            label,
            &local_wrapper(&place.0.join("state")),
            dir,
            i == 0,
            &mut report,
        );
        // What kill -9 does to flock(1) is not a property of the filesystem: measured once.
        let kills = (i == 0).then(|| {
            eprintln!(
                "[{label}] kill -9 of flock(1) and of flock -o ×{}",
                reps(FLOCK_KILL_REPS)
            );
            (
                flock_kill(&lockfile, false, dir, "flockkill"),
                flock_kill(&lockfile, true, dir, "flockokill"),
            )
        });
        locals.push((
            results,
            FlockResults {
                startup: fst,
                handoff: fho,
                kills,
            },
        ));
    }

    let redis = {
        eprintln!("[redis] starting redis-server");
        let server = RedisServer::start();
        let w = Wrapper::Tenure {
            args: vec!["--backend".into(), server.url()],
            env: Vec::new(),
        };
        measure("redis", &w, dir, true, &mut report)
    };

    let kube = {
        eprintln!("[kube] starting kube-apiserver");
        let server = kube_harness::Server::start(kube_harness::Launch::default());
        let ns = kube_harness::unique("bench-cli");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
            .block_on(server.namespace(&ns));
        let w = Wrapper::Tenure {
            args: vec!["--backend".into(), "kube".into(), "--namespace".into(), ns],
            env: vec![(
                "KUBECONFIG".into(),
                server.admin_kubeconfig().display().to_string(),
            )],
        };
        let r = measure("kube", &w, dir, true, &mut report);
        eprintln!("[kube] stopping kube-apiserver");
        r
    };

    assemble(&mut report, &locals, &[&redis, &kube], &floor);
    report.print();
    let elapsed = begun.elapsed();
    println!(
        "\n(binary {}, target/{profile}; lease 3 s, renew deadline 2 s, retry 500 ms; tenure ÷ \
         peer of the medians; stamps from bash's $EPOCHREALTIME; {:.0} s in all)",
        bin.display(),
        elapsed.as_secs_f64()
    );
    write_json(&report, bin, &profile, elapsed);
}

/// The table, in reading order.
fn assemble(
    report: &mut Report,
    locals: &[(Results, FlockResults)],
    remote: &[&Results],
    floor: &[f64],
) {
    let lease_ms = LEASE.as_secs_f64() * 1000.0;
    let bound_ms = (LEASE + RETRY).as_secs_f64() * 1000.0;
    for (t, f) in locals {
        report.versus(HANDOFF, &t.label, &t.handoff, "flock(1)", &f.handoff);
    }
    for t in remote {
        report.against(
            HANDOFF,
            &t.label,
            &t.handoff,
            "lease duration (naive wait)",
            lease_ms,
        );
    }
    let all: Vec<&Results> = locals
        .iter()
        .map(|(t, _)| t)
        .chain(remote.iter().copied())
        .collect();
    for t in &all {
        let Some(fo) = &t.failover else { continue };
        report.against(
            FAILOVER,
            &t.label,
            &fo.takeover,
            "bound lease + retry",
            bound_ms,
        );
        if let Some((
            _,
            FlockResults {
                kills: Some((k, ko)),
                ..
            },
        )) = locals.iter().find(|(l, _)| l.label == t.label)
        {
            report.text(
                FAILOVER,
                &t.label,
                &fo.takeover,
                "",
                flock_kill_text("flock(1)", k),
            );
            report.text(
                FAILOVER,
                &t.label,
                &fo.takeover,
                "",
                flock_kill_text("flock -o", ko),
            );
        }
    }
    for t in &all {
        let Some(fo) = &t.failover else { continue };
        let peer = match locals.iter().find(|(l, _)| l.label == t.label) {
            Some((
                _,
                FlockResults {
                    kills: Some((k, _)),
                    ..
                },
            )) => format!(
                "flock(1): its command survives as an orphan ({}/{} still running {} later)",
                k.orphan_alive,
                reps(FLOCK_KILL_REPS),
                fmt_ms(bound_ms)
            ),
            _ => "—".into(),
        };
        report.text(PDEATH, &t.label, &fo.command_gone, "", peer);
    }
    for t in &all {
        let Some(fz) = &t.freeze else { continue };
        report.text(
            FROZEN_KILL,
            &t.label,
            &fz.stop_to_gone,
            "",
            "flock(1): no lease, nothing expires".into(),
        );
        report.text(
            RESUME,
            &t.label,
            &fz.resume_to_gone,
            &format!("tenure exited {:?}", fz.exit_codes),
            "flock(1): no lease, nothing expires".into(),
        );
        let takeover = stats(&fz.takeover).map_or(f64::NAN, |s| s.p50);
        report.text(
            FROZEN_OVERLAP,
            &t.label,
            &fz.overlap,
            &format!("B took over {} after the SIGSTOP", fmt_ms(takeover)),
            "flock(1): —".into(),
        );
    }
    for t in &all {
        let Some(fo) = &t.failover else { continue };
        let flock_rss = locals
            .iter()
            .find(|(l, _)| l.label == t.label)
            .and_then(|(_, f)| f.kills.as_ref())
            .map(|(k, _)| k.flock_rss.as_slice());
        report.memory(&t.label, &fo.leader_rss, &fo.leader_threads, flock_rss);
    }
    for (t, f) in locals {
        report.versus(STARTUP, &t.label, &t.startup, "flock(1)", &f.startup);
    }
    for t in &all {
        report.versus(
            STARTUP,
            &t.label,
            &t.startup,
            "bare `bash -c` (floor)",
            floor,
        );
    }
    let follower: Vec<(String, f64)> = all
        .iter()
        .filter_map(|t| {
            let fo = t.failover.as_ref()?;
            Some((t.label.clone(), stats(&fo.follower_rss)?.p50))
        })
        .collect();
    report
        .raw
        .insert("follower VmRSS median, KiB".into(), json!(follower));
}

fn flock_kill_text(name: &str, k: &FlockKill) -> String {
    let window = fmt_ms((LEASE + RETRY).as_secs_f64() * 1000.0);
    let within = stats(&k.started_within);
    let after = stats(&k.after_orphan_exit);
    let mut s = format!(
        "{name}: B started within {window} in {}/{}",
        k.started_within.len(),
        reps(FLOCK_KILL_REPS)
    );
    if let Some(w) = within {
        s += &format!(" (after {}", fmt_ms(w.p50));
        if k.overlapped > 0 {
            s += &format!(
                ", while A's orphaned command still ran: {}/{} overlaps",
                k.overlapped,
                reps(FLOCK_KILL_REPS)
            );
        }
        s += ")";
    }
    if let Some(a) = after {
        s += &format!(
            "; otherwise only when A's orphaned command exited (+{})",
            fmt_ms(a.p50)
        );
    }
    s
}

fn write_json(report: &Report, bin: &Path, profile: &str, elapsed: Duration) {
    let doc = json!({
        "bench": "cli",
        "binary": bin.display().to_string(),
        "profile_dir": profile,
        "cores": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "settings": {"lease_duration_s": 3, "renew_deadline_s": 2, "retry_period_ms": 500,
                     "settle_ms": SETTLE.as_millis(), "lead_before_kill_ms": LEAD.as_millis()},
        "reps": {"startup": reps(STARTUP_REPS), "handoff": reps(HANDOFF_REPS), "failover": reps(FAILOVER_REPS),
                 "freeze": reps(FREEZE_REPS), "flock_kill": reps(FLOCK_KILL_REPS)},
        "elapsed_s": elapsed.as_secs_f64(),
        "rows": report.rows.iter().map(|r| r.json.clone()).collect::<Vec<_>>(),
        "samples": Value::Object(report.raw.clone()),
    });
    save_json("cli.json", &doc, Say::Stderr);
}
