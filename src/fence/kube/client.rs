//! `Fencer`: makes the fenced clients of one identity's terms, each term's clients sharing
//! one proof of its fence.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Resource;
use kube::api::{Api, PostParams};

use super::api::FencedApi;
use super::error::{FenceError, FenceState};
use super::proof::{DEFAULT_RECHECK, Proof, ProofSetup};
use super::service::{Gate, Stamped, election_header, extra_header, impersonation_headers};
use crate::FencingToken;
use crate::election::Term;

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

    /// A fencer that impersonates `user` with `groups` (for [`check`](super::check), run by
    /// someone allowed to impersonate a participant).
    pub(crate) fn impersonating(
        client: kube::Client,
        user: &str,
        groups: &[String],
    ) -> Result<Self, FenceError> {
        let identity = Some(Arc::new(impersonation_headers(user, groups)?));
        Ok(Self {
            identity,
            ..Self::without_policy(client)
        })
    }

    /// An ungated `Api` for the probe in the Lease namespace, naming the election `lease` and
    /// carrying `token` (`None`: no token, as a participant that is not a tenure replica
    /// would write).
    pub(crate) fn probe_api(
        &self,
        lease: &str,
        token: Option<u64>,
    ) -> Api<k8s_openapi::api::coordination::v1::Lease> {
        Api::namespaced(
            self.build_headers(lease, token.map(FencingToken::new), None, None),
            &self.lease_namespace,
        )
    }

    /// The namespace of the elections' Leases, where the probe is created (default: the
    /// client's default namespace, as for [`KubeOptions`](crate::backend::kube::KubeOptions)).
    #[must_use]
    pub fn lease_namespace(mut self, namespace: &str) -> Self {
        namespace.clone_into(&mut self.lease_namespace);
        self
    }

    /// The namespace of the elections' Leases.
    pub(super) fn lease_ns(&self) -> &str {
        &self.lease_namespace
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
    /// and `tenure_fence_checks_total{name,result}`. Needs the `metrics` feature.
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
        self.build(
            term.lease_name(),
            term.fencing_token(),
            Some(term.clone()),
            proof,
        )
    }

    /// A kube client whose requests carry `token` of the election `lease`, with no local
    /// check of the term: for a process that was handed a token rather than a [`Term`] (a
    /// command under `tenure run` reads `TENURE_LEASE` and `TENURE_FENCING_TOKEN`). Its
    /// writes still wait for the fence proof.
    #[must_use]
    pub fn client_with_token(&self, lease: &str, token: FencingToken) -> kube::Client {
        let proof = self.proof(lease, token, None);
        self.build(lease, token, None, proof)
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
                self.build(lease, FencingToken::new(t), None, None),
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

    /// The election a request of `lease` names: `NAMESPACE/LEASE`.
    pub(super) fn election(&self, lease: &str) -> String {
        format!("{}/{lease}", self.lease_namespace)
    }

    /// A client whose requests carry `token` and name the election `lease` (when this fencer
    /// sends tokens), gated by `proof` and checked against `term`.
    fn build(
        &self,
        lease: &str,
        token: FencingToken,
        term: Option<Term>,
        proof: Option<Arc<Proof>>,
    ) -> kube::Client {
        self.build_headers(lease, Some(token), term, proof)
    }

    /// [`build`](Self::build) with the token optional: without one, the requests still name
    /// the election (a proof's probe of what a token-less participant write gets).
    fn build_headers(
        &self,
        lease: &str,
        token: Option<FencingToken>,
        term: Option<Term>,
        proof: Option<Arc<Proof>>,
    ) -> kube::Client {
        let mut headers = self.identity.as_deref().cloned().unwrap_or_default();
        if self.identity.is_some() {
            // Both are plain ASCII (digits; a DNS label, '/', a DNS subdomain), so always
            // valid header values; a namespace given by hand that is not leaves the election
            // out, which the policy refuses (fail closed).
            if let Some(value) =
                token.and_then(|t| HeaderValue::from_str(&t.get().to_string()).ok())
            {
                headers.insert(extra_header(), value);
            }
            if let Ok(value) = HeaderValue::from_str(&self.election(lease)) {
                headers.insert(election_header(), value);
            }
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
            election: self.election(lease).into(),
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
            election: self.election(term.lease_name()).into(),
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
            election: self.election(term.lease_name()).into(),
        }
    }
}
