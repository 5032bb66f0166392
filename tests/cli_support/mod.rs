//! Drives the real `tenure` binary for the CLI tests: starts `tenure run` processes around a
//! small shell command that logs when it starts and ends (with its fencing token and pid),
//! and reads those logs back.

#![allow(dead_code)] // Each CLI test binary uses a different part of the harness.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The binary under test, built by cargo for the integration tests.
pub const TENURE: &str = env!("CARGO_BIN_EXE_tenure");

/// Short durations so the tests take seconds: lease 3 s, renew deadline 2 s, retry 500 ms.
pub const FAST: [&str; 6] = [
    "--lease-duration",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "500ms",
];

/// `tenure run --lease <lease> <backend…> <FAST> <extra…> -- <command…>`.
pub fn run_args(
    lease: &str,
    backend: &[&str],
    extra: &[&str],
    command: Vec<String>,
) -> Vec<String> {
    let mut args = strings(&["run", "--lease", lease]);
    args.extend(strings(backend));
    args.extend(strings(&FAST));
    args.extend(strings(extra));
    args.push("--".into());
    args.extend(command);
    args
}

/// Wall-clock nanoseconds, comparable with the times the workers log.
pub fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// `bash -c <body>` where `body` may call `log KIND [MORE]`: appends `KIND <token> <pid> <ns>
/// [MORE]` (token from `TENURE_FENCING_TOKEN`, pid of the calling (sub)shell, wall-clock time)
/// to `log` as one line in one write, the format [`events`] reads.
///
/// A line is written whole or not at all, however the command is stopped: the time is bash's
/// own clock (`$EPOCHREALTIME`, microseconds, logged as nanoseconds), not a `$(date +%s%N)`
/// child. tenure signals the whole process group, so such a child, still running while a copy
/// that was just started is stopped, died with the group, and a shell that traps the signal
/// logged its line with an empty time. With no child, nothing stops half-way; `echo` to a
/// line-buffered stream is one `write` of the whole line.
pub fn logging_shell(log: &Path, body: &str) -> Vec<String> {
    let function = format!(
        r#"log() {{ t=${{EPOCHREALTIME:?the worker log needs bash 5}}; echo "$1 $TENURE_FENCING_TOKEN $BASHPID ${{t//[!0-9]/}}000${{2:+ $2}}" >> {log}; }}"#,
        log = log.display(),
    );
    vec!["bash".into(), "-c".into(), format!("{function}\n{body}")]
}

/// A shell command that logs `start <token> <pid> <ns> <lease> <identity>` to `log`, writes its
/// pid to `<pidfile>`, works for `seconds` (a negative value: forever), then logs
/// `end <token> <pid> <ns>` and exits with `code`.
pub fn worker(log: &Path, pidfile: &Path, seconds: f64, code: i32) -> Vec<String> {
    let body = format!(
        r#"log start "$TENURE_LEASE $TENURE_IDENTITY"
echo $$ > {pid}.tmp && mv {pid}.tmp {pid}
if [ "{forever}" = 1 ]; then while :; do sleep 0.1; done; fi
sleep {seconds}
log end
exit {code}"#,
        pid = pidfile.display(),
        forever = u8::from(seconds < 0.0),
        seconds = seconds.max(0.0),
    );
    logging_shell(log, &body)
}

/// One line of a worker log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: String,
    pub token: u64,
    pub pid: u32,
    pub at_ns: u128,
    pub rest: String,
}

/// Reads a worker log (missing file: no events).
pub fn events(log: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(5, ' ');
            let mut next = || parts.next().unwrap_or_default().to_owned();
            let kind = next();
            let token = next()
                .parse()
                .unwrap_or_else(|e| panic!("bad token in {line:?}: {e}"));
            let pid = next()
                .parse()
                .unwrap_or_else(|e| panic!("bad pid in {line:?}: {e}"));
            let at_ns = next()
                .parse()
                .unwrap_or_else(|e| panic!("bad time in {line:?}: {e}"));
            Event {
                kind,
                token,
                pid,
                at_ns,
                rest: next(),
            }
        })
        .collect()
}

/// A running `tenure` process whose stderr goes to a file.
pub struct Tenure {
    pub child: Child,
    pub stderr: PathBuf,
}

impl Tenure {
    /// Starts `tenure <args…>` with extra environment variables.
    pub fn start(args: &[String], env: &[(&str, &str)], stderr: PathBuf) -> Self {
        Self::start_bin(Path::new(TENURE), args, env, stderr)
    }

    /// [`start`](Self::start) with the tenure binary at `bin` (a copy, for instance).
    pub fn start_bin(bin: &Path, args: &[String], env: &[(&str, &str)], stderr: PathBuf) -> Self {
        let err = std::fs::File::create(&stderr)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", stderr.display()));
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .env("TENURE_LOG", "info");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        Self { child, stderr }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.pid()).unwrap_or(0);
        assert!(pid > 1);
        // SAFETY: sending a signal to our own child process.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
    }

    /// Waits for exit, failing the test after `limit`.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "tenure did not exit within {limit:?}; stderr:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What tenure wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Tenure {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `tenure <args…>` to completion: (exit code, stdout, stderr).
pub fn run_to_end(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(TENURE);
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {TENURE}: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `tenure <args…>` with `stdin` as its input, like [`run_to_end`], but fails the test
/// (after killing tenure) if it has not exited within `limit`, and caps its address space at
/// 4 GiB, so a tenure that hangs or reads without bound fails the test instead of stalling it
/// or exhausting the machine's memory.
pub fn run_bounded(
    args: &[&str],
    env: &[(&str, &str)],
    stdin: &[u8],
    limit: Duration,
) -> (i32, String, String) {
    run_bounded_with(Command::new(TENURE).args(args), env, stdin, limit)
}

/// [`run_bounded`] for a prepared command (another program in front of tenure, say).
pub fn run_bounded_with(
    cmd: &mut Command,
    env: &[(&str, &str)],
    stdin: &[u8],
    limit: Duration,
) -> (i32, String, String) {
    use std::io::{Read as _, Write as _};
    use std::os::unix::process::CommandExt as _;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    // SAFETY: setrlimit is async-signal-safe and touches only the struct passed to it.
    unsafe {
        cmd.pre_exec(|| {
            let cap = libc::rlimit {
                rlim_cur: 4 << 30,
                rlim_max: 4 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &cap) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut input = child.stdin.take();
    let stdin = stdin.to_vec();
    std::thread::spawn(move || {
        if let Some(mut pipe) = input.take() {
            let _ = pipe.write_all(&stdin);
        }
    });
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let err = err.join().unwrap_or_default();
            panic!("{cmd:?} did not exit within {limit:?}; stderr:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.code().unwrap_or(-1),
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Polls `cond` every 20 ms until it holds, failing with `what` after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

/// The pid written to `pidfile` by [`worker`], once it exists.
pub fn read_pid(pidfile: &Path, limit: Duration) -> u32 {
    let mut pid = 0;
    wait_until(limit, &format!("{} to appear", pidfile.display()), || {
        pid = std::fs::read_to_string(pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        pid != 0
    });
    pid
}

/// Asserts that the `start`/`end` intervals in `events` never overlap and that tokens rise
/// from one command to the next. `deaths` gives the end time of commands that were killed
/// (pid → ns), which log no `end` line.
pub fn assert_one_at_a_time(events: &[Event], deaths: &[(u32, u128)]) {
    let mut intervals: Vec<(u128, u128, u64, u32)> = Vec::new();
    for e in events.iter().filter(|e| e.kind == "start") {
        let end = events
            .iter()
            .find(|x| x.kind == "end" && x.pid == e.pid)
            .map(|x| x.at_ns)
            .or_else(|| deaths.iter().find(|(p, _)| *p == e.pid).map(|(_, t)| *t))
            .unwrap_or_else(|| panic!("command {} has no end: {events:?}", e.pid));
        intervals.push((e.at_ns, end, e.token, e.pid));
    }
    intervals.sort_unstable();
    for pair in intervals.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(
            a.1 <= b.0,
            "commands {} and {} ran at the same time: {intervals:?}",
            a.3,
            b.3
        );
        assert!(b.2 > a.2, "token did not rise: {intervals:?}");
    }
}

/// `args` as owned strings.
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// A shell command for `tenure run --shards`: logs `start <token> <pid> <ns> <shard> <shards>
/// <lease> <identity>` to `log`, works until SIGTERM or SIGINT, then logs `term …`, takes `exit_after`
/// seconds (its grace), logs `end …` and exits 0. [`events`] reads the log; an event's `rest`
/// is `<shard> <shards> <lease> <identity>`. A copy stopped while it starts logs whole lines
/// (see [`logging_shell`]): its `start`, `term` and `end`, or nothing if the signal came
/// before its trap was set.
pub fn shard_worker(log: &Path, exit_after: f64) -> Vec<String> {
    let body = format!(
        r#"about="$TENURE_SHARD $TENURE_SHARDS $TENURE_LEASE $TENURE_IDENTITY"
trap 'log term "$about"; sleep {exit_after}; log end "$about"; exit 0' TERM INT
log start "$about"
while :; do sleep 0.1; done"#,
    );
    logging_shell(log, &body)
}

/// The shard of a [`shard_worker`] event.
pub fn shard_of(event: &Event) -> u32 {
    event
        .rest
        .split(' ')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no shard in {event:?}"))
}

/// The identity of a [`shard_worker`] event.
pub fn identity_of(event: &Event) -> &str {
    event.rest.rsplit(' ').next().unwrap_or_default()
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    let l =
        std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("no free port: {e}"));
    l.local_addr()
        .unwrap_or_else(|e| panic!("no local addr: {e}"))
        .port()
}

/// `GET path` on `127.0.0.1:port`: the status and body, or `None` if nothing answered.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}
