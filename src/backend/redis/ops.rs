//! The [`Backend`] impl of [`RedisBackend`]: each call's name checked, the call bounded by the
//! request timeout and sent through its coalescer (acquire, renew, release) or straight to the
//! engine (`renew_many`, `inspect`) or `members.rs` (membership), and the expiry table kept in
//! step with the answers; `observe` and `members` are streams on the subscriber hub.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::BoxStream;

use super::RedisBackend;
use super::engine::{self, AcquireEntry, ReleaseEntry, RenewEntry, hex, millis};
use super::error::name_error;
use super::{completion, group, keys, members};
use crate::backend::{
    AcquireRequest, Acquired, Backend, BackendError, BackendErrorKind, Completion, CompletionCheck,
    FencingToken, GroupRead, GroupRecord, GroupVersion, Handoff, HolderChange, HolderToken,
    InvalidName, LeaseRecord, Member, Released, RenewRequest, Renewed,
};

impl RedisBackend {
    /// Keeps the expiry table in step with a renewal's answer.
    fn renewed(
        &self,
        holder: &HolderToken,
        sent: Instant,
        ttl: Duration,
        answer: &Result<Renewed, BackendError>,
    ) {
        match answer {
            Ok(Renewed::Held) => self.inner.expiries.extended(holder, sent, ttl),
            Ok(Renewed::NotHeld) => self.inner.expiries.forget(holder),
            Err(_) => {}
        }
    }

    /// A release guarded by the holder token and, with `identity`, by the identity the lock
    /// names (`release_as`); one script call either way (release.lua).
    async fn release_checked(
        &self,
        name: &str,
        holder: &HolderToken,
        identity: Option<&str>,
    ) -> Result<Released, BackendError> {
        keys::validate_name(name).map_err(name_error)?;
        if identity == Some("") {
            // No lock names an empty identity (every identity is checked non-empty).
            return Ok(Released::NotHeld);
        }
        let keys = &self.inner.engine.keys;
        let entry = ReleaseEntry {
            lock: keys.lock(name),
            holder: hex(holder),
            identity: identity.map(str::to_owned),
            short: self
                .inner
                .expiries
                .take_ends_within(holder, self.inner.engine.ack_ttl),
        };
        self.bounded("redis release", self.inner.release.call(entry, false))
            .await
    }

    /// Bounds `fut` by the request timeout.
    async fn bounded<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        let t = self.inner.request_timeout;
        tokio::time::timeout(t, fut)
            .await
            .map_err(|_| BackendError::timeout(what, t))?
    }
}

/// A ttl in whole milliseconds, rounded up: the server must never hold a lease for less than
/// the ttl the client's validity estimate assumes.
fn ttl_ms(ttl: Duration) -> u64 {
    let ms = millis(ttl);
    let rounded = if Duration::from_millis(ms) < ttl {
        ms.saturating_add(1)
    } else {
        ms
    };
    rounded.max(1)
}

impl Backend for RedisBackend {
    fn validate_name(&self, name: &str) -> Result<(), InvalidName> {
        keys::validate_name(name)
    }

    /// Every acquire and release is bounded by the request timeout (`bounded`).
    fn request_bound(&self) -> Option<Duration> {
        Some(self.inner.request_timeout)
    }

    fn try_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquired, BackendError>> {
        Box::pin(async move {
            keys::validate_name(&req.name).map_err(name_error)?;
            let keys = &self.inner.engine.keys;
            let entry = AcquireEntry {
                lock: keys.lock(&req.name),
                fence: keys.fence(&req.name),
                next: keys.next(&req.name),
                holder: hex(&req.holder),
                identity: req.identity.clone(),
                ttl_ms: ttl_ms(req.ttl),
            };
            let sent = Instant::now();
            let answer = self
                .bounded("redis acquire", self.inner.acquire.call(entry, true))
                .await;
            if let Ok(Acquired::Granted { .. }) = answer {
                self.inner.expiries.extended(&req.holder, sent, req.ttl);
            }
            answer
        })
    }

    fn renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Renewed, BackendError>> {
        Box::pin(async move {
            keys::validate_name(name).map_err(name_error)?;
            let entry = RenewEntry {
                lock: self.inner.engine.keys.lock(name),
                holder: hex(holder),
                ttl_ms: ttl_ms(ttl),
            };
            let sent = Instant::now();
            let answer = self
                .bounded("redis renew", self.inner.renew.call(entry, true))
                .await;
            self.renewed(holder, sent, ttl, &answer);
            answer
        })
    }

    fn renew_many<'a>(
        &'a self,
        batch: &'a [RenewRequest],
    ) -> BoxFuture<'a, Vec<Result<Renewed, BackendError>>> {
        Box::pin(async move {
            let mut out: Vec<Option<Result<Renewed, BackendError>>> = vec![None; batch.len()];
            let mut entries = Vec::with_capacity(batch.len());
            let mut slots = Vec::with_capacity(batch.len());
            for (i, r) in batch.iter().enumerate() {
                match keys::validate_name(&r.name) {
                    Ok(()) => {
                        entries.push(RenewEntry {
                            lock: self.inner.engine.keys.lock(&r.name),
                            holder: hex(&r.holder),
                            ttl_ms: ttl_ms(r.ttl),
                        });
                        slots.push(i);
                    }
                    Err(e) => out[i] = Some(Err(name_error(e))),
                }
            }
            let t = self.inner.request_timeout;
            let sent = Instant::now();
            let answers = tokio::time::timeout(t, self.inner.engine.renew_slice(&entries))
                .await
                .unwrap_or_else(|_| {
                    let e = BackendError::timeout("redis renew batch", t);
                    engine::errors(&e, slots.len()).collect()
                });
            for (slot, answer) in slots.into_iter().zip(answers) {
                let r = &batch[slot];
                self.renewed(&r.holder, sent, r.ttl, &answer);
                out[slot] = Some(answer);
            }
            out.into_iter()
                .map(|a| {
                    a.unwrap_or_else(|| {
                        Err(BackendError::new(
                            BackendErrorKind::Protocol,
                            "redis renew batch: missing answer",
                        ))
                    })
                })
                .collect()
        })
    }

    fn release<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        Box::pin(self.release_checked(name, holder, None))
    }

    fn release_as<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        Box::pin(self.release_checked(name, holder, Some(identity)))
    }

    /// Records the target (handoff.lua), then releases as `release` does: two round trips.
    /// Between them the lock is still ours, so the record keeps nobody out; should the
    /// release fail, the lease runs out by its ttl and the target is preferred for the rest
    /// of the window, as after a release.
    fn release_to<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        to: &'a str,
        window: Duration,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        Box::pin(async move {
            keys::validate_name(name).map_err(name_error)?;
            let engine = &self.inner.engine;
            let token = hex(holder);
            let recorded = self
                .bounded(
                    "redis hand-over",
                    engine.hand_over(name, Some(&token), Some(to), ttl_ms(window)),
                )
                .await;
            if let Err(e) = recorded {
                tracing::warn!(lock = %name, error = %e, "could not record the hand-over target; releasing plainly");
            }
            self.release_checked(name, holder, None).await
        })
    }

    fn request_handoff<'a>(
        &'a self,
        name: &'a str,
        handoff: &'a Handoff,
        window: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            keys::validate_name(name).map_err(name_error)?;
            let engine = &self.inner.engine;
            self.bounded(
                "redis hand-over request",
                engine.hand_over(name, None, handoff.target(), ttl_ms(window)),
            )
            .await
        })
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseRecord>, BackendError>> {
        Box::pin(async move {
            keys::validate_name(name).map_err(name_error)?;
            self.bounded("redis inspect", self.inner.engine.inspect(name, false))
                .await
                .map(|s| s.record)
        })
    }

    /// Redis keeps the released holder in the lock's tombstone, for at least the release-ack
    /// ttl, and no time; an expired lease leaves nothing.
    fn last_term<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<crate::backend::EndedTerm>, BackendError>> {
        Box::pin(async move {
            keys::validate_name(name).map_err(name_error)?;
            let released = self
                .bounded(
                    "redis read released lock",
                    self.inner.engine.released_by(name),
                )
                .await?;
            Ok(
                released.map(|(identity, fencing)| crate::backend::EndedTerm {
                    identity: Some(identity),
                    fencing: Some(fencing),
                    end: crate::backend::TermEnd::Released,
                    ended_ms: None,
                }),
            )
        })
    }

    fn announce_member<'a>(
        &'a self,
        group: &'a str,
        member: &'a Member,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            keys::validate_name(group).map_err(name_error)?;
            let record = members::record_of(member)?;
            let announce = members::announce_member(
                &self.inner.engine,
                group,
                &member.identity,
                &record,
                ttl_ms(ttl),
            );
            self.bounded("redis announce member", announce)
                .await
                .map(|_| ())
        })
    }

    fn group_record<'a>(
        &'a self,
        group: &'a str,
    ) -> BoxFuture<'a, Result<GroupRead, BackendError>> {
        Box::pin(async move {
            keys::validate_name(group).map_err(name_error)?;
            self.bounded(
                "redis read group record",
                group::read(&self.inner.engine, group),
            )
            .await
        })
    }

    fn check_completion<'a>(
        &'a self,
        name: &'a str,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<CompletionCheck, BackendError>> {
        Box::pin(async move {
            keys::validate_name(name).map_err(name_error)?;
            self.bounded(
                "redis check completion",
                completion::check(&self.inner.engine, name, token),
            )
            .await
        })
    }

    fn record_completion<'a>(
        &'a self,
        name: &'a str,
        record: &'a Completion,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            keys::validate_name(name).map_err(name_error)?;
            self.bounded(
                "redis record completion",
                completion::record(&self.inner.engine, name, record),
            )
            .await
        })
    }

    fn swap_group_record<'a>(
        &'a self,
        group: &'a str,
        expected: Option<&'a GroupVersion>,
        record: &'a GroupRecord,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            keys::validate_name(group).map_err(name_error)?;
            self.bounded(
                "redis swap group record",
                group::swap(&self.inner.engine, group, expected, record),
            )
            .await
        })
    }

    fn withdraw_member<'a>(
        &'a self,
        group: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            keys::validate_name(group).map_err(name_error)?;
            let withdraw = members::withdraw_member(&self.inner.engine, group, identity);
            self.bounded("redis withdraw member", withdraw)
                .await
                .map(|_| ())
        })
    }

    fn members(&self, group: &str) -> BoxStream<'static, Result<Vec<Member>, BackendError>> {
        if let Err(e) = keys::validate_name(group) {
            let e = name_error(e);
            return Box::pin(futures::stream::once(async move { Err(e) }));
        }
        members::stream(&self.inner.hub, self.inner.engine.clone(), group)
    }

    fn observe(&self, name: &str) -> BoxStream<'static, Result<HolderChange, BackendError>> {
        if let Err(e) = keys::validate_name(name) {
            let e = name_error(e);
            return Box::pin(futures::stream::once(async move { Err(e) }));
        }
        let channel = self.inner.engine.keys.channel(name);
        self.inner
            .hub
            .observe(self.inner.engine.clone(), name, channel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_milliseconds() {
        assert_eq!(ttl_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(ttl_ms(Duration::from_micros(1500)), 2);
        assert_eq!(ttl_ms(Duration::from_micros(1)), 1);
        assert_eq!(ttl_ms(Duration::ZERO), 1);
    }
}
