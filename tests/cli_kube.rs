//! The real `tenure` binary on a real kube-apiserver: two replicas on one Lease, hand-over on
//! exit and on `kill -9`, the Lease as client-go writes it, and `tenure status`.

mod cli_support;
mod kube_support;

use std::time::Duration;

use cli_support::{
    FAST, Tenure, alive, assert_one_at_a_time, events, now_ns, read_pid, run_to_end, strings,
    wait_until, worker,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn two_replicas_on_a_lease_hand_over_on_exit_and_on_kill_9() {
    let server = kube_support::shared();
    let ns = kube_support::unique("cli");
    runtime().block_on(server.namespace(&ns));
    let kubeconfig = server.admin_kubeconfig().display().to_string();
    let env = [("KUBECONFIG", kubeconfig.as_str())];
    let dir = kube_support::fresh_dir("cli");
    let p = |n: &str| dir.join(n);
    let log = p("log");
    let run_args = |id: &str, command: Vec<String>| {
        let mut a = strings(&[
            "run",
            "--lease",
            "worker",
            "--backend",
            "kube",
            "--namespace",
            &ns,
        ]);
        a.extend(strings(&FAST));
        a.extend(strings(&["--identity", id, "--"]));
        a.extend(command);
        a
    };
    let mut a = Tenure::start(
        &run_args("a", worker(&log, &p("pa"), -1.0, 0)),
        &env,
        p("ea"),
    );
    let pid_a = read_pid(&p("pa"), Duration::from_secs(20));
    let mut b = Tenure::start(
        &run_args("b", worker(&log, &p("pb"), 1.0, 0)),
        &env,
        p("eb"),
    );
    let mut c = Tenure::start(
        &run_args("c", worker(&log, &p("pc"), 1.0, 0)),
        &env,
        p("ec"),
    );
    std::thread::sleep(Duration::from_millis(500));

    // The Lease names a as holder, as client-go would.
    let (code, out, err) = run_to_end(
        &[
            "status",
            "--lease",
            "worker",
            "--backend",
            "kube",
            "--namespace",
            &ns,
            "-o",
            "json",
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"holder\":\"a\""), "{out}");
    let lease = runtime()
        .block_on(server.lease(&ns, "worker"))
        .unwrap_or_else(|| panic!("no Lease"));
    assert_eq!(
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref()),
        Some("a")
    );

    a.signal(libc::SIGKILL);
    a.wait(Duration::from_secs(5));
    wait_until(Duration::from_secs(5), "a's command to die with a", || {
        !alive(pid_a)
    });
    let death = now_ns();
    assert!(b.wait(Duration::from_secs(40)).success(), "{}", b.log());
    assert!(c.wait(Duration::from_secs(40)).success(), "{}", c.log());
    let ev = events(&log);
    assert_eq!(ev.iter().filter(|e| e.kind == "start").count(), 3, "{ev:?}");
    assert_one_at_a_time(&ev, &[(pid_a, death)]);
}
