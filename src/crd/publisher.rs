//! Keeps an `Election`'s status in step with one elector's view, with few, bounded writes.

use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::Value;
use tokio::time::Instant;
use tracing::Instrument;

use super::error::PublishError;
use super::types::{Candidate, Election, ElectionSpec, ElectionStatus, LEADER_ELECTED};
use crate::FencingToken;
use crate::election::{Leader, LeaderElector};

/// The default [`min_interval`](StatusPublisher::min_interval).
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The floor of the default [`heartbeat`](StatusPublisher::heartbeat).
pub const MIN_DEFAULT_HEARTBEAT: Duration = Duration::from_secs(60);
/// The default [`request_timeout`](StatusPublisher::request_timeout).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The default [`prune_after`](StatusPublisher::prune_after), in heartbeats.
pub const DEFAULT_PRUNE_AFTER: u32 = 3;

/// A repeated failure of the same kind is logged at `warn` at most this often.
const LOG_EVERY: Duration = Duration::from_secs(300);
/// Compare-and-swap attempts per write before giving up until the next backoff.
const CAS_ATTEMPTS: u32 = 5;
/// The fields of `.status` this publisher owns; others (from a newer version) are kept.
const OWNED_FIELDS: [&str; 6] = [
    "leader",
    "fencingToken",
    "transitions",
    "lastTransitionTime",
    "candidates",
    "conditions",
];

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
        let span = tracing::info_span!(
            "election_status",
            election = %self.election(),
            identity = %elector.identity(),
        );
        self.follow(&elector, shutdown).instrument(span).await;
    }

    async fn follow<S: Future<Output = ()>>(&self, elector: &LeaderElector, shutdown: S) {
        let (lease_duration, _, _) = elector.timings();
        // Saturating arithmetic throughout: durations come from the caller unbounded, and an
        // overflow must not panic the publisher (a `Duration::MAX` heartbeat means "never").
        let heartbeat = self
            .heartbeat
            .unwrap_or_else(|| lease_duration.saturating_mul(4).max(MIN_DEFAULT_HEARTBEAT))
            .max(Duration::from_millis(10));
        let prune_older_than = heartbeat.saturating_mul(self.prune_after);
        let step_down_grace = lease_duration.saturating_mul(2);
        let poll_every = self
            .min_interval
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut leader_rx = elector.leader();
        let mut shutdown = pin!(shutdown);
        let mut poll = tokio::time::interval(poll_every);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut st = State {
            published: None,
            want: None,
            step_down: None,
            heartbeat_at: Instant::now(),
            not_before: Instant::now(),
            backoff: None,
            logged: LogGate::default(),
            spec_checked: false,
        };
        loop {
            let term = leading(elector, &leader_rx.borrow_and_update());
            st.observe(term, after(Instant::now(), step_down_grace));
            let due = st.due();
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                changed = leader_rx.changed() => {
                    if changed.is_err() {
                        // Cannot happen while we hold the elector; avoid a busy loop anyway.
                        poll.tick().await;
                    }
                }
                _ = poll.tick() => {}
                () = tokio::time::sleep_until(due) => {
                    let now = Instant::now();
                    let term = leading(elector, &leader_rx.borrow());
                    st.observe(term, after(now, step_down_grace));
                    let intent = Intent {
                        identity: elector.identity(),
                        lead: st.want,
                        clear: st.step_down.filter(|(_, at)| *at <= now).map(|(t, _)| t),
                        heartbeat: st.heartbeat_at <= now,
                        leave: false,
                        prune_older_than,
                    };
                    if intent.is_empty() {
                        continue;
                    }
                    let lease = elector.lease_name();
                    let result = tokio::select! {
                        () = &mut shutdown => break,
                        result = self.sync(&intent, lease, &mut st.spec_checked, true) => result,
                    };
                    let settings = Settings {
                        min_interval: self.min_interval,
                        heartbeat,
                    };
                    st.settle(&intent, result, &self.stats, settings);
                }
            }
        }
        if self.clear_on_shutdown {
            let intent = Intent {
                identity: elector.identity(),
                lead: None,
                clear: st.published,
                heartbeat: false,
                leave: true,
                prune_older_than,
            };
            let bound = self.request_timeout.saturating_mul(2);
            // Never create the Election just to leave it.
            let mut spec_checked = true;
            let leave = self.sync(&intent, elector.lease_name(), &mut spec_checked, false);
            match tokio::time::timeout(bound, leave).await {
                Ok(Ok(wrote)) => {
                    if wrote {
                        self.stats.inner.writes.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::debug!(wrote, "left the election's status");
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "could not leave the election's status"),
                Err(_) => tracing::debug!("leaving the election's status timed out"),
            }
        }
    }

    /// One read-modify-write of the status (compare-and-swap on `resourceVersion`, re-read
    /// and retried on conflict). Returns whether it wrote. Creates a missing Election when
    /// `may_create` and [`create_if_missing`](Self::create_if_missing) allow it.
    async fn sync(
        &self,
        intent: &Intent<'_>,
        lease: &str,
        spec_checked: &mut bool,
        may_create: bool,
    ) -> Result<bool, PublishError> {
        let election = self.election();
        if let Some(token) = intent.lead.or(intent.clear)
            && i64::try_from(token.get()).is_err()
        {
            return Err(PublishError::TokenOutOfRange { token: token.get() });
        }
        let mut conflicts = 0;
        let mut created = false;
        loop {
            let op = || format!("get elections/status {election}");
            let mut object = match self.call(op(), self.api.get_status(&self.name)).await {
                Ok(object) => object,
                Err(PublishError::NotFound { .. })
                    if may_create && !created && self.create.is_some() =>
                {
                    self.create_election().await?;
                    created = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !*spec_checked {
                *spec_checked = true;
                let described = object.data.pointer("/spec/lease").and_then(Value::as_str);
                if described.is_some_and(|d| d != lease) {
                    tracing::warn!(
                        described,
                        lease,
                        "the election's spec describes another lease than this elector's; publishing anyway"
                    );
                }
            }
            let existing = object.data.get("status").cloned().unwrap_or(Value::Null);
            let mut status: ElectionStatus = if existing.is_null() {
                ElectionStatus::default()
            } else {
                serde_json::from_value(existing.clone()).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "the election's status does not parse; rewriting it");
                    salvage(&existing)
                })
            };
            let generation = object.metadata.generation;
            if !apply(&mut status, intent, generation, now_seconds()) {
                return Ok(false);
            }
            object.data["status"] = merge_status(existing, &status);
            let op = format!("update elections/status {election}");
            let pp = PostParams::default();
            let put = self.api.replace_status(&self.name, &pp, &object);
            match self.call(op, put).await {
                Ok(_) => return Ok(true),
                Err(PublishError::Conflict { .. }) => {
                    conflicts += 1;
                    self.stats.inner.conflicts.fetch_add(1, Ordering::Relaxed);
                    if conflicts >= CAS_ATTEMPTS {
                        return Err(PublishError::Conflict {
                            election,
                            attempts: conflicts,
                        });
                    }
                    let base = Duration::from_millis(20) * 2u32.pow(conflicts);
                    let jitter = Duration::from_millis(crate::util::random_u64() % 20);
                    tokio::time::sleep(base + jitter).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn create_election(&self) -> Result<(), PublishError> {
        let Some(spec) = &self.create else {
            return Ok(());
        };
        let election = Election::new(&self.name, spec.clone());
        let op = format!("create elections {}", self.election());
        match self
            .call(op, self.creator.create(&PostParams::default(), &election))
            .await
        {
            Ok(_) => {
                tracing::info!("created the election");
                Ok(())
            }
            // Another candidate created it first.
            Err(PublishError::Conflict { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn call<T>(
        &self,
        op: String,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, PublishError> {
        match tokio::time::timeout(self.request_timeout, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(PublishError::from_kube(e, op, &self.election())),
            Err(_) => Err(PublishError::timeout(op)),
        }
    }
}

/// The fencing token of this elector's term if it leads right now.
fn leading(elector: &LeaderElector, leader: &Option<Leader>) -> Option<FencingToken> {
    let leader = leader.as_ref()?;
    if leader.identity != elector.identity() || !elector.is_leader() {
        return None;
    }
    leader.fencing
}

/// Now, truncated to whole seconds as `metav1.Time` serializes it, so that comparing a
/// computed status with a read one is exact.
fn now_seconds() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

/// What one write should do.
#[derive(Debug)]
struct Intent<'a> {
    identity: &'a str,
    /// Publish this candidate as the leader of the term with this token.
    lead: Option<FencingToken>,
    /// Clear the leader if the status shows this candidate leading the term with this token.
    clear: Option<FencingToken>,
    /// Refresh this candidate's entry (and write even if nothing else changed).
    heartbeat: bool,
    /// Remove this candidate's entry.
    leave: bool,
    /// Remove other candidates not seen for this long.
    prune_older_than: Duration,
}

impl Intent<'_> {
    fn is_empty(&self) -> bool {
        self.lead.is_none() && self.clear.is_none() && !self.heartbeat && !self.leave
    }
}

/// Applies `intent` to `status`; returns whether anything changed.
///
/// The leader fields only ever move to a higher fencing token: a replayed or late write of
/// an older term changes nothing, and `transitions` grows only when the token changes.
fn apply(
    status: &mut ElectionStatus,
    intent: &Intent<'_>,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let before = status.clone();
    let me = intent.identity;
    if let Some(token) = intent.lead {
        let current = status.fencing_token;
        if current.is_none_or(|c| c < token.get()) {
            status.transitions = Some(match current {
                None => status.transitions.unwrap_or(0),
                Some(_) => status.transitions.unwrap_or(0).saturating_add(1),
            });
            status.fencing_token = Some(token.get());
            status.leader = Some(me.to_owned());
            status.last_transition_time = Some(Time(now));
        } else if current == Some(token.get()) && status.leader.as_deref() != Some(me) {
            // Our own term, cleared or overwritten by a confused writer: put it back.
            status.leader = Some(me.to_owned());
            status.last_transition_time = Some(Time(now));
        }
        if status.fencing_token == Some(token.get()) && status.leader.as_deref() == Some(me) {
            set_condition(
                &mut status.conditions,
                "True",
                "Elected",
                format!("{me} leads the term with fencing token {token}"),
                generation,
                now,
            );
        }
    }
    if let Some(token) = intent.clear
        && status.leader.as_deref() == Some(me)
        && status.fencing_token == Some(token.get())
    {
        status.leader = None;
        status.last_transition_time = Some(Time(now));
        set_condition(
            &mut status.conditions,
            "False",
            "SteppedDown",
            format!(
                "{me} stepped down from the term with fencing token {token}; no leader published since"
            ),
            generation,
            now,
        );
    }
    // Candidates: prune others not seen for a while; refresh ours on a heartbeat or with
    // any other change, keep it as it is otherwise.
    let cutoff = SignedDuration::try_from(intent.prune_older_than)
        .ok()
        .and_then(|age| now.checked_sub(age).ok())
        .unwrap_or(Timestamp::MIN);
    let mine = status.candidates.iter().find(|c| c.identity == me).cloned();
    status
        .candidates
        .retain(|c| c.identity != me && c.last_seen.0 >= cutoff);
    if !intent.leave {
        let refresh = intent.heartbeat || mine.is_none() || {
            let mut unchanged = status.clone();
            unchanged.candidates.extend(mine.clone());
            sort_candidates(&mut unchanged.candidates);
            let mut original = before.clone();
            sort_candidates(&mut original.candidates);
            unchanged != original
        };
        status.candidates.push(match mine {
            Some(m) if !refresh => m,
            _ => Candidate {
                identity: me.to_owned(),
                last_seen: Time(now),
            },
        });
    }
    sort_candidates(&mut status.candidates);
    *status != before
}

fn sort_candidates(candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| a.identity.cmp(&b.identity));
}

/// Sets the `LeaderElected` condition; its `lastTransitionTime` moves only when its status
/// changes (the Kubernetes convention).
fn set_condition(
    conditions: &mut Vec<Condition>,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) {
    let existing = conditions.iter_mut().find(|c| c.type_ == LEADER_ELECTED);
    match existing {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(now);
                c.status = status.to_owned();
            }
            c.reason = reason.to_owned();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: LEADER_ELECTED.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: generation,
            last_transition_time: Time(now),
        }),
    }
}

/// What can be kept of a status that does not parse: the fencing token and the transition
/// count when they are readable, so that the published token never goes down.
fn salvage(existing: &Value) -> ElectionStatus {
    ElectionStatus {
        fencing_token: existing.get("fencingToken").and_then(Value::as_u64),
        transitions: existing.get("transitions").and_then(Value::as_u64),
        ..ElectionStatus::default()
    }
}

/// The status to write: `existing` with the fields this publisher owns replaced by
/// `status`'s, so fields written by a newer version survive.
fn merge_status(existing: Value, status: &ElectionStatus) -> Value {
    let mut out = match existing {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    for field in OWNED_FIELDS {
        out.remove(field);
    }
    if let Ok(Value::Object(ours)) = serde_json::to_value(status) {
        out.extend(ours);
    }
    Value::Object(out)
}

/// Timings `settle` needs.
#[derive(Clone, Copy)]
struct Settings {
    min_interval: Duration,
    heartbeat: Duration,
}

/// The publisher's bookkeeping between writes.
struct State {
    /// The token of the term the status shows this candidate leading, as far as we know.
    published: Option<FencingToken>,
    /// The token of our current term, not yet published.
    want: Option<FencingToken>,
    /// Our published term ended: check (and clear if nobody took over) at this instant.
    step_down: Option<(FencingToken, Instant)>,
    heartbeat_at: Instant,
    /// No write before this instant (the rate limit, and the backoff after failures).
    not_before: Instant,
    backoff: Option<Duration>,
    logged: LogGate,
    spec_checked: bool,
}

impl State {
    /// Takes in whether (and in which term) this candidate leads now.
    fn observe(&mut self, leading: Option<FencingToken>, step_down_at: Instant) {
        match leading {
            Some(token) => {
                self.step_down = None;
                self.want = (self.published != Some(token)).then_some(token);
            }
            None => {
                self.want = None;
                if let Some(token) = self.published
                    && self.step_down.is_none()
                {
                    self.step_down = Some((token, step_down_at));
                }
            }
        }
    }

    /// When the next write is due.
    fn due(&self) -> Instant {
        let mut due = self.heartbeat_at;
        if self.want.is_some() {
            due = Instant::now();
        }
        if let Some((_, at)) = self.step_down {
            due = due.min(at);
        }
        due.max(self.not_before)
    }

    fn settle(
        &mut self,
        intent: &Intent<'_>,
        result: Result<bool, PublishError>,
        stats: &PublisherStats,
        settings: Settings,
    ) {
        let now = Instant::now();
        match result {
            Ok(wrote) => {
                if wrote {
                    stats.inner.writes.fetch_add(1, Ordering::Relaxed);
                    self.not_before = after(now, settings.min_interval);
                    // Every write refreshes our entry.
                    self.heartbeat_at = after(now, jittered(settings.heartbeat));
                } else if intent.heartbeat {
                    self.heartbeat_at = after(now, jittered(settings.heartbeat));
                }
                if let Some(token) = intent.lead {
                    // Published, or a newer term already was: either way nothing is pending.
                    self.published = Some(token);
                    if self.want == Some(token) {
                        self.want = None;
                    }
                }
                if intent.clear.is_some() {
                    self.published = None;
                    self.step_down = None;
                }
                self.backoff = None;
                if self.logged.recover() {
                    tracing::info!("publishing the election's status again");
                }
            }
            Err(e) => {
                stats.inner.failures.fetch_add(1, Ordering::Relaxed);
                let backoff = self
                    .backoff
                    .map_or(settings.min_interval.max(Duration::from_secs(1)), |b| {
                        b.saturating_mul(2)
                    })
                    .min(settings.heartbeat);
                self.backoff = Some(backoff);
                self.not_before = after(now, backoff);
                if self.logged.should_warn(e.kind_name(), now) {
                    tracing::warn!(error = %e, retry_in = ?backoff, "cannot publish the election's status; the lease and the workload are unaffected");
                } else {
                    tracing::debug!(error = %e, retry_in = ?backoff, "cannot publish the election's status");
                }
                *stats
                    .inner
                    .last_error
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
            }
        }
    }
}

/// `now + d`, or about 30 years from now when that does not fit an `Instant` (tokio's own
/// "far future"): never a panic on a huge caller-supplied duration.
fn after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(86_400 * 365 * 30)))
        .unwrap_or(now)
}

/// `d` minus up to 10 %, at random.
fn jittered(d: Duration) -> Duration {
    let tenth = d / 10;
    let nanos = u64::try_from(tenth.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return d;
    }
    d - Duration::from_nanos(crate::util::random_u64() % nanos)
}

/// Rate-limits failure logs: a kind of failure is logged at `warn` when it first happens
/// and then at most every [`LOG_EVERY`]; repeats in between go to `debug`.
#[derive(Default)]
struct LogGate {
    last: Option<(&'static str, Instant)>,
    failing: bool,
}

impl LogGate {
    fn should_warn(&mut self, kind: &'static str, now: Instant) -> bool {
        self.failing = true;
        let warn = match self.last {
            Some((k, at)) => k != kind || now.duration_since(at) >= LOG_EVERY,
            None => true,
        };
        if warn {
            self.last = Some((kind, now));
        }
        warn
    }

    /// Whether a failure streak just ended.
    fn recover(&mut self) -> bool {
        std::mem::take(&mut self.failing)
    }
}

/// Counters of a [`StatusPublisher`], shared with it: cheap to clone, always current.
#[derive(Clone, Default)]
pub struct PublisherStats {
    inner: Arc<StatsInner>,
}

#[derive(Default)]
struct StatsInner {
    writes: AtomicU64,
    conflicts: AtomicU64,
    failures: AtomicU64,
    last_error: Mutex<Option<PublishError>>,
}

impl std::fmt::Debug for PublisherStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherStats")
            .field("writes", &self.writes())
            .field("conflicts", &self.conflicts())
            .field("failures", &self.failures())
            .field("last_error", &self.last_error())
            .finish()
    }
}

impl PublisherStats {
    /// Status writes that succeeded.
    #[must_use]
    pub fn writes(&self) -> u64 {
        self.inner.writes.load(Ordering::Relaxed)
    }

    /// Writes that lost a compare-and-swap race and were retried.
    #[must_use]
    pub fn conflicts(&self) -> u64 {
        self.inner.conflicts.load(Ordering::Relaxed)
    }

    /// Publishing attempts that failed (each retried later).
    #[must_use]
    pub fn failures(&self) -> u64 {
        self.inner.failures.load(Ordering::Relaxed)
    }

    /// The latest failure, kept after later successes.
    #[must_use]
    pub fn last_error(&self) -> Option<PublishError> {
        self.inner
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn intent(identity: &str) -> Intent<'_> {
        Intent {
            identity,
            lead: None,
            clear: None,
            heartbeat: false,
            leave: false,
            prune_older_than: Duration::from_secs(180),
        }
    }

    fn token(t: u64) -> Option<FencingToken> {
        Some(FencingToken::new(t))
    }

    #[test]
    fn apply_should_publish_a_term_once_and_count_transitions_by_token() {
        let mut s = ElectionStatus::default();
        let lead = |t| Intent {
            lead: token(t),
            ..intent("a")
        };
        assert!(apply(&mut s, &lead(10), Some(1), at(0)));
        assert_eq!(
            (s.leader.as_deref(), s.fencing_token, s.transitions),
            (Some("a"), Some(10), Some(0))
        );
        assert_eq!(s.leader_elected().map(|c| c.status.as_str()), Some("True"));
        // A replay of the same term changes nothing, even later.
        assert!(!apply(&mut s, &lead(10), Some(1), at(5)));
        // A late write of an older term changes nothing either.
        assert!(!apply(&mut s, &lead(7), Some(1), at(6)));
        assert_eq!(s.fencing_token, Some(10));
        // A new term counts one transition; the condition keeps its transition time.
        let b = Intent {
            lead: token(12),
            ..intent("b")
        };
        assert!(apply(&mut s, &b, Some(1), at(9)));
        assert_eq!(
            (s.leader.as_deref(), s.fencing_token, s.transitions),
            (Some("b"), Some(12), Some(1))
        );
        let cond = s
            .leader_elected()
            .cloned()
            .unwrap_or_else(|| panic!("{s:?}"));
        assert_eq!(cond.last_transition_time, Time(at(0)));
        assert!(cond.message.contains('b'));
        assert_eq!(s.last_transition_time, Some(Time(at(9))));
    }

    #[test]
    fn apply_should_clear_only_its_own_term() {
        let mut s = ElectionStatus::default();
        let a = |t| Intent {
            lead: token(t),
            ..intent("a")
        };
        apply(&mut s, &a(10), None, at(0));
        let clear = |t| Intent {
            clear: token(t),
            ..intent("a")
        };
        // Another candidate published a newer term: a's clear of term 10 does nothing.
        let mut newer = s.clone();
        apply(
            &mut newer,
            &Intent {
                lead: token(11),
                ..intent("b")
            },
            None,
            at(1),
        );
        let before = newer.clone();
        assert!(!apply(&mut newer, &clear(10), None, at(2)));
        assert_eq!(newer, before);
        // Its own term is cleared, the token and transitions kept.
        assert!(apply(&mut s, &clear(10), None, at(3)));
        assert_eq!((s.leader.as_deref(), s.fencing_token), (None, Some(10)));
        assert_eq!(s.leader_elected().map(|c| c.status.as_str()), Some("False"));
        assert_eq!(
            s.leader_elected().map(|c| c.reason.as_str()),
            Some("SteppedDown")
        );
    }

    #[test]
    fn apply_should_refresh_on_heartbeats_prune_the_silent_and_leave() {
        let mut s = ElectionStatus::default();
        assert!(apply(&mut s, &intent("a"), None, at(0)), "first entry");
        assert!(apply(&mut s, &intent("b"), None, at(0)));
        assert!(
            !apply(&mut s, &intent("a"), None, at(60)),
            "no heartbeat, no change"
        );
        let beat = |id| Intent {
            heartbeat: true,
            ..intent(id)
        };
        assert!(apply(&mut s, &beat("a"), None, at(60)));
        assert_eq!(s.candidates[0].last_seen, Time(at(60)));
        // b is silent for longer than the prune age: a's next write removes it.
        assert!(apply(&mut s, &beat("a"), None, at(200)));
        assert_eq!(
            s.candidates
                .iter()
                .map(|c| c.identity.as_str())
                .collect::<Vec<_>>(),
            ["a"]
        );
        let leave = Intent {
            leave: true,
            ..intent("a")
        };
        assert!(apply(&mut s, &leave, None, at(201)));
        assert!(s.candidates.is_empty());
        assert!(!apply(&mut s, &leave, None, at(202)));
    }

    #[test]
    fn salvage_should_keep_the_token_of_a_status_that_does_not_parse() {
        let existing = serde_json::json!({
            "leader": 42,
            "fencingToken": 1_000,
            "transitions": 7,
            "candidates": "garbage",
        });
        assert!(serde_json::from_value::<ElectionStatus>(existing.clone()).is_err());
        let mut s = salvage(&existing);
        assert_eq!((s.fencing_token, s.transitions), (Some(1_000), Some(7)));
        // An older term is still refused after the rewrite.
        let old = Intent {
            lead: token(999),
            ..intent("a")
        };
        apply(&mut s, &old, None, at(0));
        assert_eq!((s.leader, s.fencing_token), (None, Some(1_000)));
    }

    #[test]
    fn after_should_saturate_instead_of_panicking() {
        let now = Instant::now();
        assert!(after(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
        assert_eq!(
            after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }

    #[test]
    fn merge_status_should_keep_fields_it_does_not_own() {
        let existing = serde_json::json!({"leader": "old", "futureField": 3});
        let status = ElectionStatus {
            leader: Some("new".into()),
            ..ElectionStatus::default()
        };
        assert_eq!(
            merge_status(existing, &status),
            serde_json::json!({"leader": "new", "futureField": 3})
        );
    }
}
