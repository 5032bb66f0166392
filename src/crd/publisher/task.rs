//! The publisher's task: follow the elector's view of who leads, write when the schedule says
//! so (a read-modify-write of the status, compare-and-swap on `resourceVersion`), and leave
//! the status on shutdown.

use std::pin::pin;
use std::time::Duration;

use kube::api::PostParams;
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use super::schedule::{Settings, State, after};
use super::status::{Intent, apply, merge_status, now_seconds, salvage};
use super::{MIN_DEFAULT_HEARTBEAT, StatusPublisher};
use crate::FencingToken;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::crd::{Election, ElectionStatus, HandoffReason, LastHandoff, PublishError};
use crate::election::{HandedOff, Leader, LeaderElector};

/// Compare-and-swap attempts per write before giving up until the next backoff.
const CAS_ATTEMPTS: u32 = 5;

impl StatusPublisher {
    /// The loop behind [`run`](Self::run): publishes `elector`'s view until `shutdown`
    /// completes, then leaves the status if [`clear_on_shutdown`](Self::clear_on_shutdown).
    pub(super) async fn follow<S: Future<Output = ()>>(
        &self,
        elector: &LeaderElector,
        shutdown: S,
    ) {
        let (lease_duration, _, _) = elector.timings();
        let (heartbeat, prune_older_than) = self.cadence(lease_duration);
        // Saturating: durations come from the caller unbounded.
        let step_down_grace = lease_duration.saturating_mul(2);
        let mut leader_rx = elector.leader();
        let mut handoff_rx = elector.last_handoff();
        let mut shutdown = pin!(shutdown);
        let mut poll = self.poll();
        let mut st = State::new();
        loop {
            let term = leading(elector, &leader_rx.borrow_and_update());
            st.observe(term, after(Instant::now(), step_down_grace));
            st.observe_handoff(handoff_rx.borrow_and_update().as_ref().map(published));
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
                changed = handoff_rx.changed() => {
                    if changed.is_err() {
                        poll.tick().await;
                    }
                }
                _ = poll.tick() => {}
                () = tokio::time::sleep_until(due) => {
                    let now = Instant::now();
                    let term = leading(elector, &leader_rx.borrow());
                    st.observe(term, after(now, step_down_grace));
                    let handoff = st.handoff.clone();
                    let intent = Intent {
                        identity: elector.identity(),
                        lead: st.want,
                        clear: st.step_down.filter(|(_, at)| *at <= now).map(|(t, _)| t),
                        heartbeat: st.heartbeat_at <= now,
                        leave: false,
                        prune_older_than,
                        shards: None,
                        handoff: handoff.as_ref(),
                    };
                    if intent.is_empty() {
                        continue;
                    }
                    let lease = elector.lease_name();
                    let result = tokio::select! {
                        () = &mut shutdown => {
                            // The request may have been sent: it may yet land, uncounted
                            // as a write, so it counts as an attempt that did not finish.
                            self.stats.count_failure();
                            break;
                        }
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
            // The elector shuts down with this publisher and may still be ending a term this
            // task never saw (the shutdown won the race with the grant's news): while the
            // leader watch names us, wait (bounded) for the elector to record how the term
            // ended — it does so before the watch lets go of us — so the status shows it.
            let names_us = |rx: &watch::Receiver<Option<Leader>>| {
                rx.borrow()
                    .as_ref()
                    .is_some_and(|l| l.identity == elector.identity())
            };
            let ended = async {
                while names_us(&leader_rx) {
                    let changed = tokio::select! {
                        changed = handoff_rx.changed() => changed,
                        changed = leader_rx.changed() => changed,
                    };
                    if changed.is_err() {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(self.request_timeout, ended).await;
            // The term it leads (or the one the status shows as ours) ends gracefully now,
            // unless the elector already said how it ended.
            st.observe_handoff(handoff_rx.borrow().as_ref().map(published));
            // The newest term seen ours: still leading, published, or seen and not yet
            // published (under load the elector may have ended it before this task ran, and
            // the write publishing it may have been cut off by the shutdown).
            let ending = [leading(elector, &leader_rx.borrow()), st.published, st.want]
                .into_iter()
                .flatten()
                .max();
            let shutdown = ending
                .filter(|t| st.handoff_done != Some(t.get()))
                .filter(|t| {
                    st.handoff
                        .as_ref()
                        .is_none_or(|h| h.fencing_token < t.get())
                })
                .map(|token| LastHandoff {
                    reason: HandoffReason::GracefulShutdown,
                    from: elector.identity().to_owned(),
                    to: None,
                    fencing_token: token.get(),
                    time: Time(now_seconds()),
                    message: Some("shut down".to_owned()),
                });
            let intent = Intent {
                identity: elector.identity(),
                lead: None,
                clear: st.published,
                heartbeat: false,
                leave: true,
                prune_older_than,
                shards: None,
                handoff: shutdown.as_ref().or(st.handoff.as_ref()),
            };
            self.leave(&intent, elector.lease_name()).await;
        }
    }

    /// The heartbeat and the age after which other candidates are pruned, for an elector
    /// whose lease lasts `lease_duration`. Saturating arithmetic throughout: durations come
    /// from the caller unbounded, and an overflow must not panic the publisher (a
    /// `Duration::MAX` heartbeat means "never").
    pub(super) fn cadence(&self, lease_duration: Duration) -> (Duration, Duration) {
        let heartbeat = self
            .heartbeat
            .unwrap_or_else(|| lease_duration.saturating_mul(4).max(MIN_DEFAULT_HEARTBEAT))
            .max(Duration::from_millis(10));
        (heartbeat, heartbeat.saturating_mul(self.prune_after))
    }

    /// The timer on which the publisher looks at its elector again besides its watches.
    pub(super) fn poll(&self) -> tokio::time::Interval {
        let every = self
            .min_interval
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut poll = tokio::time::interval(every);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        poll
    }

    /// The last write on shutdown (`intent` leaves), bounded; its failure is only logged.
    pub(super) async fn leave(&self, intent: &Intent<'_>, lease: &str) {
        let bound = self.request_timeout.saturating_mul(2);
        // Never create the Election just to leave it.
        let mut spec_checked = true;
        let leave = self.sync(intent, lease, &mut spec_checked, false);
        match tokio::time::timeout(bound, leave).await {
            Ok(Ok(wrote)) => {
                if wrote {
                    self.stats.count_write();
                }
                tracing::debug!(wrote, "left the election's status");
            }
            // Counted as failures: the write may still have landed, and a caller comparing
            // its count of writes with what the server saw must know it was attempted.
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "could not leave the election's status");
                self.stats.count_failure();
                self.stats.set_last_error(e);
            }
            Err(_) => {
                tracing::debug!("leaving the election's status timed out");
                self.stats.count_failure();
            }
        }
    }

    /// One read-modify-write of the status (compare-and-swap on `resourceVersion`, re-read
    /// and retried on conflict). Returns whether it wrote. Creates a missing Election when
    /// `may_create` and [`create_if_missing`](Self::create_if_missing) allow it.
    pub(super) async fn sync(
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
                    self.stats.count_conflict();
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

/// The longest `message` a hand-off publishes (the reason may come from a caller).
const MAX_MESSAGE: usize = 256;

/// How the `Election` status shows a term this elector ended on purpose.
fn published(h: &HandedOff) -> LastHandoff {
    let at = Timestamp::try_from(h.at).unwrap_or_else(|_| now_seconds());
    let mut message = h.reason.clone();
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    LastHandoff {
        reason: h.cause.into(),
        from: h.from.clone(),
        to: h.to.clone(),
        fencing_token: h.fencing.get(),
        time: Time(Timestamp::from_second(at.as_second()).unwrap_or(at)),
        message: (!message.is_empty()).then_some(message),
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
