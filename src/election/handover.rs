//! Leadership that follows health and intent: a leader steps down on purpose (its workload
//! asks, an operator asks through the store, or its health stays bad while a healthy follower
//! waits), naming the replica that should lead next; and a replica that stepped down for its
//! health sits out until it has been healthy for a while.
//!
//! A step-down ends the term the graceful way (cancellation, the grace, the term's tasks)
//! and releases with [`Lease::release_to`](crate::Lease::release_to) when there is a target.
//! Fencing is untouched: the next term is a new grant with a higher token.
//!
//! Followers tell the leader that they are ready (healthy, with a health policy) by announcing
//! themselves in a membership group named after the lease
//! ([`health_group`](super::health_group)), the store's own member records with a ttl
//! (the same machinery as sharded leadership): a follower that dies or turns unhealthy drops
//! out of it within one lease duration, with nothing to clean up. The leader reads that group
//! only when it is about to step down for its health, or to let go with a
//! [`Preference`](super::Preference) (which of the ready followers: `prefer.rs`).

use futures::StreamExt;
use tokio::time::Instant;

use super::LeaderElector;
use super::intent::{HandedOff, HandoffCause, StepDown, health_group};
use crate::backend::{FencingToken, Handoff, Member};

impl LeaderElector {
    /// Reports this replica's health: whether its workload can make progress (its database,
    /// its downstream API). Followers that are healthy announce it in the store; a leader
    /// that stays unhealthy for the [`HealthPolicy`](super::HealthPolicy)'s bound hands over to a healthy follower,
    /// and keeps the lease when there is none. Without a policy
    /// ([`ElectionConfig::health`](super::ElectionConfig::health)) reports change nothing.
    pub fn report_health(&self, healthy: bool) {
        self.inner.intent.report_health(healthy);
    }

    /// Ends the current term on purpose, if this replica leads: the workload is cancelled
    /// and gets its grace, the term's tasks end, and the lease is released — with
    /// [`Handoff::To`], to that replica only for the hand-off window
    /// ([`ElectionConfig::handoff_window`](super::ElectionConfig::handoff_window)). The run
    /// goes on as a follower. Returns whether a term was running.
    pub fn hand_over(&self, to: Handoff, reason: &str) -> bool {
        let Some(lease) = self.current_term() else {
            return false;
        };
        self.inner.intent.request(Some(lease.fencing), to, reason);
        true
    }

    /// The last term this replica ended on purpose (a step-down, a hand-over, a graceful
    /// shutdown), once its lease is released: why, to whom, when. `None` until then. Terms
    /// that were lost (the lease ran out, the store refused a renewal) are not hand-offs.
    /// The `Election` resource's status publisher (feature `crd`) follows it into
    /// `status.lastHandoff`.
    #[must_use]
    pub fn last_handoff(&self) -> tokio::sync::watch::Receiver<Option<HandedOff>> {
        self.inner.intent.handed_off.subscribe()
    }

    /// Records that the term `fencing` ended on purpose, for [`last_handoff`](Self::last_handoff).
    pub(super) fn record_handoff(
        &self,
        fencing: FencingToken,
        cause: HandoffCause,
        to: Option<&str>,
        reason: &str,
    ) {
        self.inner.intent.handed_off.send_replace(Some(HandedOff {
            cause,
            from: self.identity().to_owned(),
            to: to.map(str::to_owned),
            fencing,
            at: std::time::SystemTime::now(),
            reason: reason.to_owned(),
        }));
    }

    /// Resolves when the term `fencing` should step down: its workload or this elector asked,
    /// an operator asked through the store (checked every retry period), or its health stayed
    /// bad for the bound while a healthy follower waits.
    pub(super) async fn step_down_wanted(&self, fencing: FencingToken) -> StepDown {
        tokio::select! {
            req = self.requested(fencing) => req,
            req = self.requested_in_store(fencing) => req,
            req = self.health_step_down(fencing) => req,
        }
    }

    async fn requested(&self, fencing: FencingToken) -> StepDown {
        let mut rx = self.inner.intent.step_down.subscribe();
        loop {
            if let Some(req) = rx.borrow_and_update().as_ref()
                && req.fencing.is_none_or(|f| f == fencing)
            {
                return req.clone();
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    async fn requested_in_store(&self, fencing: FencingToken) -> StepDown {
        if self.inner.shard {
            // A shard's lease moves with the group's assignment, not on request; and a
            // replica may hold thousands of shards: no read per shard per retry period.
            return std::future::pending().await;
        }
        let config = &self.inner.config;
        let backend = self.inner.locker.backend();
        loop {
            tokio::time::sleep(config.retry_period).await;
            let read = tokio::time::timeout(
                config.effective_request_timeout(),
                backend.inspect(&self.inner.name),
            )
            .await;
            if let Ok(Ok(Some(record))) = read
                && record.fencing == fencing
                && let Some(to) = record.handoff
                && to.target() != Some(self.identity())
            {
                let (cause, reason) = match (record.preferred_holder, to.target()) {
                    (true, Some(who)) => (
                        HandoffCause::PreferredHolder,
                        format!("the Lease's preferredHolder names {who}"),
                    ),
                    (_, Some(who)) => (
                        HandoffCause::Requested,
                        format!("hand-over to {who} requested"),
                    ),
                    (_, None) => (HandoffCause::Requested, "step-down requested".to_owned()),
                };
                return StepDown {
                    fencing: Some(fencing),
                    to,
                    reason,
                    cause,
                };
            }
        }
    }

    async fn health_step_down(&self, fencing: FencingToken) -> StepDown {
        let Some(policy) = self.inner.config.health else {
            return std::future::pending().await;
        };
        let mut rx = self.inner.intent.health.subscribe();
        loop {
            let report = *rx.borrow_and_update();
            if report.healthy {
                if rx.changed().await.is_err() {
                    return std::future::pending().await;
                }
                continue;
            }
            // Unhealthy since `report.since`: wait out the bound unless it recovers.
            let due = report.since + policy.unhealthy_after;
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return std::future::pending().await;
                    }
                    continue;
                }
                () = tokio::time::sleep_until(due) => {}
            }
            // Still unhealthy past the bound: hand over only to a healthy follower.
            loop {
                if let Some(to) = self.healthy_follower().await {
                    return StepDown {
                        fencing: Some(fencing),
                        reason: format!(
                            "unhealthy for {:?}: handing over to healthy {to}",
                            policy.unhealthy_after
                        ),
                        to: Handoff::To(to),
                        cause: HandoffCause::Unhealthy,
                    };
                }
                tracing::warn!(lease = %self.inner.name, "unhealthy, but no healthy follower: keeping the lease");
                tokio::select! {
                    () = tokio::time::sleep(self.inner.config.retry_period) => {}
                    _ = rx.changed() => {}
                }
                if rx.borrow_and_update().healthy {
                    break;
                }
            }
        }
    }

    /// A follower announced healthy in the store, if any: the preferred one
    /// ([`ElectionConfig::prefer`](super::ElectionConfig::prefer)), else the first by identity.
    async fn healthy_follower(&self) -> Option<String> {
        let members = self.ready_members().await?;
        match &self.inner.config.prefer {
            Some(preference) => preference.choose(&members, self.identity()),
            None => super::prefer::first_by_identity(&members, self.identity()),
        }
        .map(str::to_owned)
    }

    /// The follower a leader that lets go without a named target hands to: the preferred
    /// ready follower, `None` without a preference or when no follower is ready (then the
    /// release is an ordinary one).
    pub(super) async fn preferred_successor(&self) -> Option<String> {
        let preference = self.inner.config.prefer.as_ref()?;
        let members = self.ready_members().await?;
        preference
            .choose(&members, self.identity())
            .map(str::to_owned)
    }

    /// One read of the members of the election's ready group, bounded by the request
    /// timeout; `None` when the store did not answer (a warning says why).
    async fn ready_members(&self) -> Option<Vec<Member>> {
        let group = health_group(&self.inner.name);
        let mut members = self.inner.locker.backend().members(&group);
        let timeout = self.inner.config.effective_request_timeout();
        match tokio::time::timeout(timeout, members.next()).await {
            Ok(Some(Ok(members))) => Some(members),
            Ok(Some(Err(e))) => {
                tracing::warn!(lease = %self.inner.name, error = %e, "cannot read the ready followers");
                None
            }
            _ => None,
        }
    }

    /// Records a finished step-down: after one for health, this replica sits out until it
    /// has recovered; after a plain one without a target, for the hand-off window (the
    /// store keeps it out of a targeted one by itself).
    pub(super) async fn after_step_down(&self, req: &StepDown) {
        self.inner.intent.step_down.send_replace(None);
        if req.cause == HandoffCause::Unhealthy {
            *self
                .inner
                .intent
                .health_step_down
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        } else if req.to == Handoff::Anyone {
            tokio::time::sleep(self.inner.config.handoff_window).await;
        }
    }

    /// Waits until this replica may campaign: at once without a health policy, otherwise
    /// once it is healthy (after a health step-down: healthy for the recovery window).
    pub(super) async fn until_eligible(&self) {
        if self.inner.intent.last_health_step_down().is_none() {
            return;
        }
        let mut rx = self.inner.intent.health.subscribe();
        loop {
            rx.borrow_and_update();
            match self
                .inner
                .intent
                .eligible_at(self.inner.config.health.as_ref())
            {
                Some(at) if at <= Instant::now() => return,
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        _ = rx.changed() => {}
                    }
                }
                None => {
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Resolves when this replica may no longer campaign: it stepped down for its health
    /// before and is unhealthy now, or has not been healthy for the recovery window since its
    /// last change. Never resolves for a replica that did not (an unhealthy replica still
    /// takes a lease nobody else takes) or without a health policy.
    pub(super) async fn until_ineligible(&self) {
        let policy = self.inner.config.health;
        if policy.is_none() || self.inner.intent.last_health_step_down().is_none() {
            return std::future::pending().await;
        }
        let mut rx = self.inner.intent.health.subscribe();
        loop {
            rx.borrow_and_update();
            // Judged by the recovery window, not by the health seen now: a relapse over by the
            // time this task runs (unhealthy and healthy again before it was polled) restarts
            // the window all the same.
            let eligible_at = self.inner.intent.eligible_at(policy.as_ref());
            if eligible_at.is_none_or(|at| at > Instant::now()) {
                return;
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Withdraws this replica from the ready group at the end of its run (with a health
    /// policy or a preference), bounded by the request timeout; a failure leaves the
    /// announcement to run out.
    pub(super) async fn withdraw_ready(&self) {
        let config = &self.inner.config;
        if config.health.is_none() && config.prefer.is_none() {
            return;
        }
        let group = health_group(&self.inner.name);
        let withdraw = self
            .inner
            .locker
            .backend()
            .withdraw_member(&group, self.identity());
        match tokio::time::timeout(config.effective_request_timeout(), withdraw).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(%group, error = %e, "cannot withdraw from the ready group")
            }
            Err(_) => tracing::debug!(%group, "withdrawing from the ready group timed out"),
        }
    }

    /// With a health policy or a preference, keeps this replica's announcement in
    /// [`health_group`] current for as long as the run lasts: announced (ttl one lease
    /// duration, renewed every retry period) while eligible, withdrawn otherwise. Its
    /// `joined_ms` is when the run began, on this replica's wall clock: what
    /// [`Preference::Newest`](super::Preference::Newest) orders by. Never returns.
    pub(super) async fn publish_health(&self, joined_ms: u64) -> std::convert::Infallible {
        let policy = self.inner.config.health;
        if policy.is_none() && self.inner.config.prefer.is_none() {
            return std::future::pending().await;
        }
        let config = &self.inner.config;
        let backend = self.inner.locker.backend();
        let group = health_group(&self.inner.name);
        let member = Member {
            identity: self.identity().to_owned(),
            shards: 0,
            joined_ms,
            holds: Vec::new(),
        };
        let mut rx = self.inner.intent.health.subscribe();
        let mut announced = false;
        loop {
            rx.borrow_and_update();
            let eligible_at = self.inner.intent.eligible_at(policy.as_ref());
            let now = Instant::now();
            let eligible = eligible_at.is_some_and(|at| at <= now);
            let timeout = config.effective_request_timeout();
            let call = if eligible {
                backend.announce_member(&group, &member, config.lease_duration)
            } else {
                backend.withdraw_member(&group, &member.identity)
            };
            if eligible || announced {
                match tokio::time::timeout(timeout, call).await {
                    Ok(Ok(())) => announced = eligible,
                    Ok(Err(e)) => {
                        tracing::warn!(%group, error = %e, "cannot publish this replica's health");
                    }
                    Err(_) => tracing::warn!(%group, "publishing this replica's health timed out"),
                }
            }
            let mut next = now + config.retry_period;
            if let Some(at) = eligible_at.filter(|at| *at > now) {
                next = next.min(at);
            }
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                _ = rx.changed() => {}
            }
        }
    }
}
