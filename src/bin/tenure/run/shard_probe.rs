//! `--listen` with `--shards`: the library's probe server for a [`ShardedElector`]
//! (`/healthz`, `/readyz` once a member of the group), with the sharded replica's gauges on
//! `/metrics`: `tenure_shards`, `tenure_shards_assigned`, `tenure_shards_owned` and
//! `tenure_shard_group_members`, `tenure_shard_group_waiting` and
//! `tenure_shard_group_generation`, and the counters `tenure_shard_terms_lost_total` and
//! `tenure_shard_heartbeats_missed_total`, updated whenever the assignment, the held shards or
//! the group record change and every second (a missed heartbeat changes none of them); beside
//! each shard lease's own series (`ElectionMetrics`, registered by the caller).

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tenure::probe::ProbeServer;
use tenure::shard::{GroupStatus, ShardedElector};
use tokio::net::TcpListener;

/// The replica's gauges.
#[derive(Default)]
struct Gauges {
    shards: Gauge,
    assigned: Gauge,
    owned: Gauge,
    members: Gauge,
    waiting: Gauge,
    generation: Gauge,
    lost: Counter,
    missed: Counter,
}

impl Gauges {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "tenure_shards",
            "The group's shard count",
            self.shards.clone(),
        );
        registry.register(
            "tenure_shards_assigned",
            "Shards the latest assignment gives this replica",
            self.assigned.clone(),
        );
        registry.register(
            "tenure_shards_owned",
            "Shards whose term runs on this replica",
            self.owned.clone(),
        );
        registry.register(
            "tenure_shard_group_members",
            "Live members of the group in the latest assignment",
            self.members.clone(),
        );
        registry.register(
            "tenure_shard_group_waiting",
            "1 while this replica runs no shard because the group record holds another shard count, is changing count, or cannot be parsed",
            self.waiting.clone(),
        );
        registry.register(
            "tenure_shard_group_generation",
            "The group record's generation this replica runs under (0 while it waits)",
            self.generation.clone(),
        );
        registry.register(
            "tenure_shard_terms_lost",
            "Shard terms this replica lost to the store (missed renewals, a lease taken), not counting terms given up; a steady rise means the group may be past what the store can write",
            self.lost.clone(),
        );
        registry.register(
            "tenure_shard_heartbeats_missed",
            "Member announcements of this replica that did not land (failed, or unanswered within a third of a lease); about three in a row and the group drops it",
            self.missed.clone(),
        );
    }

    fn update(&self, elector: &ShardedElector) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let (mine, members) = {
            let assignment = elector.assignment();
            let assignment = assignment.borrow();
            let mine = assignment
                .owners
                .iter()
                .filter(|o| o.as_deref() == Some(elector.identity()))
                .count();
            (mine, assignment.members.len())
        };
        self.shards.set(i64::from(elector.shards()));
        self.assigned.set(count(mine));
        self.members.set(count(members));
        self.owned.set(count(elector.owned().borrow().len()));
        let generation = match *elector.group().borrow() {
            GroupStatus::Running { generation } => Some(generation),
            _ => None,
        };
        self.waiting.set(i64::from(generation.is_none()));
        let (lost, counted) = (elector.lost_terms(), self.lost.get());
        if lost > counted {
            self.lost.inc_by(lost - counted);
        }
        let (missed, counted) = (elector.missed_heartbeats(), self.missed.get());
        if missed > counted {
            self.missed.inc_by(missed - counted);
        }
        self.generation
            .set(generation.map_or(0, |g| i64::try_from(g).unwrap_or(i64::MAX)));
    }
}

/// Serves the endpoints on `listener`, with the gauges added to `registry`, until the task is
/// dropped.
pub async fn serve(listener: TcpListener, elector: ShardedElector, mut registry: Registry) {
    let gauges = Gauges::default();
    gauges.register(&mut registry);
    gauges.update(&elector);
    let server = ProbeServer::sharded(elector.clone()).metrics(Arc::new(Mutex::new(registry)));
    let (mut assignment, mut owned, mut group) =
        (elector.assignment(), elector.owned(), elector.group());
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let gauges_follow = async {
        loop {
            tokio::select! {
                changed = assignment.changed() => if changed.is_err() { break },
                changed = owned.changed() => if changed.is_err() { break },
                changed = group.changed() => if changed.is_err() { break },
                _ = tick.tick() => {}
            }
            gauges.update(&elector);
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        served = server.serve(listener) => if let Err(e) = served {
            tracing::error!(error = %e, "the /metrics and probe endpoint stopped");
        },
        () = gauges_follow => {}
    }
}
