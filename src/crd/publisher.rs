//! Keeps an `Election`'s status in step with one elector's view, with few, bounded writes.
//!
//! [`StatusPublisher`] and its options here; the task it runs in `task.rs`, the status write
//! as pure functions in `status.rs`, when to write in `schedule.rs`, the counters in
//! `stats.rs`.

mod schedule;
mod sharded;
mod stats;
mod status;
mod task;

use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject};
use tracing::Instrument;

pub use stats::PublisherStats;

use super::types::{Election, ElectionSpec};
use crate::election::LeaderElector;
use crate::shard::ShardedElector;

/// The default [`min_interval`](StatusPublisher::min_interval).
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The floor of the default [`heartbeat`](StatusPublisher::heartbeat).
pub const MIN_DEFAULT_HEARTBEAT: Duration = Duration::from_secs(60);
/// The default [`request_timeout`](StatusPublisher::request_timeout).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The default [`prune_after`](StatusPublisher::prune_after), in heartbeats.
pub const DEFAULT_PRUNE_AFTER: u32 = 3;

/// Publishes one elector's view into an `Election`'s status. See the [module docs](super)
/// for what it writes, when, and the permissions it needs.
///
/// # Example
///
/// ```no_run
/// use tenure::crd::{ElectionBackend, ElectionSpec, StatusPublisher};
/// # async fn run(client: kube::Client, elector: tenure::LeaderElector) {
/// let spec = ElectionSpec::for_elector(&elector, ElectionBackend::kubernetes());
/// let publisher = StatusPublisher::new(client, "my-namespace", "my-controller")
///     .create_if_missing(spec);
/// let stats = publisher.stats();
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// tokio::spawn(publisher.run(elector.clone(), shutdown.clone().cancelled_owned()));
/// // ... elector.run_until(shutdown.cancelled(), workload).await ...
/// # let _ = stats;
/// # }
/// ```
#[must_use]
pub struct StatusPublisher {
    api: Api<DynamicObject>,
    creator: Api<Election>,
    namespace: String,
    name: String,
    min_interval: Duration,
    heartbeat: Option<Duration>,
    prune_after: u32,
    request_timeout: Duration,
    create: Option<ElectionSpec>,
    clear_on_shutdown: bool,
    stats: PublisherStats,
}

impl std::fmt::Debug for StatusPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusPublisher")
            .field("election", &self.election())
            .field("min_interval", &self.min_interval)
            .field("heartbeat", &self.heartbeat)
            .field("prune_after", &self.prune_after)
            .field("request_timeout", &self.request_timeout)
            .field("create_if_missing", &self.create.is_some())
            .field("clear_on_shutdown", &self.clear_on_shutdown)
            .finish_non_exhaustive()
    }
}

impl StatusPublisher {
    /// A publisher into the status of `Election` `name` in `namespace`, through `client`.
    ///
    /// | option | default |
    /// |---|---|
    /// | [`min_interval`](Self::min_interval) | 1 s |
    /// | [`heartbeat`](Self::heartbeat) | max(4 × lease duration, 60 s) |
    /// | [`prune_after`](Self::prune_after) | 3 heartbeats |
    /// | [`request_timeout`](Self::request_timeout) | 5 s |
    /// | [`create_if_missing`](Self::create_if_missing) | off: a missing Election is an error |
    /// | [`clear_on_shutdown`](Self::clear_on_shutdown) | on |
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        let resource = ApiResource::erase::<Election>(&());
        Self {
            api: Api::namespaced_with(client.clone(), namespace, &resource),
            creator: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            min_interval: DEFAULT_MIN_INTERVAL,
            heartbeat: None,
            prune_after: DEFAULT_PRUNE_AFTER,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            create: None,
            clear_on_shutdown: true,
            stats: PublisherStats::default(),
        }
    }

    /// The least time between two status writes of this publisher. A change of leadership
    /// that comes sooner is published when the interval has passed.
    pub fn min_interval(mut self, interval: Duration) -> Self {
        self.min_interval = interval;
        self
    }

    /// How often this candidate refreshes its own `status.candidates[]` entry. Jittered by
    /// up to −10 % so that candidates started together do not write together.
    pub fn heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = Some(heartbeat);
        self
    }

    /// Entries of `status.candidates[]` not seen for this many heartbeats (of this
    /// publisher's) are removed by the next write. At least 2.
    pub fn prune_after(mut self, heartbeats: u32) -> Self {
        self.prune_after = heartbeats.max(2);
        self
    }

    /// The bound on each API request.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Creates the `Election` with `spec` when it does not exist (needs `create` on
    /// `elections`). Without it, a missing Election is reported and retried.
    pub fn create_if_missing(mut self, spec: ElectionSpec) -> Self {
        self.create = Some(spec);
        self
    }

    /// On shutdown, remove this candidate's entry and, if the status still shows this
    /// candidate as the leader of its last term, clear the leader (default on).
    pub fn clear_on_shutdown(mut self, on: bool) -> Self {
        self.clear_on_shutdown = on;
        self
    }

    /// Counters and the latest error of this publisher; a handle that stays valid (and
    /// current) after [`run`](Self::run) consumed the publisher.
    pub fn stats(&self) -> PublisherStats {
        self.stats.clone()
    }

    fn election(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The span every log line of this publisher's task carries.
    fn span(&self, identity: &str) -> tracing::Span {
        tracing::info_span!("election_status", election = %self.election(), identity = %identity)
    }

    /// Follows `elector` and publishes its view until `shutdown` completes. Never fails:
    /// errors are logged (rate-limited), counted in [`stats`](Self::stats) and retried with
    /// a backoff. Run it beside [`LeaderElector::run_until`] with the same shutdown signal.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops publishing at once; a write in flight may or may not land.
    /// Nothing is cleared then: use `shutdown` for a graceful stop.
    pub async fn run<S>(self, elector: LeaderElector, shutdown: S)
    where
        S: Future<Output = ()>,
    {
        let span = self.span(elector.identity());
        self.follow(&elector, shutdown).instrument(span).await;
    }

    /// Follows a member of a sharded group and publishes, until `shutdown` completes, the
    /// shards it holds (`status.shards[]`: shard, holder, fencing token), its shard count
    /// (its `status.candidates[]` entry, and `status.shardCount` while it holds shards) and
    /// `status.heldShards`. Each member replaces only its own entries; a newer term's entry
    /// (a higher token) is never overwritten, and the entries of members pruned from the
    /// candidates go with them. Run one per member, on the group's `Election`
    /// ([`ElectionSpec::for_sharded`]), beside [`ShardedElector::run_until`]; errors are
    /// handled as in [`run`](Self::run).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use tenure::crd::{ElectionBackend, ElectionSpec, StatusPublisher};
    /// # async fn run(client: kube::Client, group: tenure::shard::ShardedElector) {
    /// let spec = ElectionSpec::for_sharded(&group, ElectionBackend::kubernetes());
    /// let publisher = StatusPublisher::new(client, "my-namespace", group.name())
    ///     .create_if_missing(spec);
    /// let shutdown = tokio_util::sync::CancellationToken::new();
    /// tokio::spawn(publisher.run_sharded(group.clone(), shutdown.clone().cancelled_owned()));
    /// // ... group.run_until(shutdown.cancelled(), workload).await ...
    /// # }
    /// ```
    pub async fn run_sharded<S>(self, elector: ShardedElector, shutdown: S)
    where
        S: Future<Output = ()>,
    {
        let span = self.span(elector.identity());
        self.follow_sharded(&elector, shutdown)
            .instrument(span)
            .await;
    }
}
