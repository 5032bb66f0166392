//! The rules `tenure run` holds every job to before it campaigns, the same on every backend: one
//! rule for lease names (Kubernetes'), complete messages for refused durations, and no
//! Kubernetes namespace nobody chose.

mod cli_support;
#[path = "support/tempdir.rs"]
mod tempdir;

use cli_support::run_to_end;
use tempdir::TempDir;

/// The one error line of a refused invocation.
fn error_line(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("tenure: ") && !l.starts_with("tenure: warning:"))
        .collect();
    assert_eq!(lines.len(), 1, "expected one error line: {stderr}");
    lines[0].to_owned()
}

#[test]
fn a_lease_name_one_backend_refuses_is_refused_on_every_backend_with_one_message() {
    let dir = TempDir::new("cli-rules-names");
    let state = dir.path().join("state");
    let state = state.display().to_string();
    let mut messages = Vec::new();
    for backend in [
        vec!["--state-dir", &state],
        vec!["--backend", "redis://127.0.0.1:1"],
        vec!["--backend", "kube", "--namespace", "jobs"],
    ] {
        for name in ["NightlyReport", "cron:daily", "x-", "a..b"] {
            let mut args = vec!["run", "--lease", name];
            args.extend(&backend);
            args.extend(["--", "true"]);
            let (code, _, err) = run_to_end(&args, &[]);
            assert_eq!(code, 2, "{backend:?} {name}: {err}");
            let line = error_line(&err);
            assert!(
                line.contains("is not a lease name") && line.contains("on every backend"),
                "{line}"
            );
            messages.push((name, line));
        }
    }
    // The same words whatever the backend.
    for name in ["NightlyReport", "cron:daily", "x-", "a..b"] {
        let lines: std::collections::BTreeSet<&String> = messages
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, l)| l)
            .collect();
        assert_eq!(lines.len(), 1, "{name}: {lines:?}");
    }
    let nightly = &messages[0].1;
    assert!(nightly.contains("e.g. \"nightlyreport\""), "{nightly}");
    // And a name every backend takes still runs.
    let (code, _, err) = run_to_end(
        &[
            "run",
            "--lease",
            "nightly-report.v2",
            "--state-dir",
            &state,
            "--",
            "true",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_renew_deadline_refused_for_the_lease_is_explained_to_the_end_with_its_fix() {
    let (code, _, err) = run_to_end(
        &[
            "run",
            "--lease",
            "job",
            "--lease-duration",
            "30s",
            "--",
            "true",
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    let line = error_line(&err);
    assert!(
        line.contains(
            "--renew-deadline (10s) must be longer than a third of --lease-duration (30s)"
        ) && line.contains("ends every term before its first renewal")
            && line.contains("set --renew-deadline to about two thirds of the lease (20s for 30s)"),
        "{line}"
    );
}

/// A kubeconfig whose one context names no namespace (its server is never reached).
fn kubeconfig_without_namespace(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\ncurrent-context: dev\n\
         clusters:\n- name: dev\n  cluster:\n    server: https://127.0.0.1:1\n\
         contexts:\n- name: dev\n  context:\n    cluster: dev\n    user: dev\n\
         users:\n- name: dev\n  user:\n    token: x\n",
    )
    .expect("write");
    path
}

#[test]
fn without_a_namespace_anywhere_the_kube_backend_refuses_to_campaign() {
    let dir = TempDir::new("cli-rules-ns");
    let kubeconfig = kubeconfig_without_namespace(dir.path());
    let kubeconfig = kubeconfig.display().to_string();
    let (code, _, err) = run_to_end(
        &["run", "--lease", "job", "--backend", "kube", "--", "true"],
        &[("KUBECONFIG", &kubeconfig)],
    );
    assert_eq!(code, 2, "{err}");
    let line = error_line(&err);
    assert!(
        line.contains("no namespace chosen")
            && line.contains("context \"dev\"")
            && line.contains("--namespace"),
        "{line}"
    );
    // With one named (the flag, or $POD_NAMESPACE as in a pod) it goes on: to the server,
    // which is not there.
    for env in [vec![], vec![("POD_NAMESPACE", "jobs")]] {
        let mut args = vec!["run", "--lease", "job", "--backend", "kube"];
        if env.is_empty() {
            args.extend(["--namespace", "jobs"]);
        }
        args.extend(["--", "true"]);
        let mut all = env.clone();
        all.push(("KUBECONFIG", &kubeconfig));
        let (code, _, err) = run_to_end(&args, &all);
        assert_ne!(code, 0, "{err}");
        assert!(!err.contains("no namespace chosen"), "{err}");
    }
}
