//! A sharded group's joint watch: one label-selected watch of all the group's shard Leases
//! per process, whatever the number of shards, instead of one watch per Lease.
//!
//! It matters for more than the connection count. A non-holder judges a Lease expired when
//! `leaseDurationSeconds` pass on its own clock from the first time it saw the Lease's
//! current version; a replica that begins to follow a shard only when the shard is assigned
//! to it (after its holder's membership expired) would wait a second whole lease. The joint
//! watch sees every shard Lease from the start, so a dead holder's shards are free one
//! lease after its last renewal.
//!
//! Shard Leases carry the label `tenure.dev/shard-group=<group>`, written by whoever
//! acquires them under a joint watch. A Lease without it (written by an older tenure) is
//! not seen by the watch; the view then holds what the last read said, and a
//! compare-and-swap on a stale version fails and reads again, so such a Lease is never
//! taken early, only noticed late. Its next acquisition by this version labels it.
//!
//! The label also keeps plain elections out: a plain election named `<group>-<n>` (shard
//! `n`'s Lease) is refused with a configuration error once the group has labelled the Lease
//! ([`Inner::check_not_a_shard`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ListParams, WatchParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::inner::Inner;
use super::members::label_value;
use super::state::{Current, Joint, Source};
use super::watch::{self, Scope, TermKey};
use crate::backend::{BackendError, BackendErrorKind, ShardLeaseWatch};

/// The label every shard Lease of a group carries once tenure has written it.
pub const SHARD_GROUP_LABEL: &str = "tenure.dev/shard-group";

impl Inner {
    /// Follows `names` (shard Leases of `group`) with one joint watch until the guard drops.
    pub(super) fn follow_shard_leases(
        self: &Arc<Self>,
        group: &str,
        names: &[String],
    ) -> ShardLeaseWatch {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // Each Lease is then followed on its own, as without a group.
            return ShardLeaseWatch::none();
        };
        let label: Arc<str> = Arc::from(label_value(group));
        let names: HashSet<Arc<str>> = names.iter().map(|n| Arc::from(n.as_str())).collect();
        {
            let mut locks = self.locks();
            for name in &names {
                let st = locks.entry(name.clone()).or_default();
                let joint = st.joint.get_or_insert_with(|| Joint {
                    label: label.clone(),
                    followers: 0,
                    live: false,
                    feeds: false,
                });
                joint.followers += 1;
            }
        }
        let stop = CancellationToken::new();
        let scope = Group {
            what: format!("{SHARD_GROUP_LABEL}={label}"),
            names,
            terms: HashMap::new(),
            stop: stop.clone(),
        };
        rt.spawn(watch::run(self.clone(), scope));
        ShardLeaseWatch::keeping(stop.drop_guard())
    }

    /// The group label of `name`, if a joint watch of this process follows it.
    fn joint_label(&self, name: &str) -> Option<Arc<str>> {
        self.locks()
            .get(name)
            .and_then(|st| st.joint.as_ref().map(|j| j.label.clone()))
    }

    /// Marks `lease` as a shard Lease of its group, if a joint watch follows `name`: the
    /// label is what the joint watch selects on.
    pub(super) fn label_if_joint(&self, name: &str, lease: &mut Lease) {
        if let Some(label) = self.joint_label(name) {
            lease
                .metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(SHARD_GROUP_LABEL.to_owned(), label.to_string());
        }
    }

    /// Refuses to acquire `lease` outside its group: a Lease labelled as a shard of a group
    /// is taken only by that group's members (which follow it jointly), so that a plain
    /// election whose name happens to be `<group>-<n>` fails loudly instead of sharing the
    /// Lease with shard `n`'s terms.
    pub(super) fn check_not_a_shard(&self, name: &str, lease: &Lease) -> Result<(), BackendError> {
        let Some(group) = lease
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SHARD_GROUP_LABEL))
        else {
            return Ok(());
        };
        if self.joint_label(name).as_deref() == Some(group.as_str()) {
            return Ok(());
        }
        Err(BackendError::new(
            BackendErrorKind::Config,
            format!(
                "lease {}/{name} is a shard lease of the sharded group labelled \
                 {SHARD_GROUP_LABEL}={group}; only that group's members take it: give this \
                 election another name",
                self.namespace
            ),
        ))
    }
}

/// The joint watch of one group's shard Leases.
struct Group {
    /// The label selector, also the name in messages.
    what: String,
    /// The Leases followed: the shard Leases of this process's shard count.
    names: HashSet<Arc<str>>,
    /// The term last announced per Lease; cleared after a failure, so the next sync is
    /// announced.
    terms: HashMap<Arc<str>, TermKey>,
    stop: CancellationToken,
}

impl Group {
    /// Records `lease` (or its absence) for `name` and tells its observers, if any.
    fn apply(
        &mut self,
        inner: &Inner,
        name: &Arc<str>,
        lease: Option<Lease>,
        deleted_rv: Option<u64>,
        source: Source,
    ) -> Result<(), BackendError> {
        let current = inner.note(name, lease, deleted_rv, source)?;
        let mut locks = inner.locks();
        let Some(st) = locks.get_mut(name) else {
            return Ok(());
        };
        if let Some(joint) = &mut st.joint {
            joint.live = true;
        }
        self.tell(name, st, &current);
        Ok(())
    }

    /// Announces a change of term of `name` to the observers this watch feeds.
    fn tell(&mut self, name: &Arc<str>, st: &mut super::state::LockState, current: &Current) {
        let feeds = st.joint.as_ref().is_some_and(|j| j.feeds);
        let mut last = self.terms.remove(name);
        match &st.watch {
            Some(tx) if feeds && tx.receiver_count() == 0 => {
                // Every observer left: nobody to tell, and the next one opens a new channel.
                st.watch = None;
                if let Some(j) = &mut st.joint {
                    j.feeds = false;
                }
                last = Some(watch::term_of(current).0);
            }
            Some(tx) if feeds => watch::announce(tx, &mut last, current),
            _ => last = Some(watch::term_of(current).0),
        }
        if let Some(last) = last {
            self.terms.insert(name.clone(), last);
        }
    }
}

impl Scope for Group {
    fn what(&self) -> &str {
        &self.what
    }

    fn list_params(&self) -> ListParams {
        ListParams::default().labels(&self.what)
    }

    fn watch_params(&self) -> WatchParams {
        WatchParams::default().labels(&self.what)
    }

    /// A listed version is noted as an answer; a followed Lease not in the list is absent
    /// (or not labelled yet: see the module doc).
    fn listed(
        &mut self,
        inner: &Inner,
        leases: Vec<Lease>,
        sent: Instant,
    ) -> Result<(), BackendError> {
        let mut listed: HashMap<String, Lease> = leases
            .into_iter()
            .filter_map(|l| Some((l.metadata.name.clone()?, l)))
            .collect();
        let names: Vec<Arc<str>> = self.names.iter().cloned().collect();
        for name in names {
            let lease = listed.remove(&*name);
            self.apply(inner, &name, lease, None, Source::Answer(sent))?;
        }
        Ok(())
    }

    fn changed(
        &mut self,
        inner: &Inner,
        name: &str,
        lease: Option<Lease>,
        deleted_rv: Option<u64>,
    ) -> Result<(), BackendError> {
        // A shard Lease of another count of the group: not followed here.
        let Some(name) = self.names.get(name).cloned() else {
            return Ok(());
        };
        self.apply(inner, &name, lease, deleted_rv, Source::Watch)
    }

    fn failed(&mut self, inner: &Inner, e: BackendError) {
        tracing::debug!(watch = %self.what, error = %e, "shard lease watch failed; retrying");
        self.terms.clear();
        let mut locks = inner.locks();
        for name in &self.names {
            let Some(st) = locks.get_mut(name) else {
                continue;
            };
            let feeds = match &mut st.joint {
                Some(j) => {
                    j.live = false;
                    j.feeds
                }
                None => false,
            };
            if feeds && let Some(tx) = &st.watch {
                watch::fail(tx, e.clone());
            }
        }
    }

    fn closed(&self) -> impl Future<Output = ()> + Send + '_ {
        self.stop.cancelled()
    }

    /// Once the guard dropped: stops following, and hands every observer it fed an error,
    /// so that a later `observe` opens a watch of the Lease alone.
    fn finished(&self, inner: &Inner) -> bool {
        if !self.stop.is_cancelled() {
            return false;
        }
        let mut locks = inner.locks();
        for name in &self.names {
            let Some(st) = locks.get_mut(name) else {
                continue;
            };
            let Some(joint) = &mut st.joint else {
                continue;
            };
            joint.followers = joint.followers.saturating_sub(1);
            if joint.followers > 0 {
                continue;
            }
            let feeds = joint.feeds;
            st.joint = None;
            if feeds && let Some(tx) = st.watch.take() {
                watch::fail(
                    &tx,
                    BackendError::new(
                        BackendErrorKind::Unavailable,
                        "the shard lease watch of the group ended",
                    ),
                );
            }
            if st.is_idle() {
                locks.remove(name);
            }
        }
        true
    }
}
