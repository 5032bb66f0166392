//! Turns `--backend` and its companion flags into a connected lease store.

use std::sync::Arc;

use tenure::Backend;
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::backend::local::{self, LocalBackend};
use tenure::backend::redis::{RedisBackend, RedisConfig};
use tenure::crd::ElectionBackend;

use crate::args::BackendArgs;
use crate::error::CliError;

/// The environment variable a Redis password may come from.
pub const REDIS_PASSWORD_ENV: &str = "TENURE_REDIS_PASSWORD";

/// The environment variable `--backend` may come from.
pub const BACKEND_ENV: &str = "TENURE_BACKEND";

/// Whether tenure's environment holds a Redis password: `$TENURE_REDIS_PASSWORD`, or a
/// `$TENURE_BACKEND` URL with one.
pub fn environment_holds_secret() -> bool {
    !secret_env_vars().is_empty()
}

/// The variables of tenure's environment that hold a secret, which the command must not
/// inherit: `$TENURE_REDIS_PASSWORD`, and `$TENURE_BACKEND` when its URL has a password. A
/// `$TENURE_BACKEND` without one is passed on, so a `tenure status` in the command finds the
/// same store. (`$TENURE_REDIS_PASSWORD_FILE` is only a path, and is passed on.)
pub fn secret_env_vars() -> Vec<&'static str> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let mut names = Vec::new();
    if set(REDIS_PASSWORD_ENV).is_some() {
        names.push(REDIS_PASSWORD_ENV);
    }
    if set(BACKEND_ENV).is_some_and(|url| url_has_password(&url.to_string_lossy())) {
        names.push(BACKEND_ENV);
    }
    names
}

/// The most `--redis-password-file` may hold, in bytes: passwords are far shorter, and a
/// bound keeps a wrong path (`/dev/zero`, a log file) from being read without end.
const MAX_PASSWORD_FILE: u64 = 4096;

/// The most `--redis-ca-file` may hold, in bytes: a whole system CA bundle is ~200 KiB.
const MAX_CA_FILE: u64 = 1024 * 1024;

/// A connected store and how to describe it (never with secrets).
pub struct Connected {
    /// The store.
    pub backend: Arc<dyn Backend>,
    /// `local /run/user/1000/tenure`, `kube namespace default`, `redis://host:6379/0`.
    pub description: String,
    /// Where the lease lives, as the Election custom resource describes it.
    pub election_backend: ElectionBackend,
    /// The Kubernetes backend, for what only it can do (check its permissions at start).
    pub kube: Option<KubeBackend>,
}

impl Connected {
    /// Registers the backend's own metrics (Kubernetes: Lease records it could not parse).
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        if self.kube.is_some() {
            tenure::backend::kube::register_read_metrics(registry);
        }
    }
}

/// Connects to the configured backend. `campaigning` (`tenure run`) prints the single-host
/// warning when the local backend was chosen by default, and refuses a Kubernetes namespace
/// nobody chose.
pub async fn connect(args: &BackendArgs, campaigning: bool) -> Result<Connected, CliError> {
    match args.backend.as_deref().map(str::trim) {
        None | Some("") => {
            let c = local(args)?;
            if campaigning {
                eprintln!(
                    "tenure: warning: no --backend given: using the local backend ({}); it gives NO mutual exclusion across hosts. Use --backend kube or --backend redis://… for replicas on several machines.",
                    crate::error::printable(&c.description)
                );
            }
            Ok(c)
        }
        Some("local") => local(args),
        Some("kube" | "kubernetes") => kube(args, campaigning).await,
        Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {
            redis(url, args).await
        }
        Some(other) => Err(CliError::Config {
            message: format!(
                "--backend {:?}: expected local, kube, or a redis:// or rediss:// URL",
                redact_url(other)
            ),
        }),
    }
}

fn local(args: &BackendArgs) -> Result<Connected, CliError> {
    let dir = args
        .state_dir
        .clone()
        .unwrap_or_else(local::default_state_dir);
    let backend = LocalBackend::open(&dir)
        .map_err(|e| CliError::backend(&format!("local state directory {}", dir.display()), &e))?;
    Ok(Connected {
        backend: Arc::new(backend),
        description: format!("local {}", dir.display()),
        election_backend: ElectionBackend::local(),
        kube: None,
    })
}

/// Outside a pod, the kubeconfig's current context when it names no namespace (kube-rs would
/// then use `default`); `None` in a pod (the service account's namespace is the pod's), with a
/// namespace in the context, or when no kubeconfig can be read (connecting reports that).
fn unnamespaced_context() -> Option<String> {
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return None;
    }
    let kubeconfig = kube::config::Kubeconfig::read().ok()?;
    let current = kubeconfig.current_context.clone()?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == current)?
        .context
        .as_ref()?;
    context
        .namespace
        .as_deref()
        .is_none_or(str::is_empty)
        .then_some(current)
}

/// A Kubernetes client from the in-cluster service account, `$KUBECONFIG` or
/// `~/.kube/config`, for the commands that use the API beside a lease store (`purpose` names
/// them in the error); its default namespace is the config's.
pub async fn kube_client(purpose: &str) -> Result<kube::Client, CliError> {
    let config = kube::Config::infer().await.map_err(|e| CliError::Backend {
        message: format!(
            "{purpose} needs Kubernetes access (in-cluster service account, $KUBECONFIG or ~/.kube/config): {e}"
        ),
    })?;
    kube::Client::try_from(config).map_err(|e| CliError::Backend {
        message: format!("{purpose}: cannot build a Kubernetes client: {e}"),
    })
}

async fn kube(args: &BackendArgs, campaigning: bool) -> Result<Connected, CliError> {
    let mut options = KubeOptions::new();
    if let Some(ns) = &args.namespace {
        options = options.namespace(ns.clone());
    } else if campaigning && let Some(context) = unnamespaced_context() {
        // Every replica must campaign on the same Lease: one that falls back to `default`
        // while another runs with --namespace or another kubeconfig campaigns on a different
        // Lease, and both lead.
        return Err(CliError::Config {
            message: format!(
                "--backend kube: no namespace chosen: --namespace and $POD_NAMESPACE are unset and the kubeconfig's context {context:?} names none, so the Lease's namespace would silently be `default`, where a replica started with another kubeconfig or --namespace would not campaign; give --namespace NS (every replica the same), or set the context's namespace (kubectl config set-context --current --namespace NS)"
            ),
        });
    }
    let backend = KubeBackend::infer(options)
        .await
        .map_err(|e| CliError::backend("kube backend", &e))?;
    Ok(Connected {
        description: format!("kube namespace {}", backend.namespace()),
        election_backend: ElectionBackend::kubernetes().namespace(backend.namespace()),
        kube: Some(backend.clone()),
        backend: Arc::new(backend),
    })
}

async fn redis(url: &str, args: &BackendArgs) -> Result<Connected, CliError> {
    let mut config = RedisConfig::new(url).map_err(|e| CliError::Config {
        message: format!("--backend: {}", crate::error::chain(&e)),
    })?;
    if url_has_password(url) {
        if args.backend_from_env {
            eprintln!(
                "tenure: warning: ${BACKEND_ENV} contains a password, which processes of the same user can read in the environment (/proc/PID/environ) of every process started with it; tenure keeps it from the command, but prefer --redis-password-file"
            );
        } else {
            eprintln!(
                "tenure: warning: the --backend URL contains a password, which other users can read in the process list; use ${REDIS_PASSWORD_ENV} or --redis-password-file instead"
            );
        }
    }
    if let Some(user) = &args.redis_username {
        config = config.username(user);
    }
    if let Some(path) = &args.redis_password_file {
        let flag = "--redis-password-file";
        let bytes = read_bounded(flag, path, MAX_PASSWORD_FILE)?;
        let password = String::from_utf8(bytes).map_err(|_| CliError::Config {
            message: format!("{flag} {}: not UTF-8 text", path.display()),
        })?;
        config = config.password(password.trim_end_matches(['\n', '\r']));
    } else if let Ok(password) = std::env::var(REDIS_PASSWORD_ENV)
        && !password.is_empty()
    {
        config = config.password(&password);
    }
    if let Some(path) = &args.redis_ca_file {
        let pem = read_bounded("--redis-ca-file", path, MAX_CA_FILE)?;
        config = config.ca_certificate_pem(pem);
    }
    if let Some(prefix) = &args.key_prefix {
        config = config.key_prefix(prefix);
    }
    if args.redis_cluster {
        config = config.cluster();
    }
    let mut election_backend = ElectionBackend::redis();
    if let Some(prefix) = &args.key_prefix {
        election_backend = election_backend.key_prefix(prefix.clone());
    }
    let description = config.redacted_url();
    let backend = RedisBackend::connect(config)
        .await
        .map_err(|e| CliError::backend(&format!("redis {description}"), &e))?;
    Ok(Connected {
        backend: Arc::new(backend),
        description,
        election_backend,
        kube: None,
    })
}

/// Reads at most `max` bytes of the file at `path` named by `flag`, from any kind of file (a
/// pipe such as `/dev/stdin` too); a longer one is refused, naming the flag and the bound.
fn read_bounded(flag: &str, path: &std::path::Path, max: u64) -> Result<Vec<u8>, CliError> {
    use std::io::Read as _;
    let fail = |e: std::io::Error| CliError::Config {
        message: format!("{flag} {}: {e}", path.display()),
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(fail)?
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(fail)?;
    if bytes.len() as u64 > max {
        return Err(CliError::Config {
            message: format!(
                "{flag} {}: longer than {max} bytes; is it the right file?",
                path.display()
            ),
        });
    }
    Ok(bytes)
}

/// Whether a URL carries a password in its user-info part.
fn url_has_password(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

/// A backend string with what may hold a secret replaced, for error messages: the user-info
/// (`user:password@`) and the query (`?password=…`, which `redis+unix://` URLs use) and
/// fragment.
fn redact_url(s: &str) -> String {
    let (scheme, rest) = match s.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), s),
    };
    let (rest, query) = match rest.find(['?', '#']) {
        Some(i) => (&rest[..i], "?***"),
        None => (rest, ""),
    };
    // The user-info ends at the last '@' (a password may hold '@'); a path may hold '@' too,
    // so everything up to it goes.
    let rest = match rest.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => rest.to_owned(),
    };
    format!("{scheme}{rest}{query}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_spotted_and_redacted() {
        assert!(url_has_password("redis://:hunter2@127.0.0.1:6379"));
        assert!(url_has_password("rediss://user:hunter2@h:6380/0"));
        assert!(!url_has_password("redis://127.0.0.1:6379/0"));
        for url in [
            "memcached://u:hunter2@h",
            "redis+unix:///tmp/x.sock?pass=hunter2",
            "redis+unix:///tmp/x.sock?db=0&password=hunter2",
            "redis+unix://:hunter2@/tmp/x.sock",
            "unix:///tmp/x.sock#hunter2",
            "redis://u:p@ss:hunter2@h/0",
            "hunter2@h",
        ] {
            let shown = redact_url(url);
            assert!(!shown.contains("hunter2"), "{url} → {shown}");
        }
        assert_eq!(
            redact_url("redis+unix:///tmp/x.sock?pass=hunter2"),
            "redis+unix:///tmp/x.sock?***"
        );
        assert_eq!(redact_url("etcd://h:2379"), "etcd://h:2379");
    }
}
