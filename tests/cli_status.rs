//! `tenure status` of a free lease on every backend's real store: who held it last, with which
//! fencing token, and when and how that term ended (released, or expired after a `kill -9`);
//! and `--require-leader`'s exit code with and without a holder.

mod cli_support;
mod kube_support;
mod support;

use std::time::Duration;

use cli_support::{Tenure, read_pid, run_bounded, wait_until};
use support::{RedisServer, TempDir};

/// Runs `tenure <args>` with `env`: (exit code, stdout, stderr).
fn tenure(args: &[String], env: &[(&str, &str)]) -> (i32, String, String) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_bounded(&args, env, b"", Duration::from_secs(60))
}

fn with(first: &[&str], backend: &[String]) -> Vec<String> {
    let mut v = cli_support::strings(first);
    v.extend(backend.iter().cloned());
    v
}

/// The JSON `tenure status -o json` prints.
fn status_json(lease: &str, backend: &[String], env: &[(&str, &str)]) -> serde_json::Value {
    let (code, out, err) = tenure(
        &with(&["status", "--lease", lease, "-o", "json"], backend),
        env,
    );
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A run to its end, then status: the releasing holder, its token, `released` (with a time
/// close to now when the store keeps one). Then a holder `kill -9`ed: `expired` where the
/// store keeps expired records, nothing where it does not (Redis); see [`Crash`].
fn scenario(backend: &[String], env: &[(&str, &str)], keeps_time: bool, crash: Crash) {
    let dir = TempDir::new("cli-status");
    let fast = cli_support::FAST;
    // The default 15 s lease: Redis keeps the released holder for what remained of it.
    let mut run = with(
        &["run", "--lease", "job", "--identity", "runner-1"],
        backend,
    );
    run.extend(cli_support::strings(&[
        "--",
        "sh",
        "-c",
        "echo $TENURE_FENCING_TOKEN",
    ]));
    let before = wall_ms();
    let (code, out, err) = tenure(&run, env);
    assert_eq!(code, 0, "{err}");
    let token: u64 = out
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {out:?}"));

    let (code, table, err) = tenure(&with(&["status", "--lease", "job"], backend), env);
    assert_eq!(code, 0, "{err}");
    assert!(
        table.contains(&format!(
            "last holder: runner-1 (fencing token {token}), released"
        )),
        "{table}"
    );
    let json = status_json("job", backend, env);
    assert_eq!(json["held"], false, "{json}");
    let last = &json["lastTerm"];
    assert_eq!(last["holder"], "runner-1", "{json}");
    assert_eq!(last["fencingToken"], token, "{json}");
    assert_eq!(last["ended"], "released", "{json}");
    if keeps_time {
        let ago = last["endedAgoMs"].as_u64().unwrap_or(u64::MAX);
        let since = wall_ms() - before;
        // Kubernetes' renewTime has microseconds; the local clock is this host's.
        assert!(
            ago <= since + 1000,
            "released {ago} ms ago, run began {since} ms ago: {json}"
        );
        assert!(
            last["endedAt"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{json}"
        );
    } else {
        assert!(last["endedAt"].is_null(), "{json}");
        assert!(table.contains("time not kept by this store"), "{table}");
    }

    // A holder killed with kill -9: its lease runs out.
    if crash == Crash::NotChecked {
        return;
    }
    let pid = dir.path().join("pid");
    let mut killed = with(
        &["run", "--lease", "crash", "--identity", "runner-2"],
        backend,
    );
    killed.extend(cli_support::strings(&fast));
    killed.extend(cli_support::strings(&[
        "--",
        "sh",
        "-c",
        &format!("echo $$ > {}; exec sleep 60", pid.display()),
    ]));
    let mut holder = Tenure::start(&killed, env, dir.path().join("err"));
    read_pid(&pid, Duration::from_secs(30));
    holder.signal(libc::SIGKILL);
    holder.wait(Duration::from_secs(5));
    wait_until(
        Duration::from_secs(10),
        "the killed holder's lease to run out",
        || status_json("crash", backend, env)["held"] == false,
    );
    let json = status_json("crash", backend, env);
    if crash == Crash::Expired {
        let last = &json["lastTerm"];
        assert_eq!(last["holder"], "runner-2", "{json}");
        assert_eq!(last["ended"], "expired", "{json}");
        assert!(last["endedAgoMs"].as_u64().is_some(), "{json}");
    } else {
        assert!(json["lastTerm"].is_null(), "{json}");
    }
}

/// What status shows after a holder was killed with `kill -9` and its lease ran out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Crash {
    /// The expired term: its holder, `expired`, when.
    Expired,
    /// Nothing: the store dropped the lease with its ttl (Redis).
    Forgotten,
    /// Not checked: a Kubernetes Lease's expiry is counted from when the reader first saw
    /// it (client-go's rule: the writer's clock is never trusted), so a fresh `tenure status`
    /// shows a dead holder's Lease as held for one lease duration, every time.
    NotChecked,
}

#[test]
fn local_status_names_the_last_holder_and_when_it_released() {
    let dir = TempDir::new("cli-status-local");
    let state = dir.path().join("state").display().to_string();
    scenario(
        &cli_support::strings(&["--state-dir", &state]),
        &[],
        true,
        Crash::Expired,
    );
}

#[test]
fn redis_status_names_the_last_holder_while_its_tombstone_lasts() {
    let server = RedisServer::start();
    let url = server.url();
    scenario(
        &cli_support::strings(&["--backend", &url]),
        &[],
        false,
        Crash::Forgotten,
    );
}

#[test]
fn kube_status_names_the_last_holder_and_when_it_released() {
    let server = kube_support::shared();
    let ns = kube_support::unique("status");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
        .block_on(server.namespace(&ns));
    let kubeconfig = server.admin_kubeconfig().display().to_string();
    scenario(
        &cli_support::strings(&["--backend", "kube", "--namespace", &ns]),
        &[("KUBECONFIG", kubeconfig.as_str())],
        true,
        Crash::NotChecked,
    );
}

/// `tenure status --require-leader` (the chart's `helm test`): exit 10 with a line naming the
/// lease while nobody holds it, 0 while someone does; without the flag 0 either way. With
/// `--shards`, 10 until every shard's lease is held.
fn require_leader(backend: &[String], env: &[(&str, &str)]) {
    let dir = TempDir::new("cli-status-require");
    let check = |lease: &str, extra: &[&str]| {
        let mut args = with(&["status", "--lease", lease, "--require-leader"], backend);
        args.extend(cli_support::strings(extra));
        tenure(&args, env)
    };
    // Nobody holds it: 10, the table still printed, one line naming the lease.
    let (code, out, err) = check("leads", &[]);
    assert_eq!(code, 10, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("<none>"), "{out}");
    assert!(
        err.contains("tenure: nobody holds lease \"leads\""),
        "{err}"
    );
    let (code, _, err) = tenure(&with(&["status", "--lease", "leads"], backend), env);
    assert_eq!(code, 0, "without --require-leader: {err}");
    let (code, out, err) = check("group", &["--shards", "2", "-o", "json"]);
    assert_eq!(code, 10, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("nobody holds the lease of 2 of the 2 shards of \"group\": shard 0, 1"),
        "{err}"
    );

    // A holder: 0.
    let pid = dir.path().join("pid");
    let mut run = with(&["run", "--lease", "leads", "--identity", "one"], backend);
    run.extend(cli_support::strings(&cli_support::FAST));
    run.extend(cli_support::strings(&[
        "--",
        "sh",
        "-c",
        &format!("echo $$ > {}; exec sleep 60", pid.display()),
    ]));
    let mut single = Tenure::start(&run, env, dir.path().join("single.err"));
    read_pid(&pid, Duration::from_secs(30));
    let (code, out, err) = check("leads", &[]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("one"), "{out}");

    // A group whose one replica holds both shards: 0 once both are held.
    let mut run = with(
        &[
            "run",
            "--lease",
            "group",
            "--identity",
            "two",
            "--shards",
            "2",
        ],
        backend,
    );
    run.extend(cli_support::strings(&cli_support::FAST));
    run.extend(cli_support::strings(&["--", "sleep", "60"]));
    let mut group = Tenure::start(&run, env, dir.path().join("group.err"));
    wait_until(
        Duration::from_secs(30),
        "both shards held (status --require-leader exits 0)",
        || check("group", &["--shards", "2"]).0 == 0,
    );
    for holder in [&mut single, &mut group] {
        holder.signal(libc::SIGTERM);
        holder.wait(Duration::from_secs(15));
    }
    // Released: nobody leads again.
    let (code, _, err) = check("leads", &[]);
    assert_eq!(code, 10, "after the release: {err}");
}

#[test]
fn local_status_require_leader_exits_10_while_nobody_leads() {
    let dir = TempDir::new("cli-status-require-local");
    let state = dir.path().join("state").display().to_string();
    require_leader(&cli_support::strings(&["--state-dir", &state]), &[]);
}

#[test]
fn kube_status_require_leader_exits_10_while_nobody_leads() {
    let server = kube_support::shared();
    let ns = kube_support::unique("require");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
        .block_on(server.namespace(&ns));
    let kubeconfig = server.admin_kubeconfig().display().to_string();
    require_leader(
        &cli_support::strings(&["--backend", "kube", "--namespace", &ns]),
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
}
