//! A sharded replica's fast restart: with a [`RestartLock`] that was free — every process of
//! this replica's previous run is gone — the shard terms that run recorded are ended at once,
//! so its shards are taken over without waiting for their leases to expire.

use std::time::Duration;

use crate::Locker;
use crate::election::{RestartLock, end_recorded_terms};

/// Ends every shard term of `group` that the previous process recorded in `lock` under this
/// replica's identity ([`end_recorded_terms`]: a store error leaves that lease to expire).
pub(super) async fn end_previous_terms(
    locker: &Locker,
    group: &str,
    lock: &RestartLock,
    timeout: Duration,
) {
    let prefix = format!("{group}-");
    // Only this group's shard leases: `GROUP-N`, whatever count the previous run had (a
    // group named `GROUP-1` has leases `GROUP-1-N`, which are not ours).
    let ours = |lease: &str| {
        lease
            .strip_prefix(&prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let previous = lock.take_previous_all(locker.identity(), ours);
    if previous.is_empty() {
        return;
    }
    let recorded = previous.len();
    let ended = end_recorded_terms(
        locker.backend().as_ref(),
        locker.identity(),
        previous,
        timeout,
    )
    .await;
    tracing::info!(
        group,
        ended,
        recorded,
        lock = %lock.path().display(),
        "this replica's previous process is gone (its restart lock was free): ended the shard terms it still held, so they are taken over at once"
    );
}
