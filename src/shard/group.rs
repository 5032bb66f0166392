//! Keeping the group's record: which shard count the group runs, agreed through the store's
//! compare-and-swap, never by members' clocks or start order; and the change of that count
//! (a resize) without two counts ever running terms at once.
//!
//! # The protocol
//!
//! The record ([`GroupRecord`]) moves `Active(N, g)` → `Draining(M, g+1, from N)` →
//! `Active(M, g+1)`:
//!
//! 1. The first member creates `Active(its count, 1)` where there is none.
//! 2. A member whose count differs from an active record's waits. It writes `Draining(its
//!    count, g+1, from N)` only once no live member announces `N`: the old count's
//!    replicas have left (a rolling update has replaced them), so a replica that restarts
//!    with an old count never reverts a group that runs a newer one.
//! 3. Under `Draining`, every lease `0..N` must be seen free, each seen *after* the draining
//!    record was written; then the record becomes `Active(M, g+1)` (any member of count `M`
//!    may do it, and another may finish what one started). A lease is seen free by taking it:
//!    the keeper is granted a term of it and releases it at once ([`Keeper::fence_off`]), so
//!    its fencing token — on Kubernetes, the floor a fencing policy refuses below — is above
//!    every term of the old count before the new count starts.
//! 4. A shard term's workload starts only after a fresh read of the record, made after its
//!    lease was granted, finds it active with the member's count ([`admits`]).
//!
//! Why no two counts run at once: a term of count `N` started after a read that found
//! `Active(N, g)`, so its lease was granted before `Draining` was written; step 3 sees that
//! lease free only after the term ended (released, or run out — the lease's own guarantee).
//! A lease of the old count taken after the draining record was written fails step 4. So
//! every term of `M` begins after every term of `N` ended.
//!
//! Why fence the old leases off, when their terms have ended: a term that ended may not know
//! it yet (a frozen replica, a partition), and a fenced store judges a write by the token of
//! the lease it names. A lease of the old count that the new count never takes again (a
//! shard beyond `M`), or takes only later (its new owner slow to start), would keep the old
//! term's token as the current one, so that term's late writes would still pass — after the
//! new count's first write elsewhere. Taken once by the keeper, every old lease has a newer
//! token before `Active(M)` is written, so no old term's write passes once a term of `M` can
//! have begun (a fenced Kubernetes write is judged by the shard Lease it names:
//! `tenure::fence::kube::FencingPolicy::shards`).

use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::backend::{
    AcquireRequest, Acquired, Backend, BackendError, GroupRead, GroupRecord, HolderToken, Member,
    ShardLeaseWatch,
};

/// How many old leases a drain takes (and releases) at once.
const FENCE_OFF_IN_FLIGHT: u32 = 16;

/// Where this replica stands in its group, as its last read of the group record says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupStatus {
    /// The record has not been read yet.
    #[default]
    Joining,
    /// The group runs this replica's shard count: its shards' terms may run.
    Running {
        /// The record's generation.
        generation: u64,
    },
    /// The group runs another count, or is changing to this one and waits for the old
    /// count's leases to be free. No shard term runs here meanwhile.
    Waiting {
        /// The record as read.
        record: GroupRecord,
    },
    /// The store holds something tenure cannot parse where the record belongs. Nothing is
    /// decided from it: the shards running here stop and none starts until it is repaired or
    /// deleted (a record nobody can read must not let two counts run).
    Damaged {
        /// What is wrong with it.
        reason: String,
    },
}

/// How far this replica's drain of the old count's leases has got, across reads of the record.
#[derive(Debug, Default)]
pub(super) struct Drain {
    /// The generation of the draining record it works on.
    generation: u64,
    /// Leases `0..next` of the old count were taken and released under that record: the drain
    /// resumes past them (a lease found free after the draining record was written can only
    /// be taken by a term that step 4 refuses).
    next: u32,
    /// The old leases followed together while the drain waits on one of them. Kept from one
    /// read of the record to the next: on Kubernetes a lease whose holder stopped renewing (a
    /// frozen or killed pod) is free once this process has seen it unchanged for a lease
    /// duration, and following it afresh at each read would start that wait again every
    /// time, so the drain would never take it.
    following: Option<ShardLeaseWatch>,
}

impl Drain {
    /// (generation, next): where the drain stands.
    #[cfg(test)]
    fn at(&self) -> (u64, u32) {
        (self.generation, self.next)
    }

    /// A drain of `generation` that got through leases `0..next`.
    #[cfg(test)]
    fn from(generation: u64, next: u32) -> Self {
        Self {
            generation,
            next,
            following: None,
        }
    }
}

/// What the keeper needs to know about its replica and group.
pub(super) struct Keeper<'a> {
    pub backend: &'a dyn Backend,
    pub group: &'a str,
    /// This replica's identity, the holder of the keeper's brief terms of old leases.
    pub identity: &'a str,
    pub shards: u32,
    pub lease: Duration,
    pub retry: Duration,
    pub request_timeout: Duration,
}

impl Keeper<'_> {
    /// Keeps `status` current until a permanent store failure, which it returns. `members`
    /// is the latest live membership the replica has seen (`None` before the first read);
    /// a change of it is a reason to read the record again (a resize waits for the old
    /// count's members to leave).
    pub async fn keep(
        &self,
        status: &watch::Sender<GroupStatus>,
        mut members: watch::Receiver<Option<Vec<Member>>>,
        recheck: &Notify,
    ) -> BackendError {
        let mut drained = Drain::default();
        loop {
            let live = members.borrow_and_update().clone();
            let pause = match self.step(status, live.as_deref(), &mut drained).await {
                Ok(pause) => pause,
                Err(e) if !e.is_transient() => return e,
                Err(e) => {
                    tracing::warn!(group = self.group, error = %e, "reading the group record failed; retrying");
                    self.retry
                }
            };
            if pause.is_zero() {
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                changed = members.changed() => if changed.is_err() {
                    tokio::time::sleep(pause).await;
                },
                () = recheck.notified() => {}
            }
        }
    }

    /// One read of the record and what it calls for; answers how long to wait before the
    /// next read (zero: at once, the record was just changed).
    async fn step(
        &self,
        status: &watch::Sender<GroupStatus>,
        members: Option<&[Member]>,
        drained: &mut Drain,
    ) -> Result<Duration, BackendError> {
        let (record, version) = match self.timed(self.backend.group_record(self.group)).await? {
            GroupRead::Absent => {
                let first = GroupRecord::first(self.shards);
                self.timed(self.backend.swap_group_record(self.group, None, &first))
                    .await?;
                return Ok(Duration::ZERO);
            }
            GroupRead::Damaged { reason } => {
                if !matches!(&*status.borrow(), GroupStatus::Damaged { reason: r } if *r == reason)
                {
                    tracing::error!(
                        group = self.group,
                        reason = %reason,
                        "the group record cannot be parsed: this replica runs no shard until it is repaired or deleted"
                    );
                }
                status.send_replace(GroupStatus::Damaged { reason });
                return Ok(self.retry.max(self.lease / 4));
            }
            GroupRead::Present { record, version } => (record, version),
        };
        if record.shards != self.shards || record.is_active() {
            // No drain of this replica's to wait on (another member may have finished it).
            drained.following = None;
        }
        if record.shards == self.shards && record.is_active() {
            status.send_if_modified(|s| {
                let now = GroupStatus::Running {
                    generation: record.generation,
                };
                let changed = *s != now;
                *s = now;
                changed
            });
            // A replica that missed a resize (frozen, partitioned) learns of it here.
            return Ok(self.lease);
        }
        self.wait_on(status, record);
        if record.shards == self.shards {
            let from = record.draining_from.unwrap_or(record.shards);
            // One generation has one draining record: a swap from a given version wins once.
            if drained.generation != record.generation {
                *drained = Drain {
                    generation: record.generation,
                    ..Drain::default()
                };
            }
            if drained.next < from {
                // On Kubernetes a shard Lease is taken only by a process that follows its
                // group's leases: the old count's, here, for the drain.
                if drained.following.is_none() {
                    let old: Vec<String> = (drained.next..from)
                        .map(|shard| super::lease_name(self.group, shard))
                        .collect();
                    drained.following = Some(self.backend.follow_shard_leases(self.group, &old));
                }
                while drained.next < from {
                    let end = from.min(drained.next.saturating_add(FENCE_OFF_IN_FLIGHT));
                    let taken = futures::future::join_all(
                        (drained.next..end).map(|shard| self.fence_off(shard)),
                    )
                    .await;
                    for result in taken {
                        if !result? {
                            // Still held: look again after a retry, still following it.
                            return Ok(self.retry);
                        }
                        drained.next += 1;
                    }
                }
            }
            drained.following = None;
            let active = GroupRecord {
                draining_from: None,
                ..record
            };
            if self
                .timed(
                    self.backend
                        .swap_group_record(self.group, Some(&version), &active),
                )
                .await?
            {
                tracing::info!(
                    group = self.group,
                    from,
                    to = self.shards,
                    generation = record.generation,
                    "the group now runs this replica's shard count"
                );
            }
            return Ok(Duration::ZERO);
        }
        // Another count. Take the group over only once nobody runs it any more, as far as a
        // membership read (not the empty view before the first) shows.
        let Some(members) = members else {
            return Ok(self.retry);
        };
        if members.iter().any(|m| m.shards == record.shards) {
            return Ok(self.lease);
        }
        // The view may be old: a replica frozen through a resize (a paused pod) wakes up with
        // the membership it saw before, which lacks the members that joined since, and would
        // revert the group to its old count under the live new one. The takeover is decided
        // on a fresh read.
        if self
            .live_members()
            .await?
            .iter()
            .any(|m| m.shards == record.shards)
        {
            return Ok(self.retry);
        }
        let draining = GroupRecord {
            shards: self.shards,
            generation: record.generation.saturating_add(1),
            draining_from: Some(record.draining_from.unwrap_or(record.shards)),
        };
        if self
            .timed(
                self.backend
                    .swap_group_record(self.group, Some(&version), &draining),
            )
            .await?
        {
            tracing::info!(
                group = self.group,
                from = record.shards,
                to = self.shards,
                generation = draining.generation,
                "no live member runs the group's shard count: changing it to this replica's"
            );
        }
        Ok(Duration::ZERO)
    }

    /// Takes the old count's lease of `shard` for a moment if it is free — a grant, whose
    /// fencing token is above every earlier term's, then its release — and answers whether it
    /// was (see the module docs: the drain's fence). A release that fails leaves the brief term
    /// to run out, which only delays the new count's term of that lease.
    async fn fence_off(&self, shard: u32) -> Result<bool, BackendError> {
        let request = AcquireRequest {
            name: super::lease_name(self.group, shard).into(),
            holder: HolderToken::random(),
            identity: self.identity.into(),
            ttl: self.lease,
        };
        match self.timed(self.backend.try_acquire(&request)).await? {
            Acquired::Busy { .. } => Ok(false),
            Acquired::Granted { fencing } => {
                tracing::debug!(group = self.group, lease = %request.name, %fencing, "fenced off a lease of the old shard count");
                let released = self
                    .timed(self.backend.release(&request.name, &request.holder))
                    .await;
                if let Err(e) = released {
                    tracing::warn!(group = self.group, lease = %request.name, error = %e, "cannot release the drain's term of an old lease; it runs out after one lease");
                }
                Ok(true)
            }
        }
    }

    /// Publishes that this replica waits on `record`, saying why once per record.
    fn wait_on(&self, status: &watch::Sender<GroupStatus>, record: GroupRecord) {
        let now = GroupStatus::Waiting { record };
        if *status.borrow() != now {
            if record.shards == self.shards {
                tracing::info!(
                    group = self.group,
                    shards = self.shards,
                    record = %record,
                    "the group is changing to this replica's shard count: no shard runs until every lease of the old count is free"
                );
            } else {
                tracing::warn!(
                    group = self.group,
                    shards = self.shards,
                    record = %record,
                    "the group runs another shard count: this replica takes no shard until every member running it has left and its leases are free"
                );
            }
            status.send_replace(now);
        }
    }

    /// The group's live members now: the first set a new read of the membership gives (an
    /// error item of the stream is a hiccup; the next is waited for, within the request
    /// timeout).
    async fn live_members(&self) -> Result<Vec<Member>, BackendError> {
        use futures::StreamExt as _;
        let mut members = self.backend.members(self.group);
        let first = async {
            let mut hiccup = None;
            while let Some(read) = members.next().await {
                match read {
                    Ok(set) => return Ok(set),
                    Err(e) => hiccup = Some(e),
                }
            }
            Err(hiccup.unwrap_or_else(|| {
                BackendError::new(
                    crate::backend::BackendErrorKind::Unavailable,
                    "the group's membership read ended without an answer",
                )
            }))
        };
        tokio::time::timeout(self.request_timeout, first)
            .await
            .unwrap_or_else(|_| {
                Err(BackendError::new(
                    crate::backend::BackendErrorKind::Timeout,
                    "the group's membership read timed out",
                ))
            })
    }

    async fn timed<T>(
        &self,
        call: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        tokio::time::timeout(self.request_timeout, call)
            .await
            .unwrap_or_else(|_| {
                Err(BackendError::new(
                    crate::backend::BackendErrorKind::Timeout,
                    "the group record request timed out",
                ))
            })
    }
}

/// Why a term may not start its workload ([`admits`]).
#[derive(Debug)]
pub(super) enum Doubt {
    /// The record read does not run this count and generation (or is missing or damaged).
    Refused,
    /// The record could not be read (an error, or no answer within the bound): nothing is
    /// known, which also answers no.
    Unread(BackendError),
}

/// Whether a term of `shards` may start its workload now: a fresh read, made after the
/// term's lease was granted, finds the record active with this count and `generation`
/// (step 4 of the protocol). Any doubt answers no, and says which (a log that blamed the
/// record for a read that timed out sent readers after the wrong cause).
pub(super) async fn admits(
    backend: &dyn Backend,
    group: &str,
    shards: u32,
    generation: u64,
    timeout: Duration,
) -> Result<(), Doubt> {
    match tokio::time::timeout(timeout, backend.group_record(group)).await {
        Ok(Ok(GroupRead::Present { record, .. }))
            if record.is_active() && record.shards == shards && record.generation == generation =>
        {
            Ok(())
        }
        Ok(Ok(_)) => Err(Doubt::Refused),
        Ok(Err(e)) => Err(Doubt::Unread(e)),
        Err(_) => Err(Doubt::Unread(BackendError::timeout(
            "group record read",
            timeout,
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryBackend;

    const T: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn a_term_starts_only_under_an_active_record_of_its_count_and_generation() {
        let store = MemoryBackend::new();
        assert!(refused(admits(&store, "g", 4, 1, T).await), "no record");
        let first = GroupRecord::first(4);
        assert!(
            store
                .swap_group_record("g", None, &first)
                .await
                .expect("swap")
        );
        assert!(admits(&store, "g", 4, 1, T).await.is_ok());
        assert!(refused(admits(&store, "g", 5, 1, T).await), "another count");
        assert!(
            refused(admits(&store, "g", 4, 2, T).await),
            "another generation"
        );
        let GroupRead::Present { version, .. } = store.group_record("g").await.expect("read")
        else {
            panic!("written");
        };
        let draining = GroupRecord {
            shards: 4,
            generation: 2,
            draining_from: Some(8),
        };
        assert!(
            store
                .swap_group_record("g", Some(&version), &draining)
                .await
                .expect("swap")
        );
        assert!(refused(admits(&store, "g", 4, 2, T).await), "draining");
    }

    fn refused(answer: Result<(), Doubt>) -> bool {
        matches!(answer, Err(Doubt::Refused))
    }

    /// A read that does not answer within the bound is no "refused": the log says the record
    /// could not be read, not that it no longer runs the generation (#42).
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_read_is_told_apart_from_a_refusal() {
        let store = crate::backend::faulty::FaultyBackend::new(MemoryBackend::new());
        assert!(
            store
                .swap_group_record("g", None, &GroupRecord::first(4))
                .await
                .expect("swap")
        );
        store.set(crate::backend::faulty::Fault::Stall);
        let answer = admits(&store, "g", 4, 1, T).await;
        assert!(
            matches!(&answer, Err(Doubt::Unread(e)) if e.kind() == crate::backend::BackendErrorKind::Timeout),
            "{answer:?}"
        );
        store.heal();
        assert!(admits(&store, "g", 4, 1, T).await.is_ok());
    }

    fn keeper(store: &dyn Backend, shards: u32) -> Keeper<'_> {
        Keeper {
            backend: store,
            group: "g",
            identity: "keeper",
            shards,
            lease: Duration::from_secs(15),
            retry: Duration::from_secs(2),
            request_timeout: T,
        }
    }

    async fn write(store: &MemoryBackend, record: GroupRecord) {
        let expected = match store.group_record("g").await.expect("read") {
            GroupRead::Present { version, .. } => Some(version),
            _ => None,
        };
        assert!(
            store
                .swap_group_record("g", expected.as_ref(), &record)
                .await
                .expect("swap")
        );
    }

    async fn record(store: &MemoryBackend) -> GroupRecord {
        match store.group_record("g").await.expect("read") {
            GroupRead::Present { record, .. } => record,
            other => panic!("{other:?}"),
        }
    }

    /// A replica whose view of the membership is old (frozen through a resize: it saw no
    /// member of the new count) does not take the group back to its count while a live member
    /// runs the record's: the takeover is decided on a fresh read.
    #[tokio::test(start_paused = true)]
    async fn a_stale_membership_view_does_not_revert_a_resize() {
        let store = MemoryBackend::with_own_tokens();
        let active = GroupRecord {
            shards: 4,
            generation: 2,
            draining_from: None,
        };
        write(&store, GroupRecord::first(6)).await;
        write(&store, active).await;
        let newer = Member {
            identity: "b1".into(),
            shards: 4,
            joined_ms: 0,
            holds: vec![0, 1, 2, 3],
        };
        store
            .announce_member("g", &newer, Duration::from_secs(60))
            .await
            .expect("announce");
        let (status, _) = watch::channel(GroupStatus::Joining);
        let k = keeper(&store, 6);
        // The view from before the freeze: only this replica, of the old count.
        let old_view = [Member {
            identity: "keeper".into(),
            shards: 6,
            joined_ms: 0,
            holds: vec![],
        }];
        let pause = k
            .step(&status, Some(&old_view), &mut Drain::default())
            .await
            .expect("step");
        assert_eq!(pause, k.retry);
        assert_eq!(record(&store).await, active, "the resize was reverted");
        // Once the new count's members are gone, the old count may take the group back.
        store.withdraw_member("g", "b1").await.expect("withdraw");
        k.step(&status, Some(&old_view), &mut Drain::default())
            .await
            .expect("step");
        assert_eq!(record(&store).await.draining_from, Some(4));
    }

    /// A drain of a new generation starts again from lease 0, whatever an earlier drain by
    /// this keeper got through: the old count's leases are other leases.
    #[tokio::test(start_paused = true)]
    async fn a_drain_of_a_new_generation_checks_every_old_lease_again() {
        use crate::backend::{AcquireRequest, HolderToken};
        let store = MemoryBackend::new();
        write(&store, GroupRecord::first(8)).await;
        let draining = GroupRecord {
            shards: 6,
            generation: 4,
            draining_from: Some(8),
        };
        write(&store, draining).await;
        let held = AcquireRequest {
            name: "g-1".into(),
            holder: HolderToken::random(),
            identity: "old".into(),
            ttl: Duration::from_secs(60),
        };
        store.try_acquire(&held).await.expect("acquire");
        let (status, _) = watch::channel(GroupStatus::Joining);
        // An earlier drain (generation 2, from 4) got through leases 0..4.
        let mut drained = Drain::from(2, 4);
        let k = keeper(&store, 6);
        let pause = k
            .step(&status, Some(&[]), &mut drained)
            .await
            .expect("step");
        assert_eq!(pause, k.retry, "lease 1 is held: wait and look again");
        assert_eq!(
            record(&store).await,
            draining,
            "not active while g-1 is held"
        );
        assert_eq!(drained.at(), (4, 1));
        assert!(
            drained.following.is_some(),
            "the drain goes on following the old leases while one is held"
        );
    }

    /// A drain takes every old lease once and gives it back before the record becomes
    /// active: each gets a term newer than every old one (on Kubernetes, a floor that a
    /// fencing policy refuses every old copy's token below), and is left free for the new
    /// count. A lease the new count never uses again (here g-4 and g-5, shrinking from 6 to
    /// 4) is fenced too.
    #[tokio::test(start_paused = true)]
    async fn a_drain_takes_every_old_lease_once_and_leaves_it_free() {
        use crate::backend::faulty::FaultyBackend;
        use crate::backend::{AcquireRequest, HolderToken};
        let memory = MemoryBackend::with_own_tokens();
        let store = FaultyBackend::new(memory.clone());
        write(&memory, GroupRecord::first(6)).await;
        // The old count's last term of g-5, ended (released).
        let old = AcquireRequest {
            name: "g-5".into(),
            holder: HolderToken::random(),
            identity: "old".into(),
            ttl: Duration::from_secs(60),
        };
        let Acquired::Granted { fencing: old_token } =
            memory.try_acquire(&old).await.expect("acquire")
        else {
            panic!("free");
        };
        memory.release("g-5", &old.holder).await.expect("release");
        write(
            &memory,
            GroupRecord {
                shards: 4,
                generation: 2,
                draining_from: Some(6),
            },
        )
        .await;
        let (status, _) = watch::channel(GroupStatus::Joining);
        let k = keeper(&store, 4);
        let mut drained = Drain::default();
        let pause = k
            .step(&status, Some(&[]), &mut drained)
            .await
            .expect("step");
        assert_eq!(pause, Duration::ZERO, "the record was changed");
        assert_eq!(drained.at(), (2, 6));
        assert!(drained.following.is_none(), "done: nothing followed");
        assert_eq!(
            record(&memory).await,
            GroupRecord {
                shards: 4,
                generation: 2,
                draining_from: None,
            }
        );
        let counts = store.counts();
        assert_eq!(
            (counts.acquire, counts.release),
            (6, 6),
            "each old lease taken and given back once"
        );
        for shard in 0..6 {
            let lease = format!("g-{shard}");
            assert!(
                memory.inspect(&lease).await.expect("inspect").is_none(),
                "{lease} left free"
            );
        }
        // The next term of g-5 comes seven grants after the old one: the drain's six between.
        let next = AcquireRequest {
            holder: HolderToken::random(),
            identity: "new".into(),
            ..old
        };
        let Acquired::Granted { fencing } = memory.try_acquire(&next).await.expect("acquire")
        else {
            panic!("free");
        };
        assert_eq!(
            fencing.get(),
            old_token.get() + 7,
            "{fencing} after {old_token}"
        );
    }

    /// Once the record runs this replica's count, the run loop is told at once (it stops
    /// waiting and assigns shards); reading the same record again tells it nothing.
    #[tokio::test(start_paused = true)]
    async fn running_is_announced_once_per_change() {
        let store = MemoryBackend::new();
        write(&store, GroupRecord::first(4)).await;
        let (status, mut seen) = watch::channel(GroupStatus::Joining);
        let k = keeper(&store, 4);
        k.step(&status, Some(&[]), &mut Drain::default())
            .await
            .expect("step");
        assert!(seen.has_changed().expect("open"));
        assert_eq!(
            *seen.borrow_and_update(),
            GroupStatus::Running { generation: 1 }
        );
        k.step(&status, Some(&[]), &mut Drain::default())
            .await
            .expect("step");
        assert!(!seen.has_changed().expect("open"));
    }

    /// A store that keeps no group record: the keeper gives up at once with the store's
    /// error instead of retrying forever.
    #[tokio::test(start_paused = true)]
    async fn a_permanent_store_error_ends_the_keeper() {
        struct NoRecords(MemoryBackend);
        impl Backend for NoRecords {
            fn validate_name(&self, name: &str) -> Result<(), crate::backend::InvalidName> {
                self.0.validate_name(name)
            }
            fn try_acquire<'a>(
                &'a self,
                req: &'a crate::backend::AcquireRequest,
            ) -> futures::future::BoxFuture<'a, Result<crate::backend::Acquired, BackendError>>
            {
                self.0.try_acquire(req)
            }
            fn renew<'a>(
                &'a self,
                name: &'a str,
                holder: &'a crate::backend::HolderToken,
                ttl: Duration,
            ) -> futures::future::BoxFuture<'a, Result<crate::backend::Renewed, BackendError>>
            {
                self.0.renew(name, holder, ttl)
            }
            fn release<'a>(
                &'a self,
                name: &'a str,
                holder: &'a crate::backend::HolderToken,
            ) -> futures::future::BoxFuture<'a, Result<crate::backend::Released, BackendError>>
            {
                self.0.release(name, holder)
            }
            fn inspect<'a>(
                &'a self,
                name: &'a str,
            ) -> futures::future::BoxFuture<
                'a,
                Result<Option<crate::backend::LeaseRecord>, BackendError>,
            > {
                self.0.inspect(name)
            }
            fn observe(
                &self,
                name: &str,
            ) -> futures::stream::BoxStream<
                'static,
                Result<crate::backend::HolderChange, BackendError>,
            > {
                self.0.observe(name)
            }
        }
        let store = NoRecords(MemoryBackend::new());
        let (status, _) = watch::channel(GroupStatus::Joining);
        let (_members, latest) = watch::channel(None);
        let recheck = Notify::new();
        let e = tokio::time::timeout(
            Duration::from_secs(600),
            keeper(&store, 4).keep(&status, latest, &recheck),
        )
        .await
        .expect("a permanent error ends the keeper");
        assert_eq!(e.kind(), crate::backend::BackendErrorKind::Config);
    }
}
