//! The node tests' peers (`tests/node_peers.rs`): images of `examples/kube_controller.rs`
//! and of client-go's leader election (`e2e/node/images.sh --peers`) imported into a running
//! node, client-go's candidate as a Deployment whose leader writes to a [`Register`], and the
//! kubectl helpers those tests share (pods, a watch of any list, diagnostics on failure).
//!
//! The example's image needs `TENURE_NODE_KUBE_CONTROLLER_BIN`: its static musl build
//! (`scripts/test.sh` builds it). client-go's candidate is built (or found in the cache) by
//! `e2e/scripts/kube-testenv.sh build-candidate`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Attempt, NODE_IP, Node, Register, fresh_dir, kubectl, pod_processes, repo, run};

/// The image of the example (`images.sh --peers`).
pub const CONTROLLER_IMAGE: &str = "docker.io/library/tenure-kube-controller:0.1.0";
/// The image of client-go's candidate with busybox.
pub const CLIENTGO_IMAGE: &str = "docker.io/library/clientgo-candidate:0.1.0";

/// The static musl build of `examples/kube_controller.rs`, or why it is missing.
pub fn controller_bin() -> Result<PathBuf, String> {
    let Some(bin) = std::env::var_os("TENURE_NODE_KUBE_CONTROLLER_BIN") else {
        return Err(
            "TENURE_NODE_KUBE_CONTROLLER_BIN is not set (the static musl build of \
             examples/kube_controller.rs; scripts/test.sh builds it)"
                .into(),
        );
    };
    let bin = PathBuf::from(bin);
    if !bin.is_file() {
        return Err(format!(
            "TENURE_NODE_KUBE_CONTROLLER_BIN={} is not a file",
            bin.display()
        ));
    }
    Ok(bin)
}

/// client-go's leader-election candidate (static Go), built once per process.
pub fn candidate_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        PathBuf::from(super::script(
            &repo().join("e2e/scripts/kube-testenv.sh"),
            &["build-candidate"],
        ))
    })
}

/// Builds the peers' images (`None`: not that one) and returns the docker-archives made.
pub fn build_images(controller: Option<&Path>, candidate: Option<&Path>) -> Vec<PathBuf> {
    let out = fresh_dir("peer-images");
    let arg = |p: Option<&Path>| p.map_or_else(|| "-".to_owned(), |p| p.display().to_string());
    let (out_s, c, g) = (out.display().to_string(), arg(controller), arg(candidate));
    super::script(
        &repo().join("e2e/node/images.sh"),
        &["--peers", &out_s, &c, &g],
    );
    [
        controller.map(|_| out.join("kube-controller.tar")),
        candidate.map(|_| out.join("clientgo-candidate.tar")),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Imports a docker-archive into the node's containerd (what the launcher's `--image` does
/// before the kubelet starts).
pub fn import(node: &Node, tar: &Path) {
    let tar = tar.display().to_string();
    node.nsenter(&[
        "ctr",
        "--address",
        "/run/containerd/containerd.sock",
        "-n",
        "k8s.io",
        "images",
        "import",
        &tar,
    ])
    .expect_ok();
}

/// `kubectl apply -f -` of a JSON document.
pub fn apply(node: &Node, doc: &Value) {
    run(
        node.kubectl().args(["apply", "-f", "-"]),
        Some(&doc.to_string()),
    )
    .expect_ok();
}

/// A namespace, enforcing Pod Security "restricted".
pub fn restricted_namespace(node: &Node, name: &str) {
    apply(
        node,
        &json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            }}
        }),
    );
}

/// The Pod Security "restricted" security contexts (pod, container), as the chart's.
pub fn restricted_contexts() -> (Value, Value) {
    (
        json!({
            "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        }),
        json!({
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }),
    )
}

/// The downward-API environment every peer pod gets (`POD_NAME` also lets
/// [`pod_processes`] find its processes on the host).
pub fn pod_env() -> Value {
    json!([
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ])
}

#[derive(Debug, Clone)]
pub struct PodInfo {
    pub name: String,
    pub uid: String,
    pub phase: String,
    pub ready: bool,
    pub restarts: u64,
    pub deleting: bool,
}

/// The pods of `ns` matching `selector` (all with "").
pub fn pods(node: &Node, ns: &str, selector: &str) -> Vec<PodInfo> {
    let mut cmd = node.kubectl();
    cmd.args(["get", "pods", "-n", ns, "-o", "json"]);
    if !selector.is_empty() {
        cmd.args(["-l", selector]);
    }
    let list = run(&mut cmd, None).json();
    list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let statuses = p["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            PodInfo {
                name: p["metadata"]["name"].as_str().unwrap_or_default().into(),
                uid: p["metadata"]["uid"].as_str().unwrap_or_default().into(),
                phase: p["status"]["phase"].as_str().unwrap_or_default().into(),
                ready: p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                }),
                restarts: statuses
                    .iter()
                    .map(|s| s["restartCount"].as_u64().unwrap_or(0))
                    .sum(),
                deleting: !p["metadata"]["deletionTimestamp"].is_null(),
            }
        })
        .collect()
}

/// Waits until exactly `n` pods (none being deleted) match and all are Running and Ready.
pub fn ready_pods(
    node: &Node,
    ns: &str,
    selector: &str,
    n: usize,
    timeout: Duration,
) -> Vec<PodInfo> {
    super::wait_for(timeout, &format!("{n} Ready pods in {ns}"), || {
        let all = pods(node, ns, selector);
        let p: Vec<PodInfo> = all.iter().filter(|p| !p.deleting).cloned().collect();
        (all.len() == n && p.len() == n && p.iter().all(|p| p.phase == "Running" && p.ready))
            .then_some(p)
    })
}

/// (holder, `tenure.dev/fencing` token or 0) of a Lease.
pub fn lease(node: &Node, ns: &str, name: &str) -> (String, u64) {
    let out = run(
        node.kubectl()
            .args(["get", "lease", name, "-n", ns, "-o", "json"]),
        None,
    );
    if !out.ok {
        return (String::new(), 0);
    }
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_default();
    (
        v["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .into(),
        v["metadata"]["annotations"]["tenure.dev/fencing"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0),
    )
}

/// On a panic, what the namespaces look like (pods, events, logs).
pub struct Diagnose<'a> {
    pub node: &'a Node,
    pub namespaces: Vec<String>,
}

impl Drop for Diagnose<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for ns in &self.namespaces {
            for args in [
                &["get", "pods", "-o", "wide"][..],
                &["get", "events", "--sort-by=.lastTimestamp"][..],
                &[
                    "logs",
                    "-l",
                    "tenure.dev/test-pod=true",
                    "--all-containers",
                    "--prefix",
                    "--tail=40",
                ][..],
            ] {
                let out = run(self.node.kubectl().args(args).args(["-n", ns]), None);
                eprintln!(
                    "--- kubectl {} -n {ns}:\n{}{}",
                    args.join(" "),
                    out.stdout,
                    out.stderr
                );
            }
        }
    }
}

// ---- a watch of any list -----------------------------------------------------------------

/// One version of an object as `kubectl get -w` delivered it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub object: Value,
}

impl Seen {
    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.object["metadata"]["annotations"][key].as_str()
    }
}

/// `kubectl get KIND -n NS [-l SELECTOR] -w -o json` in the background, restarted whenever
/// kubectl exits: every distinct version (by uid and resourceVersion) with its arrival time.
pub struct Watch {
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    pid: Arc<AtomicU32>,
}

impl Watch {
    pub fn start(node: &Node, ns: &str, kind: &str, selector: &str) -> Self {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let pid = Arc::new(AtomicU32::new(0));
        let (sn, st, pd) = (seen.clone(), stop.clone(), pid.clone());
        let kubeconfig = node.kubeconfig();
        let mut args: Vec<String> = ["get", kind, "-n", ns, "-w", "-o", "json"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        if !selector.is_empty() {
            args.extend(["-l".to_owned(), selector.to_owned()]);
        }
        std::thread::spawn(move || {
            let mut versions = BTreeSet::new();
            while !st.load(Ordering::SeqCst) {
                let Ok(mut child) = Command::new(kubectl())
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(&args)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                else {
                    return;
                };
                pd.store(child.id(), Ordering::SeqCst);
                if let Some(stdout) = child.stdout.take() {
                    let stream = serde_json::Deserializer::from_reader(stdout).into_iter::<Value>();
                    for v in stream {
                        let Ok(v) = v else { break };
                        let key = (
                            v["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
                            v["metadata"]["resourceVersion"]
                                .as_str()
                                .unwrap_or_default()
                                .to_owned(),
                        );
                        if versions.insert(key) {
                            sn.lock().unwrap_or_else(|p| p.into_inner()).push(Seen {
                                at: Instant::now(),
                                object: v,
                            });
                        }
                    }
                }
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Watch { seen, stop, pid }
    }

    pub fn snapshot(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let pid = self.pid.load(Ordering::SeqCst);
        if pid != 0 {
            // SAFETY: kill(2) on the kubectl this watch started (reaped by its thread).
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
}

// ---- client-go's candidate as a Deployment --------------------------------------------------

/// The timings of a client-go release (flags of `clientgo-candidate`).
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    pub lease: Duration,
    pub renew: Duration,
    pub retry: Duration,
}

/// The pod's shell: client-go's candidate with `--timestamps`, and, from each `STARTED` to
/// the matching `ENDED`, a writer sending `token=<the term's start, Unix ns>` to the register
/// every 100 ms (a term number client-go does not have: the register refuses a write of an
/// older term than one it has taken, which counts the stale writes a fence would have refused;
/// a resource without one takes them). The writer runs in its own session and gets SIGTERM
/// as a group at `ENDED` (and when the candidate's output ends), as `tenure run` signals its
/// command. SIGTERM to the shell (PID 1) goes to the candidate, which releases the Lease
/// (ReleaseOnCancel) and exits 0; the shell exits with the candidate's status.
fn clientgo_script(register: &Register, lease: &str, t: Timings) -> String {
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    format!(
        r#"mkfifo /tmp/events
(
  w=
  while read -r ev id at; do
    case "$ev" in
      STARTED)
        setsid sh -c "while true; do printf 'GET /w?pod=%s&token=%s HTTP/1.0\r\n\r\n' \"\$POD_NAME\" $at | nc -w 2 {ip} {port} >/dev/null; sleep 0.1; done" &
        w=$! ;;
      ENDED) [ -n "$w" ] && kill -TERM -"$w"; w= ;;
    esac
  done
  [ -n "$w" ] && kill -TERM -"$w"
) </tmp/events &
/usr/local/bin/clientgo-candidate --kubeconfig /etc/clientgo/kubeconfig \
  --namespace "$POD_NAMESPACE" --lease {lease} --identity "$POD_NAME" --timestamps --rejoin \
  --lease-duration {ld} --renew-deadline {rd} --retry-period {rp} >/tmp/events &
c=$!
trap 'kill -TERM $c' TERM INT
wait $c
st=$?
while kill -0 $c 2>/dev/null; do wait $c; st=$?; done
wait
exit $st
"#,
        ip = NODE_IP,
        port = register.port,
        ld = ms(t.lease),
        rd = ms(t.renew),
        rp = ms(t.retry),
    )
}

/// What a client-go release is made of in `ns`: a ServiceAccount with a Role for its Lease
/// (get, update by name; create), a kubeconfig for the candidate (it takes no in-cluster
/// config: the ServiceAccount's token and CA files, the `kubernetes` Service's address), and
/// a Deployment of `replicas` pods in the Pod Security "restricted" profile.
pub fn clientgo_release(
    node: &Node,
    ns: &str,
    name: &str,
    register: &Register,
    t: Timings,
    replicas: u32,
) -> Value {
    let api = run(
        node.kubectl().args([
            "get",
            "service",
            "kubernetes",
            "-n",
            "default",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ]),
        None,
    )
    .expect_ok();
    let sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: in-cluster\n  cluster:\n    \
         server: https://{api}:443\n    certificate-authority: {sa_dir}/ca.crt\nusers:\n\
         - name: sa\n  user:\n    tokenFile: {sa_dir}/token\ncontexts:\n- name: in-cluster\n  \
         context:\n    cluster: in-cluster\n    user: sa\n    namespace: {ns}\n\
         current-context: in-cluster\n"
    );
    let labels = json!({"app.kubernetes.io/name": name, "tenure.dev/test-pod": "true"});
    let (pod_sc, sc) = restricted_contexts();
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": ns},
         "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": [name], "verbs": ["get", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("{name}-kubeconfig"), "namespace": ns},
         "data": {"kubeconfig": kubeconfig}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
         "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": name,
                    "enableServiceLinks": false,
                    "terminationGracePeriodSeconds": 11,
                    "securityContext": pod_sc,
                    "containers": [{
                        "name": "candidate",
                        "image": CLIENTGO_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", clientgo_script(register, name, t)],
                        "env": pod_env(),
                        "securityContext": sc,
                        "volumeMounts": [
                            {"name": "tmp", "mountPath": "/tmp"},
                            {"name": "kubeconfig", "mountPath": "/etc/clientgo", "readOnly": true},
                        ],
                    }],
                    "volumes": [
                        {"name": "tmp", "emptyDir": {"sizeLimit": "1Mi"}},
                        {"name": "kubeconfig", "configMap": {"name": format!("{name}-kubeconfig"),
                            "items": [{"key": "kubeconfig", "path": "kubeconfig"}]}},
                    ],
                },
            },
         }},
    ]})
}

/// The pid of client-go's candidate in `pod` (the host's view).
pub fn candidate_pid(pod: &str) -> Option<u32> {
    pod_processes(pod)
        .into_iter()
        .find(|(_, comm, _)| comm.starts_with("clientgo-cand"))
        .map(|(pid, _, _)| pid)
}

// ---- what the register saw ------------------------------------------------------------------

/// The first write taken after `since` of a term later than `token` (a higher token).
pub fn first_new_term(register: &Register, since: Instant, token: u64) -> Option<Attempt> {
    register
        .since(since)
        .into_iter()
        .find(|w| w.accepted && w.token > token)
}

/// The last accepted write: the current leader's pod and token.
pub fn last_accepted(register: &Register) -> Option<Attempt> {
    register.snapshot().into_iter().rev().find(|w| w.accepted)
}

/// The pods whose writes the register accepted in the last `window`.
pub fn writers(register: &Register, window: Duration) -> Vec<String> {
    let mut w: Vec<String> = register
        .since(Instant::now() - window)
        .into_iter()
        .filter(|w| w.accepted)
        .map(|w| w.pod)
        .collect();
    w.sort();
    w.dedup();
    w
}

/// The longest time between two accepted writes in `[from, to]` (the edges count: a
/// leaderless stretch at either end is a gap too).
pub fn longest_gap(register: &Register, from: Instant, to: Instant) -> Duration {
    let mut at: Vec<Instant> = register
        .since(from)
        .into_iter()
        .filter(|w| w.accepted && w.at <= to)
        .map(|w| w.at)
        .collect();
    at.insert(0, from);
    at.push(to);
    at.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
}

/// The pod's cgroup directory in the freezer hierarchy.
pub fn freezer_dir(node: &Node, uid: &str) -> PathBuf {
    let root = PathBuf::from("/sys/fs/cgroup/freezer").join(node.cgroup_root());
    let want = format!("pod{uid}");
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                if e.file_name().to_string_lossy() == want {
                    return e.path();
                }
                stack.push(e.path());
            }
        }
    }
    panic!("no freezer cgroup for pod {uid}")
}

pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid we looked up.
    let rc = unsafe { libc::kill(pid as i32, sig) };
    assert_eq!(rc, 0, "kill {pid}: {}", std::io::Error::last_os_error());
}
