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
//! | `metadata.annotations["tenure.dev/released-by"]` | `<fencing token>:<identity>` of the term that released last (for `tenure status`; `renewTime` is when) |
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
//! [`BackendErrorKind::Protocol`]: super::BackendErrorKind::Protocol
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
//! A sharded group's replica follows every shard Lease of its count with **one** watch
//! instead ([`follow_shard_leases`](Backend::follow_shard_leases)): a list and watch
//! selected by the label `tenure.dev/shard-group=<group>`, which every shard Lease acquired
//! under it carries. It serves `observe` for those Leases and starts this process's expiry
//! clock for each of them when the replica joins, so a killed member's shards are free one
//! lease after its last renewal, not one lease after their next owner first looks. Requests
//! in flight are bounded (32 per backend; kube's client is HTTP/1.1, a connection each):
//! one process holds 1,000 shard Leases with 75 open files. Eight of the 32 are kept for
//! upkeep — renewals of held leases, the member heartbeat, releases — which is also served
//! first when slots free up, so a burst of acquisitions and reads (or a server stuck on them)
//! never holds a replica's heartbeat past its timeout.
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
//! ([`record_event`](Backend::record_event)) are skipped (logged at debug level); the lease is
//! unaffected.
//!
//! [`BackendErrorKind::PermissionDenied`]: super::BackendErrorKind::PermissionDenied
//!
//! # Interoperability with client-go
//!
//! A client-go elector reads tenure's record as an ordinary LeaderElectionRecord, and tenure
//! reads client-go's: either takes over after the other releases (holder cleared) or after
//! the lease duration has passed on its own clock. A client-go holder has no fencing token;
//! tenure reports its term by the record's `resourceVersion`. Two electors must never share
//! an identity: client-go cannot tell them apart (tenure can, by the holder token).
//!
//! # Group record (sharded leadership)
//!
//! A sharded group's shared parameters ([`GroupRecord`]) live in a Lease named
//! `{group}-group`, as [`GroupRecord::encode`]'s text in the annotation
//! `tenure.dev/group-record` (no `tenure.dev/group` label, so it is not taken for a member).
//! It is read with a direct `GET` (a quorum read; version: its `resourceVersion`) and written
//! by a `POST` when there is none, else a `PUT` carrying the version read: a `409` means
//! another member wrote first. A Lease of that name without the annotation, or with one
//! tenure cannot parse, reads as [`GroupRead::Damaged`].
//!
//! # Completion record (run-once jobs)
//!
//! A run-once job's completion ([`Completion`], `tenure run --once-per`) lives in a Lease named
//! `{lease}-done`: the record in the annotation `tenure.dev/completion`, and in
//! `tenure.dev/completion-check` the token of the latest term that checked it. Both change
//! only by compare-and-swap, and a completion only while the check mark holds the writer's
//! token, so an older term's completion is refused once a newer term has checked. The clock
//! is the API server's: the `managedFields` time it stamps on the check's write (whole
//! seconds). Needs get and update on that Lease (and create on leases).
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
mod completion;
mod error;
mod events;
mod group;
mod inner;
mod members;
mod options;
mod read;
pub(crate) mod record;
mod shard_watch;
mod slots;
mod state;
mod watch;
mod write;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;

use super::{
    AcquireRequest, Acquired, Backend, BackendError, Completion, CompletionCheck, FencingToken,
    GroupRead, GroupRecord, GroupVersion, HolderChange, HolderToken, InvalidName, LeadershipEvent,
    LeaseRecord, Member, Released, Renewed, ShardLeaseWatch,
};
use inner::Inner;
/// The value of a group's [`SHARD_GROUP_LABEL`] (the fencing policy of a sharded group
/// selects its shard Leases by it).
pub(crate) use members::label_value as group_label_value;
pub use options::{DEFAULT_REQUEST_TIMEOUT, KubeOptions};
pub use read::damaged_records;
#[cfg(feature = "metrics")]
pub use read::register_read_metrics;
pub use record::{
    ANNOTATION_PREFIX, FENCING as FENCING_ANNOTATION, FENCING_FLOOR as FENCING_FLOOR_ANNOTATION,
    HOLDER_IDENTITY as HOLDER_IDENTITY_ANNOTATION, HOLDER_TOKEN as HOLDER_TOKEN_ANNOTATION,
    MAX_NAME_LEN, RELEASED_TOKEN as RELEASED_TOKEN_ANNOTATION,
};
pub use shard_watch::SHARD_GROUP_LABEL;

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
        Box::pin(async move {
            self.inner
                .release(&Arc::from(name), holder, None, None)
                .await
        })
    }

    fn release_to<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        to: &'a str,
        window: Duration,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        Box::pin(async move {
            self.inner
                .release(&Arc::from(name), holder, None, Some((to, window)))
                .await
        })
    }

    fn request_handoff<'a>(
        &'a self,
        name: &'a str,
        handoff: &'a crate::backend::Handoff,
        window: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            self.inner
                .request_handoff(&Arc::from(name), handoff, window)
                .await
        })
    }

    fn release_as<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        Box::pin(async move {
            self.inner
                .release(&Arc::from(name), holder, Some(identity), None)
                .await
        })
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseRecord>, BackendError>> {
        Box::pin(async move { self.inner.inspect(&Arc::from(name)).await })
    }

    fn last_term<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<super::EndedTerm>, BackendError>> {
        Box::pin(async move { self.inner.last_term(&Arc::from(name)).await })
    }

    fn record_event<'a>(&'a self, name: &'a str, event: &'a LeadershipEvent) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.inner.record_event(name, event).await {
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

    fn group_record<'a>(
        &'a self,
        group: &'a str,
    ) -> BoxFuture<'a, Result<GroupRead, BackendError>> {
        Box::pin(self.inner.group_record(group))
    }

    fn swap_group_record<'a>(
        &'a self,
        group: &'a str,
        expected: Option<&'a GroupVersion>,
        record: &'a GroupRecord,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(self.inner.swap_group_record(group, expected, record))
    }

    fn check_completion<'a>(
        &'a self,
        name: &'a str,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<CompletionCheck, BackendError>> {
        Box::pin(self.inner.check_completion(name, token))
    }

    fn record_completion<'a>(
        &'a self,
        name: &'a str,
        record: &'a Completion,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(self.inner.record_completion(name, record))
    }

    fn follow_shard_leases(&self, group: &str, leases: &[String]) -> ShardLeaseWatch {
        self.inner.follow_shard_leases(group, leases)
    }

    fn observe(&self, name: &str) -> BoxStream<'static, Result<HolderChange, BackendError>> {
        watch::observe(&self.inner, name)
    }
}
