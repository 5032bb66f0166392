//! Prometheus metrics of elections (feature `metrics`), with client-go's names where it has
//! them, so existing dashboards and alerts keep working.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabel {
    name: String,
}

type HistogramFamily = Family<NameLabel, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms … ~33 s
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The metrics of every elector they are attached to, labelled by lease name.
///
/// | metric | type | meaning |
/// |---|---|---|
/// | `leader_election_master_status{name}` | gauge | 1 while this process leads (client-go's name) |
/// | `leader_election_slowpath_total{name}` | counter | terms won only after waiting for another holder (client-go's name; there it counts reads before writes) |
/// | `tenure_leader_transitions_total{name}` | counter | terms this process has started |
/// | `tenure_acquire_latency_seconds{name}` | histogram | time from the start of a campaign to winning |
/// | `tenure_renew_latency_seconds{name}` | histogram | round trip of the leader's renewals, sampled every lease duration / 3 (the renewal interval) |
/// | `tenure_lease_remaining_validity_seconds{name}` | gauge | how long the current term's lease stays valid without another renewal, sampled at the start of a term and every lease duration / 3 while leading |
///
/// # Example
///
/// ```
/// use prometheus_client::registry::Registry;
/// use tenure::election::ElectionMetrics;
///
/// let mut registry = Registry::default();
/// let metrics = ElectionMetrics::register(&mut registry);
/// # let _ = metrics;
/// ```
#[derive(Clone, Debug)]
pub struct ElectionMetrics {
    master_status: Family<NameLabel, Gauge>,
    slowpath: Family<NameLabel, Counter>,
    transitions: Family<NameLabel, Counter>,
    acquire_latency: HistogramFamily,
    renew_latency: HistogramFamily,
    remaining_validity: Family<NameLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl ElectionMetrics {
    /// Creates the metrics and registers them into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            master_status: Family::default(),
            slowpath: Family::default(),
            transitions: Family::default(),
            acquire_latency: HistogramFamily::new_with_constructor(latency_histogram),
            renew_latency: HistogramFamily::new_with_constructor(latency_histogram),
            remaining_validity: Family::default(),
        };
        registry.register(
            "leader_election_master_status",
            "Whether this process leads (1) or not (0)",
            m.master_status.clone(),
        );
        registry.register(
            "leader_election_slowpath",
            "Terms won only after waiting for another holder",
            m.slowpath.clone(),
        );
        registry.register(
            "tenure_leader_transitions",
            "Terms this process has started",
            m.transitions.clone(),
        );
        registry.register(
            "tenure_acquire_latency_seconds",
            "Time from the start of a campaign to winning it",
            m.acquire_latency.clone(),
        );
        registry.register(
            "tenure_renew_latency_seconds",
            "Round trip of the leader's renewals",
            m.renew_latency.clone(),
        );
        registry.register(
            "tenure_lease_remaining_validity_seconds",
            "How long the current term's lease stays valid without another renewal",
            m.remaining_validity.clone(),
        );
        m
    }

    fn label(name: &str) -> NameLabel {
        NameLabel {
            name: name.to_owned(),
        }
    }

    pub(super) fn acquired(&self, name: &str, latency: Duration, waited: bool) {
        let l = Self::label(name);
        self.acquire_latency
            .get_or_create(&l)
            .observe(latency.as_secs_f64());
        if waited {
            self.slowpath.get_or_create(&l).inc();
        }
        self.transitions.get_or_create(&l).inc();
    }

    pub(super) fn leading(&self, name: &str, leading: bool) {
        let l = Self::label(name);
        self.master_status.get_or_create(&l).set(i64::from(leading));
        if !leading {
            self.remaining_validity.get_or_create(&l).set(0.0);
        }
    }

    pub(super) fn renewed(&self, name: &str, latency: Duration) {
        self.renew_latency
            .get_or_create(&Self::label(name))
            .observe(latency.as_secs_f64());
    }

    pub(super) fn remaining_validity(&self, name: &str, remaining: Duration) {
        self.remaining_validity
            .get_or_create(&Self::label(name))
            .set(remaining.as_secs_f64());
    }
}
