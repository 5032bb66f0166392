//! `tenure run` as a job runner: `--try` takes the lease now or exits 6 without running the
//! command, `--timeout` gives up waiting after a bound (exit 6), and neither cuts short a term
//! that began; the job flags' environment variables (`TENURE_TRY`, `TENURE_TIMEOUT`,
//! `TENURE_ONCE_PER`, `TENURE_DONE_EXIT_CODE`) set them as the flags do.

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

/// Waits, if needed, until the current hour has more than a minute left, so that the runs of
/// one test fall in one `--once-per 1h` period (the local store's clock is this host's).
fn clear_of_the_hours_end() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let left = 3600 - now % 3600;
    if left < 60 {
        std::thread::sleep(Duration::from_secs(left + 2));
    }
}

#[test]
fn the_job_flags_environment_variables_set_them_as_the_flags_do() {
    let dir = TempDir::new("cli-jobs-env");
    let pidfile = dir.path().join("holder.pid");
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let run = |extra: &[&str], env: &[(&str, &str)]| {
        let args = job(&dir, "report", "other", extra, &touch);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_to_end(&args, env)
    };
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

    let (code, _, err) = run(&[], &[("TENURE_TRY", "true")]);
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("--try: lease report is held by holder: not run"),
        "{err}"
    );
    let (code, _, err) = run(&[], &[("TENURE_TIMEOUT", "300ms")]);
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("--timeout 300ms: lease report is still held by holder"),
        "{err}"
    );
    // `false` is off, as clap reads every boolean variable of tenure's: no conflict with
    // --timeout.
    let (code, _, err) = run(&["--timeout", "200ms"], &[("TENURE_TRY", "false")]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("--timeout 200ms"), "{err}");
    // A conflict with a flag nobody typed names the variable that set it.
    let (code, _, err) = run(&["--timeout", "200ms"], &[("TENURE_TRY", "true")]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("cannot be used with") && err.contains("--try is set by $TENURE_TRY"),
        "{err}"
    );
    let (code, _, err) = run(&[], &[("TENURE_TRY", "yes")]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("invalid value 'yes' for '--try'")
            && err.contains("--try is set by $TENURE_TRY"),
        "{err}"
    );
    assert!(!marker.exists(), "the command ran");
    holder.signal(libc::SIGTERM);
    holder.wait(Duration::from_secs(10));

    // TENURE_DONE_EXIT_CODE alone (an image's default for its run-once jobs) is no error for
    // a job without --once-per: it runs.
    let (code, _, err) = run(&["--try"], &[("TENURE_DONE_EXIT_CODE", "0")]);
    assert_eq!(code, 0, "{err}");
    assert!(marker.exists(), "the command did not run");
    std::fs::remove_file(&marker).unwrap_or_else(|e| panic!("{e}"));

    clear_of_the_hours_end();
    let once = [("TENURE_ONCE_PER", "1h")];
    let (code, _, err) = run(&[], &once);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("completion recorded"), "{err}");
    assert!(marker.exists(), "the command did not run");
    std::fs::remove_file(&marker).unwrap_or_else(|e| panic!("{e}"));
    let (code, _, err) = run(&[], &once);
    assert_eq!(code, 7, "{err}");
    assert!(err.contains("this period's run is done already"), "{err}");
    let (code, _, err) = run(&[], &[once[0], ("TENURE_DONE_EXIT_CODE", "0")]);
    assert_eq!(code, 0, "{err}");
    // The flag given wins over its variable.
    let (code, _, err) = run(
        &["--done-exit-code", "5"],
        &[once[0], ("TENURE_DONE_EXIT_CODE", "0")],
    );
    assert_eq!(code, 5, "{err}");
    assert!(!marker.exists(), "a completed job ran again");
}
