//! The node tests' harness: a real single-node Kubernetes (`e2e/node`: apiserver,
//! controller-manager, scheduler, containerd, kubelet inside namespaces the launcher creates)
//! with the repository's images imported, helm and kubectl, a fenced register the pods write
//! to, the terms of a lock as a watch sees them (a Lease's with kubectl; kubectl watches of
//! any list), the measurements' report, and the processes (and freezer cgroups) of the pods as
//! the host sees them. The chart's releases and their pods are [`chart`]'s, Redis is
//! [`redis`]'s, the peer implementations' images and Deployments are [`peers`]'.
//!
//! The suite runs only when `TENURE_NODE_TENURE_BIN` names the static musl `tenure` (what
//! `scripts/test.sh` sets after building it); otherwise every test prints why it skips.

#![allow(dead_code)]

pub mod chart;
pub mod peers;
pub mod redis;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The node's address inside its network namespace (see e2e/node/main.go).
pub const NODE_IP: &str = "198.18.0.1";

const START_TIMEOUT: Duration = Duration::from_secs(300);

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn chart() -> PathBuf {
    repo().join("charts/tenure")
}

/// Why the suite cannot run here, if it cannot.
pub fn skip_reason() -> Option<String> {
    let Some(bin) = std::env::var_os("TENURE_NODE_TENURE_BIN") else {
        return Some(
            "TENURE_NODE_TENURE_BIN is not set (the static musl tenure; scripts/test.sh builds \
             it and runs this suite as root)"
                .into(),
        );
    };
    if !Path::new(&bin).is_file() {
        return Some(format!(
            "TENURE_NODE_TENURE_BIN={} is not a file",
            Path::new(&bin).display()
        ));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the node needs root (namespaces, cgroups, containerd)".into());
    }
    None
}

/// Prints the reason and returns true when the suite cannot run.
pub fn skip(test: &str) -> bool {
    match skip_reason() {
        Some(why) => {
            println!("SKIPPED {test}: {why}");
            true
        }
        None => false,
    }
}

/// Runs `bash SCRIPT ARGS...` and returns the last line it printed.
fn script(path: &Path, args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(path)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(
        out.status.success(),
        "`{} {}` failed ({})",
        path.display(),
        args.join(" "),
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned()
}

/// The directory of the node's binaries (built or cached by e2e/node/build.sh).
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| PathBuf::from(script(&repo().join("e2e/node/build.sh"), &[])))
}

pub fn helm() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| PathBuf::from(script(&repo().join("e2e/scripts/helm.sh"), &["build"])))
}

pub fn kubectl() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        PathBuf::from(script(
            &repo().join("e2e/scripts/kube-testenv.sh"),
            &["build-kubectl"],
        ))
    })
}

/// Removes the directories of earlier test processes that are gone (`node-TAG-PID-N`).
fn sweep(root: &Path) {
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.rsplitn(3, '-');
        let (_, pid, rest) = (parts.next(), parts.next(), parts.next());
        if rest.is_some_and(|r| r.starts_with("node-"))
            && let Some(pid) = pid.and_then(|p| p.parse::<u32>().ok())
            && pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A fresh directory for this process under cargo's temp dir (those of processes that are
/// gone are removed first).
pub fn fresh_dir(tag: &str) -> PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep(Path::new(env!("CARGO_TARGET_TMPDIR"))));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "node-{tag}-{}-{:08x}",
        std::process::id(),
        rand_u32()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    dir
}

pub fn rand_u32() -> u32 {
    let t = tenure::backend::HolderToken::random();
    let b = t.as_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// A running node.
pub struct Node {
    pub dir: PathBuf,
    pub inner_pid: u32,
    child: Mutex<Option<Child>>,
    /// Seconds from spawning the launcher to a Ready node.
    pub start_secs: f64,
}

/// The images, built once per process (buildah, offline) from the static tenure.
pub fn images() -> &'static Vec<PathBuf> {
    static IMAGES: OnceLock<Vec<PathBuf>> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let bin = std::env::var("TENURE_NODE_TENURE_BIN").unwrap_or_default();
        let out = fresh_dir("images");
        let pause = bin_dir().join("pause");
        let out_s = out.display().to_string();
        let pause_s = pause.display().to_string();
        script(
            &repo().join("e2e/node/images.sh"),
            &[&out_s, &bin, &pause_s],
        );
        ["tenure.tar", "tenure-next.tar", "busybox.tar", "pause.tar"]
            .iter()
            .map(|f| out.join(f))
            .collect()
    })
}

impl Node {
    /// Starts a node of this process's own; panics with its log if it fails.
    pub fn start() -> Self {
        let bins = bin_dir();
        let images = images();
        let dir = fresh_dir("cluster");
        let log = std::fs::File::create(dir.join("launcher.log"))
            .unwrap_or_else(|e| panic!("log file: {e}"));
        let mut cmd = Command::new(bins.join("kube-node"));
        cmd.arg("--dir")
            .arg(&dir)
            .arg("--bin-dir")
            .arg(bins)
            .arg("--parent-pid")
            .arg(std::process::id().to_string());
        for img in images {
            cmd.arg("--image").arg(img);
        }
        let started = Instant::now();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start kube-node: {e}"));
        let ready = dir.join("ready");
        while !ready.is_file() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "kube-node exited ({status}) before the node was ready:\n{}",
                    tail(&dir.join("launcher.log"), 60)
                );
            }
            if started.elapsed() > START_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "no Ready node after {START_TIMEOUT:?}:\n{}\n--- inner:\n{}",
                    tail(&dir.join("launcher.log"), 40),
                    tail(&dir.join("logs/inner.log"), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let start_secs = started.elapsed().as_secs_f64();
        let content = std::fs::read_to_string(&ready).unwrap_or_default();
        let inner_pid = content
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("bad ready file: {content:?}"));
        Node {
            dir,
            inner_pid,
            child: Mutex::new(Some(child)),
            start_secs,
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The launcher's pid (0 once stopped).
    pub fn launcher_pid(&self) -> u32 {
        self.child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.id())
            .unwrap_or_default()
    }

    /// The cgroup root of this node (`tenure-node-<launcher pid>`).
    pub fn cgroup_root(&self) -> String {
        let pid = self
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.id())
            .unwrap_or_default();
        format!("tenure-node-{pid}")
    }

    /// Stops the node (SIGTERM to the launcher) and waits for it to exit.
    pub fn stop(&self) {
        let Some(mut child) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        // SAFETY: kill on a pid we own.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(child.try_wait(), Ok(Some(_))) {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// kubectl as admin.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(kubectl());
        cmd.arg("--kubeconfig").arg(self.kubeconfig());
        cmd
    }

    /// helm with its own state under the node's directory.
    pub fn helm(&self) -> Command {
        let home = self.dir.join("helm-home");
        let mut cmd = Command::new(helm());
        cmd.env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env("KUBECONFIG", self.kubeconfig());
        cmd
    }

    /// A TCP listener on the node's address, inside its network namespace: pods reach it.
    pub fn listen(&self) -> TcpListener {
        let pid = self.inner_pid;
        std::thread::spawn(move || {
            let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
                .unwrap_or_else(|e| panic!("node netns: {e}"));
            // SAFETY: setns on this thread only (a network namespace may be entered by one
            // thread of a multi-threaded process); the thread ends right after.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            TcpListener::bind((NODE_IP, 0)).unwrap_or_else(|e| panic!("bind in the node: {e}"))
        })
        .join()
        .unwrap_or_else(|_| panic!("listener thread panicked"))
    }

    /// Runs a command in the node's network and mount namespaces.
    pub fn nsenter(&self, args: &[&str]) -> Output {
        run(
            Command::new("nsenter")
                .args(["-t", &self.inner_pid.to_string(), "-n", "-m", "--"])
                .args(args),
            None,
        )
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
        // Kept after a failure, for its logs (removed by the next run's sweep).
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub fn tail(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What a command did.
pub struct Output {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub what: String,
}

impl Output {
    pub fn expect_ok(self) -> String {
        assert!(
            self.ok,
            "`{}` failed:\n{}\n{}",
            self.what, self.stderr, self.stdout
        );
        self.stdout
    }

    pub fn json(self) -> Value {
        let out = self.expect_ok();
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
    }
}

pub fn run(cmd: &mut Command, input: Option<&str>) -> Output {
    let what = format!(
        "{} {}",
        cmd.get_program().to_string_lossy(),
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `{what}`: {e}"));
    if let Some(input) = input
        && let Some(mut stdin) = child.stdin.take()
    {
        stdin
            .write_all(input.as_bytes())
            .unwrap_or_else(|e| panic!("`{what}`: stdin: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("`{what}`: {e}"));
    Output {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        what,
    }
}

/// How many rounds (rollouts, installs) a measuring test runs: the number in environment
/// variable `name`, else `default`; at least 1.
pub fn count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(default)
        .max(1)
}

/// Polls `f` every 50 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out ({timeout:?}) waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The measurements: each printed as it comes (`MEASURED what: values`), and all as a table
/// at the end.
pub struct Report {
    title: String,
    rows: Vec<(String, Vec<String>)>,
}

impl Report {
    pub fn new(title: &str) -> Self {
        Report {
            title: title.to_owned(),
            rows: Vec::new(),
        }
    }

    pub fn add(&mut self, what: &str, value: String) {
        self.row(what, &[value]);
    }

    pub fn row(&mut self, what: &str, values: &[String]) {
        println!("MEASURED {what}: {}", values.join(" | "));
        self.rows.push((what.to_owned(), values.to_vec()));
    }

    pub fn print(&self) {
        use std::fmt::Write as _;
        let width = self.rows.iter().map(|(w, _)| w.len()).max().unwrap_or(0);
        let mut s = format!("\n== {}\n", self.title);
        for (w, v) in &self.rows {
            let _ = writeln!(s, "| {w:<width$} | {} |", v.join(" | "));
        }
        println!("{s}");
    }
}

pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

// ---- clocks ----------------------------------------------------------------------------------

/// A start (an install's, a fault's) on the clocks events are stamped with: the test's, the
/// wall clock (container logs, pod status) and the kernel's boot clock (process start times).
pub struct Clocks {
    pub at: Instant,
    wall: Duration,
    boot: Duration,
}

impl Clocks {
    pub fn now() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        let boot = Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        );
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Clocks {
            at: Instant::now(),
            wall,
            boot,
        }
    }

    /// How long after the start process `pid` started (10 ms resolution).
    pub fn process_start(&self, pid: u32) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name (which may hold spaces), from field 3 on.
        let rest = &stat[stat.rfind(')')? + 2..];
        let ticks: u64 = rest.split_whitespace().nth(19)?.parse().ok()?;
        // SAFETY: sysconf has no preconditions.
        let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
        let started = Duration::from_millis(ticks * 1000 / hz.max(1));
        started.checked_sub(self.boot)
    }

    /// How long after the start a wall-clock RFC 3339 time in UTC (`…T14:10:00.123456789Z`)
    /// is; `None` for one before the start or unparsable.
    pub fn since_wall(&self, rfc3339: &str) -> Option<Duration> {
        let (date, time) = rfc3339.split_once('T')?;
        let days = days_from_civil(date)?;
        let time = time.trim_end_matches('Z');
        let time = time.split(['+', '-']).next()?;
        let mut hms = time.split(':');
        let (h, m, s): (u64, u64, f64) = (
            hms.next()?.parse().ok()?,
            hms.next()?.parse().ok()?,
            hms.next()?.parse().ok()?,
        );
        let at =
            Duration::from_secs(days * 86_400 + h * 3600 + m * 60) + Duration::from_secs_f64(s);
        at.checked_sub(self.wall)
    }
}

/// Days since 1970-01-01 of a `YYYY-MM-DD` date (proleptic Gregorian).
fn days_from_civil(date: &str) -> Option<u64> {
    let mut f = date.split('-');
    let (y, m, d): (i64, i64, i64) = (
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
    );
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    u64::try_from(era * 146_097 + doe - 719_468).ok()
}

// ---- the fenced register -----------------------------------------------------------------

/// One write a pod's command sent.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub at: Instant,
    pub pod: String,
    pub token: u64,
    /// The register took it: its token was at least the highest seen.
    pub accepted: bool,
}

/// An HTTP register on the node's address that accepts a write only if its fencing token is
/// at least the highest one it has seen (`GET /w?pod=NAME&token=N`). Every attempt is kept.
pub struct Register {
    pub port: u16,
    pub writes: Arc<Mutex<Vec<Attempt>>>,
}

impl Register {
    pub fn start(node: &Node) -> Self {
        let listener = node.listen();
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("{e}"))
            .port();
        let writes: Arc<Mutex<Vec<Attempt>>> = Arc::default();
        let w = writes.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let w = w.clone();
                std::thread::spawn(move || serve(conn, &w));
            }
        });
        Register { port, writes }
    }

    pub fn url(&self) -> String {
        format!("http://{NODE_IP}:{}/w", self.port)
    }

    pub fn snapshot(&self) -> Vec<Attempt> {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Writes since `since`.
    pub fn since(&self, since: Instant) -> Vec<Attempt> {
        self.snapshot()
            .into_iter()
            .filter(|w| w.at >= since)
            .collect()
    }

    /// The first accepted write after `since` from a pod other than `not` (any pod if
    /// `not` is empty).
    pub fn first_from_other(&self, since: Instant, not: &str) -> Option<Attempt> {
        self.since(since)
            .into_iter()
            .find(|w| w.accepted && w.pod != not)
    }

    /// The last write (accepted or not) from `pod`.
    pub fn last_from(&self, pod: &str) -> Option<Attempt> {
        self.snapshot().into_iter().rev().find(|w| w.pod == pod)
    }

    pub fn refused(&self) -> usize {
        self.snapshot().iter().filter(|w| !w.accepted).count()
    }

    /// The last accepted write: the current leader's pod and token.
    pub fn last_accepted(&self) -> Option<Attempt> {
        self.snapshot().into_iter().rev().find(|w| w.accepted)
    }

    /// The first write taken after `since` of a term later than `token` (a higher token).
    pub fn first_new_term(&self, since: Instant, token: u64) -> Option<Attempt> {
        self.since(since)
            .into_iter()
            .find(|w| w.accepted && w.token > token)
    }

    /// The pods whose writes the register accepted from 1.5 s ago until now, once `holder`
    /// has written in that time (waiting up to 10 s for it; without its write the list
    /// lacks it). A loaded machine can starve a pod's writer for longer than the window: in
    /// #42's tenth loaded run a command started 3–5 s before the check had not written in
    /// its last 1.5 s. Waiting for the holder's write keeps the check about who writes, not
    /// how promptly; any other pod accepted meanwhile is listed.
    pub fn writers_around(&self, holder: &str) -> Vec<String> {
        let since = Instant::now() - Duration::from_millis(1500);
        let patience = Instant::now() + Duration::from_secs(10);
        loop {
            let mut w: Vec<String> = self
                .since(since)
                .into_iter()
                .filter(|w| w.accepted)
                .map(|w| w.pod)
                .collect();
            w.sort();
            w.dedup();
            if w.iter().any(|p| p == holder) || Instant::now() >= patience {
                return w;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last `n` attempts, oldest first, for a failure's message.
    pub fn recent(&self, n: usize) -> String {
        let all = self.snapshot();
        let now = Instant::now();
        all[all.len().saturating_sub(n)..]
            .iter()
            .map(|w| {
                let age = now.saturating_duration_since(w.at);
                let took = if w.accepted { "accepted" } else { "refused" };
                format!("{} token {} {took} {age:?} ago", w.pod, w.token)
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The longest time between two accepted writes in `[from, to]` (the edges count: a
    /// stretch without a write at either end is a gap too).
    pub fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let mut at: Vec<Instant> = self
            .since(from)
            .into_iter()
            .filter(|w| w.accepted && w.at <= to)
            .map(|w| w.at)
            .collect();
        at.insert(0, from);
        at.push(to);
        at.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }

    /// Exactly one pod wrote from 1.5 s ago until it wrote again ([`writers_around`]),
    /// `holder` (the lock's, as `whose` names it: "the Lease's"); with `token`, its last write
    /// carried that token.
    ///
    /// [`writers_around`]: Self::writers_around
    // A failure names the caller's line: node_bad_input makes the same check before and after
    // its bad inputs, with the same message.
    #[track_caller]
    pub fn assert_sole_writer(&self, holder: &str, token: Option<u64>, whose: &str) {
        assert_eq!(
            self.writers_around(holder),
            vec![holder.to_owned()],
            "one writer, {whose} holder; the last writes: {}",
            self.recent(8)
        );
        if let Some(token) = token {
            let last = self.last_from(holder).unwrap_or_else(|| panic!("no write"));
            assert_eq!(
                last.token, token,
                "the command's TENURE_FENCING_TOKEN is {whose}"
            );
        }
    }
}

fn serve(mut conn: TcpStream, writes: &Mutex<Vec<Attempt>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    // Drain the headers.
    let mut h = String::new();
    while reader.read_line(&mut h).map(|n| n > 2).unwrap_or(false) {
        h.clear();
    }
    let at = Instant::now();
    let target = line.split_whitespace().nth(1).unwrap_or_default();
    let query: BTreeMap<&str, &str> = target
        .split_once('?')
        .map(|(_, q)| q)
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let (Some(pod), Some(token)) = (
        query.get("pod"),
        query.get("token").and_then(|t| t.parse::<u64>().ok()),
    ) else {
        let _ = conn.write_all(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        return;
    };
    let accepted = {
        let mut w = writes.lock().unwrap_or_else(|p| p.into_inner());
        let max = w
            .iter()
            .filter(|x| x.accepted)
            .map(|x| x.token)
            .max()
            .unwrap_or(0);
        let accepted = token >= max;
        w.push(Attempt {
            at,
            pod: (*pod).to_owned(),
            token,
            accepted,
        });
        accepted
    };
    let reply: &[u8] = if accepted {
        b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n"
    } else {
        b"HTTP/1.0 409 Conflict\r\nContent-Length: 6\r\n\r\nstale\n"
    };
    let _ = conn.write_all(reply);
    let mut rest = Vec::new();
    let _ = conn.take(0).read_to_end(&mut rest);
}

// ---- terms of a lock, watched ------------------------------------------------------------

/// A term as a watch of the lock saw it: its holder (empty: none) and fencing token, from the
/// instant it was first seen.
#[derive(Clone, Debug)]
pub struct TermEvent {
    pub at: Instant,
    pub holder: String,
    pub token: u64,
}

/// Every change of holder or token a watch of a lock saw ([`LeaseWatch`] for a Lease,
/// [`redis::RedisWatch`] for a Redis key), in order.
#[derive(Clone, Default)]
pub struct Terms(Arc<Mutex<Vec<TermEvent>>>);

impl Terms {
    pub fn snapshot(&self) -> Vec<TermEvent> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Keeps (`holder`, `token`), seen now, if it differs from the last one kept.
    pub fn record(&self, holder: String, token: u64) {
        let mut e = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if e.last()
            .is_none_or(|l| l.holder != holder || l.token != token)
        {
            e.push(TermEvent {
                at: Instant::now(),
                holder,
                token,
            });
        }
    }

    /// The last token seen (0 before any).
    pub fn last_token(&self) -> u64 {
        self.snapshot().last().map_or(0, |l| l.token)
    }

    /// The first time the lock named a holder other than `not` (non-empty) after `since`.
    pub fn granted_after(&self, since: Instant, not: &str) -> Option<TermEvent> {
        self.snapshot()
            .into_iter()
            .find(|e| e.at >= since && !e.holder.is_empty() && e.holder != not)
    }

    /// The lock's token at instant `at` (the last change seen before it).
    pub fn token_at(&self, at: Instant) -> u64 {
        self.snapshot()
            .into_iter()
            .rev()
            .find(|e| e.at <= at)
            .map(|e| e.token)
            .unwrap_or(0)
    }

    /// Every holder the lock named after `since`.
    pub fn holders_since(&self, since: Instant) -> Vec<String> {
        let mut h: Vec<String> = self
            .snapshot()
            .into_iter()
            .filter(|e| e.at >= since && !e.holder.is_empty())
            .map(|e| e.holder)
            .collect();
        h.dedup();
        h
    }
}

/// Writes the register accepted although the lock already named a later term when they
/// arrived: the stale writes a fence must prevent (goal: none).
pub fn accepted_stale(register: &Register, terms: &Terms) -> Vec<Attempt> {
    register
        .snapshot()
        .into_iter()
        .filter(|w| w.accepted && w.token < terms.token_at(w.at))
        .collect()
}

/// A takeover: when the successor was granted (the lock's watch), the old leader's last
/// write, the successor's first.
pub struct Takeover {
    pub granted: Instant,
    pub old_last: Option<Instant>,
    pub new_first: Instant,
    pub new_leader: String,
}

/// Waits up to `within` for an accepted write after `since` from a pod other than `old`, then
/// (5 s) for the watch's grant to a holder other than `old`.
pub fn takeover(
    register: &Register,
    terms: &Terms,
    since: Instant,
    old: &str,
    within: Duration,
) -> Takeover {
    let new = wait_for(within, "a write from a new leader", || {
        register.first_from_other(since, old)
    });
    let granted = wait_for(
        Duration::from_secs(5),
        "the grant on the lock's watch",
        || terms.granted_after(since, old),
    );
    Takeover {
        granted: granted.at,
        old_last: register.last_from(old).map(|w| w.at),
        new_first: new.at,
        new_leader: new.pod,
    }
}

// ---- kubectl watches -------------------------------------------------------------------------

/// `kubectl ARGS` (a `-w -o json` watch) in the background, started again whenever kubectl
/// exits (a watch the server ends, an object not there yet), every object it prints handed to
/// `each`, until dropped.
struct Follow {
    stop: Arc<AtomicBool>,
    pid: Arc<AtomicU32>,
}

impl Follow {
    fn start(node: &Node, args: Vec<String>, mut each: impl FnMut(Value) + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let pid = Arc::new(AtomicU32::new(0));
        let (st, pd) = (stop.clone(), pid.clone());
        let kubeconfig = node.kubeconfig();
        std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                let Ok(mut child) = Command::new(kubectl())
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(&args)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                else {
                    return;
                };
                pd.store(child.id(), Ordering::SeqCst);
                if let Some(stdout) = child.stdout.take() {
                    let stream = serde_json::Deserializer::from_reader(stdout).into_iter::<Value>();
                    for v in stream {
                        let Ok(v) = v else { break };
                        each(v);
                    }
                }
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Follow { stop, pid }
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let pid = self.pid.load(Ordering::SeqCst);
        if pid != 0 {
            // SAFETY: kill(2) on the kubectl this watch started (reaped by its thread).
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
}

/// `kubectl get lease -w` in the background: every term of the Lease (holder, `tenure.dev/fencing`
/// token) with its arrival time, until dropped.
pub struct LeaseWatch {
    terms: Terms,
    _kubectl: Follow,
}

impl LeaseWatch {
    pub fn start(node: &Node, ns: &str, lease: &str) -> Self {
        let terms = Terms::default();
        let t = terms.clone();
        let args = ["get", "lease", lease, "-n", ns, "-w", "-o", "json"]
            .map(str::to_owned)
            .to_vec();
        let kubectl = Follow::start(node, args, move |v| {
            let (holder, token) = lease_term(&v);
            t.record(holder, token);
        });
        LeaseWatch {
            terms,
            _kubectl: kubectl,
        }
    }
}

impl std::ops::Deref for LeaseWatch {
    type Target = Terms;

    fn deref(&self) -> &Terms {
        &self.terms
    }
}

/// (holder, `tenure.dev/fencing` token or 0) of a Lease object.
fn lease_term(v: &Value) -> (String, u64) {
    (
        v["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        v["metadata"]["annotations"]["tenure.dev/fencing"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0),
    )
}

/// (holder, `tenure.dev/fencing` token or 0) of the Lease as it is now (empty and 0 if there
/// is none).
pub fn lease(node: &Node, ns: &str, name: &str) -> (String, u64) {
    let out = run(
        node.kubectl()
            .args(["get", "lease", name, "-n", ns, "-o", "json"]),
        None,
    );
    if !out.ok {
        return (String::new(), 0);
    }
    lease_term(&serde_json::from_str(&out.stdout).unwrap_or_default())
}

/// One version of an object as `kubectl get -w` delivered it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub object: Value,
}

impl Seen {
    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.object["metadata"]["annotations"][key].as_str()
    }
}

/// `kubectl get KIND -n NS [-l SELECTOR] -w -o json` in the background: every distinct
/// version (by uid and resourceVersion) with its arrival time, until dropped.
pub struct Watch {
    seen: Arc<Mutex<Vec<Seen>>>,
    _kubectl: Follow,
}

impl Watch {
    pub fn start(node: &Node, ns: &str, kind: &str, selector: &str) -> Self {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let sn = seen.clone();
        let mut args = ["get", kind, "-n", ns, "-w", "-o", "json"]
            .map(str::to_owned)
            .to_vec();
        if !selector.is_empty() {
            args.extend(["-l".to_owned(), selector.to_owned()]);
        }
        let mut versions = BTreeSet::new();
        let kubectl = Follow::start(node, args, move |v| {
            let key = (
                v["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
                v["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
            if versions.insert(key) {
                sn.lock().unwrap_or_else(|p| p.into_inner()).push(Seen {
                    at: Instant::now(),
                    object: v,
                });
            }
        });
        Watch {
            seen,
            _kubectl: kubectl,
        }
    }

    pub fn snapshot(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

// ---- processes of the pods, as the host sees them -----------------------------------------

/// Pids of processes whose environment has `POD_NAME=<pod>`, with their command names.
pub fn pod_processes(pod: &str) -> Vec<(u32, String, Vec<String>)> {
    let want = format!("POD_NAME={pod}");
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if !env.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            continue;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim()
            .to_owned();
        let cmdline: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        out.push((pid, comm, cmdline));
    }
    out
}

/// The pid of `tenure run` in `pod` (the container's PID 1).
pub fn tenure_pid(pod: &str) -> Option<u32> {
    pod_processes(pod)
        .into_iter()
        .find(|(_, comm, cmd)| comm == "tenure" && cmd.get(1).is_some_and(|a| a == "run"))
        .map(|(pid, _, _)| pid)
}

/// The pids of the leader's command in `pod` (everything but tenure itself).
pub fn command_pids(pod: &str) -> Vec<u32> {
    pod_processes(pod)
        .into_iter()
        .filter(|(_, comm, _)| comm != "tenure")
        .map(|(pid, _, _)| pid)
        .collect()
}

/// Resident set size of a process in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `nft ARGS` (its rules on stdin with `input`) in the network namespace of `pid`: a pod's.
pub fn nft(pid: u32, args: &[&str], input: Option<&str>) -> String {
    run(
        Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-n", "--", "nft"])
            .args(args),
        input,
    )
    .expect_ok()
}

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid we looked up.
    let rc = unsafe { libc::kill(pid as i32, sig) };
    assert_eq!(rc, 0, "kill {pid}: {}", std::io::Error::last_os_error());
}

/// The pod's cgroup directory in the freezer hierarchy.
pub fn freezer_dir(node: &Node, uid: &str) -> PathBuf {
    let root = PathBuf::from("/sys/fs/cgroup/freezer").join(node.cgroup_root());
    let want = format!("pod{uid}");
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                if e.file_name().to_string_lossy() == want {
                    return e.path();
                }
                stack.push(e.path());
            }
        }
    }
    panic!("no freezer cgroup for pod {uid}")
}
