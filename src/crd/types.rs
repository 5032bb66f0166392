//! The `Election` resource's Rust types: spec, status, candidates and the backend reference.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use kube::core::Duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::DURATION_PATTERN;
use super::duration::deserialize_optional;
use crate::election::{HandoffCause, LeaderElector};
use crate::shard::ShardedElector;

/// The condition type the publisher maintains: `True` while a leader is published.
pub const LEADER_ELECTED: &str = "LeaderElected";

/// What an `Election` describes: one lease, where it lives, and the elector's durations.
///
/// The spec is documentation for humans and tools (`kubectl get elections -o yaml`); the
/// electors do not read it. Secrets (a Redis URL or password) never belong here.
// kube's `printcolumn(...)` repeats keys (`type_`, `priority`) by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "tenure.dev",
    version = "v1alpha1",
    kind = "Election",
    plural = "elections",
    singular = "election",
    shortname = "el",
    category = "tenure",
    namespaced,
    status = "ElectionStatus",
    derive = "PartialEq",
    doc = "A leader election run by tenure: the lease it is about (spec) and who leads it, as published by the candidates (status). The status is an informational, eventually consistent view; never use it for fencing.",
    printcolumn(
        name = "Leader",
        type_ = "string",
        json_path = ".status.leader",
        description = "The identity of the current leader, as last published"
    ),
    printcolumn(
        name = "Token",
        type_ = "integer",
        json_path = ".status.fencingToken",
        description = "The fencing token of the current leader's term"
    ),
    printcolumn(
        name = "Shards",
        type_ = "integer",
        json_path = ".status.shardCount",
        description = "A sharded group: its shard count, as its members last published it"
    ),
    printcolumn(
        name = "Held",
        type_ = "integer",
        json_path = ".status.heldShards",
        description = "A sharded group: how many of its shards have a published holder"
    ),
    printcolumn(
        name = "Transitions",
        type_ = "integer",
        json_path = ".status.transitions",
        description = "How many times a new term was published after the first",
        priority = 1
    ),
    printcolumn(
        name = "Handoff",
        type_ = "string",
        json_path = ".status.lastHandoff.reason",
        description = "Why the last leader ended its term on purpose",
        priority = 1
    ),
    printcolumn(
        name = "Lease",
        type_ = "string",
        json_path = ".spec.lease",
        description = "The lease's name in its backend",
        priority = 1
    ),
    printcolumn(
        name = "Backend",
        type_ = "string",
        json_path = ".spec.backend.type",
        description = "Where the lease lives",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ElectionSpec {
    /// The lease's name in its backend (the Lease object's name, or the Redis lock name).
    #[schemars(length(min = 1, max = 253))]
    pub lease: String,
    /// Where the lease lives.
    pub backend: ElectionBackend,
    /// How long a lease lasts without renewal (Go duration syntax, e.g. `15s`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_optional"
    )]
    #[schemars(pattern(DURATION_PATTERN))]
    pub lease_duration: Option<Duration>,
    /// How long a leader keeps trying to renew before it steps down (e.g. `10s`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_optional"
    )]
    #[schemars(pattern(DURATION_PATTERN))]
    pub renew_deadline: Option<Duration>,
    /// The pause between retries of failed requests (e.g. `2s`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_optional"
    )]
    #[schemars(pattern(DURATION_PATTERN))]
    pub retry_period: Option<Duration>,
    /// A sharded group: its shard count. `lease` is then the group's
    /// name, and its shard leases are named `<lease>-<shard>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub shards: Option<u32>,
}

impl ElectionSpec {
    /// A spec for lease `lease` in `backend`, without durations.
    #[must_use]
    pub fn new(lease: impl Into<String>, backend: ElectionBackend) -> Self {
        Self {
            lease: lease.into(),
            backend,
            lease_duration: None,
            renew_deadline: None,
            retry_period: None,
            shards: None,
        }
    }

    /// A spec describing `elector`: its lease's name and its three durations.
    #[must_use]
    pub fn for_elector(elector: &LeaderElector, backend: ElectionBackend) -> Self {
        let (lease_duration, renew_deadline, retry_period) = elector.timings();
        Self {
            lease: elector.lease_name().to_owned(),
            backend,
            lease_duration: Some(lease_duration.into()),
            renew_deadline: Some(renew_deadline.into()),
            retry_period: Some(retry_period.into()),
            shards: None,
        }
    }

    /// A spec describing the sharded group `elector` runs: the group's name, its shard
    /// count and the three durations of every shard's election.
    #[must_use]
    pub fn for_sharded(elector: &ShardedElector, backend: ElectionBackend) -> Self {
        let (lease_duration, renew_deadline, retry_period) = elector.timings();
        Self {
            lease: elector.name().to_owned(),
            backend,
            lease_duration: Some(lease_duration.into()),
            renew_deadline: Some(renew_deadline.into()),
            retry_period: Some(retry_period.into()),
            shards: Some(elector.shards()),
        }
    }
}

/// Where an election's lease lives. Never carries credentials.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElectionBackend {
    /// The kind of store.
    #[serde(rename = "type")]
    pub kind: BackendKind,
    /// Kubernetes: the namespace of the Lease, when it is not the Election's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Redis: the key prefix of the lock's keys, when it is not the default `tenure:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
}

impl ElectionBackend {
    fn of(kind: BackendKind) -> Self {
        Self {
            kind,
            namespace: None,
            key_prefix: None,
        }
    }

    /// A Kubernetes Lease in the Election's own namespace.
    #[must_use]
    pub fn kubernetes() -> Self {
        Self::of(BackendKind::Kubernetes)
    }

    /// A Redis lock under the default key prefix.
    #[must_use]
    pub fn redis() -> Self {
        Self::of(BackendKind::Redis)
    }

    /// The local (one host, files under a directory) backend.
    #[must_use]
    pub fn local() -> Self {
        Self::of(BackendKind::Local)
    }

    /// The in-process memory backend (tests, development).
    #[must_use]
    pub fn memory() -> Self {
        Self::of(BackendKind::Memory)
    }

    /// The namespace of the Lease (Kubernetes).
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The key prefix (Redis).
    #[must_use]
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = Some(prefix.into());
        self
    }
}

/// The kind of store a lease lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum BackendKind {
    /// A `coordination.k8s.io/v1` Lease.
    Kubernetes,
    /// A Redis lock.
    Redis,
    /// The local backend: files under a directory on one host.
    Local,
    /// The in-process memory backend.
    Memory,
}

/// Who leads, as published by the candidates. Every field is optional: an Election nobody
/// has published to yet has an empty status.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElectionStatus {
    /// The identity of the leader, as last published; absent when no leader is published
    /// (none yet, or the last one stepped down and nobody has taken over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// The fencing token of the last published term. Kept when the leader steps down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int64"))]
    pub fencing_token: Option<u64>,
    /// How many times a new term (a new fencing token) was published after the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int64"))]
    pub transitions: Option<u64>,
    /// When the published leader last changed (a new term, or a step-down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// The candidates that published recently, one entry per identity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["identity"]))]
    pub candidates: Vec<Candidate>,
    /// A sharded group: its shard count, as last published by a member holding shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_count: Option<u32>,
    /// A sharded group: how many entries `shards` has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_shards: Option<u32>,
    /// A sharded group: each shard's holder and term, as its holder published it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["shard"]))]
    pub shards: Vec<ShardHolder>,
    /// The last term a leader ended on purpose (a hand-over, a step-down, a graceful
    /// shutdown), as that leader published it: why, from whom, to whom. Only a newer term's
    /// hand-off replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handoff: Option<LastHandoff>,
    /// `LeaderElected`: `True` while a leader is published.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl ElectionStatus {
    /// The `LeaderElected` condition, if present.
    #[must_use]
    pub fn leader_elected(&self) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == LEADER_ELECTED)
    }
}

/// A candidate that published recently.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// The candidate's identity.
    pub identity: String,
    /// When it last published (its own wall clock, whole seconds).
    pub last_seen: Time,
    /// A member of a sharded group: the shard count it runs with (during a change of the
    /// count, members differ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
}

/// One shard of a sharded group and the term that holds it, as its holder published it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardHolder {
    /// The shard's number, `0..shardCount`.
    pub shard: u32,
    /// The identity of the member holding it.
    pub holder: String,
    /// The fencing token of the holder's term of this shard.
    #[schemars(extend("format" = "int64"))]
    pub fencing_token: u64,
}

/// Why a leader ended its term on purpose, in the `Election` status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum HandoffReason {
    /// The leader was shut down gracefully and released the lease.
    GracefulShutdown,
    /// The leader stayed unhealthy for its health policy's bound and handed over to a
    /// healthy follower.
    HealthStepDown,
    /// Asked for: `tenure handoff`, [`LeaderElector::hand_over`], or the workload's
    /// [`Term::step_down`](crate::Term::step_down) / [`Term::hand_over`](crate::Term::hand_over).
    Requested,
    /// The Lease's `spec.preferredHolder` (Kubernetes coordinated leader election) named
    /// another candidate.
    PreferredHolder,
}

impl From<HandoffCause> for HandoffReason {
    fn from(cause: HandoffCause) -> Self {
        match cause {
            HandoffCause::Shutdown => Self::GracefulShutdown,
            HandoffCause::Unhealthy => Self::HealthStepDown,
            HandoffCause::PreferredHolder => Self::PreferredHolder,
            // `HandoffCause` is non-exhaustive: a cause added later reads as a request.
            _ => Self::Requested,
        }
    }
}

/// The last term a leader ended on purpose.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastHandoff {
    /// Why the term ended.
    pub reason: HandoffReason,
    /// The identity that led it.
    pub from: String,
    /// The replica the lease was released to, when the hand-off named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The fencing token of the term that ended.
    #[schemars(extend("format" = "int64"))]
    pub fencing_token: u64,
    /// When the lease was released (the releasing leader's wall clock, whole seconds).
    pub time: Time,
    /// The reason in words, as the caller or the elector gave it (at most 256 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub message: Option<String>,
}
