//! Fenced writes from a term: a kube client whose requests carry the term's token, an `Api`
//! that stamps it on objects and refuses locally after the term, and the typed refusal.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::client::Body;
use kube::core::Status;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::proof::{DEFAULT_RECHECK, FenceState, Proof, ProofSetup};
use super::{OBJECT_TOKEN_ANNOTATION, REFUSAL_PREFIX, REQUEST_TOKEN_EXTRA};
use crate::FencingToken;
use crate::election::Term;

/// Why a fenced write did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A newer term exists: the API server's policy (or, without it, the object read)
    /// refused this term's token. Stop the term's work; retrying cannot succeed.
    #[error("stale write refused{}: our token {ours} < {current}", lease_suffix(.lease.as_deref()))]
    Stale {
        /// The election's Lease (`namespace/name`), when the refusal named it.
        lease: Option<String>,
        /// This term's token.
        ours: u64,
        /// What beat it: the current term's token, the object's, or the foreign holder.
        current: Current,
    },
    /// The fence is not proven on the API server (see [`FenceState`]): it admitted a token
    /// below this term's (the policy or binding is missing, or its Lease parameter cache has
    /// stopped), or the proof could not be taken. Nothing was sent: fenced writes fail closed
    /// until a recheck finds the fence enforced again ([`Fencer::warn_only`] lets them go).
    #[error("the fence on lease {lease} is not enforced, write not sent: {cause}")]
    Unenforced {
        /// The election's Lease, `namespace/name`.
        lease: String,
        /// What the proof saw, the likely cause and the fix.
        cause: String,
    },
    /// The term had already ended (cancelled, or past its validity): nothing was sent.
    #[error("the term with fencing token {ours} has ended: write not sent")]
    TermEnded {
        /// The ended term's token.
        ours: u64,
    },
    /// The policy refused a write without a token: the client sent none (a
    /// [`Fencer::without_policy`] client while the policy is installed) or it did not arrive.
    #[error("refused by the fencing policy: {message}")]
    MissingToken {
        /// The API server's message.
        message: String,
    },
    /// The identity may not impersonate itself, which carrying the token needs (see the
    /// module docs for the RBAC); or the policy refused for another reason.
    #[error("{message}")]
    Forbidden {
        /// The API server's message, with a hint where one helps.
        message: String,
    },
    /// Learning this client's identity (SelfSubjectReview) failed.
    #[error("cannot learn this client's identity (SelfSubjectReview): {0}")]
    Identity(#[source] kube::Error),
    /// Any other API error or transport failure, unchanged.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// What a refused token was compared with.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Current {
    /// The current term's token (the Lease's floor).
    Term(u64),
    /// The token already on the object.
    Object(u64),
    /// A holder that does not stamp tokens (client-go) leads.
    ForeignHolder(String),
}

impl std::fmt::Display for Current {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Term(t) => write!(f, "current term's {t}"),
            Self::Object(t) => write!(f, "the object's {t}"),
            Self::ForeignHolder(h) => write!(f, "a term of {h:?}, which is not a tenure replica"),
        }
    }
}

/// What a policy's stale refusal names as the winner: "… < current F", "… < object O", or
/// "… held by H, which …".
pub(crate) fn parse_current(message: &str) -> Option<Current> {
    let number_after = |marker: &str| {
        message.find(marker).and_then(|i| {
            message[i + marker.len()..]
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse::<u64>().ok())
        })
    };
    if let Some(t) = number_after(" < current ") {
        Some(Current::Term(t))
    } else if let Some(t) = number_after(" < object ") {
        Some(Current::Object(t))
    } else {
        message.find("held by ").map(|i| {
            let holder = &message[i + "held by ".len()..];
            let holder = holder.split(", which").next().unwrap_or(holder);
            Current::ForeignHolder(holder.to_owned())
        })
    }
}

fn lease_suffix(lease: Option<&str>) -> String {
    lease.map(|l| format!(" on lease {l}")).unwrap_or_default()
}

impl FenceError {
    /// Whether this says a newer term exists or this one is over: stop, do not retry.
    #[must_use]
    pub fn is_stale(&self) -> bool {
        matches!(self, Self::Stale { .. } | Self::TermEnded { .. })
    }
}

/// Turns a kube error from a fenced request into a [`FenceError`].
fn classify(error: kube::Error, ours: u64) -> FenceError {
    match error {
        kube::Error::Api(status) => classify_status(*status, ours),
        kube::Error::Service(e) if e.is::<Ended>() => FenceError::TermEnded { ours },
        kube::Error::Service(e) if e.is::<Gated>() => match e.downcast::<Gated>() {
            Ok(gated) => gated.into_error(ours),
            Err(e) => FenceError::Kube(kube::Error::Service(e)),
        },
        other => FenceError::Kube(other),
    }
}

fn classify_status(status: Status, ours: u64) -> FenceError {
    let message = status.message.clone();
    let Some(at) = message.find(REFUSAL_PREFIX) else {
        if status.code == 403 && message.contains("impersonate") {
            return FenceError::Forbidden {
                message: format!(
                    "{message} (a fenced client impersonates its own identity to carry the \
                     token: grant `impersonate` on its own serviceaccount and on \
                     userextras/{REQUEST_TOKEN_EXTRA} in apiGroup authentication.k8s.io, or use \
                     Fencer::without_policy)"
                ),
            };
        }
        return FenceError::Kube(kube::Error::Api(Box::new(status)));
    };
    // "tenure fencing: lease NS/NAME: stale: token T < current F" (or "< object O", or
    // ", but the lease is held by H, which …"); "…: missing token: …".
    let rest = &message[at + REFUSAL_PREFIX.len()..];
    let lease = rest
        .trim_start()
        .strip_prefix("lease ")
        .and_then(|r| r.split(": ").next())
        .map(str::to_owned);
    if rest.contains(": missing token") {
        return FenceError::MissingToken { message };
    }
    let current = if rest.contains(": stale: ") {
        parse_current(rest)
    } else {
        None
    };
    match current {
        Some(current) => FenceError::Stale {
            lease,
            ours,
            current,
        },
        None => FenceError::Forbidden { message },
    }
}

/// The newest term's proof per lease name: (token, proof).
type Proofs = HashMap<String, (u64, Arc<Proof>)>;

/// Makes fenced clients for the terms of one identity.
///
/// Cheap to clone. [`Fencer::new`] asks the API server once who this client is
/// (`SelfSubjectReview`), so that each term's client can impersonate exactly that identity
/// with the term's token added.
///
/// # The fence proves itself
///
/// Every fenced client of one term (all its [`FencedApi`]s and [`client`](Self::client)s)
/// shares one proof ([`FenceState`]): before the term's first write goes, dry-run creates of
/// the election's probe Lease (`tenure-fence-probe.<lease>`, in
/// [`lease_namespace`](Self::lease_namespace)) must be refused with the token below the term's
/// and admitted with the term's; then once per [`recheck_every`](Self::recheck_every). Until
/// the first proof passes, writes wait (at most [`PROOF_WINDOW`](super::PROOF_WINDOW) and two
/// request timeouts);
/// while it fails they are not sent and fail with [`FenceError::Unenforced`]. The proof logs
/// at error level, writes a `FenceOpen` Warning Event on the Lease, sets the metric
/// `tenure_fence_enforced{name}` to 0 ([`with_metrics`](Self::with_metrics)) and makes
/// [`open_fence`](Self::open_fence) answer (for a readiness probe).
#[derive(Clone)]
pub struct Fencer {
    client: kube::Client,
    /// The impersonation headers without the token; `None`: send no token.
    identity: Option<Arc<HeaderMap>>,
    lease_namespace: String,
    recheck: Duration,
    warn_only: bool,
    #[cfg(feature = "metrics")]
    metrics: Option<crate::election::ElectionMetrics>,
    /// The proof of the newest term per lease name, shared by that term's clients and kept
    /// while no newer term of the lease comes (so a client made per write finds it running).
    proofs: Arc<Mutex<Proofs>>,
}

impl Debug for Fencer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fencer")
            .field("request_token", &self.identity.is_some())
            .field("lease_namespace", &self.lease_namespace)
            .field("recheck", &self.recheck)
            .field("warn_only", &self.warn_only)
            .finish_non_exhaustive()
    }
}

impl Fencer {
    /// A fencer whose clients carry the term's token in every request, for the API server's
    /// policy ([`super::FencingPolicy`]), and prove the fence before a term's first write.
    /// The elections' Leases are looked for in the client's default namespace (see
    /// [`lease_namespace`](Self::lease_namespace)).
    ///
    /// # Errors
    ///
    /// [`FenceError::Identity`] when the `SelfSubjectReview` fails (every authenticated user
    /// may create one), [`FenceError::Forbidden`] when it names no user.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn new(client: kube::Client) -> Result<Self, FenceError> {
        let review: Api<SelfSubjectReview> = Api::all(client.clone());
        let answer = review
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .map_err(FenceError::Identity)?;
        let info = answer.status.and_then(|s| s.user_info).unwrap_or_default();
        let user = info.username.unwrap_or_default();
        if user.is_empty() {
            return Err(FenceError::Forbidden {
                message: "the API server names no user for this client (anonymous?); fenced \
                          writes need an authenticated identity"
                    .into(),
            });
        }
        let identity = Some(Arc::new(impersonation_headers(
            &user,
            &info.groups.unwrap_or_default(),
        )?));
        Ok(Self {
            identity,
            ..Self::without_policy(client)
        })
    }

    /// A fencer that sends no token in requests (no impersonation, so no extra RBAC) and
    /// proves nothing: only the client-side half of fencing (see the module docs). With the
    /// policy installed, its writes are refused ([`FenceError::MissingToken`]).
    #[must_use]
    pub fn without_policy(client: kube::Client) -> Self {
        let lease_namespace = client.default_namespace().to_owned();
        Self {
            client,
            identity: None,
            lease_namespace,
            recheck: DEFAULT_RECHECK,
            warn_only: false,
            #[cfg(feature = "metrics")]
            metrics: None,
            proofs: Arc::default(),
        }
    }

    /// A fencer that impersonates `user` (for [`check`](super::check), run by someone allowed
    /// to impersonate a participant).
    pub(crate) fn impersonating(client: kube::Client, user: &str) -> Result<Self, FenceError> {
        let identity = Some(Arc::new(impersonation_headers(user, &[])?));
        Ok(Self {
            identity,
            ..Self::without_policy(client)
        })
    }

    /// An ungated `Api` for the probe in the Lease namespace, carrying `token` (`None`: no
    /// token at all).
    pub(crate) fn probe_api(
        &self,
        token: Option<u64>,
    ) -> Api<k8s_openapi::api::coordination::v1::Lease> {
        let client = match token {
            Some(t) => self.build(FencingToken::new(t), None, None),
            None => {
                let headers = self.identity.as_deref().cloned().unwrap_or_default();
                let namespace = self.client.default_namespace().to_owned();
                kube::Client::new(
                    Stamped {
                        inner: self.client.clone(),
                        headers: Arc::new(headers),
                        term: None,
                        gate: None,
                    },
                    namespace,
                )
            }
        };
        Api::namespaced(client, &self.lease_namespace)
    }

    /// The namespace of the elections' Leases, where the probe is created (default: the
    /// client's default namespace, as for [`KubeOptions`](crate::backend::kube::KubeOptions)).
    #[must_use]
    pub fn lease_namespace(mut self, namespace: &str) -> Self {
        namespace.clone_into(&mut self.lease_namespace);
        self
    }

    /// How often a term re-proves its fence after the first proof (default
    /// [`DEFAULT_RECHECK`], 10 s): one pair of dry-run requests per period and term.
    #[must_use]
    pub fn recheck_every(mut self, period: Duration) -> Self {
        self.recheck = period.max(Duration::from_millis(100));
        self
    }

    /// Opt-in: let fenced writes go while the fence is not enforced (each failed proof still
    /// logs at error level, writes the Event and sets the metric). For a migration window
    /// only: a stale leader's writes are then admitted without a sign in the write's result.
    #[must_use]
    pub fn warn_only(mut self, on: bool) -> Self {
        self.warn_only = on;
        self
    }

    /// Reports every proof into `metrics`: `tenure_fence_enforced{name}` (1 proven, 0 not)
    /// and `tenure_fence_checks_total{name,result}`.
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn with_metrics(mut self, metrics: crate::election::ElectionMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The cause of the first fence of a running term that is not enforced, if any: for a
    /// readiness probe (`ProbeServer::readiness_check`), so an open fence shows in
    /// `kubectl get pods` and rollouts.
    #[must_use]
    pub fn open_fence(&self) -> Option<String> {
        let proofs = self.proofs.lock().unwrap_or_else(PoisonError::into_inner);
        proofs
            .values()
            .filter(|(_, proof)| proof.running())
            .find_map(|(_, proof)| match proof.state() {
                FenceState::Unenforced { cause } => {
                    Some(format!("fence open on lease {}: {cause}", proof.lease()))
                }
                _ => None,
            })
    }

    /// Proves `term`'s fence (or waits for the proof already running) and returns what it
    /// found: for a caller that wants to know before it starts work, e.g. a supervisor that
    /// starts a command only once its writes would be fenced. Fenced writes do the same wait
    /// by themselves.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the proof keeps running for the term's clients.
    pub async fn prove(&self, term: &Term) -> FenceState {
        match self.proof(term.lease_name(), term.fencing_token(), Some(term)) {
            Some(proof) => proof.settled().await,
            None => FenceState::Unenforced {
                cause: "this fencer sends no token (Fencer::without_policy)".into(),
            },
        }
    }

    /// A kube client for `term`: every request carries the term's token (unless
    /// [`without_policy`](Self::without_policy)), and writes (POST, PUT, PATCH, DELETE) wait
    /// for the term's fence proof and fail locally once the term has ended. Use it for
    /// anything [`FencedApi`] does not cover; its errors are plain `kube::Error`s (a local
    /// refusal is a `Service` error).
    #[must_use]
    pub fn client(&self, term: &Term) -> kube::Client {
        let proof = self.proof(term.lease_name(), term.fencing_token(), Some(term));
        self.build(term.fencing_token(), Some(term.clone()), proof)
    }

    /// A kube client whose requests carry `token` of the election `lease`, with no local
    /// check of the term: for a process that was handed a token rather than a [`Term`] (a
    /// command under `tenure run` reads `TENURE_LEASE` and `TENURE_FENCING_TOKEN`). Its
    /// writes still wait for the fence proof.
    #[must_use]
    pub fn client_with_token(&self, lease: &str, token: FencingToken) -> kube::Client {
        let proof = self.proof(lease, token, None);
        self.build(token, None, proof)
    }

    /// The proof of (lease, token), started on first use; `None` without a request token.
    fn proof(&self, lease: &str, token: FencingToken, term: Option<&Term>) -> Option<Arc<Proof>> {
        self.identity.as_ref()?;
        let mut proofs = self.proofs.lock().unwrap_or_else(PoisonError::into_inner);
        let newest = proofs.get(lease).map(|(t, _)| *t);
        if let Some((t, proof)) = proofs.get(lease)
            && *t == token.get()
        {
            return Some(proof.clone());
        }
        let probe = |t: u64| {
            Api::namespaced(
                self.build(FencingToken::new(t), None, None),
                &self.lease_namespace,
            )
        };
        let proof = Proof::start(ProofSetup {
            lease: format!("{}/{lease}", self.lease_namespace),
            lease_name: lease.to_owned(),
            ours: token.get(),
            below: probe(token.get().saturating_sub(1)),
            at: probe(token.get()),
            events: Some(self.client.clone()),
            lease_namespace: self.lease_namespace.clone(),
            recheck: self.recheck,
            #[cfg(feature = "metrics")]
            metrics: self.metrics.clone(),
            cancel: term.map(|t| t.cancellation().clone()),
        });
        // An older term's proof (rare: a handed-over old token) lives with its clients only.
        if newest.is_none_or(|t| t < token.get()) {
            proofs.insert(lease.to_owned(), (token.get(), proof.clone()));
        }
        Some(proof)
    }

    fn build(
        &self,
        token: FencingToken,
        term: Option<Term>,
        proof: Option<Arc<Proof>>,
    ) -> kube::Client {
        let mut headers = self.identity.as_deref().cloned().unwrap_or_default();
        if self.identity.is_some()
            && let Ok(value) = HeaderValue::from_str(&token.get().to_string())
        {
            headers.insert(extra_header(), value);
        }
        let namespace = self.client.default_namespace().to_owned();
        kube::Client::new(
            Stamped {
                inner: self.client.clone(),
                headers: Arc::new(headers),
                term,
                gate: proof.map(|proof| Gate {
                    proof,
                    warn_only: self.warn_only,
                }),
            },
            namespace,
        )
    }

    /// A fenced `Api` for namespaced resources of kind `K` in `namespace`, carrying `token`
    /// of the election `lease` with no local check (see
    /// [`client_with_token`](Self::client_with_token)).
    #[must_use]
    pub fn namespaced_with_token<K>(
        &self,
        lease: &str,
        token: FencingToken,
        namespace: &str,
    ) -> FencedApi<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        FencedApi {
            api: Api::namespaced(self.client_with_token(lease, token), namespace),
            ours: token,
        }
    }

    /// A fenced `Api` for namespaced resources of kind `K` in `namespace`, for `term`.
    #[must_use]
    pub fn namespaced<K>(&self, term: &Term, namespace: &str) -> FencedApi<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        FencedApi {
            api: Api::namespaced(self.client(term), namespace),
            ours: term.fencing_token(),
        }
    }

    /// A fenced `Api` for cluster-scoped resources of kind `K` (or all namespaces), for
    /// `term`.
    #[must_use]
    pub fn all<K>(&self, term: &Term) -> FencedApi<K>
    where
        K: Resource,
        K::DynamicType: Default,
    {
        FencedApi {
            api: Api::all(self.client(term)),
            ours: term.fencing_token(),
        }
    }
}

/// `Impersonate-Extra-tenure.dev%2ffencing-token` (the key percent-encoded, as the header
/// name rules require).
fn extra_header() -> HeaderName {
    HeaderName::from_static("impersonate-extra-tenure.dev%2ffencing-token")
}

/// The headers that impersonate `user` (with `groups`) exactly: a ServiceAccount's groups
/// follow from its name, so only the user is sent; anyone else's groups are sent too
/// (`system:authenticated` is added by the server).
fn impersonation_headers(user: &str, groups: &[String]) -> Result<HeaderMap, FenceError> {
    let value = |v: &str| {
        HeaderValue::from_str(v).map_err(|_| FenceError::Forbidden {
            message: format!("cannot impersonate {v:?}: not a valid header value"),
        })
    };
    let mut headers = HeaderMap::new();
    headers.insert("impersonate-user", value(user)?);
    if !user.starts_with("system:serviceaccount:") {
        for group in groups.iter().filter(|g| *g != "system:authenticated") {
            headers.append("impersonate-group", value(group)?);
        }
    }
    Ok(headers)
}

/// The local refusal: the term ended before a write was sent.
#[derive(Debug)]
struct Ended;

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the term has ended: write not sent")
    }
}

impl std::error::Error for Ended {}

/// The local refusal: the term's fence proof did not pass, so the write was not sent.
#[derive(Debug)]
struct Gated {
    lease: String,
    state: FenceState,
}

impl Gated {
    fn into_error(self, ours: u64) -> FenceError {
        match self.state {
            FenceState::Superseded { current } => FenceError::Stale {
                lease: Some(self.lease),
                ours,
                current,
            },
            FenceState::Unenforced { cause } => FenceError::Unenforced {
                lease: self.lease,
                cause,
            },
            FenceState::Proving | FenceState::Enforced => FenceError::Unenforced {
                lease: self.lease,
                cause: "the fence proof did not finish".into(),
            },
        }
    }
}

impl std::fmt::Display for Gated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            FenceState::Superseded { current } => write!(
                f,
                "write not sent: a newer term holds lease {} ({current})",
                self.lease
            ),
            FenceState::Unenforced { cause } => write!(
                f,
                "write not sent: the fence on lease {} is not enforced: {cause}",
                self.lease
            ),
            _ => write!(
                f,
                "write not sent: the fence on lease {} is unproven",
                self.lease
            ),
        }
    }
}

impl std::error::Error for Gated {}

/// A term's writes wait for its fence proof.
#[derive(Clone)]
struct Gate {
    proof: Arc<Proof>,
    warn_only: bool,
}

impl Gate {
    /// `Ok` when a write may go.
    async fn pass(&self) -> Result<(), Gated> {
        match self.proof.settled().await {
            FenceState::Enforced => Ok(()),
            FenceState::Unenforced { cause } if self.warn_only => {
                tracing::error!(
                    lease = %self.proof.lease(),
                    "fenced write sent although the fence is not enforced (warn-only): {cause}"
                );
                Ok(())
            }
            state => Err(Gated {
                lease: self.proof.lease().to_owned(),
                state,
            }),
        }
    }
}

/// The service under a term's client: adds the headers, holds writes until the fence is
/// proven, refuses writes after the term.
#[derive(Clone)]
struct Stamped {
    inner: kube::Client,
    headers: Arc<HeaderMap>,
    /// `None`: no local check (a token handed over without its term).
    term: Option<Term>,
    /// `None`: no proof (no request token, or the proof's own probes).
    gate: Option<Gate>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Request<Body>> for Stamped {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        let write = !matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::OPTIONS
        );
        for (name, value) in self.headers.iter() {
            request.headers_mut().append(name, value.clone());
        }
        let inner = self.inner.clone();
        let term = self.term.clone();
        let gate = self.gate.clone().filter(|_| write);
        Box::pin(async move {
            if let Some(gate) = gate {
                gate.pass().await.map_err(|e| Box::new(e) as BoxError)?;
            }
            // Checked at the last moment before sending: a term that ended while the caller
            // prepared the write (or while it waited for the proof) sends nothing.
            if write && term.as_ref().is_some_and(|t| !t.is_valid()) {
                return Err(Box::new(Ended) as BoxError);
            }
            inner.send(request).await.map_err(BoxError::from)
        })
    }
}

/// A kube `Api<K>` bound to one term: writes carry and stamp the term's token.
///
/// Every method mirrors `Api`'s and takes no more arguments: a fenced write takes no more
/// lines than an unfenced one. Reads and everything else go through [`api`](Self::api),
/// whose client carries the token too.
///
/// # First write
///
/// Writes wait for the term's fence proof (see [`Fencer`]): only once the API server refuses
/// the token below this term's does the first write go, so no stale write can land (on that
/// server) after it. While the proof fails, writes fail with [`FenceError::Unenforced`].
#[derive(Clone)]
pub struct FencedApi<K> {
    api: Api<K>,
    ours: FencingToken,
}

impl<K> Debug for FencedApi<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedApi")
            .field("ours", &self.ours)
            .finish_non_exhaustive()
    }
}

impl<K> FencedApi<K>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    K::DynamicType: Default,
{
    /// The underlying `Api` (same fenced client), for reads, lists, watches and the rest.
    #[must_use]
    pub fn api(&self) -> &Api<K> {
        &self.api
    }

    /// This term's token.
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.ours
    }

    fn stamped(&self, object: &K) -> K {
        let mut object = object.clone();
        object.annotations_mut().insert(
            OBJECT_TOKEN_ANNOTATION.to_owned(),
            self.ours.get().to_string(),
        );
        object
    }

    fn refuse_higher(&self, object: &K) -> Result<(), FenceError> {
        let stored = object
            .annotations()
            .get(OBJECT_TOKEN_ANNOTATION)
            .and_then(|t| t.parse::<u64>().ok());
        match stored {
            Some(theirs) if theirs > self.ours.get() => Err(FenceError::Stale {
                lease: None,
                ours: self.ours.get(),
                current: Current::Object(theirs),
            }),
            _ => Ok(()),
        }
    }

    /// Reads an object (a plain `get`).
    ///
    /// # Errors
    ///
    /// [`FenceError::Kube`] as `Api::get`.
    pub async fn get(&self, name: &str) -> Result<K, FenceError> {
        self.api.get(name).await.map_err(FenceError::Kube)
    }

    /// Sends one write and classifies a refusal.
    async fn write<T, Fut>(&self, send: impl Fn(Api<K>, bool) -> Fut) -> Result<T, FenceError>
    where
        Fut: Future<Output = kube::Result<T>>,
    {
        send(self.api.clone(), false)
            .await
            .map_err(|e| classify(e, self.ours.get()))
    }

    /// Creates `object` with the term's token stamped on it.
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] / [`FenceError::TermEnded`] as the type says; otherwise as
    /// `Api::create`.
    pub async fn create(&self, pp: &PostParams, object: &K) -> Result<K, FenceError> {
        let stamped = self.stamped(object);
        self.write(|api, dry_run| {
            let pp = PostParams {
                dry_run,
                ..pp.clone()
            };
            let stamped = &stamped;
            async move { api.create(&pp, stamped).await }
        })
        .await
    }

    /// Replaces `object` (with its `resourceVersion`, as read) with the term's token
    /// stamped on it. Refused locally when the object carries a higher token than ours.
    ///
    /// # Errors
    ///
    /// As [`create`](Self::create); a 409 when the object changed since it was read.
    pub async fn replace(&self, name: &str, pp: &PostParams, object: &K) -> Result<K, FenceError> {
        self.refuse_higher(object)?;
        let stamped = self.stamped(object);
        self.write(|api, dry_run| {
            let pp = PostParams {
                dry_run,
                ..pp.clone()
            };
            let stamped = &stamped;
            async move { api.replace(name, &pp, stamped).await }
        })
        .await
    }

    /// Replaces the status of `object`. The request carries the token (the policy fences
    /// it); the API server keeps the stored annotations on a status write.
    ///
    /// # Errors
    ///
    /// As [`replace`](Self::replace).
    pub async fn replace_status(
        &self,
        name: &str,
        pp: &PostParams,
        object: &K,
    ) -> Result<K, FenceError> {
        self.refuse_higher(object)?;
        self.write(|api, dry_run| {
            let pp = PostParams {
                dry_run,
                ..pp.clone()
            };
            async move { api.replace_status(name, &pp, object).await }
        })
        .await
    }

    /// Patches an object. Apply, merge and strategic patches also stamp the token on the
    /// object; a JSON patch is sent as given (the request still carries the token).
    ///
    /// # Errors
    ///
    /// As [`create`](Self::create).
    pub async fn patch<P: Serialize + Debug>(
        &self,
        name: &str,
        pp: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, FenceError> {
        let stamped = stamp_patch(patch, self.ours.get())?;
        self.write(|api, dry_run| {
            let pp = PatchParams {
                dry_run,
                ..pp.clone()
            };
            let stamped = stamped.as_ref();
            async move {
                match stamped {
                    Some(stamped) => api.patch(name, &pp, stamped).await,
                    None => api.patch(name, &pp, patch).await,
                }
            }
        })
        .await
    }

    /// Patches the status subresource (the request carries the token).
    ///
    /// # Errors
    ///
    /// As [`create`](Self::create).
    pub async fn patch_status<P: Serialize + Debug>(
        &self,
        name: &str,
        pp: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, FenceError> {
        self.write(|api, dry_run| {
            let pp = PatchParams {
                dry_run,
                ..pp.clone()
            };
            async move { api.patch_status(name, &pp, patch).await }
        })
        .await
    }

    /// Deletes an object. The request carries the token, so the policy refuses a stale
    /// leader's delete like any other write; pass `dp.preconditions` with the
    /// `resourceVersion` you read to refuse deleting an object changed since.
    ///
    /// # Errors
    ///
    /// As [`create`](Self::create).
    pub async fn delete(
        &self,
        name: &str,
        dp: &DeleteParams,
    ) -> Result<either::Either<K, Status>, FenceError> {
        self.write(|api, dry_run| {
            let dp = DeleteParams {
                dry_run,
                ..dp.clone()
            };
            async move { api.delete(name, &dp).await }
        })
        .await
    }
}

/// The patch with `metadata.annotations[tenure.dev/fencing-token]` set, for the patch types
/// that merge maps; `None` for a JSON patch (sent unchanged).
fn stamp_patch<P: Serialize>(
    patch: &Patch<P>,
    ours: u64,
) -> Result<Option<Patch<serde_json::Value>>, FenceError> {
    let stamp = |p: &P| -> Result<serde_json::Value, FenceError> {
        let mut value =
            serde_json::to_value(p).map_err(|e| FenceError::Kube(kube::Error::SerdeError(e)))?;
        if let Some(root) = value.as_object_mut() {
            let metadata = root
                .entry("metadata")
                .or_insert_with(|| serde_json::json!({}));
            if let Some(metadata) = metadata.as_object_mut() {
                let annotations = metadata
                    .entry("annotations")
                    .or_insert_with(|| serde_json::json!({}));
                if let Some(annotations) = annotations.as_object_mut() {
                    annotations.insert(OBJECT_TOKEN_ANNOTATION.to_owned(), ours.to_string().into());
                }
            }
        }
        Ok(value)
    };
    Ok(match patch {
        Patch::Apply(p) => Some(Patch::Apply(stamp(p)?)),
        Patch::Merge(p) => Some(Patch::Merge(stamp(p)?)),
        Patch::Strategic(p) => Some(Patch::Strategic(stamp(p)?)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, message: &str) -> Status {
        Status {
            code,
            message: message.to_owned(),
            ..Status::default()
        }
    }

    #[test]
    fn policy_refusals_become_typed_errors() {
        let prefix = "admission webhook denied: ValidatingAdmissionPolicy 'tenure-fencing.ns.x' with binding 'tenure-fencing.ns.x' denied request:";
        let e = classify_status(
            status(
                403,
                &format!("{prefix} {REFUSAL_PREFIX} lease ns/x: stale: token 5 < current 9"),
            ),
            5,
        );
        assert!(
            matches!(&e, FenceError::Stale { lease: Some(l), ours: 5, current: Current::Term(9) } if l == "ns/x"),
            "{e:?}"
        );
        let e = classify_status(
            status(
                403,
                &format!("{prefix} {REFUSAL_PREFIX} lease ns/x: stale: token 5 < object 7"),
            ),
            5,
        );
        assert!(
            matches!(
                e,
                FenceError::Stale {
                    current: Current::Object(7),
                    ..
                }
            ),
            "{e:?}"
        );
        let e = classify_status(
            status(
                403,
                &format!(
                    "{prefix} {REFUSAL_PREFIX} lease ns/x: stale: token 5, but the lease is held by go-1, which is not a tenure replica"
                ),
            ),
            5,
        );
        assert!(
            matches!(&e, FenceError::Stale { current: Current::ForeignHolder(h), .. } if h == "go-1"),
            "{e:?}"
        );
        let e = classify_status(
            status(
                403,
                &format!("{prefix} {REFUSAL_PREFIX} lease ns/x: missing token: …"),
            ),
            5,
        );
        assert!(matches!(e, FenceError::MissingToken { .. }), "{e:?}");
        let e = classify_status(
            status(
                403,
                "users \"x\" is forbidden: User \"y\" cannot impersonate resource \"serviceaccounts\"",
            ),
            5,
        );
        assert!(
            matches!(&e, FenceError::Forbidden { message } if message.contains("userextras")),
            "{e:?}"
        );
        // A plain RBAC refusal is not an impersonation problem.
        let e = classify_status(status(403, "configmaps is forbidden: User \"x\""), 5);
        assert!(matches!(e, FenceError::Kube(kube::Error::Api(_))), "{e:?}");
        let e = classify_status(status(409, "conflict"), 5);
        assert!(matches!(e, FenceError::Kube(kube::Error::Api(_))), "{e:?}");
        assert!(e.to_string().contains("conflict"));
    }

    #[test]
    fn merge_apply_and_strategic_patches_are_stamped() {
        let body =
            serde_json::json!({ "data": { "a": "1" }, "metadata": { "labels": { "l": "v" } } });
        for patch in [
            Patch::Merge(body.clone()),
            Patch::Apply(body.clone()),
            Patch::Strategic(body.clone()),
        ] {
            let stamped = stamp_patch(&patch, 42)
                .expect("serializable")
                .expect("stamped");
            let value = match stamped {
                Patch::Merge(v) | Patch::Apply(v) | Patch::Strategic(v) => v,
                _ => panic!("kind changed"),
            };
            assert_eq!(
                value["metadata"]["annotations"][OBJECT_TOKEN_ANNOTATION],
                "42"
            );
            assert_eq!(value["metadata"]["labels"]["l"], "v", "the rest is kept");
            assert_eq!(value["data"]["a"], "1");
        }
    }

    #[test]
    fn a_service_account_impersonates_only_its_user() {
        let h = impersonation_headers(
            "system:serviceaccount:ns:sa",
            &[
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ],
        )
        .expect("valid");
        assert_eq!(h.get_all("impersonate-group").iter().count(), 0);
        let h = impersonation_headers("alice", &["devs".into(), "system:authenticated".into()])
            .expect("valid");
        let groups: Vec<_> = h.get_all("impersonate-group").iter().collect();
        assert_eq!(groups, vec!["devs"]);
        assert!(impersonation_headers("bad\nname", &[]).is_err());
    }
}
