//! How a backend is configured and built: [`KubeOptions`], the namespace check, and the
//! constructors (from a client, the environment, a kubeconfig file or a kube `Config`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::KubeBackend;
use super::inner::Inner;
use super::{client, error, record};
use crate::backend::{BackendError, BackendErrorKind};

/// The default bound on each API request: a guard against a request that is never answered
/// (a dead connection), not a latency bound.
///
/// Whoever drives the backend bounds each of its operations itself, by how long an answer is
/// of use: the lock runtime a renewal by the renew deadline, the sharded elector a group read
/// by a lease (see their `request_timeout`). Under that, a bound of the backend's own only
/// throws away answers they still wanted: at 1.5 s (the default until #42), a renewal of an
/// 8 s lease answered in 1.6 s by a loaded API server was cut, its retry came a retry period
/// later, past the renew deadline, and the term ended though the write had landed. 10 s is
/// above the default election's renew window (the renewal sent at a third of the 15 s lease,
/// the deadline at 10 s); the backend's own requests (the watch's list, Events, access
/// reviews, completion records) are sent again after it.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Options of a [`KubeBackend`]. Every field has a default.
///
/// | option | default |
/// |---|---|
/// | [`namespace`](Self::namespace) | the client's default namespace (the kubeconfig context's, or the pod's) |
/// | [`request_timeout`](Self::request_timeout) | [`DEFAULT_REQUEST_TIMEOUT`] (10 s) |
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct KubeOptions {
    namespace: Option<String>,
    request_timeout: Option<Duration>,
}

impl KubeOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The namespace the Leases live in.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The bound on each API request (the watch aside; default [`DEFAULT_REQUEST_TIMEOUT`]).
    /// The lock runtime and the sharded elector bound each of their operations as well (an
    /// operation can make a few requests when writes conflict), and the shorter bound wins:
    /// set this below theirs only to give up on each request sooner than they would.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }
}

impl KubeBackend {
    /// A backend on a client you already have (a kube-rs operator's), with `options`; the
    /// namespace defaults to the client's.
    ///
    /// A client built by kube's `Client::try_from` / `Client::try_default` leaves Nagle's
    /// algorithm on, which [`from_config`](Self::from_config) (and [`infer`](Self::infer))
    /// avoid: see there.
    ///
    /// # Errors
    ///
    /// [`BackendErrorKind::Config`] if the namespace is not a valid namespace name (a DNS-1123
    /// label) or the request timeout is zero.
    pub fn from_client(client: kube::Client, options: KubeOptions) -> Result<Self, BackendError> {
        let namespace = options
            .namespace
            .unwrap_or_else(|| client.default_namespace().to_owned());
        validate_namespace(&namespace)?;
        let timeout = options.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT);
        if timeout.is_zero() {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                "request_timeout must be positive",
            ));
        }
        Ok(Self::build(client, namespace, timeout))
    }

    /// A backend from the environment's configuration: the in-cluster service account, or
    /// `$KUBECONFIG` / `~/.kube/config` (kube's `Config::infer`).
    ///
    /// # Errors
    ///
    /// [`BackendErrorKind::Config`] if no usable configuration is found, or as
    /// [`from_client`](Self::from_client).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads configuration.
    pub async fn infer(options: KubeOptions) -> Result<Self, BackendError> {
        let config = kube::Config::infer().await.map_err(|e| {
            error::config(
                "no Kubernetes configuration found (in-cluster service account, $KUBECONFIG or ~/.kube/config)",
                e,
            )
        })?;
        Self::from_config(config, options)
    }

    /// A backend from the kubeconfig file at `path`, using its current context.
    ///
    /// # Errors
    ///
    /// [`BackendErrorKind::Config`] if the file cannot be read or used, or as
    /// [`from_client`](Self::from_client).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads configuration.
    pub async fn from_kubeconfig(
        path: impl AsRef<Path>,
        options: KubeOptions,
    ) -> Result<Self, BackendError> {
        let path = path.as_ref();
        let what = format!("kubeconfig {}", path.display());
        let kubeconfig =
            kube::config::Kubeconfig::read_from(path).map_err(|e| error::config(&what, e))?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| error::config(&what, e))?;
        Self::from_config(config, options)
    }

    /// A backend from a kube `Config` (to add headers, say, or build it by other means).
    ///
    /// Like [`infer`](Self::infer) and [`from_kubeconfig`](Self::from_kubeconfig), it builds
    /// a client that sets `TCP_NODELAY`: kube's default client does not, which costs about
    /// 40 ms on the first request of every new connection (the TLS handshake's last flight
    /// waits for a delayed ACK) — and a follower's takeover write is often exactly that
    /// request, its pooled connection being busy with the watch. A config with a proxy gets
    /// kube's own client.
    ///
    /// # Errors
    ///
    /// [`BackendErrorKind::Config`] if the TLS or authentication setup fails, or as
    /// [`from_client`](Self::from_client).
    pub fn from_config(config: kube::Config, options: KubeOptions) -> Result<Self, BackendError> {
        Self::from_client(client::build(config)?, options)
    }

    fn build(client: kube::Client, namespace: String, request_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner::new(client, namespace, request_timeout)),
        }
    }

    /// The namespace the Leases live in.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The bound on each API request.
    #[must_use]
    pub fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }
}

fn validate_namespace(ns: &str) -> Result<(), BackendError> {
    if record::is_dns1123_label(ns) {
        Ok(())
    } else {
        Err(BackendError::new(
            BackendErrorKind::Config,
            format!(
                "invalid namespace {ns:?}: a namespace must be a DNS-1123 label (at most 63 \
                 lowercase alphanumeric characters or '-', starting and ending with an \
                 alphanumeric character)"
            ),
        ))
    }
}
