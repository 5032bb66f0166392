//! Group membership on Kubernetes (sharded leadership): one small Lease per member, found by
//! a label, written with one server-side apply per announcement and watched with one watch
//! per group; a member is live until its `leaseDurationSeconds` pass on the observer's own
//! clock without a change, as a lock's holder is.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;

use super::inner::{Fail, Inner};
use super::read::ReadLease;
use super::slots::Traffic;
use crate::backend::{BackendError, BackendErrorKind, Member};

/// The label every member Lease of a group carries, with the group (or its hash) as value.
const GROUP_LABEL: &str = "tenure.dev/group";
/// The annotation holding the member's record.
const MEMBER_ANNOTATION: &str = "tenure.dev/member";
/// The field manager of the member Lease's apply.
const FIELD_MANAGER: &str = "tenure";

/// The member Lease's name: the group, then a hash of the identity (identities need not be
/// valid object names).
pub fn lease_name(group: &str, identity: &str) -> String {
    format!(
        "{group}-member-{:016x}",
        crate::util::fnv1a64(identity.as_bytes())
    )
}

/// The group label's value: the group itself when it is a valid label value, else a hash.
pub(crate) fn label_value(group: &str) -> String {
    let valid = group.len() <= 63
        && group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && group.starts_with(|c: char| c.is_ascii_alphanumeric())
        && group.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        group.to_owned()
    } else {
        format!("h-{:016x}", crate::util::fnv1a64(group.as_bytes()))
    }
}

impl Inner {
    /// Writes the member's Lease with one server-side apply: it creates the Lease the first
    /// time and replaces these fields every time after, without a `resourceVersion`. The
    /// heartbeat that keeps every shard this replica holds: upkeep, never queued behind the
    /// replica's acquisitions and reads.
    ///
    /// Why not a `PUT`: a Lease allows no update without the version of the object it
    /// replaces, so a `PUT` needs the version of this process's last write. A heartbeat the
    /// caller gave up on after it landed (an API server slower than the caller's bound) left
    /// that version stale, and the next one took four requests in a row (update 409, create
    /// 409, get, update) — under load it then missed its bound again, and again: three
    /// replicas missed 210 heartbeats in a minute and dropped every shard. An apply needs no
    /// version: one request, whatever happened to the last one. Nobody else writes this
    /// Lease, so the apply is forced (it takes over fields an older tenure's `PUT` left).
    pub(super) async fn announce_member(
        &self,
        group: &str,
        member: &Member,
        ttl: Duration,
    ) -> Result<(), BackendError> {
        let record = member.record()?;
        let name = lease_name(group, &member.identity);
        let mut lease = Lease::default();
        lease.metadata.name = Some(name.clone());
        lease.metadata.labels = Some([(GROUP_LABEL.to_owned(), label_value(group))].into());
        lease.metadata.annotations = Some([(MEMBER_ANNOTATION.to_owned(), record)].into());
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(member.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(ttl.as_millis().div_ceil(1000)).unwrap_or(i32::MAX),
            ),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..LeaseSpec::default()
        });
        let op = self.op("patch", &name);
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        match self
            .call(
                op,
                Traffic::Upkeep,
                self.api.patch(&name, &apply, &Patch::Apply(&lease)),
            )
            .await
        {
            Ok(_) => Ok(()),
            // An apply creates what is missing: a 404 is the namespace's.
            Err(Fail::NotFound) => Err(BackendError::new(
                BackendErrorKind::Unavailable,
                format!(
                    "{op}: not found (404); does namespace {:?} exist? retrying later",
                    self.namespace
                ),
            )),
            // A forced apply has no field conflicts: a 409 is the server's own write race.
            Err(Fail::Conflict) => Err(BackendError::new(
                BackendErrorKind::Unavailable,
                format!("{op}: conflicting writes; retrying later"),
            )),
            Err(Fail::Error(e)) => Err(e),
        }
    }

    /// Deletes the member's Lease; one that is already gone is fine.
    pub(super) async fn withdraw_member(
        &self,
        group: &str,
        identity: &str,
    ) -> Result<(), BackendError> {
        let name = lease_name(group, identity);
        match self
            .call(
                self.op("delete", &name),
                Traffic::Upkeep,
                self.api.delete(&name, &DeleteParams::default()),
            )
            .await
        {
            Ok(_) | Err(Fail::NotFound) => Ok(()),
            Err(Fail::Conflict) => Ok(()),
            Err(Fail::Error(e)) => Err(e),
        }
    }
}

/// One member as an observer knows it.
struct Seen {
    member: Member,
    rv: String,
    /// When this observer saw the current version: the member is live for `ttl` from here.
    changed: Instant,
    ttl: Duration,
}

/// What `members` keeps between items.
struct View {
    seen: HashMap<String, Seen>,
    /// During a re-list: the objects listed so far, replacing `seen` at its end.
    relisting: Option<HashMap<String, Seen>>,
    last: Option<Vec<Member>>,
}

impl View {
    fn live(&self, now: Instant) -> (Vec<Member>, Option<Instant>) {
        let mut live: BTreeMap<&str, &Member> = BTreeMap::new();
        let mut next = None;
        for s in self.seen.values() {
            let until = s.changed + s.ttl;
            if until > now {
                live.insert(&s.member.identity, &s.member);
                next = Some(next.map_or(until, |n: Instant| n.min(until)));
            }
        }
        (live.into_values().cloned().collect(), next)
    }

    /// Records `lease` into `into`: seen now, unless `prior` saw this very version before.
    fn apply(
        into: &mut HashMap<String, Seen>,
        prior: Option<&HashMap<String, Seen>>,
        read: &ReadLease,
    ) {
        let lease = &read.lease;
        let (Some(name), Some(rv)) = (&lease.metadata.name, &lease.metadata.resource_version)
        else {
            return;
        };
        // A member record is another replica's word on its liveness: one with a field that
        // cannot be parsed (a planted `renewTime` of 9999-12-31) is left out of the group,
        // never allowed to fail the group's view.
        if let Some(dropped) = &read.damaged {
            tracing::warn!(lease = %name, dropped = %dropped, "a member Lease with fields tenure cannot parse: ignored");
            into.remove(name);
            return;
        }
        // The identity is the Lease's holder, the record its annotation.
        let identity = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref());
        let record = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MEMBER_ANNOTATION));
        let member = match (identity, record) {
            (Some(identity), Some(record)) => Member::decode(identity, record.as_bytes()),
            (None, _) => Err("no holderIdentity"),
            (_, None) => Err("no tenure.dev/member annotation"),
        };
        let member = match member {
            Ok(member) => member,
            Err(why) => {
                tracing::warn!(lease = %name, why, "a member Lease without a readable record: ignored");
                return;
            }
        };
        let ttl = Duration::from_secs(
            lease
                .spec
                .as_ref()
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .unwrap_or(0),
        );
        let before = prior.unwrap_or(into).get(name);
        let changed = match before {
            Some(seen) if &seen.rv == rv => seen.changed,
            // A version seen before changed: now.
            Some(_) => Instant::now(),
            // First seen (this observer just started): as old as its `renewTime` says, so a
            // newcomer does not count a member that died long ago as live for a whole ttl
            // (and assign shards to it that nobody else does). Only liveness in the
            // assignment rests on the writer's clock; the shards' leases decide who holds.
            None => Instant::now()
                .checked_sub(record_age(lease).min(ttl))
                .unwrap_or_else(Instant::now),
        };
        into.insert(
            name.clone(),
            Seen {
                member,
                rv: rv.clone(),
                changed,
                ttl,
            },
        );
    }
}

/// How long ago the member wrote `lease`, by its `renewTime` and this machine's wall clock
/// (zero if it is missing or in the future).
fn record_age(lease: &Lease) -> Duration {
    let Some(renewed) = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()) else {
        return Duration::ZERO;
    };
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(renewed.0);
    Duration::try_from(age).unwrap_or(Duration::ZERO)
}

/// The live members of `group`, from one label-selected watch.
pub fn members(
    inner: &Arc<Inner>,
    group: &str,
) -> BoxStream<'static, Result<Vec<Member>, BackendError>> {
    let api: Api<ReadLease> = inner.reads.clone();
    let config =
        watcher::Config::default().labels(&format!("{GROUP_LABEL}={}", label_value(group)));
    let namespace = inner.namespace.clone();
    let events = watcher::watcher(api, config).default_backoff().boxed();
    let view = View {
        seen: HashMap::new(),
        relisting: None,
        last: None,
    };
    Box::pin(futures::stream::unfold(
        (events, view),
        move |(mut events, mut view)| {
            let namespace = namespace.clone();
            async move {
                loop {
                    // The set is known once the first list is done; not during a re-list.
                    if view.last.is_some() && view.relisting.is_none() {
                        let (live, _) = view.live(Instant::now());
                        if view.last.as_ref() != Some(&live) {
                            view.last = Some(live.clone());
                            return Some((Ok(live), (events, view)));
                        }
                    }
                    let next_expiry = view.live(Instant::now()).1;
                    let expiry = async {
                        match next_expiry {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        event = events.next() => match event? {
                            Ok(Event::Apply(lease)) => View::apply(&mut view.seen, None, &lease),
                            Ok(Event::Delete(lease)) => {
                                if let Some(name) = &lease.lease.metadata.name {
                                    view.seen.remove(name);
                                }
                            }
                            Ok(Event::Init) => view.relisting = Some(HashMap::new()),
                            Ok(Event::InitApply(lease)) => {
                                let relisting = view.relisting.get_or_insert_with(HashMap::new);
                                View::apply(relisting, Some(&view.seen), &lease);
                            }
                            Ok(Event::InitDone) => {
                                view.seen = view.relisting.take().unwrap_or_default();
                                if view.last.is_none() {
                                    let (live, _) = view.live(Instant::now());
                                    view.last = Some(live.clone());
                                    return Some((Ok(live), (events, view)));
                                }
                            }
                            Err(e) => {
                                let err = BackendError::new(
                                    BackendErrorKind::Unavailable,
                                    format!("watching the member Leases in namespace {namespace}: {e}"),
                                );
                                return Some((Err(err), (events, view)));
                            }
                        },
                        () = expiry => {}
                    }
                }
            }
        },
    ))
}
