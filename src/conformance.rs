//! The conformance suite every backend must pass: each semantic of the contract, as a check.
//!
//! Compiled for tests and behind the `conformance` feature, for backend authors. Each check is
//! a plain async method of [`Suite`] that panics (with a message naming the broken rule) when
//! the backend misbehaves; [`Suite::run_all`] runs them all. Checks use lock names with a
//! random suffix, so several may share one store, but they do write to it: point the suite at
//! a store you can scribble on. Not covered by semver.
//!
//! Checks work on tokio's paused clock (the memory backend) and on real time (servers). The
//! [`ttl`](Suite::ttl) sets the time scale: every wait in the suite is a multiple of it.
//!
//! ```
//! use tenure::backend::memory::MemoryBackend;
//! use tenure::conformance::Suite;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! Suite::new(MemoryBackend::new()).run_all().await;
//! # }
//! ```

/// Generates one test per conformance check, so each backend's test file lists no checks of
/// its own and a new check reaches every backend.
///
/// Give it the test attribute and an expression that evaluates to a future of
/// `(guard, Suite)`: the guard (a server handle, or `()`) lives until the check ends.
///
/// ```
/// use tenure::backend::memory::MemoryBackend;
/// use tenure::conformance::Suite;
///
/// async fn setup() -> ((), Suite) {
///     ((), Suite::new(MemoryBackend::new()))
/// }
///
/// tenure::conformance_tests!(#[tokio::test(start_paused = true)] setup());
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    (#[$test:meta] $setup:expr) => {
        $crate::conformance_tests!(@checks #[$test] $setup;
            check_mutual_exclusion,
            check_fencing_rises,
            check_ownership,
            check_release_as_checks_the_identity,
            check_expiry,
            check_replays_are_idempotent,
            check_lease_release_is_memoized,
            check_orphan,
            check_drop_releases,
            check_with_lock_panic_releases,
            check_wait_window_exhaustion,
            check_release_wakes_waiters,
            check_auto_renew_outlives_ttl,
            check_renew_deadline_ends_stalled_lease,
            check_membership,
            check_group_record,
            check_release_to_prefers_the_target,
            check_release_to_a_dead_target_lapses,
            check_handoff_request,
            check_completion_record
        );
    };
    (@checks #[$test:meta] $setup:expr; $($check:ident),*) => {$(
        #[$test]
        async fn $check() {
            let (_guard, suite) = $setup.await;
            suite.$check().await;
        }
    )*};
}

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::faulty::{Fault, FaultyBackend};
use crate::backend::{
    AcquireRequest, Acquired, Backend, FencingToken, HolderToken, Released, Renewed,
};
use crate::{LeaseEnd, LockError, LockOptions, Locker, LostReason, WithLockError};

/// The conformance suite, bound to one backend.
#[derive(Clone)]
pub struct Suite {
    backend: Arc<dyn Backend>,
    ttl: Duration,
    request_timeout: Option<Duration>,
}

impl std::fmt::Debug for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Suite")
            .field("ttl", &self.ttl)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

/// A resource that accepts writes only with a fencing token at least as high as any it has
/// seen, and records whether two writers were ever inside at once: the suite's referee.
#[derive(Debug, Default)]
pub struct FencedRegister {
    state: Mutex<RegisterState>,
}

#[derive(Debug, Default)]
struct RegisterState {
    inside: Option<FencingToken>,
    highest: Option<FencingToken>,
    accepted: u64,
}

impl FencedRegister {
    /// A writer holding `token` enters its exclusive section.
    ///
    /// # Panics
    ///
    /// If another writer is inside, or `token` is not greater than every token seen before.
    pub fn enter(&self, token: FencingToken) {
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert!(
            s.inside.is_none(),
            "mutual exclusion broken: token {token} entered while {:?} was inside",
            s.inside
        );
        assert!(
            s.highest.is_none_or(|h| token > h),
            "fencing token {token} does not exceed the highest seen {:?}",
            s.highest
        );
        s.inside = Some(token);
        s.highest = Some(token);
        s.accepted += 1;
    }

    /// The writer holding `token` leaves.
    pub fn leave(&self, token: FencingToken) {
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert_eq!(s.inside, Some(token), "leave without enter");
        s.inside = None;
    }

    /// How many sections were entered.
    #[must_use]
    pub fn accepted(&self) -> u64 {
        self.state.lock().map_or(0, |s| s.accepted)
    }
}

fn unique(check: &str) -> String {
    format!(
        "conformance-{check}-{:08x}",
        crate::util::random_u64() as u32
    )
}

impl Suite {
    /// The suite on `backend`, with a time scale (ttl) of one second.
    pub fn new(backend: impl Backend) -> Self {
        Self {
            backend: Arc::new(backend),
            ttl: Duration::from_secs(1),
            request_timeout: None,
        }
    }

    /// Sets the base ttl; every wait in the suite is a multiple of it. Use whole seconds for
    /// stores that count ttls in seconds (Kubernetes Leases).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the bound on each request the checks make through the lock runtime (acquire
    /// attempts, renewals); a quarter of the ttl unless set, and at most the ttl less its
    /// drift allowance. No check is about how fast the store answers: raise it for a store that
    /// may answer slowly (an API server on a busy machine), where a request cut short fails
    /// a check that expects an answer.
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    fn locker(&self, identity: &str) -> Locker {
        Locker::with_identity(self.backend.clone(), identity).unwrap_or_else(|e| panic!("{e}"))
    }

    fn opts(&self) -> LockOptions {
        LockOptions::new()
            .ttl(self.ttl)
            .retry_interval(self.ttl / 10)
            .request_timeout(self.request_timeout.unwrap_or(self.ttl / 4))
    }

    /// Runs every check in turn.
    pub async fn run_all(&self) {
        self.check_mutual_exclusion().await;
        self.check_fencing_rises().await;
        self.check_ownership().await;
        self.check_release_as_checks_the_identity().await;
        self.check_expiry().await;
        self.check_replays_are_idempotent().await;
        self.check_lease_release_is_memoized().await;
        self.check_orphan().await;
        self.check_drop_releases().await;
        self.check_with_lock_panic_releases().await;
        self.check_wait_window_exhaustion().await;
        self.check_release_wakes_waiters().await;
        self.check_auto_renew_outlives_ttl().await;
        self.check_renew_deadline_ends_stalled_lease().await;
        self.check_membership().await;
        self.check_group_record().await;
        self.check_release_to_prefers_the_target().await;
        self.check_release_to_a_dead_target_lapses().await;
        self.check_handoff_request().await;
        self.check_completion_record().await;
    }

    /// Many tasks contend for one lock through `with_lock`; the fenced register must never
    /// see two inside at once, nor a token that does not rise.
    pub async fn check_mutual_exclusion(&self) {
        let name = unique("mutex");
        let register = Arc::new(FencedRegister::default());
        let opts = self.opts().wait(self.ttl * 60);
        let mut tasks = Vec::new();
        for worker in 0..8 {
            let locker = self.locker(&format!("worker-{worker}"));
            let (name, register, opts, hold) =
                (name.clone(), register.clone(), opts.clone(), self.ttl / 20);
            tasks.push(tokio::spawn(async move {
                for _ in 0..4 {
                    let r = locker
                        .with_lock(&name, &opts, |guard| {
                            let register = register.clone();
                            async move {
                                register.enter(guard.fencing_token());
                                tokio::time::sleep(hold).await;
                                register.leave(guard.fencing_token());
                            }
                        })
                        .await;
                    if let Err(e) = r {
                        panic!("with_lock failed: {e}");
                    }
                }
            }));
        }
        for t in tasks {
            t.await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        }
        assert_eq!(register.accepted(), 32, "every section ran once");
    }

    /// Tokens rise across holders and across the same identity acquiring again.
    pub async fn check_fencing_rises(&self) {
        let name = unique("fencing");
        let (a, b) = (self.locker("a"), self.locker("b"));
        let mut last = None;
        for locker in [&a, &a, &b, &a, &b, &b] {
            let lease = locker
                .try_acquire(&name, &self.opts())
                .await
                .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
            let t = lease.fencing_token();
            assert!(last.is_none_or(|l| t > l), "token {t} after {last:?}");
            last = Some(t);
            lease
                .release()
                .await
                .unwrap_or_else(|e| panic!("release failed: {e}"));
        }
    }

    /// A wrong holder token can neither renew nor release, and the holder is unaffected.
    pub async fn check_ownership(&self) {
        let name = unique("ownership");
        let lease = self
            .locker("owner")
            .try_acquire(&name, &self.opts())
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        let intruder = HolderToken::random();
        let b = &self.backend;
        assert_eq!(
            b.renew(&name, &intruder, self.ttl * 10).await.ok(),
            Some(Renewed::NotHeld)
        );
        assert_eq!(
            b.release(&name, &intruder).await.ok(),
            Some(Released::NotHeld)
        );
        let record = b
            .inspect(&name)
            .await
            .ok()
            .flatten()
            .expect("the lock is held");
        assert_eq!(record.identity, "owner");
        assert_eq!(record.fencing, lease.fencing_token());
        assert!(lease.is_valid());
        lease
            .release()
            .await
            .unwrap_or_else(|e| panic!("owner's release failed: {e}"));
    }

    /// [`Backend::release_as`] releases only what the store says the identity holds with the
    /// token: the right token under another identity (a restart record carrying a token copied
    /// from another replica's lease) releases nothing, nor does the right identity with another
    /// token; both right, it releases.
    pub async fn check_release_as_checks_the_identity(&self) {
        let name = unique("release-as");
        let b = &self.backend;
        let holder = HolderToken::random();
        let req = AcquireRequest {
            name: name.as_str().into(),
            holder,
            identity: "replica-b".into(),
            ttl: self.ttl * 10,
        };
        let granted = b
            .try_acquire(&req)
            .await
            .unwrap_or_else(|e| panic!("acquire failed: {e}"));
        assert!(
            matches!(granted, Acquired::Granted { .. }),
            "free lock not granted: {granted:?}"
        );
        assert_eq!(
            b.release_as(&name, &holder, "replica-a").await.ok(),
            Some(Released::NotHeld),
            "the holder's token under another identity released the lock"
        );
        assert_eq!(
            b.release_as(&name, &HolderToken::random(), "replica-b")
                .await
                .ok(),
            Some(Released::NotHeld),
            "another token under the holder's identity released the lock"
        );
        let record = b
            .inspect(&name)
            .await
            .ok()
            .flatten()
            .expect("the lock is still held");
        assert_eq!(record.identity, "replica-b");
        assert_eq!(
            b.renew(&name, &holder, self.ttl * 10).await.ok(),
            Some(Renewed::Held),
            "the holder still holds it"
        );
        assert_eq!(
            b.release_as(&name, &holder, "replica-b").await.ok(),
            Some(Released::Released)
        );
        assert!(
            b.inspect(&name).await.ok().flatten().is_none(),
            "released by its token under its identity"
        );
        assert_eq!(
            b.release_as(&name, &holder, "replica-b").await.ok(),
            Some(Released::NotHeld),
            "nothing left to release"
        );
    }

    /// A lease not renewed expires: its handle reports the loss no later than another
    /// candidate acquires, and the old holder cannot renew it back.
    pub async fn check_expiry(&self) {
        let name = unique("expiry");
        let old = self
            .locker("old")
            .try_acquire(&name, &self.opts())
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        let new_locker = self.locker("new");
        match new_locker.try_acquire(&name, &self.opts()).await {
            Err(LockError::NotAcquired {
                holder, remaining, ..
            }) => {
                assert_eq!(holder.as_deref(), Some("old"));
                assert!(
                    remaining.is_none_or(|r| r <= self.ttl),
                    "remaining {remaining:?}"
                );
            }
            other => panic!("held lock must be busy, got {other:?}"),
        }
        let new = new_locker
            .acquire(&name, &self.opts().wait(self.ttl * 5))
            .await
            .unwrap_or_else(|e| panic!("expired lock not granted: {e}"));
        assert!(
            matches!(old.end(), Some(LeaseEnd::Lost(LostReason::Expired))),
            "the old handle must have seen its expiry by the time a successor holds: {:?}",
            old.end()
        );
        assert!(!old.is_valid());
        assert!(new.fencing_token() > old.fencing_token());
        assert!(matches!(old.refresh().await, Err(LockError::Lost { .. })));
        let b = &self.backend;
        assert_eq!(
            b.renew(&name, &old.shared().holder, self.ttl).await.ok(),
            Some(Renewed::NotHeld),
            "renewal must not resurrect an expired lease"
        );
        assert!(matches!(old.release().await, Err(LockError::Lost { .. })));
        assert!(
            new.is_valid(),
            "the old holder's release must not touch the successor"
        );
        new.release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
    }

    /// A replayed acquire returns the original token; a replayed release reports success
    /// and never touches a successor.
    pub async fn check_replays_are_idempotent(&self) {
        let name = unique("replay");
        let b = &self.backend;
        let req = AcquireRequest {
            name: name.as_str().into(),
            holder: HolderToken::random(),
            identity: "replayer".into(),
            ttl: self.ttl * 5,
        };
        let first = b.try_acquire(&req).await.ok();
        let Some(Acquired::Granted { fencing }) = first else {
            panic!("free lock not granted: {first:?}");
        };
        let replay = b.try_acquire(&req).await.ok();
        assert_eq!(
            replay,
            Some(Acquired::Granted { fencing }),
            "replay must return the original grant"
        );
        assert_eq!(
            b.release(&name, &req.holder).await.ok(),
            Some(Released::Released)
        );
        assert_eq!(
            b.release(&name, &req.holder).await.ok(),
            Some(Released::Released),
            "a replayed release must report success"
        );
        let next = AcquireRequest {
            holder: HolderToken::random(),
            identity: "successor".into(),
            ..req.clone()
        };
        let Some(Acquired::Granted { fencing: later }) = b.try_acquire(&next).await.ok() else {
            panic!("released lock not granted");
        };
        assert!(later > fencing);
        let _ = b.release(&name, &req.holder).await;
        let record = b.inspect(&name).await.ok().flatten();
        assert_eq!(
            record.map(|r| r.identity).as_deref(),
            Some("successor"),
            "a replayed release must not remove the successor"
        );
        assert_eq!(
            b.release(&name, &next.holder).await.ok(),
            Some(Released::Released)
        );
    }

    /// `Lease::release` contacts the store once, however often it is called.
    pub async fn check_lease_release_is_memoized(&self) {
        let name = unique("release-once");
        let counted = FaultyBackend::new(self.backend.clone());
        let locker =
            Locker::with_identity(counted.clone(), "once").unwrap_or_else(|e| panic!("{e}"));
        let lease = locker
            .try_acquire(&name, &self.opts())
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        assert!(lease.release().await.is_ok());
        assert!(lease.release().await.is_ok());
        assert!(matches!(lease.end(), Some(LeaseEnd::Released)));
        assert!(matches!(lease.lost().await, LeaseEnd::Released));
        drop(lease);
        tokio::time::sleep(self.ttl / 10).await;
        assert_eq!(
            counted.counts().release,
            1,
            "one release round trip, also after drop"
        );
    }

    /// An orphaned lease stops renewing, is not released on drop, and expires by its ttl.
    pub async fn check_orphan(&self) {
        let name = unique("orphan");
        let locker = self.locker("orphaner");
        let lease = locker
            .try_acquire(&name, &self.opts().auto_renew(true))
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        lease.orphan();
        assert!(matches!(lease.lost().await, LeaseEnd::Orphaned));
        drop(lease);
        tokio::time::sleep(self.ttl / 10).await;
        assert!(
            self.backend.inspect(&name).await.ok().flatten().is_some(),
            "an orphaned lease must stay until its ttl runs out"
        );
        let next = self
            .locker("next")
            .acquire(&name, &self.opts().wait(self.ttl * 5))
            .await
            .unwrap_or_else(|e| panic!("orphaned lock never expired: {e}"));
        next.release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
    }

    /// Dropping a held lease releases it in the background.
    pub async fn check_drop_releases(&self) {
        let name = unique("drop");
        let long = self.opts().ttl(self.ttl * 20);
        let lease = self
            .locker("dropper")
            .try_acquire(&name, &long)
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        drop(lease);
        // Without the background release the lock would stay held for 20 ttls.
        let next = self
            .locker("next")
            .acquire(&name, &long.clone().wait(self.ttl * 2))
            .await
            .unwrap_or_else(|e| panic!("dropped lease was not released: {e}"));
        next.release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
    }

    /// A panic inside `with_lock` propagates, and the lock is released first.
    pub async fn check_with_lock_panic_releases(&self) {
        let name = unique("panic");
        let locker = self.locker("panicker");
        let long = self.opts().ttl(self.ttl * 20);
        let (n, o) = (name.clone(), long.clone());
        let joined = tokio::spawn(async move {
            locker
                .with_lock(&n, &o, |_guard| async move {
                    panic!("workload panicked");
                })
                .await
        })
        .await;
        assert!(
            joined.is_err_and(|e| e.is_panic()),
            "the panic must propagate"
        );
        let next = self
            .locker("next")
            .try_acquire(&name, &long)
            .await
            .unwrap_or_else(|e| panic!("lock not released after a panic: {e}"));
        next.release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
    }

    /// Waiting for a held lock gives up with `NotAcquired` when the window runs out.
    pub async fn check_wait_window_exhaustion(&self) {
        let name = unique("window");
        let holder = self
            .locker("holder")
            .try_acquire(&name, &self.opts().ttl(self.ttl * 20))
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        let started = Instant::now();
        let window = self.ttl / 2;
        let waited = self
            .locker("waiter")
            .acquire(&name, &self.opts().wait(window))
            .await;
        assert!(
            matches!(&waited, Err(LockError::NotAcquired { holder, .. }) if holder.as_deref() == Some("holder")),
            "expected NotAcquired naming the holder, got {waited:?}"
        );
        assert!(
            started.elapsed() >= window,
            "gave up before the window ran out"
        );
        let with = self
            .locker("waiter")
            .with_lock(&name, &self.opts().wait(window), |_| async {})
            .await;
        assert!(matches!(
            with,
            Err(WithLockError::NotRun(LockError::NotAcquired { .. }))
        ));
        holder
            .release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
    }

    /// A release to a target lets only the target in while the window runs; the target,
    /// waiting, is woken by the release (long before its retry interval); its term has a
    /// higher token; its grant clears the preference.
    pub async fn check_release_to_prefers_the_target(&self) {
        let name = unique("release-to");
        let slow_retry = self.opts().ttl(self.ttl * 20).retry_interval(self.ttl * 10);
        let leader = self
            .locker("leader")
            .try_acquire(&name, &slow_retry)
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        let target = self.locker("target");
        let (n, o) = (name.clone(), slow_retry.clone().wait(self.ttl * 10));
        let started = Instant::now();
        let waiting =
            tokio::spawn(
                async move { target.acquire(&n, &o).await.map(|l| (l, started.elapsed())) },
            );
        tokio::time::sleep(self.ttl / 5).await;
        let bystander = self.locker("bystander");
        // The bystander and the target race for the release; the bystander must lose
        // however the race goes.
        leader
            .release_to("target", self.ttl * 20)
            .await
            .unwrap_or_else(|e| panic!("release_to failed: {e}"));
        let early = bystander.try_acquire(&name, &self.opts()).await;
        assert!(
            matches!(early, Err(LockError::NotAcquired { .. })),
            "a replica other than the target took the lease in the hand-off window: {early:?}"
        );
        let (lease, took) = waiting
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
            .unwrap_or_else(|e| panic!("the target never acquired: {e}"));
        assert!(
            took < self.ttl * 5,
            "the target took {took:?}: it was not woken by the release"
        );
        assert!(lease.fencing_token() > leader.fencing_token());
        lease
            .release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
        let after = bystander
            .try_acquire(&name, &self.opts())
            .await
            .unwrap_or_else(|e| panic!("the target's grant must clear the preference: {e}"));
        assert!(after.fencing_token() > lease.fencing_token());
        after
            .release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
    }

    /// A target that never comes leaves an ordinary release once the window ends: anyone may
    /// take the lease then, with a higher token.
    pub async fn check_release_to_a_dead_target_lapses(&self) {
        let name = unique("release-to-dead");
        let leader = self
            .locker("leader")
            .try_acquire(&name, &self.opts())
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        leader
            .release_to("gone", self.ttl * 2)
            .await
            .unwrap_or_else(|e| panic!("release_to failed: {e}"));
        let other = self.locker("other");
        assert!(
            matches!(
                other.try_acquire(&name, &self.opts()).await,
                Err(LockError::NotAcquired { .. })
            ),
            "the hand-off window must keep others out"
        );
        let lease = other
            .acquire(&name, &self.opts().wait(self.ttl * 10))
            .await
            .unwrap_or_else(|e| panic!("the lease stayed reserved for a dead target: {e}"));
        assert!(lease.fencing_token() > leader.fencing_token());
        lease
            .release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
    }

    /// A hand-over request is recorded on a held lock only, shows in `inspect`, and leaves the
    /// holder holding (the holder acts on it); once the holder releases to the target, the
    /// request is gone with the grant.
    pub async fn check_handoff_request(&self) {
        use crate::backend::Handoff;
        let name = unique("handoff-request");
        let b = &self.backend;
        let want = Handoff::To("next".to_owned());
        assert_eq!(
            b.request_handoff(&name, &want, self.ttl * 5).await.ok(),
            Some(false),
            "a request on a free lock records nothing"
        );
        let leader = self
            .locker("leader")
            .try_acquire(&name, &self.opts().ttl(self.ttl * 20))
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        assert_eq!(
            b.request_handoff(&name, &want, self.ttl * 5).await.ok(),
            Some(true)
        );
        let record = b
            .inspect(&name)
            .await
            .ok()
            .flatten()
            .expect("the lock is held");
        assert_eq!(record.identity, "leader");
        assert_eq!(record.handoff, Some(want));
        assert_eq!(
            b.renew(&name, &leader.shared().holder, self.ttl * 20)
                .await
                .ok(),
            Some(Renewed::Held),
            "a request does not end the holder's lease"
        );
        leader
            .release_to("next", self.ttl * 5)
            .await
            .unwrap_or_else(|e| panic!("release_to failed: {e}"));
        let next = self
            .locker("next")
            .try_acquire(&name, &self.opts())
            .await
            .unwrap_or_else(|e| panic!("the target was refused: {e}"));
        let record = b
            .inspect(&name)
            .await
            .ok()
            .flatten()
            .expect("the lock is held");
        assert_eq!(record.handoff, None, "the grant clears the request");
        next.release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
        let anyone = Handoff::Anyone;
        let again = self
            .locker("leader")
            .try_acquire(&name, &self.opts())
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        assert_eq!(
            b.request_handoff(&name, &anyone, self.ttl * 5).await.ok(),
            Some(true)
        );
        let record = b.inspect(&name).await.ok().flatten();
        assert_eq!(record.and_then(|r| r.handoff), Some(anyone));
        again
            .release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
    }

    /// A waiter is woken by the holder's release, long before its retry interval.
    pub async fn check_release_wakes_waiters(&self) {
        let name = unique("wake");
        let slow_retry = self.opts().ttl(self.ttl * 20).retry_interval(self.ttl * 10);
        let holder = self
            .locker("holder")
            .try_acquire(&name, &slow_retry)
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        let waiter = self.locker("waiter");
        let (n, o) = (name.clone(), slow_retry.clone().wait(self.ttl * 10));
        let started = Instant::now();
        let waiting =
            tokio::spawn(
                async move { waiter.acquire(&n, &o).await.map(|l| (l, started.elapsed())) },
            );
        tokio::time::sleep(self.ttl / 5).await;
        holder
            .release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
        let (lease, took) = waiting
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
            .unwrap_or_else(|e| panic!("waiter never acquired: {e}"));
        assert!(
            took < self.ttl * 5,
            "the waiter took {took:?}: it was not woken by the release notification"
        );
        lease
            .release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
    }

    /// Auto-renew keeps a lease far beyond its ttl, in few round trips.
    pub async fn check_auto_renew_outlives_ttl(&self) {
        let name = unique("renew");
        let locker = self.locker("renewer");
        let lease = locker
            .try_acquire(&name, &self.opts().auto_renew(true))
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        tokio::time::sleep(self.ttl * 4).await;
        assert!(lease.end().is_none(), "lease ended: {:?}", lease.end());
        assert!(lease.is_valid());
        assert!(
            locker.stats().renewals() >= 6,
            "renewals: {:?}",
            locker.stats()
        );
        assert!(
            matches!(
                self.locker("other").try_acquire(&name, &self.opts()).await,
                Err(LockError::NotAcquired { .. })
            ),
            "a renewed lease must still be held"
        );
        lease
            .release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
    }

    /// A lease whose store stops answering ends at its renew deadline, before its validity.
    pub async fn check_renew_deadline_ends_stalled_lease(&self) {
        let name = unique("deadline");
        let faulty = FaultyBackend::new(self.backend.clone());
        let locker =
            Locker::with_identity(faulty.clone(), "stalled").unwrap_or_else(|e| panic!("{e}"));
        let deadline = self.ttl * 2 / 3;
        let lease = locker
            .try_acquire(
                &name,
                &self.opts().auto_renew(true).renew_deadline(deadline),
            )
            .await
            .unwrap_or_else(|e| panic!("free lock not granted: {e}"));
        let acquired_valid_until = lease.valid_until();
        faulty.set(Fault::Stall);
        let end = tokio::time::timeout(self.ttl * 3, lease.lost())
            .await
            .unwrap_or_else(|_| panic!("a stalled lease never ended"));
        assert!(
            matches!(end, LeaseEnd::Lost(LostReason::RenewDeadline)),
            "ended with {end:?}"
        );
        assert!(!lease.is_valid());
        assert!(
            Instant::now() < acquired_valid_until,
            "the lease must end at its renew deadline, before its validity runs out"
        );
        faulty.heal();
        drop(lease);
        let next = self
            .locker("next")
            .acquire(&name, &self.opts().wait(self.ttl * 5))
            .await
            .unwrap_or_else(|e| panic!("lock never freed: {e}"));
        next.release()
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"));
    }

    /// Group membership (sharded leadership): announcements appear in one stream of whole
    /// member sets, sorted by identity, with what each member holds; a withdrawal and an
    /// announcement that is not renewed within its ttl take the member out.
    pub async fn check_membership(&self) {
        use futures::StreamExt;
        let group = unique("group");
        let b = &self.backend;
        let mut sets = b.members(&group);
        let mut next = async |what: &str| -> Vec<crate::backend::Member> {
            loop {
                match tokio::time::timeout(self.ttl * 10, sets.next()).await {
                    Ok(Some(Ok(set))) => return set,
                    Ok(Some(Err(e))) if e.is_transient() => {}
                    other => panic!("{what}: the members stream gave {other:?}"),
                }
            }
        };
        assert_eq!(
            next("at first").await,
            Vec::new(),
            "a new group has no members"
        );
        let member = |identity: &str, holds: Vec<u32>| crate::backend::Member {
            identity: identity.to_owned(),
            shards: 8,
            joined_ms: 1_700_000_000_000,
            holds,
        };
        let ttl = self.ttl * 3;
        let announce = async |m: &crate::backend::Member| {
            b.announce_member(&group, m, ttl)
                .await
                .unwrap_or_else(|e| panic!("announcing {} failed: {e}", m.identity));
        };
        announce(&member("pod-b", vec![])).await;
        assert_eq!(
            next("after one announcement").await,
            vec![member("pod-b", vec![])]
        );
        // A renewal of the same announcement changes nothing a reader sees.
        announce(&member("pod-b", vec![])).await;
        // pod-a's only announcement: its ttl counts from no earlier than this.
        let last = Instant::now();
        announce(&member("pod-a", vec![1, 5])).await;
        assert_eq!(
            next("after a second").await,
            vec![member("pod-a", vec![1, 5]), member("pod-b", vec![])],
            "sorted by identity, with what each holds"
        );
        b.withdraw_member(&group, "pod-b")
            .await
            .unwrap_or_else(|e| panic!("withdrawing failed: {e}"));
        assert_eq!(
            next("after a withdrawal").await,
            vec![member("pod-a", vec![1, 5])]
        );
        b.withdraw_member(&group, "pod-b")
            .await
            .unwrap_or_else(|e| panic!("withdrawing an absent member must succeed: {e}"));
        // pod-a stops announcing: it is gone once its ttl has passed since its announcement
        // (timed from before it was sent: the steps since then took a while on a busy machine).
        assert_eq!(next("after pod-a's ttl").await, Vec::new());
        assert!(
            last.elapsed() >= ttl - self.ttl / 10,
            "pod-a expired {:?} after its announcement, before its ttl {ttl:?}",
            last.elapsed()
        );
    }

    /// The group record (sharded leadership): absent at first; created only where there is
    /// none; changed only by a writer that read the current version, so of two writers that
    /// read the same version exactly one wins; every read is fresh.
    pub async fn check_group_record(&self) {
        use crate::backend::{GroupRead, GroupRecord};
        let group = unique("group");
        let b = &self.backend;
        let read = async || {
            b.group_record(&group)
                .await
                .unwrap_or_else(|e| panic!("reading the group record failed: {e}"))
        };
        let swap = async |expected, record: &GroupRecord| {
            b.swap_group_record(&group, expected, record)
                .await
                .unwrap_or_else(|e| panic!("swapping the group record failed: {e}"))
        };
        assert_eq!(read().await, GroupRead::Absent, "a new group has no record");
        let first = GroupRecord::first(4);
        assert!(swap(None, &first).await, "creating the first record");
        assert!(
            !swap(None, &GroupRecord::first(8)).await,
            "a second creation must lose"
        );
        let GroupRead::Present { record, version } = read().await else {
            panic!("the record just written must read back");
        };
        assert_eq!(record, first);
        let draining = GroupRecord {
            shards: 8,
            generation: 2,
            draining_from: Some(4),
        };
        let active = GroupRecord {
            draining_from: None,
            ..draining
        };
        assert!(
            swap(Some(&version), &draining).await,
            "a swap from the version read"
        );
        assert!(
            !swap(
                Some(&version),
                &GroupRecord {
                    shards: 2,
                    generation: 2,
                    draining_from: Some(4)
                }
            )
            .await,
            "a swap from a version that is no longer current must lose"
        );
        let GroupRead::Present {
            record,
            version: v2,
        } = read().await
        else {
            panic!("the swapped record must read back");
        };
        assert_eq!(record, draining, "the losing swap changed nothing");
        assert_ne!(v2, version, "a change gives a new version");
        assert!(swap(Some(&v2), &active).await);
        let GroupRead::Present { record, .. } = read().await else {
            panic!("the record must read back");
        };
        assert_eq!(record, active);
    }

    /// A run-once job's completion record: absent at first; the store's clock near this
    /// host's; written by the lease's latest term and read back exactly; refused to a term
    /// once a newer term has checked (or, on stores that know their grants, was granted),
    /// and to a token never granted.
    pub async fn check_completion_record(&self) {
        use crate::backend::{Completion, CompletionRead};
        let name = unique("completion");
        let b = &self.backend;
        let check = async |token: FencingToken| {
            b.check_completion(&name, token)
                .await
                .unwrap_or_else(|e| panic!("checking the completion record failed: {e}"))
        };
        let record = async |c: &Completion| {
            b.record_completion(&name, c)
                .await
                .unwrap_or_else(|e| panic!("recording a completion failed: {e}"))
        };
        let first = self
            .locker("runner-a")
            .try_acquire(&name, &self.opts())
            .await
            .unwrap_or_else(|e| panic!("first acquire: {e}"));
        let t1 = first.fencing_token();
        let c1 = check(t1).await;
        assert_eq!(
            c1.last,
            CompletionRead::Absent,
            "a new lease has no completion"
        );
        assert!(c1.latest, "the only term is the latest");
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        assert!(
            c1.now_ms.abs_diff(wall) < 3_600_000,
            "the store's clock ({} ms) is not within an hour of this host's ({wall} ms)",
            c1.now_ms
        );
        let done = Completion {
            token: t1,
            started_ms: c1.now_ms,
            took_ms: 5,
            identity: "runner-a".to_owned(),
        };
        assert!(
            record(&done).await,
            "the latest term records its completion"
        );
        let again = check(t1).await;
        assert_eq!(again.last, CompletionRead::Present(done.clone()));
        assert!(again.latest);
        assert!(again.now_ms >= c1.now_ms, "the store's clock went back");
        first
            .release()
            .await
            .unwrap_or_else(|e| panic!("release: {e}"));

        let second = self
            .locker("runner-b")
            .try_acquire(&name, &self.opts())
            .await
            .unwrap_or_else(|e| panic!("second acquire: {e}"));
        let t2 = second.fencing_token();
        let c2 = check(t2).await;
        assert!(c2.latest);
        assert_eq!(
            c2.last,
            CompletionRead::Present(done.clone()),
            "kept across terms"
        );
        let stale = Completion {
            took_ms: 6,
            ..done.clone()
        };
        assert!(
            !record(&stale).await,
            "an older term's completion must be refused once a newer term checked"
        );
        assert!(!check(t1).await.latest, "the older term is not the latest");
        let forged = Completion {
            token: FencingToken::new(t2.get() + 1000),
            ..done.clone()
        };
        assert!(
            !record(&forged).await,
            "a token never granted must write nothing"
        );
        let newer = Completion {
            token: t2,
            started_ms: c2.now_ms,
            took_ms: 7,
            identity: "runner-b".to_owned(),
        };
        assert!(record(&newer).await);
        assert_eq!(check(t2).await.last, CompletionRead::Present(newer));
        second
            .release()
            .await
            .unwrap_or_else(|e| panic!("release: {e}"));
    }
}
