//! The `Election` custom resource (`tenure.dev/v1alpha1`) and the opt-in status publisher.
//!
//! An [`Election`] describes one lease — its name, where it lives, the elector's durations —
//! and its status shows who leads it, as published by the candidates themselves, so that
//! `kubectl get elections` answers "who leads?" for every backend, Redis included:
//!
//! ```text
//! $ kubectl get elections
//! NAME            LEADER   TOKEN   AGE
//! my-controller   pod-b    1742    3d
//! $ kubectl get el -o wide        # also TRANSITIONS, LEASE, BACKEND
//! ```
//!
//! A sharded group ([`StatusPublisher::run_sharded`]) shows its count and how many shards
//! have a published holder; `-o yaml` lists each shard's holder and token:
//!
//! ```text
//! NAME    LEADER   TOKEN   SHARDS   HELD   AGE
//! crawl                    4        4      2m
//! ```
//!
//! # Installing the CRD
//!
//! [`crd()`] and [`crd_yaml()`] generate it; the same YAML is committed as
//! `crds/election.yaml` (and ships in the Helm chart's `crds/`), and `tenure crd` prints it:
//!
//! ```text
//! tenure crd | kubectl apply -f -
//! ```
//!
//! # The resource
//!
//! | field | meaning |
//! |---|---|
//! | `spec.lease` | the lease's name in its backend |
//! | `spec.backend.type` | `Kubernetes`, `Redis`, `Local` or `Memory`; plus `namespace` (Kubernetes) or `keyPrefix` (Redis). Never credentials. |
//! | `spec.leaseDuration`, `spec.renewDeadline`, `spec.retryPeriod` | Go duration strings (`metav1.Duration`: `15s`, `1.5s`, `500ms`) |
//! | `status.leader` | the identity of the published leader; absent when none is published |
//! | `status.fencingToken` | the fencing token of the last published term (`int64`) |
//! | `status.transitions` | how many times a new term was published after the first |
//! | `status.lastTransitionTime` | when the published leader last changed |
//! | `status.candidates[]` | `identity` and `lastSeen` of each candidate that published recently; `shards`: a sharded group's member's count |
//! | `spec.shards`, `status.shardCount`, `status.heldShards` | a sharded group: its count (`spec.lease` is then the group's name), as its members run it, and how many shards have a published holder |
//! | `status.shards[]` | a sharded group: `shard`, `holder` and `fencingToken` of each held shard, each published by its holder |
//! | `status.lastHandoff` | the last term a leader ended on purpose, as it published it: `reason` (`GracefulShutdown`, `HealthStepDown`, `Requested` — `tenure handoff`, `LeaderElector::hand_over`, `Term::step_down` —, `PreferredHolder`), `from`, `to` (a targeted hand-over), the ended term's `fencingToken`, `time` (the leader's wall clock), `message`; a lease lost or run out is no hand-off |
//! | `status.conditions[]` | `LeaderElected`: `True` (reason `Elected`) while a leader is published, `False` (reason `SteppedDown`) after it stepped down and nobody took over |
//!
//! Durations are strings rather than integer seconds because leases shorter than a second
//! exist (tests, local use). The fencing token is an `int64` in the schema: the API server
//! stores integers as `int64` and refuses larger values, whatever `format` says; every
//! backend's tokens stay far below that, and a token above it is not published
//! ([`PublishError::TokenOutOfRange`]).
//!
//! # Publishing
//!
//! A [`StatusPublisher`] follows one [`LeaderElector`](crate::LeaderElector) — on any
//! backend: the lease may live in Redis while the Election lives in Kubernetes — and
//! writes its view:
//!
//! ```no_run
//! use tenure::backend::kube::{KubeBackend, KubeOptions};
//! use tenure::crd::{ElectionBackend, ElectionSpec, StatusPublisher};
//! use tenure::election::{ElectionConfig, LeaderElector};
//! use tenure::Locker;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = kube::Client::try_default().await?;
//! let backend = KubeBackend::from_client(client.clone(), KubeOptions::new())?;
//! let elector = LeaderElector::new(Locker::new(backend), "my-controller", ElectionConfig::new())?;
//!
//! let spec = ElectionSpec::for_elector(&elector, ElectionBackend::kubernetes());
//! let publisher = StatusPublisher::new(client, "my-namespace", "my-controller")
//!     .create_if_missing(spec);
//! let shutdown = CancellationToken::new();
//! let publishing = tokio::spawn(publisher.run(elector.clone(), shutdown.clone().cancelled_owned()));
//!
//! elector
//!     .run_until(shutdown.cancelled(), |term| async move {
//!         // reconcile, stamping term.fencing_token() on every write
//!         term.cancellation().cancelled().await;
//!     })
//!     .await?;
//! shutdown.cancel();
//! publishing.await?;
//! # Ok(()) }
//! ```
//!
//! ## What is written, and when
//!
//! Every write reads the status and replaces it with the `resourceVersion` it read (a
//! compare-and-swap); on `409 Conflict` it reads again and retries, up to 5 times with a
//! short randomized backoff. A write that would change nothing is not sent.
//!
//! | when | what |
//! |---|---|
//! | the publisher starts | this candidate's `candidates[]` entry |
//! | this elector becomes leader | `leader`, `fencingToken`, `lastTransitionTime`, `LeaderElected=True`, and `transitions + 1` — only if the status's token is lower than the term's, so replays and late writes of an older term change nothing |
//! | every [heartbeat](StatusPublisher::heartbeat) (default max(4 × lease duration, 60 s)) | this candidate's `lastSeen`; entries not seen for [3 heartbeats](StatusPublisher::prune_after) are removed |
//! | 2 × lease duration after this elector stopped leading, if nobody published since | `leader` removed, `LeaderElected=False` |
//! | this elector ended a term on purpose ([`LeaderElector::last_handoff`](crate::LeaderElector::last_handoff)) | `lastHandoff`, unless it shows a newer term's |
//! | the publisher shuts down | this candidate's entry removed; `leader` removed if it still shows this candidate's last term, and then `lastHandoff` says `GracefulShutdown` |
//!
//! Writes never follow renewals: a candidate writes once when it starts, about once per
//! heartbeat, at most three times per term it leads (its start, its hand-off, the check after it), and once when it shuts down — and, shutdown
//! aside, never twice within [`min_interval`](StatusPublisher::min_interval) (default 1 s).
//! Each write refreshes this candidate's own entry. Measured against a real API server: two
//! candidates on a 300 ms lease (78 renewals in 8 s) with a 2 s heartbeat made 12–13 status
//! writes in all.
//!
//! ## Failures
//!
//! A failed write (no permission, no Election and no `create_if_missing`, API server down)
//! is logged with `tracing` — at `warn` the first time, then at most every 5 minutes per kind
//! of failure, at `debug` in between — counted in [`PublisherStats`], and retried after a
//! backoff that starts at max(1 s, min interval) and doubles up to the heartbeat. It
//! **never** affects the lease or the workload: the publisher only reads the elector's
//! state, and the elector does not know it exists.
//!
//! ## Permissions
//!
//! A Role in the Election's namespace, with exactly the verbs the publisher uses:
//!
//! ```yaml
//! apiVersion: rbac.authorization.k8s.io/v1
//! kind: Role
//! metadata: { name: tenure-election-status, namespace: my-namespace }
//! rules:
//! - apiGroups: ["tenure.dev"]
//!   resources: ["elections/status"]
//!   verbs: ["get", "update"]
//! - apiGroups: ["tenure.dev"]     # only with `create_if_missing`
//!   resources: ["elections"]
//!   verbs: ["create"]
//! ```
//!
//! # Guarantees
//!
//! - The status's fencing token never decreases through this publisher, and `transitions`
//!   counts each published term once however often a write is retried or replayed.
//! - Concurrent publishers never overwrite each other's changes (compare-and-swap).
//!
//! # Caveats
//!
//! The status is an **informational, eventually consistent view**. It lags the lease by up
//! to a few seconds, and can name a leader that has crashed until the next leader
//! publishes; `lastSeen` comes from each candidate's wall clock. **Never use it for
//! fencing or to decide who may act**: only a [`Term`](crate::Term)'s fencing token,
//! checked where you write, protects downstream resources. Stop the publisher together with
//! its elector: stopped early, it clears a leader that is still leading until the next term.
//! If the store loses its history so that tokens restart lower (an etcd rebuilt from
//! scratch), the status keeps the higher token until the Election's status is reset.

mod duration;
mod error;
mod publisher;
mod types;

pub use duration::{DURATION_PATTERN, DurationError, parse_duration};
pub use error::PublishError;
pub use publisher::{
    DEFAULT_MIN_INTERVAL, DEFAULT_PRUNE_AFTER, DEFAULT_REQUEST_TIMEOUT, MIN_DEFAULT_HEARTBEAT,
    PublisherStats, StatusPublisher,
};
pub use types::{
    BackendKind, Candidate, Election, ElectionBackend, ElectionSpec, ElectionStatus, HandoffReason,
    LEADER_ELECTED, LastHandoff, ShardHolder,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The comment [`crd_yaml`] starts with.
const YAML_HEADER: &str = "\
# The Election CRD (tenure.dev/v1alpha1), generated by `tenure crd` (tenure::crd::crd_yaml()).
# Do not edit: regenerate with `TENURE_BLESS=1 cargo test --features crd,conformance --test crd`.
";

/// The name of the CustomResourceDefinition: `elections.tenure.dev`.
pub const CRD_NAME: &str = "elections.tenure.dev";

/// The `Election` CustomResourceDefinition, as generated from the Rust types.
///
/// # Example
///
/// ```
/// let crd = tenure::crd::crd();
/// assert_eq!(crd.metadata.name.as_deref(), Some(tenure::crd::CRD_NAME));
/// ```
#[must_use]
pub fn crd() -> CustomResourceDefinition {
    Election::crd()
}

/// The CRD as YAML: the content of `crds/election.yaml` (what `tenure crd` prints).
///
/// # Example
///
/// ```
/// let yaml = tenure::crd::crd_yaml();
/// assert!(yaml.contains("name: elections.tenure.dev"));
/// ```
#[must_use]
pub fn crd_yaml() -> String {
    let body = match serde_saphyr::to_string(&crd()) {
        Ok(yaml) => yaml,
        // Unreachable in practice (a CRD is plain data); JSON is valid YAML.
        Err(_) => serde_json::to_string_pretty(&crd()).unwrap_or_default(),
    };
    format!("{YAML_HEADER}{body}")
}
