//! The real `tenure` binary on the local backend (the default): one command at a time,
//! takeover on exit and on `kill -9`, signals, exit codes, a frozen tenure, bad input,
//! `tenure status` and the probe endpoints; sharded workers (`--shards`): the split, a graceful
//! leave handing shards over, copies that exit, escaped daemons, bad counts.

mod cli_support;
#[path = "support/tempdir.rs"]
mod tempdir;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use cli_support::{
    Event, FAST, TENURE as TENURE_BIN, Tenure, alive, assert_one_at_a_time, events, identity_of,
    logging_shell, now_ns, read_pid, run_bounded, run_to_end, shard_of, shard_worker, strings,
    wait_until, worker,
};
use tempdir::TempDir;

/// A fresh directory for one test: the state directory and log files.
struct Scratch(TempDir);

impl Scratch {
    fn new(tag: &str) -> Self {
        Self(TempDir::new(&format!("cli-{tag}")))
    }
    fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.path().join(name)
    }
    fn state(&self) -> String {
        self.path("state").display().to_string()
    }
}

/// `tenure run --lease <lease> <FAST> <extra…> -- <command…>` on the local backend in `s`.
fn run_args(s: &Scratch, lease: &str, extra: &[&str], command: Vec<String>) -> Vec<String> {
    cli_support::run_args(lease, &["--state-dir", &s.state()], extra, command)
}

#[test]
fn the_second_run_waits_for_the_first_and_tokens_rise() {
    let s = Scratch::new("handoff");
    let log = s.path("log");
    // No --backend: the default local backend, with its warning.
    let start = |n: u32| {
        let mut args = strings(&["run", "--lease", "nightly"]);
        args.extend(strings(&FAST));
        args.push("--".into());
        args.extend(worker(&log, &s.path(&format!("pid{n}")), 1.5, 0));
        Tenure::start(
            &args,
            &[("TENURE_STATE_DIR", &s.state())],
            s.path(&format!("err{n}")),
        )
    };
    let mut first = start(1);
    read_pid(&s.path("pid1"), Duration::from_secs(10));
    let mut second = start(2);
    assert!(
        first.wait(Duration::from_secs(20)).success(),
        "{}",
        first.log()
    );
    assert!(
        second.wait(Duration::from_secs(20)).success(),
        "{}",
        second.log()
    );
    let ev = events(&log);
    assert_eq!(ev.iter().filter(|e| e.kind == "start").count(), 2, "{ev:?}");
    assert_one_at_a_time(&ev, &[]);
    for t in [&first, &second] {
        let log = t.log();
        assert!(log.contains("warning") && log.contains("NO mutual exclusion across hosts"));
    }
    // The first command's end released the lease; the second started without waiting for
    // the 3 s ttl.
    let end1 = ev
        .iter()
        .find(|e| e.kind == "end")
        .map(|e| e.at_ns)
        .unwrap_or(0);
    let start2 = ev
        .iter()
        .filter(|e| e.kind == "start")
        .nth(1)
        .map_or(0, |e| e.at_ns);
    let handoff = Duration::from_nanos(u64::try_from(start2 - end1).unwrap_or(u64::MAX));
    println!("hand-off from the first command's exit to the second's start: {handoff:?}");
    assert!(
        handoff < Duration::from_secs(3),
        "waited for the ttl: {handoff:?}"
    );
}

#[test]
fn kill_9_of_tenure_takes_its_command_and_the_other_replica_takes_over() {
    let s = Scratch::new("kill9");
    let log = s.path("log");
    let mut a = Tenure::start(
        &run_args(
            &s,
            "kill9",
            &["--identity", "a"],
            worker(&log, &s.path("pa"), -1.0, 0),
        ),
        &[],
        s.path("ea"),
    );
    let pid_a = read_pid(&s.path("pa"), Duration::from_secs(10));
    let mut b = Tenure::start(
        &run_args(
            &s,
            "kill9",
            &["--identity", "b"],
            worker(&log, &s.path("pb"), 0.5, 0),
        ),
        &[],
        s.path("eb"),
    );
    std::thread::sleep(Duration::from_millis(300));
    a.signal(libc::SIGKILL);
    a.wait(Duration::from_secs(5));
    wait_until(
        Duration::from_secs(5),
        "the command of a killed tenure to die",
        || !alive(pid_a),
    );
    let death = now_ns();
    assert!(b.wait(Duration::from_secs(20)).success(), "{}", b.log());
    let ev = events(&log);
    assert_one_at_a_time(&ev, &[(pid_a, death)]);
    let starts: Vec<_> = ev.iter().filter(|e| e.kind == "start").collect();
    assert_eq!(starts.len(), 2, "{ev:?}");
    assert!(
        starts[0].rest.ends_with(" a") && starts[1].rest.ends_with(" b"),
        "{ev:?}"
    );
}

#[test]
fn the_commands_exit_code_and_environment_are_passed_through() {
    let s = Scratch::new("codes");
    let cmd = |script: &str| strings(&["sh", "-c", script]);
    let code = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run_to_end(&refs, &[])
    };
    let (c, _, err) = code(run_args(&s, "codes", &[], cmd("exit 7")));
    assert_eq!(c, 7, "{err}");
    let (c, _, err) = code(run_args(&s, "codes", &[], cmd("kill -KILL $$")));
    assert_eq!(c, 137, "{err}");
    let (c, out, err) = code(run_args(
        &s,
        "codes",
        &["--identity", "me"],
        cmd("echo \"$TENURE_LEASE/$TENURE_IDENTITY/$TENURE_FENCING_TOKEN\""),
    ));
    assert_eq!(c, 0, "{err}");
    let fields: Vec<&str> = out.trim().split('/').collect();
    assert_eq!(fields[..2], ["codes", "me"], "{out}");
    assert!(fields[2].parse::<u64>().is_ok_and(|t| t > 0), "{out}");
    let (c, _, err) = code(run_args(&s, "codes", &[], strings(&["/nonexistent/cmd"])));
    assert_eq!(c, 127, "{err}");
    assert!(err.contains("cannot run \"/nonexistent/cmd\""), "{err}");
}

#[test]
fn sigterm_is_forwarded_to_the_command_and_its_exit_code_returned() {
    let s = Scratch::new("sigterm");
    let script = format!(
        "trap 'echo got-term > {}; exit 42' TERM; echo $$ > {}; while :; do sleep 0.1; done",
        s.path("trapped").display(),
        s.path("pid").display()
    );
    let mut t = Tenure::start(
        &run_args(&s, "term", &[], strings(&["sh", "-c", &script])),
        &[],
        s.path("err"),
    );
    read_pid(&s.path("pid"), Duration::from_secs(10));
    t.signal(libc::SIGTERM);
    let status = t.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(42), "{}", t.log());
    assert!(s.path("trapped").exists());
    // Released on the way out: nobody holds it now.
    let (c, out, err) = run_to_end(
        &[
            "status",
            "--lease",
            "term",
            "--state-dir",
            &s.state(),
            "-o",
            "json",
        ],
        &[],
    );
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("\"held\":false"), "{out}");
}

/// Starts tenure with `--grace <grace>` on a command that ignores SIGINT and SIGTERM; returns
/// tenure and the command's pid once it runs.
fn start_stubborn(s: &Scratch, lease: &str, grace: &str) -> (Tenure, u32) {
    let script = format!(
        "trap '' INT TERM; echo $$ > {}; while :; do sleep 0.1; done",
        s.path("pid").display()
    );
    let t = Tenure::start(
        &run_args(
            s,
            lease,
            &["--grace", grace],
            strings(&["sh", "-c", &script]),
        ),
        &[],
        s.path("err"),
    );
    let pid = read_pid(&s.path("pid"), Duration::from_secs(10));
    (t, pid)
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let s = Scratch::new("grace");
    let (mut t, pid) = start_stubborn(&s, "grace", "1s");
    let sent = Instant::now();
    t.signal(libc::SIGINT);
    let status = t.wait(Duration::from_secs(10));
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(137), "{}", t.log());
    assert!(!alive(pid));
    assert!(
        took >= Duration::from_millis(900),
        "killed before the grace period: {took:?}"
    );
}

#[test]
fn a_second_signal_kills_the_command_without_waiting_for_the_grace_period() {
    let s = Scratch::new("hurry");
    let (mut t, pid) = start_stubborn(&s, "hurry", "60s");
    let sent = Instant::now();
    t.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        alive(pid),
        "the first signal alone must leave the grace period running"
    );
    t.signal(libc::SIGTERM);
    let status = t.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(137), "{}", t.log());
    assert!(!alive(pid));
    assert!(
        sent.elapsed() < Duration::from_secs(30),
        "waited for the grace period"
    );
}

/// The children of `pid` (all its threads), from /proc.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|l| {
            l.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Whether `pid` is a zombie.
fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[test]
fn as_pid_1_tenure_reaps_the_orphans_its_command_leaves() {
    let s = Scratch::new("pid1");
    // The command starts a background process from a shell that exits at once: the orphan
    // is adopted by PID 1 (tenure, as in a container) and exits 200 ms later.
    let script = format!(
        "sh -c 'sleep 0.2 &'; echo $$ > {}; sleep 30",
        s.path("pid").display()
    );
    let mut args = strings(&["--pid", "--fork", "--mount-proc", TENURE_BIN]);
    args.extend(run_args(&s, "pid1", &[], strings(&["sh", "-c", &script])));
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(&args)
        .stdin(std::process::Stdio::null())
        .stderr(std::fs::File::create(s.path("err")).unwrap_or_else(|e| panic!("{e}")));
    let mut unshare = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run unshare (util-linux; needs root): {e}"));
    read_pid(&s.path("pid"), Duration::from_secs(10));
    let tenure = children_of(unshare.id());
    assert_eq!(
        tenure.len(),
        1,
        "unshare should have one child, tenure as PID 1"
    );
    let tenure = tenure[0];
    std::thread::sleep(Duration::from_millis(1500));
    let kids = children_of(tenure);
    let zombies: Vec<u32> = kids.iter().copied().filter(|&k| zombie(k)).collect();
    let _ = unshare.kill();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &tenure.to_string()])
        .status();
    let _ = unshare.wait();
    assert!(
        kids.len() >= 2,
        "tenure's children: {kids:?} (the command and its watchdog)"
    );
    assert!(
        zombies.is_empty(),
        "zombies under tenure (PID 1): {zombies:?}"
    );
}

#[test]
fn processes_that_escape_the_process_group_do_not_outlive_the_term() {
    let s = Scratch::new("escape");
    // A daemon in its own session (out of the command's process group), then the command
    // exits: the term is over, so the daemon must be gone too.
    let script = format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 100' </dev/null >/dev/null 2>&1 & sleep 0.5; exit 0",
        s.path("escaped").display()
    );
    let started = Instant::now();
    let (code, _, err) = run_to_end(
        &run_args(&s, "escape", &[], strings(&["sh", "-c", &script]))
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "tenure waited for the daemon"
    );
    let escaped = read_pid(&s.path("escaped"), Duration::from_secs(5));
    wait_until(
        Duration::from_secs(5),
        "the escaped daemon to be killed",
        || !alive(escaped),
    );
}

#[test]
fn a_frozen_tenure_cannot_leave_its_command_running_into_the_next_term() {
    let s = Scratch::new("frozen");
    let log = s.path("log");
    let mut a = Tenure::start(
        &run_args(
            &s,
            "frozen",
            &["--identity", "a"],
            worker(&log, &s.path("pa"), -1.0, 0),
        ),
        &[],
        s.path("ea"),
    );
    let pid_a = read_pid(&s.path("pa"), Duration::from_secs(10));
    let b = Tenure::start(
        &run_args(
            &s,
            "frozen",
            &["--identity", "b"],
            worker(&log, &s.path("pb"), -1.0, 0),
        ),
        &[],
        s.path("eb"),
    );
    // Only tenure is frozen: its command, in its own process group, keeps running until the
    // watchdog process (in the command's group) sees the lease's validity run out.
    a.signal(libc::SIGSTOP);
    wait_until(
        Duration::from_secs(10),
        "a's command to be killed while a is frozen",
        || !alive(pid_a),
    );
    let a_gone = now_ns();
    let pid_b = read_pid(&s.path("pb"), Duration::from_secs(15));
    let ev = events(&log);
    let start_b = ev.iter().find(|e| e.pid == pid_b).map_or(0, |e| e.at_ns);
    assert!(
        a_gone <= start_b,
        "a's command ran into b's term: gone at {a_gone}, b started at {start_b}"
    );
    assert_one_at_a_time(&ev, &[(pid_a, a_gone), (pid_b, u128::MAX)]);
    // Resumed, a finds its term over: exit code 3, and b is undisturbed.
    a.signal(libc::SIGCONT);
    let status = a.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(3), "{}", a.log());
    assert!(a.log().contains("lost"), "{}", a.log());
    assert!(alive(pid_b), "b's command must not be disturbed");
    drop(b);
}

#[test]
fn bad_input_ends_with_one_clear_line_and_a_documented_code() {
    let s = Scratch::new("bad");
    let state = s.state();
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["run", "--lease", "a/b", "--state-dir", &state, "--", "true"],
            2,
            "lease",
        ),
        (
            vec![
                "run",
                "--lease",
                "x",
                "--state-dir",
                &state,
                "--fence",
                "--",
                "true",
            ],
            2,
            "--fence needs --backend kube",
        ),
        (
            vec![
                "run",
                "--lease",
                "x",
                "--state-dir",
                &state,
                "--lease-duration",
                "3s",
                "--renew-deadline",
                "5s",
                "--retry-period",
                "1s",
                "--",
                "true",
            ],
            2,
            "--renew-deadline (5s) must be shorter than --lease-duration (3s)",
        ),
        (
            vec![
                "run",
                "--lease",
                "x",
                "--backend",
                "ftp://u:hunter2@h",
                "--",
                "true",
            ],
            2,
            "expected local, kube",
        ),
        (
            vec![
                "run",
                "--lease",
                "x",
                "--backend",
                "redis://127.0.0.1:1",
                "--",
                "true",
            ],
            4,
            "redis",
        ),
        (
            vec![
                "run",
                "--lease",
                "x",
                "--state-dir",
                "/proc/version/x",
                "--",
                "true",
            ],
            4,
            "/proc/version/x",
        ),
    ];
    for (args, code, needle) in cases {
        let (c, _, err) = run_to_end(&args, &[]);
        assert_eq!(c, code, "{args:?}: {err}");
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("tenure: ") && !l.starts_with("tenure: warning:"))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "{args:?} should print one error line: {err}"
        );
        assert!(lines[0].contains(needle), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("hunter2"),
            "{err}"
        );
    }
    // clap's own usage errors also exit 2.
    let (c, _, err) = run_to_end(&["run", "--lease", "x", "--grace", "5", "--", "true"], &[]);
    assert_eq!(c, 2, "{err}");
    assert!(err.contains("no unit"), "{err}");
    let (c, _, err) = run_to_end(
        &["run", "--lease", "x", "--lease-duration=-1s", "--", "true"],
        &[],
    );
    assert_eq!(c, 2, "{err}");
    assert!(
        err.contains("\"-1s\" is negative") && err.contains("--lease-duration"),
        "{err}"
    );
}

/// Durations are written as kubectl writes them (`1m30s`, `2.5s`) and compared by value.
#[test]
fn compound_durations_are_taken_and_compared_by_value() {
    let s = Scratch::new("durations");
    let state = s.state();
    let run = |lease: &str, renew: &str| {
        let lease = format!("--lease-duration={lease}");
        let renew = format!("--renew-deadline={renew}");
        run_bounded(
            &[
                "run",
                "--lease",
                "durations",
                "--state-dir",
                &state,
                &lease,
                &renew,
                "--retry-period=2.5s",
                "--",
                "sh",
                "-c",
                "exit 5",
            ],
            &[],
            b"",
            Duration::from_secs(20),
        )
    };
    // 1m30s > 61s: a parser that stopped at the first component (1m) would refuse this.
    let (c, _, err) = run("1m30s", "61s");
    assert_eq!(c, 5, "the command should have run: {err}");
    let (c, _, err) = run("1m", "1m30s");
    assert_eq!(c, 2, "{err}");
    assert!(
        error_line(&err)
            .contains("--renew-deadline (90s) must be shorter than --lease-duration (60s)"),
        "{err}"
    );
}

#[test]
fn status_shows_the_holder_and_its_token() {
    let s = Scratch::new("status");
    let log = s.path("log");
    let _t = Tenure::start(
        &run_args(
            &s,
            "shown",
            &["--identity", "holder-1"],
            worker(&log, &s.path("p"), -1.0, 0),
        ),
        &[],
        s.path("err"),
    );
    read_pid(&s.path("p"), Duration::from_secs(10));
    let token = events(&log)[0].token.to_string();
    let (c, out, err) = run_to_end(
        &["status", "--lease", "shown", "--state-dir", &s.state()],
        &[],
    );
    assert_eq!(c, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("LEASE") && lines[0].contains("FENCING TOKEN"),
        "{out}"
    );
    assert!(
        lines[1].contains("holder-1") && lines[1].contains(&token),
        "{out}"
    );
    let (c, out, err) = run_to_end(
        &[
            "status",
            "--lease",
            "shown",
            "--state-dir",
            &s.state(),
            "--output",
            "json",
        ],
        &[],
    );
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("\"holder\":\"holder-1\""), "{out}");
    assert!(out.contains(&format!("\"fencingToken\":{token}")), "{out}");
}

/// A plain HTTP GET on loopback: (status line, body).
fn get(addr: &str, path: &str) -> (String, String) {
    let mut conn = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    // One request per connection: the endpoint keeps connections alive otherwise.
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut response = String::new();
    conn.read_to_string(&mut response)
        .unwrap_or_else(|e| panic!("{e}"));
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

#[test]
fn listen_serves_metrics_and_probes() {
    let s = Scratch::new("listen");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = format!("127.0.0.1:{port}");
    let _t = Tenure::start(
        &run_args(
            &s,
            "probed",
            &["--listen", &addr],
            worker(&s.path("log"), &s.path("p"), -1.0, 0),
        ),
        &[],
        s.path("err"),
    );
    read_pid(&s.path("p"), Duration::from_secs(10));
    let (status, body) = get(&addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    assert!(
        body.lines()
            .any(|l| l.starts_with("leader_election_master_status{")
                && l.contains("probed")
                && l.ends_with(" 1")),
        "{body}"
    );
    assert!(get(&addr, "/healthz").0.contains("200"));
    let (status, body) = get(&addr, "/readyz");
    assert!(
        status.contains("200") && body.contains("leading"),
        "{status} {body}"
    );
    assert!(get(&addr, "/nope").0.contains("404"));
}

#[test]
fn crd_prints_the_election_definition() {
    let (c, out, err) = run_to_end(&["crd"], &[]);
    assert_eq!(c, 0, "{err}");
    let committed =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/election.yaml"))
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out, committed);
}

/// The one `tenure: …` error line of `stderr` (warnings aside), failing the test otherwise.
fn error_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("tenure: ") && !l.starts_with("tenure: warning:"))
        .collect();
    assert_eq!(lines.len(), 1, "expected one error line: {stderr}");
    lines[0]
}

#[test]
fn an_identity_over_the_limit_is_refused_and_the_lease_stays_usable() {
    let s = Scratch::new("identity");
    let state = s.state();
    let run = |extra: &[&str], env: &[(&str, &str)], script: &str| {
        let args = run_args(&s, "ident", extra, strings(&["sh", "-c", script]));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run_bounded(&refs, env, b"", Duration::from_secs(20))
    };
    // 64 KiB and more: the local record could not be read back. Refused before anything is
    // written, naming the flag and the limit, without echoing the identity.
    let huge = "x".repeat(70_000);
    let (c, _, err) = run(&["--identity", &huge], &[], "exit 0");
    assert_eq!(c, 2, "{err}");
    let line = error_line(&err);
    assert!(
        line.contains("--identity") && line.contains("253"),
        "{line}"
    );
    assert!(
        line.len() < 500,
        "the identity was echoed: {} bytes",
        line.len()
    );
    // Just over the limit, from $POD_NAME: the error names the variable.
    let (c, _, err) = run(&[], &[("POD_NAME", &"p".repeat(254))], "exit 0");
    assert_eq!(c, 2, "{err}");
    assert!(error_line(&err).contains("$POD_NAME"), "{err}");
    // At the limit: accepted.
    let (c, out, err) = run(
        &["--identity", &"y".repeat(253)],
        &[],
        "echo \"$TENURE_IDENTITY\"",
    );
    assert_eq!((c, out.trim().len()), (0, 253), "{err}");
    // A host name too long for the default `<hostname>-<pid>` is shortened to fit.
    let (c, out, err) = run(
        &[],
        &[("POD_NAME", ""), ("HOSTNAME", &"h".repeat(300))],
        "echo \"$TENURE_IDENTITY\"",
    );
    assert_eq!(c, 0, "{err}");
    let id = out.trim();
    assert!(id.len() <= 253 && id.starts_with("hhh"), "{id}");
    let pid = id.rsplit_once('-').map_or("", |(_, p)| p);
    assert!(pid.parse::<u32>().is_ok(), "no pid at the end of {id:?}");
    // Nothing the runs above did left the lease unreadable.
    let (c, out, err) = run_bounded(
        &["status", "--lease", "ident", "--state-dir", &state],
        &[],
        b"",
        Duration::from_secs(20),
    );
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("<none>"), "{out}");
}

#[test]
fn redis_credential_files_are_read_with_a_bound() {
    // Read before connecting, so no server is needed: /dev/zero never ends.
    let started = Instant::now();
    for (url, flag, limit) in [
        ("redis://127.0.0.1:1", "--redis-password-file", "4096 bytes"),
        ("rediss://127.0.0.1:1", "--redis-ca-file", "1048576 bytes"),
    ] {
        let (c, _, err) = run_bounded(
            &[
                "status",
                "--lease",
                "x",
                "--backend",
                url,
                flag,
                "/dev/zero",
            ],
            &[],
            b"",
            Duration::from_secs(20),
        );
        assert_eq!(c, 2, "{flag}: {err}");
        let line = error_line(&err);
        assert!(
            line.contains(&format!("{flag} /dev/zero")) && line.contains(limit),
            "{line}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn install_replaces_a_symlink_instead_of_writing_through_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let s = Scratch::new("install");
    let dir = s.path("bin");
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    let victim = s.path("victim");
    std::fs::write(&victim, b"precious").unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600))
        .unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(&victim, dir.join("tenure")).unwrap_or_else(|e| panic!("{e}"));
    let dir_arg = dir.display().to_string();
    let (c, out, err) = run_bounded(&["install", &dir_arg], &[], b"", Duration::from_secs(20));
    assert_eq!(c, 0, "{err}");
    assert_eq!(out.trim(), dir.join("tenure").display().to_string());
    let victim_now = std::fs::read(&victim).unwrap_or_default();
    assert!(
        victim_now == b"precious",
        "install wrote through the symlink ({} bytes now)",
        victim_now.len()
    );
    let meta = std::fs::metadata(&victim).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o600,
        "victim's mode changed"
    );
    let installed = std::fs::symlink_metadata(dir.join("tenure")).unwrap_or_else(|e| panic!("{e}"));
    assert!(installed.file_type().is_file(), "{installed:?}");
    assert_eq!(installed.permissions().mode() & 0o7777, 0o755);
    let copied = std::fs::read(dir.join("tenure")).unwrap_or_default();
    let original = std::fs::read(TENURE_BIN).unwrap_or_else(|e| panic!("{e}"));
    assert!(copied == original, "the installed file is not tenure");
    // No temporary file is left behind, and a second install (over a regular file) works.
    let (c, _, err) = run_bounded(&["install", &dir_arg], &[], b"", Duration::from_secs(20));
    assert_eq!(c, 0, "{err}");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{e}"))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["tenure"]);
}

#[test]
fn error_lines_escape_control_characters() {
    // A path (or any text) with ESC and a newline reaches the error line escaped: one line,
    // no terminal escape sequence.
    let (c, out, err) = run_bounded(
        &[
            "status",
            "--lease",
            "x",
            "--state-dir",
            "/proc/version/\x1b[31mred\nfake line",
        ],
        &[],
        b"",
        Duration::from_secs(20),
    );
    assert_eq!(c, 4, "{err}");
    assert!(!err.contains('\x1b') && !out.contains('\x1b'), "{err:?}");
    let line = error_line(&err);
    assert!(line.contains("\\u{1b}[31mred\\nfake line"), "{line}");
}

#[test]
fn a_fifo_in_place_of_the_record_fails_fast_instead_of_hanging() {
    let s = Scratch::new("fifo");
    let state = s.state();
    // Create the state directory (with its checks) by running once.
    let (c, _, err) = run_bounded(
        &run_args(&s, "piped", &[], strings(&["true"]))
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        &[],
        b"",
        Duration::from_secs(20),
    );
    assert_eq!(c, 0, "{err}");
    let record = s.path("state/piped.lease");
    std::fs::remove_file(&record).unwrap_or_else(|e| panic!("{e}"));
    let status = std::process::Command::new("mkfifo")
        .arg(&record)
        .status()
        .unwrap_or_else(|e| panic!("mkfifo: {e}"));
    assert!(status.success());
    let record = record.display().to_string();
    let started = Instant::now();
    let (c, _, err) = run_bounded(
        &["status", "--lease", "piped", "--state-dir", &state],
        &[],
        b"",
        Duration::from_secs(10),
    );
    assert_eq!(c, 4, "{err}");
    let line = error_line(&err);
    assert!(
        line.contains(&record) && line.contains("not a regular file"),
        "{line}"
    );
    let args = run_args(&s, "piped", &[], strings(&["true"]));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (c, _, err) = run_bounded(&refs, &[], b"", Duration::from_secs(10));
    assert_eq!(c, 4, "{err}");
    let line = error_line(&err);
    assert!(
        line.contains(&record) && line.contains("not a regular file"),
        "{line}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
}

/// `tenure run --shards` args on the local backend in `s`.
fn shard_args(
    s: &Scratch,
    lease: &str,
    shards: &str,
    id: &str,
    command: Vec<String>,
) -> Vec<String> {
    run_args(s, lease, &["--shards", shards, "--identity", id], command)
}

/// The copies running now, by shard: their `start` event, for starts without an `end`.
fn running(ev: &[Event]) -> BTreeMap<u32, Event> {
    let mut out = BTreeMap::new();
    for e in ev.iter().filter(|e| e.kind == "start") {
        if !ev.iter().any(|x| x.kind == "end" && x.pid == e.pid) {
            out.insert(shard_of(e), e.clone());
        }
    }
    out
}

/// Per shard: one copy at a time, each ended before the next started, tokens rising.
fn assert_one_copy_per_shard_at_a_time(ev: &[Event]) {
    let shards: BTreeSet<u32> = ev.iter().map(shard_of).collect();
    for shard in shards {
        let mut starts: Vec<&Event> = ev
            .iter()
            .filter(|e| e.kind == "start" && shard_of(e) == shard)
            .collect();
        starts.sort_by_key(|e| e.at_ns);
        for pair in starts.windows(2) {
            let end = ev
                .iter()
                .find(|x| x.kind == "end" && x.pid == pair[0].pid)
                .unwrap_or_else(|| panic!("shard {shard}: {:?} has no end: {ev:?}", pair[0]));
            assert!(
                end.at_ns <= pair[1].at_ns,
                "shard {shard}: two copies at once: {ev:?}"
            );
            assert!(
                pair[1].token > pair[0].token,
                "shard {shard}: token did not rise: {ev:?}"
            );
        }
    }
}

/// How many of `running` copies each identity runs.
fn per_identity(running: &BTreeMap<u32, Event>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in running.values() {
        *out.entry(identity_of(e).to_owned()).or_insert(0) += 1;
    }
    out
}

#[test]
fn sharded_replicas_split_the_shards_and_a_leaver_hands_its_own_over_gracefully() {
    let s = Scratch::new("shards");
    let log = s.path("log");
    let start = |id: &str| {
        Tenure::start(
            &shard_args(&s, "mail", "4", id, shard_worker(&log, 0.5)),
            &[],
            s.path(&format!("err-{id}")),
        )
    };
    let mut a = start("a");
    wait_until(Duration::from_secs(15), "a to run a copy per shard", || {
        running(&events(&log)).len() == 4
    });
    let mut b = start("b");
    wait_until(
        Duration::from_secs(20),
        "the shards to be split 2 + 2",
        || {
            let r = running(&events(&log));
            r.len() == 4 && per_identity(&r) == [("a".into(), 2), ("b".into(), 2)].into()
        },
    );
    // Each copy knows its shard, the count and its shard's lease.
    for (shard, e) in running(&events(&log)) {
        let rest: Vec<&str> = e.rest.split(' ').collect();
        assert_eq!(
            rest[..3],
            [shard.to_string(), "4".into(), format!("mail-{shard}")],
            "{e:?}"
        );
    }
    let of_a: Vec<u32> = running(&events(&log))
        .into_iter()
        .filter(|(_, e)| identity_of(e) == "a")
        .map(|(shard, _)| shard)
        .collect();

    // SIGTERM to a: its copies get their grace, its shards move to b, a exits 0.
    a.signal(libc::SIGTERM);
    let status = a.wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", a.log());
    wait_until(Duration::from_secs(10), "b to run every shard", || {
        let r = running(&events(&log));
        r.len() == 4 && per_identity(&r) == [("b".into(), 4)].into()
    });
    let ev = events(&log);
    assert_one_copy_per_shard_at_a_time(&ev);
    for shard in &of_a {
        let copy = |kind: &str, id: &str| {
            ev.iter()
                .filter(|e| e.kind == kind && shard_of(e) == *shard && identity_of(e) == id)
                .map(|e| e.at_ns)
                .next_back()
                .unwrap_or_else(|| panic!("no {kind} of shard {shard} on {id}: {ev:?}"))
        };
        let (term, end) = (copy("term", "a"), copy("end", "a"));
        assert!(
            end - term >= 400_000_000,
            "shard {shard}: a's copy was not given its grace: {ev:?}"
        );
        let handoff = Duration::from_nanos(
            u64::try_from(copy("start", "b").saturating_sub(end)).unwrap_or(u64::MAX),
        );
        println!("shard {shard}: a's copy ended → b's copy started: {handoff:?}");
        assert!(
            handoff < Duration::from_secs(3),
            "shard {shard} waited for the ttl: {handoff:?}"
        );
    }

    // status --shards: b holds every shard, with the token its copy got; b is the only member.
    // b announces the shards it holds as soon as they change, but in a write of its own that
    // can land after its copies started (their logs are what the wait above saw): poll until
    // the membership shows all four.
    let state = s.state();
    let mail_status = |extra: &[&str]| {
        let mut args = vec!["status", "--lease", "mail", "--shards", "4"];
        args.extend(["--state-dir", &state]);
        args.extend(extra);
        run_to_end(&args, &[])
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let out = loop {
        let (c, out, err) = mail_status(&[]);
        assert_eq!(c, 0, "{err}");
        if out
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["b", "4", "0,1,2,3"])
        {
            break out;
        }
        assert!(
            Instant::now() < deadline,
            "b's membership never showed all four shards:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let r = running(&events(&log));
    for (shard, e) in &r {
        let row = out
            .lines()
            .find(|l| l.starts_with(&format!("{shard} ")))
            .unwrap_or_else(|| panic!("no row for shard {shard}: {out}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells[..4],
            [
                shard.to_string(),
                format!("mail-{shard}"),
                "b".into(),
                e.token.to_string()
            ],
            "{out}"
        );
    }
    assert!(
        out.contains("GROUP RECORD: 4 shards (generation 1)"),
        "{out}"
    );

    b.signal(libc::SIGINT);
    let status = b.wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", b.log());
    assert!(running(&events(&log)).is_empty(), "{:?}", events(&log));
    let (c, out, err) = mail_status(&["-o", "json"]);
    assert_eq!(c, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let leases = v["shardLeases"].as_array().map_or(0, Vec::len);
    assert_eq!(leases, 4, "{out}");
    assert!(
        (0..4).all(|i| v["shardLeases"][i]["held"] == false),
        "released on the way out: {out}"
    );
    assert_eq!(v["members"], serde_json::json!([]), "{out}");
}

/// Whether process `pid` has a handler for `signal` (`SigCgt` in /proc/PID/status).
fn catches(pid: u32, signal: libc::c_int) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| mask >> (signal - 1) & 1 == 1)
}

/// A copy that tenure stops while it starts (its group was still settling) is an expected
/// event, never a broken log: the worker writes whole lines only. A `date` on `PATH` that takes
/// two seconds holds a worker that asks `date` for its start time in that state long enough to
/// signal its process group there, as tenure does; the copy still logs its `start` (unless the
/// signal came first), then `term` and `end`, each a whole line with its token, pid, shard and
/// a time between launch and exit.
#[test]
fn a_shard_copy_stopped_while_it_starts_logs_whole_lines() {
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;
    let s = Scratch::new("stopped-at-start");
    let bin = s.path("bin");
    std::fs::create_dir(&bin).unwrap_or_else(|e| panic!("{e}"));
    let date = bin.join("date");
    std::fs::write(&date, "#!/bin/sh\nsleep 2\nexec /bin/date \"$@\"\n")
        .and_then(|()| std::fs::set_permissions(&date, std::fs::Permissions::from_mode(0o755)))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", date.display()));
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = s.path("log");
    let command = shard_worker(&log, 0.0);
    let launched = now_ns();
    let mut copy = std::process::Command::new(&command[0])
        .args(&command[1..])
        .env("PATH", path)
        .envs([
            ("TENURE_FENCING_TOKEN", "41"),
            ("TENURE_SHARD", "2"),
            ("TENURE_SHARDS", "4"),
            ("TENURE_LEASE", "crawl-2"),
            ("TENURE_IDENTITY", "a"),
        ])
        .stderr(std::fs::File::create(s.path("err")).unwrap_or_else(|e| panic!("stderr file: {e}")))
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    let pid = copy.id();
    // Signalled before its trap is set, the copy would just die, logging nothing.
    wait_until(Duration::from_secs(10), "the copy to trap SIGTERM", || {
        catches(pid, libc::SIGTERM)
    });
    // Past its trap, it starts: well inside a slow `date` called there.
    std::thread::sleep(Duration::from_millis(300));
    let group = libc::pid_t::try_from(pid).unwrap_or(0);
    assert!(group > 1);
    // SAFETY: killpg only sends a signal, to the process group of our own child.
    assert_eq!(unsafe { libc::killpg(group, libc::SIGTERM) }, 0);
    wait_until(Duration::from_secs(10), "the stopped copy to exit", || {
        copy.try_wait().ok().flatten().is_some()
    });
    let exited = now_ns();
    let ev = events(&log);
    let kinds: Vec<&str> = ev.iter().map(|e| e.kind.as_str()).collect();
    let said = std::fs::read_to_string(s.path("err")).unwrap_or_default();
    // Mostly all three; `term` and `end` only if the signal beat the first line.
    assert!(
        kinds == ["start", "term", "end"] || kinds == ["term", "end"],
        "{ev:?}\nstderr: {said}"
    );
    for e in &ev {
        assert_eq!((e.token, e.pid), (41, pid), "{e:?}");
        assert_eq!((shard_of(e), identity_of(e)), (2, "a"), "{e:?}");
        // The log keeps microseconds: launch time rounded down to them.
        assert!(
            launched / 1000 * 1000 <= e.at_ns && e.at_ns <= exited,
            "{e:?} not between {launched} and {exited}"
        );
    }
}

#[test]
fn a_copy_that_exits_ends_its_shards_term_and_the_shard_is_taken_again() {
    let s = Scratch::new("shard-exit");
    let log = s.path("log");
    let command = logging_shell(
        &log,
        r#"log start "$TENURE_SHARD $TENURE_SHARDS $TENURE_LEASE $TENURE_IDENTITY"
sleep 0.3
log end "$TENURE_SHARD"
exit 3"#,
    );
    let mut t = Tenure::start(
        &shard_args(&s, "brief", "2", "solo", command),
        &[],
        s.path("err"),
    );
    wait_until(
        Duration::from_secs(20),
        "three copies of each shard",
        || {
            let ev = events(&log);
            (0..2).all(|shard| {
                ev.iter()
                    .filter(|e| e.kind == "end" && shard_of(e) == shard)
                    .count()
                    >= 3
            })
        },
    );
    assert!(
        t.child.try_wait().ok().flatten().is_none(),
        "tenure must keep running: {}",
        t.log()
    );
    assert_one_copy_per_shard_at_a_time(&events(&log));
    t.signal(libc::SIGTERM);
    let status = t.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", t.log());
}

#[test]
fn with_shards_escaped_processes_live_only_while_the_term_in_their_environment_runs() {
    let s = Scratch::new("shard-escape");
    let dir = s.0.path().display().to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = format!("127.0.0.1:{port}");
    // Shard 0's copy leaves two daemons (double fork, own session): one with the copy's
    // environment, one with none; then an orphan that exits, so tenure sweeps while both
    // shards' terms run. Shard 1's copy just runs.
    let script = format!(
        r#"if [ "$TENURE_SHARD" = 0 ]; then
  (setsid sh -c 'echo $$ > {dir}/marked.tmp; mv {dir}/marked.tmp {dir}/marked; exec sleep 100' </dev/null >/dev/null 2>&1 &)
  (setsid env -i sh -c 'echo $$ > {dir}/bare.tmp; mv {dir}/bare.tmp {dir}/bare; exec sleep 100' </dev/null >/dev/null 2>&1 &)
  sleep 0.5
  (sleep 0.2 &)
  while [ ! -e {dir}/stop ]; do sleep 0.1; done
  exit 0
fi
echo $$ > {dir}/other.tmp; mv {dir}/other.tmp {dir}/other
while :; do sleep 0.1; done"#
    );
    let mut t = Tenure::start(
        &run_args(
            &s,
            "esc",
            &["--shards", "2", "--identity", "solo", "--listen", &addr],
            strings(&["sh", "-c", &script]),
        ),
        &[],
        s.path("err"),
    );
    let marked = read_pid(&s.path("marked"), Duration::from_secs(15));
    let bare = read_pid(&s.path("bare"), Duration::from_secs(5));
    let other = read_pid(&s.path("other"), Duration::from_secs(5));
    wait_until(
        Duration::from_secs(5),
        "the daemon without a term in its environment to be killed",
        || !alive(bare),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        alive(marked),
        "the daemon of a running term must live: {}",
        t.log()
    );

    // The sharded probe endpoints.
    let (status, body) = get(&addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    for metric in [
        "tenure_shards 2",
        "tenure_shards_owned 2",
        "tenure_shard_group_members 1",
        "tenure_shard_group_waiting 0",
        "tenure_shard_group_generation 1",
    ] {
        assert!(body.lines().any(|l| l == metric), "{metric}: {body}");
    }
    let (status, body) = get(&addr, "/readyz");
    assert!(status.contains("200"), "{status} {body}");
    assert!(get(&addr, "/healthz").0.contains("200"));
    assert!(get(&addr, "/nope").0.contains("404"));

    // Shard 0's copy exits: its term ends, and its daemon with it; shard 1 runs on.
    std::fs::write(s.path("stop"), b"").unwrap_or_else(|e| panic!("{e}"));
    wait_until(
        Duration::from_secs(5),
        "the daemon of the ended term to be killed",
        || !alive(marked),
    );
    assert!(alive(other), "shard 1's copy must be undisturbed");
    t.signal(libc::SIGTERM);
    let status = t.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", t.log());
    assert!(!alive(other));
}

#[test]
fn bad_shard_counts_exit_2_and_a_replica_with_another_count_waits() {
    let s = Scratch::new("shard-bad");
    let state = s.state();
    for bad in ["0", "4097", "-1", "many", ""] {
        let flag = format!("--shards={bad}");
        for args in [
            vec![
                "run",
                "--lease",
                "x",
                "--state-dir",
                &state,
                &flag,
                "--",
                "true",
            ],
            vec!["status", "--lease", "x", "--state-dir", &state, &flag],
        ] {
            let (c, _, err) = run_to_end(&args, &[]);
            assert_eq!(c, 2, "{args:?}: {err}");
            assert!(err.contains("--shards"), "{args:?}: {err}");
            assert!(!err.contains("panicked"), "{err}");
        }
    }

    // A replica started with another count than the group's waits, runs nothing, and says
    // why; once the group's replica has left, it changes the group to its count.
    let log = s.path("log");
    let mut first = Tenure::start(
        &shard_args(&s, "counted", "4", "first", shard_worker(&log, 0.0)),
        &[],
        s.path("err-first"),
    );
    wait_until(
        Duration::from_secs(15),
        "the first replica's copies",
        || running(&events(&log)).len() == 4,
    );
    let mut second = Tenure::start(
        &shard_args(&s, "counted", "3", "second", shard_worker(&log, 0.0)),
        &[],
        s.path("err-second"),
    );
    wait_until(
        Duration::from_secs(15),
        "the second replica's warning",
        || second.log().contains("the group runs another shard count"),
    );
    std::thread::sleep(Duration::from_secs(2));
    let r = running(&events(&log));
    assert_eq!(
        per_identity(&r),
        [("first".into(), 4)].into(),
        "the group is undisturbed: {r:?}"
    );
    first.signal(libc::SIGTERM);
    assert_eq!(
        first.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        first.log()
    );
    wait_until(
        Duration::from_secs(15),
        "the second replica's copies of 3 shards",
        || per_identity(&running(&events(&log))) == [("second".into(), 3)].into(),
    );

    // A plain election named like one of the group's shards is refused before it campaigns.
    let plain = run_args(&s, "counted-1", &[], vec!["true".into()]);
    let plain: Vec<&str> = plain.iter().map(String::as_str).collect();
    let (c, _, err) = run_to_end(&plain, &[]);
    assert_eq!(c, 2, "{err}");
    assert!(
        error_line(&err).contains("shard 1 of the sharded group \"counted\""),
        "{err}"
    );
    second.signal(libc::SIGTERM);
    assert_eq!(
        second.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        second.log()
    );
}

/// A shell line that appends `overlap <pid>` to `file` for each process `pidfile` names that
/// is still running (not a zombie): run by a command as it starts, it checks the previous
/// term's command (or every copy of a killed run) from inside the new term.
fn check_gone(pidfile: &Path, file: &Path) -> String {
    format!(
        r#"for old in $(cat {p}); do st=$(cut -d' ' -f3 /proc/$old/stat 2>/dev/null); if [ -n "$st" ] && [ "$st" != Z ]; then echo "overlap $old" >> {f}; fi; done"#,
        p = pidfile.display(),
        f = file.display()
    )
}

/// `worker` preceded by `check`.
fn checked_worker(check: &str, log: &Path, pidfile: &Path) -> Vec<String> {
    let mut w = worker(log, pidfile, -1.0, 0);
    w[2] = format!("{check}\n{}", w[2]);
    w
}

/// `tenure run` as replica `w1` with `--restart-dir`, then `extra` (durations, `--shards`;
/// none: the default durations, lease 15 s).
fn restartable(s: &Scratch, lease: &str, extra: &[&str], command: Vec<String>) -> Vec<String> {
    let mut args = strings(&["run", "--lease", lease, "--state-dir", &s.state()]);
    args.extend(strings(&["--identity", "w1", "--restart-dir"]));
    args.push(s.path("restart").display().to_string());
    args.extend(strings(extra));
    args.push("--".into());
    args.extend(command);
    args
}

/// The same replica restarted after `kill -9` (same identity, same --restart-dir) finds the
/// restart lock free once the killed tenure, its watchdog and its command are gone, ends the
/// recorded term and starts its command at once — not after the 15 s lease — with a higher
/// token, and never while the old command runs.
#[test]
fn a_replica_restarted_after_kill_9_takes_over_at_once() {
    let s = Scratch::new("restart");
    let log = s.path("log");
    let overlap = s.path("overlap");
    let mut first = Tenure::start(
        &restartable(&s, "restart", &[], worker(&log, &s.path("p1"), -1.0, 0)),
        &[],
        s.path("e1"),
    );
    read_pid(&s.path("p1"), Duration::from_secs(10));
    for round in 2..=4 {
        let previous = s.path(&format!("p{}", round - 1));
        let killed = Instant::now();
        first.signal(libc::SIGKILL);
        first.wait(Duration::from_secs(5));
        let check = check_gone(&previous, &overlap);
        first = Tenure::start(
            &restartable(
                &s,
                "restart",
                &[],
                checked_worker(&check, &log, &s.path(&format!("p{round}"))),
            ),
            &[],
            s.path(&format!("e{round}")),
        );
        read_pid(&s.path(&format!("p{round}")), Duration::from_secs(30));
        let took = killed.elapsed();
        println!("round {round}: kill -9 to the restarted command's start: {took:?}");
        assert!(
            took < Duration::from_secs(7),
            "waited for the 15 s lease ({took:?}): {}",
            first.log()
        );
        assert!(
            first.log().contains("previous process is gone"),
            "{}",
            first.log()
        );
    }
    first.signal(libc::SIGTERM);
    first.wait(Duration::from_secs(10));
    assert!(
        !overlap.exists(),
        "{}",
        std::fs::read_to_string(&overlap).unwrap_or_default()
    );
    let tokens: Vec<u64> = events(&log)
        .iter()
        .filter(|e| e.kind == "start")
        .map(|e| e.token)
        .collect();
    assert_eq!(tokens.len(), 4, "{tokens:?}");
    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]),
        "tokens rise: {tokens:?}"
    );
}

/// A sharded replica (4 shards, lease 15 s) restarted after `kill -9` with the same identity
/// and --restart-dir: one lock for the replica, inherited by every shard's copy and watchdog,
/// is free once all of them are gone; the restart ends every shard term the killed tenure
/// recorded and runs all four copies again at once, each with a higher token, none while an
/// old copy still runs.
#[test]
fn a_sharded_replica_restarted_after_kill_9_takes_its_shards_back_at_once() {
    let s = Scratch::new("restart-shards");
    let log = s.path("log");
    let old_pids = s.path("old-pids");
    let overlap = s.path("overlap");
    std::fs::write(&old_pids, "").expect("write");
    // Each copy first checks that no copy of the killed run is alive (not a zombie).
    let mut command = shard_worker(&log, 0.0);
    command[2] = format!("{}\n{}", check_gone(&old_pids, &overlap), command[2]);
    let args = restartable(&s, "mail", &["--shards", "4"], command);
    let mut tenure = Tenure::start(&args, &[], s.path("e1"));
    wait_until(Duration::from_secs(15), "a copy per shard", || {
        running(&events(&log)).len() == 4
    });
    for round in 2..=3 {
        let before = running(&events(&log));
        let pids: Vec<String> = before.values().map(|e| e.pid.to_string()).collect();
        std::fs::write(&old_pids, pids.join("\n")).expect("write");
        let killed = Instant::now();
        tenure.signal(libc::SIGKILL);
        tenure.wait(Duration::from_secs(5));
        tenure = Tenure::start(&args, &[], s.path(&format!("e{round}")));
        let took = wait_until(Duration::from_secs(30), "the four copies again", || {
            let now = running(&events(&log));
            now.len() == 4
                && now
                    .values()
                    .all(|e| !before.values().any(|b| b.pid == e.pid))
        });
        println!(
            "round {round}: kill -9 to every shard's copy running again: {:?}",
            killed.elapsed()
        );
        assert!(
            took < Duration::from_secs(7),
            "waited for the 15 s leases ({took:?}): {}",
            tenure.log()
        );
        assert!(
            tenure.log().contains("previous process is gone"),
            "{}",
            tenure.log()
        );
        let after = running(&events(&log));
        for (shard, e) in &after {
            assert!(
                e.token > before[shard].token,
                "shard {shard}: {} after {}",
                e.token,
                before[shard].token
            );
        }
        for old in &before {
            assert!(!alive(old.1.pid), "shard {}: the old copy is gone", old.0);
        }
    }
    tenure.signal(libc::SIGTERM);
    tenure.wait(Duration::from_secs(10));
    assert!(
        !overlap.exists(),
        "{}",
        std::fs::read_to_string(&overlap).unwrap_or_default()
    );
}

/// The hostile probe's forged restart record, on the local backend: replica `b` leads; the
/// holder token of its lease, readable by anyone who can read the state directory, is written
/// into replica `w1`'s restart record under `w1`'s identity, and `w1` is started. Its restart
/// lock is free, but the store does not name `w1` as the holder of that token: nothing is
/// released, `b`'s command runs on alone, and `w1` does not start its command.
#[test]
fn a_forged_restart_record_does_not_end_another_replicas_term() {
    let s = Scratch::new("restart-forged");
    let log = s.path("log");
    let mut b = Tenure::start(
        &{
            let mut args = strings(&["run", "--lease", "forged", "--state-dir", &s.state()]);
            args.extend(strings(&["--identity", "b", "--"]));
            args.extend(worker(&log, &s.path("pb"), -1.0, 0));
            args
        },
        &[],
        s.path("eb"),
    );
    let pid_b = read_pid(&s.path("pb"), Duration::from_secs(10));
    let record = std::fs::read_to_string(s.path("state").join("forged.lease")).expect("read");
    let b_holder = record
        .lines()
        .find_map(|l| l.strip_prefix("holder "))
        .expect("b's holder token in the store")
        .to_owned();
    let restart = s.path("restart");
    std::fs::create_dir_all(&restart).expect("mkdir");
    std::fs::write(
        restart.join("forged.restart"),
        format!("tenure-restart v2\nholder {b_holder} 6 forged w1\n"),
    )
    .expect("write");
    let mut a = Tenure::start(
        &restartable(&s, "forged", &[], worker(&log, &s.path("pa"), -1.0, 0)),
        &[],
        s.path("ea"),
    );
    // Past a's restart lock and first campaign (both take milliseconds), well inside b's lease.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !s.path("pa").exists(),
        "w1 started its command beside b's: {}",
        a.log()
    );
    assert!(alive(pid_b), "b's command still runs");
    assert!(!a.log().contains("previous process is gone"), "{}", a.log());
    let still = std::fs::read_to_string(s.path("state").join("forged.lease")).expect("read");
    assert!(still.contains(&format!("holder {b_holder}")), "{still}");
    b.signal(libc::SIGTERM);
    b.wait(Duration::from_secs(10));
    // b's graceful release hands over at once.
    read_pid(&s.path("pa"), Duration::from_secs(10));
    a.signal(libc::SIGTERM);
    a.wait(Duration::from_secs(10));
}

/// A frozen tenure keeps the restart lock: its restart gets none, ends nothing, and starts its
/// command only after the frozen one's watchdog killed the old command and the lease expired.
#[test]
fn a_restart_beside_a_frozen_tenure_waits_for_the_lease() {
    let s = Scratch::new("restart-frozen");
    let log = s.path("log");
    let overlap = s.path("overlap");
    let mut frozen = Tenure::start(
        &restartable(
            &s,
            "restart-frozen",
            &FAST,
            worker(&log, &s.path("p1"), -1.0, 0),
        ),
        &[],
        s.path("e1"),
    );
    let pid1 = read_pid(&s.path("p1"), Duration::from_secs(10));
    frozen.signal(libc::SIGSTOP);
    let check = check_gone(&s.path("p1"), &overlap);
    let mut restarted = Tenure::start(
        &restartable(
            &s,
            "restart-frozen",
            &FAST,
            checked_worker(&check, &log, &s.path("p2")),
        ),
        &[],
        s.path("e2"),
    );
    let pid2 = read_pid(&s.path("p2"), Duration::from_secs(15));
    assert!(!alive(pid1), "the old command was killed by its watchdog");
    assert!(
        !overlap.exists(),
        "{}",
        std::fs::read_to_string(&overlap).unwrap_or_default()
    );
    let text = restarted.log();
    assert!(text.contains("still holds the restart lock"), "{text}");
    assert!(!text.contains("previous process is gone"), "{text}");
    // The new command checked at its start that the old one was gone (no overlap file).
    let tokens: Vec<u64> = events(&log).iter().map(|e| e.token).collect();
    assert!(tokens.len() == 2 && tokens[1] > tokens[0], "{tokens:?}");
    frozen.signal(libc::SIGCONT);
    assert_eq!(
        frozen.wait(Duration::from_secs(10)).code(),
        Some(3),
        "{}",
        frozen.log()
    );
    assert!(alive(pid2), "the restarted command is undisturbed");
    restarted.signal(libc::SIGTERM);
    restarted.wait(Duration::from_secs(10));
}

/// The binary tenure was started from is replaced on disk while it runs (an upgrade in place):
/// a later term still starts its watchdog — tenure re-executes itself through /proc/self/exe,
/// not the path, which now names another file. (It ended tenure with "cannot start the
/// watchdog process: spawn: No such file or directory" in an hour-long soak whose binary was
/// rebuilt.)
#[test]
fn a_new_term_starts_its_watchdog_after_the_binary_was_replaced() {
    let s = Scratch::new("replaced");
    let log = s.path("log");
    let copy = s.path("tenure");
    std::fs::copy(TENURE_BIN, &copy).expect("copy the binary");
    let mut tenure = Tenure::start_bin(
        &copy,
        &run_args(
            &s,
            "replaced",
            &["--rejoin"],
            worker(&log, &s.path("p"), -1.0, 0),
        ),
        &[],
        s.path("err"),
    );
    let first = read_pid(&s.path("p"), Duration::from_secs(10));
    // Replace the file (a new inode under the same path, as a package upgrade does).
    let next = s.path("tenure.new");
    std::fs::write(&next, b"#!/bin/sh\nexit 99\n").expect("write");
    std::fs::rename(&next, &copy).expect("replace");
    // Lose the term: frozen past the lease, tenure rejoins and wins a new term.
    tenure.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(4));
    tenure.signal(libc::SIGCONT);
    wait_until(Duration::from_secs(20), "a second term's command", || {
        events(&log).iter().filter(|e| e.kind == "start").count() >= 2
    });
    let stderr = tenure.log();
    assert!(
        tenure.child.try_wait().expect("wait").is_none(),
        "tenure exited: {stderr}"
    );
    assert!(!stderr.contains("cannot start the watchdog"), "{stderr}");
    assert!(!alive(first), "the first term's command is gone");
    tenure.signal(libc::SIGTERM);
    tenure.wait(Duration::from_secs(10));
}
