//! Writers that are not Rust, fenced on the real API server with no code change: kubectl, Helm,
//! a Python HTTP client and a client-go program run as `tenure run --fence` commands (issue #24), as a
//! ServiceAccount whose lease and impersonation RBAC is exactly what `tenure policy` prints
//! (applied with kubectl, with the policy from the same output). In a live term
//! their writes go through the term's endpoint and are admitted; a participant's write that
//! bypasses it is refused by the policy; after a freeze and a takeover the old command's
//! writes never land after the new term's (a watch of the object is the judge); an ended
//! term's kubeconfig no longer works; the endpoint refuses a wrong secret and, after its
//! term, answers with a message that names tenure and the tokens; a crowd of idle strangers
//! larger than tenure's descriptor limit starves neither the command's writes nor the probe.

mod cli_support;
mod kube_support;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cli_support::{Tenure, wait_until};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use kube_support::fencing::{self, apply, obj};
use kube_support::{kubectl, shared, unique};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A ServiceAccount `bare` in `ns` that may use leases and write events but not impersonate:
/// a worker whose fence cannot be carried. Its kubeconfig.
async fn bare_worker(ns: &str) -> std::path::PathBuf {
    let admin = shared().admin().await;
    apply(
        &Api::<Role>::namespaced(admin.clone(), ns),
        "bare",
        &obj(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "bare"},
            "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
            ]
        })),
    )
    .await;
    apply(
        &Api::<RoleBinding>::namespaced(admin, ns),
        "bare",
        &obj(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "bare"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bare"},
            "subjects": [{"kind": "ServiceAccount", "name": "bare", "namespace": ns}]
        })),
    )
    .await;
    fencing::service_account(ns, "bare").await.1
}

/// A namespace with the ServiceAccount `worker` whose lease and impersonation RBAC is exactly
/// what `tenure policy` prints (applied with kubectl, as a user would), plus the workload's
/// own (configmaps, and secrets for Helm's release records); the fencing policy of `lease`
/// from the same output, enforced. The worker's kubeconfig.
async fn fenced_namespace(lease: &str) -> (String, std::path::PathBuf) {
    fenced_namespace_with(lease, &[]).await
}

/// [`fenced_namespace`] with `tenure policy`'s output for these extra flags (`--prefer
/// newest`).
async fn fenced_namespace_with(lease: &str, flags: &[&str]) -> (String, std::path::PathBuf) {
    let server = shared();
    let ns = unique("workers");
    server.namespace(&ns).await;
    let (client, kubeconfig) = fencing::service_account(&ns, "worker").await;
    let printed = Command::new(cli_support::TENURE)
        .args([
            "policy",
            "--lease",
            lease,
            "--namespace",
            &ns,
            "--service-account",
            "worker",
        ])
        .args(flags)
        .output()
        .unwrap_or_else(|e| panic!("tenure policy: {e}"));
    assert!(printed.status.success(), "{printed:?}");
    // The anchor is shared by every election: the tests of this file apply it at once, and two
    // `kubectl apply`s that both find it missing race to create it (AlreadyExists). Applying again is what a user would do; it is idempotent.
    let apply_printed = || {
        let mut child = Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(server.admin_kubeconfig())
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("kubectl: {e}"));
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write;
            stdin
                .write_all(&printed.stdout)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("kubectl apply: {e}"))
    };
    let mut applied = apply_printed();
    for _ in 0..3 {
        if applied.status.success()
            || !String::from_utf8_lossy(&applied.stderr).contains("AlreadyExists")
        {
            break;
        }
        applied = apply_printed();
    }
    assert!(applied.status.success(), "kubectl apply: {applied:?}");
    let admin = server.admin().await;
    apply(
        &Api::<Role>::namespaced(admin.clone(), &ns),
        "workload",
        &obj(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "workload"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["*"]}]
        })),
    )
    .await;
    apply(
        &Api::<RoleBinding>::namespaced(admin, &ns),
        "workload",
        &obj(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "workload"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workload"},
            "subjects": [{"kind": "ServiceAccount", "name": "worker", "namespace": ns}]
        })),
    )
    .await;
    // Enforced once the worker's own write without a token is refused by this policy.
    let policy = tenure::fence::kube::FencingPolicy::new(&ns, lease)
        .unwrap_or_else(|e| panic!("{e}"))
        .name();
    fencing::wait_until_enforced(&Api::namespaced(client, &ns), &policy).await;
    (ns, kubeconfig)
}

/// A chart with one ConfigMap, for `helm install`.
fn tiny_chart(dir: &Path) -> std::path::PathBuf {
    let chart = dir.join("chart");
    std::fs::create_dir_all(chart.join("templates")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: fenced\nversion: 0.1.0\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        chart.join("templates/cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-helm\ndata:\n  token: {{ .Values.token | quote }}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    chart
}

/// Creates a ConfigMap through the term's endpoint with nothing but Python's standard
/// library: the URL from the environment, as any HTTP client would.
const PYTHON_WRITER: &str = r#"
import json, os, sys, urllib.request, urllib.error
server = os.environ["TENURE_KUBE_SERVER"]
name, ns = sys.argv[1], sys.argv[2]
body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                   "data": {"token": os.environ["TENURE_FENCING_TOKEN"]}}).encode()
req = urllib.request.Request(server + "/api/v1/namespaces/" + ns + "/configmaps", data=body,
                             method="POST", headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=20) as r:
        print("python", r.status)
except urllib.error.HTTPError as e:
    print("python refused", e.code, e.read().decode())
    sys.exit(1)
"#;

fn kubectl_as(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("kubectl: {e}"));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn kubectl_helm_python_and_go_write_fenced_in_a_live_term() {
    let rt = runtime();
    let lease = "fenced-job";
    let (ns, worker_kubeconfig) = rt.block_on(fenced_namespace(lease));
    let dir = kube_support::fresh_dir("fence-workers");
    let chart = tiny_chart(&dir);
    let python = dir.join("writer.py");
    std::fs::write(&python, PYTHON_WRITER).unwrap_or_else(|e| panic!("{e}"));
    let out = dir.join("out");
    let script = format!(
        r#"set -e
cp "$KUBECONFIG" {dir}/seen.kubeconfig
stat -c %a "$KUBECONFIG" > {dir}/file-mode
stat -c %a "$(dirname "$KUBECONFIG")" > {dir}/dir-mode
export HOME={dir}
{kubectl} create configmap from-kubectl --from-literal=token=$TENURE_FENCING_TOKEN
{helm} install fenced {chart} --set token=$TENURE_FENCING_TOKEN --wait=false
python3 {python} from-python {ns}
{go} {ns} from-go
u=${{TENURE_KUBE_SERVER#http://}}; hp=${{u%%/*}}; prefix=/${{u#*/}}
body='{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"from-nc"}},"data":{{"token":"'$TENURE_FENCING_TOKEN'"}}}}'
printf 'POST %s/api/v1/namespaces/{ns}/configmaps HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %s\r\n\r\n%s' "$prefix" "${{#body}}" "$body" | busybox nc -w 10 127.0.0.1 "${{hp#*:}}" | head -1
echo done"#,
        dir = dir.display(),
        kubectl = kubectl().display(),
        helm = kube_support::helm().display(),
        chart = chart.display(),
        python = python.display(),
        go = kube_support::fenced_writer().display(),
    );
    let kubeconfig = worker_kubeconfig.display().to_string();
    let args = cli_support::run_args(
        lease,
        &["--backend", "kube", "--namespace", &ns],
        &["--identity", "w1", "--fence"],
        vec![
            "sh".into(),
            "-c".into(),
            format!("{script} > {} 2>&1", out.display()),
        ],
    );
    let mut tenure = Tenure::start(&args, &[("KUBECONFIG", &kubeconfig)], dir.join("err"));
    let status = tenure.wait(Duration::from_secs(120));
    let said = std::fs::read_to_string(&out).unwrap_or_default();
    assert_eq!(
        status.code(),
        Some(0),
        "command: {said}\ntenure: {}",
        tenure.log()
    );
    assert!(tenure.log().contains("fence proven"), "{}", tenure.log());

    // Every client's object exists, with the term's token.
    let admin = rt.block_on(shared().admin());
    let cms: Api<ConfigMap> = Api::namespaced(admin, &ns);
    let mut tokens = Vec::new();
    for name in [
        "from-kubectl",
        "from-helm",
        "from-python",
        "from-go",
        "from-nc",
    ] {
        let cm = rt
            .block_on(cms.get(name))
            .unwrap_or_else(|e| panic!("{name}: {e}; command said: {said}"));
        tokens.push(
            cm.data
                .unwrap_or_default()
                .remove("token")
                .unwrap_or_default(),
        );
    }
    assert!(
        tokens.iter().all(|t| !t.is_empty() && *t == tokens[0]),
        "{tokens:?}"
    );

    // The files were private to this user.
    let mode = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    assert_eq!(mode("file-mode").trim(), "600");
    assert_eq!(mode("dir-mode").trim(), "700");

    // The policy is on: the same ServiceAccount writing around the endpoint is refused, with a
    // message that names tenure and how a client sends its token.
    let (ok, text) = kubectl_as(
        &worker_kubeconfig,
        &[
            "-n",
            &ns,
            "create",
            "configmap",
            "around",
            "--from-literal=v=1",
        ],
    );
    assert!(
        !ok,
        "a participant's write without a token must be refused: {text}"
    );
    assert!(
        text.contains("tenure fencing") && text.contains("missing token"),
        "{text}"
    );
    assert!(text.contains("tenure run --fence"), "{text}");

    // The ended term's kubeconfig no longer reaches anything.
    let (ok, text) = kubectl_as(&dir.join("seen.kubeconfig"), &["get", "configmaps"]);
    assert!(!ok, "an ended term's kubeconfig must not work: {text}");
}

/// The endpoint itself: a URL with a wrong secret gets 401 (naming no lease, and not a panic
/// for a path that splits a character where the secret ends); after its term has ended (the lease lost
/// while the command could still call), every request gets 403 naming tenure and the term's
/// token — and the current term's once the elector has seen it.
#[test]
fn the_endpoint_refuses_strangers_and_everything_after_its_term() {
    use tenure::backend::faulty::{Fault, FaultyBackend};
    use tenure::election::{ElectionConfig, LeaderElector};
    use tenure::fence::kube::{FenceProxy, Fencer};

    let rt = runtime();
    let lease = "fenced-proxy";
    let (ns, worker_kubeconfig) = rt.block_on(fenced_namespace(lease));
    // a's term must last through the URL checks below: a renewal every 2 s, due within 2 s
    // more, and no request bound of our own (a 400 ms one on a 3 s lease gave a renewal one
    // attempt, which a loaded API server missed now and then, #42). The store going silent
    // below is `Fault::Fail`, which fails at once: no bound is needed to notice it.
    let config = ElectionConfig::default()
        .lease_duration(Duration::from_secs(6))
        .renew_deadline(Duration::from_secs(4))
        .retry_period(Duration::from_secs(1))
        .stop_margin(Duration::from_millis(200));
    rt.block_on(async {
        let server = shared();
        let client = server.client_from(&worker_kubeconfig).await;
        let fencer = Fencer::new(client.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .lease_namespace(&ns);
        let backend = |client: kube::Client| {
            tenure::backend::kube::KubeBackend::from_client(
                client,
                tenure::backend::kube::KubeOptions::new().namespace(ns.clone()),
            )
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let faulty = FaultyBackend::new(backend(client.clone()));
        let a = LeaderElector::new(
            tenure::Locker::with_identity(faulty.clone(), "a").unwrap_or_else(|e| panic!("{e}")),
            lease,
            config.clone().rejoin(true),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let kept: Arc<Mutex<Option<(FenceProxy, u64)>>> = Arc::default();
        let (kept_in, fencer_in, leader) = (kept.clone(), fencer.clone(), a.leader());
        let run_a = tokio::spawn(async move {
            a.run(|term| {
                let (kept, fencer, leader) = (kept_in.clone(), fencer_in.clone(), leader.clone());
                async move {
                    let proxy = FenceProxy::start(&fencer, &term, Some(leader))
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                    *kept.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some((proxy, term.fencing_token().get()));
                    std::future::pending::<()>().await;
                }
            })
            .await
        });
        let started = tokio::time::Instant::now();
        let (url, ours) = loop {
            if let Some((proxy, token)) = &*kept.lock().unwrap_or_else(|e| e.into_inner()) {
                break (proxy.url(), *token);
            }
            assert!(started.elapsed() < Duration::from_secs(20), "a never led");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let get = |base: String| {
            let url = format!("{base}/api/v1/namespaces/{ns}/configmaps");
            async move {
                let out = tokio::process::Command::new("python3")
                    .arg("-c")
                    .arg(
                        "import sys, urllib.request, urllib.error\n\
                         req = urllib.request.Request(sys.argv[1])\n\
                         try:\n    print(urllib.request.urlopen(req, timeout=10).status)\n\
                         except urllib.error.HTTPError as e:\n    print(e.code, e.read().decode())\n",
                    )
                    .arg(url)
                    .output()
                    .await
                    .unwrap_or_else(|e| panic!("python3: {e}"));
                String::from_utf8_lossy(&out.stdout).into_owned()
            }
        };
        assert!(get(url.clone()).await.starts_with("200"), "the term's own URL is served");
        let stranger = get(format!("{}x", &url[..url.len() - 1])).await;
        assert!(stranger.starts_with("401") && stranger.contains("tenure"), "{stranger}");
        assert!(
            !stranger.contains(lease) && !stranger.contains(&ns),
            "a client without the secret learns no lease: {stranger}"
        );
        // A two-byte character straddling the secret's last byte (issue #40): 401, as raw
        // bytes on the wire (urllib would not send them), and the endpoint still serves.
        let (host, secret_path) = url
            .strip_prefix("http://")
            .and_then(|rest| rest.split_once('/'))
            .unwrap_or_else(|| panic!("an endpoint URL: {url}"));
        let split = format!("/term/{}é/api", "a".repeat(secret_path.len() - "term/".len() - 1));
        let answer = {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut stream = tokio::net::TcpStream::connect(host)
                .await
                .unwrap_or_else(|e| panic!("connect: {e}"));
            stream
                .write_all(format!("GET {split} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
                .await
                .unwrap_or_else(|e| panic!("send: {e}"));
            let mut answer = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
                .await
                .unwrap_or_else(|_| panic!("no answer to {split}"))
                .unwrap_or_else(|e| panic!("read: {e}"));
            String::from_utf8_lossy(&answer).into_owned()
        };
        assert!(answer.starts_with("HTTP/1.1 401 "), "{split}: {answer:?}");
        assert!(get(url.clone()).await.starts_with("200"), "still served");

        // a's store goes silent: its term ends by the renew deadline; b takes over.
        faulty.set(Fault::Fail);
        let b = LeaderElector::new(
            tenure::Locker::with_identity(backend(client.clone()), "b")
                .unwrap_or_else(|e| panic!("{e}")),
            lease,
            config,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let (told, b_token) = tokio::sync::oneshot::channel();
        let told = Mutex::new(Some(told));
        let run_b = tokio::spawn(async move {
            b.run(|term| {
                if let Some(told) = told.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    let _ = told.send(term.fencing_token().get());
                }
                std::future::pending::<()>()
            })
            .await
        });
        let b_token = tokio::time::timeout(Duration::from_secs(30), b_token)
            .await
            .unwrap_or_else(|_| panic!("b never led"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(b_token > ours);
        let after = get(url.clone()).await;
        assert!(
            after.starts_with("403")
                && after.contains("tenure fencing")
                && after.contains(&format!("token {ours}")),
            "{after}"
        );
        // Once a sees the store again, the refusal names the term that followed.
        faulty.heal();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let text = get(url.clone()).await;
            if text.contains(&format!("current token {b_token} held by b")) {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{text}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        run_a.abort();
        run_b.abort();
    });
}

/// Freeze-and-thaw takeovers with kubectl writing in a loop on both replicas: no write of an
/// old term lands after the next term's first write (judged by a watch of the object, in
/// the API server's order), and what the old command hears names tenure and its token.
#[test]
fn a_frozen_commands_writes_never_land_after_the_next_terms() {
    freeze_and_thaw("fenced-loop", |dir, _ns, id| {
        let log = dir.join(format!("{id}.log"));
        let command = kube_support::kubectl_writer_loop(&dir.join(format!("{id}-home")), &log);
        (log, command)
    });
}

/// The Python `kubernetes` client (PyPI; `e2e/scripts/python-kubernetes.sh` installs it),
/// writing in a loop: `load_kube_config()` reads the KUBECONFIG `tenure run --fence` gives
/// each term's command. Prints lines as the kubectl loop does.
const PYTHON_CLIENT_WRITER: &str = r#"
import os, sys, time
from kubernetes import client, config
from kubernetes.client.rest import ApiException
ns, log = sys.argv[1], sys.argv[2]
token = os.environ["TENURE_FENCING_TOKEN"]
config.load_kube_config()
api = client.CoreV1Api()
with open(log, "a", buffering=1) as out:
    i = 0
    while True:
        i += 1
        patch = {"metadata": {"annotations": {"w": "%s-%d" % (token, i)}}}
        try:
            api.patch_namespaced_config_map("target", ns, patch, _request_timeout=10)
            out.write("ok %s %d\n" % (token, i))
        except ApiException as e:
            body = (e.body or "").replace("\n", " ")
            out.write("refused %s %d %s %s\n" % (token, i, e.status, body))
        except Exception as e:
            # The term's endpoint gone (its term over): not an answer from the API server.
            out.write("failed %s %d %r\n" % (token, i, e))
            time.sleep(0.2)
"#;

/// As above, with the Python `kubernetes` client writing (issue #45).
#[test]
fn a_frozen_python_clients_writes_never_land_after_the_next_terms() {
    let out = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/scripts/python-kubernetes.sh"))
        .output()
        .unwrap_or_else(|e| panic!("python-kubernetes.sh: {e}"));
    assert!(
        out.status.success(),
        "installing the Python kubernetes client (PyPI) failed: {out:?}"
    );
    let site = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    freeze_and_thaw("fenced-python", |dir, ns, id| {
        let log = dir.join(format!("{id}.log"));
        let script = dir.join("writer.py");
        std::fs::write(&script, PYTHON_CLIENT_WRITER).unwrap_or_else(|e| panic!("{e}"));
        let command = vec![
            "env".into(),
            format!("PYTHONPATH={site}"),
            "python3".into(),
            script.display().to_string(),
            ns.to_owned(),
            log.display().to_string(),
        ];
        (log, command)
    });
}

/// Two `tenure run --fence --rejoin` replicas whose commands (from `writer(dir, namespace,
/// id)`: its log and command line) write `w=<token>-<i>` to one ConfigMap nonstop; three
/// rounds freeze the leader until the other has written. 0 stale writes accepted.
fn freeze_and_thaw(
    lease: &str,
    writer: impl Fn(&Path, &str, &str) -> (std::path::PathBuf, Vec<String>),
) {
    let rt = runtime();
    let (ns, worker_kubeconfig) = rt.block_on(fenced_namespace(lease));
    let dir = kube_support::fresh_dir(lease);
    let admin = rt.block_on(shared().admin());
    let cms: Api<ConfigMap> = Api::namespaced(admin, &ns);
    rt.block_on(cms.create(&PostParams::default(), &fencing::cm("target", "0")))
        .unwrap_or_else(|e| panic!("{e}"));

    // Every version of the object, in the API server's order: (token, i) of its writer.
    let history: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let seen = history.clone();
    let watch = rt.spawn(async move {
        let mut stream = kube::runtime::watcher(
            cms,
            kube::runtime::watcher::Config::default().fields("metadata.name=target"),
        )
        .boxed();
        while let Some(event) = stream.next().await {
            if let Ok(kube::runtime::watcher::Event::Apply(cm)) = event
                && let Some(w) = cm.metadata.annotations.and_then(|mut a| a.remove("w"))
                && let Some((t, i)) = w.split_once('-')
                && let (Ok(t), Ok(i)) = (t.parse(), i.parse())
            {
                seen.lock().unwrap_or_else(|e| e.into_inner()).push((t, i));
            }
        }
    });

    let writer = |id: &str| writer(&dir, &ns, id);
    let kubeconfig = worker_kubeconfig.display().to_string();
    let start = |id: &str, command: Vec<String>| {
        Tenure::start(
            &cli_support::run_args(
                lease,
                &["--backend", "kube", "--namespace", &ns],
                &["--identity", id, "--fence", "--rejoin"],
                command,
            ),
            &[("KUBECONFIG", &kubeconfig)],
            dir.join(format!("{id}.err")),
        )
    };
    let read = |log: &Path| std::fs::read_to_string(log).unwrap_or_default();
    let (log_a, cmd_a) = writer("a");
    let (log_b, cmd_b) = writer("b");
    let a = start("a", cmd_a);
    wait_until(Duration::from_secs(30), "a's first fenced write", || {
        read(&log_a).contains("ok ")
    });
    let b = start("b", cmd_b);
    let mut frozen_rounds = 0;
    for round in 0..3 {
        // Freeze whoever leads (tenure and its command's process group, as a paused pod),
        // until the other has written; then thaw it.
        std::thread::sleep(Duration::from_millis(700));
        let (leader, other_log) = if round % 2 == 0 {
            (&a, &log_b)
        } else {
            (&b, &log_a)
        };
        let written_before = read(other_log).matches("ok ").count();
        let group = kube_support::child_process_groups(leader.pid());
        leader.signal(libc::SIGSTOP);
        for g in &group {
            // SAFETY: signalling a process group our child created.
            unsafe { libc::kill(-g, libc::SIGSTOP) };
        }
        wait_until(Duration::from_secs(30), "the other replica's write", || {
            read(other_log).matches("ok ").count() > written_before
        });
        for g in &group {
            // SAFETY: as above.
            unsafe { libc::kill(-g, libc::SIGCONT) };
        }
        leader.signal(libc::SIGCONT);
        frozen_rounds += 1;
    }
    std::thread::sleep(Duration::from_secs(2));
    drop(a);
    drop(b);
    watch.abort();

    let history = history.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let stale = kube_support::landed_after_newer(&history);
    let tokens: std::collections::BTreeSet<u64> = history.iter().map(|h| h.0).collect();
    let refused =
        read(&log_a).matches("refused ").count() + read(&log_b).matches("refused ").count();
    eprintln!(
        "{frozen_rounds} freezes, {} versions, terms {tokens:?}, stale accepted {}, refusals heard by old commands {refused}",
        history.len(),
        stale.len()
    );
    assert!(tokens.len() >= 3, "takeovers happened: {tokens:?}");
    assert!(
        stale.is_empty(),
        "stale writes accepted after a newer term's: {stale:?}"
    );
    for line in read(&log_a).lines().chain(read(&log_b).lines()) {
        if let Some(rest) = line.strip_prefix("refused ") {
            let token = rest.split(' ').next().unwrap_or_default();
            assert!(
                rest.contains("tenure") && rest.contains(token),
                "a refusal names tenure and the token: {line}"
            );
        }
    }
}

/// A shutdown signal while a term's fence is being proven: the term ends before its command
/// started, so none is started, and no verdict is logged — a proof cut short by the term's end
/// says nothing about the fence (it used to log a false "NOT enforced" and start the command
/// only to signal it 20 µs later). The policy is removed first, so the proof waits out its
/// whole window (the lower token admitted) and the signal lands inside it.
#[test]
fn a_signal_during_the_fence_proof_starts_no_command() {
    let rt = runtime();
    let lease = "fenced-stop";
    let (ns, worker_kubeconfig) = rt.block_on(fenced_namespace(lease));
    let policy = tenure::fence::kube::FencingPolicy::new(&ns, lease)
        .unwrap_or_else(|e| panic!("{e}"))
        .name();
    rt.block_on(remove_policy(&policy, &worker_kubeconfig, &ns));
    let dir = kube_support::fresh_dir("fence-stop");
    let marker = dir.join("started");
    let kubeconfig = worker_kubeconfig.display().to_string();
    let mut tenure = Tenure::start(
        &cli_support::run_args(
            lease,
            &["--backend", "kube", "--namespace", &ns],
            &["--identity", "a", "--fence"],
            vec![
                "sh".into(),
                "-c".into(),
                format!("touch {}; sleep 30", marker.display()),
            ],
        ),
        &[("KUBECONFIG", &kubeconfig)],
        dir.join("a.err"),
    );
    let admin = rt.block_on(shared().admin());
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(admin, &ns);
    // The term began (the Lease names us): its proof now runs for up to 3 s.
    wait_until(Duration::from_secs(30), "the grant", || {
        rt.block_on(leases.get_opt(lease))
            .ok()
            .flatten()
            .and_then(|l| l.spec.and_then(|s| s.holder_identity))
            .as_deref()
            == Some("a")
    });
    std::thread::sleep(Duration::from_millis(300));
    tenure.signal(libc::SIGTERM);
    let status = tenure.wait(Duration::from_secs(20));
    let log = tenure.log();
    assert!(!marker.exists(), "the command was started: {log}");
    assert!(!log.contains("NOT enforced"), "a false verdict: {log}");
    assert!(log.contains("ended before its command started"), "{log}");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{log}");
}

/// `--fence` refuses to run unfenced: without the RBAC to carry its token (no `impersonate`),
/// or with no policy installed, the proof fails and the command never starts; tenure exits 8
/// naming what is missing (it used to run the command, log two errors, and exit 0 having
/// written nothing).
#[test]
fn a_fence_that_cannot_be_proven_starts_no_command_and_exits_8() {
    let rt = runtime();
    let lease = "fenced-closed";
    let (ns, worker_kubeconfig) = rt.block_on(fenced_namespace(lease));
    let dir = kube_support::fresh_dir("fence-closed");
    // A ServiceAccount that may lead (the Lease, Events) but not impersonate itself.
    let bare = rt.block_on(bare_worker(&ns));
    let run = |kubeconfig: &Path, lease: &str, who: &str| {
        let marker = dir.join(format!("{who}-started"));
        let mut tenure = Tenure::start(
            &cli_support::run_args(
                lease,
                &["--backend", "kube", "--namespace", &ns],
                &["--identity", who, "--fence"],
                vec![
                    "sh".into(),
                    "-c".into(),
                    format!("touch {}; sleep 30", marker.display()),
                ],
            ),
            &[("KUBECONFIG", &kubeconfig.display().to_string())],
            dir.join(format!("{who}.err")),
        );
        let status = tenure.wait(Duration::from_secs(30));
        (status, tenure.log(), marker.exists())
    };
    // No impersonation RBAC.
    let (status, log, started) = run(&bare, "fenced-bare", "bare");
    assert!(!started, "the command was started: {log}");
    assert_eq!(status.code(), Some(8), "{log}");
    assert!(
        log.contains("the command was not started") && log.contains("impersonate"),
        "{log}"
    );
    // The policy of this election removed: nothing refuses the lower token.
    let policy = tenure::fence::kube::FencingPolicy::new(&ns, lease)
        .unwrap_or_else(|e| panic!("{e}"))
        .name();
    rt.block_on(remove_policy(&policy, &worker_kubeconfig, &ns));
    let (status, log, started) = run(&worker_kubeconfig, lease, "worker");
    assert!(!started, "the command was started: {log}");
    assert_eq!(status.code(), Some(8), "{log}");
    assert!(
        log.contains(&format!("tenure-fencing.{ns}.{lease}")),
        "{log}"
    );
}

/// A term whose proof finds a newer term of its lease was lost before its command started:
/// the command never starts and the elector's verdict on the lost term is tenure's exit
/// (3 without `--rejoin`), not an unproven fence's 8. The newer term is an intruder's
/// take-over of the Lease made once the proof has said so (the floor is raised first, so the
/// proof sees the newer term before the renewal does; a long lease leaves the take-over time).
#[test]
fn a_proof_that_finds_its_term_superseded_ends_as_a_lost_term_exit_3() {
    let rt = runtime();
    let lease = "fenced-superseded";
    let (ns, worker_kubeconfig) = rt.block_on(fenced_namespace(lease));
    let dir = kube_support::fresh_dir("fence-superseded");
    let leases = rt.block_on(async {
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(shared().admin().await, &ns)
    });
    let patch = |body: serde_json::Value| {
        rt.block_on(leases.patch(
            lease,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(body),
        ))
        .unwrap_or_else(|e| panic!("patch the lease: {e}"));
    };
    patch(serde_json::json!({
        "metadata": {"annotations": {"tenure.dev/fencing-floor": "9999999999999999"}}
    }));
    let marker = dir.join("started");
    let mut args: Vec<String> = [
        "run",
        "--lease",
        lease,
        "--backend",
        "kube",
        "--namespace",
        &ns,
        "--lease-duration",
        "20s",
        "--renew-deadline",
        "15s",
        "--retry-period",
        "500ms",
        "--identity",
        "worker",
        "--fence",
        "--",
        "sh",
        "-c",
    ]
    .map(String::from)
    .into();
    args.push(format!("touch {}; sleep 30", marker.display()));
    let mut tenure = Tenure::start(
        &args,
        &[("KUBECONFIG", &worker_kubeconfig.display().to_string())],
        dir.join("worker.err"),
    );
    wait_until(
        Duration::from_secs(30),
        "the proof to find its term superseded",
        || tenure.log().contains("a newer term of this lease exists"),
    );
    patch(serde_json::json!({
        "metadata": {"annotations": {
            "tenure.dev/holder-identity": "intruder",
            "tenure.dev/holder-token": "00000000000000000000000000000001"
        }},
        "spec": {"holderIdentity": "intruder"}
    }));
    let status = tenure.wait(Duration::from_secs(30));
    let log = tenure.log();
    assert!(!marker.exists(), "the command was started: {log}");
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(!log.contains("fencing floor"), "{log}");
}

/// A Lease whose fencing floor is above every token the API server can issue (an etcd
/// restored from an older backup leaves the floor ahead of the new revisions; so does a
/// hand-edited annotation): every term's own token is refused as stale, so each proof finds
/// its term superseded while the replica still holds the lease. That is no lost term (whose
/// verdict, exit 3 or `--rejoin`, the elector gives): the command never starts and tenure
/// exits 8 naming the floor, instead of renewing a lease whose every write would be refused.
#[test]
fn a_floor_above_every_token_starts_no_command_and_exits_8_naming_it() {
    let rt = runtime();
    let lease = "fenced-floor";
    let (ns, worker_kubeconfig) = rt.block_on(fenced_namespace(lease));
    let dir = kube_support::fresh_dir("fence-floor");
    rt.block_on(async {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(shared().admin().await, &ns);
        // `tenure policy`'s output created the Lease (the policy's param); an admin raises
        // its floor, as a restore from an older backup would leave it.
        leases
            .patch(
                lease,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({
                    "metadata": {"annotations": {"tenure.dev/fencing-floor": "9999999999999999"}}
                })),
            )
            .await
            .unwrap_or_else(|e| panic!("raise the floor: {e}"));
    });
    let marker = dir.join("started");
    let mut tenure = Tenure::start(
        &cli_support::run_args(
            lease,
            &["--backend", "kube", "--namespace", &ns],
            &["--identity", "worker", "--fence"],
            vec![
                "sh".into(),
                "-c".into(),
                format!("touch {}; sleep 30", marker.display()),
            ],
        ),
        &[("KUBECONFIG", &worker_kubeconfig.display().to_string())],
        dir.join("worker.err"),
    );
    let status = tenure.wait(Duration::from_secs(30));
    let log = tenure.log();
    assert!(!marker.exists(), "the command was started: {log}");
    assert!(log.contains("a newer term of this lease exists"), "{log}");
    assert_eq!(status.code(), Some(8), "{log}");
    assert!(
        log.contains("fencing floor") && log.contains("the command was not started"),
        "{log}"
    );
}

/// Removes the policy named `policy` and waits until the API server no longer enforces it:
/// the worker's write without a token is admitted.
async fn remove_policy(policy: &str, worker_kubeconfig: &Path, ns: &str) {
    fencing::uninstall(policy).await;
    let worker = shared().client_from(worker_kubeconfig).await;
    let cms: Api<ConfigMap> = Api::namespaced(worker, ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while cms
        .create(&PostParams::default(), &fencing::cm("unfenced", "x"))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the policy still refuses 30 s after its removal"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = cms.delete("unfenced", &Default::default()).await;
}

/// A term's command that writes through the endpoint on a signal: it publishes the endpoint's
/// URL in `DIR/url`, waits for `DIR/go`, creates `N` ConfigMaps (a fresh connection each, as
/// urllib opens them), prints `ok I` or `failed I: …` for each, touches `DIR/done` and exits
/// once `DIR/finish` exists.
const CROWD_WRITER: &str = r#"
import json, os, sys, time, urllib.request, urllib.error
server, token = os.environ["TENURE_KUBE_SERVER"], os.environ["TENURE_FENCING_TOKEN"]
out, ns, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(out + "/url.tmp", "w") as f:
    f.write(server)
os.rename(out + "/url.tmp", out + "/url")
while not os.path.exists(out + "/go"):
    time.sleep(0.02)
for i in range(n):
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "crowd-%d" % i},
                       "data": {"token": token}}).encode()
    req = urllib.request.Request(server + "/api/v1/namespaces/" + ns + "/configmaps", data=body,
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            print("ok", i, r.status, flush=True)
    except Exception as e:
        print("failed", i, repr(e), flush=True)
open(out + "/done", "w").close()
while not os.path.exists(out + "/finish"):
    time.sleep(0.02)
"#;

/// Issue #40: a local process without the secret holds more idle connections to the endpoint
/// than `tenure` has file descriptors (its `RLIMIT_NOFILE` lowered to 256, so the endpoint's
/// cap is 64 and the probe's 16). The command's writes through the endpoint all succeed,
/// `--listen`'s `/healthz` answers every poll throughout, and failed accepts (if any) are
/// not logged one by one.
#[test]
fn idle_strangers_beyond_the_descriptor_limit_starve_neither_writes_nor_probe() {
    const OPEN_FILES: usize = 256;
    const STRANGERS: usize = OPEN_FILES + 44;
    const WRITES: usize = 30;
    let rt = runtime();
    let lease = "fenced-crowd";
    let (ns, worker_kubeconfig) = rt.block_on(fenced_namespace(lease));
    let dir = kube_support::fresh_dir("fence-crowd");
    let writer = dir.join("writer.py");
    std::fs::write(&writer, CROWD_WRITER).unwrap_or_else(|e| panic!("{e}"));
    let port = cli_support::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec![
        "-c".to_owned(),
        format!("ulimit -n {OPEN_FILES} && exec \"$0\" \"$@\""),
        cli_support::TENURE.to_owned(),
    ];
    args.extend(cli_support::run_args(
        lease,
        &["--backend", "kube", "--namespace", &ns],
        &["--identity", "crowded", "--fence", "--listen", &listen],
        vec![
            "sh".into(),
            "-c".into(),
            format!(
                "python3 {} {} {ns} {WRITES} > {} 2>&1",
                writer.display(),
                dir.display(),
                dir.join("out").display()
            ),
        ],
    ));
    let kubeconfig = worker_kubeconfig.display().to_string();
    let mut tenure = Tenure::start_bin(
        Path::new("/bin/sh"),
        &args,
        &[("KUBECONFIG", &kubeconfig)],
        dir.join("err"),
    );
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    wait_until(
        Duration::from_secs(60),
        "the command's endpoint URL",
        || !read("url").is_empty(),
    );
    let url = read("url");
    let endpoint = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("an endpoint URL: {url}"))
        .to_owned();

    // The strangers: connected, silent, held to the end of the test.
    let strangers: Vec<std::net::TcpStream> = (0..STRANGERS)
        .map(|_| std::net::TcpStream::connect(&endpoint).unwrap_or_else(|e| panic!("connect: {e}")))
        .collect();
    // /healthz polled every 100 ms: for 2 s beside the strangers, through the writes, and
    // 2 s after them.
    let mut probes = Vec::new();
    let mut poll_for = |limit: Duration, until: &dyn Fn() -> bool| {
        let start = std::time::Instant::now();
        while start.elapsed() < limit && !until() {
            probes.push(cli_support::http_get(port, "/healthz"));
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let started = std::time::Instant::now();
    poll_for(Duration::from_secs(2), &|| false);
    std::fs::write(dir.join("go"), "").unwrap_or_else(|e| panic!("{e}"));
    poll_for(Duration::from_secs(90), &|| dir.join("done").exists());
    poll_for(Duration::from_secs(2), &|| false);
    std::fs::write(dir.join("finish"), "").unwrap_or_else(|e| panic!("{e}"));
    let status = tenure.wait(Duration::from_secs(60));
    let elapsed = started.elapsed();
    drop(strangers);
    let said = read("out");
    let log = tenure.log();
    assert_eq!(status.code(), Some(0), "command: {said}\ntenure: {log}");
    let written = said.lines().filter(|l| l.starts_with("ok ")).count();
    assert_eq!(
        written, WRITES,
        "every write through the endpoint succeeds beside {STRANGERS} idle strangers: {said}\ntenure: {log}"
    );
    assert!(probes.len() >= 40, "{} polls", probes.len());
    let unanswered: Vec<usize> = (0..probes.len())
        .filter(|&i| !matches!(probes[i], Some((200, _))))
        .collect();
    assert!(
        unanswered.is_empty(),
        "/healthz failed {} of {} polls (the first: {:?})\ntenure: {log}",
        unanswered.len(),
        probes.len(),
        &unanswered[..unanswered.len().min(10)]
    );
    // One warning at once, then at most one every 10 s.
    let warnings = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("accept"))
        .count();
    let allowed = 1 + usize::try_from(elapsed.as_secs() / 10).unwrap_or(usize::MAX);
    assert!(
        warnings <= allowed,
        "{warnings} accept warnings in {elapsed:?}: {log}"
    );
}

/// `tenure run --check` is the pre-flight of the same command line: run as a ServiceAccount
/// that may lead but not impersonate itself, it names each missing permission with its fix
/// and exits 4, campaigning for nothing and running nothing; as the worker with exactly the
/// RBAC `tenure policy` prints, every check passes (exit 0).
#[test]
fn run_check_names_the_missing_impersonate_permission_with_its_fix() {
    let rt = runtime();
    let lease = "fenced-check";
    let (ns, worker_kubeconfig) = rt.block_on(fenced_namespace(lease));
    let bare = rt.block_on(bare_worker(&ns));
    let dir = kube_support::fresh_dir("fence-check");
    let marker = dir.join("started");
    let check = |kubeconfig: &Path| {
        let args = cli_support::run_args(
            lease,
            &["--backend", "kube", "--namespace", &ns],
            &["--check", "--fence"],
            vec!["touch".into(), marker.display().to_string()],
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let kubeconfig = kubeconfig.display().to_string();
        cli_support::run_bounded(
            &args,
            &[("KUBECONFIG", kubeconfig.as_str())],
            b"",
            Duration::from_secs(60),
        )
    };
    let (code, out, err) = check(&bare);
    assert_eq!(code, 4, "{out}{err}");
    let who = format!("system:serviceaccount:{ns}:bare");
    assert!(
        out.contains(&format!(
            "ok    this user may get, list, watch and update lease {ns}/{lease}"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "FAIL  --fence: {who} may impersonate serviceaccounts/bare in {ns}: missing permission: impersonate serviceaccounts/bare in {ns}"
        )),
        "{out}"
    );
    assert!(
        out.contains("missing permission: impersonate userextras/tenure.dev/fencing-token"),
        "{out}"
    );
    assert!(out.contains("fix: "), "{out}");
    assert!(!marker.exists(), "--check ran the command");

    let (code, out, err) = check(&worker_kubeconfig);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("FAIL"), "{out}");
    assert!(
        out.contains("impersonate userextras/tenure.dev/fencing-election"),
        "{out}"
    );
    assert!(!marker.exists(), "--check ran the command");
}

/// The metric names `text` (Prometheus' text format) has samples of, histograms by their
/// family name (without `_bucket`, `_sum`, `_count`).
fn sample_names(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .flat_map(|name| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            [name.to_owned(), family.to_owned()]
        })
        .collect()
}

/// Every metric name in `text` (the chart's rendered alerts and dashboard).
fn queried_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for prefix in ["tenure_", "leader_election_"] {
        for (at, _) in text.match_indices(prefix) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

/// Polls `/metrics` on `port` until `ready` holds for its text (or fails after a minute).
fn scrape_until(port: u16, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if let Some((200, body)) = cli_support::http_get(port, "/metrics") {
            if ready(&body) {
                return body;
            }
            last = body;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("/metrics never showed {what}:\n{last}");
}

/// Issue #45: every metric the chart's alerts (`metrics.prometheusRule`) and dashboard
/// (`metrics.dashboard`) query is one `tenure run --listen` exports, from live scrapes — a
/// fenced term on the real API server, a plain term and a sharded group on the local backend —
/// not from a list typed twice.
#[test]
fn the_charts_alerts_and_dashboard_query_only_metrics_tenure_exports() {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/tenure");
    let render = |extra: &[&str]| {
        let out = Command::new(kube_support::helm())
            .args(["template", "r"])
            .arg(&chart)
            .args([
                "--namespace",
                "jobs",
                "--set",
                "metrics.prometheusRule.enabled=true",
            ])
            .args(["--set", "metrics.dashboard.enabled=true"])
            .args(["--show-only", "templates/prometheusrule.yaml"])
            .args(["--show-only", "templates/dashboard.yaml"])
            .args(extra)
            .output()
            .unwrap_or_else(|e| panic!("helm: {e}"));
        assert!(out.status.success(), "helm template: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut queried = queried_names(&render(&["--set", "fencing.policy.enabled=true"]));
    queried.extend(queried_names(&render(&["--set", "sharding.shards=2"])));
    assert!(
        queried.len() >= 12,
        "the alerts and the dashboard query: {queried:?}"
    );

    let mut exported = std::collections::BTreeSet::new();
    // A fenced term on the real API server: the fence's metrics.
    let lease = "fenced-metrics";
    let rt = runtime();
    let (ns, kubeconfig) = rt.block_on(fenced_namespace(lease));
    let dir = kube_support::fresh_dir("fence-metrics");
    let port = cli_support::free_port();
    let listen = format!("127.0.0.1:{port}");
    let kubeconfig = kubeconfig.display().to_string();
    let fenced = Tenure::start(
        &cli_support::run_args(
            lease,
            &["--backend", "kube", "--namespace", &ns],
            &["--identity", "scraped", "--fence", "--listen", &listen],
            vec!["sleep".into(), "60".into()],
        ),
        &[("KUBECONFIG", &kubeconfig)],
        dir.join("fenced.err"),
    );
    let text = scrape_until(port, "a proven fence and a renewal", |t| {
        t.contains("tenure_fence_enforced{") && t.contains("tenure_renew_latency_seconds_count{")
    });
    assert!(
        text.contains(&format!("tenure_fence_enforced{{name=\"{lease}\"}} 1")),
        "{text}\n{}",
        fenced.log()
    );
    exported.extend(sample_names(&text));
    drop(fenced);
    // A sharded group on the local backend: the group's gauges.
    let state = dir.join("state");
    let port = cli_support::free_port();
    let listen = format!("127.0.0.1:{port}");
    let state_arg = state.display().to_string();
    let sharded = Tenure::start(
        &cli_support::run_args(
            "sharded-metrics",
            &["--state-dir", &state_arg],
            &["--shards", "2", "--listen", &listen],
            vec!["sleep".into(), "60".into()],
        ),
        &[],
        dir.join("sharded.err"),
    );
    let text = scrape_until(port, "both shards owned", |t| {
        t.contains("tenure_shards_owned 2")
    });
    exported.extend(sample_names(&text));
    drop(sharded);

    let missing: Vec<&String> = queried.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the chart queries metrics tenure does not export: {missing:?}\nexported: {exported:?}"
    );
}

/// #46: a fenced election whose replicas prefer the newest, as the worker ServiceAccount under
/// exactly the RBAC `tenure policy --prefer newest` prints (applied with kubectl) and the
/// policy from the same output. Each replica announces itself in a member Lease without a
/// token (the policy governs no Lease but the probe); a graceful stop of the leader hands to
/// the newest follower (not the first by identity, nor whoever campaigns first); each term's
/// fenced write is admitted, terms never overlap and their tokens rise, and the ended term's
/// token is refused by the API server as stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_election_hands_to_the_newest_follower_under_the_printed_rbac() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Patch, PatchParams};
    use tenure::backend::kube::{KubeBackend, KubeOptions};
    use tenure::election::{ElectionConfig, HandoffCause, LeaderElector, Preference};
    use tenure::fence::kube::{FenceError, FencedApi, Fencer};
    use tokio_util::sync::CancellationToken;

    let lease = "prefer";
    let (ns, kubeconfig) = fenced_namespace_with(lease, &["--prefer", "newest"]).await;
    let server = shared();
    let client = server.client_from(&kubeconfig).await;
    // The object every term writes (the admin is no participant: not fenced).
    Api::<ConfigMap>::namespaced(server.admin().await, &ns)
        .create(&PostParams::default(), &fencing::cm("target", "none"))
        .await
        .expect("the target");
    let unit = Duration::from_secs(1);
    let config = ElectionConfig::new()
        .lease_duration(unit * 8)
        .renew_deadline(unit * 5)
        .retry_period(unit)
        .stop_margin(unit)
        .grace(unit * 2)
        .handoff_window(unit * 4)
        .rejoin(true)
        .prefer(Preference::Newest);
    // Each term as its workload saw it: (identity, token, its fenced write's outcome).
    type Seen = Arc<Mutex<Vec<(String, u64, Result<(), String>)>>>;
    let seen: Seen = Arc::default();
    let active: Arc<Mutex<Option<u64>>> = Arc::default();
    let mut electors = Vec::new();
    let mut runs = Vec::new();
    let mut stops = Vec::new();
    // b starts last: the newest, though neither first by identity nor the longest waiting.
    for id in ["a", "c", "b"] {
        let backend = KubeBackend::from_client(client.clone(), KubeOptions::new().namespace(&ns))
            .expect("backend");
        let locker = tenure::Locker::with_identity(backend, id).expect("identity");
        let elector = LeaderElector::new(locker, lease, config.clone()).expect("config");
        let fencer = Fencer::new(client.clone())
            .await
            .expect("identity")
            .lease_namespace(&ns);
        let (term_seen, active, term_ns, me) =
            (seen.clone(), active.clone(), ns.clone(), id.to_owned());
        let stop = CancellationToken::new();
        let run = elector.clone();
        let stopped = stop.clone();
        runs.push(tokio::spawn(async move {
            run.run_until(stopped.cancelled_owned(), move |term| {
                let (seen, active, fencer, ns, me) = (
                    term_seen.clone(),
                    active.clone(),
                    fencer.clone(),
                    term_ns.clone(),
                    me.clone(),
                );
                async move {
                    let token = term.fencing_token().get();
                    let overlapped = active.lock().expect("not poisoned").replace(token);
                    assert_eq!(overlapped, None, "{me}'s term {token} overlaps another");
                    let cms: FencedApi<ConfigMap> = fencer.namespaced(&term, &ns);
                    let wrote = cms
                        .patch(
                            "target",
                            &PatchParams::default(),
                            &Patch::Merge(serde_json::json!({"data": {"v": token.to_string()}})),
                        )
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string());
                    seen.lock().expect("not poisoned").push((me, token, wrote));
                    term.cancellation().cancelled().await;
                    *active.lock().expect("not poisoned") = None;
                }
            })
            .await
        }));
        electors.push(elector);
        stops.push(stop);
        if id == "a" {
            until(unit * 60, "a leads", || {
                !seen.lock().expect("not poisoned").is_empty()
            })
            .await;
        }
        // "Newest" orders by each run's start, in milliseconds.
        tokio::time::sleep(unit / 2).await;
    }
    // Every replica announced itself, as the worker, in its member Lease.
    let leases: Api<Lease> = Api::namespaced(server.admin().await, &ns);
    let prefix = format!("{}-member-", tenure::election::health_group(lease));
    let deadline = tokio::time::Instant::now() + unit * 20;
    loop {
        let members = kube_support::leases_named_from(&leases, &prefix)
            .await
            .len();
        if members == 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{members} of 3 member Leases {prefix}* within 20 s: the printed RBAC does not let \
             the replicas announce themselves"
        );
        tokio::time::sleep(unit / 4).await;
    }

    // The leader stops gracefully: the newest follower leads next.
    stops[0].cancel();
    let ended = tokio::time::timeout(unit * 30, &mut runs[0])
        .await
        .expect("a shut down")
        .expect("a's run");
    assert!(
        matches!(ended, Ok(Some(()))),
        "a led until its stop: {ended:?}"
    );
    let last = electors[0].last_handoff().borrow().clone();
    assert_eq!(
        last.map(|h| (h.cause, h.to)),
        Some((HandoffCause::Shutdown, Some("b".to_owned()))),
        "the shutdown released to the newest follower"
    );
    until(unit * 30, "a second term", || {
        seen.lock().expect("not poisoned").len() == 2
    })
    .await;
    tokio::time::sleep(unit * 3).await;
    let terms = seen.lock().expect("not poisoned").clone();
    let who: Vec<&str> = terms.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(who, ["a", "b"], "{terms:?}");
    for (id, token, wrote) in &terms {
        assert_eq!(wrote, &Ok(()), "{id}'s term {token}: its fenced write");
    }
    let (token_a, token_b) = (terms[0].1, terms[1].1);
    assert!(token_b > token_a, "tokens rise: {terms:?}");

    // a's token, after its term: the API server refuses it as stale.
    let fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    let stale: FencedApi<ConfigMap> =
        fencer.namespaced_with_token(lease, tenure::FencingToken::new(token_a), &ns);
    let refused = stale
        .patch(
            "target",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"v": "stale"}})),
        )
        .await;
    assert!(
        matches!(&refused, Err(FenceError::Stale { ours, lease: Some(_), .. }) if *ours == token_a),
        "{refused:?}"
    );
    let target = Api::<ConfigMap>::namespaced(server.admin().await, &ns)
        .get("target")
        .await
        .expect("target");
    assert_eq!(
        target.data.and_then(|d| d.get("v").cloned()),
        Some(token_b.to_string()),
        "b's write is the last"
    );
    for stop in &stops {
        stop.cancel();
    }
    for run in runs.into_iter().skip(1) {
        let out = tokio::time::timeout(unit * 30, run)
            .await
            .expect("shut down")
            .expect("run");
        assert!(out.is_ok(), "{out:?}");
    }
}

/// Waits (without blocking a runtime thread) until `cond` holds, failing after `limit`.
async fn until(limit: Duration, what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
