//! One term of leadership as the workload sees it: the fencing token, the cancellation, and the
//! tasks bound to the term, which end before the lease is released.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::FencingToken;
use crate::lock::LeaseShared;

/// One term of leadership, handed to the workload.
///
/// # Guarantees
///
/// While [`is_valid`](Self::is_valid) is true no other candidate can have been granted the
/// lease. [`cancellation`](Self::cancellation) fires the moment the term ends (renew deadline
/// passed, lease lost, shutdown); the workload future is dropped no later than
/// `valid_until − stop_margin` even if it ignores the cancellation. Tasks started with
/// [`spawn`](Self::spawn) are aborted once the workload has stopped, and awaited, before the
/// lease is released.
///
/// # Caveats
///
/// A process frozen past its lease can act before it notices. Pass
/// [`fencing_token`](Self::fencing_token) to every resource you write (see
/// [`crate::fence`]) so such writes are refused. Tasks started with `tokio::spawn` rather
/// than [`spawn`](Self::spawn) are not bound to the term and can outlive it.
#[derive(Clone)]
pub struct Term {
    lease: Arc<LeaseShared>,
    identity: Arc<str>,
    started_at: Instant,
    /// The elector's: cancelled when the term ends. Never handed out, so the workload cannot
    /// end its own term's validity while the lease stays held.
    cancel: CancellationToken,
    /// What [`cancellation`](Self::cancellation) hands out: a child of `cancel`, so it fires
    /// when the term ends, and a workload that cancels it (to stop its own work early) stops
    /// only what listens to it, not the term.
    workload_cancel: CancellationToken,
    tasks: Arc<TermTasks>,
    intent: Arc<super::intent::Intent>,
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("lease", &self.lease.name)
            .field("identity", &self.identity)
            .field("fencing", &self.lease.fencing)
            .field("cancelled", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Term {
    /// A term of `lease`, starting now. The elector keeps the returned [`TermTasks`] to end
    /// the term's tasks before it releases the lease.
    pub(super) fn begin(
        lease: Arc<LeaseShared>,
        identity: &str,
        cancel: CancellationToken,
        intent: Arc<super::intent::Intent>,
    ) -> (Self, Arc<TermTasks>) {
        let tasks = Arc::new(TermTasks::default());
        let term = Self {
            lease,
            identity: identity.into(),
            started_at: Instant::now(),
            workload_cancel: cancel.child_token(),
            cancel,
            tasks: tasks.clone(),
            intent,
        };
        (term, tasks)
    }

    /// The fencing token of this term: greater than every earlier term's.
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.lease.fencing
    }

    /// The lease's name.
    #[must_use]
    pub fn lease_name(&self) -> &str {
        &self.lease.name
    }

    /// This candidate's identity.
    #[must_use]
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// When the term began, on this process's monotonic clock.
    #[must_use]
    pub fn started_at(&self) -> Instant {
        self.started_at
    }

    /// Fires when the term ends. Select on it in long work and stop promptly.
    ///
    /// A child of the term's own token: cancelling it (to stop the workload's own work early)
    /// fires it for every clone of this term, but the term goes on — [`is_valid`](Self::is_valid)
    /// and the elector still follow the lease. To end the term, return from the workload.
    #[must_use]
    pub fn cancellation(&self) -> &CancellationToken {
        &self.workload_cancel
    }

    /// Whether the lease is still ours right now.
    #[must_use]
    pub fn is_valid(&self) -> bool {
        !self.cancel.is_cancelled() && self.lease.is_valid()
    }

    /// Ends this term on purpose: the cancellation fires, the workload gets the elector's
    /// grace to stop, the term's tasks end, and the lease is released at once; whoever
    /// campaigns next may win, except this replica, which sits out the hand-off window
    /// ([`ElectionConfig::handoff_window`](super::ElectionConfig::handoff_window)). The run goes
    /// on as a follower. `reason` is logged and announced ("stopped leading"). A call after
    /// the term ended does nothing.
    pub fn step_down(&self, reason: &str) {
        self.intent.request(
            Some(self.lease.fencing),
            crate::backend::Handoff::Anyone,
            reason,
        );
    }

    /// Ends this term like [`step_down`](Self::step_down) and hands the lease to the replica
    /// `to`: only it may take the lease for the hand-off window; if it does not (it died),
    /// the release was an ordinary one. Its term has a higher fencing token.
    ///
    /// # Example
    ///
    /// ```
    /// use tenure::backend::memory::MemoryBackend;
    /// use tenure::election::{ElectionConfig, LeaderElector};
    /// use tenure::Locker;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tenure::election::ElectionError> {
    /// let store = MemoryBackend::new();
    /// let config = ElectionConfig::new().rejoin(true);
    /// let a = LeaderElector::new(Locker::with_identity(store.clone(), "pod-a")?, "jobs", config.clone())?;
    /// let b = LeaderElector::new(Locker::with_identity(store, "pod-b")?, "jobs", config)?;
    /// let a_run = tokio::spawn(async move {
    ///     a.run(|term| async move {
    ///         term.hand_over("pod-b", "maintenance");
    ///         term.cancellation().cancelled().await;
    ///         std::future::pending::<()>().await
    ///     })
    ///     .await
    /// });
    /// tokio::task::yield_now().await;
    /// let b_token = b.run(|term| async move { term.fencing_token() }).await?;
    /// assert!(b_token.get() > 0);
    /// a_run.abort();
    /// # Ok(()) }
    /// ```
    pub fn hand_over(&self, to: &str, reason: &str) {
        self.intent.request(
            Some(self.lease.fencing),
            crate::backend::Handoff::To(to.to_owned()),
            reason,
        );
    }

    /// Reports whether the workload can make progress, as
    /// [`LeaderElector::report_health`](super::LeaderElector::report_health) does: with a
    /// [`HealthPolicy`](super::HealthPolicy), a term that stays unhealthy for its bound hands
    /// over to a healthy follower.
    pub fn report_health(&self, healthy: bool) {
        self.intent.report_health(healthy);
    }

    /// How the term's lease ended, once it has (lost, released, orphaned).
    pub(crate) fn end_cause(&self) -> Option<crate::LeaseEnd> {
        self.lease.end_cause()
    }

    /// Until when the lease is surely ours, on this process's monotonic clock.
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        self.lease.valid_until()
    }

    /// Calls `listener` with [`valid_until`](Self::valid_until) at once, and again each time a
    /// renewal moves it later, until the term's lease ends: a mirror of the term's validity
    /// for something that cannot ask (another process, a hardware watchdog).
    ///
    /// The listener runs on the renewal scheduler's task while the lease's state is locked,
    /// so nothing in this process can see a validity the listener has not been given. It must
    /// therefore be quick, must not block, and must not call into this term (that would
    /// deadlock). A listener that panics is logged; the term and other listeners go on.
    ///
    /// # Example
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use std::time::Duration;
    /// use tenure::election::TestTerm;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tenure::election::ElectionError> {
    /// let test = TestTerm::begin("reports", "pod-a").await?;
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let mirror = Arc::clone(&seen);
    /// test.term().on_renewal(move |valid_until| mirror.lock().unwrap().push(valid_until));
    /// // The default lease is renewed 5 s in.
    /// tokio::time::sleep(Duration::from_secs(6)).await;
    /// let seen = seen.lock().unwrap();
    /// assert_eq!(seen.len(), 2, "once at registration, once at the renewal");
    /// assert!(seen[0] < seen[1]);
    /// assert_eq!(seen[1], test.term().valid_until());
    /// # Ok(()) }
    /// ```
    pub fn on_renewal(&self, listener: impl Fn(Instant) + Send + Sync + 'static) {
        self.lease.on_renewal(Box::new(listener));
    }

    /// Runs `task` on the tokio runtime for this term only.
    ///
    /// When the term ends, the task first sees [`cancellation`](Self::cancellation) fire, like
    /// the workload; once the workload has stopped, every task of the term still running is
    /// aborted and awaited, and only then is the lease released — so a task never acts while
    /// another replica leads, as long as it reaches an `.await` (an abort takes effect there).
    /// The wait is bounded by `valid_until − stop_margin`, as the workload's is: a task stuck
    /// in blocking code past that instant is logged and left behind.
    ///
    /// A task spawned after the term ended is aborted at once: its handle reports
    /// cancellation. The handle can be awaited for the task's output or dropped.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as [`tokio::spawn`] does (the workload always runs in one).
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use tenure::backend::memory::MemoryBackend;
    /// use tenure::election::{ElectionConfig, LeaderElector};
    /// use tenure::Locker;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tenure::election::ElectionError> {
    /// let locker = Locker::with_identity(MemoryBackend::new(), "pod-a")?;
    /// let elector = LeaderElector::new(locker, "reports", ElectionConfig::new())?;
    /// let (sent, mut heartbeats) = tokio::sync::mpsc::unbounded_channel();
    /// elector
    ///     .run(|term| {
    ///         let sent = sent.clone();
    ///         async move {
    ///             // A side task that must stop with the term, not run on into the next one.
    ///             let token = term.fencing_token();
    ///             term.spawn(async move {
    ///                 loop {
    ///                     let _ = sent.send(token);
    ///                     tokio::time::sleep(Duration::from_secs(1)).await;
    ///                 }
    ///             });
    ///             tokio::time::sleep(Duration::from_millis(2500)).await;
    ///         }
    ///     })
    ///     .await?;
    /// // The term ended when the workload returned: the heartbeat task ended with it.
    /// drop(sent);
    /// let mut beats = 0;
    /// while heartbeats.recv().await.is_some() {
    ///     beats += 1;
    /// }
    /// assert_eq!(beats, 3);
    /// # Ok(()) }
    /// ```
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(task)
    }
}

/// The tasks of one term: tracked so they can be aborted and awaited at its end.
#[derive(Default)]
pub(super) struct TermTasks {
    tracker: TaskTracker,
    /// One lock orders spawns against the stop: a task is either in `handles` when the stop
    /// aborts them, or sees `stopped` and is aborted at once.
    aborts: Mutex<Aborts>,
}

#[derive(Default)]
struct Aborts {
    handles: Vec<AbortHandle>,
    /// The length at which finished tasks are next forgotten: twice what was left running at
    /// the last sweep, so a term with n tasks in flight sweeps once per n spawns (each spawn
    /// costs O(1) amortised, not a scan of every task in flight — a controller's term spawns
    /// one task per reconcile), and the list stays under twice what runs plus the minimum.
    sweep_at: usize,
    stopped: bool,
}

/// The shortest list swept: below it, a sweep would cost more than the handles it frees.
const MIN_SWEEP: usize = 64;

impl TermTasks {
    fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = self.tracker.spawn(task);
        let mut aborts = self
            .aborts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if aborts.stopped {
            handle.abort();
        } else {
            // Forget finished tasks so a long term that spawns many short ones stays small.
            if aborts.handles.len() >= aborts.sweep_at.max(MIN_SWEEP) {
                aborts.handles.retain(|h| !h.is_finished());
                aborts.sweep_at = aborts.handles.len().saturating_mul(2);
            }
            aborts.handles.push(handle.abort_handle());
        }
        handle
    }

    /// Aborts every task of the term still running and waits for them to end, until
    /// `deadline` at the latest. Returns whether they all ended.
    pub(super) async fn stop(&self, deadline: Instant) -> bool {
        self.abort();
        tokio::time::timeout_at(deadline, self.tracker.wait())
            .await
            .is_ok()
    }

    /// Aborts every task of the term still running, and every one spawned from now on; each
    /// ends at its next `.await`. `stop` waits for them.
    pub(super) fn abort(&self) {
        let running = {
            let mut aborts = self
                .aborts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            aborts.stopped = true;
            std::mem::take(&mut aborts.handles)
        };
        for task in &running {
            task.abort();
        }
        self.tracker.close();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use crate::Locker;
    use crate::backend::memory::MemoryBackend;
    use crate::election::{ElectionConfig, ElectionError, LeaderElector};

    use super::{MIN_SWEEP, TermTasks};

    /// A workload that cancels its term's cancellation stops what listens to it; the term
    /// itself stays valid (the lease is held and renewed) until the lease really ends.
    #[tokio::test(start_paused = true)]
    async fn cancelling_the_handed_out_token_does_not_end_the_term() {
        let store = MemoryBackend::new();
        let locker = Locker::with_identity(store.clone(), "pod-a").expect("identity");
        let elector =
            LeaderElector::new(locker, "reports", ElectionConfig::new()).expect("valid config");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let saw = Arc::clone(&seen);
        let see = move |what: &'static str, valid: bool| {
            saw.lock().expect("not poisoned").push((what, valid));
        };
        let ended = elector
            .run(|term| {
                let (store, see) = (store.clone(), see.clone());
                async move {
                    term.cancellation().cancel();
                    see("cancelled", term.cancellation().is_cancelled());
                    see("valid at once", term.is_valid());
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    see("valid after 20 s", term.is_valid());
                    store.steal("reports", "pod-b", Duration::from_secs(15));
                    while term.is_valid() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    see("valid once the lease is gone", term.is_valid());
                }
            })
            .await;
        assert!(
            matches!(ended, Err(ElectionError::Lost { .. })),
            "{ended:?}"
        );
        assert_eq!(
            *seen.lock().expect("not poisoned"),
            [
                ("cancelled", true),
                ("valid at once", true),
                ("valid after 20 s", true),
            ]
        );
    }

    /// A long term spawning many short tasks keeps a bounded list of them (under twice what
    /// runs, plus the minimum sweep), and sweeps rarely: the list is not scanned per spawn.
    #[tokio::test(start_paused = true)]
    async fn many_short_tasks_leave_a_bounded_list_swept_rarely() {
        let tasks = TermTasks::default();
        let long = tasks.spawn(std::future::pending::<()>());
        let mut sweeps = 0;
        let mut last = 0;
        for _ in 0..10_000 {
            let _ = tasks.spawn(async {}).await;
            let len = tasks.aborts.lock().map(|a| a.handles.len()).unwrap_or(0);
            assert!(len <= MIN_SWEEP + 1, "{len} handles kept");
            if len < last {
                sweeps += 1;
            }
            last = len;
        }
        assert!(
            (10_000 / MIN_SWEEP - 5..=10_000 / (MIN_SWEEP - 2)).contains(&sweeps),
            "{sweeps} sweeps over 10000 spawns"
        );
        // The long task is still tracked: the stop aborts it.
        assert!(
            tasks
                .stop(tokio::time::Instant::now() + Duration::from_secs(1))
                .await
        );
        assert!(long.await.is_err_and(|e| e.is_cancelled()));
    }
}
