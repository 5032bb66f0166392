//! Fencing on Kubernetes, enforced by the API server: a stale leader's writes are refused
//! from the moment the next term is granted, on every governed object (feature `kube`).
//!
//! Three parts:
//!
//! - **The policy** ([`FencingPolicy`]): a `ValidatingAdmissionPolicy` and its binding (CEL
//!   in the API server, no webhook to run) for one election. It reads the election's Lease
//!   as its parameter and refuses a participant's write whose fencing token is lower than the
//!   current term's, or lower than the token already on the object. `tenure policy` prints
//!   it; the Helm chart installs it with `fencing.policy.enabled=true`.
//! - **Fenced writes** ([`Fencer`], [`FencedApi`]): a kube `Api` for one [`Term`](crate::election::Term) whose every
//!   request carries the term's token, whose writes stamp it on the object
//!   (`tenure.dev/fencing-token`), which refuses locally once the term has ended, and which
//!   turns the policy's refusal into [`FenceError::Stale`], never a retry.
//! - **The proof** ([`FenceState`], [`check`]): the API server judges by a cached copy of the
//!   Lease that tenure cannot see, so each term proves, by dry-run, that the server refuses the
//!   token below the term's and admits the term's, before its first write and every recheck
//!   period; while it does not, fenced writes fail closed ([`FenceError::Unenforced`]) and
//!   the leader says so (error log, a `FenceOpen` Event on the Lease, the metric
//!   `tenure_fence_enforced`, [`Fencer::open_fence`] for a readiness probe).
//!   `tenure policy --check` runs the same proof from outside.
//!
//! # How the token travels
//!
//! In the request, not (only) in the object: the fenced client impersonates **its own**
//! identity and adds the user extra `tenure.dev/fencing-token` (`Impersonate-Extra-…`
//! headers), which the policy reads as `request.userInfo.extra`. So every verb carries it —
//! create, update, every patch type, server-side apply, status and other subresource writes,
//! and **delete**, which has no object to annotate — and the object's own annotation cannot be
//! replayed by a stale writer (a status write keeps the stored annotations, so an annotation
//! alone could not fence it). The identity needs RBAC to impersonate itself: for a
//! ServiceAccount, `impersonate` on its own `serviceaccounts` object, and on
//! `userextras/tenure.dev/fencing-token` (apiGroup `authentication.k8s.io`); the chart grants
//! both. Impersonating yourself grants nothing you did not have.
//!
//! # When the gap is zero
//!
//! The Lease's `tenure.dev/fencing-floor` is raised by the write that grants the term (see
//! [`crate::backend::kube`]), so the previous leader is refused from the grant itself, on
//! objects the new leader has not touched as well. The exact token is stamped one write
//! later, before the grant is returned. The API server sees the floor through its informer,
//! milliseconds later; the proof holds the term's first write until it does, so no stale
//! write lands after it — on the API server that answered the proof. Each API server of an
//! HA control plane has its own cache: a proof speaks for one.
//!
//! # The upstream bug, and the anchor
//!
//! On Kubernetes 1.30–1.36 an API server stops its Lease parameter informer for good once no
//! policy with a Lease parameter has a binding (kubernetes/kubernetes#130887, #133827; fix
//! #141015 open): every fencing policy then reads a frozen Lease, or none, and admits stale
//! writes until that API server restarts. Install [`FencingPolicy::anchor`] before the first
//! election's policy and never delete it (`tenure policy` prints it first; the chart installs
//! the same object, [`ANCHOR_NAME`], and keeps it on uninstall): its binding keeps the Lease
//! kind in use. The proof catches the
//! bug where the anchor came too late.
//!
//! # What remains unfenced
//!
//! - Writes by non-participants (people, other controllers): by design.
//! - Resources the policy does not govern (with explicit `--resource`s), and the election's
//!   own Leases, Events and `Election` status (always excluded; `--resource` refuses them).
//!   Only the probe Lease `tenure-fence-probe.<lease>` is governed, and only ever dry-run.
//! - While a client-go replica holds the Lease (a mixed fleet), its writes carry no token
//!   and are admitted, and so would be a stale client-go leader's: client-go has no fencing.
//!   Every write with a token is refused then (no tenure replica leads).
//! - A participant that forges a token (the fence protects against stale honest writers,
//!   not malicious ones — as every fencing token does).
//! - While the Lease does not exist (deleted by hand, before it was first created): the
//!   binding's `parameterNotFoundAction` is `Allow`, so nothing is fenced until the next
//!   grant recreates it. `Deny` would be worse: the API server resolves the parameter before
//!   it evaluates `matchConditions`, so every writer of a governed resource — people and
//!   other controllers too — would be refused. A deleted Lease also ends the current term at
//!   its next renewal (not held), so no leader is running then. `tenure policy` and the
//!   chart create the Lease (empty) with the policy, so it exists from the start.
//!
//! # Without the policy
//!
//! [`Fencer::without_policy`] sends no request token (no impersonation RBAC needed) and keeps
//! the client-side half: the local refusal once the term has ended, the stamp on the object,
//! and, on [`FencedApi::replace`], a refusal when the object read carries a higher token
//! (with its `resourceVersion` a concurrent write makes the replace fail with 409). That only
//! protects objects the writer re-reads; the policy protects every governed object.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo(client: kube::Client, term: tenure::election::Term) -> Result<(), tenure::fence::kube::FenceError> {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Patch, PatchParams};
//! use tenure::fence::kube::{FenceError, FencedApi, Fencer};
//!
//! let fencer = Fencer::new(client).await?; // once per process: learns who we are
//! let cms: FencedApi<ConfigMap> = fencer.namespaced(&term, "default");
//! let patch = serde_json::json!({ "data": { "owner": term.identity() } });
//! match cms.patch("report", &PatchParams::default(), &Patch::Merge(&patch)).await {
//!     Ok(_) => {}
//!     // A newer term exists: stop this one's work, do not retry.
//!     Err(FenceError::Stale { .. } | FenceError::TermEnded { .. }) => return Ok(()),
//!     Err(e) => return Err(e),
//! }
//! # Ok(()) }
//! ```

mod api;
mod check;
mod client;
mod error;
mod policy;
mod proof;
mod proxy;
mod rbac;
#[cfg(test)]
mod script;
mod service;

pub use api::FencedApi;
pub use check::{CheckError, CheckVerdict, OpenCause, Participant, check};
pub use client::Fencer;
pub use error::{Current, FenceError, FenceState};
pub use policy::{ANCHOR_NAME, FencingPolicy, PolicyError};
pub use proof::{DEFAULT_RECHECK, PROOF_WINDOW};
pub use proxy::{FenceProxy, MAX_REQUEST_BODY};
pub use rbac::WorkerRbac;

/// The user extra that carries a request's fencing token (sent as
/// `Impersonate-Extra-tenure.dev%2ffencing-token`), read by the policy.
pub const REQUEST_TOKEN_EXTRA: &str = "tenure.dev/fencing-token";

/// The user extra that names the election a fenced request belongs to, `NAMESPACE/LEASE`
/// (sent as `Impersonate-Extra-tenure.dev%2ffencing-election`): each election's policy judges
/// only the requests that name it, so one participant may take part in any number of
/// elections (tokens are resourceVersions, ordered across all Leases: judged against another
/// election's floor, a live term's token would be refused).
pub const REQUEST_ELECTION_EXTRA: &str = "tenure.dev/fencing-election";

/// The annotation a fenced write stamps on the object: the token of the last term that
/// wrote it. The policy refuses a write with a lower token.
pub const OBJECT_TOKEN_ANNOTATION: &str = "tenure.dev/fencing-token";

/// How every refusal message of the policy begins; [`FenceError`] is parsed from it.
pub const REFUSAL_PREFIX: &str = "tenure fencing:";
