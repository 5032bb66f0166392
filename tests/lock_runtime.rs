//! The lock runtime's own behaviour on the memory backend and tokio's paused clock: the
//! renewal scheduler, cancel safety, `with_lock` outcomes and input validation.

use std::time::Duration;

use tenure::backend::faulty::{Fault, FaultyBackend};
use tenure::backend::memory::MemoryBackend;
use tenure::backend::{Backend, Released};
use tenure::{Lease, LeaseEnd, LockError, LockOptions, Locker, LostReason, WithLockError};

fn faulty_locker() -> (MemoryBackend, FaultyBackend, Locker) {
    let store = MemoryBackend::new();
    let faulty = FaultyBackend::new(store.clone());
    let locker = Locker::with_identity(faulty.clone(), "test").expect("valid identity");
    (store, faulty, locker)
}

/// A locker on a fresh memory store.
fn memory_locker() -> Locker {
    Locker::with_identity(MemoryBackend::new(), "test").expect("valid identity")
}

/// A lease of an hour without renewal: keeps the scheduler task alive, its own timer far away.
async fn hold_for_an_hour(locker: &Locker) -> Lease {
    locker
        .try_acquire("held", &LockOptions::new().ttl(Duration::from_secs(3600)))
        .await
        .expect("free")
}

/// A lease whose first `release` call was cancelled after 10 ms while the store delays every
/// request by 500 ms: the release goes on in the background.
async fn release_left_running(name: &str) -> (MemoryBackend, FaultyBackend, Lease) {
    let (store, faulty, locker) = faulty_locker();
    let lease = locker
        .try_acquire(name, &LockOptions::new())
        .await
        .expect("free");
    faulty.set(Fault::Delay(Duration::from_millis(500)));
    let cancelled = tokio::time::timeout(Duration::from_millis(10), lease.release()).await;
    assert!(
        cancelled.is_err(),
        "the release must still have been running"
    );
    (store, faulty, lease)
}

fn renewing() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(3))
        .auto_renew(true)
}

#[tokio::test(start_paused = true)]
async fn scheduler_should_serve_many_leases_from_one_task_and_batch_renewals_due_together() {
    let (_, faulty, locker) = faulty_locker();
    let mut leases = Vec::new();
    for i in 0..500 {
        leases.push(
            locker
                .try_acquire(&format!("lease-{i}"), &renewing())
                .await
                .expect("free"),
        );
    }
    while locker.stats().scheduler_internals().tracked_leases < 500 {
        tokio::task::yield_now().await;
    }
    assert_eq!(locker.stats().scheduler_tasks(), 1);
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        1
    );

    // All were acquired at the same paused instant: their renewals fall due together.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let counts = faulty.counts();
    assert_eq!(counts.renewals, 500);
    assert_eq!(
        counts.renew_round_trips, 1,
        "renewals due together must share one renew_many"
    );
    assert!(leases.iter().all(|l| l.is_valid() && l.end().is_none()));
    assert_eq!(locker.stats().renewals(), 500);
}

/// Runs `cycles` lock cycles of ttl 20 s, five per millisecond, `window` leases held
/// at a time (released oldest first), then waits 2 s for the task to take the last commands
/// in. Returns how often the scheduler task woke meanwhile.
async fn short_cycles(locker: &Locker, cycles: u64, window: usize) -> u64 {
    let short = LockOptions::new().ttl(Duration::from_secs(20));
    let start = locker.stats().scheduler_internals().wakeups;
    let mut held = std::collections::VecDeque::new();
    for i in 0..cycles {
        let lease = locker
            .try_acquire(&format!("cycle-{}", i % 1000), &short)
            .await
            .expect("free");
        held.push_back(lease);
        if held.len() >= window
            && let Some(oldest) = held.pop_front()
        {
            oldest.release().await.expect("released");
        }
        if i % 5 == 4 {
            // The timer's granularity.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    for lease in held {
        lease.release().await.expect("released");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    locker.stats().scheduler_internals().wakeups - start
}

/// A new lease due sooner than every lease the task tracks wakes it: with one lease held for
/// an hour, every short lock cycle did.
#[tokio::test(start_paused = true)]
async fn scheduler_should_not_wake_for_each_lease_due_sooner_than_a_long_held_one() {
    let locker = memory_locker();
    let held = hold_for_an_hour(&locker).await;
    let cycles = 10_000;
    let woke = short_cycles(&locker, cycles, 1).await;
    // One wake-up per 512 cycles (their queued commands) and at most one per second.
    assert!(woke <= cycles / 100, "woke {woke} times in {cycles} cycles");
    assert!(held.is_valid());
}

/// The task sleeps toward its earliest timer (at most a second ahead); a new lease due sooner
/// must wake it, or it would be renewed too late: here an auto-renewed lease of 300 ms beside
/// one held for an hour.
#[tokio::test(start_paused = true)]
async fn a_lease_due_sooner_than_the_task_sleeps_wakes_it() {
    let locker = memory_locker();
    let _held = hold_for_an_hour(&locker).await;
    // The task takes the first lease in and sleeps.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let short = locker
        .try_acquire(
            "short",
            &LockOptions::new()
                .ttl(Duration::from_millis(300))
                .auto_renew(true),
        )
        .await
        .expect("free");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(short.is_valid(), "{:?}", short.end());
    assert!(locker.stats().renewals() >= 10, "{:?}", locker.stats());
}

/// A task that wakes late (its thread was busy) fires every bucket due by then, not only the
/// one it slept until: here the clock jumps past a renewal's instant.
#[tokio::test(start_paused = true)]
async fn a_task_woken_late_fires_every_timer_due_by_then() {
    let locker = memory_locker();
    let lease = locker.try_acquire("a", &renewing()).await.expect("free");
    tokio::task::yield_now().await;
    // Renewal due at 1 s; the task sees the clock at 1.5 s.
    tokio::time::advance(Duration::from_millis(1500)).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(locker.stats().renewals(), 1, "{:?}", locker.stats());
    assert!(lease.is_valid());
}

/// Timers fire on a millisecond grid, so a lease due within a millisecond after what the task
/// sleeps until is served by that wake-up: adding it must not wake the task.
#[tokio::test(start_paused = true)]
async fn a_lease_due_in_the_bucket_the_task_sleeps_until_does_not_wake_it() {
    let locker = memory_locker();
    let opts = LockOptions::new().ttl(Duration::from_millis(500));
    let _first = locker.try_acquire("first", &opts).await.expect("free");
    tokio::task::yield_now().await;
    let asleep = locker.stats().scheduler_internals().wakeups;
    tokio::time::advance(Duration::from_micros(500)).await;
    let _second = locker.try_acquire("second", &opts).await.expect("free");
    tokio::task::yield_now().await;
    assert_eq!(locker.stats().scheduler_internals().wakeups, asleep);
}

/// A lease the scheduler took in while it was held leaves its timer behind when it is
/// released. A ttl later those timers fall due one millisecond bucket after another: the task
/// must not wake for them (it did, once per bucket: a thousand wake-ups a second, a ttl after
/// any busy second), nor keep one per lease of the last ttl (here they sit behind the held
/// lease's timer, which falls due first).
#[tokio::test(start_paused = true)]
async fn scheduler_should_not_wake_for_or_hoard_the_timers_of_released_leases() {
    let locker = memory_locker();
    let early = locker
        .try_acquire("early", &LockOptions::new().ttl(Duration::from_secs(12)))
        .await
        .expect("free");
    // Keeps the task from going idle (which drops every timer) when `early` has expired.
    let held = hold_for_an_hour(&locker).await;
    let cycles = 40_000;
    let woke = short_cycles(&locker, cycles, 64).await;
    let before = locker.stats();
    assert!(woke <= cycles / 100, "woke {woke} times in {cycles} cycles");
    assert!(early.is_valid());
    assert!(
        before.scheduler_internals().timers <= 2 * 2 + 4096,
        "timers must stay bounded by the leases tracked: {before:?}"
    );
    // `early` expires, and every cycle's deadline passes.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let after = locker.stats();
    assert!(
        after.scheduler_internals().wakeups - before.scheduler_internals().wakeups <= 30,
        "the task woke for released leases' timers: {before:?} -> {after:?}"
    );
    assert_eq!(
        after.scheduler_internals().timers,
        1,
        "only the held lease's timer is left: {after:?}"
    );
    assert!(matches!(
        early.end(),
        Some(LeaseEnd::Lost(LostReason::Expired))
    ));
    assert!(held.is_valid());
}

#[tokio::test(start_paused = true)]
async fn scheduler_should_exit_a_second_after_the_last_lease_and_restart_for_the_next() {
    let locker = memory_locker();
    let lease = locker.try_acquire("a", &renewing()).await.expect("free");
    tokio::task::yield_now().await;
    assert_eq!(locker.stats().scheduler_tasks(), 1);
    lease.release().await.expect("released");
    // It lingers a second for the next lease (no task started per lease), then exits.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(locker.stats().scheduler_tasks(), 1);
    let between = locker.try_acquire("b", &renewing()).await.expect("free");
    tokio::task::yield_now().await;
    between.release().await.expect("released");
    assert_eq!(
        locker.stats().scheduler_tasks(),
        1,
        "the lingering task took it"
    );
    // The linger counts from the last end.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(locker.stats().scheduler_tasks(), 1);
    tokio::time::sleep(Duration::from_millis(501)).await;
    assert_eq!(locker.stats().scheduler_tasks(), 0);
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        0
    );

    let again = locker.try_acquire("a", &renewing()).await.expect("free");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(locker.stats().scheduler_tasks(), 1);
    assert!(again.is_valid(), "a restarted scheduler must renew");
}

#[tokio::test(start_paused = true)]
async fn dropping_an_acquire_whose_answer_is_late_releases_what_it_was_granted() {
    let (store, faulty, locker) = faulty_locker();
    // The store grants at once; the answer would arrive after the caller gave up.
    faulty.set(Fault::DelayAnswers(Duration::from_secs(1)));
    let gave_up = tokio::time::timeout(
        Duration::from_millis(100),
        locker.try_acquire("late", &LockOptions::new().ttl(Duration::from_secs(60))),
    )
    .await;
    assert!(gave_up.is_err(), "the acquire must still have been waiting");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        store.inspect("late").await.expect("memory never fails"),
        None,
        "the grant of an abandoned acquire must be released, not left for its 60 s ttl"
    );
}

#[tokio::test(start_paused = true)]
async fn release_should_finish_when_its_caller_is_cancelled_and_be_memoized() {
    let (store, faulty, lease) = release_left_running("r").await;
    assert!(
        matches!(lease.end(), Some(LeaseEnd::Released)),
        "the lease ends at release"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(store.inspect("r").await.expect("memory never fails"), None);
    faulty.heal();
    lease.release().await.expect("the first call's result");
    assert_eq!(faulty.counts().release, 1);
}

/// A second call waiting while the first call's release goes on in the background is woken by
/// its outcome.
#[tokio::test(start_paused = true)]
async fn a_release_waiting_for_a_detached_one_gets_its_outcome() {
    let (_, faulty, lease) = release_left_running("w").await;
    let waited = tokio::time::timeout(Duration::from_secs(2), lease.release()).await;
    assert!(
        matches!(waited, Ok(Ok(()))),
        "the waiting call must get the detached release's outcome: {waited:?}"
    );
    assert_eq!(faulty.counts().release, 1);
}

/// A detached release whose runtime shuts down before it finishes answers its waiters with an
/// error instead of leaving them waiting for an outcome nobody will record.
#[test]
fn a_release_abandoned_by_its_runtime_gives_its_waiters_an_error() {
    let paused = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime")
    };
    let first = paused();
    let (_store, _faulty, lease) = first.block_on(release_left_running("abandoned"));
    // Drops the task finishing the release, unfinished (the store delays it 500 ms).
    drop(first);
    let waited = paused()
        .block_on(async { tokio::time::timeout(Duration::from_secs(60), lease.release()).await });
    match waited {
        Ok(Err(LockError::Backend(e))) => assert!(e.to_string().contains("abandoned"), "{e}"),
        other => panic!("expected the abandoned release's error, got {other:?}"),
    }
}

/// `Lease::on_renewal` mirrors the validity: the listener gets `valid_until` at once, and the
/// later one each time a renewal moves it.
#[tokio::test(start_paused = true)]
async fn a_renewal_listener_gets_the_validity_at_once_and_after_each_renewal() {
    let locker = memory_locker();
    let lease = locker
        .try_acquire("mirror", &LockOptions::new())
        .await
        .expect("free");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mirror = seen.clone();
    lease.on_renewal(move |until| mirror.lock().expect("not poisoned").push(until));
    let first = lease.valid_until();
    assert_eq!(*seen.lock().expect("not poisoned"), [first]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    lease.refresh().await.expect("still held");
    let renewed = lease.valid_until();
    assert!(renewed > first);
    assert_eq!(*seen.lock().expect("not poisoned"), [first, renewed]);
}

/// A release that failed stays failed: a second call gets the first one's error, and does not
/// try again, though the store would now answer. Reporting success for a delete that never
/// happened would tell `with_lock`'s caller exclusivity was handed back when the lease still
/// sits in the store until its ttl.
#[tokio::test(start_paused = true)]
async fn a_second_release_gets_the_first_ones_failure() {
    let (store, faulty, locker) = faulty_locker();
    let lease = locker
        .try_acquire("f", &LockOptions::new())
        .await
        .expect("free");
    faulty.set(Fault::Fail);
    let first = lease.release().await;
    assert!(matches!(first, Err(LockError::Backend(_))), "{first:?}");
    faulty.heal();
    let second = lease.release().await;
    assert!(
        matches!(second, Err(LockError::Backend(_))),
        "the second call must get the first one's outcome: {second:?}"
    );
    assert_eq!(faulty.counts().release, 1, "one release run per lease");
    assert!(
        store
            .inspect("f")
            .await
            .expect("memory never fails")
            .is_some(),
        "the failed release deleted nothing"
    );
}

/// Dropping a lease whose release has run does not release it again, even when the release
/// found it lost by its clock (the one end a drop would otherwise act on): one release run
/// per lease, whatever the order of `release` and drop.
#[tokio::test(start_paused = true)]
async fn dropping_a_lost_lease_after_its_release_does_not_release_it_again() {
    let (_, faulty, locker) = faulty_locker();
    let lease = locker
        .try_acquire("e", &LockOptions::new().ttl(Duration::from_secs(1)))
        .await
        .expect("free");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let released = lease.release().await;
    assert!(
        matches!(
            released,
            Err(LockError::Lost {
                reason: LostReason::Expired,
                ..
            })
        ),
        "{released:?}"
    );
    assert_eq!(faulty.counts().release, 1);
    drop(lease);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        faulty.counts().release,
        1,
        "dropped after its release, the lease was released again"
    );
}

/// A lease released while its renewal is in flight, the renewal then answered "not held"
/// (the store lost it meanwhile): the release stopped tracking it, so the scheduler task,
/// finding it lost, leaves it to the release's removal. Were both to count its end, the lease
/// count would go below zero and its slot be freed twice: two later leases would share one
/// entry, and one of them would not be renewed.
#[tokio::test(start_paused = true)]
async fn a_lease_released_while_its_renewal_is_answered_not_held_ends_once() {
    let (store, faulty, locker) = faulty_locker();
    let lease = locker.try_acquire("r", &renewing()).await.expect("free");
    // Every request reaches the store 500 ms after it is sent.
    faulty.set(Fault::Delay(Duration::from_millis(500)));
    // The first renewal is sent a third of the ttl in: in flight from then on.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        faulty.counts().renew_round_trips,
        1,
        "the renewal is in flight"
    );
    store.wipe();
    // The renewal reaches the wiped store first ("not held"), then the release's delete.
    let released = lease.release().await;
    assert!(
        matches!(released, Err(LockError::NotHeld { .. })),
        "{released:?}"
    );
    faulty.heal();
    assert_eq!(locker.stats().active_leases(), 0);
    let x = locker.try_acquire("x", &renewing()).await.expect("free");
    let y = locker.try_acquire("y", &renewing()).await.expect("free");
    assert_eq!(locker.stats().active_leases(), 2);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(x.is_valid() && y.is_valid(), "{:?} {:?}", x.end(), y.end());
}

#[tokio::test(start_paused = true)]
async fn cancelling_waits_on_a_lease_never_ends_it() {
    let locker = memory_locker();
    let lease = locker.try_acquire("c", &renewing()).await.expect("free");
    assert!(
        tokio::time::timeout(Duration::from_millis(10), lease.lost())
            .await
            .is_err()
    );
    let refresh = lease.refresh();
    drop(refresh);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(lease.end().is_none());
    assert!(lease.is_valid());
}

#[tokio::test(start_paused = true)]
async fn with_lock_should_cancel_the_workload_when_the_lease_is_lost() {
    let (_, faulty, locker) = faulty_locker();
    let opts = renewing().renew_deadline(Duration::from_secs(2));
    let outcome = locker
        .with_lock("w", &opts, |guard| {
            let faulty = faulty.clone();
            async move {
                assert!(guard.is_valid(), "a fresh guard's lease is valid");
                faulty.set(Fault::Stall);
                guard.cancellation().cancelled().await;
                assert!(!guard.is_valid());
                "stopped"
            }
        })
        .await;
    match outcome {
        Err(WithLockError::Unconfirmed { output, error }) => {
            assert_eq!(output, "stopped");
            assert!(
                matches!(
                    error,
                    LockError::Lost {
                        reason: LostReason::RenewDeadline,
                        ..
                    }
                ),
                "{error:?}"
            );
        }
        other => panic!("expected Unconfirmed, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn with_lock_should_report_a_release_that_finds_the_lease_gone() {
    let store = MemoryBackend::new();
    let locker = Locker::with_identity(store.clone(), "test").expect("valid identity");
    let outcome = locker
        .with_lock("gone", &LockOptions::new(), |_| async move {
            store.wipe(); // the store loses its data while we work
            42
        })
        .await;
    assert!(
        matches!(
            outcome,
            Err(WithLockError::Unconfirmed {
                output: 42,
                error: LockError::NotHeld { .. }
            })
        ),
        "{outcome:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn renewal_answered_not_held_ends_the_lease_at_once() {
    let store = MemoryBackend::new();
    let locker = Locker::with_identity(store.clone(), "test").expect("valid identity");
    let lease = locker.try_acquire("n", &renewing()).await.expect("free");
    store.wipe();
    let end = tokio::time::timeout(Duration::from_secs(2), lease.lost())
        .await
        .expect("ended");
    assert!(
        matches!(end, LeaseEnd::Lost(LostReason::NotHeld)),
        "{end:?}"
    );
    assert!(matches!(
        lease.release().await,
        Err(LockError::Lost {
            reason: LostReason::NotHeld,
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn bad_input_gets_typed_errors() {
    let locker = memory_locker();
    let short = LockOptions::new().ttl(Duration::from_millis(20));
    assert!(matches!(
        locker.with_lock("x", &short, |_| async {}).await,
        Err(WithLockError::NotRun(LockError::TtlTooShort { .. }))
    ));
    // Without auto-renew a short ttl is allowed.
    let lease = locker
        .try_acquire("x", &short)
        .await
        .expect("short ttl without auto-renew");
    assert_eq!(lease.release().await.map_err(|e| e.to_string()), Ok(()));
    assert!(matches!(
        locker.try_acquire("", &LockOptions::new()).await,
        Err(LockError::InvalidName(e)) if e.rule.contains("empty")
    ));
    assert!(matches!(
        Locker::with_identity(MemoryBackend::new(), " "),
        Err(LockError::InvalidConfig { .. })
    ));
    assert!(matches!(
        locker.try_acquire("x", &LockOptions::new().renew_fraction(2.0).auto_renew(true)).await,
        Err(LockError::InvalidConfig { rule }) if rule.contains("renew_fraction")
    ));
    // A store refusing a release by a stranger is a value, not an error.
    let b = MemoryBackend::new();
    assert_eq!(
        b.release("nothing", &tenure::backend::HolderToken::random())
            .await
            .ok(),
        Some(Released::NotHeld)
    );
}

#[test]
fn identities_are_capped_in_bytes() {
    // Every backend stores 253 bytes (the longest Kubernetes object name, so any pod name).
    assert!(Locker::with_identity(MemoryBackend::new(), &"a".repeat(253)).is_ok());
    for long in ["a".repeat(254), "é".repeat(127), "x".repeat(70_000)] {
        let refused = Locker::with_identity(MemoryBackend::new(), &long);
        assert!(
            matches!(&refused, Err(LockError::InvalidConfig { rule }) if rule.contains("253") && rule.len() < 200),
            "{} bytes: {refused:?}",
            long.len()
        );
    }
    assert!(tenure::default_identity().len() <= 253);
}

/// A backend that says it bounds its own calls by `bound` (without doing so: the tests see
/// whose deadline ends a stalled call).
struct Claims {
    inner: FaultyBackend,
    bound: Duration,
}

impl Backend for Claims {
    fn validate_name(&self, name: &str) -> Result<(), tenure::backend::InvalidName> {
        self.inner.validate_name(name)
    }
    fn try_acquire<'a>(
        &'a self,
        req: &'a tenure::backend::AcquireRequest,
    ) -> futures::future::BoxFuture<
        'a,
        Result<tenure::backend::Acquired, tenure::backend::BackendError>,
    > {
        self.inner.try_acquire(req)
    }
    fn renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a tenure::backend::HolderToken,
        ttl: Duration,
    ) -> futures::future::BoxFuture<
        'a,
        Result<tenure::backend::Renewed, tenure::backend::BackendError>,
    > {
        self.inner.renew(name, holder, ttl)
    }
    fn release<'a>(
        &'a self,
        name: &'a str,
        holder: &'a tenure::backend::HolderToken,
    ) -> futures::future::BoxFuture<'a, Result<Released, tenure::backend::BackendError>> {
        self.inner.release(name, holder)
    }
    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> futures::future::BoxFuture<
        'a,
        Result<Option<tenure::backend::LeaseRecord>, tenure::backend::BackendError>,
    > {
        self.inner.inspect(name)
    }
    fn observe(
        &self,
        name: &str,
    ) -> futures::stream::BoxStream<
        'static,
        Result<tenure::backend::HolderChange, tenure::backend::BackendError>,
    > {
        self.inner.observe(name)
    }
    fn request_bound(&self) -> Option<Duration> {
        Some(self.bound)
    }
}

/// The lock runtime sets no deadline of its own on a call the backend bounds at least as
/// tightly (one timer per call instead of two), and keeps its own when the backend's bound is
/// looser; a fault injector never passes its inner backend's bound on.
#[tokio::test(start_paused = true)]
async fn a_call_the_backend_bounds_gets_no_second_deadline() {
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .request_timeout(Duration::from_secs(3));
    for (bound, ends_by_the_lockers_deadline) in [
        (Duration::from_secs(1), false),
        (Duration::from_secs(10), true),
    ] {
        let store = MemoryBackend::new();
        let faulty = FaultyBackend::new(store.clone());
        faulty.set(Fault::Stall);
        let locker = Locker::with_identity(
            Claims {
                inner: faulty.clone(),
                bound,
            },
            "test",
        )
        .expect("identity");
        let started = tokio::time::Instant::now();
        let ended =
            tokio::time::timeout(Duration::from_secs(60), locker.try_acquire("jobs", &opts)).await;
        match ended {
            Ok(Err(LockError::Backend(e))) => {
                assert!(ends_by_the_lockers_deadline, "bound {bound:?}: {e}");
                assert_eq!(started.elapsed(), Duration::from_secs(3));
            }
            Err(_) => assert!(
                !ends_by_the_lockers_deadline,
                "bound {bound:?}: the runtime's own 3 s deadline fired"
            ),
            other => panic!("bound {bound:?}: {other:?}"),
        }
    }
    let wrapped = FaultyBackend::new(Claims {
        inner: FaultyBackend::new(MemoryBackend::new()),
        bound: Duration::from_secs(1),
    });
    assert_eq!(wrapped.request_bound(), None, "it adds waits of its own");
}
