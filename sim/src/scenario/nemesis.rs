//! Targeted faults ("nemeses"): each aims at a boundary a guarantee rests on, and is aimed
//! from the state of the run — who holds which lease, when that holder's renew deadline
//! falls, when the store's record expires, which replica has recovered from a step-down for
//! its health — not from the seed alone. They run in the chaos phase beside the random
//! faults; each is named in the history (`nemesis NAME …`), counted in the summary, and
//! named beside the replay line of a violation it preceded.
//!
//! Seeded random faults almost never line up with a boundary: a renewal answered at the
//! last instant it counts, then silence until the store's expiry while another replica
//! campaigns at that instant, is one order of faults among millions. Defects that only break
//! at a boundary need the nemeses to be seen (docs/evidence.md).

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt;
use tenure::{Backend, Term};
use tokio::time::Instant;

use super::Sim;
use super::chaos::{Heal, HealWhat};
use crate::link::{Cut, HoldRenewal, Link, SLOWEST_COVERED_RATE};
use crate::world::{Stall, World};

/// Every nemesis, in the order the summary lists them.
pub const NAMES: [&str; 14] = [
    "slow-renewal",
    "drift-edge",
    "drift-past",
    "store-stall",
    "watch-lag",
    "stubborn-stop",
    "join-late",
    "leave-late",
    "resize-late",
    "health-flip",
    "health-turns",
    "all-unhealthy",
    "runtime-stall",
    "health-relapse",
];

/// The clock rate of `drift-past`: just slower than the drift allowance covers.
const JUST_PAST_RATE: f64 = 0.985;

/// A lease held now, as the store sees it.
struct Held {
    lease: String,
    id: usize,
    /// The store's expiry of the holder's record.
    expiry: Instant,
}

impl Sim {
    /// The leases held now by a live replica, as the store sees them.
    fn held(&self) -> Vec<Held> {
        let now = Instant::now();
        self.leases()
            .into_iter()
            .filter_map(|lease| {
                // The memory store answers at once; reading it wakes nothing and draws nothing.
                let record = self
                    .store
                    .inspect(&lease)
                    .now_or_never()
                    .and_then(Result::ok)
                    .flatten()?;
                let (id, _) = self
                    .replicas
                    .iter()
                    .find(|(_, r)| r.identity == record.identity)?;
                Some(Held {
                    lease,
                    id: *id,
                    expiry: now + record.remaining?,
                })
            })
            .collect()
    }

    /// Waits until `at`, healing on the way whatever falls due; a `health-relapse` falling
    /// due meanwhile waits until then (one aim at a time).
    pub(super) async fn wait_until(&mut self, at: Instant, heals: &mut Vec<(Instant, Heal)>) {
        heals.sort_by_key(|(at, _)| *at);
        let mut postponed = Vec::new();
        while heals.first().is_some_and(|(due, _)| *due <= at) {
            let (due, heal) = heals.remove(0);
            tokio::time::sleep_until(due).await;
            match heal {
                Heal::Relapse(_) => postponed.push((at, heal)),
                heal => self.heal(heal),
            }
        }
        heals.append(&mut postponed);
        tokio::time::sleep_until(at).await;
    }

    /// Runs one nemesis, drawn among those that fit the run now. False if none fits (no
    /// lease is held by a live replica).
    pub(super) async fn nemesis(&mut self, heals: &mut Vec<(Instant, Heal)>) -> bool {
        let held = self.held();
        if held.is_empty() {
            return false;
        }
        let sharded = self.p.shards > 0;
        // Weights: the boundary of validity most, the membership moments only in groups,
        // health only for one lease (whose electors follow it; zero weights in groups keep
        // their histories as they were).
        let weights: [u64; 14] = [
            3,
            3,
            1,
            2,
            2,
            2,
            u64::from(sharded),
            u64::from(sharded),
            u64::from(sharded),
            2 * u64::from(!sharded),
            2 * u64::from(!sharded),
            u64::from(!sharded),
            2,
            5 * u64::from(!sharded),
        ];
        let total: u64 = weights.iter().sum();
        let mut draw = self.world.rng(|r| r.below(total));
        let mut which = 0;
        while draw >= weights[which] {
            draw -= weights[which];
            which += 1;
        }
        let target = &held[self.world.rng(|r| r.below(held.len() as u64)) as usize];
        let (lease, id, expiry) = (target.lease.clone(), target.id, target.expiry);
        let name = NAMES[which];
        match name {
            "slow-renewal" | "drift-edge" | "drift-past" => self.hold_renewal(name, &lease, id),
            "store-stall" => self.stall_across_expiry(&lease, id, expiry, heals).await,
            "watch-lag" => self.lag_watches_around_hand_off(&lease, id, heals),
            "stubborn-stop" => self.stubborn_stop(&lease, id, expiry, heals),
            "health-flip" => self.health_flip(&lease, id, heals),
            "health-turns" => self.health_turns(&lease, id, heals),
            "all-unhealthy" => self.all_unhealthy(&lease, heals),
            "runtime-stall" => self.arm_runtime_stall(&lease, id),
            "health-relapse" => {
                let recovered = self.recovered(&held);
                if recovered.is_empty() {
                    self.arm_relapse(&lease, id, heals);
                } else if let Some(until) =
                    self.health_relapse(&lease, id, expiry, &recovered, heals)
                {
                    self.wait_until(until, heals).await;
                }
            }
            _ => self.at_last_renew_period(name, &lease, id, heals).await,
        }
        true
    }

    /// `slow-renewal`: the holder's next renewal of `lease` is answered at the last instant
    /// it counts, then the holder is cut off until well past the store's expiry while the
    /// others' campaigns are aimed at the expiry instant. `drift-edge` does the same with the
    /// holder's clock exactly at the edge of the drift allowance (rate 0.99); `drift-past`
    /// just past it (0.985: overlaps are expected, and reported as such).
    fn hold_renewal(&mut self, name: &'static str, lease: &str, id: usize) {
        let link = self.replicas[&id].link.clone();
        if link.holding() {
            return;
        }
        let l = self.t.lease;
        let cut_for = l.mul_f64(self.world.rng(|r| r.between(1.2, 2.0)));
        match name {
            "drift-edge" => link.change(|s| s.rate = SLOWEST_COVERED_RATE),
            "drift-past" => link.change(|s| s.rate = JUST_PAST_RATE),
            _ => {}
        }
        self.world.event(format_args!(
            "nemesis {name} armed on {} {lease} (clock rate {:.4})",
            link.label(),
            link.state().rate
        ));
        link.hold_next_renewal(HoldRenewal {
            nemesis: name,
            lease: lease.to_owned(),
            cut_for,
            armed_until: Instant::now() + l,
        });
    }

    /// `runtime-stall`, armed: the workload of the holder's term of `lease` stalls its
    /// runtime at its next wake-up (`stall_runtime`).
    fn arm_runtime_stall(&mut self, lease: &str, id: usize) {
        let label = self.replicas[&id].link.label().to_owned();
        let Some((token, ..)) = self
            .world
            .running_terms(lease)
            .into_iter()
            .find(|(_, holder, _)| *holder == label)
        else {
            return;
        };
        let (past_validity, at) = self.world.rng(|r| (r.chance(0.5), r.between(0.0, 1.0)));
        self.world.event(format_args!(
            "nemesis runtime-stall armed on {label} {lease} #{token} ({} {at:.3})",
            if past_validity {
                "in the drift allowance"
            } else {
                "within validity"
            }
        ));
        let leases = self.leases();
        self.world.arm_stall(
            lease,
            token,
            Stall {
                past_validity,
                at,
                leases,
            },
        );
    }

    /// `store-stall`: the holder of `lease` goes silent (its requests held), the store
    /// stalls shortly before the lease's expiry and resumes after it with the campaigns
    /// (aimed at the expiry) and the holder's last renewal queued at its door.
    async fn stall_across_expiry(
        &mut self,
        lease: &str,
        id: usize,
        expiry: Instant,
        heals: &mut Vec<(Instant, Heal)>,
    ) {
        let link = self.replicas[&id].link.clone();
        let patience = self.t.request_timeout;
        let (before, after) = self
            .world
            .rng(|r| (r.between(0.1, 0.9), r.between(0.3, 0.9)));
        let (from, to) = (
            expiry - patience.mul_f64(before),
            expiry + patience.mul_f64(after),
        );
        self.world.nemesis(
            "store-stall",
            lease,
            format_args!(
                "{} {lease}: holder silent, store stalled {} to {} ms across the expiry at {} ms",
                link.label(),
                self.world.ms(from),
                self.world.ms(to),
                self.world.ms(expiry)
            ),
        );
        link.change(|s| s.cut = Cut::Requests);
        heals.push((from, Heal::Link(link, HealWhat::Cut)));
        self.world.aim_at(lease, expiry);
        self.wait_until(from, heals).await;
        self.world.stall_store(true);
        self.wait_until(to, heals).await;
        self.world.event("heal store resumes (nemesis)");
        self.world.stall_store(false);
    }

    /// `watch-lag`: every other replica's watches lag (items held, some lost) while the
    /// holder of `lease` hands it off with a graceful stop.
    fn lag_watches_around_hand_off(
        &mut self,
        lease: &str,
        id: usize,
        heals: &mut Vec<(Instant, Heal)>,
    ) {
        let l = self.t.lease;
        let (lag, hiccups, span) = self.world.rng(|r| {
            (
                l.mul_f64(r.between(0.3, 1.5)),
                r.between(0.1, 0.6),
                l.mul_f64(r.between(1.0, 2.5)),
            )
        });
        let holder = self.replicas[&id].link.label().to_owned();
        self.world.nemesis(
            "watch-lag",
            lease,
            format_args!(
                "{holder} hands {lease} off; the others' watches lag {lag:?}, hiccups {hiccups:.2}, for {span:?}"
            ),
        );
        for (other, r) in &self.replicas {
            if *other == id {
                continue;
            }
            r.link.change(|s| {
                s.lag = lag;
                s.hiccups = hiccups;
            });
            heals.push((
                Instant::now() + span,
                Heal::Link(r.link.clone(), HealWhat::Watch),
            ));
        }
        self.leave(id);
        heals.push((Instant::now() + span, Heal::Restart(id, true)));
    }

    /// `stubborn-stop`: the holder of `lease` stops gracefully while its workloads ignore
    /// cancellation, and is cut off at once (its renewals and its release never land): the
    /// elector's drop deadline alone must end the workload before the store's expiry, at
    /// which the others' campaigns are aimed.
    fn stubborn_stop(
        &mut self,
        lease: &str,
        id: usize,
        expiry: Instant,
        heals: &mut Vec<(Instant, Heal)>,
    ) {
        let link = self.replicas[&id].link.clone();
        let l = self.t.lease;
        self.world.nemesis(
            "stubborn-stop",
            lease,
            format_args!(
                "{} stops gracefully holding {lease}, its workloads ignoring cancellation, cut off; campaigns aimed at the expiry {} ms",
                link.label(),
                self.world.ms(expiry)
            ),
        );
        self.world.force_stubborn(link.label());
        self.world.aim_at(lease, expiry);
        self.leave(id);
        link.change(|s| s.cut = Cut::Both);
        let back = Instant::now() + self.t.grace.max(l) + l;
        heals.push((back, Heal::Link(link, HealWhat::Cut)));
        heals.push((back, Heal::Restart(id, true)));
    }

    /// `join-late`, `leave-late`, `resize-late` (sharded groups): the holder of a shard goes
    /// silent until its term of the shard is in its last renew period (its renewals failing,
    /// its renew deadline within a retry period), and at that moment a replica joins, the
    /// holder leaves, or a replica of another shard count starts (a resize's first step).
    async fn at_last_renew_period(
        &mut self,
        name: &'static str,
        lease: &str,
        id: usize,
        heals: &mut Vec<(Instant, Heal)>,
    ) {
        let link = self.replicas[&id].link.clone();
        let Some(deadline) = link.renew_deadline(lease) else {
            return;
        };
        let retry = self.t.retry;
        let l = self.t.lease;
        link.change(|s| s.cut = Cut::Requests);
        let heal_at = deadline - retry / 2 + l.mul_f64(self.world.rng(|r| r.between(0.0, 0.5)));
        heals.push((heal_at, Heal::Link(link.clone(), HealWhat::Cut)));
        // The cut may come while a renewal is on its way: the deadline read again then.
        let moment = deadline.saturating_sub_dur(retry);
        self.wait_until(moment.max(Instant::now()), heals).await;
        if !self.replicas.contains_key(&id) {
            return;
        }
        let deadline = link.renew_deadline(lease).unwrap_or(deadline);
        self.world.nemesis(
            name,
            lease,
            format_args!(
                "{} holds {lease} in its last renew period (renew deadline {} ms)",
                link.label(),
                self.world.ms(deadline)
            ),
        );
        match name {
            "join-late" => {
                let new = self.next_id;
                self.next_id += 1;
                self.start(new);
            }
            "leave-late" => {
                self.leave(id);
                heals.push((Instant::now() + l * 2, Heal::Restart(id, true)));
            }
            _ => {
                let new = self.next_id;
                self.next_id += 1;
                let count = (self.p.shards + 4).min(tenure::shard::MAX_SHARDS);
                self.start_with(new, count);
                self.transient.insert(new);
                let span = l.mul_f64(self.world.rng(|r| r.between(1.0, 2.0)));
                heals.push((Instant::now() + span, Heal::Retire(new)));
            }
        }
    }
}

/// `Instant - Duration`, saturating at the run's origin rather than panicking.
trait SaturatingSub {
    fn saturating_sub_dur(self, d: Duration) -> Instant;
}

impl SaturatingSub for Instant {
    fn saturating_sub_dur(self, d: Duration) -> Instant {
        self.checked_sub(d).unwrap_or(self)
    }
}

impl Sim {
    /// `health-flip`: the holder's health flips, unhealthy for spans around the policy's
    /// bound (some shorter, some longer) with healthy spells between: it may hand over once,
    /// and must not lead again before it has been healthy for the recovery window.
    fn health_flip(&mut self, lease: &str, id: usize, heals: &mut Vec<(Instant, Heal)>) {
        let label = self.replicas[&id].link.label().to_owned();
        let bound = self.t.health.unhealthy_after;
        let flips = self.world.rng(|r| 2 + r.below(5));
        self.world
            .nemesis("health-flip", lease, format_args!("{label} {flips} flips"));
        self.report_health(&label, false);
        let mut at = Instant::now();
        for i in 0..flips {
            let (bad, good) = self
                .world
                .rng(|r| (r.between(0.3, 2.0), r.between(0.2, 1.5)));
            at += bound.mul_f64(bad);
            heals.push((at, Heal::Health(label.clone(), true)));
            if i + 1 < flips {
                at += bound.mul_f64(good);
                heals.push((at, Heal::Health(label.clone(), false)));
            }
        }
    }

    /// `health-turns`: two replicas unhealthy in turn: the holder first, then (about when it
    /// has handed over) another replica, while the first is unhealthy or sitting out; each
    /// recovers later. Leadership must not flap between the two.
    fn health_turns(&mut self, lease: &str, id: usize, heals: &mut Vec<(Instant, Heal)>) {
        let first = self.replicas[&id].link.label().to_owned();
        let others: Vec<String> = self
            .replicas
            .iter()
            .filter(|(other, _)| **other != id)
            .map(|(_, r)| r.link.label().to_owned())
            .collect();
        if others.is_empty() {
            return;
        }
        let second = others[self.world.rng(|r| r.below(others.len() as u64)) as usize].clone();
        let l = self.t.lease;
        let bound = self.t.health.unhealthy_after;
        let (turn, first_back, second_back) = self.world.rng(|r| {
            (
                r.between(1.0, 3.0),
                r.between(0.5, 3.0),
                r.between(1.0, 4.0),
            )
        });
        self.world
            .nemesis("health-turns", lease, format_args!("{first} then {second}"));
        self.report_health(&first, false);
        let now = Instant::now();
        let second_at = now + bound + l.mul_f64(turn);
        heals.push((second_at, Heal::Health(second.clone(), false)));
        heals.push((second_at + l.mul_f64(first_back), Heal::Health(first, true)));
        heals.push((
            second_at + l.mul_f64(second_back),
            Heal::Health(second, true),
        ));
    }

    /// `all-unhealthy`: every replica unhealthy for longer than an announcement can outlive
    /// its health: the leader must keep the lease (stepping down helps nobody).
    fn all_unhealthy(&mut self, lease: &str, heals: &mut Vec<(Instant, Heal)>) {
        let labels: Vec<String> = self
            .replicas
            .values()
            .map(|r| r.link.label().to_owned())
            .collect();
        self.world.nemesis(
            "all-unhealthy",
            lease,
            format_args!("{} replicas", labels.len()),
        );
        let stale = self.t.health.stale_for;
        let now = Instant::now();
        for label in labels {
            self.report_health(&label, false);
            let extra = self
                .t
                .lease
                .mul_f64(self.world.rng(|r| r.between(0.5, 2.5)));
            heals.push((now + stale + extra, Heal::Health(label, true)));
        }
    }
}

impl Sim {
    /// A heal falls due; a `health-relapse` armed on a process fires, when a replica has
    /// recovered from a health step-down — or later, when the armed one will have. Returns
    /// the instant until which the relapse needs no other fault (`health_relapse`).
    pub(super) fn due(&mut self, heal: Heal, heals: &mut Vec<(Instant, Heal)>) -> Option<Instant> {
        let Heal::Relapse(armed) = heal else {
            self.heal(heal);
            return None;
        };
        let held = self.held();
        let recovered = self.recovered(&held);
        let mut until = None;
        if let Some(target) = held.first()
            && !recovered.is_empty()
        {
            let (lease, id, expiry) = (target.lease.clone(), target.id, target.expiry);
            until = self.health_relapse(&lease, id, expiry, &recovered, heals);
            // Not now: again a lease later, while the faults' phase lasts.
            let again = Instant::now() + self.t.lease;
            if until.is_none() && again < self.chaos_end {
                heals.push((again, Heal::Relapse(armed)));
            }
        } else if let Some(at) = self.recovers_at(&armed)
            && at > Instant::now()
        {
            // Its step-down came later than armed for (the workload's grace, a slow store).
            heals.push((at, Heal::Relapse(armed)));
        } else if let Some(target) = held.first()
            && Instant::now()
                + self.t.health.unhealthy_after * 2
                + self.t.health.recovery
                + self.t.lease * 2
                < self.chaos_end
        {
            // The armed replica did not step down (its term lost, not handed over), or is
            // gone: armed again on the holder while there is time for it.
            let (lease, id) = (target.lease.clone(), target.id);
            self.arm_relapse(&lease, id, heals);
        } else {
            self.world.event(format_args!(
                "nemesis health-relapse on {armed}: nothing to aim at (no replica recovered from a health step-down, or no lease held)"
            ));
        }
        // Its heals among the others, in order (a stable sort: deterministic).
        heals.sort_by_key(|(at, _)| *at);
        until
    }

    /// When process `label`, if it stepped down for its health and is healthy, will have
    /// been healthy for the recovery window and a retry period (its elector campaigns again).
    fn recovers_at(&self, label: &str) -> Option<Instant> {
        self.world
            .recovering(self.t.retry)
            .into_iter()
            .find(|(l, _)| l == label)
            .map(|(_, at)| at)
    }

    /// The live replicas (labels) that stepped down for their health and have been healthy
    /// since for the recovery window (and a retry period: their electors campaign again),
    /// none of them a holder. Read from the world's health records, not drawn.
    fn recovered(&self, held: &[Held]) -> Vec<String> {
        let now = Instant::now();
        let holders: Vec<&str> = held
            .iter()
            .map(|h| self.replicas[&h.id].link.label())
            .collect();
        self.world
            .recovering(self.t.retry)
            .into_iter()
            .filter(|(label, at)| {
                *at <= now
                    && !holders.contains(&label.as_str())
                    && self.replicas.values().any(|r| r.link.label() == label)
            })
            .map(|(label, _)| label)
            .collect()
    }

    /// `health-relapse` with no replica recovered from a health step-down yet: armed on the
    /// holder of `lease`. It turns unhealthy for 1.2–2 × the bound (so it steps down), and
    /// the relapse falls due once it has been healthy for the recovery window, a retry
    /// period and 0–0.25 lease (its elector campaigns again).
    fn arm_relapse(&mut self, lease: &str, id: usize, heals: &mut Vec<(Instant, Heal)>) {
        let label = self.replicas[&id].link.label().to_owned();
        let (bound, recovery) = (self.t.health.unhealthy_after, self.t.health.recovery);
        let (sick, wait) = self
            .world
            .rng(|r| (bound.mul_f64(r.between(1.2, 2.0)), r.between(0.0, 0.25)));
        let healthy_at = Instant::now() + sick;
        let due = healthy_at + recovery + self.t.retry + self.t.lease.mul_f64(wait);
        self.world.event(format_args!(
            "nemesis health-relapse armed on {label} {lease}: unhealthy for {sick:?}, the relapse due at {} ms",
            self.world.ms(due)
        ));
        self.report_health(&label, false);
        heals.push((healthy_at, Heal::Health(label.clone(), true)));
        heals.push((due, Heal::Relapse(label)));
    }

    /// `health-relapse` (one lease): a replica that stepped down for its health and has been
    /// healthy for the recovery window since, so that it campaigns again, relapses —
    /// unhealthy for an instant or for 0.3–3 leases — and the holder is cut off both ways at
    /// once until past its lease's expiry, which frees the lease without a hand-over. The
    /// relapsed replica's campaign is aimed at the expiry, every other one a little after
    /// it. The relapse must have stopped that campaign (its recovery window starts again):
    /// if it still runs, it wins the lease too early (checker `Flapping`).
    fn health_relapse(
        &mut self,
        lease: &str,
        id: usize,
        expiry: Instant,
        recovered: &[String],
        heals: &mut Vec<(Instant, Heal)>,
    ) -> Option<Instant> {
        let link = self.replicas[&id].link.clone();
        let relapsing =
            recovered[self.world.rng(|r| r.below(recovered.len() as u64)) as usize].clone();
        let (l, retry) = (self.t.lease, self.t.retry);
        let (for_an_instant, unhealthy, after, back) = self.world.rng(|r| {
            (
                r.chance(0.25),
                l.mul_f64(r.between(0.3, 3.0)),
                retry.mul_f64(r.between(0.25, 1.0)),
                l.mul_f64(r.between(0.2, 1.0)),
            )
        });
        // Aimed where nothing else stands in the way: no `slow-renewal` armed on the holder
        // (it would aim the campaigns elsewhere), the store up, the relapsing replica's link
        // clear (a campaign that cannot reach the store wins nothing), the expiry within the
        // faults' phase (the heal of them all ends the cut).
        let clear = self.replicas.values().any(|r| {
            let s = r.link.state();
            r.link.label() == relapsing && s.cut == Cut::None && !s.frozen && s.extra.is_zero()
        });
        if link.holding()
            || !clear
            || self.world.store_down.load(Ordering::Relaxed)
            || expiry + after >= self.chaos_end
        {
            self.world.event(format_args!(
                "nemesis health-relapse on {relapsing}: not now (the holder armed, the store down, its link faulty or the faults' end too near)"
            ));
            return None;
        }
        self.world.nemesis(
            "health-relapse",
            lease,
            format_args!(
                "{relapsing} relapses {} while campaigning; {} cut off, campaigns aimed at the expiry {} ms, all but {relapsing}'s {after:?} after it",
                if for_an_instant {
                    "for an instant".to_owned()
                } else {
                    format!("for {unhealthy:?}")
                },
                link.label(),
                self.world.ms(expiry)
            ),
        );
        // The store answers at once: no renewal of the holder lands after the cut, and the
        // expiry read with `held` stands.
        link.change(|s| s.cut = Cut::Both);
        heals.push((expiry + back, Heal::Link(link, HealWhat::Cut)));
        self.world.aim_first(lease, expiry, &relapsing, after);
        self.report_health(&relapsing, false);
        if for_an_instant {
            self.report_health(&relapsing, true);
        } else {
            heals.push((Instant::now() + unhealthy, Heal::Health(relapsing, true)));
        }
        // No other fault until the others' campaigns have reached the store: a store-stall or
        // another aim would decide the race instead.
        Some(expiry + after)
    }
}

/// `runtime-stall`: the runtime of the holder of `lease` stalls (its workload blocking the
/// thread, the process starved of CPU) until past its renew deadline — within its validity,
/// or past that but before the store's expiry, in the drift allowance — so the renewal
/// scheduler runs late, and the workload looks at its term before the scheduler has ended
/// it. Virtual time jumps with no task polled meanwhile, so every replica stalls with it (as
/// under a paused host); the stall ends before the store's first expiry of any lease, so
/// no replica is granted a lease whose stalled holder has not yet run (a pause past the
/// store's expiry is the fence's to handle). The term must say it is no longer valid
/// (checker `InvalidWrite`).
pub(super) fn stall_runtime(world: &World, link: &Link, lease: &str, term: &Term, stall: &Stall) {
    let now = Instant::now();
    let Some(deadline) = link.renew_deadline(lease) else {
        return;
    };
    let valid_until = term.valid_until();
    let token = term.fencing_token().get();
    let (from, to) = if stall.past_validity {
        let Some(expiry) = link
            .store_record(lease)
            .filter(|r| r.fencing.get() == token)
            .and_then(|r| r.remaining)
        else {
            return;
        };
        (valid_until, now + expiry)
    } else {
        (deadline, valid_until)
    };
    // Every process stalls: a lease of another replica expiring in the stall could be
    // granted before its holder runs again.
    let first_expiry = stall
        .leases
        .iter()
        .filter_map(|other| link.store_record(other)?.remaining)
        .min()
        .map(|remaining| now + remaining);
    let to = first_expiry.map_or(to, |first| first.min(to));
    let until = from + to.saturating_duration_since(from).mul_f64(stall.at);
    if until <= now || until >= to {
        return;
    }
    world.nemesis(
        "runtime-stall",
        lease,
        format_args!(
            "{} {lease} #{token}: runtime stalled until {} ms (renew deadline {} ms, valid until {} ms{})",
            link.label(),
            world.ms(until),
            world.ms(deadline),
            world.ms(valid_until),
            if stall.past_validity {
                format!(", store's expiry {} ms", world.ms(to))
            } else {
                String::new()
            }
        ),
    );
    // Moves the paused clock without yielding: no other task runs before this one goes on.
    let _ = tokio::time::advance(until - now).now_or_never();
}
