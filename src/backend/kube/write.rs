//! The write path: take over, renew and release, each a compare-and-swap `PUT` on the
//! `resourceVersion` it was decided from (a create when the Lease is missing), read again and
//! decided afresh after a conflict; the grant's checks and the fencing token's stamp.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use tokio::time::Instant;

use super::inner::{Fail, Inner};
use super::record;
use super::slots::Traffic;
use super::state::{Current, Own, Source};
use crate::backend::{
    AcquireRequest, Acquired, BackendError, BackendErrorKind, FencingToken, Handoff, HolderToken,
    Released, Renewed,
};

/// How many read-decide-write rounds one operation makes when its writes keep conflicting.
const ROUNDS: usize = 4;

impl Inner {
    /// A grant succeeded with `lease`; `fencing` is the original token of a replay, `None` for
    /// a new term (whose token is the write's resourceVersion, which must exceed `floor`).
    fn granted(
        &self,
        name: &Arc<str>,
        req: &AcquireRequest,
        lease: Lease,
        sent: Instant,
        fencing: Option<FencingToken>,
        floor: u64,
    ) -> Result<Acquired, BackendError> {
        let rv = record::parse_resource_version(&lease)?;
        if fencing.is_none() && rv <= floor {
            return Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!(
                    "lease {}/{name}: the acquiring write got resourceVersion {rv}, not above \
                     {floor} seen earlier; etcd's revisions went backwards (restored or \
                     replaced?), so fencing tokens would not rise: refusing the grant",
                    self.namespace
                ),
            ));
        }
        let fencing = fencing.unwrap_or(FencingToken::new(rv));
        let duration = Duration::from_secs(
            record::lease_duration_seconds(req.ttl)
                .unsigned_abs()
                .into(),
        );
        self.note(name, Some(lease), None, Source::Answer(sent))?;
        if let Some(st) = self.locks().get_mut(name) {
            st.own = Some(Own {
                holder: req.holder,
                fencing,
                last_sent: sent,
                duration,
            });
        }
        Ok(Acquired::Granted { fencing })
    }

    /// Records a new term's exact fencing token in the Lease at once (the acquiring write
    /// cannot contain its own `resourceVersion`), before the grant is returned and so before
    /// the term's workload starts: observers and the API server's fencing policy see the
    /// token one write after the grant. The acquiring write already raised
    /// [`record::FENCING_FLOOR`] above every earlier term's token, so the policy refuses the
    /// previous leader from the grant itself; the stamp makes the floor exact. If it fails
    /// (a foreign write in between, a transient error), the first renewal stamps instead.
    async fn stamp(
        &self,
        name: &Arc<str>,
        req: &AcquireRequest,
        granted: Lease,
        acquired: &Acquired,
    ) {
        let Acquired::Granted { fencing } = acquired else {
            return;
        };
        let mut lease = granted;
        record::renewed(&mut lease, req.ttl, Some(*fencing));
        let started = Instant::now();
        match self.replace(name, &lease, Traffic::Ordinary).await {
            Ok(obj) => {
                tracing::debug!(lease = %name, fencing = %fencing, elapsed = ?started.elapsed(), "stamped the term's fencing token");
                if let Err(e) = self.note(name, Some(obj), None, Source::Answer(started)) {
                    tracing::warn!(lease = %name, "after stamping the fencing token: {e}");
                }
            }
            Err(Fail::Conflict | Fail::NotFound) => {
                tracing::debug!(lease = %name, "the Lease changed before the fencing token was stamped");
            }
            Err(Fail::Error(e)) => {
                tracing::warn!(lease = %name, "cannot stamp the fencing token yet (the first renewal will): {e}");
            }
        }
    }

    async fn replace(&self, name: &str, lease: &Lease, traffic: Traffic) -> Result<Lease, Fail> {
        self.call(
            self.op("update", name),
            traffic,
            self.api.replace(name, &PostParams::default(), lease),
        )
        .await
    }

    pub(super) async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquired, BackendError> {
        let name = &req.name;
        let mut last_holder = None;
        for round in 0..ROUNDS {
            // After a conflict, read from the server: the view lost a race.
            let current = self.read(name, round == 0, Traffic::Ordinary).await?;
            let floor = self.max_rv.load(Ordering::Relaxed);
            let sent = Instant::now();
            let seen = match current {
                Current::Absent => {
                    let lease = record::created(
                        &self.namespace,
                        name,
                        &req.holder,
                        &req.identity,
                        req.ttl,
                        floor.saturating_add(1),
                    );
                    let mut lease = lease;
                    self.label_if_joint(name, &mut lease);
                    let op = self.op("create", name);
                    match self
                        .call(
                            op,
                            Traffic::Ordinary,
                            self.api.create(&PostParams::default(), &lease),
                        )
                        .await
                    {
                        Ok(obj) => {
                            let acquired =
                                self.granted(name, req, obj.clone(), sent, None, floor)?;
                            self.stamp(name, req, obj, &acquired).await;
                            return Ok(acquired);
                        }
                        // AlreadyExists: another candidate created it first.
                        Err(Fail::Conflict) => continue,
                        Err(Fail::NotFound) => {
                            return Err(BackendError::new(
                                BackendErrorKind::Config,
                                format!("{op}: not found (404); does the namespace exist?"),
                            ));
                        }
                        Err(Fail::Error(e)) => return Err(e),
                    }
                }
                Current::Present(seen) => seen,
            };
            self.check_not_a_shard(name, &seen.lease)?;
            let view = record::View::of(&seen.lease);
            let mut lease = seen.lease.clone();
            let replay = if view.token == Some(req.holder) {
                // A replay of our own grant: the original token, the ttl restarted.
                let (_, own) = self.own_view(name, &req.holder);
                let fencing = own.map_or_else(|| view.term_fencing(seen.rv), |o| o.fencing);
                record::renewed(&mut lease, req.ttl, Some(fencing));
                Some(fencing)
            } else {
                let now = Instant::now();
                let remaining = seen.remaining(view.duration, now);
                if view.holder.is_some() && !remaining.is_zero() {
                    return Ok(Acquired::Busy {
                        holder: view.holder,
                        remaining: Some(remaining),
                    });
                }
                // Free, but handed over to another replica whose window still runs (on this
                // process's clock, from when it first saw the release).
                if let Some((handoff, window)) = &view.handoff
                    && handoff.excludes(&req.identity)
                    && !seen.remaining(*window, now).is_zero()
                {
                    return Ok(Acquired::Busy {
                        holder: handoff.target().map(str::to_owned),
                        remaining: Some(seen.remaining(*window, now)),
                    });
                }
                last_holder = view.holder;
                // Every token issued before this term is at most the version we read.
                let term_floor = seen.rv.saturating_add(1);
                record::take_over(&mut lease, &req.holder, &req.identity, req.ttl, term_floor);
                self.label_if_joint(name, &mut lease);
                None
            };
            match self.replace(name, &lease, Traffic::Ordinary).await {
                Ok(obj) => {
                    let acquired = self.granted(name, req, obj.clone(), sent, replay, floor)?;
                    if replay.is_none() {
                        self.stamp(name, req, obj, &acquired).await;
                    }
                    return Ok(acquired);
                }
                // Someone else wrote (409), or deleted it (404): read again and decide afresh.
                Err(Fail::Conflict | Fail::NotFound) => {}
                Err(Fail::Error(e)) => return Err(e),
            }
        }
        Ok(Acquired::Busy {
            holder: last_holder,
            remaining: None,
        })
    }

    pub(super) async fn renew(
        &self,
        name: &Arc<str>,
        holder: &HolderToken,
        ttl: Duration,
    ) -> Result<Renewed, BackendError> {
        for round in 0..ROUNDS {
            let (cached, own) = self.own_view(name, holder);
            // The fast path (client-go's): write over our own last write, one request.
            let current = match cached.filter(|_| round == 0) {
                Some(c) => c,
                None => self.read(name, false, Traffic::Upkeep).await?,
            };
            let Current::Present(seen) = current else {
                self.forget(name, holder);
                return Ok(Renewed::NotHeld);
            };
            let view = record::View::of(&seen.lease);
            if view.token != Some(*holder) {
                self.forget(name, holder);
                return Ok(Renewed::NotHeld);
            }
            let now = Instant::now();
            let expired = match own {
                Some(o) => o.expired(now),
                None => seen.remaining(view.duration, now).is_zero(),
            };
            if expired {
                // Others may already judge it expired: renewing would resurrect it.
                return Ok(Renewed::NotHeld);
            }
            let fencing = own.map(|o| o.fencing).or(view.fencing);
            let mut lease = seen.lease.clone();
            record::renewed(&mut lease, ttl, fencing);
            let sent = Instant::now();
            match self.replace(name, &lease, Traffic::Upkeep).await {
                Ok(obj) => {
                    self.note(name, Some(obj), None, Source::Answer(sent))?;
                    if let Some(st) = self.locks().get_mut(&**name)
                        && let Some(o) = st.own.as_mut().filter(|o| o.holder == *holder)
                    {
                        o.last_sent = sent;
                        o.duration = Duration::from_secs(
                            record::lease_duration_seconds(ttl).unsigned_abs().into(),
                        );
                    }
                    return Ok(Renewed::Held);
                }
                Err(Fail::Conflict) => {}
                Err(Fail::NotFound) => {
                    self.forget(name, holder);
                    return Ok(Renewed::NotHeld);
                }
                Err(Fail::Error(e)) => return Err(e),
            }
        }
        Err(self.contended("renew", name))
    }

    /// Gives `name` up if `holder` holds it; with `identity`, only if the Lease also names
    /// that identity as its holder (`release_as`: a replay then counts as not held). The
    /// check and the write are one compare-and-swap on the version read.
    ///
    /// With `to`, the release also records the hand-over target and its window
    /// (`release_to`), in the same write.
    pub(super) async fn release(
        &self,
        name: &Arc<str>,
        holder: &HolderToken,
        identity: Option<&str>,
        to: Option<(&str, Duration)>,
    ) -> Result<Released, BackendError> {
        for round in 0..ROUNDS {
            let (cached, _) = self.own_view(name, holder);
            let current = match cached.filter(|_| round == 0) {
                Some(c) => c,
                None => self.read(name, false, Traffic::Upkeep).await?,
            };
            let Current::Present(seen) = current else {
                self.forget(name, holder);
                return Ok(Released::NotHeld);
            };
            let view = record::View::of(&seen.lease);
            if identity.is_some()
                && (view.token != Some(*holder) || view.holder.as_deref() != identity)
            {
                return Ok(Released::NotHeld);
            }
            if view.token != Some(*holder) {
                self.forget(name, holder);
                return Ok(if view.released == Some(*holder) {
                    // A replay of a release that took effect.
                    Released::Released
                } else {
                    Released::NotHeld
                });
            }
            let mut lease = seen.lease.clone();
            record::released(&mut lease, holder);
            if let Some((to, window)) = to {
                record::hand_over(&mut lease, &Handoff::To(to.to_owned()), window);
            }
            let sent = Instant::now();
            match self.replace(name, &lease, Traffic::Upkeep).await {
                Ok(obj) => {
                    self.note(name, Some(obj), None, Source::Answer(sent))?;
                    self.forget(name, holder);
                    return Ok(Released::Released);
                }
                Err(Fail::Conflict) => {}
                Err(Fail::NotFound) => {
                    self.forget(name, holder);
                    return Ok(Released::NotHeld);
                }
                Err(Fail::Error(e)) => return Err(e),
            }
        }
        Err(self.contended("release", name))
    }

    /// Records a request that the holder of `name` hand the Lease over, if a holder's lease
    /// is live by this process's clock; a compare-and-swap like every write.
    pub(super) async fn request_handoff(
        &self,
        name: &Arc<str>,
        handoff: &Handoff,
        window: Duration,
    ) -> Result<bool, BackendError> {
        for _ in 0..ROUNDS {
            let Current::Present(seen) = self.read(name, false, Traffic::Ordinary).await? else {
                return Ok(false);
            };
            let view = record::View::of(&seen.lease);
            if view.holder.is_none() || seen.remaining(view.duration, Instant::now()).is_zero() {
                return Ok(false);
            }
            let mut lease = seen.lease.clone();
            record::hand_over(&mut lease, handoff, window);
            let sent = Instant::now();
            match self.replace(name, &lease, Traffic::Ordinary).await {
                Ok(obj) => {
                    self.note(name, Some(obj), None, Source::Answer(sent))?;
                    return Ok(true);
                }
                Err(Fail::Conflict) => {}
                Err(Fail::NotFound) => return Ok(false),
                Err(Fail::Error(e)) => return Err(e),
            }
        }
        Err(self.contended("hand-over request", name))
    }

    fn contended(&self, what: &str, name: &str) -> BackendError {
        BackendError::new(
            BackendErrorKind::Unavailable,
            format!(
                "{what} of lease {}/{name}: the Lease changed under every one of {ROUNDS} \
                 attempts (409 Conflict each time)",
                self.namespace
            ),
        )
    }
}
