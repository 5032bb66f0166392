//! The publisher's task for a member of a sharded group: the shards it holds, each with its
//! term's token, and its shard count, written into the group's `Election` status beside the
//! other members' (each member replaces only its own entries; see `status.rs`).

use std::collections::BTreeMap;
use std::pin::pin;

use tokio::time::Instant;

use super::StatusPublisher;
use super::schedule::{Settings, State};
use super::status::{Intent, ShardIntent};
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
        let (heartbeat, prune_older_than) = self.cadence(lease_duration);
        let settings = || Settings {
            min_interval: self.min_interval,
            heartbeat,
        };
        // A shard taken again keeps the owned set as it was but changes its token: the set
        // is compared with the tokens, polled as well as watched.
        let mut poll = self.poll();
        let mut owned = elector.owned();
        let mut shutdown = pin!(shutdown);
        let mut st = State::new();
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
                        handoff: None,
                    };
                    let result = tokio::select! {
                        () = &mut shutdown => {
                            // The request may have been sent: it may yet land, uncounted
                            // as a write, so it counts as an attempt that did not finish.
                            self.stats.count_failure();
                            break;
                        }
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
                handoff: None,
            };
            self.leave(&intent, elector.name()).await;
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
