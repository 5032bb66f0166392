//! The elector's run: campaign until the lease is ours, serve the term (the workload, its
//! cancellation and drop deadline, the term's tasks, the release), then campaign again or
//! return. Following the leader, sampling metrics and the shutdown signal are branches of the
//! same `select!`: the elector owns no background task.

use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::FusedFuture;
use futures::{FutureExt, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::intent::{HandoffCause, StepDown};
use super::{ElectionError, LeaderElector, Term};
use crate::backend::{BackendError, FencingToken, Handoff, HolderChange, LeadershipEvent};
use crate::{Lease, LeaseEnd, LockError, LostReason};

/// The store's holder changes for one lease, as the elector follows them.
type HolderChanges = futures::stream::BoxStream<'static, Result<HolderChange, BackendError>>;

/// The least time aborted term tasks get to end, even when the term's deadline has passed.
const TASKS_MIN_WAIT: Duration = Duration::from_millis(100);

/// How a term ended.
enum TermEnd<T> {
    /// The workload returned while the term was intact (or during a shutdown's grace).
    Returned(T),
    /// The workload panicked.
    Panicked(String),
    /// The lease was lost.
    Lost(FencingToken, LostReason),
    /// Shutdown was requested and the workload has stopped.
    Shutdown,
    /// The term was ended on purpose (a hand-over) and the lease released.
    SteppedDown(StepDown),
}

/// Why the term is being wound down.
enum Stopping {
    Lost(LostReason),
    Shutdown,
    StepDown(StepDown),
}

impl LeaderElector {
    /// Campaigns and runs `workload` for each term won, until the workload returns.
    ///
    /// Equivalent to [`run_until`](Self::run_until) with a shutdown signal that never fires.
    ///
    /// # Errors
    ///
    /// As [`run_until`](Self::run_until).
    pub async fn run<F, Fut, T>(&self, workload: F) -> Result<T, ElectionError>
    where
        F: FnMut(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        match self.run_until(std::future::pending(), workload).await {
            Ok(Some(out)) => Ok(out),
            // `pending()` never completes, so a shutdown never happens.
            Ok(None) => Err(ElectionError::Internal {
                message: "run stopped for a shutdown that has no signal".into(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Campaigns and runs `workload` for each term won, until the workload returns or
    /// `shutdown` completes.
    ///
    /// On shutdown: the term's cancellation fires, the workload gets up to the grace period
    /// (never past `valid_until − stop_margin`) to stop, then the lease is released at once so
    /// a waiting candidate takes over without waiting for the ttl. Returns `Ok(None)` then, or
    /// `Ok(Some(output))` if the workload returned an output while stopping.
    ///
    /// It returns only once the releases its locker left to the background have finished (a
    /// campaign cut short by the shutdown may have been granted: that grant is released too),
    /// or the lease's release timeout has passed, so the process may exit right after.
    ///
    /// # Errors
    ///
    /// - [`ElectionError::Lost`]: a term was lost and
    ///   [`rejoin`](super::ElectionConfig::rejoin) is off. The workload has stopped and the
    ///   lease was released.
    /// - [`ElectionError::WorkloadPanicked`]: the workload panicked; the lease was released.
    /// - [`ElectionError::Lock`]: campaigning failed permanently (credentials, permissions).
    ///   Transient store failures are retried every retry period.
    /// - [`ElectionError::AlreadyRunning`]: this elector is already running.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the workload at once. In the background the term's tasks
    /// ([`Term::spawn`]) are then aborted and awaited, as at a term's end (at most until
    /// `valid_until − stop_margin`), and only then is the lease released.
    pub async fn run_until<S, F, Fut, T>(
        &self,
        shutdown: S,
        mut workload: F,
    ) -> Result<Option<T>, ElectionError>
    where
        S: Future<Output = ()>,
        F: FnMut(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        if self.inner.running.swap(true, Ordering::AcqRel) {
            return Err(ElectionError::AlreadyRunning);
        }
        let _running = RunningGuard(self);
        self.inner.contact.run_started();
        // When this run began, for the ready group: what "newest first" orders by.
        let joined_ms = crate::util::unix_millis();
        let mut shutdown = pin!(shutdown.fuse());
        // One stream of holder changes for the whole run: campaigning and leading follow the
        // same watch, so a won campaign does not close it and open another (two requests per
        // term on Kubernetes, where the last observer's leaving stops the shared watch).
        let mut changes = self.inner.locker.backend().observe(&self.inner.name);
        if !self.inner.shard {
            tokio::select! {
                checked = self.refuse_shard_lease() => checked?,
                () = &mut shutdown => return Ok(None),
            }
        }
        tokio::select! {
            () = self.end_previous_process_term() => {}
            () = &mut shutdown => return Ok(None),
        }
        let terms = async {
            loop {
                tokio::select! {
                    () = self.until_eligible() => {}
                    () = &mut shutdown => return Ok(None),
                }
                let lease = tokio::select! {
                    lease = self.campaign(&mut changes) => lease?,
                    // Eligibility is not for the campaign's start only: a replica that stepped
                    // down for its health and turns unhealthy again stops campaigning.
                    () = self.until_ineligible() => continue,
                    () = &mut shutdown => return Ok(None),
                };
                match self
                    .serve(lease, &mut workload, shutdown.as_mut(), &mut changes)
                    .await
                {
                    TermEnd::Returned(out) => return Ok(Some(out)),
                    TermEnd::SteppedDown(req) => {
                        tokio::select! {
                            () = self.after_step_down(&req) => {}
                            () = &mut shutdown => return Ok(None),
                        }
                    }
                    TermEnd::Shutdown => return Ok(None),
                    TermEnd::Panicked(message) => {
                        return Err(ElectionError::WorkloadPanicked { message });
                    }
                    TermEnd::Lost(fencing, reason) => {
                        if !self.inner.config.rejoin {
                            return Err(ElectionError::Lost {
                                name: self.inner.name.to_string(),
                                fencing,
                                reason,
                            });
                        }
                        if shutdown.is_terminated() {
                            return Ok(None);
                        }
                    }
                }
            }
        };
        // Ready replicas announce it for as long as the run lasts (with a health policy or a
        // preference).
        let out = tokio::select! {
            out = terms => out,
            never = self.publish_health(joined_ms) => match never {},
        };
        // A replica that is gone is nobody's successor: out of the ready group now rather
        // than when its announcement runs out.
        self.withdraw_ready().await;
        // Releases left to the background (a campaign dropped at shutdown after its request
        // went out, whose grant may have landed): finished before the run returns, bounded,
        // so that a process exiting when the run returns does not drop them with its runtime
        // and leave a lease to its ttl; bounded as a term's own release is. Found by a loaded
        // run of `tests/helm_chart.rs` (#42).
        let deadline = Instant::now() + self.inner.lease_opts.get_release_timeout();
        if !self.inner.locker.background_settled(deadline).await {
            tracing::warn!(lease = %self.inner.name, "a release left to the background did not finish before the run returned");
        }
        out
    }

    /// Refuses a plain election whose lease is named `GROUP-N` when the sharded group `GROUP`
    /// exists (its record is in the store, readable or not), so it never contends with the
    /// group's members for shard N. A store that keeps no groups, or credentials that may not
    /// read the record (a Role scoped to this election's Lease), cannot tell: the run goes on
    /// (on Kubernetes the shard Lease's label still refuses the take-over). A group created
    /// after this check is not seen: the lease stays exclusive, the two contend for it.
    async fn refuse_shard_lease(&self) -> Result<(), ElectionError> {
        use crate::backend::group::{GroupRead, parse_shard_lease_name};
        let name = &*self.inner.name;
        let Some((group, shard)) = parse_shard_lease_name(name) else {
            return Ok(());
        };
        loop {
            match self.inner.locker.backend().group_record(group).await {
                Ok(GroupRead::Absent) => return Ok(()),
                Ok(GroupRead::Present { .. } | GroupRead::Damaged { .. }) => {
                    return Err(ElectionError::ShardLease {
                        name: name.to_owned(),
                        group: group.to_owned(),
                        shard,
                    });
                }
                Err(e) if e.is_transient() => {
                    tracing::warn!(lease = %name, error = %e, "could not read whether the lease is a sharded group's shard; retrying");
                    tokio::time::sleep(self.inner.config.retry_period).await;
                }
                Err(e) => {
                    tracing::debug!(lease = %name, error = %e, "cannot tell whether the lease is a sharded group's shard");
                    return Ok(());
                }
            }
        }
    }

    /// With a [`RestartLock`](super::RestartLock) taken, ends the term this replica's previous
    /// process recorded: the lock proves that process gone, so its lease is released with its
    /// holder token (the store releases nothing if the token no longer holds it). A store
    /// error leaves the lease to expire, as without the lock.
    async fn end_previous_process_term(&self) {
        let Some(lock) = self.restart_lock() else {
            return;
        };
        let name = &*self.inner.name;
        let Some(holder) = lock.take_previous(name, self.identity()) else {
            return;
        };
        let timeout = self.inner.config.effective_request_timeout();
        let terms = vec![(name.to_owned(), holder)];
        let backend = self.inner.locker.backend().as_ref();
        if super::end_recorded_terms(backend, self.identity(), terms, timeout).await == 1 {
            tracing::info!(
                lease = %name,
                lock = %lock.path().display(),
                "this replica's previous process is gone (its restart lock was free): ended its term, so this one takes over at once"
            );
        }
    }

    /// The holder token of the next campaign, recorded first when a restart lock is held (a
    /// record that cannot be written is logged: the next restart then waits for the lease,
    /// since the record names an older token).
    fn next_holder(&self) -> crate::backend::HolderToken {
        let holder = crate::backend::HolderToken::random();
        if let Some(lock) = self.restart_lock()
            && let Err(e) = lock.record(&self.inner.name, self.identity(), holder)
        {
            tracing::warn!(
                lock = %lock.path().display(),
                error = %e,
                "cannot record the campaign's holder token; a restart of this replica will wait for the lease to expire"
            );
        }
        holder
    }

    /// Tries until the lease is ours, following the leader meanwhile.
    async fn campaign(&self, changes: &mut HolderChanges) -> Result<Lease, ElectionError> {
        let span =
            tracing::info_span!("campaign", lease = %self.inner.name, identity = %self.identity());
        let inner = &self.inner;
        let window = inner.config.lease_duration.saturating_mul(4);
        let opts = inner.lease_opts.clone().wait(window);
        let attempt = async {
            let started = Instant::now();
            let mut waited = false;
            loop {
                match inner
                    .locker
                    .acquire_as(&inner.name, &opts, self.next_holder())
                    .await
                {
                    Ok(lease) => {
                        self.record_acquired(lease.fencing_token(), started.elapsed(), waited);
                        return Ok(lease);
                    }
                    Err(LockError::NotAcquired { .. }) => waited = true,
                    Err(LockError::Backend(e)) if e.is_transient() => {
                        tracing::warn!(error = %e, "campaign request failed; retrying");
                        waited = true;
                        tokio::time::sleep(inner.config.retry_period).await;
                    }
                    Err(e) => return Err(ElectionError::Lock(e)),
                }
            }
        };
        async {
            tokio::select! {
                result = attempt => result,
                never = self.follow_leader(changes) => match never {},
            }
        }
        .instrument(span)
        .await
    }

    /// Keeps [`leader`](Self::leader) current from the store's holder changes. Never returns.
    async fn follow_leader(&self, changes: &mut HolderChanges) -> std::convert::Infallible {
        while let Some(change) = changes.next().await {
            if let Ok(change) = change {
                self.inner.contact.answered();
                self.inner.leader.publish(&change);
            }
        }
        std::future::pending().await
    }

    /// Serves one term: runs the workload, stops it in time, releases the lease.
    async fn serve<S, F, Fut, T>(
        &self,
        lease: Lease,
        workload: &mut F,
        mut shutdown: std::pin::Pin<&mut futures::future::Fuse<S>>,
        changes: &mut HolderChanges,
    ) -> TermEnd<T>
    where
        S: Future<Output = ()>,
        F: FnMut(Term) -> Fut,
        Fut: Future<Output = T>,
    {
        let shared = lease.shared().clone();
        let fencing = shared.fencing;
        let span = tracing::info_span!("term", lease = %self.inner.name, identity = %self.identity(), %fencing);
        let cancel = CancellationToken::new();
        let (term, tasks) = Term::begin(
            shared.clone(),
            self.identity(),
            cancel.clone(),
            self.inner.intent.clone(),
        );
        let mut held = HeldTerm {
            lease: Some(lease),
            cancel: cancel.clone(),
            tasks: tasks.clone(),
            stop_margin: self.inner.config.stop_margin,
        };
        self.set_term(Some(shared.clone()));
        self.inner.leader.publish(&HolderChange {
            holder: Some(self.identity().to_owned()),
            fencing: Some(fencing),
        });
        self.record_leading(true);
        tracing::info!(parent: &span, "became leader");
        self.record_event(LeadershipEvent::BecameLeader {
            identity: self.identity().to_owned(),
            fencing,
        })
        .await;

        let config = &self.inner.config;
        let mut stopping: Option<Stopping> = None;
        let mut drop_at: Option<Instant> = None;
        // How long the workload was given to stop after its cancellation (zero: the term's
        // validity had run out before its end was seen, a process frozen or starved).
        let mut allowed = Duration::ZERO;
        // The store said the lease is gone (someone else may hold it): dropped at once.
        let mut told_gone = false;
        let finished = {
            let mut work = pin!(AssertUnwindSafe(workload(term)).catch_unwind());
            let mut follow = pin!(self.follow_leader(changes));
            let mut wanted = pin!(self.step_down_wanted(fencing));
            let mut sample = tokio::time::interval(config.lease_duration / 3);
            let mut renewals_seen = 0;
            loop {
                let deadline = drop_at;
                tokio::select! {
                    biased;
                    out = &mut work => break Some(out),
                    end = shared.wait_end(), if stopping.is_none() => {
                        cancel.cancel();
                        self.set_term(None);
                        self.record_leading(false);
                        let reason = match end {
                            LeaseEnd::Lost(reason) => reason,
                            // Only this function releases or orphans the term's lease.
                            LeaseEnd::Released | LeaseEnd::Orphaned => LostReason::NotHeld,
                        };
                        tracing::warn!(parent: &span, %reason, "stopped leading: lease lost");
                        // Told outright that the lease is gone: someone else may hold it now.
                        let now = Instant::now();
                        let at = if matches!(reason, LostReason::NotHeld) {
                            now
                        } else {
                            shared.valid_until() - config.stop_margin
                        };
                        allowed = at.saturating_duration_since(now);
                        told_gone = matches!(reason, LostReason::NotHeld);
                        drop_at = Some(at);
                        stopping = Some(Stopping::Lost(reason));
                    }
                    () = &mut shutdown, if stopping.is_none() && !shutdown.is_terminated() => {
                        cancel.cancel();
                        tracing::info!(parent: &span, "shutting down: workload cancelled");
                        let now = Instant::now();
                        let at = (now + config.grace).min(shared.valid_until() - config.stop_margin);
                        allowed = at.saturating_duration_since(now);
                        drop_at = Some(at);
                        stopping = Some(Stopping::Shutdown);
                    }
                    () = crate::util::sleep_until_opt(deadline) => {
                        if told_gone {
                            tracing::warn!(parent: &span, "the store says the lease is gone (another holder may have it): workload dropped at once");
                        } else if allowed.is_zero() {
                            // Not the workload's doing: it had no time at all.
                            tracing::warn!(parent: &span, "the term was over when its end was seen (the lease's validity had run out: this process was frozen, or starved of CPU): workload dropped at once");
                        } else {
                            tracing::warn!(parent: &span, ?allowed, "workload did not stop within the time it had after its cancellation: dropped");
                        }
                        break None;
                    }
                    req = &mut wanted, if stopping.is_none() => {
                        cancel.cancel();
                        tracing::info!(parent: &span, reason = %req.reason, to = ?req.to.target(), "stepping down: workload cancelled");
                        drop_at = Some((Instant::now() + config.grace).min(shared.valid_until() - config.stop_margin));
                        stopping = Some(Stopping::StepDown(req));
                    }
                    never = &mut follow => match never {},
                    _ = sample.tick(), if stopping.is_none() => {
                        renewals_seen = self.record_sample(&shared, renewals_seen);
                    }
                }
            }
            // `work` is dropped here, before the release below.
        };
        // The term's tasks end before the release too, within the workload's bound: a lost
        // term's drop deadline, or the instant before anyone else can hold the lease.
        // Aborted tasks end at their next poll: leave them a moment even when the deadline
        // has passed (the store said the lease is gone), so that only a task stuck in
        // blocking code is reported.
        let tasks_deadline = drop_at
            .unwrap_or_else(|| shared.valid_until() - config.stop_margin)
            .max(Instant::now() + TASKS_MIN_WAIT);
        if !tasks.stop(tasks_deadline).await {
            tracing::error!(parent: &span, "a task of the term ignored its abort (blocking code?); releasing the lease anyway");
        }
        // A workload can finish at an instant its lease had already run out (the process was
        // frozen, say): then the term was lost, whatever the workload returned.
        if stopping.is_none()
            && let Some(LeaseEnd::Lost(reason)) = shared.end_cause()
        {
            stopping = Some(Stopping::Lost(reason));
        }
        self.set_term(None);
        self.record_leading(false);
        if matches!(stopping, Some(Stopping::Lost(_))) {
            self.record_term_lost();
        }
        cancel.cancel();
        // Letting go without a named target (a graceful shutdown, a step-down without one):
        // to the preferred ready follower, when there is a preference and one.
        let mut shutdown_to = None;
        match &mut stopping {
            Some(Stopping::StepDown(req)) if req.to == Handoff::Anyone => {
                if let Some(who) = self.preferred_successor().await {
                    req.reason = format!("{}: handing over to preferred {who}", req.reason);
                    req.to = Handoff::To(who);
                }
            }
            Some(Stopping::Shutdown) => shutdown_to = self.preferred_successor().await,
            _ => {}
        }
        if let Some(who) = &shutdown_to {
            tracing::info!(parent: &span, to = %who, "shutting down: releasing to the preferred follower");
        }
        // The term's tasks have ended: from here on, a drop of this future leaves the
        // release to the lease (`Lease::release` finishes in the background, `Drop` releases).
        // `take` gives the lease once, here.
        let released = match (held.lease.take(), &stopping, &shutdown_to) {
            (None, ..) => Ok(()),
            (Some(lease), Some(Stopping::StepDown(StepDown { to, .. })), _)
                if let Some(to) = to.target() =>
            {
                lease.release_to(to, config.handoff_window).await
            }
            (Some(lease), Some(Stopping::Shutdown), Some(to)) => {
                lease.release_to(to, config.handoff_window).await
            }
            (Some(lease), ..) => lease.release().await,
        };
        if let Err(e) = &released {
            tracing::debug!(parent: &span, error = %e, "release after the term");
        }
        match &stopping {
            Some(Stopping::StepDown(req)) => {
                self.record_handoff(fencing, req.cause, req.to.target(), &req.reason);
            }
            Some(Stopping::Shutdown) => {
                self.record_handoff(
                    fencing,
                    HandoffCause::Shutdown,
                    shutdown_to.as_deref(),
                    "shut down",
                );
            }
            _ => {}
        }
        // `leader()` must not keep naming this replica for a term that is over; the next
        // campaign's watch reports whoever leads next.
        self.inner.leader.forget(self.identity(), Some(fencing));
        tracing::info!(parent: &span, "stopped leading");
        let reason = match &stopping {
            Some(Stopping::Lost(reason)) => format!("lease lost: {reason}"),
            Some(Stopping::Shutdown) => "shut down: released".to_owned(),
            Some(Stopping::StepDown(req)) => format!("stepped down: {}", req.reason),
            None => "workload finished: released".to_owned(),
        };
        self.record_event(LeadershipEvent::StoppedLeading {
            identity: self.identity().to_owned(),
            fencing,
            reason,
        })
        .await;
        match (finished, stopping) {
            (Some(Err(panic)), _) => TermEnd::Panicked(panic_message(panic.as_ref())),
            (_, Some(Stopping::Lost(reason))) => TermEnd::Lost(fencing, reason),
            (_, Some(Stopping::StepDown(req))) => TermEnd::SteppedDown(req),
            (Some(Ok(out)), _) => TermEnd::Returned(out),
            (None, _) => TermEnd::Shutdown,
        }
    }
    /// Records the event through the backend (a Kubernetes Event), bounded by the request
    /// timeout so that a slow store never delays a term by more than that.
    async fn record_event(&self, event: LeadershipEvent) {
        let backend = self.inner.locker.backend();
        let timeout = self.inner.config.effective_request_timeout();
        let _ = tokio::time::timeout(timeout, backend.record_event(&self.inner.name, &event)).await;
    }
}

/// The lease of the term `serve` is serving, until its release. If the run is dropped
/// mid-term (a caller's `select!` or timeout around `run_until`), `Drop` keeps the order a
/// term's end keeps: the term's cancellation fires, its tasks are aborted at once and awaited
/// (bounded by `valid_until − stop_margin`, as at a term's end), and only then is the lease
/// released, in the background. Without it the term's tasks outlived a dropped run, acting
/// after the release while another replica led (the simulation's `abandon` fault, #42).
struct HeldTerm {
    lease: Option<Lease>,
    cancel: CancellationToken,
    tasks: std::sync::Arc<super::term::TermTasks>,
    stop_margin: Duration,
}

impl Drop for HeldTerm {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        self.cancel.cancel();
        self.tasks.abort();
        let deadline =
            (lease.valid_until() - self.stop_margin).max(Instant::now() + TASKS_MIN_WAIT);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // Outside a runtime the tasks cannot be awaited; the lease's drop leaves it to
            // expire by its ttl.
            return;
        };
        let tasks = self.tasks.clone();
        let name = lease.name().to_owned();
        let background = lease.background();
        let stop = async move {
            if !tasks.stop(deadline).await {
                tracing::error!(lease = %name, "a task of the dropped term ignored its abort (blocking code?); releasing the lease anyway");
            }
            // `Lease`'s drop releases it.
            drop(lease);
        };
        background.spawn(&rt, stop);
    }
}

/// Clears the "running" flag however `run_until` ends.
struct RunningGuard<'a>(&'a LeaderElector);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.set_term(None);
        // Also when `run_until` was dropped in the middle of a term.
        self.0.inner.leader.forget(self.0.identity(), None);
        self.0.inner.contact.run_ended();
        self.0.inner.running.store(false, Ordering::Release);
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned())
}
