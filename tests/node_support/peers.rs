//! The node tests' peers (`tests/node_peers.rs`): images of `examples/kube_controller.rs`
//! and of client-go's leader election (`e2e/node/images.sh --peers`) imported into a running
//! node, the Pod Security "restricted" contexts and downward-API environment of their pods,
//! and client-go's candidate as a Deployment whose leader writes to a [`Register`].
//!
//! The example's image needs `TENURE_NODE_KUBE_CONTROLLER_BIN`: its static musl build
//! (`scripts/test.sh` builds it). client-go's candidate is built (or found in the cache) by
//! `e2e/scripts/kube-testenv.sh build-candidate`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use super::{NODE_IP, Node, Register, fresh_dir, pod_processes, repo, run};

/// The image of the example (`images.sh --peers`).
pub const CONTROLLER_IMAGE: &str = "docker.io/library/tenure-kube-controller:0.1.0";
/// The image of client-go's candidate with busybox.
pub const CLIENTGO_IMAGE: &str = "docker.io/library/clientgo-candidate:0.1.0";
/// Busybox with tenure at /usr/local/bin/tenure (`images.sh --peers`'s fourth binary): the
/// workload image of a release with `tenure.inject=false`.
pub const TENURE_IN_IMAGE: &str = "docker.io/library/tenure-busybox:0.1.0";

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

/// Builds the peers' images (`None`: not that one) and returns the docker-archives made:
/// the example's, client-go's candidate's, and busybox with `tenure_in_image` at
/// /usr/local/bin/tenure ([`TENURE_IN_IMAGE`], a workload image that has tenure).
pub fn build_images(
    controller: Option<&Path>,
    candidate: Option<&Path>,
    tenure_in_image: Option<&Path>,
) -> Vec<PathBuf> {
    let out = fresh_dir("peer-images");
    let arg = |p: Option<&Path>| p.map_or_else(|| "-".to_owned(), |p| p.display().to_string());
    let (out_s, c, g, t) = (
        out.display().to_string(),
        arg(controller),
        arg(candidate),
        arg(tenure_in_image),
    );
    super::script(
        &repo().join("e2e/node/images.sh"),
        &["--peers", &out_s, &c, &g, &t],
    );
    [
        controller.map(|_| out.join("kube-controller.tar")),
        candidate.map(|_| out.join("clientgo-candidate.tar")),
        tenure_in_image.map(|_| out.join("tenure-busybox.tar")),
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
