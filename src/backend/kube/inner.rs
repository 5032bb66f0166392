//! What a backend shares with its tasks — the Lease API, the request timeout, the per-Lease
//! view — and the primitives every path is built on: one request under the timeout with its
//! outcome sorted ([`Fail`]), a read through the watch-fed view, recording what the server
//! returned, and `inspect`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio::time::Instant;

use super::error::{self, Op};
use super::read::ReadLease;
use super::record;
use super::slots::{Slots, Traffic};
use super::state::{Current, LockState, Own, Source};
use crate::backend::{
    BackendError, BackendErrorKind, EndedTerm, HolderToken, LeaseRecord, TermEnd,
};

/// The shared state of a backend and its watch tasks.
pub(super) struct Inner {
    pub(super) api: Api<Lease>,
    /// The same API for reads, parsed field by field ([`ReadLease`]): a Lease another
    /// process wrote may hold what a typed `Lease` cannot parse.
    pub(super) reads: Api<ReadLease>,
    pub(super) namespace: String,
    pub(super) request_timeout: Duration,
    locks: Mutex<HashMap<Arc<str>, LockState>>,
    /// The highest resourceVersion this backend has seen on any Lease: every later write's
    /// is higher (etcd revisions are global), so a grant at or below it means etcd went
    /// backwards, and is refused.
    pub(super) max_rv: AtomicU64,
    /// Bounds the requests in flight (one connection, one file descriptor each), upkeep
    /// served first: see [`slots`](super::slots).
    slots: Slots,
}

/// Why a write or read did not succeed, for the caller to decide.
pub(super) enum Fail {
    NotFound,
    /// 409: `Conflict` on an update, `AlreadyExists` on a create.
    Conflict,
    Error(BackendError),
}

impl Inner {
    /// A backend's state before it has seen any Lease.
    pub(super) fn new(client: kube::Client, namespace: String, request_timeout: Duration) -> Self {
        Self {
            api: Api::namespaced(client.clone(), &namespace),
            reads: Api::namespaced(client, &namespace),
            namespace,
            request_timeout,
            locks: Mutex::new(HashMap::new()),
            max_rv: AtomicU64::new(0),
            slots: Slots::new(),
        }
    }

    pub(super) fn locks(&self) -> MutexGuard<'_, HashMap<Arc<str>, LockState>> {
        // Nothing panics while this lock is held; recover rather than propagate a poison.
        self.locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn op<'a>(&'a self, verb: &'static str, name: &'a str) -> Op<'a> {
        Op {
            verb,
            resource: error::LEASES,
            namespace: &self.namespace,
            name,
        }
    }

    /// Runs one request under the request timeout, the wait for a free slot of its class
    /// included: upkeep never waits behind ordinary traffic.
    pub(super) async fn call<T>(
        &self,
        op: Op<'_>,
        traffic: Traffic,
        request: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, Fail> {
        let sent = async {
            let _slot = self.slots.acquire(traffic).await;
            request.await
        };
        match tokio::time::timeout(self.request_timeout, sent).await {
            Err(_) => Err(Fail::Error(BackendError::timeout(
                &op.to_string(),
                self.request_timeout,
            ))),
            Ok(Ok(v)) => Ok(v),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Err(Fail::NotFound),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => Err(Fail::Conflict),
            Ok(Err(e)) => Err(Fail::Error(error::map(e, op))),
        }
    }

    /// Records what a read or write returned; returns the lock's view after it.
    pub(super) fn note(
        &self,
        name: &Arc<str>,
        lease: Option<Lease>,
        deleted_rv: Option<u64>,
        source: Source,
    ) -> Result<Current, BackendError> {
        let lease = match lease {
            Some(l) => {
                let rv = record::parse_resource_version(&l)?;
                self.max_rv.fetch_max(rv, Ordering::Relaxed);
                Some((l, rv))
            }
            None => None,
        };
        let now = Instant::now();
        let mut locks = self.locks();
        let st = locks.entry(name.clone()).or_default();
        st.note(lease, deleted_rv, source, now);
        Ok(st.known.clone().unwrap_or(Current::Absent))
    }

    /// The Lease now: from the watch-fed view if `cached` is allowed and the watch is synced,
    /// otherwise from the server, as `traffic`.
    pub(super) async fn read(
        &self,
        name: &Arc<str>,
        cached: bool,
        traffic: Traffic,
    ) -> Result<Current, BackendError> {
        if cached {
            let locks = self.locks();
            if let Some(st) = locks.get(name)
                && st.synced()
                && let Some(known) = &st.known
            {
                return Ok(known.clone());
            }
        }
        let op = self.op("get", name);
        let sent = Instant::now();
        let lease = match self.call(op, traffic, self.reads.get(name)).await {
            Ok(l) => Some(l.into_lease()),
            Err(Fail::NotFound) => None,
            Err(Fail::Conflict) => {
                return Err(BackendError::new(
                    BackendErrorKind::Protocol,
                    format!("{op}: unexpected 409"),
                ));
            }
            Err(Fail::Error(e)) => return Err(e),
        };
        self.note(name, lease, None, Source::Answer(sent))
    }

    /// The view, if this backend's grant to `holder` is current in it.
    pub(super) fn own_view(
        &self,
        name: &str,
        holder: &HolderToken,
    ) -> (Option<Current>, Option<Own>) {
        let locks = self.locks();
        let Some(st) = locks.get(name) else {
            return (None, None);
        };
        let own = st.own_of(holder);
        let cached = own.and(st.known.clone()).filter(|k| {
            matches!(k, Current::Present(s) if record::View::of(&s.lease).token == Some(*holder))
        });
        (cached, own)
    }

    pub(super) fn forget(&self, name: &str, holder: &HolderToken) {
        let mut locks = self.locks();
        if let Some(st) = locks.get_mut(name) {
            st.forget(holder);
            if st.is_idle() {
                locks.remove(name);
            }
        }
    }

    /// The holder on record, if its lease is live by this process's clock.
    pub(super) async fn inspect(
        &self,
        name: &Arc<str>,
    ) -> Result<Option<LeaseRecord>, BackendError> {
        let Current::Present(seen) = self.read(name, true, Traffic::Ordinary).await? else {
            return Ok(None);
        };
        let view = record::View::of(&seen.lease);
        let Some(identity) = view.holder.clone() else {
            return Ok(None);
        };
        let remaining = seen.remaining(view.duration, Instant::now());
        if remaining.is_zero() {
            return Ok(None);
        }
        Ok(Some(LeaseRecord {
            identity,
            fencing: view.term_fencing(seen.rv),
            remaining: Some(remaining),
            transitions: u64::try_from(view.transitions).ok(),
            handoff: view.handoff.map(|(h, _)| h),
            preferred_holder: view.handoff_preferred,
        }))
    }

    /// How the Lease's latest term ended, while it is free: released (holder cleared; who
    /// from [`record::RELEASED_BY`], when from `renewTime`, the releasing client's clock) or
    /// expired (the holder still named; `renewTime` + `leaseDurationSeconds`).
    pub(super) async fn last_term(
        &self,
        name: &Arc<str>,
    ) -> Result<Option<EndedTerm>, BackendError> {
        let Current::Present(seen) = self.read(name, true, Traffic::Ordinary).await? else {
            return Ok(None);
        };
        let view = record::View::of(&seen.lease);
        let spec = seen.lease.spec.as_ref();
        let renewed_ms = spec
            .and_then(|s| s.renew_time.as_ref())
            .and_then(|t| u64::try_from(t.0.as_millisecond()).ok());
        match view.holder.clone() {
            None => {
                let (fencing, identity) = record::released_by(&seen.lease);
                Ok(Some(EndedTerm {
                    identity,
                    fencing,
                    end: TermEnd::Released,
                    ended_ms: renewed_ms,
                }))
            }
            Some(identity) if seen.remaining(view.duration, Instant::now()).is_zero() => {
                let duration_ms = u64::try_from(view.duration.as_millis()).unwrap_or(u64::MAX);
                Ok(Some(EndedTerm {
                    identity: Some(identity),
                    fencing: Some(view.term_fencing(seen.rv)),
                    end: TermEnd::Expired,
                    ended_ms: renewed_ms.map(|r| r.saturating_add(duration_ms)),
                }))
            }
            Some(_) => Ok(None),
        }
    }
}
