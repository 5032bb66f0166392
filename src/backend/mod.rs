//! The storage contract: the few atomic primitives a lease store must offer, and nothing more.
//!
//! Everything backend-specific lives below this module; the lock runtime ([`crate::lock`]) and
//! the elector talk to a store only through [`Backend`]. Each primitive is one round trip where
//! the store allows it, and each is idempotent under the client's own retries:
//!
//! | primitive | answers | guarded by |
//! |---|---|---|
//! | [`Backend::try_acquire`] | [`Acquired::Granted`] with a fencing token, or [`Acquired::Busy`] | the lock being free, or already ours (a replay) |
//! | [`Backend::renew`] / [`Backend::renew_many`] | [`Renewed::Held`] or [`Renewed::NotHeld`] | the holder token |
//! | [`Backend::release`] | [`Released::Released`] or [`Released::NotHeld`] | the holder token |
//! | [`Backend::release_as`] | [`Released::Released`] or [`Released::NotHeld`] | the holder token *and* the holder's identity |
//! | [`Backend::release_to`] | as `release`, and only `to` may acquire for a window | the holder token |
//! | [`Backend::request_handoff`] | whether the lock was held; the holder is asked to hand over | — |
//! | [`Backend::inspect`] | the current [`LeaseRecord`], if any | — |
//! | [`Backend::observe`] | a stream of [`HolderChange`]s | — |
//! | [`Backend::check_completion`] | a run-once job's [`CompletionCheck`]: the record, the store's clock | — |
//! | [`Backend::record_completion`] | whether the [`Completion`] was written | the term being the lease's latest |
//!
//! "Busy" and "not held" are *values*: they are normal outcomes of a race, not failures.
//! [`BackendError`] is reserved for I/O: the store could not be asked, or did not answer.
//!
//! Backends:
//! - [`memory::MemoryBackend`]: in-process, always available, driven by tokio's clock.
//! - [`faulty::FaultyBackend`]: wraps any backend and injects delays, stalls and failures.
//! - `redis::RedisBackend` (feature `redis`): one Redis server, Lua scripts over one shared
//!   connection, release notifications over pub/sub.
//! - `kube::KubeBackend` (feature `kube`): a `coordination.k8s.io/v1` Lease per lock, written
//!   as client-go writes it; compare-and-swap on resourceVersion, a watch for notifications.

pub mod completion;
mod error;
pub mod faulty;
pub mod group;
#[cfg(feature = "kube")]
pub mod kube;
#[cfg(feature = "local")]
pub mod local;
mod member;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
pub(crate) mod types;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;

pub use completion::{Completion, CompletionCheck, CompletionRead};
pub(crate) use error::check_common_name_rules;
pub use error::{BackendError, BackendErrorKind, InvalidName};
pub use group::{GroupRead, GroupRecord, GroupVersion, ShardLeaseWatch};
pub use member::MAX_MEMBER_RECORD;
pub use types::{
    AcquireRequest, Acquired, EndedTerm, FencingToken, Handoff, HolderChange, HolderToken,
    LeadershipEvent, LeaseRecord, Member, Released, RenewRequest, Renewed, TermEnd,
};

/// A lease store: the atomic primitives the lock runtime is built from.
///
/// # Contract
///
/// Every implementation must pass the shared conformance suite (`tenure::conformance`, behind
/// the `conformance` feature). In words:
///
/// - **Ownership.** A lock is held by at most one holder token at a time. Only the current
///   holder token can renew or release it.
/// - **Expiry.** A lock whose holder has not renewed within its ttl is free. The store measures
///   that ttl on its own clock from when it *processed* the acquire or renew, which is never
///   earlier than when the client sent it; this is what makes the client's own validity estimate
///   (sent + ttl − drift) safe.
/// - **Fencing.** Every grant carries a [`FencingToken`] strictly greater than every token issued
///   before it for the same lock name, whoever holds it. A replay of an acquire by the current
///   holder token returns the *original* token and restarts the ttl from now.
/// - **Idempotence.** A replayed release by a holder token that already released reports
///   [`Released::Released`] again and never touches a successor's lock.
/// - **Renewal never resurrects.** Renewing a lock that expired or was taken over answers
///   [`Renewed::NotHeld`]; it never recreates it.
/// - **Notification.** [`observe`](Backend::observe) reports releases promptly, so waiters can
///   retry at once. It may miss events (expiry is not reported, messages can be lost); waiters
///   always keep a timed fallback.
///
/// Methods return boxed futures so that the lock runtime can hold any backend as
/// `Arc<dyn Backend>`.
pub trait Backend: Send + Sync + 'static {
    /// Checks a lock name against this store's naming rules.
    ///
    /// # Errors
    ///
    /// [`InvalidName`] naming the rule the name breaks.
    fn validate_name(&self, name: &str) -> Result<(), InvalidName>;

    /// One attempt to take the lock `req.name` for `req.holder`.
    ///
    /// Grants when the lock is free (never held, expired or released) or already held by
    /// `req.holder` (a replay, which restarts the ttl and returns the original token).
    fn try_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquired, BackendError>>;

    /// Extends the lock's ttl to `ttl` from now if `holder` still holds it.
    fn renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Renewed, BackendError>>;

    /// Renews many leases at once; the answer has one entry per request, in order.
    ///
    /// The default sends the renewals concurrently, one call each. Stores that can batch (a
    /// Redis pipeline) override it to use one round trip.
    fn renew_many<'a>(
        &'a self,
        batch: &'a [RenewRequest],
    ) -> BoxFuture<'a, Vec<Result<Renewed, BackendError>>> {
        Box::pin(futures::future::join_all(
            batch.iter().map(|r| self.renew(&r.name, &r.holder, r.ttl)),
        ))
    }

    /// Gives the lock up if `holder` holds it, and notifies observers.
    fn release<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
    ) -> BoxFuture<'a, Result<Released, BackendError>>;

    /// Gives the lock up only if `holder` holds it *and* the store names `identity` as its
    /// holder: a compare-and-delete on both. For a holder token that comes from outside this
    /// process — a replica's restart record ([`RestartLock`](crate::election::RestartLock)) —
    /// which anyone who can read the store could have copied from another replica's lease:
    /// the identity check keeps such a record from ending another replica's term.
    ///
    /// Unlike [`release`](Self::release), a replay after the release took effect may answer
    /// [`Released::NotHeld`] (the caller learns nothing it needs from it).
    ///
    /// The default reads the lease ([`inspect`](Self::inspect)) and releases only when it
    /// names `identity`. That is safe without atomicity because a holder token is drawn fresh
    /// for each campaign by one process with one identity: if the lease named `identity` when
    /// read, the token can only release that identity's term, or nothing. The built-in stores
    /// override it to check both in the store's own atomic step.
    fn release_as<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        Box::pin(async move {
            match self.inspect(name).await? {
                Some(record) if record.identity == identity => self.release(name, holder).await,
                _ => Ok(Released::NotHeld),
            }
        })
    }

    /// Gives the lock up like [`release`](Self::release), and records `to` as the preferred
    /// next holder: for `window` (on the store's clock) only `to` may take the lock; after it,
    /// anyone may (a dead target is an ordinary release). The grant that follows clears the
    /// preference. Observers are notified as for a release, so the target wakes at once.
    ///
    /// The default releases without recording a preference (a store that cannot keep one
    /// still hands over, only not to a chosen replica). The built-in stores keep it.
    fn release_to<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        to: &'a str,
        window: Duration,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        let _ = (to, window);
        self.release(name, holder)
    }

    /// Asks the current holder of `name` to hand the lease over (to `handoff`'s target),
    /// for `window` on the store's clock: the request shows in [`inspect`](Self::inspect)'s
    /// [`LeaseRecord::handoff`], which a [`LeaderElector`](crate::LeaderElector) holding the
    /// lease (not a shard's) checks every retry period; it then steps down with
    /// [`release_to`](Self::release_to). A request nobody acts on lapses after `window`; while
    /// it stands and the lock is free, only the target may take it. Answers whether the lock
    /// was held (`false`: nothing was recorded).
    ///
    /// The default answers that this store cannot record hand-over requests.
    fn request_handoff<'a>(
        &'a self,
        name: &'a str,
        handoff: &'a Handoff,
        window: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let _ = (name, handoff, window);
        Box::pin(std::future::ready(Err(BackendError::new(
            BackendErrorKind::Config,
            "this backend cannot record hand-over requests",
        ))))
    }

    /// Reads who holds the lock now, if anyone.
    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseRecord>, BackendError>>;

    /// How the lock's latest term ended, while it is free and the store remembers it: for
    /// `tenure status` after a release or a crash. `None` while the lock is held, and when the
    /// store keeps nothing of it. A record another process wrote is untrusted: what does not
    /// parse is left out.
    ///
    /// The default remembers nothing.
    ///
    /// # Errors
    ///
    /// A [`BackendError`] when the store could not be asked.
    fn last_term<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<EndedTerm>, BackendError>> {
        let _ = name;
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Records a leadership change where people look for it, best effort: the Kubernetes
    /// backend writes an Event on the Lease ("became leader", "stopped leading"), as client-go
    /// does. The default does nothing. Failures are the backend's to log; they never affect the
    /// lease.
    fn record_event<'a>(&'a self, name: &'a str, event: &'a LeadershipEvent) -> BoxFuture<'a, ()> {
        let _ = (name, event);
        Box::pin(std::future::ready(()))
    }

    /// Announces `member` in `group`, or renews its announcement: it counts as live until
    /// `ttl` passes on the store's clock without another announcement, or until it
    /// withdraws. Sharded leadership ([`crate::shard`]) builds on it.
    ///
    /// The default answers that this backend keeps no membership.
    fn announce_member<'a>(
        &'a self,
        group: &'a str,
        member: &'a Member,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = (group, member, ttl);
        Box::pin(std::future::ready(Err(no_membership())))
    }

    /// Removes `identity` from `group` at once (a graceful leave). Withdrawing a member that
    /// is not there succeeds.
    fn withdraw_member<'a>(
        &'a self,
        group: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = (group, identity);
        Box::pin(std::future::ready(Err(no_membership())))
    }

    /// The live members of `group`: the set now, then the whole set again on every change
    /// (an announcement, a withdrawal, an expiry), through one watch or subscription for the
    /// whole group. Members come sorted by identity. An `Err` item is a hiccup of the channel;
    /// the stream continues after it.
    fn members(&self, group: &str) -> BoxStream<'static, Result<Vec<Member>, BackendError>> {
        let _ = group;
        Box::pin(futures::stream::iter([Err(no_membership())]))
    }

    /// Reads `group`'s record: the parameters every member shares ([`GroupRecord`]).
    /// Always a fresh read from the store (on Kubernetes a quorum read, not a cache): the
    /// sharded elector's safety rests on it.
    ///
    /// The default answers that this backend keeps no membership.
    fn group_record<'a>(
        &'a self,
        group: &'a str,
    ) -> BoxFuture<'a, Result<GroupRead, BackendError>> {
        let _ = group;
        Box::pin(std::future::ready(Err(no_membership())))
    }

    /// Writes `record` as `group`'s record if the record is still the one read at
    /// `expected` (`None`: only if there is none). Answers whether it was written; `false`
    /// means another member changed it first (read again).
    ///
    /// The default answers that this backend keeps no membership.
    fn swap_group_record<'a>(
        &'a self,
        group: &'a str,
        expected: Option<&'a GroupVersion>,
        record: &'a GroupRecord,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let _ = (group, expected, record);
        Box::pin(std::future::ready(Err(no_membership())))
    }

    /// Reads lease `name`'s completion record ([`Completion`]: the run-once job's last
    /// completion) and the store's clock, as the term with fencing token `token` begins a
    /// run of the job (`tenure run --once-per`). Answers whether that term is the lease's
    /// latest ([`CompletionCheck::latest`]).
    ///
    /// From this call's answer on, [`record_completion`](Self::record_completion) refuses a
    /// record of any term with a lower token: a term that checks, finds no completion in its
    /// period and runs the job is never followed by an older term's record of the same period.
    /// The clock is the store's own (Redis `TIME`, the API server's time of a write, the
    /// host's clock for local files), so every replica orders runs by one clock.
    ///
    /// A record another process wrote is untrusted: bounded and parsed alone, and reported as
    /// [`CompletionRead::Damaged`] when it does not parse.
    ///
    /// The default answers that this backend keeps no completion records.
    ///
    /// # Errors
    ///
    /// A [`BackendError`]: the store could not be asked, or keeps no completion records.
    fn check_completion<'a>(
        &'a self,
        name: &'a str,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<CompletionCheck, BackendError>> {
        let _ = (name, token);
        Box::pin(std::future::ready(Err(no_completions())))
    }

    /// Writes `record` as lease `name`'s completion record if the term with fencing token
    /// `record.token` is still the lease's latest, in one atomic step of the store: no term
    /// with a higher token was granted (Redis, local files, memory: the lease's counter still
    /// equals it) or has checked ([`check_completion`](Self::check_completion); on
    /// Kubernetes, where a grant and the record are separate objects, the check is what
    /// every term writes first). Answers `false`, writing nothing, when it is not.
    ///
    /// The default answers that this backend keeps no completion records.
    ///
    /// # Errors
    ///
    /// A [`BackendError`]: the store could not be asked (the record may or may not have been
    /// written), or keeps no completion records.
    fn record_completion<'a>(
        &'a self,
        name: &'a str,
        record: &'a Completion,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let _ = (name, record);
        Box::pin(std::future::ready(Err(no_completions())))
    }

    /// Follows `leases` — the shard leases of sharded group `group` that this process may
    /// hold — together, for as long as the returned guard lives.
    ///
    /// A backend whose expiry judgement runs on the observer's clock (Kubernetes) starts
    /// that clock for every one of them now, not when this process first asks for one: a
    /// shard whose holder died is then taken over one lease after the holder's last
    /// renewal, not one lease after a new owner first looked. It may also serve
    /// [`observe`](Self::observe) of these leases from one watch for the whole group rather
    /// than one per lease, and mark the leases it writes as the group's.
    ///
    /// The default follows each lease on its own (the store judges expiry, or a
    /// notification per lease costs nothing).
    fn follow_shard_leases(&self, group: &str, leases: &[String]) -> ShardLeaseWatch {
        let _ = (group, leases);
        ShardLeaseWatch::none()
    }

    /// The longest this backend lets a `try_acquire` or `release` take before it fails the
    /// call itself with a timeout error, if it bounds every such call (the whole call:
    /// connecting, redirects, retries). The lock runtime then sets no deadline of its own on a
    /// call when this is at most the deadline it would set: one timer per call, not two.
    ///
    /// The default, `None`, makes no such promise. A wrapper that adds waits of its own (a
    /// fault injector, a proxy) must not pass its inner backend's bound on.
    fn request_bound(&self) -> Option<Duration> {
        None
    }

    /// A stream of holder changes of one lock: grants and releases.
    ///
    /// The first item describes the state when the stream started, so a subscriber cannot miss
    /// a change that happened between reading the state and subscribing. Expiry is not
    /// necessarily reported. An `Err` item is a hiccup of the notification channel, not of the
    /// lock; the stream may continue after it.
    fn observe(&self, name: &str) -> BoxStream<'static, Result<HolderChange, BackendError>>;
}

// Every method forwarded: a method left to its default here would silently bypass the
// inner backend's own (an atomic `release_as`, a store's `release_to`) for every `Arc` user.
#[deny(clippy::missing_trait_methods)]
impl<B: Backend + ?Sized> Backend for Arc<B> {
    fn validate_name(&self, name: &str) -> Result<(), InvalidName> {
        (**self).validate_name(name)
    }
    fn try_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquired, BackendError>> {
        (**self).try_acquire(req)
    }
    fn renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Renewed, BackendError>> {
        (**self).renew(name, holder, ttl)
    }
    fn renew_many<'a>(
        &'a self,
        batch: &'a [RenewRequest],
    ) -> BoxFuture<'a, Vec<Result<Renewed, BackendError>>> {
        (**self).renew_many(batch)
    }
    fn release<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        (**self).release(name, holder)
    }
    fn release_as<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        (**self).release_as(name, holder, identity)
    }
    fn release_to<'a>(
        &'a self,
        name: &'a str,
        holder: &'a HolderToken,
        to: &'a str,
        window: Duration,
    ) -> BoxFuture<'a, Result<Released, BackendError>> {
        (**self).release_to(name, holder, to, window)
    }
    fn request_handoff<'a>(
        &'a self,
        name: &'a str,
        handoff: &'a Handoff,
        window: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).request_handoff(name, handoff, window)
    }
    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseRecord>, BackendError>> {
        (**self).inspect(name)
    }
    fn last_term<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<EndedTerm>, BackendError>> {
        (**self).last_term(name)
    }
    fn record_event<'a>(&'a self, name: &'a str, event: &'a LeadershipEvent) -> BoxFuture<'a, ()> {
        (**self).record_event(name, event)
    }
    fn announce_member<'a>(
        &'a self,
        group: &'a str,
        member: &'a Member,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        (**self).announce_member(group, member, ttl)
    }
    fn withdraw_member<'a>(
        &'a self,
        group: &'a str,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        (**self).withdraw_member(group, identity)
    }
    fn members(&self, group: &str) -> BoxStream<'static, Result<Vec<Member>, BackendError>> {
        (**self).members(group)
    }
    fn group_record<'a>(
        &'a self,
        group: &'a str,
    ) -> BoxFuture<'a, Result<GroupRead, BackendError>> {
        (**self).group_record(group)
    }
    fn swap_group_record<'a>(
        &'a self,
        group: &'a str,
        expected: Option<&'a GroupVersion>,
        record: &'a GroupRecord,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).swap_group_record(group, expected, record)
    }
    fn check_completion<'a>(
        &'a self,
        name: &'a str,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<CompletionCheck, BackendError>> {
        (**self).check_completion(name, token)
    }
    fn record_completion<'a>(
        &'a self,
        name: &'a str,
        record: &'a Completion,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        (**self).record_completion(name, record)
    }
    fn follow_shard_leases(&self, group: &str, leases: &[String]) -> ShardLeaseWatch {
        (**self).follow_shard_leases(group, leases)
    }
    fn request_bound(&self) -> Option<Duration> {
        (**self).request_bound()
    }
    fn observe(&self, name: &str) -> BoxStream<'static, Result<HolderChange, BackendError>> {
        (**self).observe(name)
    }
}

/// The answer of a backend that keeps no membership.
fn no_membership() -> BackendError {
    BackendError::new(
        BackendErrorKind::Config,
        "this backend keeps no group membership (needed for sharded leadership)",
    )
}

/// The answer of a backend that keeps no completion records.
fn no_completions() -> BackendError {
    BackendError::new(
        BackendErrorKind::Config,
        "this backend keeps no completion records (needed for run-once jobs)",
    )
}
