//! The real `tenure` binary on a real `redis-server`: hand-over between two replicas,
//! `kill -9`, a lease deleted under the leader (exit 3, or a new term with `--rejoin`), and
//! credentials from the environment or a file, never echoed.

mod cli_support;
mod support;

use std::time::Duration;

use cli_support::{
    FAST, TENURE, Tenure, alive, assert_one_at_a_time, events, now_ns, read_pid, run_bounded,
    run_bounded_with, run_to_end, strings, wait_until, worker,
};
use support::{RedisServer, TempDir};

fn run_args(url: &str, lease: &str, extra: &[&str], command: Vec<String>) -> Vec<String> {
    cli_support::run_args(lease, &["--backend", url], extra, command)
}

#[test]
fn two_replicas_take_turns_and_kill_9_hands_over() {
    let server = RedisServer::start();
    let dir = TempDir::new("cli-redis");
    let p = |n: &str| dir.path().join(n);
    let log = p("log");
    let url = server.url();
    let mut a = Tenure::start(
        &run_args(
            &url,
            "job",
            &["--identity", "a"],
            worker(&log, &p("pa"), -1.0, 0),
        ),
        &[],
        p("ea"),
    );
    let pid_a = read_pid(&p("pa"), Duration::from_secs(10));
    let mut b = Tenure::start(
        &run_args(
            &url,
            "job",
            &["--identity", "b"],
            worker(&log, &p("pb"), 1.0, 0),
        ),
        &[],
        p("eb"),
    );
    let mut c = Tenure::start(
        &run_args(
            &url,
            "job",
            &["--identity", "c"],
            worker(&log, &p("pc"), 1.0, 5),
        ),
        &[],
        p("ec"),
    );
    std::thread::sleep(Duration::from_millis(500));
    a.signal(libc::SIGKILL);
    a.wait(Duration::from_secs(5));
    wait_until(Duration::from_secs(5), "a's command to die with a", || {
        !alive(pid_a)
    });
    let death = now_ns();
    let b_status = b.wait(Duration::from_secs(30));
    let c_status = c.wait(Duration::from_secs(30));
    assert_eq!(b_status.code(), Some(0), "{}", b.log());
    assert_eq!(c_status.code(), Some(5), "{}", c.log());
    let ev = events(&log);
    assert_eq!(ev.iter().filter(|e| e.kind == "start").count(), 3, "{ev:?}");
    assert_one_at_a_time(&ev, &[(pid_a, death)]);
}

#[test]
fn a_deleted_lease_ends_the_term_and_rejoin_starts_a_new_one() {
    let server = RedisServer::start();
    let dir = TempDir::new("cli-redis-del");
    let p = |n: &str| dir.path().join(n);
    let url = server.url();

    // Without --rejoin: the command is stopped and tenure exits 3.
    let mut once = Tenure::start(
        &run_args(&url, "del1", &[], worker(&p("log1"), &p("p1"), -1.0, 0)),
        &[],
        p("e1"),
    );
    let pid = read_pid(&p("p1"), Duration::from_secs(10));
    server.cmd(&["DEL", "tenure:{del1}"]);
    let status = once.wait(Duration::from_secs(15));
    assert_eq!(status.code(), Some(3), "{}", once.log());
    assert!(!alive(pid));

    // With --rejoin: a new term, a new command, a higher token.
    let _again = Tenure::start(
        &run_args(
            &url,
            "del2",
            &["--rejoin"],
            worker(&p("log2"), &p("p2"), -1.0, 0),
        ),
        &[],
        p("e2"),
    );
    let first = read_pid(&p("p2"), Duration::from_secs(10));
    std::fs::remove_file(p("p2")).unwrap_or_else(|e| panic!("{e}"));
    server.cmd(&["DEL", "tenure:{del2}"]);
    let second = read_pid(&p("p2"), Duration::from_secs(15));
    assert_ne!(first, second);
    assert!(!alive(first), "the first term's command still runs");
    let ev = events(&p("log2"));
    let starts: Vec<_> = ev.iter().filter(|e| e.kind == "start").collect();
    assert_eq!(starts.len(), 2, "{ev:?}");
    assert!(starts[1].token > starts[0].token, "{ev:?}");
}

#[test]
fn passwords_come_from_the_environment_or_a_file_and_are_never_printed() {
    const PW: &str = "s3cret-cli-pw";
    let server = RedisServer::options()
        .acl_user(&support::documented_acl_user("tenure", PW))
        .start();
    let dir = TempDir::new("cli-redis-pw");
    let url = server.url();
    let base = |extra: &[&str]| {
        let mut a = vec!["run", "--lease", "pw", "--backend", url.as_str()];
        a.extend_from_slice(&FAST);
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--redis-username", "tenure", "--", "sh", "-c", "exit 9"]);
        a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>, env: &[(&str, &str)]| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run_to_end(&refs, env)
    };

    let (c, _, err) = run(base(&[]), &[("TENURE_REDIS_PASSWORD", PW)]);
    assert_eq!(c, 9, "password from the environment: {err}");
    // The command does not inherit tenure's password.
    let mut leak = base(&[]);
    leak.truncate(leak.len() - 3);
    leak.extend(strings(&["sh", "-c", "exit ${TENURE_REDIS_PASSWORD:+1}0"]));
    let (c, _, err) = run(leak, &[("TENURE_REDIS_PASSWORD", PW)]);
    assert_eq!(c, 0, "the command saw TENURE_REDIS_PASSWORD: {err}");

    let file = dir.path().join("pw");
    std::fs::write(&file, format!("{PW}\n")).unwrap_or_else(|e| panic!("{e}"));
    let file = file.display().to_string();
    let (c, _, err) = run(base(&["--redis-password-file", &file]), &[]);
    assert_eq!(c, 9, "password from a file: {err}");
    // A pipe is a file too.
    let args = base(&["--redis-password-file", "/dev/stdin"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (c, _, err) = run_bounded(
        &refs,
        &[],
        format!("{PW}\n").as_bytes(),
        Duration::from_secs(30),
    );
    assert_eq!(c, 9, "password from a pipe: {err}");

    let (c, out, err) = run(base(&[]), &[("TENURE_REDIS_PASSWORD", "wrong-pw-123")]);
    assert_eq!(c, 4, "{err}");
    assert!(
        err.lines().filter(|l| l.starts_with("tenure: ")).count() == 1,
        "{err}"
    );
    assert!(err.to_lowercase().contains("auth"), "{err}");
    assert!(
        !err.contains("wrong-pw-123") && !out.contains("wrong-pw-123"),
        "{err}"
    );

    // A password in the URL works but earns a warning, and is not echoed either.
    let with_pw = format!("redis://tenure:{PW}@127.0.0.1:{}", server.port());
    let mut args = vec!["run", "--lease", "pw", "--backend", with_pw.as_str()];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(&["--", "sh", "-c", "exit 9"]);
    let (c, out, err) = run_to_end(&args, &[]);
    assert_eq!(c, 9, "{err}");
    assert!(err.contains("contains a password"), "{err}");
    assert!(err.contains("process list"), "from the flag: {err}");
    assert!(!err.contains(PW) && !out.contains(PW), "{err}");

    let (c, out, err) = run_to_end(
        &[
            "status",
            "--lease",
            "pw",
            "--backend",
            &with_pw,
            "-o",
            "json",
        ],
        &[],
    );
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("\"held\":false") && !out.contains(PW), "{out}");
}

#[test]
fn runs_on_a_redis_cluster_with_rising_tokens() {
    let cluster = support::RedisCluster::start(3);
    let url = cluster.url();
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let mut args = vec!["run", "--lease", "clustered", "--backend", url.as_str()];
        args.extend_from_slice(&FAST);
        args.extend_from_slice(&[
            "--redis-cluster",
            "--",
            "sh",
            "-c",
            "echo $TENURE_FENCING_TOKEN",
        ]);
        let (code, out, err) = run_to_end(&args, &[]);
        assert_eq!(code, 0, "{err}");
        tokens.push(
            out.trim()
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("{out:?}: {e}")),
        );
    }
    assert!(tokens[1] > tokens[0], "{tokens:?}");
    assert!(
        cluster.command_calls("evalsha") >= 4,
        "the runs went through the cluster"
    );
}

#[test]
fn secrets_in_the_environment_do_not_reach_the_command() {
    const PW: &str = "s3cret-env-pw";
    let server = RedisServer::options()
        .acl_user(&support::documented_acl_user("tenure", PW))
        .start();
    let dir = TempDir::new("cli-redis-env");
    let with_pw = server.url_as("tenure", PW);
    let run = |script: &str, env: &[(&str, &str)]| {
        let mut args = vec!["run", "--lease", "env"];
        args.extend_from_slice(&FAST);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        run_bounded(&args, env, b"", Duration::from_secs(30))
    };
    // The URL from the environment: used, named in the warning as the environment (not the
    // process list), and removed from the command's environment.
    let (c, out, err) = run(
        "exit ${TENURE_BACKEND:+1}0",
        &[("TENURE_BACKEND", &with_pw)],
    );
    assert_eq!(
        c, 0,
        "the command saw TENURE_BACKEND with its password: {err}"
    );
    assert!(err.contains("contains a password"), "{err}");
    assert!(
        err.contains("environment") && !err.contains("process list"),
        "{err}"
    );
    assert!(!err.contains(PW) && !out.contains(PW), "{err}");
    // Without credentials in it, TENURE_BACKEND is passed on (a nested `tenure status` in the
    // command finds the same store); the password from its own variable is not.
    let (c, _, err) = run(
        "exit ${TENURE_BACKEND:+1}${TENURE_REDIS_PASSWORD:+2}0",
        &[
            ("TENURE_BACKEND", &server.url()),
            ("TENURE_REDIS_USERNAME", "tenure"),
            ("TENURE_REDIS_PASSWORD", PW),
        ],
    );
    assert_eq!(c, 10, "{err}");

    // Nor can the command read it from tenure's own /proc/PID/environ: with a password in
    // its environment, tenure is not dumpable. Run as an unprivileged user (root could read
    // it anyway); the same run with the password in a file (tenure stays dumpable) shows that
    // the command could read it otherwise.
    let file = dir.path().join("pw");
    std::fs::write(&file, PW).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .unwrap_or_else(|e| panic!("{e}"));
    // Exit 11: tenure's environment is readable; 12: some process's environment (tenure's,
    // its watchdog's) holds the password (codes no failure of tenure's own can produce).
    let probe = format!(
        "sleep 0.5; cat /proc/$PPID/environ >/dev/null 2>&1 && exit 11; \
         grep -q -s -F '{PW}' /proc/[0-9]*/environ && exit 12; exit 0"
    );
    // The unprivileged user runs a copy it can reach (cargo's target directory may sit
    // under a home directory it cannot enter, and tenure re-executes itself for the
    // watchdog).
    let tenure = dir.path().join("tenure");
    std::fs::copy(TENURE, &tenure).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&tenure, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    let plain = server.url();
    let nobody = |env: &[(&str, &str)], extra: &[&str]| {
        let mut cmd = std::process::Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&tenure)
            .args(["run", "--lease", "proc", "--redis-username", "tenure"])
            .args(FAST)
            .args(extra)
            .args(["--", "sh", "-c", &probe]);
        run_bounded_with(&mut cmd, env, b"", Duration::from_secs(30))
    };
    let file = file.display().to_string();
    let (c, _, err) = nobody(&[], &["--backend", &plain, "--redis-password-file", &file]);
    assert_eq!(
        c, 11,
        "setpriv (needs root) or /proc: the control run could not read environ: {err}"
    );
    for (what, env, extra) in [
        (
            "$TENURE_REDIS_PASSWORD",
            [("TENURE_REDIS_PASSWORD", PW)],
            ["--backend", plain.as_str()],
        ),
        (
            "$TENURE_BACKEND",
            [("TENURE_BACKEND", with_pw.as_str())],
            ["--grace", "5s"],
        ),
    ] {
        let (c, _, err) = nobody(&env, &extra);
        assert_eq!(
            c, 0,
            "password in {what}: the command could read tenure's environment (11) or found the \
             password in a process's environment (12): {err}"
        );
    }
}

#[test]
fn status_escapes_control_characters_in_the_holder() {
    let server = RedisServer::start();
    let url = server.url();
    // A value in tenure's layout (see acquire.lua) written by someone else, with ESC, CR and
    // LF in the identity.
    let evil = "evil\x1b[2J\x1b[31mred\r\nFAKE   9999   1s";
    let value = format!("+{}0{}42:{evil}", "0".repeat(32), "0".repeat(32));
    server.cmd(&["SET", "tenure:{esc}", &value, "PX", "60000"]);
    let (c, out, err) = run_bounded(
        &["status", "--lease", "esc", "--backend", &url],
        &[],
        b"",
        Duration::from_secs(20),
    );
    assert_eq!(c, 0, "{err}");
    assert!(
        !out.contains('\x1b') && !out.contains('\r'),
        "raw control characters: {out:?}"
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out:?}");
    assert!(
        lines[1].contains("evil\\u{1b}[2J\\u{1b}[31mred\\r\\nFAKE") && lines[1].contains("42"),
        "{out:?}"
    );
    // JSON keeps the identity exact (JSON-escaped).
    let (c, out, err) = run_bounded(
        &["status", "--lease", "esc", "--backend", &url, "-o", "json"],
        &[],
        b"",
        Duration::from_secs(20),
    );
    assert_eq!(c, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
    assert_eq!(v["holder"], evil);
}

/// `--store-liveness`: a follower the store stopped answering fails `/healthz` (so a liveness
/// probe restarts it) once 2 × lease + retry have passed; without the flag only `/readyz`
/// fails and the replica stays live.
#[test]
fn store_liveness_fails_healthz_of_a_follower_cut_off_from_the_store() {
    let mut server = RedisServer::start();
    let dir = TempDir::new("cli-store-liveness");
    let p = |n: &str| dir.path().join(n);
    let url = server.url();
    let forever = || worker(&p("log"), &p("pid"), -1.0, 0);
    let _leader = Tenure::start(
        &run_args(&url, "live", &["--identity", "a"], forever()),
        &[],
        p("ea"),
    );
    read_pid(&p("pid"), Duration::from_secs(10));
    let (strict, lenient) = (cli_support::free_port(), cli_support::free_port());
    let follower = |id: &str, port: u16, extra: &[&str]| {
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["--identity", id, "--listen", &listen];
        args.extend(extra);
        Tenure::start(&run_args(&url, "live", &args, forever()), &[], p(id))
    };
    let b = follower("b", strict, &["--store-liveness"]);
    let c = follower("c", lenient, &[]);
    let get = |port, path| cli_support::http_get(port, path).map(|(code, _)| code);
    wait_until(Duration::from_secs(10), "both followers ready", || {
        get(strict, "/readyz") == Some(200) && get(lenient, "/readyz") == Some(200)
    });
    assert_eq!(get(strict, "/healthz"), Some(200), "{}", b.log());

    server.stop();
    // 2 × 3 s + 500 ms of silence, then the answers change.
    wait_until(Duration::from_secs(15), "b's /healthz to fail", || {
        get(strict, "/healthz") == Some(503)
    });
    let (_, body) = cli_support::http_get(strict, "/healthz").unwrap_or_default();
    assert!(body.starts_with("store unreachable"), "{body}");
    wait_until(Duration::from_secs(5), "c's /readyz to fail", || {
        get(lenient, "/readyz") == Some(503)
    });
    assert_eq!(
        get(lenient, "/healthz"),
        Some(200),
        "without the flag, still live: {}",
        c.log()
    );

    // Bad input: the flag needs --listen, and a sharded replica has no such probe.
    for extra in [
        &["--store-liveness"][..],
        &[
            "--store-liveness",
            "--listen",
            "127.0.0.1:1",
            "--shards",
            "2",
        ],
    ] {
        let (code, out, err) = run_to_end(
            &run_args(&url, "live", extra, strings(&["true"]))
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            &[],
        );
        assert_eq!(code, 2, "{extra:?}: {out}{err}");
        assert!(err.contains("--store-liveness"), "{err}");
    }
}
