//! The node tests' harness: a real single-node Kubernetes (`e2e/node`: apiserver,
//! controller-manager, scheduler, containerd, kubelet inside namespaces the launcher creates)
//! with the repository's images imported, helm and kubectl, a fenced register the pods write
//! to, and the processes of the pods as the host sees them.
//!
//! The suite runs only when `TENURE_NODE_TENURE_BIN` names the static musl `tenure` (what
//! `scripts/test.sh` sets after building it); otherwise every test prints why it skips.

#![allow(dead_code)]

pub mod peers;
pub mod redis;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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

// ---- the Lease, watched ------------------------------------------------------------------

/// A change of the Lease as the watch saw it.
#[derive(Clone, Debug)]
pub struct LeaseEvent {
    pub at: Instant,
    pub holder: String,
    pub token: u64,
}

/// `kubectl get lease -w` in the background: every version of the Lease with its arrival time.
/// kubectl is started again whenever it exits (a watch the server ends, a Lease not there
/// yet) until this is dropped.
pub struct LeaseWatch {
    pub events: Arc<Mutex<Vec<LeaseEvent>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    pid: Arc<std::sync::atomic::AtomicU32>,
}

impl LeaseWatch {
    pub fn start(node: &Node, ns: &str, lease: &str) -> Self {
        use std::sync::atomic::Ordering;
        let events: Arc<Mutex<Vec<LeaseEvent>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pid = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (ev, st, pd) = (events.clone(), stop.clone(), pid.clone());
        let kubeconfig = node.kubeconfig();
        let (ns, lease) = (ns.to_owned(), lease.to_owned());
        std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                let Ok(mut child) = Command::new(kubectl())
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(["get", "lease", &lease, "-n", &ns, "-w", "-o", "json"])
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
                        record(&ev, &v);
                    }
                }
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        LeaseWatch { events, stop, pid }
    }

    pub fn snapshot(&self) -> Vec<LeaseEvent> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The first time the Lease showed a holder other than `not` (non-empty) after `since`.
    pub fn granted_after(&self, since: Instant, not: &str) -> Option<LeaseEvent> {
        self.snapshot()
            .into_iter()
            .find(|e| e.at >= since && !e.holder.is_empty() && e.holder != not)
    }

    /// The Lease's token at instant `at` (the last event before it).
    pub fn token_at(&self, at: Instant) -> u64 {
        self.snapshot()
            .into_iter()
            .rev()
            .find(|e| e.at <= at)
            .map(|e| e.token)
            .unwrap_or(0)
    }
}

impl Drop for LeaseWatch {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::SeqCst);
        let pid = self.pid.load(Ordering::SeqCst);
        if pid != 0 {
            // SAFETY: kill(2) on the kubectl this watch started (reaped by its thread).
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
}

fn record(events: &Mutex<Vec<LeaseEvent>>, v: &Value) {
    let holder = v["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let token = v["metadata"]["annotations"]["tenure.dev/fencing"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let mut e = events.lock().unwrap_or_else(|p| p.into_inner());
    if e.last()
        .is_none_or(|l: &LeaseEvent| l.holder != holder || l.token != token)
    {
        e.push(LeaseEvent {
            at: Instant::now(),
            holder,
            token,
        });
    }
}

/// Writes the register accepted although the Lease already named a later term when they
/// arrived: the stale writes a fence must prevent (goal: none).
pub fn accepted_stale(register: &Register, watch: &LeaseWatch) -> Vec<Attempt> {
    register
        .snapshot()
        .into_iter()
        .filter(|w| w.accepted && w.token < watch.token_at(w.at))
        .collect()
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
