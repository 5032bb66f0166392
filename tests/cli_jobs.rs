//! `tenure run` as a job runner: `--try` takes the lease now or exits 6 without running the
//! command, `--timeout` gives up waiting after a bound (exit 6), and neither cuts short a term
//! that began.

mod cli_support;
#[path = "support/tempdir.rs"]
mod tempdir;

use std::time::{Duration, Instant};

use cli_support::{Tenure, read_pid, run_to_end, strings};
use tempdir::TempDir;

fn job(dir: &TempDir, lease: &str, identity: &str, extra: &[&str], command: &str) -> Vec<String> {
    let state = dir.path().join("state").display().to_string();
    let mut args = strings(&["run", "--lease", lease, "--state-dir", &state]);
    args.extend(strings(&["--identity", identity]));
    args.extend(strings(extra));
    args.extend(strings(&["--", "sh", "-c", command]));
    args
}

#[test]
fn try_and_timeout_give_up_with_exit_6_while_another_replica_holds_the_lease() {
    let dir = TempDir::new("cli-jobs-try");
    let pidfile = dir.path().join("holder.pid");
    let marker = dir.path().join("ran");
    let mut holder = Tenure::start(
        &job(
            &dir,
            "report",
            "holder",
            &[],
            &format!("echo $$ > {}; exec sleep 30", pidfile.display()),
        ),
        &[],
        dir.path().join("holder.err"),
    );
    read_pid(&pidfile, Duration::from_secs(10));
    let touch = format!("touch {}", marker.display());

    let started = Instant::now();
    let args = job(&dir, "report", "other", &["--try"], &touch);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = run_to_end(&args, &[]);
    let tried = started.elapsed();
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("--try: lease report is held by holder: not run"),
        "{err}"
    );
    assert!(!marker.exists(), "the command ran");
    assert!(tried < Duration::from_secs(2), "--try waited {tried:?}");

    let started = Instant::now();
    let args = job(&dir, "report", "other", &["--timeout", "1500ms"], &touch);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = run_to_end(&args, &[]);
    let waited = started.elapsed();
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("--timeout 1.5s: lease report is still held by holder"),
        "{err}"
    );
    assert!(!marker.exists(), "the command ran");
    assert!(
        waited >= Duration::from_millis(1500),
        "gave up after {waited:?}"
    );
    println!("--try gave up in {tried:?}; --timeout 1.5s in {waited:?}");

    // Free: --try takes it and runs the command to its end (exit 0).
    holder.signal(libc::SIGTERM);
    holder.wait(Duration::from_secs(10));
    let args = job(&dir, "report", "other", &["--try"], &touch);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = run_to_end(&args, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(marker.exists(), "the command did not run");
}

#[test]
fn a_timeout_never_cuts_a_term_that_began_short() {
    let dir = TempDir::new("cli-jobs-timeout");
    // The term outlives the timeout; the command's own exit code comes back.
    let args = job(
        &dir,
        "long",
        "a",
        &["--timeout", "200ms"],
        "sleep 1; exit 7",
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = run_to_end(&args, &[]);
    assert_eq!(code, 7, "{err}");
}
