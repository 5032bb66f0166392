//! The Helm chart `charts/tenure`: `helm lint --strict`, `helm template` with default and
//! non-default values, the values schema's refusals, and the rendered objects on a real
//! kube-apiserver (the harness's, `tests/kube_support`): `helm install` into fresh namespaces
//! that enforce Pod Security "restricted", Pods from the Deployment's template admitted (and
//! weakened ones refused) by the apiserver, `kubectl auth can-i` for the ServiceAccount,
//! tenure's own Kubernetes backend running under exactly the chart's Role, and the fencing
//! policy (`fencing.*`): rendered exactly as `tenure::fence::kube::FencingPolicy` generates
//! it (its anchor too), enforced by the apiserver on the chart's ServiceAccount, and its anchor
//! left in place by `helm uninstall`.
//!
//! helm (`e2e/scripts/helm.sh build`) and kubectl (`e2e/scripts/kube-testenv.sh
//! build-kubectl`) are built from Go modules into `~/.cache/tenure` on first use. Nothing is
//! skipped: if a tool cannot be built, the test fails saying why.

mod kube_support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube_support::{shared, unique};
use serde_json::{Value, json};
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::backend::{Backend, BackendErrorKind, LeadershipEvent};
use tenure::fence::kube::{FenceError, Fencer, FencingPolicy};
use tenure::{LockError, LockOptions, Locker};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    repo().join("charts/tenure")
}

/// A values file of the chart's `ci/` directory.
fn ci(name: &str) -> String {
    chart().join("ci").join(name).display().to_string()
}

/// Runs `bash SCRIPT ARG`, which builds (or finds in the cache) a tool and prints its path.
fn build_tool(script: &str, arg: &str) -> PathBuf {
    let script = repo().join(script);
    let out = Command::new("bash")
        .arg(&script)
        .arg(arg)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "`{} {arg}` failed ({}): the chart checks need Go and the Go module proxy for the \
         first build of the tool (see the script's header)",
        script.display(),
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = PathBuf::from(stdout.trim().lines().last().unwrap_or_default());
    assert!(
        path.is_file(),
        "`{} {arg}` printed no binary path (stdout: {stdout:?})",
        script.display()
    );
    path
}

/// helm v3, built from `helm.sh/helm/v3/cmd/helm`.
fn helm() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_tool("e2e/scripts/helm.sh", "build"))
}

/// kubectl of the apiserver's release, built from `k8s.io/kubernetes/cmd/kubectl`.
fn kubectl() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_tool("e2e/scripts/kube-testenv.sh", "build-kubectl"))
}

/// helm's own state (cache, config, data) in a directory of this process, never the user's.
fn helm_home() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| kube_support::fresh_dir("helm-home"))
}

/// What a command did.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
    what: String,
}

impl Run {
    /// Its stdout; panics with everything it said if it failed.
    fn expect_ok(self) -> String {
        assert!(
            self.ok,
            "`{}` failed:\n{}\n{}",
            self.what, self.stderr, self.stdout
        );
        self.stdout
    }
}

/// Runs `cmd`, feeding `input` on stdin.
fn run(cmd: &mut Command, input: Option<&str>) -> Run {
    let what = format!(
        "{} {}",
        cmd.get_program().to_string_lossy(),
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `{what}`: {e}"));
    if let Some(input) = input {
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(input.as_bytes())
            .unwrap_or_else(|e| panic!("`{what}`: writing stdin: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("`{what}`: {e}"));
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        what,
    }
}

fn helm_cmd() -> Command {
    let home = helm_home();
    let mut cmd = Command::new(helm());
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG");
    cmd
}

/// kubectl as the apiserver's admin.
fn kubectl_cmd() -> Command {
    let mut cmd = Command::new(kubectl());
    cmd.arg("--kubeconfig").arg(shared().admin_kubeconfig());
    cmd
}

/// `helm template RELEASE charts/tenure --namespace NS ARGS...`: the YAML, or helm's error.
fn template(release: &str, ns: &str, args: &[&str]) -> Result<String, String> {
    let r = run(
        helm_cmd()
            .arg("template")
            .arg(release)
            .arg(chart())
            .args(["--namespace", ns])
            .args(args),
        None,
    );
    if r.ok { Ok(r.stdout) } else { Err(r.stderr) }
}

/// The objects `helm template` renders, as JSON, without the hooks (which `helm install`
/// does not create): see [`render_hooks`].
fn render(release: &str, ns: &str, args: &[&str]) -> Vec<Value> {
    render_all(release, ns, args)
        .into_iter()
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .collect()
}

/// The hooks `helm template` renders (objects with a `helm.sh/hook` annotation).
fn render_hooks(release: &str, ns: &str, args: &[&str]) -> Vec<Value> {
    render_all(release, ns, args)
        .into_iter()
        .filter(|o| !o["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .collect()
}

/// The hooks of `event` (`pre-delete`, `test`, ...) among `hooks`.
fn hooks_of(hooks: Vec<Value>, event: &str) -> Vec<Value> {
    hooks
        .into_iter()
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"] == event)
        .collect()
}

fn render_all(release: &str, ns: &str, args: &[&str]) -> Vec<Value> {
    let yaml = template(release, ns, args)
        .unwrap_or_else(|e| panic!("helm template {release} {args:?} failed:\n{e}"));
    objects(&yaml)
}

/// Multi-document YAML to JSON objects, offline: `kubectl annotate --local` parses the
/// documents without a server and prints them as JSON (removing an annotation nobody has).
fn objects(yaml: &str) -> Vec<Value> {
    let out = run(
        Command::new(kubectl())
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .args(["annotate", "--local", "-f", "-", "-o", "json"])
            .arg("tenure.test/none-"),
        Some(yaml),
    )
    .expect_ok();
    serde_json::Deserializer::from_str(&out)
        .into_iter::<Value>()
        .map(|v| {
            let mut v = v.unwrap_or_else(|e| panic!("kubectl printed bad JSON: {e}\n{out}"));
            if v["metadata"]["annotations"] == json!({}) {
                v["metadata"]
                    .as_object_mut()
                    .expect("metadata")
                    .remove("annotations");
            }
            v
        })
        .collect()
}

fn kinds(objs: &[Value]) -> BTreeSet<String> {
    objs.iter()
        .map(|o| o["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The only object of `kind`.
fn one<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objs.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind} in {:?}", kinds(objs));
    found[0]
}

fn pod_spec(objs: &[Value]) -> &Value {
    &one(objs, "Deployment")["spec"]["template"]["spec"]
}

fn container<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name} in {list}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("not a string: {s}"))
                .to_owned()
        })
        .collect()
}

/// The env var `name` of container `c`.
fn env<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    c["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == name))
}

/// The volume `name` of pod spec `spec`.
fn volume<'a>(spec: &'a Value, name: &str) -> Option<&'a Value> {
    spec["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == name))
}

/// Pod Security "restricted", checked on the rendered object (the apiserver checks it again
/// in `pod_security_restricted_is_enforced_by_the_apiserver`).
fn assert_restricted(spec: &Value) {
    let pod = &spec["securityContext"];
    assert_eq!(pod["runAsNonRoot"], true, "{pod}");
    assert!(pod["runAsUser"].as_i64().is_some_and(|u| u > 0), "{pod}");
    assert_eq!(pod["seccompProfile"]["type"], "RuntimeDefault", "{pod}");
    let all = spec["containers"]
        .as_array()
        .into_iter()
        .chain(spec["initContainers"].as_array())
        .flatten();
    for c in all {
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{}", c["name"]);
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{}", c["name"]);
        assert_eq!(sc["runAsNonRoot"], true, "{}", c["name"]);
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{}", c["name"]);
        assert!(sc["capabilities"]["add"].is_null(), "{}", c["name"]);
        assert_eq!(
            sc["seccompProfile"]["type"], "RuntimeDefault",
            "{}",
            c["name"]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Offline: lint, template, schema.

#[test]
fn lint_strict_with_default_and_ci_values() {
    let mut files: Vec<String> = std::fs::read_dir(chart().join("ci"))
        .expect("charts/tenure/ci")
        .map(|e| e.expect("ci entry").path().display().to_string())
        .filter(|p| p.ends_with(".yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "ci values files: {files:?}");
    let mut cases: Vec<Vec<String>> = vec![vec![]];
    cases.extend(files.into_iter().map(|f| vec!["-f".to_owned(), f]));
    // The Redis backend without the Election and without CA: no RBAC at all.
    cases.push(
        [
            "--set",
            "backend.type=redis,backend.redis.url=redis://redis:6379,backend.redis.passwordSecret.name=redis",
        ]
        .map(str::to_owned)
        .to_vec(),
    );
    for args in cases {
        let out = run(
            helm_cmd()
                .arg("lint")
                .arg("--strict")
                .arg(chart())
                .args(&args),
            None,
        )
        .expect_ok();
        assert!(
            out.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{args:?}: {out}"
        );
        assert!(!out.contains("[WARNING]"), "{args:?}: {out}");
    }
    // --strict turns a values problem into a failure.
    let r = run(
        helm_cmd()
            .arg("lint")
            .arg("--strict")
            .arg(chart())
            .args(["--set", "backend.type=etcd"]),
        None,
    );
    assert!(!r.ok, "{}", r.stdout);
    assert!(
        r.stdout.contains("value must be one of 'kube', 'redis'"),
        "{}",
        r.stdout
    );
}

#[test]
fn default_values_render_a_kubernetes_lease_singleton() {
    let objs = render("demo", "apps", &[]);
    assert_eq!(
        kinds(&objs),
        [
            "Deployment",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ]
        .map(str::to_owned)
        .into(),
        "no ServiceMonitor, no Election by default"
    );
    for o in &objs {
        assert_eq!(o["metadata"]["namespace"], "apps", "{}", o["kind"]);
    }

    let deploy = one(&objs, "Deployment");
    assert_eq!(deploy["metadata"]["name"], "demo-tenure");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let spec = pod_spec(&objs);
    assert_eq!(spec["serviceAccountName"], "demo-tenure");
    assert_eq!(spec["automountServiceAccountToken"], true);
    assert_eq!(spec["enableServiceLinks"], false);
    let grace = spec["terminationGracePeriodSeconds"]
        .as_i64()
        .expect("grace");
    assert!(
        grace > 5,
        "terminationGracePeriodSeconds {grace} must exceed --grace 5s"
    );
    assert_restricted(spec);

    // The injector copies tenure into an emptyDir the workload runs it from.
    let init = container(&spec["initContainers"], "tenure-install");
    assert_eq!(init["image"], "tenure:0.1.0");
    assert_eq!(
        strings(&init["command"]),
        ["/usr/local/bin/tenure", "install", "/tenure-bin"]
    );
    assert_eq!(init["volumeMounts"][0]["mountPath"], "/tenure-bin");
    let worker = container(&spec["containers"], "worker");
    assert_eq!(worker["image"], "busybox:1.37");
    assert_eq!(strings(&worker["command"]), ["/tenure-bin/tenure"]);
    let args = strings(&worker["args"]);
    let dashdash = args.iter().position(|a| a == "--").expect("-- in args");
    assert_eq!(
        args[..dashdash],
        [
            "run",
            "--lease=demo-tenure",
            "--backend=kube",
            "--namespace=$(POD_NAMESPACE)",
            "--identity=$(POD_NAME)",
            "--lease-duration=15s",
            "--renew-deadline=10s",
            "--retry-period=2s",
            "--grace=5s",
            "--rejoin",
            "--restart-dir=/run/tenure-restart",
            "--listen=0.0.0.0:9090",
        ]
    );
    assert_eq!(args[dashdash + 1..dashdash + 3], ["sh", "-c"]);
    assert!(
        args[dashdash + 3].contains("$TENURE_FENCING_TOKEN"),
        "{args:?}"
    );
    assert_eq!(
        env(worker, "POD_NAME").expect("POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(
        env(worker, "POD_NAMESPACE").expect("POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert!(env(worker, "TENURE_REDIS_PASSWORD").is_none());
    assert_eq!(worker["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(worker["livenessProbe"]["httpGet"]["port"], "metrics");
    assert_eq!(worker["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(worker["readinessProbe"]["httpGet"]["port"], "metrics");
    assert_eq!(
        worker["ports"],
        json!([{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}])
    );
    assert!(worker["resources"]["requests"]["cpu"].is_string());
    let mounts: BTreeSet<&str> = worker["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| m["mountPath"].as_str().expect("path"))
        .collect();
    assert_eq!(
        mounts,
        ["/run/tenure-restart", "/tenure-bin", "/tmp"].into()
    );
    // The restart lock's directory outlives the container, not the pod.
    let restart = volume(spec, "tenure-restart").expect("the restart volume");
    assert_eq!(restart["emptyDir"]["sizeLimit"], "1Mi");

    // Exactly the elector's verbs, on its own Lease where RBAC can restrict by name.
    let role = one(&objs, "Role");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": ["demo-tenure"], "verbs": ["get", "list", "watch", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ])
    );
    let binding = one(&objs, "RoleBinding");
    assert_eq!(binding["roleRef"]["name"], "demo-tenure");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "demo-tenure", "namespace": "apps"}])
    );
    assert_eq!(
        one(&objs, "PodDisruptionBudget")["spec"]["maxUnavailable"],
        1
    );
    let svc = one(&objs, "Service");
    assert_eq!(svc["spec"]["ports"][0]["port"], 9090);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "metrics");
}

#[test]
fn a_run_once_job_renders_a_cron_job_with_once_per_and_its_completion_lease() {
    let objs = render(
        "nightly",
        "jobs",
        &[
            "--set",
            "job.oncePer=24h,job.schedule=0 3 * * *,job.timeout=10m,job.timeZone=Etc/UTC",
        ],
    );
    assert_eq!(
        kinds(&objs),
        [
            "CronJob",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ]
        .map(str::to_owned)
        .into(),
        "a CronJob instead of the Deployment, and no PodDisruptionBudget"
    );
    let cron = one(&objs, "CronJob");
    assert_eq!(cron["spec"]["schedule"], "0 3 * * *");
    assert_eq!(cron["spec"]["timeZone"], "Etc/UTC");
    assert_eq!(cron["spec"]["concurrencyPolicy"], "Forbid");
    let job = &cron["spec"]["jobTemplate"]["spec"];
    assert_eq!(job["backoffLimit"], 2);
    let spec = &job["template"]["spec"];
    assert_eq!(spec["restartPolicy"], "Never");
    assert_restricted(spec);
    let args = strings(&container(&spec["containers"], "worker")["args"]);
    for want in ["--once-per=24h", "--done-exit-code=0", "--timeout=10m"] {
        assert!(args.contains(&want.to_owned()), "{want} missing: {args:?}");
    }
    assert!(
        args.iter().position(|a| a == "--once-per=24h") < args.iter().position(|a| a == "--"),
        "{args:?}"
    );
    let role = one(&objs, "Role");
    let done_rule = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .find(|r| r["resourceNames"] == json!(["nightly-tenure-done"]))
        .unwrap_or_else(|| panic!("no rule for the completion Lease: {role}"));
    assert_eq!(done_rule["verbs"], json!(["get", "update"]));

    // The same pod template as the Deployment's, but for the restart policy.
    let deploy = render("nightly", "jobs", &[]);
    let mut pod = spec.clone();
    pod.as_object_mut().expect("pod").remove("restartPolicy");
    let mut deploy_pod = pod_spec(&deploy).clone();
    for p in [&mut pod, &mut deploy_pod] {
        let worker = p["containers"]
            .as_array_mut()
            .expect("containers")
            .iter_mut()
            .find(|c| c["name"] == "worker")
            .expect("worker");
        worker.as_object_mut().expect("worker").remove("args");
    }
    assert_eq!(pod, deploy_pod);

    for (set, says) in [
        ("job.oncePer=24h", "job.oncePer needs job.schedule"),
        ("job.schedule=0 3 * * *", "job.schedule needs job.oncePer"),
        (
            "job.schedule=0 3 * * *,job.oncePer=1h,sharding.shards=2",
            "cannot run sharded workers",
        ),
        ("job.oncePer=daily,job.schedule=@daily", "oncePer"),
    ] {
        let err = template("bad", "jobs", &["--set", set]).expect_err(set);
        assert!(err.contains(says), "{set}: {err}");
    }
}

#[test]
fn non_default_values_render() {
    // Redis over TLS, password and CA from existing objects, Election status, ServiceMonitor,
    // tenure already in the workload image.
    let objs = render("r", "jobs", &["-f", &ci("redis-values.yaml")]);
    assert_eq!(
        kinds(&objs),
        [
            "Deployment",
            "Election",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ServiceMonitor"
        ]
        .map(str::to_owned)
        .into()
    );
    let deploy = one(&objs, "Deployment");
    assert_eq!(deploy["spec"]["replicas"], 3);
    let spec = pod_spec(&objs);
    assert_restricted(spec);
    assert!(spec["initContainers"].is_null(), "inject: false");
    assert_eq!(spec["terminationGracePeriodSeconds"], 45);
    let worker = container(&spec["containers"], "worker");
    assert_eq!(worker["image"], "registry.example.com/team/reporter:2.4.1");
    assert_eq!(strings(&worker["command"]), ["/usr/local/bin/tenure"]);
    assert_eq!(
        strings(&worker["args"]),
        [
            "run",
            "--lease=nightly-report",
            "--backend=rediss://redis.data.svc:6380/2",
            "--namespace=$(POD_NAMESPACE)",
            "--identity=$(POD_NAME)",
            "--lease-duration=30s",
            "--renew-deadline=20s",
            "--retry-period=4s",
            "--grace=20s",
            "--restart-dir=/run/tenure-restart",
            "--listen=0.0.0.0:9400",
            "--publish-status",
            "--election=nightly-report",
            "--redis-username=tenure",
            "--redis-ca-file=/etc/tenure/redis-ca/ca.crt",
            "--key-prefix=reports:",
            "--",
            "/app/reporter",
            "--once",
            "--token=$(TENURE_FENCING_TOKEN)",
        ]
    );
    assert_eq!(
        env(worker, "TENURE_REDIS_PASSWORD").expect("password env")["valueFrom"],
        json!({"secretKeyRef": {"name": "redis-auth", "key": "password"}})
    );
    assert_eq!(env(worker, "RUST_LOG").expect("user env")["value"], "info");
    let ca = volume(spec, "redis-ca").expect("redis-ca volume");
    assert_eq!(ca["secret"]["secretName"], "redis-ca");
    assert!(
        worker["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .any(|m| m["mountPath"] == "/etc/tenure/redis-ca" && m["readOnly"] == true)
    );
    // Redis: no Lease or Event permissions; only the Election, by name.
    assert_eq!(
        one(&objs, "Role")["rules"],
        json!([
            {"apiGroups": ["tenure.dev"], "resources": ["elections/status"],
             "resourceNames": ["nightly-report"], "verbs": ["get", "update"]},
        ])
    );
    let election = one(&objs, "Election");
    assert_eq!(election["apiVersion"], "tenure.dev/v1alpha1");
    assert_eq!(election["metadata"]["name"], "nightly-report");
    assert_eq!(
        election["spec"],
        json!({"lease": "nightly-report", "backend": {"type": "Redis", "keyPrefix": "reports:"},
               "leaseDuration": "30s", "renewDeadline": "20s", "retryPeriod": "4s"})
    );
    let monitor = one(&objs, "ServiceMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    let svc = one(&objs, "Service");
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"],
        svc["metadata"]["labels"]["app.kubernetes.io/component"]
    );
    let pdb = &one(&objs, "PodDisruptionBudget")["spec"];
    assert_eq!(pdb["minAvailable"], 1);
    assert!(pdb["maxUnavailable"].is_null());

    // Redis without the Election: the pods never talk to the API server.
    let objs = render(
        "r",
        "jobs",
        &[
            "--set",
            "backend.type=redis,backend.redis.url=redis://redis:6379/0,\
             backend.redis.passwordSecret.name=redis-auth",
        ],
    );
    let k = kinds(&objs);
    assert!(!k.contains("Role") && !k.contains("RoleBinding"), "{k:?}");
    assert_eq!(pod_spec(&objs)["automountServiceAccountToken"], false);
    assert_eq!(
        one(&objs, "ServiceAccount")["automountServiceAccountToken"],
        false
    );
    let worker = container(&pod_spec(&objs)["containers"], "worker");
    assert!(strings(&worker["args"]).contains(&"--backend=redis://redis:6379/0".to_owned()));
    assert!(
        !strings(&worker["args"])
            .iter()
            .any(|a| a.starts_with("--redis-ca-file"))
    );

    // Kubernetes backend with the Election: lease and Election rules together; image digest.
    let objs = render("m", "db", &["-f", &ci("kube-publish-values.yaml")]);
    let rules = &one(&objs, "Role")["rules"];
    assert_eq!(rules.as_array().map(Vec::len), Some(4), "{rules}");
    assert_eq!(rules[0]["resourceNames"], json!(["schema-migrations"]));
    assert_eq!(
        rules[3],
        json!({"apiGroups": ["tenure.dev"], "resources": ["elections/status"],
               "resourceNames": ["schema-migrations"], "verbs": ["get", "update"]})
    );
    let spec = pod_spec(&objs);
    let worker = container(&spec["containers"], "worker");
    assert_eq!(
        worker["image"],
        "registry.example.com/team/migrator@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    );
    assert_eq!(
        container(&spec["initContainers"], "tenure-install")["image"],
        "registry.example.com/tenure:0.1.0"
    );
    // grace 30s and no explicit terminationGracePeriodSeconds: grace + 10 s.
    assert_eq!(spec["terminationGracePeriodSeconds"], 40);
    assert_eq!(
        one(&objs, "Election")["spec"]["backend"]["type"],
        "Kubernetes"
    );

    // IPv6 listener.
    let objs = render("v6", "x", &["--set", "metrics.host=::"]);
    let worker = container(&pod_spec(&objs)["containers"], "worker");
    assert!(strings(&worker["args"]).contains(&"--listen=[::]:9090".to_owned()));
}

/// The `--flag=value` arguments of the worker container that hold durations.
fn duration_args(objs: &[Value]) -> Vec<String> {
    let worker = container(&pod_spec(objs)["containers"], "worker");
    strings(&worker["args"])
        .into_iter()
        .filter(|a| {
            [
                "--lease-duration=",
                "--renew-deadline=",
                "--retry-period=",
                "--grace=",
            ]
            .iter()
            .any(|flag| a.starts_with(flag))
        })
        .collect()
}

#[test]
fn compound_durations_render_and_are_checked_by_value() {
    // 1m30s > 61s: read as its first component (1m), the lease would be refused as shorter.
    let objs = render(
        "d",
        "ns",
        &[
            "--set",
            "election.leaseDuration=1m30s,election.renewDeadline=61s,\
             election.retryPeriod=2.5s,election.grace=1m0.5s,election.publishStatus=true",
        ],
    );
    assert_eq!(
        duration_args(&objs),
        [
            "--lease-duration=1m30s",
            "--renew-deadline=61s",
            "--retry-period=2.5s",
            "--grace=1m0.5s"
        ]
    );
    // grace 60.5 s, rounded up, + 10 s.
    assert_eq!(pod_spec(&objs)["terminationGracePeriodSeconds"], 71);
    let spec = &one(&objs, "Election")["spec"];
    assert_eq!(
        (
            &spec["leaseDuration"],
            &spec["renewDeadline"],
            &spec["retryPeriod"]
        ),
        (&json!("1m30s"), &json!("61s"), &json!("2.5s"))
    );

    // Every unit, fractions, leading zeros (decimal) and 0 for the grace.
    let objs = render(
        "d",
        "ns",
        &[
            "--set",
            "election.leaseDuration=0h1m0.000000001s,election.renewDeadline=39s999ms999us999ns,\
             election.retryPeriod=015s",
            // As a string: `--set` would make 0 a number, which the schema refuses.
            "--set-string",
            "election.grace=0",
        ],
    );
    assert_eq!(
        duration_args(&objs),
        [
            "--lease-duration=0h1m0.000000001s",
            "--renew-deadline=39s999ms999us999ns",
            "--retry-period=015s",
            "--grace=0"
        ]
    );
    assert_eq!(pod_spec(&objs)["terminationGracePeriodSeconds"], 10);

    // The termination grace period is checked to the nanosecond: 3 s > 1.5 s + 2 s is false,
    // 4 s is enough.
    let objs = render(
        "d",
        "ns",
        &[
            "--set",
            "election.grace=1.5s,terminationGracePeriodSeconds=4",
        ],
    );
    assert_eq!(pod_spec(&objs)["terminationGracePeriodSeconds"], 4);
    assert_refused(&[(
        &[
            "--set",
            "election.grace=1.5s,terminationGracePeriodSeconds=3",
        ],
        &["terminationGracePeriodSeconds (3) must be longer than election.grace (1.5s) + 2s"],
    )]);
}

/// The chart refuses the same durations as `tenure run`, with the same message (`election.*`
/// for the flags): a chart that rendered what tenure refuses put pods into CrashLoopBackOff.
#[test]
fn the_chart_refuses_the_durations_tenure_refuses_with_the_same_message() {
    // (lease, renew deadline, retry): each edge of each rule, and accepted ones beside them.
    let cases = [
        ("15s", "14.9s", "1s"),
        ("15s", "14848ms", "1s"),
        ("15s", "14849ms", "1s"),
        ("20ms", "15ms", "5ms"),
        ("30ms", "20ms", "8ms"),
        ("15s", "10s", "0s"),
        ("15s", "15s", "2s"),
        ("15s", "2.4s", "2s"),
        ("15s", "5s", "2s"),
        ("15s", "5001ms", "2s"),
        ("1m", "59s", "10s"),
        ("1m", "59.4s", "10s"),
    ];
    for (lease, deadline, retry) in cases {
        let chart = template(
            "d",
            "ns",
            &[
                "--set",
                &format!(
                    "election.leaseDuration={lease},election.renewDeadline={deadline},election.retryPeriod={retry}"
                ),
            ],
        );
        let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args([
                "run",
                "--lease",
                "d",
                "--backend",
                "local",
                "--state-dir",
                "/nonexistent/tenure-chart-agreement",
                "--lease-duration",
                lease,
                "--renew-deadline",
                deadline,
                "--retry-period",
                retry,
                "--",
                "true",
            ])
            .output()
            .expect("run tenure");
        let cli = String::from_utf8_lossy(&out.stderr).into_owned();
        let case = format!("lease {lease}, renew deadline {deadline}, retry {retry}");
        match chart {
            Ok(_) => assert!(
                !cli.contains("invalid durations"),
                "{case}: the chart renders what tenure refuses: {cli}"
            ),
            Err(err) => {
                let line = cli
                    .lines()
                    .find_map(|l| l.strip_prefix("tenure: invalid durations: "))
                    .unwrap_or_else(|| {
                        panic!("{case}: the chart refuses, tenure does not:\n{err}\n{cli}")
                    });
                assert_eq!(out.status.code(), Some(2), "{case}: {cli}");
                let as_chart = without_values(
                    &line
                        .replace("--lease-duration", "election.leaseDuration")
                        .replace("--renew-deadline", "election.renewDeadline")
                        .replace("--retry-period", "election.retryPeriod"),
                );
                assert!(
                    without_values(&err).contains(&as_chart),
                    "{case}: tenure says {line:?}, the chart:\n{err}"
                );
            }
        }
    }
}

/// `text` with each value in parentheses emptied: tenure shows the durations it parsed
/// (`14.848s`), the chart the strings it was given (`14848ms`); the rest must be the same.
fn without_values(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('(') {
        out.push_str(&rest[..=open]);
        let Some(close) = rest[open..].find(')') else {
            rest = &rest[open + 1..];
            break;
        };
        let inside = &rest[open + 1..open + close];
        if inside == "1% + 2ms" {
            out.push_str(inside);
        }
        out.push(')');
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

/// Asserts that rendering with each case's arguments fails with a short error that contains
/// every expected part.
fn assert_refused(cases: &[(&[&str], &[&str])]) {
    for (args, expected) in cases {
        let err = match template("bad", "ns", args) {
            Ok(out) => panic!("{args:?} rendered:\n{out}"),
            Err(e) => e,
        };
        for want in *expected {
            assert!(
                err.contains(want),
                "{args:?}: expected {want:?} in helm's error:\n{err}"
            );
        }
        assert!(err.lines().count() <= 8, "{args:?}: too long:\n{err}");
    }
}

#[test]
fn bad_values_fail_with_a_clear_message() {
    let schema = "values don't meet the specifications of the schema(s)";
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--set", "backend.type=etcd"],
            &[
                schema,
                "at '/backend/type': value must be one of 'kube', 'redis'",
            ],
        ),
        (
            &["--set", "election.leaseDuration=15 seconds"],
            &[
                schema,
                "at '/election/leaseDuration': '15 seconds' does not match pattern",
            ],
        ),
        (
            &["--set", "replicas=3"],
            &[schema, "additional properties 'replicas' not allowed"],
        ),
        (
            &["--set", "election.rejion=true"],
            &[
                schema,
                "at '/election': additional properties 'rejion' not allowed",
            ],
        ),
        (
            &["--set", "backend.type=redis"],
            &[schema, "at '/backend/redis/url': minLength: got 0, want 1"],
        ),
        (
            &[
                "--set",
                "backend.type=redis,backend.redis.url=redis://u:secret@redis:6379",
            ],
            &[
                schema,
                "'redis://u:secret@redis:6379' does not match pattern",
            ],
        ),
        (
            &["--set", "election.lease=My_Lease"],
            &[schema, "at '/election/lease'"],
        ),
        (
            &["--set", "election.leaseDuration=-1s"],
            &[
                schema,
                "at '/election/leaseDuration': '-1s' does not match pattern",
            ],
        ),
        (
            &["--set", "election.grace=1m30"],
            &[
                schema,
                "at '/election/grace': '1m30' does not match pattern",
            ],
        ),
        (
            &["--set", "election.renewDeadline=1.5"],
            &[
                schema,
                "at '/election/renewDeadline': '1.5' does not match pattern",
            ],
        ),
        // A zero retry period passes every cross-field rule but makes `tenure run` exit at
        // start (and the pods crash-loop): refused before anything is installed.
        (
            &["--set", "election.retryPeriod=0s"],
            &["election.retryPeriod (0s) must be positive"],
        ),
        (
            &["--set", "election.retryPeriod=0m0.0s"],
            &["election.retryPeriod (0m0.0s) must be positive"],
        ),
        // Leading zeros are decimal, as `tenure run` reads them: sprig's int64 would read
        // 016s as octal (14 s) and let it pass as shorter than 15 s.
        (
            &["--set", "election.renewDeadline=016s"],
            &["election.renewDeadline (016s) must be shorter than election.leaseDuration (15s)"],
        ),
        // tenure refuses durations over 365 days; so does the chart, summing the components.
        (
            &["--set", "election.leaseDuration=8761h"],
            &["election.leaseDuration (8761h) is longer than 365 days"],
        ),
        (
            &["--set", "election.grace=8000h8000h"],
            &["election.grace (8000h8000h) is longer than 365 days"],
        ),
        (
            &["--set", "election.leaseDuration=99999999999999999999h"],
            &["election.leaseDuration (99999999999999999999h) is longer than 365 days"],
        ),
        // Names that would render objects the apiserver refuses.
        (
            &[
                "--set",
                "backend.type=redis,backend.redis.url=redis://r:6379,backend.redis.passwordSecret.name=Redis_Password",
            ],
            &[schema, "at '/backend/redis/passwordSecret/name'"],
        ),
        (
            &["--set", "serviceAccount.name=My SA"],
            &[schema, "at '/serviceAccount/name'"],
        ),
        (
            &["--set", "fullnameOverride=My_App"],
            &[schema, "at '/fullnameOverride'"],
        ),
        (
            &["--set", "replicaCount=-1"],
            &[schema, "at '/replicaCount': minimum: got -1, want 0"],
        ),
        (
            &["--set", "metrics.port=70000"],
            &[
                schema,
                "at '/metrics/port': maximum: got 70,000, want 65,535",
            ],
        ),
        (
            &["--set-json", "command=[]"],
            &[schema, "at '/command': minItems: got 0, want 1"],
        ),
        (
            &["--set", "image.pullPolicy=Sometimes"],
            &[schema, "at '/image/pullPolicy'"],
        ),
        // Cross-field rules, checked by the templates.
        (
            &["--set", "election.renewDeadline=20s"],
            &["election.renewDeadline (20s) must be shorter than election.leaseDuration (15s)"],
        ),
        (
            &["--set", "election.retryPeriod=9s"],
            &["election.renewDeadline (10s) must be longer than 1.2 × election.retryPeriod (9s)"],
        ),
        // The same rules on compound durations, compared by their whole value.
        (
            &[
                "--set",
                "election.leaseDuration=1m,election.renewDeadline=1m30s",
            ],
            &["election.renewDeadline (1m30s) must be shorter than election.leaseDuration (1m)"],
        ),
        (
            &[
                "--set",
                "election.leaseDuration=1m0.5s,election.renewDeadline=1m0.5s",
            ],
            &[
                "election.renewDeadline (1m0.5s) must be shorter than election.leaseDuration (1m0.5s)",
            ],
        ),
        // The default renew deadline (10s) is a third of 30s: not longer.
        (
            &["--set", "election.leaseDuration=30s"],
            &[
                "election.renewDeadline (10s) must be longer than a third of election.leaseDuration (30s): the leader first renews a third of the way into the lease, so a renew deadline no longer than that ends every term before its first renewal; set election.renewDeadline to about two thirds of the lease (20000ms for 30s)",
            ],
        ),
        // 1.2 × 1m40s is exactly 2m: not longer.
        (
            &[
                "--set",
                "election.leaseDuration=3m,election.renewDeadline=2m,election.retryPeriod=1m40s",
            ],
            &["election.renewDeadline (2m) must be longer than 1.2 × election.retryPeriod (1m40s)"],
        ),
        (
            &[
                "--set",
                "election.grace=1m0.5s,terminationGracePeriodSeconds=62",
            ],
            &[
                "terminationGracePeriodSeconds (62) must be longer than election.grace (1m0.5s) + 2s",
            ],
        ),
        (
            &["--set", "terminationGracePeriodSeconds=5"],
            &["terminationGracePeriodSeconds (5) must be longer than election.grace (5s) + 2s"],
        ),
        (
            &["--set", "terminationGracePeriodSeconds=7"],
            &["terminationGracePeriodSeconds (7) must be longer than election.grace (5s) + 2s"],
        ),
        (
            &[
                "--set",
                "backend.type=redis,backend.redis.url=redis://r:6379,backend.redis.ca.secretName=ca",
            ],
            &["backend.redis.ca is set but backend.redis.url is not rediss:// (TLS)"],
        ),
    ];
    assert_refused(cases);
}

// ---------------------------------------------------------------------------------------------
// On the real apiserver.

/// A stand-in for the Prometheus Operator's ServiceMonitor CRD (not on this apiserver): same
/// group, version and names, any fields.
fn servicemonitor_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"plural": "servicemonitors", "singular": "servicemonitor",
                      "kind": "ServiceMonitor", "listKind": "ServiceMonitorList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {"spec": {
                        "type": "object",
                        "required": ["selector"],
                        "x-kubernetes-preserve-unknown-fields": true
                    }}
                }}
            }]
        }
    })
}

/// Applies `yaml_or_json` with server-side apply as admin.
fn apply(input: &str) -> String {
    run(
        kubectl_cmd().args([
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=helm-chart-test",
            "-f",
            "-",
        ]),
        Some(input),
    )
    .expect_ok()
}

/// The ServiceMonitor stand-in, once per server.
fn servicemonitor_crd_installed() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        apply(&servicemonitor_crd().to_string());
        run(
            kubectl_cmd().args([
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/servicemonitors.monitoring.coreos.com",
            ]),
            None,
        )
        .expect_ok();
    });
}

/// The Election CRD the chart ships, applied once per server.
fn election_crd_installed() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let path = chart().join("crds/election.yaml");
        let crd = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; the chart must ship the Election CRD (a copy of crds/election.yaml, \
                 generated by `tenure crd`)",
                path.display()
            )
        });
        let reference = repo().join("crds/election.yaml");
        if let Ok(generated) = std::fs::read_to_string(&reference) {
            assert_eq!(
                crd,
                generated,
                "{} differs from {}",
                path.display(),
                reference.display()
            );
        }
        apply(&crd);
        run(
            kubectl_cmd().args([
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/elections.tenure.dev",
            ]),
            None,
        )
        .expect_ok();
    });
}

/// A fresh namespace that enforces Pod Security "restricted" (latest).
fn restricted_namespace(prefix: &str) -> String {
    let ns = unique(prefix);
    apply(
        &json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
                "pod-security.kubernetes.io/warn": "restricted",
                "pod-security.kubernetes.io/warn-version": "latest",
            }}
        })
        .to_string(),
    );
    ns
}

/// `helm install RELEASE charts/tenure -n NS ARGS...` against the test apiserver.
fn helm_install(release: &str, ns: &str, args: &[&str]) -> Run {
    run(
        helm_cmd()
            .args(["install", release])
            .arg(chart())
            .args(["--namespace", ns, "--kubeconfig"])
            .arg(shared().admin_kubeconfig())
            .args(args),
        None,
    )
}

/// (kind, name) of every object in `objs`.
fn names(objs: &[Value]) -> BTreeSet<(String, String)> {
    objs.iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_owned(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// The (kind, name) of the objects the apiserver has for release `release` in `ns`.
fn installed(ns: &str, release: &str) -> BTreeSet<(String, String)> {
    let out = run(
        kubectl_cmd().args([
            "get",
            "deployments,serviceaccounts,roles,rolebindings,services,poddisruptionbudgets,\
             servicemonitors.monitoring.coreos.com,elections.tenure.dev",
            "-n",
            ns,
            "-l",
            &format!("app.kubernetes.io/instance={release}"),
            "-o",
            "json",
        ]),
        None,
    )
    .expect_ok();
    let list: Value = serde_json::from_str(&out).expect("kubectl get -o json");
    names(list["items"].as_array().expect("items"))
}

#[test]
fn helm_install_on_the_real_apiserver() {
    servicemonitor_crd_installed();
    election_crd_installed();
    let cases: &[(&str, &[&str])] = &[
        ("defaults", &[]),
        ("kube-publish", &["-f", &ci("kube-publish-values.yaml")]),
        ("redis", &["-f", &ci("redis-values.yaml")]),
    ];
    for (release, args) in cases {
        let ns = restricted_namespace(&format!("helm-{release}"));
        let out = helm_install(release, &ns, args).expect_ok_with_stderr();
        // The Deployment's pods would be admitted under "restricted": no warning.
        assert!(
            !out.1.contains("PodSecurity"),
            "{release}: helm install warned:\n{}",
            out.1
        );
        let notes = out.0;
        assert!(notes.contains("STATUS: deployed"), "{release}: {notes}");
        let expected = names(&render(release, &ns, args));
        assert_eq!(installed(&ns, release), expected, "{release}");
        let status = run(
            helm_cmd()
                .args([
                    "status",
                    release,
                    "-o",
                    "json",
                    "--namespace",
                    &ns,
                    "--kubeconfig",
                ])
                .arg(shared().admin_kubeconfig()),
            None,
        )
        .expect_ok();
        let status: Value = serde_json::from_str(&status).expect("helm status json");
        assert_eq!(status["info"]["status"], "deployed", "{release}");

        match *release {
            "defaults" => {
                assert!(
                    notes.contains(&format!(
                        "kubectl get lease defaults-tenure -n {ns} -o yaml"
                    )),
                    "{notes}"
                );
                assert!(!notes.contains("kubectl get elections"), "{notes}");
            }
            "kube-publish" => {
                assert!(
                    notes.contains(&format!("kubectl get elections -n {ns}")),
                    "{notes}"
                );
                assert!(
                    notes.contains(&format!(
                        "kubectl get lease schema-migrations -n {ns} -o yaml"
                    )),
                    "{notes}"
                );
                // The Election passed the CRD's schema and shows its spec.
                let el = run(
                    kubectl_cmd().args([
                        "get",
                        "election",
                        "schema-migrations",
                        "-n",
                        &ns,
                        "-o",
                        "json",
                    ]),
                    None,
                )
                .expect_ok();
                let el: Value = serde_json::from_str(&el).expect("election json");
                assert_eq!(el["spec"]["lease"], "schema-migrations");
                assert_eq!(el["spec"]["backend"]["type"], "Kubernetes");
                assert_eq!(el["spec"]["renewDeadline"], "12s");
                let table =
                    run(kubectl_cmd().args(["get", "elections", "-n", &ns]), None).expect_ok();
                assert!(table.contains("schema-migrations"), "{table}");
            }
            _ => {
                assert!(notes.contains("kubectl get elections"), "{notes}");
                assert!(!notes.contains("kubectl get lease"), "redis: {notes}");
                assert!(
                    notes.contains(&format!(
                        "kubectl exec -n {ns} deploy/redis-tenure -c worker -- /usr/local/bin/tenure \
                         status --lease nightly-report --backend rediss://redis.data.svc:6380/2"
                    )),
                    "{notes}"
                );
            }
        }
    }
}

impl Run {
    /// (stdout, stderr); panics with both if it failed.
    fn expect_ok_with_stderr(self) -> (String, String) {
        assert!(
            self.ok,
            "`{}` failed:\n{}\n{}",
            self.what, self.stderr, self.stdout
        );
        (self.stdout, self.stderr)
    }
}

/// A Pod made of the Deployment's pod template.
fn pod_from(objs: &[Value], name: &str) -> Value {
    let template = &one(objs, "Deployment")["spec"]["template"];
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    })
}

/// `kubectl create --dry-run=server` of `obj` in `ns`.
fn create_dry_run(ns: &str, obj: &Value) -> Run {
    run(
        kubectl_cmd().args([
            "create",
            "--dry-run=server",
            "-n",
            ns,
            "-o",
            "name",
            "-f",
            "-",
        ]),
        Some(&obj.to_string()),
    )
}

#[test]
fn pod_security_restricted_is_enforced_by_the_apiserver() {
    let ns = restricted_namespace("psa");
    // The chart's pods, with and without the injecting init container, are admitted.
    for (i, args) in [
        vec![],
        vec!["-f".to_owned(), ci("redis-values.yaml")],
        vec!["-f".to_owned(), ci("kube-publish-values.yaml")],
    ]
    .iter()
    .enumerate()
    {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let objs = render("psa", &ns, &args);
        let r = create_dry_run(&ns, &pod_from(&objs, &format!("chart-pod-{i}")));
        assert!(r.ok, "{args:?}: the chart's pod was refused:\n{}", r.stderr);
        assert!(!r.stderr.contains("PodSecurity"), "{args:?}: {}", r.stderr);
        // And its Deployment draws no Pod Security warning.
        let r = create_dry_run(&ns, one(&objs, "Deployment"));
        assert!(r.ok, "{args:?}: {}", r.stderr);
        assert!(!r.stderr.contains("PodSecurity"), "{args:?}: {}", r.stderr);
    }

    // Weakened through the values: refused, naming what is wrong.
    let weakened: &[(&[&str], &str)] = &[
        (
            &["--set", "securityContext.allowPrivilegeEscalation=true"],
            "allowPrivilegeEscalation != false",
        ),
        (
            &[
                "--set",
                "podSecurityContext.runAsNonRoot=false,securityContext.runAsNonRoot=false",
            ],
            "runAsNonRoot != true",
        ),
        (
            &["--set-json", "securityContext.capabilities.drop=null"],
            "unrestricted capabilities",
        ),
        (
            &[
                "--set-json",
                "podSecurityContext.seccompProfile=null,securityContext.seccompProfile=null",
            ],
            "seccompProfile",
        ),
    ];
    for (i, (args, why)) in weakened.iter().enumerate() {
        let objs = render("weak", &ns, args);
        let r = create_dry_run(&ns, &pod_from(&objs, &format!("weak-pod-{i}")));
        assert!(!r.ok, "{args:?}: a weakened pod was admitted");
        assert!(
            r.stderr
                .contains("violates PodSecurity \"restricted:latest\""),
            "{args:?}: {}",
            r.stderr
        );
        assert!(
            r.stderr.contains(why),
            "{args:?}: expected {why:?} in {}",
            r.stderr
        );
        // Its Deployment is accepted (Pod Security admits controllers) but warned about.
        let r = create_dry_run(&ns, one(&objs, "Deployment"));
        assert!(r.ok, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr
                .contains("would violate PodSecurity \"restricted:latest\""),
            "{args:?}: {}",
            r.stderr
        );
    }
}

/// `can_i`'s namespace for "in all namespaces" (`--all-namespaces`).
const ALL: &str = "*";

/// `kubectl auth can-i VERB RESOURCE -n NS --as USER [--subresource S]`.
fn can_i(user: &str, ns: &str, verb: &str, resource: &str, subresource: Option<&str>) -> bool {
    let mut cmd = kubectl_cmd();
    cmd.args(["auth", "can-i", verb, resource, "--as", user]);
    if ns == ALL {
        cmd.arg("--all-namespaces");
    } else {
        cmd.args(["-n", ns]);
    }
    if let Some(s) = subresource {
        cmd.arg(format!("--subresource={s}"));
    }
    let r = run(&mut cmd, None);
    match r.stdout.split_whitespace().next() {
        Some("yes") => true,
        Some("no") => false,
        _ => panic!("`{}`: {}\n{}", r.what, r.stdout, r.stderr),
    }
}

/// Waits until RBAC's caches have the new binding: `user` may `verb resource`.
fn wait_allowed(user: &str, ns: &str, verb: &str, resource: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !can_i(user, ns, verb, resource, None) {
        assert!(
            Instant::now() < deadline,
            "{user} still may not {verb} {resource} in {ns}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The resource rules of `kubectl auth can-i --list` (resource, resource names, verbs).
fn rules_of(user: &str, ns: &str) -> BTreeSet<(String, String, String)> {
    let out = run(
        kubectl_cmd().args(["auth", "can-i", "--list", "-n", ns, "--as", user]),
        None,
    )
    .expect_ok();
    out.lines()
        .skip(1)
        .filter(|l| !l.starts_with(char::is_whitespace) && !l.is_empty())
        .map(|l| {
            let resource = l.split_whitespace().next().unwrap_or_default().to_owned();
            let groups: Vec<String> = l
                .split('[')
                .skip(1)
                .map(|g| g.split(']').next().unwrap_or_default().to_owned())
                .collect();
            assert_eq!(groups.len(), 3, "can-i --list row {l:?}");
            (resource, groups[1].clone(), groups[2].clone())
        })
        .collect()
}

/// What the ServiceAccount may do beyond what every authenticated user may.
fn granted(ns: &str, sa: &str) -> BTreeSet<(String, String, String)> {
    let baseline = rules_of(&format!("system:serviceaccount:{ns}:nobody"), ns);
    rules_of(&format!("system:serviceaccount:{ns}:{sa}"), ns)
        .difference(&baseline)
        .cloned()
        .collect()
}

fn rule(resource: &str, names: &str, verbs: &str) -> (String, String, String) {
    (resource.to_owned(), names.to_owned(), verbs.to_owned())
}

#[test]
fn the_service_account_can_do_exactly_what_the_elector_needs() {
    servicemonitor_crd_installed();
    election_crd_installed();

    // Kubernetes backend (defaults).
    let ns = restricted_namespace("rbac-kube");
    helm_install("el", &ns, &[]).expect_ok();
    let sa = format!("system:serviceaccount:{ns}:el-tenure");
    wait_allowed(&sa, &ns, "get", "leases/el-tenure");
    for (verb, resource) in [
        ("get", "leases/el-tenure"),
        ("list", "leases/el-tenure"),
        ("watch", "leases/el-tenure"),
        ("update", "leases/el-tenure"),
        ("create", "leases"),
        ("create", "events"),
    ] {
        assert!(can_i(&sa, &ns, verb, resource, None), "{verb} {resource}");
    }
    for (verb, resource) in [
        ("delete", "leases/el-tenure"),
        ("patch", "leases/el-tenure"),
        ("get", "leases/someone-else"),
        ("update", "leases/someone-else"),
        ("list", "leases"),
        ("watch", "leases"),
        ("deletecollection", "leases"),
        ("get", "secrets"),
        ("list", "secrets"),
        ("get", "configmaps"),
        ("create", "pods"),
        ("list", "pods"),
        ("get", "events"),
        ("delete", "events"),
        ("get", "elections.tenure.dev/el-tenure"),
    ] {
        assert!(
            !can_i(&sa, &ns, verb, resource, None),
            "may {verb} {resource}"
        );
    }
    // Nothing in another namespace, nothing cluster-wide.
    for (verb, resource) in [
        ("get", "leases/el-tenure"),
        ("create", "leases"),
        ("create", "events"),
    ] {
        assert!(
            !can_i(&sa, "default", verb, resource, None),
            "{verb} {resource} in default"
        );
        assert!(
            !can_i(&sa, "kube-system", verb, resource, None),
            "{verb} {resource} in kube-system"
        );
    }
    assert!(!can_i(&sa, ALL, "list", "namespaces", None));
    assert!(!can_i(&sa, ALL, "list", "leases", None));
    assert!(!can_i(&sa, ALL, "create", "leases", None));
    assert_eq!(
        granted(&ns, "el-tenure"),
        [
            rule("events", "", "create"),
            rule("leases.coordination.k8s.io", "", "create"),
            rule(
                "leases.coordination.k8s.io",
                "el-tenure",
                "get list watch update"
            ),
        ]
        .into()
    );

    // Kubernetes backend + Election status.
    let ns = restricted_namespace("rbac-publish");
    helm_install("mig", &ns, &["-f", &ci("kube-publish-values.yaml")]).expect_ok();
    let sa = format!("system:serviceaccount:{ns}:mig-tenure");
    let el = "elections.tenure.dev/schema-migrations";
    wait_allowed(&sa, &ns, "update", "leases/schema-migrations");
    for verb in ["get", "update"] {
        assert!(can_i(&sa, &ns, verb, el, Some("status")), "{verb} status");
    }
    assert!(!can_i(&sa, &ns, "patch", el, Some("status")));
    for verb in ["get", "update", "patch", "delete"] {
        assert!(
            !can_i(&sa, &ns, verb, el, None),
            "may {verb} the Election itself"
        );
    }
    assert!(!can_i(&sa, &ns, "create", "elections.tenure.dev", None));
    assert!(!can_i(&sa, &ns, "list", "elections.tenure.dev", None));
    assert!(!can_i(
        &sa,
        &ns,
        "get",
        "elections.tenure.dev/other",
        Some("status")
    ));
    assert!(!can_i(
        &sa,
        &ns,
        "update",
        "elections.tenure.dev/other",
        Some("status")
    ));
    assert!(!can_i(&sa, "default", "update", el, Some("status")));
    assert_eq!(
        granted(&ns, "mig-tenure"),
        [
            rule("events", "", "create"),
            rule("leases.coordination.k8s.io", "", "create"),
            rule(
                "leases.coordination.k8s.io",
                "schema-migrations",
                "get list watch update"
            ),
            rule(
                "elections.tenure.dev/status",
                "schema-migrations",
                "get update"
            ),
        ]
        .into()
    );

    // Redis + Election status: the Election only; no Lease, no Events.
    let ns = restricted_namespace("rbac-redis");
    helm_install("rep", &ns, &["-f", &ci("redis-values.yaml")]).expect_ok();
    let sa = format!("system:serviceaccount:{ns}:rep-tenure");
    let el = "elections.tenure.dev/nightly-report";
    let deadline = Instant::now() + Duration::from_secs(15);
    while !can_i(&sa, &ns, "update", el, Some("status")) {
        assert!(
            Instant::now() < deadline,
            "{sa} still may not update {el}/status"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for (verb, resource) in [
        ("get", "leases/nightly-report"),
        ("create", "leases"),
        ("create", "events"),
    ] {
        assert!(
            !can_i(&sa, &ns, verb, resource, None),
            "redis: may {verb} {resource}"
        );
    }
    assert_eq!(
        granted(&ns, "rep-tenure"),
        [rule(
            "elections.tenure.dev/status",
            "nightly-report",
            "get update"
        )]
        .into()
    );

    // Redis alone: no Role at all.
    let ns = restricted_namespace("rbac-redis-only");
    helm_install(
        "solo",
        &ns,
        &[
            "--set",
            "backend.type=redis,backend.redis.url=redis://redis:6379,backend.redis.passwordSecret.name=redis",
        ],
    )
    .expect_ok();
    assert!(granted(&ns, "solo-tenure").is_empty());
}

/// A kubeconfig like the admin's, but authenticating with `token`.
fn kubeconfig_with_token(token: &str) -> PathBuf {
    let admin = std::fs::read_to_string(shared().admin_kubeconfig()).expect("admin kubeconfig");
    let mut replaced = 0;
    let text: Vec<String> = admin
        .lines()
        .map(|l| match l.split_once("token: ") {
            Some((indent, _)) if indent.trim().is_empty() => {
                replaced += 1;
                format!("{indent}token: {token}")
            }
            _ => l.to_owned(),
        })
        .collect();
    assert_eq!(replaced, 1, "one token line in the admin kubeconfig");
    let path = kube_support::fresh_dir("sa-kubeconfig").join("kubeconfig");
    std::fs::write(&path, text.join("\n") + "\n").expect("write kubeconfig");
    path
}

/// The chart's Role is not just what `can-i` says: tenure's Kubernetes backend, authenticated
/// as the chart's ServiceAccount, creates, renews, watches, releases and takes over its Lease
/// and records its Events, and is refused any other Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kube_backend_works_under_exactly_the_chart_role() {
    let ns = tokio::task::spawn_blocking(|| {
        let ns = restricted_namespace("rbac-real");
        helm_install("wk", &ns, &[]).expect_ok();
        wait_allowed(
            &format!("system:serviceaccount:{ns}:wk-tenure"),
            &ns,
            "get",
            "leases/wk-tenure",
        );
        ns
    })
    .await
    .expect("setup");
    let token = run(
        kubectl_cmd().args(["create", "token", "wk-tenure", "-n", &ns, "--duration=10m"]),
        None,
    )
    .expect_ok();
    let kubeconfig = kubeconfig_with_token(token.trim());
    let backend = || async {
        KubeBackend::from_kubeconfig(&kubeconfig, KubeOptions::new().namespace(ns.clone()))
            .await
            .expect("backend as the ServiceAccount")
    };
    let lease_name = "wk-tenure";
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .auto_renew(true);

    let first = Locker::with_identity(backend().await, "wk-0").expect("identity");
    let lease = first
        .try_acquire(lease_name, &opts)
        .await
        .expect("create the Lease");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        lease.is_valid(),
        "renewals (update) must work: {:?}",
        lease.end()
    );

    // Observers (list + watch by name) see the holder.
    let watcher = backend().await;
    let mut changes = watcher.observe(lease_name);
    let seen = tokio::time::timeout(Duration::from_secs(5), changes.next())
        .await
        .expect("list + watch by name are granted");
    match seen {
        Some(Ok(change)) => assert_eq!(change.holder.as_deref(), Some("wk-0")),
        other => panic!("observe: {other:?}"),
    }

    // A waiter is woken by the release and takes over (get + update).
    let second = Locker::with_identity(backend().await, "wk-1").expect("identity");
    let wait_opts = opts
        .clone()
        .retry_interval(Duration::from_secs(30))
        .wait(Duration::from_secs(30));
    let waiting = tokio::spawn(async move { second.acquire(lease_name, &wait_opts).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    lease.release().await.expect("release (update)");
    let next = waiting
        .await
        .expect("waiter task")
        .expect("taken over after the release");
    assert!(next.fencing_token() > lease.fencing_token());

    // Events: create is granted.
    let events_backend = backend().await;
    events_backend
        .record_event(
            lease_name,
            &LeadershipEvent::BecameLeader {
                identity: "wk-1".into(),
                fencing: next.fencing_token(),
            },
        )
        .await;
    next.release().await.expect("release");
    let ns2 = ns.clone();
    let events = tokio::task::spawn_blocking(move || {
        run(
            kubectl_cmd().args([
                "get",
                "events",
                "-n",
                &ns2,
                "--field-selector",
                "involvedObject.name=wk-tenure,reason=LeaderElection",
                "-o",
                "name",
            ]),
            None,
        )
        .expect_ok()
    })
    .await
    .expect("events");
    assert!(
        !events.trim().is_empty(),
        "no LeaderElection Event recorded"
    );

    // Any other Lease: refused.
    let other = Locker::with_identity(backend().await, "wk-2").expect("identity");
    match other.try_acquire("someone-else", &opts).await {
        Err(LockError::Backend(e)) => {
            assert_eq!(e.kind(), BackendErrorKind::PermissionDenied, "{e}");
        }
        other => panic!("another Lease: {other:?}"),
    }
}

/// `GET path` on 127.0.0.1:`port`: (status, body), or `None` if nothing answers.
#[cfg(feature = "cli")]
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// The Deployment's container command line, run as it would be in the pod: the real `tenure`
/// binary with exactly the chart's arguments, authenticated as the chart's ServiceAccount
/// (only its Role), leads, runs the command with the documented environment, serves
/// `/readyz`, `/healthz` and `/metrics` on the metrics port, and releases the Lease when the
/// command exits. Needs the binary, so it exists with the `cli` feature (CI's
/// `--all-features`).
#[cfg(feature = "cli")]
#[test]
fn the_rendered_command_line_runs_the_real_tenure() {
    let ns = restricted_namespace("cli");
    let port = kube_support::free_port();
    let values = [
        "--set".to_owned(),
        format!("metrics.host=127.0.0.1,metrics.port={port}"),
        "--set-json".to_owned(),
        r#"command=["sh","-c","echo token=$TENURE_FENCING_TOKEN lease=$TENURE_LEASE id=$TENURE_IDENTITY; sleep 4"]"#
            .to_owned(),
    ];
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    helm_install("cli", &ns, &values).expect_ok();
    let sa = format!("system:serviceaccount:{ns}:cli-tenure");
    wait_allowed(&sa, &ns, "get", "leases/cli-tenure");
    let token = run(
        kubectl_cmd().args(["create", "token", "cli-tenure", "-n", &ns, "--duration=10m"]),
        None,
    )
    .expect_ok();
    let kubeconfig = kubeconfig_with_token(token.trim());

    let objs = render("cli", &ns, &values);
    let worker = container(&pod_spec(&objs)["containers"], "worker");
    assert_eq!(strings(&worker["command"]), ["/tenure-bin/tenure"]);
    // Kubernetes' $(VAR) expansion of the two downward-API variables.
    let args: Vec<String> = strings(&worker["args"])
        .into_iter()
        .map(|a| {
            a.replace("$(POD_NAMESPACE)", &ns)
                .replace("$(POD_NAME)", "cli-pod-0")
        })
        .collect();
    let child = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(&args)
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAME", "cli-pod-0")
        .env("POD_NAMESPACE", &ns)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("TENURE_BACKEND")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tenure");

    let deadline = Instant::now() + Duration::from_secs(3);
    let ready = loop {
        match http_get(port, "/readyz") {
            Some((200, _)) => break true,
            _ if Instant::now() > deadline => break false,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let health = http_get(port, "/healthz");
    let metrics = http_get(port, "/metrics");
    let out = child.wait_with_output().expect("wait for tenure");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tenure: {}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(ready, "/readyz never answered 200 while leading:\n{stderr}");
    assert_eq!(health.map(|h| h.0), Some(200), "/healthz");
    let metrics = metrics.map(|m| m.1).unwrap_or_default();
    assert!(
        metrics.contains("leader_election_master_status{name=\"cli-tenure\"} 1"),
        "{metrics}"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("token="))
        .unwrap_or_else(|| panic!("the command did not run:\n{stdout}\n{stderr}"));
    assert!(line.ends_with(" lease=cli-tenure id=cli-pod-0"), "{line}");
    let token: u64 = line["token=".len()..]
        .split_whitespace()
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no fencing token in {line:?}"));
    assert!(token > 0);
    // Released when the command exited (client-go's release: holder cleared).
    let lease = run(
        kubectl_cmd().args(["get", "lease", "cli-tenure", "-n", &ns, "-o", "json"]),
        None,
    )
    .expect_ok();
    let lease: Value = serde_json::from_str(&lease).expect("lease json");
    assert_eq!(
        lease["spec"]["holderIdentity"].as_str().unwrap_or_default(),
        "",
        "{lease}"
    );
}

// ---------------------------------------------------------------------------------------------
// Fencing enforced by the API server (`fencing.*`): the chart's policy is the generator's.

/// The objects `fencing.*` adds (and a rule in the Role): the policy, its binding, the
/// ClusterRole for the token's user extra and its binding, the election's Lease, created
/// empty before the binding (so the policy has its parameter from the start), and the anchor
/// (a second policy and binding, kept on uninstall).
const FENCING_KINDS: [&str; 5] = [
    "Lease",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ClusterRole",
    "ClusterRoleBinding",
];

/// The Role's rule that lets the ServiceAccount impersonate itself.
fn self_impersonation(sa: &str) -> Value {
    json!({"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": [sa],
           "verbs": ["impersonate"]})
}

/// The object of `kind` named `name` (the only one).
fn named<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = objs
        .iter()
        .filter(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {kind} {name} in {:?}",
        names(objs)
    );
    found[0]
}

/// The anchor's name: one per cluster, the chart's and `tenure policy`'s alike.
const ANCHOR: &str = tenure::fence::kube::ANCHOR_NAME;

/// Asserts that `objs` carry the anchor, exactly as `FencingPolicy::anchor` (what `tenure
/// policy` prints) generates it: its name, both specs (compared as JSON), its labels and
/// annotations; kept by `helm uninstall` (`helm.sh/resource-policy: keep`).
fn assert_generators_anchor(objs: &[Value], what: &str) {
    let name = ANCHOR;
    let (policy, binding) = FencingPolicy::anchor();
    assert_eq!(policy.metadata.name.as_deref(), Some(name));
    assert_eq!(binding.metadata.name.as_deref(), Some(name));
    for (kind, spec, metadata) in [
        (
            "ValidatingAdmissionPolicy",
            serde_json::to_value(&policy.spec).expect("anchor spec json"),
            &policy.metadata,
        ),
        (
            "ValidatingAdmissionPolicyBinding",
            serde_json::to_value(&binding.spec).expect("anchor binding spec json"),
            &binding.metadata,
        ),
    ] {
        let rendered = named(objs, kind, name);
        assert_eq!(rendered["apiVersion"], "admissionregistration.k8s.io/v1");
        assert!(
            rendered["metadata"]["namespace"].is_null(),
            "{what}: anchor {kind} is cluster-scoped"
        );
        assert!(
            rendered["spec"] == spec,
            "{what}: the chart's anchor {kind} spec differs from the generator's\n\
             chart:     {}\ngenerator: {spec}",
            rendered["spec"]
        );
        let labels = &rendered["metadata"]["labels"];
        for (k, v) in metadata.labels.iter().flatten() {
            if k == "app.kubernetes.io/managed-by" {
                assert_eq!(labels[k], "Helm", "{what}: anchor {kind}");
            } else {
                assert_eq!(labels[k], v.as_str(), "{what}: anchor {kind} label {k}");
            }
        }
        let annotations = &rendered["metadata"]["annotations"];
        for (k, v) in metadata.annotations.iter().flatten() {
            assert_eq!(
                annotations[k],
                v.as_str(),
                "{what}: anchor {kind} annotation {k}"
            );
        }
        assert_eq!(
            annotations["helm.sh/resource-policy"], "keep",
            "{what}: anchor {kind} must outlive `helm uninstall`"
        );
    }
}

/// The generator's policy spec as JSON.
fn generators_policy_spec(policy: &FencingPolicy) -> Value {
    serde_json::to_value(policy.policy().spec).expect("policy spec json")
}

/// Asserts that `objs` carry exactly `policy` (the generator's objects for the same inputs):
/// names, the election's labels, and both specs, compared as JSON.
fn assert_generators_policy(objs: &[Value], policy: &FencingPolicy, what: &str) {
    let generated_policy = policy.policy();
    let generated_binding = policy.binding();
    for (kind, spec) in [
        ("ValidatingAdmissionPolicy", generators_policy_spec(policy)),
        (
            "ValidatingAdmissionPolicyBinding",
            serde_json::to_value(&generated_binding.spec).expect("binding spec json"),
        ),
    ] {
        let rendered = named(objs, kind, &policy.name());
        assert_eq!(rendered["apiVersion"], "admissionregistration.k8s.io/v1");
        assert!(
            rendered["metadata"]["namespace"].is_null(),
            "{what}: {kind} is cluster-scoped"
        );
        assert!(
            rendered["spec"] == spec,
            "{what}: the chart's {kind} spec differs from the generator's\n\
             chart:     {}\ngenerator: {spec}",
            rendered["spec"]
        );
        // The generator's labels, but managed-by: Helm manages these. Uninstall deletes them
        // (the anchor stays).
        assert!(
            rendered["metadata"]["annotations"]["helm.sh/resource-policy"].is_null(),
            "{what}: {kind}"
        );
        let labels = &rendered["metadata"]["labels"];
        for (k, v) in generated_policy.metadata.labels.iter().flatten() {
            if k == "app.kubernetes.io/managed-by" {
                assert_eq!(labels[k], "Helm", "{what}: {kind}");
            } else {
                assert_eq!(labels[k], v.as_str(), "{what}: {kind} label {k}");
            }
        }
    }
}

#[test]
fn fencing_policy_renders_exactly_the_generators_objects_and_rbac() {
    // Defaults: the chart's lease and ServiceAccount, every resource.
    let objs = render("demo", "apps", &["--set", "fencing.policy.enabled=true"]);
    let k = kinds(&objs);
    for kind in FENCING_KINDS {
        assert!(k.contains(kind), "{kind} missing from {k:?}");
    }
    let policy = FencingPolicy::new("apps", "demo-tenure")
        .and_then(|p| p.service_account("apps", "demo-tenure"))
        .expect("valid policy");
    assert_eq!(policy.name(), "tenure-fencing.apps.demo-tenure");
    assert_generators_policy(&objs, &policy, "defaults");
    // The one anchor of the cluster, as `tenure policy` prints it, kept on uninstall.
    assert_generators_anchor(&objs, "defaults");
    assert_eq!(
        names(&objs)
            .into_iter()
            .filter(|(kind, _)| kind.starts_with("ValidatingAdmissionPolicy"))
            .collect::<BTreeSet<_>>(),
        [
            (
                "ValidatingAdmissionPolicy",
                "tenure-fencing.apps.demo-tenure"
            ),
            ("ValidatingAdmissionPolicy", "tenure-fencing-anchor"),
            (
                "ValidatingAdmissionPolicyBinding",
                "tenure-fencing.apps.demo-tenure"
            ),
            ("ValidatingAdmissionPolicyBinding", "tenure-fencing-anchor"),
        ]
        .map(|(k, n)| (k.to_owned(), n.to_owned()))
        .into()
    );
    // The binding's parameter exists from the start, and outlives the release.
    let lease = one(&objs, "Lease");
    assert_eq!(lease["apiVersion"], "coordination.k8s.io/v1");
    assert_eq!(lease["metadata"]["name"], "demo-tenure");
    assert_eq!(lease["metadata"]["namespace"], "apps");
    assert_eq!(
        lease["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert!(lease["spec"].is_null(), "an empty Lease: {lease}");
    // Spelled out once, so the comparison above cannot pass on two equal mistakes.
    let spec = &named(&objs, "ValidatingAdmissionPolicy", &policy.name())["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    let ops = json!(["CREATE", "UPDATE", "DELETE", "CONNECT"]);
    assert_eq!(
        spec["matchConstraints"]["resourceRules"],
        json!([{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ops,
                "resources": ["*/*"], "scope": "*"}])
    );
    let excluded: Vec<(Value, Value)> = spec["matchConstraints"]["excludeResourceRules"]
        .as_array()
        .expect("exclusions")
        .iter()
        .map(|r| {
            assert_eq!(r["operations"], ops);
            (r["apiGroups"].clone(), r["resources"].clone())
        })
        .collect();
    // Leases are not excluded: the second match condition spares all but the probe.
    assert_eq!(
        excluded,
        [
            (json!([""]), json!(["events", "events/*"])),
            (json!(["events.k8s.io"]), json!(["events", "events/*"])),
            (json!(["tenure.dev"]), json!(["elections", "elections/*"])),
            (
                json!(["authentication.k8s.io", "authorization.k8s.io"]),
                json!(["*/*"])
            ),
        ]
    );
    assert_eq!(
        spec["paramKind"],
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"})
    );
    assert_eq!(spec["matchConditions"].as_array().map(Vec::len), Some(2));
    assert_eq!(spec["matchConditions"][0]["name"], "election-participant");
    assert_eq!(
        spec["matchConditions"][0]["expression"],
        "request.userInfo.username in ['system:serviceaccount:apps:demo-tenure']"
    );
    assert_eq!(
        spec["matchConditions"][1]["name"],
        "not-a-lease-but-a-probe"
    );
    let probe = spec["matchConditions"][1]["expression"]
        .as_str()
        .expect("probe condition");
    assert!(
        probe.starts_with("!(request.resource.group == 'coordination.k8s.io' && ")
            && probe.ends_with(") || request.name.startsWith('tenure-fence-probe.')"),
        "{probe}"
    );
    assert_eq!(policy.probe(), "tenure-fence-probe.demo-tenure");
    assert_eq!(spec["validations"].as_array().map(Vec::len), Some(1));
    assert!(
        spec["validations"][0]["messageExpression"]
            .as_str()
            .is_some_and(|m| m.contains("tenure fencing:")),
        "{spec}"
    );
    let binding = &named(&objs, "ValidatingAdmissionPolicyBinding", &policy.name())["spec"];
    assert_eq!(
        binding,
        &json!({
            "policyName": "tenure-fencing.apps.demo-tenure",
            "paramRef": {"name": "demo-tenure", "namespace": "apps",
                         "parameterNotFoundAction": "Allow"},
            "validationActions": ["Deny"]
        })
    );
    // The anchor, spelled out once too: a Lease parameter, a resource nobody serves.
    let anchor = named(&objs, "ValidatingAdmissionPolicy", "tenure-fencing-anchor");
    assert_eq!(
        anchor["spec"],
        json!({
            "failurePolicy": "Ignore",
            "paramKind": {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"},
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["tenure.dev"], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["fencinganchors"], "scope": "*"}]},
            "validations": [{"expression": "true"}]
        })
    );
    assert_eq!(
        named(
            &objs,
            "ValidatingAdmissionPolicyBinding",
            "tenure-fencing-anchor"
        )["spec"],
        json!({
            "policyName": "tenure-fencing-anchor",
            "paramRef": {"name": "tenure-fencing-anchor",
                         "parameterNotFoundAction": "Allow"},
            "validationActions": ["Deny"]
        })
    );
    // The dry-run proof creates the probe Lease: the Role grants create on leases.
    let rules = one(&objs, "Role")["rules"]
        .as_array()
        .expect("rules")
        .clone();
    assert!(
        rules
            .iter()
            .any(|r| r["apiGroups"] == json!(["coordination.k8s.io"])
                && r["resources"] == json!(["leases"])
                && r["resourceNames"].is_null()
                && strings(&r["verbs"]).iter().any(|v| v == "create")),
        "no create on leases for the fence proof: {rules:?}"
    );

    // RBAC: self-impersonation in the Role, the token's user extra in a ClusterRole.
    let rules = one(&objs, "Role")["rules"]
        .as_array()
        .expect("rules")
        .clone();
    assert_eq!(rules.last(), Some(&self_impersonation("demo-tenure")));
    assert_eq!(rules.len(), 4, "{rules:?}");
    let cluster_role = one(&objs, "ClusterRole");
    assert_eq!(cluster_role["metadata"]["name"], policy.name());
    assert_eq!(
        cluster_role["rules"],
        json!([{"apiGroups": ["authentication.k8s.io"],
                "resources": ["userextras/tenure.dev/fencing-token",
                              "userextras/tenure.dev/fencing-election"],
                "verbs": ["impersonate"]}])
    );
    let crb = one(&objs, "ClusterRoleBinding");
    assert_eq!(crb["metadata"]["name"], policy.name());
    assert_eq!(
        crb["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
               "name": policy.name()})
    );
    assert_eq!(
        crb["subjects"],
        json!([{"kind": "ServiceAccount", "name": "demo-tenure", "namespace": "apps"}])
    );

    // Governed resources (unsorted, repeated), more participants (one repeated), a named
    // lease and ServiceAccount: still the generator's objects.
    let objs = render(
        "r",
        "ops",
        &[
            "--set",
            "fencing.policy.enabled=true,election.lease=reports.controller,serviceAccount.name=reporter",
            "--set-json",
            r#"fencing.policy.resources=["statefulsets.apps","configmaps","widgets.example.com","deployments.apps","configmaps"]"#,
            "--set-json",
            r#"fencing.policy.extraServiceAccounts=[{"name":"helper"},{"name":"auditor","namespace":"audit"},{"name":"reporter"}]"#,
            "--set-json",
            r#"fencing.policy.extraUsers=["alice@example.com","system:serviceaccount:audit:auditor"]"#,
        ],
    );
    let policy = FencingPolicy::new("ops", "reports.controller")
        .and_then(|p| p.service_account("ops", "reporter"))
        .and_then(|p| p.service_account("ops", "helper"))
        .and_then(|p| p.service_account("audit", "auditor"))
        .and_then(|p| p.service_account("ops", "reporter"))
        .and_then(|p| p.user("alice@example.com"))
        .and_then(|p| p.user("system:serviceaccount:audit:auditor"))
        .and_then(|p| p.resource("statefulsets.apps"))
        .and_then(|p| p.resource("configmaps"))
        .and_then(|p| p.resource("widgets.example.com"))
        .and_then(|p| p.resource("deployments.apps"))
        .and_then(|p| p.resource("configmaps"))
        .expect("valid policy");
    assert_generators_policy(&objs, &policy, "resources and participants");
    assert_generators_anchor(&objs, "resources and participants");
    let rules = named(&objs, "ValidatingAdmissionPolicy", &policy.name())["spec"]
        ["matchConstraints"]["resourceRules"]
        .clone();
    assert_eq!(
        rules.as_array().and_then(|r| r.last()),
        Some(
            &json!({"apiGroups": ["coordination.k8s.io"], "apiVersions": ["*"],
                     "operations": ["CREATE"], "resources": ["leases"], "scope": "*"})
        ),
        "the probe's rule comes last: {rules}"
    );
    assert_eq!(rules.as_array().map(Vec::len), Some(4), "{rules}");
    let rules = one(&objs, "Role")["rules"]
        .as_array()
        .expect("rules")
        .clone();
    // The participants of the release's namespace impersonate themselves; every participant
    // ServiceAccount (an extraUsers entry naming one too) carries the token, as `tenure policy`
    // grants it. Another namespace's self-impersonation is its own to grant.
    assert_eq!(
        rules.last(),
        Some(&json!({"apiGroups": [""], "resources": ["serviceaccounts"],
                     "resourceNames": ["reporter", "helper"], "verbs": ["impersonate"]}))
    );
    let participants = json!([
        {"kind": "ServiceAccount", "name": "auditor", "namespace": "audit"},
        {"kind": "ServiceAccount", "name": "reporter", "namespace": "ops"},
        {"kind": "ServiceAccount", "name": "helper", "namespace": "ops"},
    ]);
    assert_eq!(one(&objs, "ClusterRoleBinding")["subjects"], participants);
    assert_eq!(
        named(&objs, "RoleBinding", "tenure-worker.reports.controller")["subjects"],
        participants
    );

    // The CI values file, as lint and the install below use it.
    let objs = render("ci", "ci", &["-f", &ci("kube-fencing-values.yaml")]);
    let policy = FencingPolicy::new("ci", "fenced-controller")
        .and_then(|p| p.service_account("ci", "ci-tenure"))
        .and_then(|p| p.user("ops-bot@example.com"))
        .and_then(|p| p.resource("configmaps"))
        .and_then(|p| p.resource("deployments.apps"))
        .expect("valid policy");
    assert_generators_policy(&objs, &policy, "ci values");
    assert_generators_anchor(&objs, "ci values");

    // Neither the namespace nor the release names the anchor: one per cluster.
    let objs = render(
        "x",
        "other",
        &[
            "--set",
            "fencing.policy.enabled=true,fullnameOverride=f,election.lease=l",
        ],
    );
    assert_generators_anchor(&objs, "another release");
    // fencing.policy.anchor: true renders it as auto does without a cluster (helm template
    // has none to look up), false never.
    let objs = render(
        "x",
        "apps",
        &[
            "--set",
            "fencing.policy.enabled=true,fencing.policy.anchor=true",
        ],
    );
    assert_generators_anchor(&objs, "anchor=true");
    let objs = render(
        "x",
        "apps",
        &[
            "--set",
            "fencing.policy.enabled=true,fencing.policy.anchor=false",
        ],
    );
    assert!(
        !names(&objs).iter().any(|(_, name)| name == ANCHOR),
        "anchor=false renders the anchor: {:?}",
        names(&objs)
    );
    assert_generators_policy(
        &objs,
        &FencingPolicy::new("apps", "x-tenure")
            .and_then(|p| p.service_account("apps", "x-tenure"))
            .expect("valid policy"),
        "anchor=false",
    );
}

#[test]
fn fencing_is_rendered_only_when_asked_for() {
    let fencing_kinds = |objs: &[Value]| -> BTreeSet<String> {
        kinds(objs)
            .into_iter()
            .filter(|k| FENCING_KINDS.contains(&k.as_str()))
            .collect()
    };
    let impersonates = |objs: &[Value]| {
        objs.iter()
            .filter(|o| o["kind"] == "Role")
            .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
            .any(|rule| rule["verbs"] == json!(["impersonate"]))
    };
    let set =
        |kinds: &[&str]| -> BTreeSet<String> { kinds.iter().map(|k| (*k).to_owned()).collect() };
    let policy_only = [
        "Lease",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    let cases: &[(&[&str], &[&str], bool)] = &[
        // Off by default, with every other ci values file too.
        (&[], &[], false),
        (&["-f", &ci("kube-publish-values.yaml")], &[], false),
        (&["-f", &ci("redis-values.yaml")], &[], false),
        (&["--set", "fencing.policy.enabled=false"], &[], false),
        // Everything with the policy.
        (
            &["--set", "fencing.policy.enabled=true"],
            &FENCING_KINDS,
            true,
        ),
        // The RBAC alone (a policy installed outside the chart).
        (
            &["--set", "fencing.impersonation=true"],
            &["ClusterRole", "ClusterRoleBinding"],
            true,
        ),
        // The policy alone (RBAC granted elsewhere).
        (
            &[
                "--set",
                "fencing.policy.enabled=true,fencing.impersonation=false",
            ],
            &policy_only,
            false,
        ),
        (
            &["--set", "fencing.policy.enabled=true,rbac.create=false"],
            &policy_only,
            false,
        ),
    ];
    for (args, expected, role_rule) in cases {
        // A release named "off": its labels must stay strings, not YAML booleans.
        let objs = render("off", "apps", args);
        assert_eq!(fencing_kinds(&objs), set(expected), "{args:?}");
        assert_eq!(
            impersonates(&objs),
            *role_rule,
            "{args:?}: the Role's impersonate rule"
        );
        // The anchor comes with the policy, and only with it.
        let anchors: BTreeSet<(String, String)> = names(&objs)
            .into_iter()
            .filter(|(_, name)| name == ANCHOR)
            .collect();
        let expected_anchors: BTreeSet<(String, String)> =
            if expected.contains(&"ValidatingAdmissionPolicy") {
                [
                    "ValidatingAdmissionPolicy",
                    "ValidatingAdmissionPolicyBinding",
                ]
                .map(|k| (k.to_owned(), ANCHOR.to_owned()))
                .into()
            } else {
                BTreeSet::new()
            };
        assert_eq!(anchors, expected_anchors, "{args:?}");
    }
}

#[test]
fn bad_fencing_values_fail_with_a_clear_message() {
    let schema = "values don't meet the specifications of the schema(s)";
    let long_resource = format!(r#"fencing.policy.resources=["{}.apps"]"#, "r".repeat(64));
    let long_lease = format!(
        "fencing.policy.enabled=true,election.lease={}",
        "l".repeat(64)
    );
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--set", "fencing.policy.enabled=yes"],
            &[
                schema,
                "at '/fencing/policy/enabled': got string, want boolean",
            ],
        ),
        (
            &["--set", "fencing.impersonation=maybe"],
            &[schema, "at '/fencing/impersonation'"],
        ),
        (
            &["--set", "fencing.policy.anchor=maybe"],
            &[
                schema,
                "at '/fencing/policy/anchor': value must be one of 'auto', true, false",
            ],
        ),
        (
            &[
                "--set-json",
                r#"fencing.policy.resources=["Deployments.apps"]"#,
            ],
            &[
                schema,
                "at '/fencing/policy/resources/0'",
                "does not match pattern",
            ],
        ),
        (
            &["--set-json", r#"fencing.policy.resources=["deployments."]"#],
            &[schema, "at '/fencing/policy/resources/0'"],
        ),
        (
            &["--set-json", r#"fencing.policy.resources="configmaps""#],
            &[schema, "at '/fencing/policy/resources'"],
        ),
        (
            &["--set-json", r#"fencing.policy.extraUsers=["it's me"]"#],
            &[schema, "at '/fencing/policy/extraUsers/0'"],
        ),
        (
            &[
                "--set-json",
                r#"fencing.policy.extraServiceAccounts=[{"namespace":"x"}]"#,
            ],
            &[
                schema,
                "at '/fencing/policy/extraServiceAccounts/0'",
                "missing property 'name'",
            ],
        ),
        (
            &[
                "--set-json",
                r#"fencing.policy.extraServiceAccounts=[{"name":"a","namespace":"a.b"}]"#,
            ],
            &[
                schema,
                "at '/fencing/policy/extraServiceAccounts/0/namespace'",
            ],
        ),
        (
            &["--set", "fencing.policy.enable=true"],
            &[schema, "additional properties 'enable' not allowed"],
        ),
        // Checked by the templates.
        (
            &[
                "--set",
                "fencing.policy.enabled=true,backend.type=redis,backend.redis.url=redis://r:6379",
            ],
            &["fencing.policy / fencing.impersonation need backend.type kube"],
        ),
        (
            &[
                "--set",
                "fencing.impersonation=true,backend.type=redis,backend.redis.url=redis://r:6379",
            ],
            &["fencing.policy / fencing.impersonation need backend.type kube"],
        ),
        (
            &[
                "--set",
                "fencing.policy.enabled=true",
                "--kube-version",
                "1.29.4",
            ],
            &["fencing.policy.enabled needs Kubernetes >= 1.30"],
        ),
        (
            &[
                "--set",
                "fencing.policy.enabled=true",
                "--set-json",
                &long_resource,
            ],
            &["the resource part must be at most 63 characters"],
        ),
        (
            &["--set", &long_lease],
            &["needs a lease name of at most 63 characters"],
        ),
    ];
    assert_refused(cases);
    // The election's own resources, which it writes without a token (`tenure policy` refuses
    // them too, exit 2): one line naming the value.
    for own in [
        "leases.coordination.k8s.io",
        "events",
        "events.events.k8s.io",
        "elections.tenure.dev",
    ] {
        let resources = format!(r#"fencing.policy.resources=["configmaps","{own}"]"#);
        let expected = format!("fencing.policy.resources: \"{own}\" cannot be governed");
        assert_refused(&[(
            &[
                "--set",
                "fencing.policy.enabled=true",
                "--set-json",
                &resources,
            ],
            &[&expected, "without a token"],
        )]);
    }
    // Names alike, but not the election's: governed.
    let objs = render(
        "ok",
        "ns",
        &[
            "--set",
            "fencing.policy.enabled=true",
            "--set-json",
            r#"fencing.policy.resources=["leases","events.example.com","elections.example.com"]"#,
        ],
    );
    let policy = FencingPolicy::new("ns", "ok-tenure")
        .and_then(|p| p.service_account("ns", "ok-tenure"))
        .and_then(|p| p.resource("leases"))
        .and_then(|p| p.resource("events.example.com"))
        .and_then(|p| p.resource("elections.example.com"))
        .expect("valid policy");
    assert_generators_policy(&objs, &policy, "names alike the election's own");
}

/// The worker's `tenure run` flags (before the `--`), and whether `/tmp` is mounted.
fn worker_flags(objs: &[Value]) -> (Vec<String>, bool) {
    let worker = container(&pod_spec(objs)["containers"], "worker");
    let args = strings(&worker["args"]);
    let dashdash = args.iter().position(|a| a == "--").expect("-- in args");
    let tmp = worker["volumeMounts"]
        .as_array()
        .is_some_and(|m| m.iter().any(|v| v["mountPath"] == "/tmp"));
    (args[..dashdash].to_vec(), tmp)
}

#[test]
fn fencing_command_renders_fence_before_the_command() {
    // (values, whether the worker runs `tenure run --fence`)
    let cases: &[(&[&str], bool)] = &[
        // Off by default, and with every ci values file but the fencing one.
        (&[], false),
        (&["-f", &ci("kube-publish-values.yaml")], false),
        (&["-f", &ci("redis-values.yaml")], false),
        (&["--set", "fencing.policy.enabled=false"], false),
        (&["--set", "fencing.impersonation=true"], false),
        // null follows the policy (Kubernetes backend)...
        (&["--set", "fencing.policy.enabled=true"], true),
        (&["-f", &ci("kube-fencing-values.yaml")], true),
        (
            &[
                "--set",
                "fencing.policy.enabled=true,fencing.impersonation=true",
            ],
            true,
        ),
        (
            &["--set", "fencing.policy.enabled=true,rbac.create=false"],
            true,
        ),
        // ...but not when the chart grants no self-impersonation (RBAC granted elsewhere):
        // that release renders as it did before fencing.command.
        (
            &[
                "--set",
                "fencing.policy.enabled=true,fencing.impersonation=false",
            ],
            false,
        ),
        // Forced either way.
        (
            &["--set", "fencing.policy.enabled=true,fencing.command=false"],
            false,
        ),
        (&["--set", "fencing.command=false"], false),
        (&["--set", "fencing.command=true"], true),
        (
            &["--set", "fencing.command=true,fencing.impersonation=true"],
            true,
        ),
        // A writable root filesystem, or a /tmp of the user's, instead of the chart's /tmp.
        (
            &[
                "--set",
                "fencing.command=true,tmpVolume.enabled=false,securityContext.readOnlyRootFilesystem=false",
            ],
            true,
        ),
        (
            &[
                "--set",
                "fencing.command=true,tmpVolume.enabled=false",
                "--set-json",
                r#"extraVolumes=[{"name":"scratch","emptyDir":{}}]"#,
                "--set-json",
                r#"extraVolumeMounts=[{"name":"scratch","mountPath":"/tmp"}]"#,
            ],
            true,
        ),
    ];
    for (args, fenced) in cases {
        let objs = render("cmd", "apps", args);
        let (flags, tmp) = worker_flags(&objs);
        let fences = flags.iter().filter(|a| *a == "--fence").count();
        assert_eq!(
            fences,
            usize::from(*fenced),
            "{args:?}: --fence before the -- in {flags:?}"
        );
        // Where the fenced kubeconfig goes: /tmp, writable (unless the root filesystem is).
        let writable_root = args
            .iter()
            .any(|a| a.contains("readOnlyRootFilesystem=false"));
        if *fenced && !writable_root {
            assert!(tmp, "{args:?}: the fenced kubeconfig's /tmp is not mounted");
        }
    }
    // Nowhere but among tenure's flags: not in the command, not in the init container.
    let objs = render("cmd", "apps", &["--set", "fencing.policy.enabled=true"]);
    let spec = pod_spec(&objs);
    let args = strings(&container(&spec["containers"], "worker")["args"]);
    assert_eq!(
        args.iter().filter(|a| *a == "--fence").count(),
        1,
        "{args:?}"
    );
    let fence = args.iter().position(|a| a == "--fence").expect("--fence");
    let dashdash = args.iter().position(|a| a == "--").expect("--");
    assert!(fence < dashdash, "{args:?}");
    assert_eq!(args[0], "run", "{args:?}");
    assert!(
        !strings(&container(&spec["initContainers"], "tenure-install")["command"])
            .contains(&"--fence".to_owned())
    );
    assert_restricted(spec);

    let redis = "backend.type=redis,backend.redis.url=redis://r:6379";
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--set", "fencing.command=maybe"],
            &[
                "values don't meet the specifications of the schema(s)",
                "at '/fencing/command'",
            ],
        ),
        (
            &["--set", &format!("fencing.command=true,{redis}")],
            &["fencing.command needs backend.type=kube"],
        ),
        (
            &[
                "-f",
                &ci("redis-values.yaml"),
                "--set",
                "fencing.command=true",
            ],
            &["fencing.command needs backend.type=kube"],
        ),
        (
            &["--set", "fencing.command=true,tmpVolume.enabled=false"],
            &["fencing.command needs tmpVolume.enabled=true", "under /tmp"],
        ),
        (
            &[
                "--set",
                "fencing.policy.enabled=true,tmpVolume.enabled=false",
            ],
            &["fencing.command needs tmpVolume.enabled=true", "under /tmp"],
        ),
    ];
    assert_refused(cases);
    // Off, the same values render: nothing else stands in the way.
    for args in [
        format!("fencing.command=false,{redis}"),
        "fencing.command=false,tmpVolume.enabled=false".to_owned(),
        "fencing.command=false,sharding.shards=3".to_owned(),
    ] {
        let (flags, _) = worker_flags(&render("cmd", "apps", &["--set", &args]));
        assert!(!flags.contains(&"--fence".to_owned()), "{args}: {flags:?}");
    }
    // Impersonation RBAC granted outside the chart: forced on, it renders.
    let (flags, _) = worker_flags(&render(
        "cmd",
        "apps",
        &[
            "--set",
            "fencing.policy.enabled=true,fencing.impersonation=false,fencing.command=true",
        ],
    ));
    assert!(flags.contains(&"--fence".to_owned()), "{flags:?}");
}

/// `kubectl create` of a SubjectAccessReview as admin: may `user` impersonate the user extra
/// `key`? (`kubectl auth can-i` cannot ask: it does not know `userextras` and drops its group.)
fn may_impersonate_extra(user: &str, key: &str) -> bool {
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "resourceAttributes": {
            "group": "authentication.k8s.io", "resource": "userextras",
            "subresource": key, "verb": "impersonate"}}
    });
    let out = run(
        kubectl_cmd().args(["create", "-f", "-", "-o", "json"]),
        Some(&review.to_string()),
    )
    .expect_ok();
    let answer: Value = serde_json::from_str(&out).expect("SubjectAccessReview json");
    answer["status"]["allowed"] == true
}

/// The cluster-scoped objects the apiserver has for the fencing of lease `ns/lease`.
fn installed_fencing(ns: &str, lease: &str) -> BTreeSet<(String, String)> {
    let out = run(
        kubectl_cmd().args([
            "get",
            "validatingadmissionpolicies,validatingadmissionpolicybindings,clusterroles,\
             clusterrolebindings",
            "-l",
            &format!("tenure.dev/lease-namespace={ns},tenure.dev/lease={lease}"),
            "-o",
            "json",
        ]),
        None,
    )
    .expect_ok();
    let list: Value = serde_json::from_str(&out).expect("kubectl get -o json");
    names(list["items"].as_array().expect("items"))
}

/// The anchor policy and binding named `name` that the apiserver has: (kind, name), each
/// checked to carry `helm.sh/resource-policy: keep`.
fn installed_anchor(name: &str) -> BTreeSet<(String, String)> {
    let out = run(
        kubectl_cmd().args([
            "get",
            "validatingadmissionpolicies,validatingadmissionpolicybindings",
            name,
            "--ignore-not-found",
            "-o",
            "json",
        ]),
        None,
    )
    .expect_ok();
    if out.trim().is_empty() {
        return BTreeSet::new();
    }
    let list: Value = serde_json::from_str(&out).expect("kubectl get -o json");
    let items = list["items"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| vec![list]);
    for item in &items {
        assert_eq!(
            item["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{item}"
        );
    }
    names(&items)
}

/// `helm uninstall RELEASE -n NS --no-hooks` against the test apiserver (the pre-delete hook's
/// Job would never run: the test apiserver has no controllers or nodes).
fn helm_uninstall(release: &str, ns: &str) -> Run {
    run(
        helm_cmd()
            .args([
                "uninstall",
                release,
                "--no-hooks",
                "--namespace",
                ns,
                "--kubeconfig",
            ])
            .arg(shared().admin_kubeconfig()),
        None,
    )
}

/// The release (name, namespace) that Helm's ownership annotations on the anchor's policy name;
/// None without an anchor. Its binding must name the same.
fn anchor_owner() -> Option<(String, String)> {
    let owner = |kind: &str| {
        let out = run(
            kubectl_cmd().args(["get", kind, ANCHOR, "--ignore-not-found", "-o", "json"]),
            None,
        )
        .expect_ok();
        if out.trim().is_empty() {
            return None;
        }
        let obj: Value = serde_json::from_str(&out).expect("kubectl get -o json");
        let a = &obj["metadata"]["annotations"];
        Some((
            a["meta.helm.sh/release-name"].as_str()?.to_owned(),
            a["meta.helm.sh/release-namespace"].as_str()?.to_owned(),
        ))
    };
    let policy = owner("validatingadmissionpolicy");
    assert_eq!(
        policy,
        owner("validatingadmissionpolicybinding"),
        "the anchor's policy and binding have different owners"
    );
    policy
}

/// (kind, name) of the objects in release `release`'s manifest as Helm stored it.
fn manifest_names(release: &str, ns: &str) -> BTreeSet<(String, String)> {
    let out = run(
        helm_cmd()
            .args([
                "get",
                "manifest",
                release,
                "--namespace",
                ns,
                "--kubeconfig",
            ])
            .arg(shared().admin_kubeconfig()),
        None,
    )
    .expect_ok();
    names(&objects(&out))
}

/// With the anchor installed by `owner` (in `owner_ns`): a second fenced release in another
/// namespace installs without it (fencing.policy.anchor auto; true is refused by Helm, as the
/// object is another release's), `owner`'s upgrade keeps it in its manifest, and uninstalling
/// the second release leaves it.
fn second_release_leaves_the_anchor_to_its_owner(owner: &str, owner_ns: &str) {
    let ns = restricted_namespace("fencing-second");
    let forced = helm_install(
        "fy",
        &ns,
        &[
            "--set",
            "fencing.policy.enabled=true,fencing.policy.anchor=true",
        ],
    );
    assert!(!forced.ok, "a second owner of the anchor was accepted");
    assert!(
        forced.stderr.contains(ANCHOR) && forced.stderr.contains("cannot be imported"),
        "{}",
        forced.stderr
    );
    helm_uninstall("fy", &ns);
    helm_install("fy", &ns, &["--set", "fencing.policy.enabled=true"]).expect_ok();
    let fy = manifest_names("fy", &ns);
    assert!(
        fy.contains(&(
            "ValidatingAdmissionPolicy".to_owned(),
            format!("tenure-fencing.{ns}.fy-tenure")
        )),
        "{fy:?}"
    );
    assert!(
        !fy.iter().any(|(_, n)| n == ANCHOR),
        "the second release renders the anchor: {fy:?}"
    );
    assert_eq!(
        anchor_owner(),
        Some((owner.to_owned(), owner_ns.to_owned()))
    );
    // The owner's upgrade finds its own anchor and keeps it in its manifest.
    run(
        helm_cmd()
            .args(["upgrade", owner])
            .arg(chart())
            .args(["--namespace", owner_ns, "--reuse-values", "--kubeconfig"])
            .arg(shared().admin_kubeconfig()),
        None,
    )
    .expect_ok();
    let kept = manifest_names(owner, owner_ns);
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(
            kept.contains(&(kind.to_owned(), ANCHOR.to_owned())),
            "the owner's upgrade dropped the anchor's {kind}: {kept:?}"
        );
    }
    helm_uninstall("fy", &ns).expect_ok();
    assert_eq!(installed_anchor(ANCHOR).len(), 2);
    assert_eq!(
        anchor_owner(),
        Some((owner.to_owned(), owner_ns.to_owned()))
    );
}

/// `tenure policy`'s RBAC applied first (`kubectl apply`), then a release of the same
/// election with `fencing.impersonation`: the objects have the same names (#44), and Helm
/// refuses to take over an object it did not create, so the release leaves them to what applied
/// them (`tenure.absentOrOwned`), installs, and its ServiceAccount carries the token through
/// them; uninstalling the release leaves them.
#[test]
fn a_release_leaves_the_rbac_tenure_policy_applied_in_place() {
    let ns = restricted_namespace("fencing-both");
    let lease = "both-tenure";
    let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["policy", "--lease", lease, "--namespace", &ns])
        .args(["--service-account", lease])
        .output()
        .expect("tenure policy");
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    // Its RBAC only: the anchor is shared with the other tests' releases, the policy is not
    // what this test is about.
    let rbac: Vec<&str> = printed
        .split("\n---\n")
        .filter(|doc| {
            ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]
                .iter()
                .any(|k| doc.contains(&format!("\nkind: {k}\n")))
        })
        .collect();
    assert_eq!(rbac.len(), 4, "{printed}");
    apply(&rbac.join("\n---\n"));
    let election = [
        (
            "ClusterRole".to_owned(),
            format!("tenure-fencing.{ns}.{lease}"),
        ),
        (
            "ClusterRoleBinding".to_owned(),
            format!("tenure-fencing.{ns}.{lease}"),
        ),
        ("Role".to_owned(), format!("tenure-worker.{lease}")),
        ("RoleBinding".to_owned(), format!("tenure-worker.{lease}")),
    ];
    helm_install("both", &ns, &["--set", "fencing.impersonation=true"]).expect_ok();
    let manifest = manifest_names("both", &ns);
    for object in &election {
        assert!(
            !manifest.contains(object),
            "the release took {object:?} (applied by tenure policy): {manifest:?}"
        );
    }
    let sa = format!("system:serviceaccount:{ns}:{lease}");
    assert!(may_impersonate_extra(&sa, "tenure.dev/fencing-token"));
    assert!(can_i(
        &sa,
        &ns,
        "impersonate",
        &format!("serviceaccounts/{lease}"),
        None
    ));
    helm_uninstall("both", &ns).expect_ok();
    for (kind, name) in &election {
        let mut get = kubectl_cmd();
        get.args(["get", &kind.to_lowercase(), name, "-o", "name"]);
        if kind.starts_with("Role") {
            get.args(["--namespace", &ns]);
        }
        run(&mut get, None).expect_ok();
    }
}

/// A Role of the user's (not the chart's) letting `sa` write ConfigMaps: the workload's own
/// permissions, which the chart leaves to its user.
fn grant_configmaps(ns: &str, sa: &str) {
    apply(
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "workload", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]
        })
        .to_string(),
    );
    apply(
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "workload", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workload"},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
        })
        .to_string(),
    );
}

fn configmap(name: &str) -> k8s_openapi::api::core::v1::ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": name}}))
        .expect("configmap")
}

/// Creates ConfigMap `name` without a token until the policy refuses it (it is loaded
/// asynchronously after install); returns the refusal.
async fn refused_without_token(
    api: &kube::Api<k8s_openapi::api::core::v1::ConfigMap>,
    name: &str,
) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match api.create(&Default::default(), &configmap(name)).await {
            Err(kube::Error::Api(s)) if s.message.contains("tenure fencing:") => {
                return s.message;
            }
            other => {
                if other.is_ok() {
                    let _ = api.delete(name, &Default::default()).await;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "a write without a token was not refused within 30 s: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// A release's ServiceAccount with a Role of the user's for ConfigMaps: (a client
/// authenticated as it with a TokenRequest token, its user name).
fn workload_service_account(ns: &str, sa: &str) -> (PathBuf, String) {
    let user = format!("system:serviceaccount:{ns}:{sa}");
    grant_configmaps(ns, sa);
    wait_allowed(&user, ns, "create", "configmaps");
    let token = run(
        kubectl_cmd().args(["create", "token", sa, "-n", ns, "--duration=10m"]),
        None,
    )
    .expect_ok();
    (kubeconfig_with_token(token.trim()), user)
}

/// Two terms of `lease` taken (and the first released) through tenure's Kubernetes backend as
/// `client`: (the stale term's token, the current term).
async fn two_terms(
    client: &kube::Client,
    ns: &str,
    lease: &str,
) -> (tenure::FencingToken, tenure::lock::Lease) {
    let locker = Locker::with_identity(
        KubeBackend::from_client(client.clone(), KubeOptions::new().namespace(ns.to_owned()))
            .expect("backend"),
        "pod-0",
    )
    .expect("identity");
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let first = locker.try_acquire(lease, &opts).await.expect("first term");
    let stale = first.fencing_token();
    first.release().await.expect("release");
    let current = locker.try_acquire(lease, &opts).await.expect("second term");
    assert!(current.fencing_token() > stale);
    (stale, current)
}

/// The chart installed with the fencing policy (the ci values: configmaps and deployments.apps
/// governed): its objects are on the apiserver, its RBAC is what a fenced client needs and no
/// more, and the apiserver enforces the policy on the chart's ServiceAccount from the start
/// (the chart's empty Lease is the parameter): a write without a token is refused, the
/// current term's is admitted, a stale term's is refused, a non-participant's is admitted
/// here and in other namespaces. `helm uninstall` then leaves the Lease and the anchor. Then,
/// with the default (every resource) and without the chart's impersonation RBAC: the policy
/// is accepted and governs ConfigMaps, and the fenced client fails closed for want of the
/// RBAC (its fence proof is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_fencing_policy_is_enforced_by_the_apiserver() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::api::{Api, PostParams};

    let release = "fx";
    let lease = "fenced-controller";
    let (ns, kubeconfig) = tokio::task::spawn_blocking(move || {
        let ns = restricted_namespace("fencing");
        let values = ["-f".to_owned(), ci("kube-fencing-values.yaml")];
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        helm_install(release, &ns, &values).expect_ok();
        let expected: BTreeSet<(String, String)> = names(&render(release, &ns, &values))
            .into_iter()
            .filter(|(kind, _)| FENCING_KINDS.contains(&kind.as_str()))
            .collect();
        assert_eq!(expected.len(), 7, "{expected:?}");
        let mut found = installed_fencing(&ns, lease);
        found.extend(installed_anchor(ANCHOR));
        assert_eq!(
            anchor_owner(),
            Some((release.to_owned(), ns.clone())),
            "the first fenced release installs the cluster's anchor"
        );
        let lease_json = run(
            kubectl_cmd().args(["get", "lease", lease, "-n", &ns, "-o", "json"]),
            None,
        )
        .expect_ok();
        let lease_json: Value = serde_json::from_str(&lease_json).expect("lease json");
        found.insert(("Lease".to_owned(), lease.to_owned()));
        assert_eq!(found, expected);
        assert!(
            lease_json["spec"]["holderIdentity"].is_null(),
            "no term yet: {lease_json}"
        );

        let (kubeconfig, sa) = workload_service_account(&ns, "fx-tenure");
        // `kubectl auth can-i`: itself, by name; nobody else.
        wait_allowed(&sa, &ns, "impersonate", "serviceaccounts/fx-tenure");
        assert!(!can_i(
            &sa,
            &ns,
            "impersonate",
            "serviceaccounts/other",
            None
        ));
        assert!(!can_i(&sa, &ns, "impersonate", "serviceaccounts", None));
        assert!(!can_i(
            &sa,
            "default",
            "impersonate",
            "serviceaccounts/fx-tenure",
            None
        ));
        assert!(!can_i(&sa, ALL, "impersonate", "users", None));
        assert!(!can_i(&sa, ALL, "impersonate", "groups", None));
        // A SubjectAccessReview: the token's user extra, and no other.
        let deadline = Instant::now() + Duration::from_secs(15);
        while !may_impersonate_extra(&sa, "tenure.dev/fencing-token") {
            assert!(
                Instant::now() < deadline,
                "{sa} may not impersonate userextras/tenure.dev/fencing-token"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(!may_impersonate_extra(&sa, "tenure.dev/other"));
        assert!(!may_impersonate_extra(
            &format!("system:serviceaccount:{ns}:nobody"),
            "tenure.dev/fencing-token"
        ));
        (ns, kubeconfig)
    })
    .await
    .expect("setup");
    let client = shared().client_from(&kubeconfig).await;
    let plain: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();

    // Before any term (the chart's empty Lease is the parameter): a participant's write
    // without a token is refused by the policy itself, not for a missing parameter.
    let refusal = refused_without_token(&plain, "plain").await;
    assert!(
        refusal.contains(&format!(
            "tenure fencing: lease {ns}/{lease}: missing token"
        )),
        "{refusal}"
    );
    // Everyone else's writes to governed resources go on, here and elsewhere.
    let admin_client = shared().admin().await;
    for namespace in [ns.as_str(), "default"] {
        let name = format!("{ns}-admin");
        let api: Api<ConfigMap> = Api::namespaced(admin_client.clone(), namespace);
        api.create(&pp, &configmap(&name))
            .await
            .unwrap_or_else(|e| panic!("a non-participant's write in {namespace}: {e}"));
    }

    // Two terms of the chart's election (taking the empty Lease over), under the chart's Role.
    let (stale, current_term) = two_terms(&client, &ns, lease).await;
    let current = current_term.fencing_token();

    // Through the fenced client (self-impersonation with the token: the chart's RBAC).
    let fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    let written = fencer
        .namespaced_with_token::<ConfigMap>(lease, current, &ns)
        .create(&pp, &configmap("current"))
        .await
        .expect("the current term's write is admitted");
    assert_eq!(
        written
            .metadata
            .annotations
            .and_then(|a| a.get("tenure.dev/fencing-token").cloned()),
        Some(current.get().to_string())
    );
    match fencer
        .namespaced_with_token::<ConfigMap>(lease, stale, &ns)
        .create(&pp, &configmap("stale"))
        .await
    {
        Err(FenceError::Stale {
            ours,
            lease: Some(l),
            ..
        }) => {
            assert_eq!(ours, stale.get());
            assert_eq!(l, format!("{ns}/{lease}"));
        }
        other => panic!("a stale term's write: {other:?}"),
    }
    // A non-participant is not fenced; the stale write did not land.
    let admin: Api<ConfigMap> = Api::namespaced(shared().admin().await, &ns);
    admin
        .create(&pp, &configmap("by-admin"))
        .await
        .expect("a non-participant is not fenced");
    assert!(admin.get_opt("stale").await.expect("read").is_none());
    current_term.release().await.expect("release");

    // A second fenced release while fx owns the anchor: the cluster keeps one anchor. With
    // fencing.policy.anchor=true it would own it too, which Helm refuses; with auto (the
    // default) it leaves the anchor to fx, and fx keeps it in its manifest on an upgrade.
    tokio::task::spawn_blocking({
        let ns = ns.clone();
        move || second_release_leaves_the_anchor_to_its_owner(release, &ns)
    })
    .await
    .expect("a second release");

    // `helm uninstall` deletes the election's policy, binding and RBAC, and leaves the Lease
    // and the anchor (policy and binding). This is the regression test of the anchor: with no
    // Lease-parameter binding left (nothing else in this test binary installs one), the test
    // apiserver (Kubernetes 1.36) stops reading Lease parameters for good
    // (kubernetes/kubernetes#130887), and the next release's policy, installed below, would
    // admit every write (tried: without `helm.sh/resource-policy: keep`, the token-less write
    // below is admitted for 30 s).
    tokio::task::spawn_blocking({
        let ns = ns.clone();
        move || {
            helm_uninstall(release, &ns).expect_ok();
            assert_eq!(installed_fencing(&ns, lease), BTreeSet::new());
            assert_eq!(
                installed_anchor(ANCHOR),
                [
                    "ValidatingAdmissionPolicy",
                    "ValidatingAdmissionPolicyBinding"
                ]
                .map(|k| (k.to_owned(), ANCHOR.to_owned()))
                .into(),
                "the anchor must outlive `helm uninstall`"
            );
            run(kubectl_cmd().args(["get", "lease", lease, "-n", &ns]), None).expect_ok();
        }
    })
    .await
    .expect("uninstall");

    // Every resource governed (the default), no impersonation RBAC from the chart.
    let fx_ns = ns.clone();
    let (ns2, kubeconfig2) = tokio::task::spawn_blocking(move || {
        let ns = restricted_namespace("fencing-all");
        helm_install(
            "all",
            &ns,
            &[
                "--set",
                "fencing.policy.enabled=true,fencing.impersonation=false",
            ],
        )
        .expect_ok();
        // The anchor fx left behind stays the cluster's one anchor, still fx's.
        assert!(
            !manifest_names("all", &ns).iter().any(|(_, n)| n == ANCHOR),
            "a release installed after the anchor's owner left renders the anchor again"
        );
        assert_eq!(anchor_owner(), Some(("fx".to_owned(), fx_ns)));
        let (kubeconfig, sa) = workload_service_account(&ns, "all-tenure");
        assert!(!can_i(
            &sa,
            &ns,
            "impersonate",
            "serviceaccounts/all-tenure",
            None
        ));
        assert!(!may_impersonate_extra(&sa, "tenure.dev/fencing-token"));
        (ns, kubeconfig)
    })
    .await
    .expect("setup without the RBAC");
    let client2 = shared().client_from(&kubeconfig2).await;
    let plain2: Api<ConfigMap> = Api::namespaced(client2.clone(), &ns2);
    let refusal = refused_without_token(&plain2, "plain").await;
    assert!(refusal.contains("missing token"), "{refusal}");
    // The API server accepted the every-resource rules, and they leave everyone else alone
    // (Pods, Secrets, ConfigMaps, in any namespace), the Lease being there from the start.
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin_client.clone(), "default");
    admin_cms
        .create(&pp, &configmap(&format!("{ns2}-admin")))
        .await
        .expect("a non-participant's write under the every-resource policy");
    let pod_from_chart = tokio::task::spawn_blocking({
        let ns2 = ns2.clone();
        move || {
            let objs = render("all", &ns2, &["--set", "fencing.policy.enabled=true"]);
            create_dry_run(&ns2, &pod_from(&objs, "all-pod"))
        }
    })
    .await
    .expect("dry run");
    assert!(
        pod_from_chart.ok,
        "the chart's own Pod is refused under its policy: {}",
        pod_from_chart.stderr
    );
    let (_, term) = two_terms(&client2, &ns2, "all-tenure").await;
    // Secrets are governed too, but not granted: RBAC refuses before admission.
    let secrets: Api<Secret> = Api::namespaced(client2.clone(), &ns2);
    match secrets.list(&Default::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{}", s.message),
        other => panic!("secrets: {other:?}"),
    }
    let fencer2 = Fencer::new(client2)
        .await
        .expect("identity")
        .lease_namespace(&ns2);
    match fencer2
        .namespaced_with_token::<ConfigMap>("all-tenure", term.fencing_token(), &ns2)
        .create(&pp, &configmap("fenced"))
        .await
    {
        // The term's fence proof (dry-run creates of the probe Lease, impersonating itself)
        // is refused for want of the RBAC: the fence is not proven, so the write fails
        // closed without being sent, naming what is missing.
        Err(FenceError::Unenforced { lease, cause }) => {
            assert_eq!(lease, format!("{ns2}/all-tenure"));
            assert!(cause.contains("cannot impersonate"), "{cause}");
        }
        other => panic!("a fenced write without the impersonation RBAC: {other:?}"),
    }
    let admin2: Api<ConfigMap> = Api::namespaced(admin_client.clone(), &ns2);
    assert!(
        admin2.get_opt("fenced").await.expect("read").is_none(),
        "the unproven write was sent"
    );
    term.release().await.expect("release");
}

// ---------------------------------------------------------------------------------------------
// Sharded workers (`sharding.shards`): `tenure run --shards N`.

/// The Role's rules, as rendered.
fn role_rules(objs: &[Value]) -> Value {
    one(objs, "Role")["rules"].clone()
}

/// `sharding.shards` passes `--shards`, and the Role grants what membership needs (member
/// Leases named after pods: no resourceNames; `delete` for a graceful leave); unset, nothing
/// changes; bad counts and combinations are refused with a clear message.
#[test]
fn sharding_renders_the_shard_count_and_its_role() {
    let worker_args =
        |objs: &[Value]| strings(&container(&pod_spec(objs)["containers"], "worker")["args"]);
    let plain = render("sh", "ns", &[]);
    assert!(
        !worker_args(&plain)
            .iter()
            .any(|a| a.starts_with("--shards")),
        "{:?}",
        worker_args(&plain)
    );
    let sharded = render("sh", "ns", &["--set", "sharding.shards=16"]);
    let args = worker_args(&sharded);
    assert!(args.contains(&"--shards=16".to_owned()), "{args:?}");
    let dashes = args.iter().position(|a| a == "--").expect("--");
    assert!(
        args.iter().position(|a| a == "--shards=16") < Some(dashes),
        "{args:?}"
    );
    // A sharded replica restarts fast too: one restart lock for all its shards.
    assert!(
        args.contains(&"--restart-dir=/run/tenure-restart".to_owned()),
        "{args:?}"
    );
    assert!(volume(pod_spec(&sharded), "tenure-restart").is_some());
    let off = render("sh", "ns", &["--set", "election.fastRestart=false"]);
    assert!(
        !worker_args(&off)
            .iter()
            .any(|a| a.starts_with("--restart-dir")),
        "{:?}",
        worker_args(&off)
    );
    assert_eq!(
        role_rules(&sharded),
        json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["get", "list", "watch", "update", "patch", "create", "delete"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ])
    );
    // A values file's number (a float to helm) renders as an integer.
    let file = kube_support::fresh_dir("sharding-values").join("values.yaml");
    std::fs::write(&file, "sharding:\n  shards: 4096\n").expect("values file");
    let args = worker_args(&render("sh", "ns", &["-f", &file.display().to_string()]));
    assert!(args.contains(&"--shards=4096".to_owned()), "{args:?}");
    // Redis: still no Kubernetes API use.
    let redis = render(
        "sh",
        "ns",
        &[
            "--set",
            "sharding.shards=4,backend.type=redis,backend.redis.url=redis://redis:6379",
        ],
    );
    assert!(!kinds(&redis).contains("Role"), "{:?}", kinds(&redis));
    assert!(worker_args(&redis).contains(&"--shards=4".to_owned()));
    // A sharded group publishes to its Election: each shard's holder and token.
    let published = worker_args(&render(
        "sh",
        "ns",
        &["--set", "sharding.shards=4,election.publishStatus=true"],
    ));
    assert!(
        published.contains(&"--shards=4".to_owned())
            && published.contains(&"--publish-status".to_owned()),
        "{published:?}"
    );

    let schema = "values don't meet the specifications of the schema(s)";
    let long = "l".repeat(230);
    let long = format!("sharding.shards=2,election.lease={long}");
    assert_refused(&[
        (
            &["--set", "sharding.shards=0"],
            &[schema, "at '/sharding/shards': minimum: got 0, want 1"],
        ),
        (
            &["--set", "sharding.shards=4097"],
            &[
                schema,
                "at '/sharding/shards': maximum: got 4,097, want 4,096",
            ],
        ),
        (
            &["--set", "sharding.shards=2.5"],
            &[schema, "/sharding/shards"],
        ),
        (
            &["--set", "sharding.shards=many"],
            &[schema, "/sharding/shards"],
        ),
        (
            &["--set", "sharding.shard=4"],
            &[schema, "additional properties 'shard' not allowed"],
        ),
        (
            &[
                "--set",
                &format!(
                    "sharding.shards=4,fencing.policy.enabled=true,election.lease={}",
                    "l".repeat(64)
                ),
            ],
            &[
                "with sharding.shards and fencing.policy the lease name may have at most 63 characters",
                "tenure.dev/shard-group",
            ],
        ),
        (
            &["--set", &long],
            &["with sharding.shards the lease name may have at most 229 characters"],
        ),
    ]);
}

/// `sharding.shards` with `fencing.policy.enabled`: the group's one policy and binding, the
/// objects `tenure policy --shards N` prints (names and specs, compared as JSON), whatever the
/// count; no Lease (each shard Lease is created, labelled, by its first grant); each shard's
/// copy fenced (`--fence` with `--shards`); the impersonation RBAC as for one election.
#[test]
fn sharded_fencing_renders_the_groups_one_policy_as_tenure_policy_prints_it() {
    let printed = |shards: &str| -> Vec<Value> {
        let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(["policy", "--lease", "sh-tenure", "--namespace", "ns"])
            .args(["--service-account", "sh-tenure", "--shards", shards])
            .output()
            .expect("tenure policy");
        assert!(out.status.success(), "{out:?}");
        objects(&String::from_utf8_lossy(&out.stdout))
    };
    for shards in ["4", "16"] {
        let objs = render(
            "sh",
            "ns",
            &[
                "--set",
                &format!("sharding.shards={shards},fencing.policy.enabled=true"),
            ],
        );
        let policy = FencingPolicy::new("ns", "sh-tenure")
            .and_then(|p| p.service_account("ns", "sh-tenure"))
            .and_then(|p| p.shards(shards.parse().expect("count")))
            .expect("valid policy");
        assert_eq!(policy.name(), "tenure-fencing.ns.sh-tenure");
        assert_generators_policy(&objs, &policy, &format!("{shards} shards"));
        // What `tenure policy --shards` prints: the same objects, by name and spec.
        let cli = printed(shards);
        for kind in [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ] {
            let chart = named(&objs, kind, &policy.name());
            let printed = named(&cli, kind, &policy.name());
            assert_eq!(
                chart["spec"], printed["spec"],
                "{shards} shards: the chart's {kind} is not what tenure policy prints"
            );
        }
        assert!(
            !cli.iter().any(|o| o["kind"] == "Lease"),
            "tenure policy --shards prints no Lease either"
        );
        let binding = named(&objs, "ValidatingAdmissionPolicyBinding", &policy.name());
        assert_eq!(
            binding["spec"]["paramRef"],
            json!({"namespace": "ns", "parameterNotFoundAction": "Allow",
                   "selector": {"matchLabels": {"tenure.dev/shard-group": "sh-tenure"}}})
        );
        assert!(
            !kinds(&objs).contains("Lease"),
            "no Lease for a sharded group: {:?}",
            kinds(&objs)
        );
        let (flags, _) = worker_flags(&objs);
        assert!(
            flags.contains(&"--fence".to_owned()) && flags.contains(&format!("--shards={shards}")),
            "{flags:?}"
        );
        // The Role as for sharding, plus the self-impersonation of a fenced client.
        let rules = role_rules(&objs);
        assert!(
            rules
                .as_array()
                .expect("rules")
                .contains(&self_impersonation("sh-tenure")),
            "{rules}"
        );
        assert_generators_anchor(&objs, "sharded");
        // What `tenure policy --shards` prints: the same anchor, by name and spec.
        for kind in [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ] {
            assert_eq!(
                named(&objs, kind, ANCHOR)["spec"],
                named(&cli, kind, ANCHOR)["spec"],
                "{shards} shards: the chart's anchor {kind} is not what tenure policy prints"
            );
        }
    }
    // Without sharding, the single election's policy and its Lease, as before.
    let single = render("sh", "ns", &["--set", "fencing.policy.enabled=true"]);
    assert!(kinds(&single).contains("Lease"));
    let binding = named(
        &single,
        "ValidatingAdmissionPolicyBinding",
        "tenure-fencing.ns.sh-tenure",
    );
    assert_eq!(binding["spec"]["paramRef"]["name"], "sh-tenure");
}

/// The kind, namespace and name of an object.
fn key(o: &Value) -> (String, String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&o["kind"]),
        text(&o["metadata"]["namespace"]),
        text(&o["metadata"]["name"]),
    )
}

/// The election's objects in a render: the fencing kinds, and the worker Role and RoleBinding
/// `tenure-worker.<lease>` (the release's own Role `<fullname>` is the workload's, not the
/// election's).
fn elections_objects(objs: &[Value]) -> Vec<&Value> {
    objs.iter()
        .filter(|o| {
            let (kind, _, name) = key(o);
            FENCING_KINDS.contains(&kind.as_str())
                || (["Role", "RoleBinding"].contains(&kind.as_str())
                    && name.starts_with("tenure-worker."))
        })
        .collect()
}

/// Asserts that the chart's render `objs` and `tenure policy ARGS`'s output are the same
/// objects: the same kinds, namespaces and names (but `only_printed`, which `tenure policy`
/// prints and the chart does not render), and the same content — every field but metadata
/// (specs, rules, roleRefs, subjects) equal as JSON, and `tenure policy`'s labels on the
/// chart's object (but `app.kubernetes.io/managed-by`, Helm's).
fn assert_chart_is_tenure_policy(
    objs: &[Value],
    args: &[&str],
    only_printed: &[(&str, &str, &str)],
    what: &str,
) {
    let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .arg("policy")
        .args(args)
        .output()
        .expect("tenure policy");
    assert!(out.status.success(), "{what}: {out:?}");
    let printed = objects(&String::from_utf8_lossy(&out.stdout));
    let chart = elections_objects(objs);
    let chart_keys: BTreeSet<_> = chart.iter().map(|o| key(o)).collect();
    let printed_keys: BTreeSet<_> = printed.iter().map(key).collect();
    let only_printed: BTreeSet<_> = only_printed
        .iter()
        .map(|(k, ns, n)| ((*k).to_owned(), (*ns).to_owned(), (*n).to_owned()))
        .collect();
    assert_eq!(
        chart_keys,
        printed_keys.difference(&only_printed).cloned().collect(),
        "{what}: the chart renders other objects than tenure policy prints"
    );
    assert!(only_printed.is_subset(&printed_keys), "{what}");
    for rendered in chart {
        let (kind, _, name) = key(rendered);
        let generated = printed
            .iter()
            .find(|o| key(o) == key(rendered))
            .expect("same keys");
        let content = |o: &Value| -> Value {
            let mut o = o.clone();
            let map = o.as_object_mut().expect("an object");
            map.remove("metadata");
            o
        };
        assert_eq!(
            content(rendered),
            content(generated),
            "{what}: the chart's {kind} {name} is not what tenure policy prints"
        );
        let labels = &rendered["metadata"]["labels"];
        for (k, v) in generated["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flatten()
        {
            if k != "app.kubernetes.io/managed-by" {
                assert_eq!(&labels[k], v, "{what}: {kind} {name} label {k}");
            }
        }
    }
}

/// Every object of a fenced election, the chart's and `tenure policy`'s alike (#44): the
/// anchor, the Lease, the policy and its binding, the worker Role and RoleBinding, the token
/// extra's ClusterRole and ClusterRoleBinding — the same names and the same content, for one
/// election, a sharded group, and more participants (whose other namespaces' Roles `tenure
/// policy` prints and the chart does not render).
#[test]
fn every_fencing_object_is_what_tenure_policy_prints() {
    let objs = render("demo", "apps", &["--set", "fencing.policy.enabled=true"]);
    let sa = ["--service-account", "demo-tenure"];
    let election = ["--lease", "demo-tenure", "--namespace", "apps"];
    assert_chart_is_tenure_policy(&objs, &[&election[..], &sa].concat(), &[], "defaults");
    let names: BTreeSet<_> = elections_objects(&objs).into_iter().map(key).collect();
    let expected: BTreeSet<_> = [
        ("ValidatingAdmissionPolicy", "", ANCHOR),
        ("ValidatingAdmissionPolicyBinding", "", ANCHOR),
        ("Lease", "apps", "demo-tenure"),
        (
            "ValidatingAdmissionPolicy",
            "",
            "tenure-fencing.apps.demo-tenure",
        ),
        (
            "ValidatingAdmissionPolicyBinding",
            "",
            "tenure-fencing.apps.demo-tenure",
        ),
        ("Role", "apps", "tenure-worker.demo-tenure"),
        ("RoleBinding", "apps", "tenure-worker.demo-tenure"),
        ("ClusterRole", "", "tenure-fencing.apps.demo-tenure"),
        ("ClusterRoleBinding", "", "tenure-fencing.apps.demo-tenure"),
    ]
    .into_iter()
    .map(|(k, ns, n)| (k.to_owned(), ns.to_owned(), n.to_owned()))
    .collect();
    assert_eq!(names, expected, "every object, by its name");

    for shards in ["4", "16"] {
        let objs = render(
            "demo",
            "apps",
            &[
                "--set",
                &format!("sharding.shards={shards},fencing.policy.enabled=true"),
            ],
        );
        assert_chart_is_tenure_policy(
            &objs,
            &[&election[..], &sa, &["--shards", shards]].concat(),
            &[],
            &format!("{shards} shards"),
        );
    }

    // More participants, governed resources, a named lease and ServiceAccount.
    let objs = render(
        "r",
        "ops",
        &[
            "--set",
            "fencing.policy.enabled=true,election.lease=reports.controller,serviceAccount.name=reporter",
            "--set-json",
            r#"fencing.policy.resources=["configmaps","deployments.apps"]"#,
            "--set-json",
            r#"fencing.policy.extraServiceAccounts=[{"name":"helper"},{"name":"auditor","namespace":"audit"}]"#,
            "--set-json",
            r#"fencing.policy.extraUsers=["alice@example.com"]"#,
        ],
    );
    assert_chart_is_tenure_policy(
        &objs,
        &[
            "--lease",
            "reports.controller",
            "--namespace",
            "ops",
            "--service-account",
            "reporter",
            "--service-account",
            "helper",
            "--service-account",
            "audit/auditor",
            "--user",
            "alice@example.com",
            "--resource",
            "configmaps",
            "--resource",
            "deployments.apps",
        ],
        &[
            ("Role", "audit", "tenure-worker.reports.controller"),
            ("RoleBinding", "audit", "tenure-worker.reports.controller"),
        ],
        "more participants",
    );
}

/// With `sharding.shards`, the ServiceAccount may do exactly what sharded membership needs on
/// the Kubernetes backend, in its namespace only.
#[test]
fn the_service_account_can_do_exactly_what_sharding_needs() {
    let ns = restricted_namespace("rbac-shards");
    helm_install("sh", &ns, &["--set", "sharding.shards=4"]).expect_ok();
    let sa = format!("system:serviceaccount:{ns}:sh-tenure");
    wait_allowed(
        &sa,
        &ns,
        "delete",
        "leases/sh-tenure-member-0123456789abcdef",
    );
    assert_eq!(
        granted(&ns, "sh-tenure"),
        [
            rule("events", "", "create"),
            rule(
                "leases.coordination.k8s.io",
                "",
                "get list watch update patch create delete"
            ),
        ]
        .into()
    );
    // A member's heartbeat is one server-side apply of its member Lease.
    assert!(
        can_i(
            &sa,
            &ns,
            "patch",
            "leases/sh-tenure-member-0123456789abcdef",
            None
        ),
        "may not patch its member Lease"
    );
    for (verb, resource) in [
        ("deletecollection", "leases"),
        ("get", "secrets"),
        ("list", "pods"),
    ] {
        assert!(
            !can_i(&sa, &ns, verb, resource, None),
            "may {verb} {resource}"
        );
    }
    for verb in ["get", "delete", "create"] {
        assert!(
            !can_i(&sa, "default", verb, "leases", None),
            "{verb} in default"
        );
    }
    assert!(!can_i(&sa, ALL, "list", "leases", None));
}

/// The sharded Deployment's command line, run as it would be in two pods: the real `tenure`
/// binary with exactly the chart's arguments, authenticated as the chart's ServiceAccount
/// (only its Role), splits the shards between the two, runs one copy per shard with the
/// documented environment, and on SIGTERM leaves: every shard Lease released, every member
/// Lease deleted.
#[cfg(feature = "cli")]
#[test]
fn the_rendered_sharded_command_line_runs_the_real_tenure() {
    let ns = restricted_namespace("cli-shards");
    let dir = kube_support::fresh_dir("cli-shards");
    let log = dir.join("log");
    let script = format!(
        "echo \"$TENURE_SHARD $TENURE_SHARDS $TENURE_LEASE $TENURE_FENCING_TOKEN $TENURE_IDENTITY\" >> {}; exec sleep 60",
        log.display()
    );
    let values = [
        "--set".to_owned(),
        "sharding.shards=4,metrics.host=127.0.0.1".to_owned(),
        "--set-json".to_owned(),
        format!("command={}", json!(["sh", "-c", script])),
    ];
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    helm_install("cs", &ns, &values).expect_ok();
    let sa = format!("system:serviceaccount:{ns}:cs-tenure");
    wait_allowed(
        &sa,
        &ns,
        "delete",
        "leases/cs-tenure-member-0123456789abcdef",
    );
    let token = run(
        kubectl_cmd().args(["create", "token", "cs-tenure", "-n", &ns, "--duration=10m"]),
        None,
    )
    .expect_ok();
    let kubeconfig = kubeconfig_with_token(token.trim());
    let objs = render("cs", &ns, &values);
    let worker = container(&pod_spec(&objs)["containers"], "worker");
    let start = |pod: &str| {
        let port = kube_support::free_port();
        let args: Vec<String> = strings(&worker["args"])
            .into_iter()
            .map(|a| {
                let a = a
                    .replace("$(POD_NAMESPACE)", &ns)
                    .replace("$(POD_NAME)", pod);
                if a.starts_with("--listen=") {
                    format!("--listen=127.0.0.1:{port}")
                } else {
                    a
                }
            })
            .collect();
        Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", pod)
            .env("POD_NAMESPACE", &ns)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("TENURE_BACKEND")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{pod}.err"))).expect("stderr file"))
            .spawn()
            .expect("spawn tenure")
    };
    let mut a = start("cs-pod-a");
    let mut b = start("cs-pod-b");
    let stderr =
        |pod: &str| std::fs::read_to_string(dir.join(format!("{pod}.err"))).unwrap_or_default();
    // Each line: shard, count, lease, token, identity. Split 2 + 2 once both have joined.
    let latest = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let mut by_shard = std::collections::BTreeMap::new();
        for line in text.lines() {
            let f: Vec<String> = line.split(' ').map(str::to_owned).collect();
            assert_eq!(f.len(), 5, "{line:?}");
            by_shard.insert(f[0].clone(), f);
        }
        by_shard
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let shards = latest();
        let on_a = shards.values().filter(|f| f[4] == "cs-pod-a").count();
        if shards.len() == 4 && on_a == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no 2 + 2 split: {shards:?}\n{}\n{}",
            stderr("cs-pod-a"),
            stderr("cs-pod-b")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for (shard, f) in latest() {
        assert_eq!(
            f[1..3],
            ["4".to_owned(), format!("cs-tenure-{shard}")],
            "{f:?}"
        );
        assert!(f[3].parse::<u64>().is_ok_and(|t| t > 0), "{f:?}");
    }
    let members = |label: &str| {
        run(
            kubectl_cmd().args(["get", "leases", "-n", &ns, "-l", label, "-o", "name"]),
            None,
        )
        .expect_ok()
    };
    assert_eq!(
        members("tenure.dev/group=cs-tenure").lines().count(),
        2,
        "one member Lease per replica"
    );
    for child in [&a, &b] {
        let pid = libc::pid_t::try_from(child.id()).expect("pid");
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    }
    for (pod, child) in [("cs-pod-a", &mut a), ("cs-pod-b", &mut b)] {
        let status = child.wait().expect("wait for tenure");
        assert_eq!(status.code(), Some(0), "{pod}: {}", stderr(pod));
    }
    // Graceful leave: member Leases deleted (the Role's `delete`), shard Leases released.
    assert_eq!(
        members("tenure.dev/group=cs-tenure").trim(),
        "",
        "member Leases left"
    );
    for shard in 0..4 {
        let lease = run(
            kubectl_cmd().args([
                "get",
                "lease",
                &format!("cs-tenure-{shard}"),
                "-n",
                &ns,
                "-o",
                "json",
            ]),
            None,
        )
        .expect_ok();
        let lease: Value = serde_json::from_str(&lease).expect("lease json");
        assert_eq!(
            lease["spec"]["holderIdentity"].as_str().unwrap_or_default(),
            "",
            "shard {shard} not released: {lease}"
        );
    }
}

/// `helm uninstall`'s pre-delete hook: `tenure drain` of this release's Deployment, with a
/// ServiceAccount that may get and delete that Deployment and nothing else, admitted under
/// Pod Security "restricted"; rendered only where the pods need the API and the chart owns
/// their ServiceAccount or RBAC.
#[test]
fn the_uninstall_hook_drains_the_deployment_with_only_that_permission() {
    let pre_delete = |args: &[&str]| hooks_of(render_hooks("demo", "apps", args), "pre-delete");
    let hooks = pre_delete(&[]);
    assert_eq!(
        names(&hooks),
        ["Job", "Role", "RoleBinding", "ServiceAccount"]
            .map(|k| (k.to_owned(), "demo-tenure-drain".to_owned()))
            .into()
    );
    for h in &hooks {
        let a = &h["metadata"]["annotations"];
        assert_eq!(a["helm.sh/hook"], "pre-delete", "{h}");
        assert_eq!(
            a["helm.sh/hook-delete-policy"], "before-hook-creation,hook-succeeded",
            "{h}"
        );
    }
    // The Job runs after its permissions exist.
    let weight = |kind: &str| {
        one(&hooks, kind)["metadata"]["annotations"]["helm.sh/hook-weight"]
            .as_str()
            .unwrap_or_default()
            .parse::<i32>()
            .unwrap_or_else(|e| panic!("{kind}: {e}"))
    };
    assert!(weight("Role") < weight("Job") && weight("ServiceAccount") < weight("Job"));
    assert_eq!(
        one(&hooks, "Role")["rules"],
        json!([{"apiGroups": ["apps"], "resources": ["deployments"],
                "resourceNames": ["demo-tenure"], "verbs": ["get", "delete"]}])
    );
    let job = one(&hooks, "Job");
    let spec = &job["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], "demo-tenure-drain");
    assert_restricted(spec);
    let c = container(&spec["containers"], "drain");
    assert_eq!(c["image"], "tenure:0.1.0");
    assert_eq!(
        strings(&c["command"])
            .into_iter()
            .chain(strings(&c["args"]))
            .collect::<Vec<_>>(),
        [
            "/usr/local/bin/tenure",
            "drain",
            "--deployment=demo-tenure",
            "--namespace=apps",
            // The pods' grace period (5 s + 10 s) and a minute.
            "--timeout=75s"
        ]
    );
    // The hook's pod is not one of the Deployment's (selector) nor in its PDB.
    let objs = render("demo", "apps", &[]);
    let selector = &one(&objs, "Deployment")["spec"]["selector"]["matchLabels"];
    let labels = &job["spec"]["template"]["metadata"]["labels"];
    let selected = selector
        .as_object()
        .is_some_and(|m| m.iter().all(|(k, v)| &labels[k] == v));
    assert!(
        !selected,
        "{labels} matches the Deployment's selector {selector}"
    );
    // tenure already in the workload image: the hook runs it from there.
    let hooks = pre_delete(&["--set", "tenure.inject=false"]);
    let c = container(
        &one(&hooks, "Job")["spec"]["template"]["spec"]["containers"],
        "drain",
    );
    assert_eq!(c["image"], "busybox:1.37");
    assert_eq!(strings(&c["command"]), ["tenure"]);

    // Not rendered: turned off; the pods do not use the API (Redis without the status
    // publisher); the chart creates neither their ServiceAccount nor their RBAC.
    for args in [
        &["--set", "uninstallHook.enabled=false"][..],
        &[
            "--set",
            "backend.type=redis",
            "--set",
            "backend.redis.url=redis://r:6379",
        ][..],
        &[
            "--set",
            "rbac.create=false",
            "--set",
            "serviceAccount.create=false",
        ][..],
    ] {
        assert!(pre_delete(args).is_empty(), "{args:?}");
    }

    // On the real apiserver: the Job is admitted under "restricted", and the ServiceAccount
    // may get and delete this Deployment only.
    let ns = restricted_namespace("drain-hook");
    let hooks = hooks_of(render_hooks("demo", &ns, &[]), "pre-delete");
    let r = create_dry_run(&ns, one(&hooks, "Job"));
    assert!(
        r.ok && !r.stderr.contains("PodSecurity"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    for kind in ["ServiceAccount", "Role", "RoleBinding"] {
        apply(&one(&hooks, kind).to_string());
    }
    let sa = format!("system:serviceaccount:{ns}:demo-tenure-drain");
    wait_allowed(&sa, &ns, "delete", "deployments.apps/demo-tenure");
    assert!(can_i(&sa, &ns, "get", "deployments.apps/demo-tenure", None));
    for (verb, resource) in [
        ("delete", "deployments.apps/other"),
        ("patch", "deployments.apps/demo-tenure"),
        ("update", "deployments.apps/demo-tenure"),
        ("list", "deployments.apps"),
        ("delete", "pods"),
        ("get", "leases/demo-tenure"),
    ] {
        assert!(
            !can_i(&sa, &ns, verb, resource, None),
            "may {verb} {resource}"
        );
    }
    assert_eq!(
        granted(&ns, "demo-tenure-drain"),
        [rule("deployments.apps", "demo-tenure", "get delete")].into()
    );
}

/// `rbac.extraRules`: the workload's own API access, added to the chart's Role; with any, the
/// ServiceAccount token is mounted even on the Redis backend (where tenure needs none). A rule
/// without its required fields is refused by the schema, naming them.
#[test]
fn extra_rules_extend_the_role_and_mount_the_token() {
    let rule = json!({"apiGroups": [""], "resources": ["configmaps"],
                      "verbs": ["get", "list", "watch", "patch"]});
    let extra = format!("rbac.extraRules=[{rule}]");
    let objs = render("demo", "apps", &["--set-json", &extra]);
    let rules = one(&objs, "Role")["rules"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(rules.last(), Some(&rule), "{rules:?}");
    assert_eq!(
        rules.len(),
        4,
        "the elector's three rules and the extra one: {rules:?}"
    );

    let redis = [
        "--set",
        "backend.type=redis",
        "--set",
        "backend.redis.url=redis://r:6379",
    ];
    let plain = render("demo", "apps", &redis);
    assert!(!kinds(&plain).contains("Role"), "no Role for Redis alone");
    assert_eq!(pod_spec(&plain)["automountServiceAccountToken"], false);
    let mut args = redis.to_vec();
    args.extend(["--set-json", &extra]);
    let objs = render("demo", "apps", &args);
    assert_eq!(one(&objs, "Role")["rules"], json!([rule]));
    assert_eq!(pod_spec(&objs)["automountServiceAccountToken"], true);
    assert_eq!(
        one(&objs, "ServiceAccount")["automountServiceAccountToken"],
        true
    );

    let e = template(
        "demo",
        "apps",
        &[
            "--set-json",
            r#"rbac.extraRules=[{"resources":["configmaps"]}]"#,
        ],
    )
    .expect_err("a rule without apiGroups and verbs");
    assert!(
        e.contains("extraRules") && e.contains("apiGroups") && e.contains("verbs"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// Offline: the alerts (metrics.prometheusRule), run by promtool.

/// `promtool` (Debian's `prometheus` package; `scripts/test.sh` installs it).
fn promtool() -> &'static str {
    let found = Command::new("promtool").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "promtool is missing: apt-get install prometheus (scripts/test.sh does)"
    );
    "promtool"
}

/// The rendered PrometheusRule's groups as a Prometheus rules file (JSON is YAML).
fn rules_file(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let objs = render("r", "jobs", args);
    let rule = one(&objs, "PrometheusRule");
    let path = dir.join(format!("{name}.rules.yaml"));
    let file = json!({ "groups": rule["spec"]["groups"] });
    std::fs::write(&path, file.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let out = run(
        Command::new(promtool())
            .arg("check")
            .arg("rules")
            .arg(&path),
        None,
    );
    assert!(
        out.ok,
        "promtool check rules {name}: {}{}",
        out.stdout, out.stderr
    );
    path
}

/// Runs `promtool test rules` on one test of `rules` and returns its output (asserting success).
/// An expected alert written as `{"fires": SEVERITY, "value": V}` becomes the alert with that
/// severity and the rule's own annotations, `{{ $value }}` read as V.
fn promtool_test(dir: &Path, rules: &Path, name: &str, test: &Value) -> String {
    let groups: Value =
        serde_json::from_str(&std::fs::read_to_string(rules).unwrap_or_else(|e| panic!("{e}")))
            .expect("rules JSON");
    let mut test = test.clone();
    for case in test["alert_rule_test"].as_array_mut().expect("cases") {
        let alert = case["alertname"].as_str().expect("alertname").to_owned();
        let Some(fires) = case.get("fires").cloned() else {
            continue;
        };
        let rule = groups["groups"][0]["rules"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["alert"] == alert.as_str()))
            .unwrap_or_else(|| panic!("no alert {alert} in {groups}"));
        let value = case["value"].as_str().unwrap_or_default().to_owned();
        let annotations: serde_json::Map<String, Value> = rule["annotations"]
            .as_object()
            .expect("annotations")
            .iter()
            .map(|(k, v)| {
                let text = v.as_str().expect("text").replace("{{ $value }}", &value);
                (k.clone(), Value::String(text))
            })
            .collect();
        let case = case.as_object_mut().expect("case");
        case.remove("fires");
        case.remove("value");
        case.insert(
            "exp_alerts".into(),
            json!([{"exp_labels": {"severity": fires}, "exp_annotations": annotations}]),
        );
    }
    let test = &test;
    let path = dir.join(format!("{name}.test.yaml"));
    let file = json!({
        "rule_files": [rules.display().to_string()],
        "evaluation_interval": "10s",
        "tests": [test],
    });
    std::fs::write(&path, file.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let out = run(
        Command::new(promtool()).arg("test").arg("rules").arg(&path),
        None,
    );
    assert!(
        out.ok,
        "promtool test rules {name}:\n{}{}",
        out.stdout, out.stderr
    );
    out.stdout
}

/// Each alert fires on the series a failing release would export (the metric names of
/// `tenure run --listen`; `tests/kube_fence_workers.rs` checks each against a live scrape) and
/// stays silent before its bound. `for` of TenureNoLeader: 2 × 15 s + 2 s + 30 s = 62 s.
#[test]
fn the_alerts_fire_on_a_failing_release_and_not_before_their_bounds() {
    let dir = kube_support::fresh_dir("alerts");
    let single = rules_file(
        &dir,
        "single",
        &[
            "-f",
            &ci("monitoring-values.yaml"),
            "--set",
            "fencing.policy.enabled=true",
        ],
    );
    let sel = r#"namespace="jobs",job="r-tenure-metrics""#;
    let out = promtool_test(
        &dir,
        &single,
        "single",
        &json!({
            "interval": "10s",
            "input_series": [
                // pod a leads until 30 s, then nobody does.
                {"series": format!("leader_election_master_status{{{sel},pod=\"a\",name=\"r-tenure\"}}"), "values": "1 1 1 0x40"},
                {"series": format!("leader_election_master_status{{{sel},pod=\"b\",name=\"r-tenure\"}}"), "values": "0x43"},
                // One term lost at 60 s.
                {"series": format!("tenure_terms_lost_total{{{sel},pod=\"a\",name=\"r-tenure\"}}"), "values": "0x5 1x37"},
                // A new term every 10 s.
                {"series": format!("tenure_leader_transitions_total{{{sel},pod=\"b\",name=\"r-tenure\"}}"), "values": "0+1x43"},
                // The fence stops being enforced at 100 s.
                {"series": format!("tenure_fence_enforced{{{sel},pod=\"a\",name=\"r-tenure\"}}"), "values": "1x9 0x33"},
            ],
            "alert_rule_test": [
                {"eval_time": "80s", "alertname": "TenureNoLeader", "exp_alerts": []},
                {"eval_time": "100s", "alertname": "TenureNoLeader", "fires": "critical"},
                {"eval_time": "50s", "alertname": "TenureTermsLost", "exp_alerts": []},
                {"eval_time": "70s", "alertname": "TenureTermsLost", "fires": "warning", "value": "1"},
                {"eval_time": "40s", "alertname": "TenureLeadershipFlapping", "exp_alerts": []},
                {"eval_time": "300s", "alertname": "TenureLeadershipFlapping", "fires": "warning", "value": "30"},
                {"eval_time": "150s", "alertname": "TenureFenceNotEnforced", "exp_alerts": []},
                {"eval_time": "170s", "alertname": "TenureFenceNotEnforced", "fires": "critical"},
            ],
        }),
    );
    assert!(out.contains("SUCCESS"), "{out}");

    // Unfenced: no fence alert at all.
    let unfenced = render("r", "jobs", &["-f", &ci("monitoring-values.yaml")]);
    let text = one(&unfenced, "PrometheusRule").to_string();
    assert!(!text.contains("TenureFenceNotEnforced"), "{text}");

    // Sharded: 4 shards over pods a and b; b drops a shard at 30 s (no one runs it), then a
    // holds 3 and b 1 from 150 s (unbalanced); a shard term is lost at 60 s.
    let sharded = rules_file(
        &dir,
        "sharded",
        &[
            "-f",
            &ci("monitoring-values.yaml"),
            "--set",
            "sharding.shards=4",
        ],
    );
    let out = promtool_test(
        &dir,
        &sharded,
        "sharded",
        &json!({
            "interval": "10s",
            "input_series": [
                {"series": format!("tenure_shards{{{sel},pod=\"a\"}}"), "values": "4x200"},
                {"series": format!("tenure_shards{{{sel},pod=\"b\"}}"), "values": "4x200"},
                {"series": format!("tenure_shards_owned{{{sel},pod=\"a\"}}"), "values": "2x14 3x185"},
                {"series": format!("tenure_shards_owned{{{sel},pod=\"b\"}}"), "values": "2 2 2 1x197"},
                {"series": format!("tenure_shard_terms_lost_total{{{sel},pod=\"b\"}}"), "values": "0x5 1x194"},
            ],
            "alert_rule_test": [
                {"eval_time": "80s", "alertname": "TenureNoLeader", "exp_alerts": []},
                {"eval_time": "110s", "alertname": "TenureNoLeader", "fires": "critical", "value": "1"},
                // 3 + 1 = 4 from 150 s: every shard runs again.
                {"eval_time": "200s", "alertname": "TenureNoLeader", "exp_alerts": []},
                {"eval_time": "1000s", "alertname": "TenureShardsUnbalanced", "exp_alerts": []},
                {"eval_time": "1100s", "alertname": "TenureShardsUnbalanced", "fires": "warning", "value": "2"},
                {"eval_time": "70s", "alertname": "TenureTermsLost", "fires": "warning", "value": "1"},
            ],
        }),
    );
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The metric names the chart's alerts and dashboard query (`tests/kube_fence_workers.rs`
/// checks each against a live scrape of `tenure run --listen`).
#[test]
fn the_dashboard_renders_for_the_release_and_queries_its_series() {
    let objs = render(
        "r",
        "jobs",
        &[
            "-f",
            &ci("monitoring-values.yaml"),
            "--set",
            "metrics.dashboard.labels.team=ops",
        ],
    );
    let cm = objs
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "r-tenure-dashboard")
        .unwrap_or_else(|| panic!("the dashboard ConfigMap in {:?}", kinds(&objs)));
    assert_eq!(cm["metadata"]["labels"]["team"], "ops");
    let dash: Value = serde_json::from_str(cm["data"]["tenure.json"].as_str().expect("json"))
        .expect("the dashboard is JSON");
    assert_eq!(dash["title"], "tenure: jobs/r-tenure");
    let vars = &dash["templating"]["list"];
    let var = |name: &str| {
        vars.as_array()
            .and_then(|l| l.iter().find(|v| v["name"] == name))
            .map(|v| v["query"].clone())
    };
    assert_eq!(var("namespace"), Some(json!("jobs")));
    assert_eq!(var("job"), Some(json!("r-tenure-metrics")));
    let exprs: Vec<&str> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .collect();
    assert!(exprs.len() >= 8, "{exprs:?}");
    for expr in exprs {
        assert!(
            expr.contains(r#"namespace="$namespace",job="$job""#),
            "every query is of this release's series: {expr}"
        );
    }
    // Off by default.
    let plain = render("r", "jobs", &[]);
    assert!(
        !kinds(&plain).contains("PrometheusRule")
            && !plain
                .iter()
                .any(|o| o["metadata"]["name"] == "r-tenure-dashboard"),
        "{:?}",
        kinds(&plain)
    );
}

/// `helm package` makes the chart's archive (what a chart repository serves), and the
/// chart's `kubeVersion` range is enforced: a cluster below it is refused by name, the one
/// the suites run (1.36) is accepted.
#[test]
fn the_chart_packages_and_holds_to_its_kube_version_range() {
    let dir = kube_support::fresh_dir("helm-package");
    let out = run(
        helm_cmd()
            .arg("package")
            .arg(chart())
            .arg("--destination")
            .arg(&dir),
        None,
    )
    .expect_ok();
    let archive = dir.join("tenure-0.1.0.tgz");
    assert!(archive.is_file(), "{out}");
    // The archive renders as the directory does.
    let from_archive = run(
        helm_cmd()
            .args(["template", "r"])
            .arg(&archive)
            .args(["--namespace", "jobs"]),
        None,
    )
    .expect_ok();
    let from_dir = template("r", "jobs", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(from_archive, from_dir);
    let old = template("r", "jobs", &["--kube-version", "1.24.0"]);
    let err = old.expect_err("a 1.24 cluster is below the chart's kubeVersion");
    assert!(err.contains("kubeVersion"), "{err}");
    template("r", "jobs", &["--kube-version", "1.36.0"])
        .unwrap_or_else(|e| panic!("1.36 is in range: {e}"));
}

/// `helm test`: a Pod runs `tenure status --require-leader` against the release's Lease (every
/// shard's when sharded) with a ServiceAccount that may only get those Leases; admitted under
/// "restricted"; not rendered where the release holds no Lease of its own (Redis, a CronJob)
/// or the chart creates no RBAC. On the real apiserver, the Pod's own command with a token of
/// that ServiceAccount exits 10 while nobody holds the Lease and 0 once someone does.
#[test]
fn the_helm_test_checks_the_release_leads_with_only_get_on_its_leases() {
    let tests = hooks_of(render_hooks("demo", "apps", &[]), "test");
    assert_eq!(
        names(&tests),
        ["Pod", "Role", "RoleBinding", "ServiceAccount"]
            .map(|k| (k.to_owned(), "demo-tenure-test".to_owned()))
            .into()
    );
    for h in &tests {
        assert_eq!(
            h["metadata"]["annotations"]["helm.sh/hook-delete-policy"],
            "before-hook-creation,hook-succeeded",
            "{h}"
        );
    }
    let weight = |kind: &str| {
        one(&tests, kind)["metadata"]["annotations"]["helm.sh/hook-weight"]
            .as_str()
            .unwrap_or_default()
            .parse::<i32>()
            .unwrap_or_else(|e| panic!("{kind}: {e}"))
    };
    assert!(
        weight("Role") < weight("Pod")
            && weight("RoleBinding") < weight("Pod")
            && weight("ServiceAccount") < weight("Pod")
    );
    assert_eq!(
        one(&tests, "Role")["rules"],
        json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                "resourceNames": ["demo-tenure"], "verbs": ["get"]}])
    );
    let pod = one(&tests, "Pod");
    let spec = &pod["spec"];
    assert_eq!(spec["serviceAccountName"], "demo-tenure-test");
    assert_eq!(spec["restartPolicy"], "Never");
    assert_restricted(spec);
    let command = |pod: &Value| {
        let c = container(&pod["spec"]["containers"], "leader");
        strings(&c["command"])
            .into_iter()
            .chain(strings(&c["args"]))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        command(pod),
        [
            "/usr/local/bin/tenure",
            "status",
            "--lease=demo-tenure",
            "--backend=kube",
            "--namespace=apps",
            "--require-leader"
        ]
    );
    assert_eq!(
        container(&spec["containers"], "leader")["image"],
        "tenure:0.1.0"
    );
    // Not one of the Deployment's pods.
    let objs = render("demo", "apps", &[]);
    let selector = &one(&objs, "Deployment")["spec"]["selector"]["matchLabels"];
    let labels = &pod["metadata"]["labels"];
    assert!(
        !selector
            .as_object()
            .is_some_and(|m| m.iter().all(|(k, v)| &labels[k] == v)),
        "{labels} matches the Deployment's selector {selector}"
    );
    // Sharded: every shard's Lease and the group record, by name; --shards.
    let sharded = hooks_of(
        render_hooks("demo", "apps", &["--set", "sharding.shards=3"]),
        "test",
    );
    assert_eq!(
        one(&sharded, "Role")["rules"][0]["resourceNames"],
        json!([
            "demo-tenure-group",
            "demo-tenure-0",
            "demo-tenure-1",
            "demo-tenure-2"
        ])
    );
    assert!(
        command(one(&sharded, "Pod")).contains(&"--shards=3".to_owned()),
        "{:?}",
        command(one(&sharded, "Pod"))
    );
    // tenure in the workload image: run from there.
    let own = hooks_of(
        render_hooks("demo", "apps", &["--set", "tenure.inject=false"]),
        "test",
    );
    assert_eq!(command(one(&own, "Pod"))[0], "tenure");
    // Not rendered: turned off; Redis; a CronJob; no RBAC from the chart.
    for args in [
        &["--set", "test.enabled=false"][..],
        &[
            "--set",
            "backend.type=redis",
            "--set",
            "backend.redis.url=redis://r:6379",
        ][..],
        &[
            "--set",
            "job.schedule=0 3 * * *",
            "--set",
            "job.oncePer=24h",
        ][..],
        &["--set", "rbac.create=false"][..],
    ] {
        assert!(
            hooks_of(render_hooks("demo", "apps", args), "test").is_empty(),
            "{args:?}"
        );
    }

    // On the real apiserver: admitted under "restricted"; the ServiceAccount may get the
    // release's Lease and nothing else.
    let ns = restricted_namespace("helm-test");
    let tests = hooks_of(render_hooks("demo", &ns, &[]), "test");
    let r = create_dry_run(&ns, one(&tests, "Pod"));
    assert!(
        r.ok && !r.stderr.contains("PodSecurity"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    for kind in ["ServiceAccount", "Role", "RoleBinding"] {
        apply(&one(&tests, kind).to_string());
    }
    let sa = format!("system:serviceaccount:{ns}:demo-tenure-test");
    wait_allowed(&sa, &ns, "get", "leases/demo-tenure");
    assert_eq!(
        granted(&ns, "demo-tenure-test"),
        [rule("leases.coordination.k8s.io", "demo-tenure", "get")].into()
    );
    // The Pod's own command, authenticated as its ServiceAccount.
    let token = run(
        kubectl_cmd().args([
            "create",
            "token",
            "demo-tenure-test",
            "-n",
            &ns,
            "--duration=10m",
        ]),
        None,
    )
    .expect_ok();
    let as_test = kubeconfig_with_token(token.trim());
    let check_with = |args: &[String]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(&args[1..])
            .env("KUBECONFIG", &as_test)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("TENURE_BACKEND")
            .stdin(Stdio::null())
            .output()
            .expect("run tenure status");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let args = command(one(&tests, "Pod"));
    let check = || check_with(&args);
    let (code, out, err) = check();
    assert_eq!(code, Some(10), "nobody leads yet:\n{out}\n{err}");
    assert!(err.contains("nobody holds lease \"demo-tenure\""), "{err}");
    // A leader (as admin): the same command passes.
    let mut leader = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args([
            "run",
            "--lease=demo-tenure",
            "--backend=kube",
            &format!("--namespace={ns}"),
            "--identity=demo-pod",
            "--",
            "sleep",
            "60",
        ])
        .env("KUBECONFIG", shared().admin_kubeconfig())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("TENURE_BACKEND")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tenure run");
    let deadline = Instant::now() + Duration::from_secs(30);
    let passed = loop {
        let (code, out, err) = check();
        if code == Some(0) {
            break out;
        }
        assert_eq!(code, Some(10), "{out}\n{err}");
        assert!(Instant::now() < deadline, "no leader seen:\n{out}\n{err}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(passed.contains("demo-pod"), "{passed}");
    let _ = leader.kill();
    let _ = leader.wait();
    // Sharded, the same ServiceAccount under the sharded Role: every shard read (the members,
    // which it may not list, show as unknown), none held: 10, naming the free shards.
    let sharded = hooks_of(
        render_hooks("demo", &ns, &["--set", "sharding.shards=2"]),
        "test",
    );
    apply(&one(&sharded, "Role").to_string());
    wait_allowed(&sa, &ns, "get", "leases/demo-tenure-1");
    let (code, out, err) = check_with(&command(one(&sharded, "Pod")));
    assert_eq!(code, Some(10), "{out}\n{err}");
    assert!(
        err.contains("nobody holds the lease of 2 of the 2 shards of \"demo-tenure\": shard 0, 1"),
        "{err}"
    );
    assert!(out.contains("MEMBERS: unknown"), "{out}");
}

/// `election.prefer` passes `--prefer` before the `--`, and on Kubernetes the Role grants
/// what the replicas' announcements need (member Leases named after pods: no
/// resourceNames); unset, neither; bad values and combinations are refused with a clear
/// message.
#[test]
fn prefer_renders_the_flag_and_the_member_lease_rules() {
    let worker_args =
        |objs: &[Value]| strings(&container(&pod_spec(objs)["containers"], "worker")["args"]);
    let plain = render("pr", "ns", &[]);
    assert!(
        !worker_args(&plain)
            .iter()
            .any(|a| a.starts_with("--prefer")),
        "{:?}",
        worker_args(&plain)
    );
    assert!(
        role_rules(&plain)[0]["resourceNames"].is_array(),
        "without a preference the Lease rule stays by name: {}",
        role_rules(&plain)
    );
    let newest = render("pr", "ns", &["--set", "election.prefer=newest"]);
    let args = worker_args(&newest);
    let dashes = args.iter().position(|a| a == "--").expect("--");
    assert!(
        args.iter().position(|a| a == "--prefer=newest") < Some(dashes),
        "{args:?}"
    );
    assert_eq!(
        role_rules(&newest),
        json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["get", "list", "watch", "update", "patch", "create", "delete"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ])
    );
    let listed = worker_args(&render(
        "pr",
        "ns",
        &["--set", "election.prefer=identities:pod-a\\,pod-b"],
    ));
    assert!(
        listed.contains(&"--prefer=identities:pod-a,pod-b".to_owned()),
        "{listed:?}"
    );
    let redis = render(
        "pr",
        "ns",
        &[
            "--set",
            "election.prefer=newest,backend.type=redis,backend.redis.url=redis://redis:6379",
        ],
    );
    assert!(!kinds(&redis).contains("Role"), "{:?}", kinds(&redis));
    assert!(worker_args(&redis).contains(&"--prefer=newest".to_owned()));

    // Fenced: the election's worker Role covers the member Leases, exactly as `tenure policy
    // --prefer` prints it (the chart refused the combination before).
    assert_fenced_member_leases("election.prefer=newest", &["--prefer", "newest"]);

    let schema = "values don't meet the specifications of the schema(s)";
    let long = format!("election.prefer=newest,election.lease={}", "l".repeat(222));
    assert_refused(&[
        (
            &["--set", "election.prefer=oldest"],
            &[schema, "at '/election/prefer'"],
        ),
        (
            &["--set", "election.prefer=identities:"],
            &[schema, "at '/election/prefer'"],
        ),
        (
            &["--set", "election.prefer=newest,sharding.shards=2"],
            &["election.prefer does not apply with sharding.shards"],
        ),
        (
            &["--set", &long],
            &["with election.prefer the lease name may have at most 221 characters"],
        ),
    ]);
}

/// `election.health`: `--health-cmd` and its timings before the `--`, the Role's member-Lease
/// rules on Kubernetes (healthy replicas announce themselves there), and the same refusals as
/// `election.prefer`.
#[test]
fn health_renders_the_flags_and_the_member_lease_rules() {
    let worker_args =
        |objs: &[Value]| strings(&container(&pod_spec(objs)["containers"], "worker")["args"]);
    let plain = render("hl", "ns", &[]);
    assert!(
        !worker_args(&plain)
            .iter()
            .any(|a| a.starts_with("--health")),
        "{:?}",
        worker_args(&plain)
    );
    let checked = render(
        "hl",
        "ns",
        &[
            "--set",
            "election.health.command=pg_isready -h db,election.health.interval=2s,election.health.unhealthyAfter=7s,election.health.recovery=1m",
        ],
    );
    let args = worker_args(&checked);
    let dashes = args.iter().position(|a| a == "--").expect("--");
    for flag in [
        "--health-cmd=pg_isready -h db",
        "--health-interval=2s",
        "--unhealthy-after=7s",
        "--health-recovery=1m",
    ] {
        assert!(
            args.iter().position(|a| a == flag) < Some(dashes),
            "{flag} before the --: {args:?}"
        );
    }
    assert_eq!(
        role_rules(&checked),
        json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["get", "list", "watch", "update", "patch", "create", "delete"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ])
    );
    let defaults = worker_args(&render(
        "hl",
        "ns",
        &["--set", "election.health.command=/bin/check"],
    ));
    for flag in [
        "--health-interval=5s",
        "--unhealthy-after=15s",
        "--health-recovery=60s",
    ] {
        assert!(defaults.contains(&flag.to_owned()), "{flag}: {defaults:?}");
    }
    assert_fenced_member_leases(
        "election.health.command=/bin/check",
        &["--health-cmd", "/bin/check"],
    );
    let schema = "values don't meet the specifications of the schema(s)";
    let long = format!(
        "election.health.command=/bin/check,election.lease={}",
        "l".repeat(222)
    );
    assert_refused(&[
        (
            &["--set", "election.health.interval=5x"],
            &[schema, "at '/election/health/interval'"],
        ),
        (
            &[
                "--set",
                "election.health.command=/bin/check,sharding.shards=2",
            ],
            &["election.health.command does not apply with sharding.shards"],
        ),
        (
            &["--set", &long],
            &["with election.health.command the lease name may have at most 221 characters"],
        ),
    ]);
}

/// With `fencing.policy` and `set` (`election.prefer` or `election.health.command`), the chart
/// renders the election's worker Role with the member-Lease rule (Leases of any name, every
/// verb a member's announcement uses, `patch` for its server-side apply) and the
/// self-impersonation rule, and no release Role for Leases; every election object is what
/// `tenure policy FLAGS` prints, and without FLAGS `tenure policy`'s Role differs (the Lease
/// by name: it could not announce).
fn assert_fenced_member_leases(set: &str, flags: &[&str]) {
    let objs = render(
        "demo",
        "apps",
        &["--set", &format!("{set},fencing.policy.enabled=true")],
    );
    let election = [
        "--lease",
        "demo-tenure",
        "--namespace",
        "apps",
        "--service-account",
        "demo-tenure",
    ];
    assert_chart_is_tenure_policy(&objs, &[&election[..], flags].concat(), &[], set);
    let worker = named(&objs, "Role", "tenure-worker.demo-tenure");
    assert_eq!(
        worker["rules"],
        json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["get", "list", "watch", "update", "patch", "create", "delete"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": ["demo-tenure"],
             "verbs": ["impersonate"]},
        ]),
        "{set}"
    );
    assert!(
        !objs
            .iter()
            .any(|o| o["kind"] == "Role" && o["metadata"]["name"] == "demo-tenure"),
        "{set}: the Lease rules are the election's, not in the release's Role"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .arg("policy")
        .args(election)
        .output()
        .expect("tenure policy");
    let printed = objects(&String::from_utf8_lossy(&out.stdout));
    let plain = printed
        .iter()
        .find(|o| o["kind"] == "Role")
        .expect("a worker Role");
    assert_ne!(
        plain["rules"], worker["rules"],
        "{set}: without the flag tenure policy's Role has no member-Lease rule"
    );
}
