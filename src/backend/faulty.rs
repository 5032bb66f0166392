//! A wrapper backend that injects faults, for testing what the runtime does when a store
//! misbehaves.
//!
//! It wraps any [`Backend`] and, on command, delays requests, stalls them (they reach the store
//! only once healed, as a paused or partitioned server's would), fails them, or lets them reach
//! the store but loses the answer. It also counts calls, so tests can check how many round trips
//! the runtime made. Faults apply to the request primitives; `observe` passes through (counted).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tokio::sync::watch;

use super::{
    AcquireRequest, Acquired, Backend, BackendError, BackendErrorKind, Completion, CompletionCheck,
    FencingToken, GroupRead, GroupRecord, GroupVersion, HolderChange, HolderToken, InvalidName,
    LeaseRecord, Member, Released, RenewRequest, Renewed, ShardLeaseWatch,
};

/// The fault currently injected by a [`FaultyBackend`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// Requests pass through untouched.
    #[default]
    Healthy,
    /// Every request waits this long before it reaches the store.
    Delay(Duration),
    /// Every answer waits this long after the store processed the request (a slow reply
    /// path: the store's clock started before the caller hears back).
    DelayAnswers(Duration),
    /// Requests wait until the fault is healed, then reach the store (a paused server).
    Stall,
    /// Requests fail at once with [`BackendErrorKind::Unavailable`] and never reach the store.
    Fail,
    /// Requests reach the store, but their answers are lost: the caller waits forever
    /// (until its own timeout), as after a connection dropped mid-request.
    LoseAnswers,
}

/// Counts of the calls a [`FaultyBackend`] has forwarded or faulted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// `try_acquire` calls.
    pub acquire: u64,
    /// `renew` calls plus `renew_many` batches: the round trips spent on renewal.
    pub renew_round_trips: u64,
    /// Leases renewed, counting each entry of a batch.
    pub renewals: u64,
    /// `release` calls.
    pub release: u64,
    /// `observe` calls: the watches or subscriptions the runtime opened.
    pub observe: u64,
}

/// Wraps a backend and injects the [`Fault`] set through [`FaultyBackend::set`].
///
/// Clones share the fault and the counters.
#[derive(Clone)]
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    fault: Arc<watch::Sender<Fault>>,
    counts: Arc<Counters>,
}

impl std::fmt::Debug for FaultyBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyBackend")
            .field("fault", &*self.fault.borrow())
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Counters {
    acquire: AtomicU64,
    renew_round_trips: AtomicU64,
    renewals: AtomicU64,
    release: AtomicU64,
    observe: AtomicU64,
}

enum Gate {
    Pass,
    PassThenWait(Duration),
    Fail(BackendError),
    LoseAnswer,
}

impl FaultyBackend {
    /// Wraps `inner`, healthy at first.
    #[must_use]
    pub fn new(inner: impl Backend) -> Self {
        Self {
            inner: Arc::new(inner),
            fault: Arc::new(watch::channel(Fault::Healthy).0),
            counts: Arc::default(),
        }
    }

    /// Injects `fault` into every request from now on (and releases stalled ones when it is
    /// no longer [`Fault::Stall`]).
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Back to [`Fault::Healthy`].
    pub fn heal(&self) {
        self.set(Fault::Healthy);
    }

    /// The calls seen so far.
    #[must_use]
    pub fn counts(&self) -> CallCounts {
        CallCounts {
            acquire: self.counts.acquire.load(Ordering::Relaxed),
            renew_round_trips: self.counts.renew_round_trips.load(Ordering::Relaxed),
            renewals: self.counts.renewals.load(Ordering::Relaxed),
            release: self.counts.release.load(Ordering::Relaxed),
            observe: self.counts.observe.load(Ordering::Relaxed),
        }
    }

    /// Applies the current fault before a request reaches the store.
    async fn gate(&self) -> Gate {
        let mut rx = self.fault.subscribe();
        loop {
            let fault = *rx.borrow_and_update();
            match fault {
                Fault::Healthy => return Gate::Pass,
                Fault::DelayAnswers(d) => return Gate::PassThenWait(d),
                Fault::Delay(d) => {
                    tokio::time::sleep(d).await;
                    return Gate::Pass;
                }
                Fault::Fail => {
                    return Gate::Fail(BackendError::new(
                        BackendErrorKind::Unavailable,
                        "injected fault: backend unavailable",
                    ));
                }
                Fault::LoseAnswers => return Gate::LoseAnswer,
                Fault::Stall => {
                    if rx.changed().await.is_err() {
                        return Gate::Pass;
                    }
                }
            }
        }
    }

    /// Sends `req` through the fault. The request is made only once the gate lets it
    /// through: a store that does its work when a call is made (the memory backend) must
    /// not see a request a stall holds back or a failure drops.
    async fn run<'a, T>(
        &self,
        req: impl FnOnce() -> BoxFuture<'a, Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        match self.gate().await {
            Gate::Pass => req().await,
            Gate::PassThenWait(d) => {
                let answer = req().await;
                tokio::time::sleep(d).await;
                answer
            }
            Gate::Fail(e) => Err(e),
            Gate::LoseAnswer => {
                let _ = req().await;
                std::future::pending().await
            }
        }
    }
}

impl Backend for FaultyBackend {
    fn validate_name(&self, name: &str) -> Result<(), InvalidName> {
        self.inner.validate_name(name)
    }

    fn try_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquired, BackendError>> {
        self.counts.acquire.fetch_add(1, Ordering::Relaxed);
        Box::pin(self.run(move || self.inner.try_acquire(req)))
    }

    fn renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Renewed, BackendError>> {
        self.counts
            .renew_round_trips
            .fetch_add(1, Ordering::Relaxed);
        self.counts.renewals.fetch_add(1, Ordering::Relaxed);
        Box::pin(self.run(move || self.inner.renew(name, holder, ttl)))
    }

    fn renew_many<'a>(
        &'a self,
        batch: &'a [RenewRequest],
    ) -> BoxFuture<'a, Vec<Result<Renewed, BackendError>>> {
        self.counts
            .renew_round_trips
            .fetch_add(1, Ordering::Relaxed);
        self.counts
            .renewals
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        Box::pin(async move {
            match self.gate().await {
                Gate::Pass => self.inner.renew_many(batch).await,
                Gate::PassThenWait(d) => {
                    let answer = self.inner.renew_many(batch).await;
                    tokio::time::sleep(d).await;
                    answer
                }
                Gate::Fail(e) => vec![Err(e); batch.len()],
                Gate::LoseAnswer => {
                    let _ = self.inner.renew_many(batch).await;
                    std::future::pending().await
                }
            }
        })
    }

    fn release<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        self.counts.release.fetch_add(1, Ordering::Relaxed);
        Box::pin(self.run(move || self.inner.release(name, holder)))
    }

    fn release_as<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        self.counts.release.fetch_add(1, Ordering::Relaxed);
        Box::pin(self.run(move || self.inner.release_as(name, holder, identity)))
    }

    fn release_to<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        to: &'a str,
        window: Duration,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        self.counts.release.fetch_add(1, Ordering::Relaxed);
        Box::pin(self.run(move || self.inner.release_to(name, holder, to, window)))
    }

    fn request_handoff<'a>(
        &'a self,
        name: &'a str,
        handoff: &'a crate::backend::Handoff,
        window: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(self.run(move || self.inner.request_handoff(name, handoff, window)))
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseRecord>, BackendError>> {
        Box::pin(self.run(move || self.inner.inspect(name)))
    }

    fn last_term<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<super::EndedTerm>, BackendError>> {
        Box::pin(self.run(move || self.inner.last_term(name)))
    }

    fn announce_member<'a>(
        &'a self,
        group: &'a str,
        member: &'a Member,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.run(move || self.inner.announce_member(group, member, ttl)))
    }

    fn withdraw_member<'a>(
        &'a self,
        group: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.run(move || self.inner.withdraw_member(group, identity)))
    }

    fn group_record<'a>(
        &'a self,
        group: &'a str,
    ) -> BoxFuture<'a, Result<GroupRead, BackendError>> {
        Box::pin(self.run(move || self.inner.group_record(group)))
    }

    fn swap_group_record<'a>(
        &'a self,
        group: &'a str,
        expected: Option<&'a GroupVersion>,
        record: &'a GroupRecord,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(self.run(move || self.inner.swap_group_record(group, expected, record)))
    }

    fn check_completion<'a>(
        &'a self,
        name: &'a str,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<CompletionCheck, BackendError>> {
        Box::pin(self.run(move || self.inner.check_completion(name, token)))
    }

    fn record_completion<'a>(
        &'a self,
        name: &'a str,
        record: &'a Completion,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(self.run(move || self.inner.record_completion(name, record)))
    }

    fn members(&self, group: &str) -> BoxStream<'static, Result<Vec<Member>, BackendError>> {
        self.inner.members(group)
    }

    fn follow_shard_leases(&self, group: &str, leases: &[String]) -> ShardLeaseWatch {
        self.inner.follow_shard_leases(group, leases)
    }

    fn observe(&self, name: &str) -> BoxStream<'static, Result<HolderChange, BackendError>> {
        self.counts.observe.fetch_add(1, Ordering::Relaxed);
        self.inner.observe(name)
    }
}
