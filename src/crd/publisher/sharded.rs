//! The publisher's task for a member of a sharded group: the shards it holds, each with its
//! term's token, and its shard count, written into the group's `Election` status beside the
//! other members' (each member replaces only its own entries; see `status.rs`).

use std::collections::BTreeMap;
use std::pin::pin;
use std::time::Duration;

use tokio::time::Instant;

use super::schedule::{LogGate, Settings, State};
use super::status::{Intent, ShardIntent};
use super::{MIN_DEFAULT_HEARTBEAT, StatusPublisher};
use crate::FencingToken;
use crate::shard::ShardedElector;

impl StatusPublisher {
    /// The loop behind [`run_sharded`](Self::run_sharded).
    pub(super) async fn follow_sharded<S: Future<Output = ()>>(
        &self,
        elector: &ShardedElector,
        shutdown: S,
    ) {
        let (lease_duration, _, _) = elector.timings();
        let heartbeat = self
            .heartbeat
            .unwrap_or_else(|| lease_duration.saturating_mul(4).max(MIN_DEFAULT_HEARTBEAT))
            .max(Duration::from_millis(10));
        let prune_older_than = heartbeat.saturating_mul(self.prune_after);
        let settings = || Settings {
            min_interval: self.min_interval,
            heartbeat,
        };
        // A shard taken again keeps the owned set as it was but changes its token: the set
        // is compared with the tokens, polled as well as watched.
        let poll_every = self
            .min_interval
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut poll = tokio::time::interval(poll_every);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut owned = elector.owned();
        let mut shutdown = pin!(shutdown);
        let mut st = State {
            published: None,
            want: None,
            step_down: None,
            heartbeat_at: Instant::now(),
            not_before: Instant::now(),
            backoff: None,
            logged: LogGate::default(),
            spec_checked: false,
        };
        let mut published: Option<BTreeMap<u32, FencingToken>> = None;
        loop {
            let held = held(elector);
            let due = if published.as_ref() == Some(&held) {
                st.due()
            } else {
                st.not_before
            };
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = owned.changed() => {}
                _ = poll.tick() => {}
                () = tokio::time::sleep_until(due) => {
                    let now = Instant::now();
                    let intent = Intent {
                        identity: elector.identity(),
                        lead: None,
                        clear: None,
                        heartbeat: st.heartbeat_at <= now,
                        leave: false,
                        prune_older_than,
                        shards: Some(ShardIntent {
                            count: elector.shards(),
                            held: &held,
                        }),
                    };
                    let result = tokio::select! {
                        () = &mut shutdown => break,
                        result = self.sync(&intent, elector.name(), &mut st.spec_checked, true) => result,
                    };
                    if result.is_ok() {
                        published = Some(held.clone());
                    }
                    st.settle(&intent, result, &self.stats, settings());
                }
            }
        }
        if self.clear_on_shutdown {
            let none = BTreeMap::new();
            let intent = Intent {
                identity: elector.identity(),
                lead: None,
                clear: None,
                heartbeat: false,
                leave: true,
                prune_older_than,
                shards: Some(ShardIntent {
                    count: elector.shards(),
                    held: &none,
                }),
            };
            let bound = self.request_timeout.saturating_mul(2);
            let mut spec_checked = true;
            let leave = self.sync(&intent, elector.name(), &mut spec_checked, false);
            match tokio::time::timeout(bound, leave).await {
                Ok(Ok(wrote)) => {
                    if wrote {
                        self.stats.count_write();
                    }
                    tracing::debug!(wrote, "left the election's status");
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "could not leave the election's status"),
                Err(_) => tracing::debug!("leaving the election's status timed out"),
            }
        }
    }
}

/// The shards whose term runs here now, with their tokens.
fn held(elector: &ShardedElector) -> BTreeMap<u32, FencingToken> {
    let owned = elector.owned().borrow().clone();
    owned
        .into_iter()
        .filter_map(|shard| Some((shard, elector.term(shard)?.fencing_token())))
        .collect()
}
