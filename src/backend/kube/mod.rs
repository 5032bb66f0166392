//! The Kubernetes backend: one `coordination.k8s.io/v1` Lease per lock, written exactly as
//! client-go's leader election writes it, so Go and Rust replicas can share one Lease.
//!
//! # The Lease record
//!
//! | field | written as |
//! |---|---|
//! | `spec.holderIdentity` | the locker's identity; `""` after a release |
//! | `spec.leaseDurationSeconds` | the ttl rounded **up** to whole seconds; `1` after a release |
//! | `spec.acquireTime` | when the term began (kept by renewals); the release time after a release |
//! | `spec.renewTime` | the latest write (MicroTime) |
//! | `spec.leaseTransitions` | +1 whenever the holder identity changes, as client-go counts |
//! | `metadata.annotations["tenure.dev/holder-token"]` | the term's 128-bit holder token (hex) |
//! | `metadata.annotations["tenure.dev/holder-identity"]` | the identity that token was issued to |
//! | `metadata.annotations["tenure.dev/fencing"]` | the term's fencing token, once the first renewal wrote it |
//! | `metadata.annotations["tenure.dev/released-token"]` | the holder token that released last |
//!
//! Every write is a `PUT` carrying the `resourceVersion` it was computed from (a
//! compare-and-swap: a `409 Conflict` means someone else wrote first, and the backend reads
//! again and decides afresh, never retrying blindly); a missing Lease is created (`POST`), and
//! `409 AlreadyExists` means another candidate created it first: read again.
//!
//! # Fencing token
//!
//! The `resourceVersion` returned by the acquiring write, as a `u64`: etcd's global revision,
//! strictly increasing across holders and across a delete and re-create of the Lease, and
//! comparable by contract since Kubernetes 1.35 (KEP-5504). A `resourceVersion` that is not an
//! integer fails closed with [`BackendErrorKind::Protocol`]. The acquiring write cannot
//! contain its own `resourceVersion`, so a second write right after the grant (before the
//! grant is returned) stamps it into the `tenure.dev/fencing` annotation; a replayed acquire
//! returns it. The acquiring write itself raises `tenure.dev/fencing-floor` above every
//! earlier term's token, which is what the API server's fencing policy compares
//! ([`crate::fence::kube`]). A backend instance also
//! refuses (fails closed) a grant whose `resourceVersion` is not above every one it has seen,
//! which catches an etcd restored from a backup while the process runs.
//!
//! **Assumption:** tokens rise only as long as the etcd behind the API server keeps its
//! revision history; an etcd rebuilt from scratch restarts revisions near zero.
//!
//! # Time
//!
//! A candidate that does not hold the Lease treats it as expired only after
//! `leaseDurationSeconds` have passed on *its own* monotonic clock since it last saw the
//! record change (a new `resourceVersion`), exactly as client-go does. `renewTime` is never
//! used for decisions, so clock skew between machines changes nothing; the price, as in
//! client-go, is that a candidate that has just started waits a full lease duration before
//! taking over a lease whose holder has died.
//!
//! # Notifications
//!
//! [`observe`](Backend::observe) runs one watch per Lease (field selector
//! `metadata.name=NAME`) however many observers there are. The watch also keeps this
//! backend's view of the Lease current, so while it is synced, [`try_acquire`] on a lease
//! held by a live holder answers from that view and sends **no request**: a waiting follower
//! costs one long-running watch, not one `GET` per retry. Observers are told of grants and
//! releases only, never of renewals. If the watch breaks, reads go to the server again until
//! it is back.
//!
//! [`try_acquire`]: Backend::try_acquire
//!
//! # Permissions
//!
//! A Role in the Lease's namespace:
//!
//! ```yaml
//! apiVersion: rbac.authorization.k8s.io/v1
//! kind: Role
//! metadata: { name: tenure-leases, namespace: my-namespace }
//! rules:
//! - apiGroups: ["coordination.k8s.io"]
//!   resources: ["leases"]
//!   verbs: ["get", "list", "watch", "create", "update"]
//! - apiGroups: [""]          # optional: the "became leader" / "stopped leading" Events
//!   resources: ["events"]
//!   verbs: ["create"]
//! ```
//!
//! A missing permission fails with [`BackendErrorKind::PermissionDenied`], naming the verb.
//! [`KubeBackend::missing_permissions`] asks the API server beforehand what is missing on a
//! Lease; `tenure run` does, and refuses to campaign without it (exit 4).
//! Without `list` and `watch`, [`observe`](Backend::observe) reports the error and waiters
//! fall back to reading on every retry. Without `create` on events, the Events
//! ([`announce`](Backend::announce)) are skipped (logged at debug level); the lease is
//! unaffected.
//!
//! # Interoperability with client-go
//!
//! A client-go elector reads tenure's record as an ordinary LeaderElectionRecord, and tenure
//! reads client-go's: either takes over after the other releases (holder cleared) or after
//! the lease duration has passed on its own clock. A client-go holder has no fencing token;
//! tenure reports its term by the record's `resourceVersion`. Two electors must never share
//! an identity: client-go cannot tell them apart (tenure can, by the holder token).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tenure::backend::kube::{KubeBackend, KubeOptions};
//! use tenure::{LockOptions, Locker};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = KubeBackend::infer(KubeOptions::new().namespace("my-namespace")).await?;
//! let locker = Locker::new(backend);
//! let opts = LockOptions::new().ttl(Duration::from_secs(15)).wait(Duration::from_secs(60));
//! locker
//!     .with_lock("nightly-report", &opts, |guard| async move {
//!         // Pass guard.fencing_token() to whatever this writes.
//!     })
//!     .await?;
//! # Ok(()) }
//! ```

mod access;
mod client;
mod error;
mod members;
pub(crate) mod record;
mod state;
mod watch;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use tokio::time::Instant;

use super::{
    AcquireRequest, Acquired, Backend, BackendError, BackendErrorKind, FencingToken, HolderChange,
    HolderToken, InvalidName, LeadershipEvent, LeaseRecord, Member, Released, Renewed,
};
use error::Op;
pub use record::{
    ANNOTATION_PREFIX, FENCING as FENCING_ANNOTATION, FENCING_FLOOR as FENCING_FLOOR_ANNOTATION,
    HOLDER_IDENTITY as HOLDER_IDENTITY_ANNOTATION, HOLDER_TOKEN as HOLDER_TOKEN_ANNOTATION,
    MAX_NAME_LEN, RELEASED_TOKEN as RELEASED_TOKEN_ANNOTATION,
};
use state::{Current, LockState, Own};

/// The default bound on each API request: below the default retry period (2 s), so
/// one slow request never costs more than one retry.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);

/// How many read-decide-write rounds one operation makes when its writes keep conflicting.
const ROUNDS: usize = 4;

/// Options of a [`KubeBackend`]. Every field has a default.
///
/// | option | default |
/// |---|---|
/// | [`namespace`](Self::namespace) | the client's default namespace (the kubeconfig context's, or the pod's) |
/// | [`request_timeout`](Self::request_timeout) | [`DEFAULT_REQUEST_TIMEOUT`] (1.5 s) |
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

    /// The bound on each API request (the watch aside). Keep it below the retry period of
    /// whatever drives the backend. The lock runtime applies its own `request_timeout` around
    /// each operation as well; an operation can make up to a few requests when writes conflict.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }
}

/// A lease store on Kubernetes `coordination.k8s.io/v1` Leases. See the [module
/// docs](self) for the record layout, the fencing token, time and permissions.
///
/// Cheap to clone: clones share the client, the per-Lease observations and the watches.
#[derive(Clone)]
pub struct KubeBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend")
            .field("namespace", &self.inner.namespace)
            .field("request_timeout", &self.inner.request_timeout)
            .finish_non_exhaustive()
    }
}

/// The shared state of a backend and its watch tasks.
struct Inner {
    api: Api<Lease>,
    namespace: String,
    request_timeout: Duration,
    locks: Mutex<HashMap<Arc<str>, LockState>>,
    /// The highest resourceVersion this backend has seen on any Lease: every later write's
    /// is higher (etcd revisions are global), so a grant at or below it means etcd went
    /// backwards, and is refused.
    max_rv: AtomicU64,
    /// The resourceVersion of each member Lease this backend wrote last (sharded
    /// leadership): the next announcement replaces it with one request.
    member_versions: Mutex<HashMap<String, String>>,
}

impl KubeBackend {
    /// A backend on `client`, in the client's default namespace, with default options.
    ///
    /// Prefer [`from_config`](Self::from_config) (or [`infer`](Self::infer)) to a client
    /// built by kube's `Client::try_from`: see there about `TCP_NODELAY`.
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        let namespace = client.default_namespace().to_owned();
        Self::build(client, namespace, DEFAULT_REQUEST_TIMEOUT)
    }

    /// A backend on `client` with `options`.
    ///
    /// # Errors
    ///
    /// [`BackendErrorKind::Config`] if the namespace is not a valid namespace name (a DNS-1123
    /// label) or the request timeout is zero.
    pub fn with_options(client: kube::Client, options: KubeOptions) -> Result<Self, BackendError> {
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
    /// [`with_options`](Self::with_options).
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
    /// [`with_options`](Self::with_options).
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
    /// [`with_options`](Self::with_options).
    pub fn from_config(config: kube::Config, options: KubeOptions) -> Result<Self, BackendError> {
        Self::with_options(client::build(config)?, options)
    }

    fn build(client: kube::Client, namespace: String, request_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                api: Api::namespaced(client, &namespace),
                namespace,
                request_timeout,
                locks: Mutex::new(HashMap::new()),
                max_rv: AtomicU64::new(0),
                member_versions: Mutex::new(HashMap::new()),
            }),
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

/// Why a write or read did not succeed, for the caller to decide.
enum Fail {
    NotFound,
    /// 409: `Conflict` on an update, `AlreadyExists` on a create.
    Conflict,
    Error(BackendError),
}

impl Inner {
    fn locks(&self) -> MutexGuard<'_, HashMap<Arc<str>, LockState>> {
        // Nothing panics while this lock is held; recover rather than propagate a poison.
        self.locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn op<'a>(&'a self, verb: &'static str, name: &'a str) -> Op<'a> {
        Op {
            verb,
            resource: error::LEASES,
            namespace: &self.namespace,
            name,
        }
    }

    /// Runs one request under the request timeout.
    async fn call<T>(
        &self,
        op: Op<'_>,
        request: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, Fail> {
        match tokio::time::timeout(self.request_timeout, request).await {
            Err(_) => Err(Fail::Error(BackendError::timeout(
                &op.to_string(),
                self.request_timeout,
            ))),
            Ok(Ok(v)) => Ok(v),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Err(Fail::NotFound),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => Err(Fail::Conflict),
            Ok(Err(e)) => Err(Fail::Error(error::map(e, op))),
        }
    }

    /// Records what a read or write returned; returns the lock's view after it.
    fn note(
        &self,
        name: &Arc<str>,
        lease: Option<Lease>,
        authoritative: bool,
    ) -> Result<Current, BackendError> {
        let lease = match lease {
            Some(l) => {
                let rv = record::parse_resource_version(&l)?;
                self.max_rv.fetch_max(rv, Ordering::Relaxed);
                Some((l, rv))
            }
            None => None,
        };
        let now = Instant::now();
        let mut locks = self.locks();
        let st = locks.entry(name.clone()).or_default();
        st.note(lease, authoritative, now);
        Ok(st.known.clone().unwrap_or(Current::Absent))
    }

    /// The Lease now: from the watch-fed view if `cached` is allowed and the watch is synced,
    /// otherwise from the server.
    async fn read(&self, name: &Arc<str>, cached: bool) -> Result<Current, BackendError> {
        if cached {
            let locks = self.locks();
            if let Some(st) = locks.get(name)
                && st.live
                && let Some(known) = &st.known
            {
                return Ok(known.clone());
            }
        }
        let op = self.op("get", name);
        let lease = match self.call(op, self.api.get(name)).await {
            Ok(l) => Some(l),
            Err(Fail::NotFound) => None,
            Err(Fail::Conflict) => {
                return Err(BackendError::new(
                    BackendErrorKind::Protocol,
                    format!("{op}: unexpected 409"),
                ));
            }
            Err(Fail::Error(e)) => return Err(e),
        };
        self.note(name, lease, true)
    }

    /// The view, if this backend's grant to `holder` is current in it.
    fn own_view(&self, name: &str, holder: &HolderToken) -> (Option<Current>, Option<Own>) {
        let locks = self.locks();
        let Some(st) = locks.get(name) else {
            return (None, None);
        };
        let own = st.own_of(holder);
        let cached = own.and(st.known.clone()).filter(|k| {
            matches!(k, Current::Present(s) if record::View::of(&s.lease).token == Some(*holder))
        });
        (cached, own)
    }

    fn forget(&self, name: &str, holder: &HolderToken) {
        let mut locks = self.locks();
        if let Some(st) = locks.get_mut(name) {
            st.forget(holder);
            if st.is_idle() {
                locks.remove(name);
            }
        }
    }

    /// A grant succeeded with `lease`; `fencing` is the original token of a replay, `None` for
    /// a new term (whose token is the write's resourceVersion, which must exceed `floor`).
    fn granted(
        &self,
        name: &Arc<str>,
        req: &AcquireRequest,
        lease: Lease,
        sent: Instant,
        fencing: Option<FencingToken>,
        floor: u64,
    ) -> Result<Acquired, BackendError> {
        let rv = record::parse_resource_version(&lease)?;
        if fencing.is_none() && rv <= floor {
            return Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!(
                    "lease {}/{name}: the acquiring write got resourceVersion {rv}, not above \
                     {floor} seen earlier; etcd's revisions went backwards (restored or \
                     replaced?), so fencing tokens would not rise: refusing the grant",
                    self.namespace
                ),
            ));
        }
        let fencing = fencing.unwrap_or(FencingToken::new(rv));
        let duration = Duration::from_secs(
            record::lease_duration_seconds(req.ttl)
                .unsigned_abs()
                .into(),
        );
        self.note(name, Some(lease), true)?;
        if let Some(st) = self.locks().get_mut(name) {
            st.own = Some(Own {
                holder: req.holder,
                fencing,
                last_sent: sent,
                duration,
            });
        }
        Ok(Acquired::Granted { fencing })
    }

    /// Records a new term's exact fencing token in the Lease at once (the acquiring write
    /// cannot contain its own `resourceVersion`), before the grant is returned and so before
    /// the term's workload starts: observers and the API server's fencing policy see the
    /// token one write after the grant. The acquiring write already raised
    /// [`record::FENCING_FLOOR`] above every earlier term's token, so the policy refuses the
    /// previous leader from the grant itself; the stamp makes the floor exact. If it fails
    /// (a foreign write in between, a transient error), the first renewal stamps instead.
    async fn stamp(
        &self,
        name: &Arc<str>,
        req: &AcquireRequest,
        granted: Lease,
        acquired: &Acquired,
    ) {
        let Acquired::Granted { fencing } = acquired else {
            return;
        };
        let mut lease = granted;
        record::renewed(&mut lease, req.ttl, Some(*fencing));
        let started = Instant::now();
        match self.replace(name, &lease).await {
            Ok(obj) => {
                tracing::debug!(lease = %name, fencing = %fencing, elapsed = ?started.elapsed(), "stamped the term's fencing token");
                if let Err(e) = self.note(name, Some(obj), true) {
                    tracing::warn!(lease = %name, "after stamping the fencing token: {e}");
                }
            }
            Err(Fail::Conflict | Fail::NotFound) => {
                tracing::debug!(lease = %name, "the Lease changed before the fencing token was stamped");
            }
            Err(Fail::Error(e)) => {
                tracing::warn!(lease = %name, "cannot stamp the fencing token yet (the first renewal will): {e}");
            }
        }
    }

    async fn replace(&self, name: &str, lease: &Lease) -> Result<Lease, Fail> {
        self.call(
            self.op("update", name),
            self.api.replace(name, &PostParams::default(), lease),
        )
        .await
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquired, BackendError> {
        let name = &req.name;
        let mut last_holder = None;
        for round in 0..ROUNDS {
            // After a conflict, read from the server: the view lost a race.
            let current = self.read(name, round == 0).await?;
            let floor = self.max_rv.load(Ordering::Relaxed);
            let sent = Instant::now();
            let seen = match current {
                Current::Absent => {
                    let lease = record::created(
                        &self.namespace,
                        name,
                        &req.holder,
                        &req.identity,
                        req.ttl,
                        floor.saturating_add(1),
                    );
                    let op = self.op("create", name);
                    match self
                        .call(op, self.api.create(&PostParams::default(), &lease))
                        .await
                    {
                        Ok(obj) => {
                            let acquired =
                                self.granted(name, req, obj.clone(), sent, None, floor)?;
                            self.stamp(name, req, obj, &acquired).await;
                            return Ok(acquired);
                        }
                        // AlreadyExists: another candidate created it first.
                        Err(Fail::Conflict) => continue,
                        Err(Fail::NotFound) => {
                            return Err(BackendError::new(
                                BackendErrorKind::Config,
                                format!("{op}: not found (404); does the namespace exist?"),
                            ));
                        }
                        Err(Fail::Error(e)) => return Err(e),
                    }
                }
                Current::Present(seen) => seen,
            };
            let view = record::View::of(&seen.lease);
            let mut lease = seen.lease.clone();
            let replay = if view.token == Some(req.holder) {
                // A replay of our own grant: the original token, the ttl restarted.
                let (_, own) = self.own_view(name, &req.holder);
                let fencing = own.map_or_else(|| view.term_fencing(seen.rv), |o| o.fencing);
                record::renewed(&mut lease, req.ttl, Some(fencing));
                Some(fencing)
            } else {
                let remaining = seen.remaining(view.duration, Instant::now());
                if view.holder.is_some() && !remaining.is_zero() {
                    return Ok(Acquired::Busy {
                        holder: view.holder,
                        remaining: Some(remaining),
                    });
                }
                last_holder = view.holder;
                // Every token issued before this term is at most the version we read.
                let term_floor = seen.rv.saturating_add(1);
                record::take_over(&mut lease, &req.holder, &req.identity, req.ttl, term_floor);
                None
            };
            match self.replace(name, &lease).await {
                Ok(obj) => {
                    let acquired = self.granted(name, req, obj.clone(), sent, replay, floor)?;
                    if replay.is_none() {
                        self.stamp(name, req, obj, &acquired).await;
                    }
                    return Ok(acquired);
                }
                // Someone else wrote (409), or deleted it (404): read again and decide afresh.
                Err(Fail::Conflict | Fail::NotFound) => {}
                Err(Fail::Error(e)) => return Err(e),
            }
        }
        Ok(Acquired::Busy {
            holder: last_holder,
            remaining: None,
        })
    }

    async fn renew(
        &self,
        name: &Arc<str>,
        holder: &HolderToken,
        ttl: Duration,
    ) -> Result<Renewed, BackendError> {
        for round in 0..ROUNDS {
            let (cached, own) = self.own_view(name, holder);
            // The fast path (client-go's): write over our own last write, one request.
            let current = match cached.filter(|_| round == 0) {
                Some(c) => c,
                None => self.read(name, false).await?,
            };
            let Current::Present(seen) = current else {
                self.forget(name, holder);
                return Ok(Renewed::NotHeld);
            };
            let view = record::View::of(&seen.lease);
            if view.token != Some(*holder) {
                self.forget(name, holder);
                return Ok(Renewed::NotHeld);
            }
            let now = Instant::now();
            let expired = match own {
                Some(o) => o.expired(now),
                None => seen.remaining(view.duration, now).is_zero(),
            };
            if expired {
                // Others may already judge it expired: renewing would resurrect it.
                return Ok(Renewed::NotHeld);
            }
            let fencing = own.map(|o| o.fencing).or(view.fencing);
            let mut lease = seen.lease.clone();
            record::renewed(&mut lease, ttl, fencing);
            let sent = Instant::now();
            match self.replace(name, &lease).await {
                Ok(obj) => {
                    self.note(name, Some(obj), true)?;
                    if let Some(st) = self.locks().get_mut(&**name)
                        && let Some(o) = st.own.as_mut().filter(|o| o.holder == *holder)
                    {
                        o.last_sent = sent;
                        o.duration = Duration::from_secs(
                            record::lease_duration_seconds(ttl).unsigned_abs().into(),
                        );
                    }
                    return Ok(Renewed::Held);
                }
                Err(Fail::Conflict) => {}
                Err(Fail::NotFound) => {
                    self.forget(name, holder);
                    return Ok(Renewed::NotHeld);
                }
                Err(Fail::Error(e)) => return Err(e),
            }
        }
        Err(self.contended("renew", name))
    }

    async fn release(
        &self,
        name: &Arc<str>,
        holder: &HolderToken,
    ) -> Result<Released, BackendError> {
        for round in 0..ROUNDS {
            let (cached, _) = self.own_view(name, holder);
            let current = match cached.filter(|_| round == 0) {
                Some(c) => c,
                None => self.read(name, false).await?,
            };
            let Current::Present(seen) = current else {
                self.forget(name, holder);
                return Ok(Released::NotHeld);
            };
            let view = record::View::of(&seen.lease);
            if view.token != Some(*holder) {
                self.forget(name, holder);
                return Ok(if view.released == Some(*holder) {
                    // A replay of a release that took effect.
                    Released::Released
                } else {
                    Released::NotHeld
                });
            }
            let mut lease = seen.lease.clone();
            record::released(&mut lease, holder);
            match self.replace(name, &lease).await {
                Ok(obj) => {
                    self.note(name, Some(obj), true)?;
                    self.forget(name, holder);
                    return Ok(Released::Released);
                }
                Err(Fail::Conflict) => {}
                Err(Fail::NotFound) => {
                    self.forget(name, holder);
                    return Ok(Released::NotHeld);
                }
                Err(Fail::Error(e)) => return Err(e),
            }
        }
        Err(self.contended("release", name))
    }

    fn contended(&self, what: &str, name: &str) -> BackendError {
        BackendError::new(
            BackendErrorKind::Unavailable,
            format!(
                "{what} of lease {}/{name}: the Lease changed under every one of {ROUNDS} \
                 attempts (409 Conflict each time)",
                self.namespace
            ),
        )
    }

    async fn inspect(&self, name: &Arc<str>) -> Result<Option<LeaseRecord>, BackendError> {
        let Current::Present(seen) = self.read(name, true).await? else {
            return Ok(None);
        };
        let view = record::View::of(&seen.lease);
        let Some(identity) = view.holder.clone() else {
            return Ok(None);
        };
        let remaining = seen.remaining(view.duration, Instant::now());
        if remaining.is_zero() {
            return Ok(None);
        }
        Ok(Some(LeaseRecord {
            identity,
            fencing: view.term_fencing(seen.rv),
            remaining: Some(remaining),
            transitions: u64::try_from(view.transitions).ok(),
        }))
    }

    /// Writes a Normal Event, reason `LeaderElection`, on the Lease, as client-go's
    /// `LeaseLock.RecordEvent` does: "<identity> became leader" / "<identity> stopped leading".
    async fn announce(&self, name: &str, event: &LeadershipEvent) -> Result<(), BackendError> {
        let (identity, what, note) = match event {
            LeadershipEvent::BecameLeader { identity, fencing } => (
                identity,
                "became leader",
                format!("fencing token {fencing}"),
            ),
            LeadershipEvent::StoppedLeading {
                identity,
                fencing,
                reason,
            } => (
                identity,
                "stopped leading",
                format!("fencing token {fencing}: {reason}"),
            ),
        };
        let (uid, rv) = {
            let locks = self.locks();
            match locks.get(name).and_then(|st| st.known.clone()) {
                Some(Current::Present(seen)) => (seen.lease.metadata.uid.clone(), Some(seen.rv)),
                _ => (None, None),
            }
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        let event: k8s_openapi::api::core::v1::Event = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": format!("{name}.{:x}", now.as_nanosecond()),
                "namespace": self.namespace,
                "annotations": { record::FENCING: note },
            },
            "involvedObject": {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "name": name,
                "namespace": self.namespace,
                "uid": uid,
                "resourceVersion": rv.map(|v| v.to_string()),
            },
            "reason": "LeaderElection",
            "message": format!("{identity} {what}"),
            "type": "Normal",
            "source": { "component": "tenure" },
            "reportingComponent": "tenure",
            "reportingInstance": identity,
            "firstTimestamp": now.to_string(),
            "lastTimestamp": now.to_string(),
            "count": 1,
        }))
        .map_err(|e| BackendError::new(BackendErrorKind::Protocol, format!("event: {e}")))?;
        let api: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.api.clone().into_client(), &self.namespace);
        let op = Op {
            verb: "create",
            resource: error::EVENTS,
            namespace: &self.namespace,
            name,
        };
        match self
            .call(op, api.create(&PostParams::default(), &event))
            .await
        {
            Ok(_) => Ok(()),
            Err(Fail::Error(e)) => Err(e),
            Err(Fail::NotFound | Fail::Conflict) => Ok(()),
        }
    }

    /// The Lease `name` (if any) and a resourceVersion to watch from.
    async fn list_one(&self, name: &str) -> Result<watch::Listed, BackendError> {
        let op = self.op("list", name);
        let params = ListParams::default().fields(&format!("metadata.name={name}"));
        let list = match self.call(op, self.api.list(&params)).await {
            Ok(l) => l,
            Err(Fail::Error(e)) => return Err(e),
            Err(Fail::NotFound | Fail::Conflict) => {
                return Err(BackendError::new(
                    BackendErrorKind::Config,
                    format!("{op}: not found (404); does the namespace exist?"),
                ));
            }
        };
        let rv = list.metadata.resource_version.clone().unwrap_or_default();
        Ok((
            list.items
                .into_iter()
                .find(|l| l.metadata.name.as_deref() == Some(name)),
            rv,
        ))
    }

    /// Opens a watch of the Lease `name` from resourceVersion `rv`.
    async fn watch_from(
        &self,
        name: &str,
        rv: &str,
    ) -> Result<BoxStream<'static, kube::Result<WatchEvent<Lease>>>, BackendError> {
        let op = self.op("watch", name);
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(watch::WATCH_TIMEOUT_SECS);
        match self.call(op, self.api.watch(&params, rv)).await {
            Ok(s) => Ok(boxed(s)),
            Err(Fail::Error(e)) => Err(e),
            Err(Fail::NotFound | Fail::Conflict) => Err(BackendError::new(
                BackendErrorKind::Unavailable,
                format!("{op}: the watch could not start"),
            )),
        }
    }
}

fn boxed<S>(s: S) -> BoxStream<'static, kube::Result<WatchEvent<Lease>>>
where
    S: Stream<Item = kube::Result<WatchEvent<Lease>>> + Send + 'static,
{
    s.boxed()
}

impl Backend for KubeBackend {
    fn validate_name(&self, name: &str) -> Result<(), InvalidName> {
        record::validate_name(name)
    }

    fn try_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquired, BackendError>> {
        Box::pin(self.inner.try_acquire(req))
    }

    fn renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Renewed, BackendError>> {
        Box::pin(async move { self.inner.renew(&Arc::from(name), holder, ttl).await })
    }

    fn release<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        Box::pin(async move { self.inner.release(&Arc::from(name), holder).await })
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseRecord>, BackendError>> {
        Box::pin(async move { self.inner.inspect(&Arc::from(name)).await })
    }

    fn announce<'a>(&'a self, name: &'a str, event: &'a LeadershipEvent) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.inner.announce(name, event).await {
                tracing::debug!(lock = name, error = %e, "could not record the leadership Event");
            }
        })
    }

    fn announce_member<'a>(
        &'a self,
        group: &'a str,
        member: &'a Member,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.inner.announce_member(group, member, ttl))
    }

    fn withdraw_member<'a>(
        &'a self,
        group: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.inner.withdraw_member(group, identity))
    }

    fn members(&self, group: &str) -> BoxStream<'static, Result<Vec<Member>, BackendError>> {
        members::members(&self.inner, group)
    }

    fn observe(&self, name: &str) -> BoxStream<'static, Result<HolderChange, BackendError>> {
        watch::observe(&self.inner, name)
    }
}
