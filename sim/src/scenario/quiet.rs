//! The quiet phase: with every fault healed, liveness, balance, and a graceful join, a graceful
//! leave and a kill, each from a settled group — judged on the store's holders.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tenure::Backend;
use tenure::shard::lease_name;
use tokio::time::{Instant, sleep};

use super::{Figures, Sim};
use crate::world::Kind;

impl Sim {
    pub(super) fn leases(&self) -> Vec<String> {
        if self.p.shards == 0 {
            vec!["job".to_owned()]
        } else {
            (0..self.p.shards)
                .map(|s| lease_name(self.group(), s))
                .collect()
        }
    }

    /// The holder of each lease now, as the store sees it (a term stopping gracefully still
    /// holds its lease; a dead holder's until its lease runs out).
    fn owners(&self) -> BTreeMap<String, Option<String>> {
        use futures::FutureExt;
        self.leases()
            .into_iter()
            .map(|l| {
                // The memory store answers at once; reading it wakes nothing and draws nothing.
                let who = self
                    .store
                    .inspect(&l)
                    .now_or_never()
                    .and_then(Result::ok)
                    .flatten()
                    .map(|record| record.identity);
                (l, who)
            })
            .collect()
    }

    fn balanced(&self) -> bool {
        let owners = self.owners();
        if owners.values().any(Option::is_none) {
            return false;
        }
        let mut loads: BTreeMap<&str, usize> = self
            .replicas
            .values()
            .map(|r| (r.identity.as_str(), 0))
            .collect();
        for who in owners.values().flatten() {
            match loads.get_mut(who.as_str()) {
                Some(n) => *n += 1,
                None => return false,
            }
        }
        let max = loads.values().max().copied().unwrap_or(0);
        let min = loads.values().min().copied().unwrap_or(0);
        max - min <= 1
    }

    fn sample_every(&self) -> Duration {
        if self.p.shards > 256 {
            Duration::from_millis(100)
        } else {
            Duration::from_millis(10)
        }
    }

    /// Waits until balanced (sharded) or led (one lease), at most `limit`; the time it took.
    async fn until_settled(&self, limit: Duration) -> Option<f64> {
        let from = Instant::now();
        while from.elapsed() <= limit {
            let ok = if self.p.shards == 0 {
                self.owners().values().all(Option::is_some)
            } else {
                self.balanced()
            };
            if ok {
                return Some(from.elapsed().as_secs_f64());
            }
            sleep(self.sample_every()).await;
        }
        None
    }

    /// Liveness: with the store reachable and every fault healed, no lease goes without a
    /// leader for longer than lease + retry period (+ jitter and latency slack).
    async fn check_liveness(&self, window: Duration) {
        let allowed = self.t.lease + self.t.retry.mul_f64(1.2) + Duration::from_secs(1);
        let from = Instant::now();
        let mut leaderless: BTreeMap<String, Instant> = BTreeMap::new();
        let mut reported: std::collections::BTreeSet<String> = Default::default();
        let mut invalid: BTreeMap<(String, u64), Instant> = BTreeMap::new();
        while from.elapsed() <= window {
            self.check_stalled(&mut invalid);
            for (lease, who) in self.owners() {
                if who.is_some() {
                    leaderless.remove(&lease);
                    continue;
                }
                let since = *leaderless.entry(lease.clone()).or_insert_with(Instant::now);
                if since.elapsed() > allowed && reported.insert(lease.clone()) {
                    self.world.find(
                        &lease,
                        Kind::Liveness,
                        None,
                        format!(
                            "no leader for {:?} with the store reachable (allowed {allowed:?})",
                            since.elapsed()
                        ),
                    );
                }
            }
            sleep(self.sample_every()).await;
        }
    }

    /// A running term not cancelled (its lease has not ended) is valid: its renew deadline comes before
    /// its validity ends. One that believes itself invalid for longer than a retry period
    /// while its lease goes on has a workload that cannot act (checker `Stalled`).
    fn check_stalled(&self, invalid: &mut BTreeMap<(String, u64), Instant>) {
        let mut seen = std::collections::BTreeSet::new();
        for lease in self.leases() {
            for (token, holder, term) in self.world.running_terms(&lease) {
                if term.cancellation().is_cancelled() || term.is_valid() {
                    continue;
                }
                let key = (lease.clone(), token);
                seen.insert(key.clone());
                let since = *invalid.entry(key).or_insert_with(Instant::now);
                if since.elapsed() > self.t.retry
                    && since.elapsed() <= self.t.retry + self.sample_every()
                {
                    self.world.find(
                        &lease,
                        Kind::Stalled,
                        None,
                        format!(
                            "term #{token} ({holder}) has not ended but believes itself invalid for {:?}",
                            since.elapsed()
                        ),
                    );
                }
            }
        }
        invalid.retain(|k, _| seen.contains(k));
    }

    /// Counts the leases whose owner differs between two snapshots.
    fn moves(
        before: &BTreeMap<String, Option<String>>,
        after: &BTreeMap<String, Option<String>>,
    ) -> usize {
        before
            .iter()
            .filter(|(l, who)| after.get(*l) != Some(*who))
            .count()
    }

    fn move_bound(&self) -> usize {
        let m = self.replicas.len().max(1);
        (self.p.shards as usize).div_ceil(m) + 1
    }

    /// The quiet phase: liveness, balance, then a graceful join, a graceful leave and a kill.
    pub(super) async fn quiet(&mut self) -> Figures {
        let lease = self.t.lease;
        let mut f = Figures::default();
        // Leaseholders frozen or cut just before the heal still hold for up to a lease.
        self.check_liveness(lease * 3).await;
        let settle = lease * 4;
        if self.until_settled(settle).await.is_none() {
            self.world.find(
                "group",
                Kind::Unbalanced,
                None,
                format!(
                    "not settled {settle:?} after every fault healed: owners {:?}",
                    self.loads()
                ),
            );
            return f;
        }
        if self.p.shards == 0 {
            return f;
        }
        let calls = self.world.counters.store_calls.load(Ordering::Relaxed);
        sleep(lease).await;
        self.judge_published("settled");
        f.store_calls_per_sec = (self.world.counters.store_calls.load(Ordering::Relaxed) - calls)
            as f64
            / lease.as_secs_f64();

        // A graceful join.
        let before = self.owners();
        let id = self.next_id;
        self.next_id += 1;
        self.start(id);
        f.balanced_after_join = self.until_settled(settle).await;
        f.moves_join = Self::moves(&before, &self.owners());
        self.judge_moves(
            "join",
            f.balanced_after_join,
            f.moves_join,
            self.move_bound(),
        );

        // Each change starts from a settled group: balanced, and every member's announced
        // holds caught up (one heartbeat), which the bound on moves assumes.
        sleep(lease).await;
        self.judge_published("after a join");

        // A graceful leave.
        let before = self.owners();
        let bound = self.move_bound();
        if let Some(id) = self.pick() {
            self.leave(id);
        }
        f.balanced_after_leave = self.until_settled(settle).await;
        f.moves_leave = Self::moves(&before, &self.owners());
        self.judge_moves("leave", f.balanced_after_leave, f.moves_leave, bound);

        sleep(lease).await;
        self.judge_published("after a leave");

        // A kill: its shards are taken over once its leases run out.
        let before = self.owners();
        if let Some(id) = self.pick() {
            self.kill(id);
        }
        f.balanced_after_kill = self.until_settled(settle).await;
        f.moves_kill = Self::moves(&before, &self.owners());
        if f.balanced_after_kill.is_none() {
            self.world.find(
                "group",
                Kind::Unbalanced,
                None,
                format!("not balanced {settle:?} after a kill: {:?}", self.loads()),
            );
        }
        self.down.clear();
        sleep(lease).await;
        self.judge_published("after a kill");

        // A rolling update to four more shards: a replica of the new count starts, then an old
        // one leaves, one by one. The group record lets the new count start only once no old
        // workload runs (checker `TwoCounts`).
        let old: Vec<usize> = self.replicas.keys().copied().collect();
        let to = (self.p.shards + 4).min(tenure::shard::MAX_SHARDS);
        self.world
            .event(format_args!("resize {} -> {to} shards", self.p.shards));
        self.p.shards = to;
        let from = Instant::now();
        for id in old {
            let new = self.next_id;
            self.next_id += 1;
            self.start(new);
            sleep(lease / 3).await;
            self.leave(id);
            sleep(lease / 3).await;
        }
        self.down.clear();
        f.resized_after = self
            .until_settled(settle * 2)
            .await
            .map(|_| from.elapsed().as_secs_f64());
        if f.resized_after.is_none() {
            self.world.find(
                "group",
                Kind::Unbalanced,
                None,
                format!(
                    "not balanced on {to} shards after a rolling update: {:?}",
                    self.loads()
                ),
            );
        }
        f
    }

    /// Each live member of the group's count publishes the owners whose terms hold the
    /// shards' leases (checker `WrongAssignment`); called with the group settled for a lease.
    fn judge_published(&self, when: &str) {
        let held = self.owners();
        for r in self.replicas.values() {
            let Some((count, assignment)) = &r.assignment else {
                continue;
            };
            if *count != self.p.shards {
                continue;
            }
            let published = assignment.borrow().owners.clone();
            let wrong: Vec<String> = (0..self.p.shards)
                .filter_map(|s| {
                    let says = published.get(s as usize).cloned().flatten();
                    let holds = held.get(&lease_name(self.group(), s)).cloned().flatten();
                    (says != holds).then(|| format!("{s}: {says:?} (held by {holds:?})"))
                })
                .collect();
            if !wrong.is_empty() {
                self.world.find(
                    "group",
                    Kind::WrongAssignment,
                    None,
                    format!(
                        "{when}: {} publishes other owners than hold the shards: {}",
                        r.link.label(),
                        wrong.join(", ")
                    ),
                );
            }
        }
    }

    fn judge_moves(&self, what: &str, settled: Option<f64>, moves: usize, bound: usize) {
        if settled.is_none() {
            self.world.find(
                "group",
                Kind::Unbalanced,
                None,
                format!("not balanced after a graceful {what}: {:?}", self.loads()),
            );
        }
        if moves > bound {
            self.world.find(
                "group",
                Kind::TooManyMoves,
                None,
                format!("a graceful {what} moved {moves} shards (bound {bound})"),
            );
        }
    }

    fn loads(&self) -> BTreeMap<String, usize> {
        let mut loads = BTreeMap::new();
        for who in self.owners().into_values() {
            *loads.entry(who.unwrap_or_else(|| "-".into())).or_insert(0) += 1;
        }
        loads
    }
}
