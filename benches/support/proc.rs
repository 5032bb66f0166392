//! Child processes: spawned ones (signals, waits, killed on drop), the event lines they print,
//! and what `/proc` says of a process.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant, SystemTime};

/// The elector flags of `tenure run` in the benches: lease 3 s, renew deadline 2 s, retry
/// period 500 ms (the CLI tests' `FAST`).
pub const FAST: [&str; 6] = [
    "--lease-duration",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "500ms",
];

/// A child process with a name for messages; killed and reaped on drop.
pub struct Process {
    pub identity: String,
    pub child: Child,
}

impl Process {
    pub fn new(identity: &str, child: Child) -> Self {
        Self {
            identity: identity.to_owned(),
            child,
        }
    }

    /// Starts `cmd` with stdin closed, stdout piped (returned, for [`read_events`]) and
    /// stderr to `stderr`; panics if it cannot.
    pub fn spawn(
        cmd: &mut Command,
        identity: &str,
        stderr: impl Into<Stdio>,
    ) -> (Self, ChildStdout) {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {identity}: {e}"));
        let stdout = child.stdout.take().expect("the child's stdout is piped");
        (Self::new(identity, child), stdout)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` directly (spawning kill(1) would add its start-up to what is timed); a
    /// failure is printed.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid fits pid_t");
        // SAFETY: a signal to our own child, not yet reaped (its pid cannot have been reused).
        let rc = unsafe { libc::kill(pid, sig) };
        if rc != 0 {
            let name = match sig {
                libc::SIGTERM => "TERM".to_owned(),
                libc::SIGKILL => "KILL".to_owned(),
                other => other.to_string(),
            };
            eprintln!(
                "kill -{name} {}: {}",
                self.identity,
                std::io::Error::last_os_error()
            );
        }
    }

    /// SIGTERM.
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Waits up to `within` for it to exit; after that kills it, and returns false.
    pub fn wait_exit(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }

    /// Resident set size, KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        rss_kib(self.pid())
    }

    /// User + system CPU time so far.
    pub fn cpu(&self) -> Option<Duration> {
        cpu_time(self.pid())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads a child's event lines on a thread of their own: each line whose last word is
/// wall-clock nanoseconds (see [`crate::support::role::emit`]) becomes `parse(the words
/// before it, that time)`, sent on `tx` unless `None`. At the end of `stdout` (the child is
/// gone), `at_end()` is sent, unless `None`; nothing more once the receiver is gone.
pub fn read_events<T: Send + 'static>(
    stdout: ChildStdout,
    tx: mpsc::Sender<T>,
    parse: impl Fn(&[&str], SystemTime) -> Option<T> + Send + 'static,
    at_end: impl FnOnce() -> Option<T> + Send + 'static,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut words: Vec<&str> = line.split_whitespace().collect();
            let Some(ns) = words.pop().and_then(|n| n.parse::<u64>().ok()) else {
                continue;
            };
            let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(ns);
            if let Some(event) = parse(&words, at)
                && tx.send(event).is_err()
            {
                return;
            }
        }
        if let Some(event) = at_end() {
            let _ = tx.send(event);
        }
    });
}

/// `/proc/PID/status`, empty if there is none.
pub fn status(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default()
}

/// The number of `field` (`VmRSS:`, `Threads:`) in a `/proc/PID/status` text.
pub fn status_field(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// A process's resident memory in KiB (VmRSS).
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_field(&status(pid), "VmRSS:")
}

/// The CPU time (user + system) a process has used, from `/proc/PID/stat`.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (in parentheses, which may hold spaces): utime and
    // stime, fields 14 and 15 of the line, are 11 and 12 after the state field.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|&h| h > 0)?;
    Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

/// The `tenure` binary to measure, found once: `$TENURE_BIN`, cargo's `CARGO_BIN_EXE_tenure`
/// (benches with the `cli` feature), the binary next to the bench's own, or built by cargo
/// into the bench's target directory.
pub fn tenure_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("TENURE_BIN") {
            return PathBuf::from(p);
        }
        if let Some(p) = option_env!("CARGO_BIN_EXE_tenure").map(PathBuf::from)
            && p.is_file()
        {
            return p;
        }
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
        // target/<profile>/deps/<bench>-HASH
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .unwrap_or_else(|| panic!("{} is not under target/<profile>/deps", exe.display()));
        let next_to_us = profile_dir.join("tenure");
        if next_to_us.is_file() {
            return next_to_us;
        }
        let target_dir = profile_dir
            .parent()
            .unwrap_or_else(|| panic!("no target dir above {}", profile_dir.display()));
        let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.args(["build", "--features", "cli", "--bin", "tenure"])
            .env("CARGO_TARGET_DIR", target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot run cargo build: {e}"));
        assert!(
            status.success() && next_to_us.is_file(),
            "cargo build failed"
        );
        next_to_us
    })
}
