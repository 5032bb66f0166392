//! The Kubernetes tests' harness: a real kube-apiserver (with embedded etcd) from
//! `e2e/kube-testenv`, one per test binary, started on first use and stopped when the test
//! process exits (the launcher watches its parent pid). `TENURE_KUBE_DIR=DIR` reuses a server
//! started with `e2e/scripts/kube-testenv.sh start DIR` instead. Never skips: if the server
//! cannot be built or started, the test fails saying why.

#![allow(dead_code)]

#[cfg(feature = "kube")]
pub mod fencing;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use tenure::backend::kube::{KubeBackend, KubeOptions};

/// How long a cold start may take (the launcher is cached; a cold Go build is not waited for
/// here: `kube-testenv.sh build` runs first and takes as long as it takes).
const START_TIMEOUT: Duration = Duration::from_secs(180);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `kube-testenv.sh <what>` and returns the binary path it prints.
fn build(what: &str) -> PathBuf {
    build_with("e2e/scripts/kube-testenv.sh", what)
}

/// Runs `<script> <what>` (a builder under `e2e/scripts`) and returns the binary path it prints.
fn build_with(script: &str, what: &str) -> PathBuf {
    let script = repo().join(script);
    let out = Command::new("bash")
        .arg(&script)
        .arg(what)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "`{} {what}` failed ({}); the Kubernetes tests need Go and the Go module proxy for \
         the first build (see e2e/kube-testenv/README.md)",
        script.display(),
        out.status
    );
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let path = PathBuf::from(path.lines().last().unwrap_or_default());
    assert!(path.is_file(), "`{what}` printed no binary path");
    path
}

/// The launcher binary, built (or found in the cache) once per test process.
pub fn launcher() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("build"))
}

/// kubectl of the apiserver's release, built from `k8s.io/kubernetes/cmd/kubectl`.
pub fn kubectl() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("build-kubectl"))
}

/// The Go example of `tenure run --fence` (`e2e/kube-testenv/cmd/fenced-writer`): a plain
/// client-go program that creates a ConfigMap through `$KUBECONFIG`.
pub fn fenced_writer() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("build-fenced-writer"))
}

/// helm, built by `e2e/scripts/helm.sh`.
pub fn helm() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_with("e2e/scripts/helm.sh", "build"))
}

/// The client-go leader-election candidate binary.
pub fn candidate() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("build-candidate"))
}

/// How to start a server.
#[derive(Clone, Debug, Default)]
pub struct Launch {
    /// A fixed port (needed for a restart that keeps kubeconfigs valid).
    pub port: Option<u16>,
    /// Keep etcd's data here across restarts.
    pub etcd_dir: Option<PathBuf>,
    /// Reuse the credentials in the directory (for restarts).
    pub reuse_credentials: bool,
    /// Extra kube-apiserver flags.
    pub extra: Vec<String>,
}

/// A running kube-apiserver.
pub struct Server {
    pub dir: PathBuf,
    launch: Launch,
    /// `None` for a server this process did not start (`TENURE_KUBE_DIR`), or while stopped.
    child: Mutex<Option<Child>>,
    owned: bool,
}

/// The server shared by every test of this binary.
pub fn shared() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var_os("TENURE_KUBE_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            assert!(
                dir.join("ready").is_file() && dir.join("admin.kubeconfig").is_file(),
                "TENURE_KUBE_DIR={} is not a running kube-testenv (no ready marker); start one \
                 with `e2e/scripts/kube-testenv.sh start DIR` or unset it",
                dir.display()
            );
            Server {
                dir,
                launch: Launch::default(),
                child: Mutex::new(None),
                owned: false,
            }
        }
        None => Server::start(Launch::default()),
    })
}

/// A server of this process's own with Coordinated Leader Election (KEP-4355) switched on:
/// the gate is off by default in 1.36, and without it the API server drops `spec.strategy`
/// and `spec.preferredHolder` from every Lease write (create and update alike, unless the
/// stored Lease already has them).
pub fn coordinated() -> Server {
    Server::start(Launch {
        extra: vec![
            "--feature-gates=CoordinatedLeaderElection=true".into(),
            "--runtime-config=coordination.k8s.io/v1beta1=true".into(),
            // Open watches would otherwise hold the stop for the 60 s shutdown timeout.
            "--shutdown-send-retry-after=true".into(),
        ],
        ..Launch::default()
    })
}

/// Removes the directories of earlier test processes that are gone (`kube-TAG-PID-N`).
fn sweep(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.rsplitn(3, '-');
        let (_, pid) = (parts.next(), parts.next());
        let is_ours = parts.next().is_some_and(|p| p.starts_with("kube-"));
        if let Some(pid) = pid.and_then(|p| p.parse::<u32>().ok())
            && is_ours
            && pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A fresh directory under cargo's per-target temp dir.
pub fn fresh_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    SWEPT.call_once(|| sweep(&root));
    let dir = root.join(format!(
        "kube-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    dir
}

/// A free port on 127.0.0.1 (free now; good enough for a test server started right away).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

impl Server {
    /// Starts a server of this process's own in a fresh directory; panics if it fails.
    pub fn start(launch: Launch) -> Self {
        let server = Self {
            dir: fresh_dir("apiserver"),
            launch,
            child: Mutex::new(None),
            owned: true,
        };
        server.spawn();
        server
    }

    fn spawn(&self) {
        let bin = launcher();
        let _ = std::fs::remove_file(self.dir.join("ready"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("log"))
            .unwrap_or_else(|e| panic!("log file: {e}"));
        let mut cmd = Command::new(bin);
        cmd.arg("--dir")
            .arg(&self.dir)
            .arg("--parent-pid")
            .arg(std::process::id().to_string());
        if let Some(port) = self.launch.port {
            cmd.arg("--port").arg(port.to_string());
        }
        if let Some(etcd) = &self.launch.etcd_dir {
            cmd.arg("--etcd-dir").arg(etcd);
        }
        if self.launch.reuse_credentials {
            cmd.arg("--reuse-credentials");
        }
        if !self.launch.extra.is_empty() {
            cmd.arg("--").args(&self.launch.extra);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let started = Instant::now();
        while !self.dir.join("ready").is_file() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "kube-testenv exited ({status}) before it was ready; its log:\n{}",
                    self.log_tail()
                );
            }
            if started.elapsed() > START_TIMEOUT {
                let _ = child.kill();
                panic!(
                    "kube-testenv not ready after {START_TIMEOUT:?}; its log:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Stops the server (SIGTERM, then SIGKILL after 60 s) and waits for it to exit.
    pub fn stop(&self) {
        let Some(mut child) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pid of the `kube-testenv` process (kube-apiserver and its embedded etcd, one
    /// process) this harness started; `None` for a server it did not start
    /// (`TENURE_KUBE_DIR`) or while stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Child::id)
    }

    /// Starts a stopped server again with the same options.
    pub fn restart(&self) {
        self.spawn();
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    pub fn tester_kubeconfig(&self) -> PathBuf {
        self.dir.join("tester.kubeconfig")
    }

    /// The server's URL (`https://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        std::fs::read_to_string(self.dir.join("ready"))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// A client from the kubeconfig at `path`.
    pub async fn client_from(&self, path: &Path) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(path)
            .unwrap_or_else(|e| panic!("kubeconfig {}: {e}", path.display()));
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("kubeconfig {}: {e}", path.display()));
        kube::Client::try_from(config).unwrap_or_else(|e| panic!("client: {e}"))
    }

    /// An admin client.
    pub async fn admin(&self) -> kube::Client {
        self.client_from(&self.admin_kubeconfig()).await
    }

    /// A backend as admin in `namespace`.
    pub async fn backend(&self, namespace: &str) -> KubeBackend {
        self.backend_with(namespace, KubeOptions::new()).await
    }

    /// A backend as admin in `namespace` with `options`.
    pub async fn backend_with(&self, namespace: &str, options: KubeOptions) -> KubeBackend {
        KubeBackend::from_kubeconfig(self.admin_kubeconfig(), options.namespace(namespace))
            .await
            .unwrap_or_else(|e| panic!("backend: {e}"))
    }

    /// Creates namespace `name` (fine if it exists).
    pub async fn namespace(&self, name: &str) {
        let api: Api<Namespace> = Api::all(self.admin().await);
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create namespace {name}: {e}"),
        }
    }

    /// Reads Lease `name` in `namespace` as admin.
    pub async fn lease(&self, namespace: &str, name: &str) -> Option<Lease> {
        let api: Api<Lease> = Api::namespaced(self.admin().await, namespace);
        api.get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("get lease: {e}"))
    }

    /// Deletes Lease `name` in `namespace` as admin.
    pub async fn delete_lease(&self, namespace: &str, name: &str) {
        let api: Api<Lease> = Api::namespaced(self.admin().await, namespace);
        api.delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete lease: {e}"));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.owned {
            self.stop();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A unique lowercase suffix for Lease names.
pub fn unique(prefix: &str) -> String {
    let mut b = [0u8; 4];
    getrandom_fill(&mut b);
    format!("{prefix}-{:08x}", u32::from_le_bytes(b))
}

fn getrandom_fill(b: &mut [u8]) {
    // A tenure holder token is 16 random bytes from the OS source; borrow 4 of them.
    let t = tenure::backend::HolderToken::random();
    b.copy_from_slice(&t.as_bytes()[..b.len()]);
}

/// The Leases in `leases`' namespace whose names begin with `prefix`: a group's member
/// Leases (`<group>-member-<hash>`), named after identities the test does not know.
pub async fn leases_named_from(leases: &Api<Lease>, prefix: &str) -> Vec<Lease> {
    leases
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("list leases: {e}"))
        .items
        .into_iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect()
}

/// Applies the committed `Election` CRD (server-side apply; idempotent, so every test may
/// call it) and waits until the API server has established it and serves the resource.
#[cfg(feature = "crd")]
pub async fn install_crd(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};
    use tenure::crd::{CRD_NAME, Election};

    let path = repo().join("crds/election.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("parse: {e}"));
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(
        CRD_NAME,
        &PatchParams::apply("tenure-crd-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap_or_else(|e| panic!("apply the CRD: {e}"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = api.get(CRD_NAME).await.unwrap_or_else(|e| panic!("{e}"));
        let conditions = got.status.and_then(|s| s.conditions).unwrap_or_default();
        let is = |t: &str| {
            conditions
                .iter()
                .any(|c| c.type_ == t && c.status == "True")
        };
        assert!(
            !is("NonStructuralSchema"),
            "the API server finds the schema non-structural: {conditions:?}"
        );
        if is("Established") && is("NamesAccepted") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "CRD not established: {conditions:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Established can come a moment before the resource is served.
    let probe: Api<Election> = Api::namespaced(client.clone(), "default");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Err(e) = probe.list(&Default::default()).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "elections not served: {e}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The process groups of `pid`'s children: a `tenure run` leads none, each term's command
/// leads its own. Freezing `pid` and these (SIGSTOP) pauses a replica as a frozen pod would.
pub fn child_process_groups(pid: u32) -> Vec<i32> {
    let Ok(children) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) else {
        return Vec::new();
    };
    children
        .split_whitespace()
        .filter_map(|c| c.parse::<i32>().ok())
        .filter_map(|c| {
            let stat = std::fs::read_to_string(format!("/proc/{c}/stat")).ok()?;
            // Fields after the command name (which may hold spaces): state ppid pgrp …
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().nth(2)?.parse().ok()
        })
        .collect()
}

/// The writes in `history` (each version of an object as (writer's token, its counter), in
/// the API server's order) that landed after a write of a newer term: (token, counter, the
/// newer token). A fence lets none through.
pub fn landed_after_newer(history: &[(u64, u64)]) -> Vec<(u64, u64, u64)> {
    let mut newest = 0;
    let mut stale = Vec::new();
    for &(token, i) in history {
        if token < newest {
            stale.push((token, i, newest));
        }
        newest = newest.max(token);
    }
    stale
}

/// A shell loop that annotates the ConfigMap `target` with `w=<its term's token>-<i>` through
/// kubectl as fast as it can (`HOME` at `home`, for kubectl's discovery cache), logging each
/// attempt to `log` as `ok TOKEN I` or `refused TOKEN I <kubectl's message on one line>`: the
/// writer of the freeze-and-thaw rounds of `tenure run --fence`.
pub fn kubectl_writer_loop(home: &Path, log: &Path) -> Vec<String> {
    let script = format!(
        r#"export HOME={home}
i=0
while :; do
  i=$((i+1))
  if out=$({kubectl} annotate configmap target --overwrite "w=$TENURE_FENCING_TOKEN-$i" 2>&1); then
    echo "ok $TENURE_FENCING_TOKEN $i" >> {log}
  else
    echo "refused $TENURE_FENCING_TOKEN $i $(printf %s "$out" | tr '\n' ' ')" >> {log}
  fi
done"#,
        home = home.display(),
        kubectl = kubectl().display(),
        log = log.display(),
    );
    vec!["sh".into(), "-c".into(), script]
}
