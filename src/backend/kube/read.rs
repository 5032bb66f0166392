//! Reading a Lease that another process wrote: field by field, so that one field tenure cannot
//! parse costs that field, never the object, the list it came in, or the watch.
//!
//! The API server stores what any writer sends that passes its validation, and Go reads more
//! than Rust does: a `renewTime` of `9999-12-31T23:59:59Z` is a valid `metav1.MicroTime`, but
//! beyond the range of the `jiff` timestamps k8s-openapi parses into. Read as a typed `Lease`,
//! that one field failed the whole answer: every member of a sharded group lost its view of
//! the group (a `LeaseList` is parsed at once), and every candidate of a plain election exited.
//! Reads therefore go through [`ReadLease`], whose parsing never fails on an object: what
//! cannot be read is dropped and named in [`ReadLease::damaged`].
//!
//! What a dropped field means is decided where it is used: a member record with one is
//! skipped (the group's view goes on without it); a plain election's Lease whose times are
//! dropped is still held by the holder it names, until that holder's lease runs out on this
//! replica's clock (the observation clock tenure uses anyway) and a compare-and-swap takes it.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Records read with fields tenure could not parse, since the process started (each read of
/// one counts: a watch event, a list item, a GET).
static DAMAGED: AtomicU64 = AtomicU64::new(0);

/// How many Lease records were read with fields that could not be parsed (dropped, and the
/// record skipped or read without them), since the process started.
#[must_use]
pub fn damaged_records() -> u64 {
    DAMAGED.load(Ordering::Relaxed)
}

/// Registers `tenure_kube_unparseable_lease_records_total` in `registry`: the count of
/// [`damaged_records`], read at each scrape. Needs the `metrics` feature.
///
/// ```
/// let mut registry = prometheus_client::registry::Registry::default();
/// tenure::backend::kube::register_read_metrics(&mut registry);
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains("tenure_kube_unparseable_lease_records_total 0"));
/// ```
#[cfg(feature = "metrics")]
pub fn register_read_metrics(registry: &mut prometheus_client::registry::Registry) {
    registry.register_collector(Box::new(DamagedCollector));
}

#[cfg(feature = "metrics")]
#[derive(Debug)]
struct DamagedCollector;

#[cfg(feature = "metrics")]
impl prometheus_client::collector::Collector for DamagedCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let counter = prometheus_client::metrics::counter::ConstCounter::new(damaged_records());
        let metric = encoder.encode_descriptor(
            "tenure_kube_unparseable_lease_records",
            "Lease records read with fields tenure could not parse (dropped; a member record is skipped)",
            None,
            counter.metric_type(),
        )?;
        counter.encode(metric)
    }
}

/// A Lease as read from the API server, with what could not be parsed dropped.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReadLease {
    pub(crate) lease: Lease,
    /// What was dropped, in words (`spec.renewTime`), or `None` for a Lease read whole.
    pub(crate) damaged: Option<String>,
}

impl ReadLease {
    /// Parses `value`, dropping what does not parse: first the two timestamps, then the whole
    /// spec, then everything but the name and resourceVersion.
    fn from_value(mut value: Value) -> Self {
        if let Ok(lease) = Lease::deserialize(&value) {
            return Self {
                lease,
                damaged: None,
            };
        }
        DAMAGED.fetch_add(1, Ordering::Relaxed);
        let mut dropped = Vec::new();
        if let Some(spec) = value.get_mut("spec").and_then(Value::as_object_mut) {
            for (field, key) in [
                ("spec.acquireTime", "acquireTime"),
                ("spec.renewTime", "renewTime"),
            ] {
                if spec
                    .get(key)
                    .is_some_and(|t| MicroTime::deserialize(t).is_err())
                {
                    spec.remove(key);
                    dropped.push(field);
                }
            }
        }
        if let Ok(lease) = Lease::deserialize(&value) {
            return Self::damaged(lease, &dropped);
        }
        if let Some(object) = value.as_object_mut() {
            object.remove("spec");
            dropped.push("spec");
        }
        if let Ok(lease) = Lease::deserialize(&value) {
            return Self::damaged(lease, &dropped);
        }
        let text = |pointer: &str| {
            value
                .pointer(pointer)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let lease = Lease {
            metadata: ObjectMeta {
                name: text("/metadata/name"),
                namespace: text("/metadata/namespace"),
                resource_version: text("/metadata/resourceVersion"),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        dropped.push("metadata");
        Self::damaged(lease, &dropped)
    }

    fn damaged(lease: Lease, dropped: &[&str]) -> Self {
        Self {
            lease,
            damaged: Some(dropped.join(", ")),
        }
    }

    /// The Lease, with a warning naming what was dropped when something was.
    pub(crate) fn into_lease(self) -> Lease {
        if let Some(dropped) = &self.damaged {
            tracing::warn!(
                lease = ?self.lease.metadata.name,
                resource_version = ?self.lease.metadata.resource_version,
                dropped = %dropped,
                "a Lease with fields tenure cannot parse: read without them (held by the holder it names until that holder's lease runs out on this replica's clock)"
            );
        }
        self.lease
    }
}

impl<'de> Deserialize<'de> for ReadLease {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(Self::from_value)
    }
}

impl Serialize for ReadLease {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.lease.serialize(s)
    }
}

impl kube::Resource for ReadLease {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        <Lease as kube::Resource>::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        <Lease as kube::Resource>::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        <Lease as kube::Resource>::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        <Lease as kube::Resource>::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.lease.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.lease.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(spec: Value) -> Value {
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "a", "resourceVersion": "7", "annotations": {"k": "v"}},
            "spec": spec,
        })
    }

    #[test]
    fn a_readable_lease_is_read_whole() {
        let r = ReadLease::from_value(lease(json!({
            "holderIdentity": "x",
            "leaseDurationSeconds": 15,
            "renewTime": "2026-12-03T10:00:00.000000Z",
        })));
        assert_eq!(r.damaged, None);
        assert!(r.lease.spec.and_then(|s| s.renew_time).is_some());
    }

    #[test]
    fn an_out_of_range_time_costs_that_field_only() {
        let before = damaged_records();
        let r = ReadLease::from_value(lease(json!({
            "holderIdentity": "x",
            "leaseDurationSeconds": 15,
            "acquireTime": "2026-12-03T10:00:00.000000Z",
            "renewTime": "9999-12-31T23:59:59.999999Z",
        })));
        assert_eq!(r.damaged.as_deref(), Some("spec.renewTime"));
        let spec = r.lease.spec.clone().expect("spec kept");
        assert_eq!(spec.holder_identity.as_deref(), Some("x"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert!(spec.acquire_time.is_some() && spec.renew_time.is_none());
        assert_eq!(r.lease.metadata.resource_version.as_deref(), Some("7"));
        assert!(damaged_records() > before);
    }

    #[test]
    fn an_unreadable_spec_is_dropped_and_the_metadata_kept() {
        let r = ReadLease::from_value(lease(json!({"leaseDurationSeconds": "fifteen"})));
        assert_eq!(r.damaged.as_deref(), Some("spec"));
        assert!(r.lease.spec.is_none());
        assert_eq!(r.lease.metadata.name.as_deref(), Some("a"));
        let mut v = lease(json!({}));
        v["metadata"]["labels"] = json!(["not", "a", "map"]);
        let r = ReadLease::from_value(v);
        assert_eq!(r.damaged.as_deref(), Some("spec, metadata"));
        assert_eq!(r.lease.metadata.resource_version.as_deref(), Some("7"));
    }

    /// One bad item in a list costs that item's field, not the list.
    #[test]
    fn a_list_with_one_bad_item_parses() {
        let list = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "LeaseList",
            "metadata": {"resourceVersion": "9"},
            "items": [
                lease(json!({"renewTime": "9999-12-31T23:59:59.000000Z"})),
                lease(json!({"holderIdentity": "y"})),
            ],
        });
        let parsed: kube::core::ObjectList<ReadLease> =
            serde_json::from_value(list.clone()).expect("the list parses");
        assert_eq!(parsed.items.len(), 2);
        assert!(parsed.items[0].damaged.is_some() && parsed.items[1].damaged.is_none());
        assert!(
            serde_json::from_value::<kube::core::ObjectList<Lease>>(list).is_err(),
            "as a typed LeaseList it fails whole (what this module is for)"
        );
    }
}
