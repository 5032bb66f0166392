//! The benches' kube-apiserver (`kube_harness::Server`) with an audit log, which attributes
//! every request to its sender's User-Agent; and the clients' side of that attribution.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::kube_harness::{Launch, Server};

/// Metadata of every request on Leases, nothing else.
pub const LEASE_AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n\
     - level: Metadata\n  resources:\n  - group: coordination.k8s.io\n    resources: [\"leases\"]\n\
     - level: None\n";

/// Starts a server whose audit log, `DIR/audit.log` (JSON, written before each answer),
/// follows `policy` (written to `DIR/policy.yaml`); returns it and the log's path.
pub fn start_audited(dir: &Path, policy: &str) -> (Server, PathBuf) {
    let policy_file = dir.join("policy.yaml");
    let audit = dir.join("audit.log");
    std::fs::write(&policy_file, policy).unwrap_or_else(|e| panic!("audit policy: {e}"));
    let server = Server::start(Launch {
        extra: vec![
            format!("--audit-policy-file={}", policy_file.display()),
            format!("--audit-log-path={}", audit.display()),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
        ],
        ..Launch::default()
    });
    (server, audit)
}

/// The audit log's events so far, read as they are iterated (lines that do not parse, such as
/// one being written, are left out).
pub fn audit_events(audit: &Path) -> impl Iterator<Item = Value> {
    std::fs::File::open(audit).into_iter().flat_map(|f| {
        BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .filter_map(|line| serde_json::from_str(&line).ok())
    })
}

/// An audit event's time field (`requestReceivedTimestamp`, `stageTimestamp`).
pub fn timestamp(v: &Value) -> Option<SystemTime> {
    v.as_str()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(SystemTime::from)
}

/// A kube config from `kubeconfig` whose requests carry `user_agent` (the audit log's name for
/// the process).
pub async fn config_as(kubeconfig: &str, user_agent: &str) -> Result<kube::Config, String> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(user_agent).map_err(|e| e.to_string())?,
    ));
    Ok(config)
}

/// A duration as Go's `time.ParseDuration` reads it (for the Go peers' flags).
pub fn go_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// A Go peer's command (`clientgo-candidate`, `controller-runtime-peer`), with the flags they
/// share: the kubeconfig, the Lease, the identity, and the durations (lease, renew deadline,
/// retry period).
pub fn go_peer(
    bin: &Path,
    kubeconfig: &Path,
    namespace: &str,
    lease: &str,
    identity: &str,
    (lease_duration, renew_deadline, retry_period): (Duration, Duration, Duration),
) -> std::process::Command {
    let mut c = std::process::Command::new(bin);
    c.arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "--namespace",
            namespace,
            "--lease",
            lease,
            "--identity",
            identity,
        ])
        .args(["--lease-duration", &go_duration(lease_duration)])
        .args(["--renew-deadline", &go_duration(renew_deadline)])
        .args(["--retry-period", &go_duration(retry_period)]);
    c
}

/// A `Locker` named `identity` on Leases in `namespace`, through `config`.
pub fn locker(
    config: kube::Config,
    namespace: &str,
    identity: &str,
) -> Result<tenure::Locker, String> {
    use tenure::backend::kube::{KubeBackend, KubeOptions};
    let backend = KubeBackend::from_config(config, KubeOptions::new().namespace(namespace))
        .map_err(|e| e.to_string())?;
    tenure::Locker::with_identity(backend, identity).map_err(|e| e.to_string())
}

/// A `LeaderElector` of Lease `lease` in `namespace`, as `identity`, through `config`, with
/// these durations: lease, renew deadline, retry period.
pub fn elector(
    config: kube::Config,
    namespace: &str,
    lease: &str,
    identity: &str,
    (lease_duration, renew_deadline, retry_period): (Duration, Duration, Duration),
) -> Result<tenure::election::LeaderElector, String> {
    let election = tenure::election::ElectionConfig::new()
        .lease_duration(lease_duration)
        .renew_deadline(renew_deadline)
        .retry_period(retry_period);
    tenure::election::LeaderElector::new(locker(config, namespace, identity)?, lease, election)
        .map_err(|e| e.to_string())
}
