//! `tenure run --once-per` on every backend's real store (local files, a real `redis-server`, a
//! real kube-apiserver): two copies run the job once per period; a runner killed with
//! `kill -9` mid-run leaves no completion and the other copy runs the job; after a completed
//! run no copy runs it again (exit 7, or `--done-exit-code`); a damaged record is a warning and
//! counts as none; a command that succeeded whose record the store refused or could not write
//! exits 9, and the next run of the period runs it again.

mod cli_support;
mod kube_support;
mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use cli_support::{Tenure, alive, events, logging_shell, read_pid, run_bounded, wait_until};
use support::{RedisServer, TempDir};

/// The period of every test: an hour, and no test starts within two minutes of an hour's end
/// ([`clear_of_the_period_end`]), so every run of a test falls in one period.
const PERIOD: &str = "1h";

/// What differs between stores: how to reach one, and how a test damages its record or makes
/// it refuse the running term's record.
trait Store {
    /// `--backend …` and the like.
    fn args(&self) -> Vec<String>;
    /// Environment of every copy.
    fn env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Plants something that is not a completion record where lease `lease`'s record belongs.
    fn damage(&self, lease: &str);
    /// Makes the store refuse (or fail to write) the record of the term now running `lease`'s
    /// command.
    fn refuse(&self, lease: &str);
    /// Undoes [`refuse`](Self::refuse) where it left the store unable to write a record.
    fn undo_refuse(&self, _lease: &str) {}
}

/// Waits, if needed, until the current period has more than two minutes left (the stores'
/// clocks are this host's: every server runs on loopback).
fn clear_of_the_period_end() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let left = 3600 - now % 3600;
    if left < 120 {
        std::thread::sleep(Duration::from_secs(left + 2));
    }
}

struct Copies<'a> {
    store: &'a dyn Store,
    dir: PathBuf,
    lease: String,
}

impl Copies<'_> {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn args(&self, identity: &str, extra: &[&str], body: &str) -> Vec<String> {
        let mut args = cli_support::strings(&["run", "--lease", &self.lease]);
        args.extend(self.store.args());
        args.extend(cli_support::strings(&cli_support::FAST));
        args.extend(cli_support::strings(&[
            "--identity",
            identity,
            "--once-per",
            PERIOD,
        ]));
        args.extend(cli_support::strings(extra));
        args.push("--".into());
        args.extend(logging_shell(&self.path("log"), body));
        args
    }

    fn start(&self, identity: &str, body: &str) -> Tenure {
        let env = self.store.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Tenure::start(
            &self.args(identity, &[], body),
            &env,
            self.path(&format!("err-{identity}")),
        )
    }

    /// One copy run to its end: (exit code, stderr).
    fn run(&self, identity: &str, extra: &[&str], body: &str) -> (i32, String) {
        let env = self.store.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let args = self.args(identity, extra, body);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = run_bounded(&args, &env, b"", Duration::from_secs(60));
        (code, err)
    }

    /// How many times the command started, and how many of those runs ended.
    fn runs(&self) -> (usize, usize) {
        let events = events(&self.path("log"));
        let count = |kind: &str| events.iter().filter(|e| e.kind == kind).count();
        (count("start"), count("end"))
    }
}

/// The job: logs its start and (after a short piece of work) its end; `$TENURE_PERIOD_START`
/// is in the start line.
const JOB: &str = r#"log start "$TENURE_PERIOD_START"; sleep 0.3; log end"#;

fn scenario(store: &dyn Store, dir: &Path, lease: &str) {
    clear_of_the_period_end();
    let copies = Copies {
        store,
        dir: dir.to_path_buf(),
        lease: lease.to_owned(),
    };

    // a starts the job and is killed mid-run; b, waiting, then runs it to completion.
    let pa = copies.path("pa");
    let mut a = copies.start(
        "a",
        &format!(
            "log start; echo $$ > {pa}; while :; do sleep 0.1; done",
            pa = pa.display()
        ),
    );
    let command_a = read_pid(&pa, Duration::from_secs(30));
    let mut b = copies.start("b", JOB);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(copies.runs(), (1, 0), "b ran while a held the lease");
    a.signal(libc::SIGKILL);
    a.wait(Duration::from_secs(5));
    wait_until(Duration::from_secs(10), "a's command to die with a", || {
        !alive(command_a)
    });
    let status = b.wait(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", b.log());
    assert_eq!(
        copies.runs(),
        (2, 1),
        "a run killed mid-run runs again, to its end"
    );
    assert!(
        b.log().contains("completion recorded"),
        "b's log:\n{}",
        b.log()
    );
    let period = events(&copies.path("log"))
        .iter()
        .rev()
        .find(|e| e.kind == "start")
        .map(|e| e.rest.clone())
        .unwrap_or_default();
    assert!(
        period.ends_with(":00:00Z") && period.len() == 20,
        "TENURE_PERIOD_START={period:?} is not the start of an hour"
    );

    // Completed: no copy runs it again in this period.
    let (code, err) = copies.run("c", &[], JOB);
    assert_eq!(code, 7, "{err}");
    assert!(err.contains("this period's run is done already"), "{err}");
    assert!(err.contains("completed_by=b"), "{err}");
    let (code, err) = copies.run("c", &["--done-exit-code", "0"], JOB);
    assert_eq!(code, 0, "{err}");
    assert_eq!(copies.runs(), (2, 1), "a completed job ran again");

    // A damaged record: a warning, and the job runs; this run's record is refused (or cannot
    // be written): exit 9, and the next run of the period runs the job again.
    store.damage(lease);
    let (ran, go) = (copies.path("ran"), copies.path("go"));
    let gated = format!(
        "log start; touch {ran}; while [ ! -e {go} ]; do sleep 0.05; done; log end",
        ran = ran.display(),
        go = go.display()
    );
    let mut d = copies.start("d", &gated);
    wait_until(Duration::from_secs(30), "d's command to start", || {
        ran.exists()
    });
    store.refuse(lease);
    std::fs::write(&go, b"").unwrap_or_else(|e| panic!("{e}"));
    let status = d.wait(Duration::from_secs(60));
    let log = d.log();
    assert_eq!(status.code(), Some(9), "{log}");
    assert!(
        log.contains("the completion record cannot be read; it counts as none"),
        "{log}"
    );
    assert!(
        log.contains("the command succeeded but its completion was not recorded"),
        "{log}"
    );
    assert_eq!(copies.runs(), (3, 2));
    store.undo_refuse(lease);

    let (code, err) = copies.run("e", &[], JOB);
    assert_eq!(code, 0, "an unrecorded run must run again: {err}");
    assert_eq!(copies.runs(), (4, 3));
    let (code, err) = copies.run("f", &[], JOB);
    assert_eq!(code, 7, "{err}");
    assert_eq!(copies.runs(), (4, 3), "a completed job ran again");
}

struct Local {
    state: PathBuf,
}

impl Store for Local {
    fn args(&self) -> Vec<String> {
        vec!["--state-dir".into(), self.state.display().to_string()]
    }

    fn damage(&self, lease: &str) {
        std::fs::write(self.state.join(format!("{lease}.done")), "c1:garbage")
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// A directory where the record belongs: the record cannot replace it.
    fn refuse(&self, lease: &str) {
        let done = self.state.join(format!("{lease}.done"));
        std::fs::remove_file(&done).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir(&done).unwrap_or_else(|e| panic!("{e}"));
    }

    fn undo_refuse(&self, lease: &str) {
        std::fs::remove_dir(self.state.join(format!("{lease}.done")))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn local_once_per_period_across_kill_9_damage_and_a_failed_record() {
    let dir = TempDir::new("cli-once-local");
    let store = Local {
        state: dir.path().join("state"),
    };
    scenario(&store, dir.path(), "report");
}

struct Redis {
    server: RedisServer,
}

impl Store for Redis {
    fn args(&self) -> Vec<String> {
        vec!["--backend".into(), self.server.url()]
    }

    fn damage(&self, lease: &str) {
        self.server
            .cmd(&["SET", &format!("tenure:{{{lease}}}:done"), "c1:garbage"]);
    }

    /// A later term, as far as the fencing counter knows.
    fn refuse(&self, lease: &str) {
        self.server
            .cmd(&["INCR", &format!("tenure:{{{lease}}}:fence")]);
    }
}

#[test]
fn redis_once_per_period_across_kill_9_damage_and_a_refused_record() {
    let dir = TempDir::new("cli-once-redis");
    let store = Redis {
        server: RedisServer::start(),
    };
    scenario(&store, dir.path(), "report");
    // The record is the documented key, readable with redis-cli.
    let redis::Value::BulkString(text) = store.server.cmd(&["GET", "tenure:{report}:done"]) else {
        panic!("no completion record at tenure:{{report}}:done");
    };
    let text = String::from_utf8_lossy(&text).into_owned();
    assert!(text.starts_with("c1:") && text.ends_with(":e"), "{text}");
}

struct Kube {
    namespace: String,
    kubeconfig: String,
}

impl Kube {
    fn annotate(&self, lease: &str, key: &str, value: &str) {
        use k8s_openapi::api::coordination::v1::Lease;
        use kube::api::{Api, Patch, PatchParams};
        let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
        runtime().block_on(async {
            let api: Api<Lease> =
                Api::namespaced(kube_support::shared().admin().await, &self.namespace);
            api.patch(
                &format!("{lease}-done"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap_or_else(|e| panic!("annotate {lease}-done: {e}"));
        });
    }
}

impl Store for Kube {
    fn args(&self) -> Vec<String> {
        cli_support::strings(&["--backend", "kube", "--namespace", &self.namespace])
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![("KUBECONFIG".into(), self.kubeconfig.clone())]
    }

    fn damage(&self, lease: &str) {
        self.annotate(lease, "tenure.dev/completion", "c1:garbage");
    }

    /// A later term's check mark (a token no resourceVersion of this test server reaches).
    fn refuse(&self, lease: &str) {
        self.annotate(
            lease,
            "tenure.dev/completion-check",
            "900000000000000000:later",
        );
    }

    /// The mark stays ahead of every real term: put back one that every term passes.
    fn undo_refuse(&self, lease: &str) {
        self.annotate(lease, "tenure.dev/completion-check", "1:test");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn kube_once_per_period_across_kill_9_damage_and_a_refused_record() {
    let server = kube_support::shared();
    let namespace = kube_support::unique("once");
    runtime().block_on(server.namespace(&namespace));
    let store = Kube {
        namespace: namespace.clone(),
        kubeconfig: server.admin_kubeconfig().display().to_string(),
    };
    let dir = kube_support::fresh_dir("cli-once");
    scenario(&store, &dir, "report");
    let lease = runtime()
        .block_on(server.lease(&namespace, "report-done"))
        .unwrap_or_else(|| panic!("no Lease report-done"));
    let record = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("tenure.dev/completion"))
        .cloned()
        .unwrap_or_default();
    assert!(
        record.starts_with("c1:") && record.ends_with(":e"),
        "{record}"
    );
}
