//! The chaos phase: seeded faults, each healed after its own span, and the heal of them all
//! when the phase ends.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::Sim;
use crate::link::{Cut, Link, SLOWEST_COVERED_RATE};

/// The share of the chaos phase's faults that are nemeses (`nemesis.rs`).
const NEMESIS_SHARE: f64 = 0.3;

impl Sim {
    /// Seeded faults for `length`, each healed after its own span.
    pub(super) async fn chaos(&mut self, length: Duration) {
        let end = Instant::now() + length;
        self.chaos_end = end;
        let lease = self.t.lease.as_secs_f64();
        let mut heals: Vec<(Instant, Heal)> = Vec::new();
        loop {
            let gap = self.world.rng(|r| r.exp(lease / 3.0));
            let next = Instant::now() + Duration::from_secs_f64(gap);
            // Heal what is due before the next fault.
            heals.sort_by_key(|(at, _)| *at);
            while let Some((at, _)) = heals.first() {
                if *at > next.min(end) {
                    break;
                }
                let (at, heal) = heals.remove(0);
                tokio::time::sleep_until(at).await;
                if let Some(until) = self.due(heal, &mut heals) {
                    self.wait_until(until, &mut heals).await;
                }
            }
            if next >= end {
                tokio::time::sleep_until(end).await;
                break;
            }
            tokio::time::sleep_until(next).await;
            self.world.counters.faults.fetch_add(1, Ordering::Relaxed);
            // A share of the faults are nemeses, aimed from the run's state.
            if self.p.nemeses
                && self.world.rng(|r| r.chance(NEMESIS_SHARE))
                && self.nemesis(&mut heals).await
            {
                continue;
            }
            let kind = self.world.rng(|r| r.below(100));
            let span = Duration::from_secs_f64(self.world.rng(|r| r.between(0.2, 2.5)) * lease);
            let Some(id) = self.pick() else {
                // Everyone is down: bring one back.
                if let Some(id) = self.down.pop() {
                    self.start(id);
                }
                continue;
            };
            let link = self.replicas[&id].link.clone();
            let label = link.label().to_owned();
            match kind {
                0..=14 => {
                    let extra =
                        Duration::from_secs_f64(self.world.rng(|r| r.between(0.1, 1.2)) * lease);
                    self.world
                        .event(format_args!("fault spike {label} +{extra:?} for {span:?}"));
                    link.change(|s| s.extra = extra);
                    heals.push((Instant::now() + span, Heal::Link(link, HealWhat::Spike)));
                }
                15..=34 => {
                    let cut = [Cut::Both, Cut::Requests, Cut::Answers]
                        [self.world.rng(|r| r.below(3)) as usize];
                    self.world
                        .event(format_args!("fault cut {label} {cut:?} for {span:?}"));
                    link.change(|s| s.cut = cut);
                    heals.push((Instant::now() + span, Heal::Link(link, HealWhat::Cut)));
                }
                35..=49 => {
                    self.world
                        .event(format_args!("fault freeze {label} for {span:?}"));
                    link.change(|s| s.frozen = true);
                    heals.push((Instant::now() + span, Heal::Link(link, HealWhat::Freeze)));
                }
                50..=61 => {
                    self.kill(id);
                    // Back with the same identity (a restarted container) or as a new one.
                    let same = self.world.rng(|r| r.chance(0.5));
                    heals.push((Instant::now() + span, Heal::Restart(id, same)));
                }
                62..=69 => {
                    let beyond = self.p.drift_beyond && self.world.rng(|r| r.chance(0.5));
                    let rate = if beyond {
                        self.world.rng(|r| r.between(0.6, 0.95))
                    } else {
                        self.world.rng(|r| r.between(SLOWEST_COVERED_RATE, 1.05))
                    };
                    self.world
                        .event(format_args!("fault clock {label} rate {rate:.4}"));
                    link.change(|s| s.rate = rate);
                }
                70..=77 => {
                    let (stale, hiccups) = self
                        .world
                        .rng(|r| (r.between(0.1, 0.9), r.between(0.1, 0.9)));
                    self.world.event(format_args!(
                        "fault watch {label} hiccups {hiccups:.2} stale reads {stale:.2} for {span:?}"
                    ));
                    link.change(|s| {
                        s.stale = stale;
                        s.hiccups = hiccups;
                    });
                    heals.push((Instant::now() + span, Heal::Link(link, HealWhat::Watch)));
                }
                78..=83 => {
                    self.leave(id);
                    heals.push((Instant::now() + span, Heal::Restart(id, true)));
                }
                84..=85 => {
                    if let Some(link) = self.abandon(id) {
                        heals.push((Instant::now() + span, Heal::Exit(id, link)));
                    }
                }
                86..=91 => {
                    let down = span.min(self.t.lease);
                    self.world
                        .event(format_args!("fault store restart for {down:?}"));
                    self.world.store_down.store(true, Ordering::Relaxed);
                    heals.push((Instant::now() + down, Heal::StoreUp));
                }
                92..=95 => {
                    self.world.event("fault store loses its data");
                    self.world.wiped();
                    self.store.wipe();
                }
                _ => {
                    // A new replica joins.
                    let id = self.next_id;
                    self.next_id += 1;
                    self.start(id);
                }
            }
        }
        for (_, heal) in heals {
            self.heal(heal);
        }
    }

    pub(super) fn heal(&mut self, heal: Heal) {
        match heal {
            Heal::Link(link, what) => {
                self.world
                    .event(format_args!("heal {} {what:?}", link.label()));
                link.change(|s| match what {
                    HealWhat::Spike => s.extra = Duration::ZERO,
                    HealWhat::Cut => s.cut = Cut::None,
                    HealWhat::Freeze => s.frozen = false,
                    HealWhat::Watch => {
                        s.stale = 0.0;
                        s.hiccups = 0.0;
                        s.lag = Duration::ZERO;
                    }
                });
            }
            Heal::Restart(id, same) => {
                self.down.retain(|d| *d != id);
                if same {
                    self.start(id);
                } else {
                    let id = self.next_id;
                    self.next_id += 1;
                    self.start(id);
                }
            }
            Heal::Exit(id, link) => {
                self.world.event(format_args!("exit {}", link.label()));
                self.world.releases_owed(link.label());
                link.change(|s| s.dead = true);
                self.down.retain(|d| *d != id);
                self.start(id);
            }
            Heal::StoreUp => {
                self.world.event("heal store up");
                self.world.store_down.store(false, Ordering::Relaxed);
            }
            Heal::Retire(id) => self.retire(id),
            Heal::Health(label, healthy) => self.report_health(&label, healthy),
            // A relapse falls due only while the faults run (`due`); not at their end.
            Heal::Relapse(_) => {}
        }
    }

    /// Ends every fault: links healthy with true clocks, the store up, replicas that are
    /// down restarted.
    pub(super) fn heal_all(&mut self) {
        self.world.event("quiet: every fault healed");
        self.quiet = true;
        self.world.store_down.store(false, Ordering::Relaxed);
        self.world.stall_store(false);
        for id in std::mem::take(&mut self.transient) {
            self.retire(id);
        }
        for r in self.replicas.values() {
            r.link.change(|s| {
                *s = crate::link::State {
                    dead: s.dead,
                    rate: s.rate.clamp(SLOWEST_COVERED_RATE, 1.05),
                    spikes: false,
                    ..crate::link::State::default()
                };
            });
        }
        for id in std::mem::take(&mut self.down) {
            self.start(id);
        }
        let labels: Vec<String> = self
            .replicas
            .values()
            .map(|r| r.link.label().to_owned())
            .collect();
        for label in labels {
            self.report_health(&label, true);
        }
    }
}

impl Sim {
    /// A replica started for a while only (a resize's first step): it leaves for good.
    fn retire(&mut self, id: usize) {
        self.transient.remove(&id);
        self.leave(id);
        self.down.retain(|d| *d != id);
    }
}

pub(super) enum HealWhat {
    Spike,
    Cut,
    Freeze,
    Watch,
}

impl std::fmt::Debug for HealWhat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Spike => "spike",
            Self::Cut => "cut",
            Self::Freeze => "freeze",
            Self::Watch => "watch",
        })
    }
}

pub(super) enum Heal {
    Link(Link, HealWhat),
    Restart(usize, bool),
    /// A process that dropped its elector's run (`abandon`) exits, and is started again.
    Exit(usize, Link),
    StoreUp,
    /// A transient replica leaves for good.
    Retire(usize),
    /// Process `label`'s workload reports its health (`health-*` nemeses); nothing if the
    /// process is gone.
    Health(String, bool),
    /// A `health-relapse` armed on process `label` falls due.
    Relapse(String),
}
