//! Prometheus metrics of elections (feature `metrics`): client-go's name, label and help text
//! where tenure measures the same thing, so existing dashboards and alerts keep working, and
//! `tenure_*` names for everything else.

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    name: String,
    result: &'static str,
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
/// | `leader_election_master_status{name}` | gauge | 1 while this process leads the lease `name`, else 0 — from the moment the elector is given the metrics, as client-go reports it (client-go's name, label and help text) |
/// | `tenure_retried_campaigns_total{name}` | counter | terms won by a campaign that had already gone one whole acquire window (4 × lease duration) without the lease (held by others throughout it, or the store failing at its end) |
/// | `tenure_leader_transitions_total{name}` | counter | terms this process has started |
/// | `tenure_fencing_token{name}` | gauge | the fencing token of this process's latest term (kept after it ends); it rises with every term, whoever holds it |
/// | `tenure_terms_lost_total{name}` | counter | terms this process lost to the store (renewals missed until the renew deadline, the lease taken or gone), not counting terms it ended itself (released, shut down); created at 0 with the first term |
/// | `tenure_acquire_latency_seconds{name}` | histogram | time from the start of a campaign to winning |
/// | `tenure_renew_latency_seconds{name}` | histogram | round trip of the leader's renewals, sampled every lease duration / 3 (the renewal interval) |
/// | `tenure_lease_remaining_validity_seconds{name}` | gauge | how long the current term's lease stays valid without another renewal, sampled at the start of a term and every lease duration / 3 while leading |
/// | `tenure_fence_enforced{name}` | gauge | 1 when the latest proof of this process's term found the API server enforcing the fence, 0 when it did not (fenced writes fail closed); absent before the first proof (feature `kube`: `Fencer::with_metrics`) |
/// | `tenure_fence_checks_total{name,result}` | counter | fence proofs by result: `enforced`, `unenforced`, `superseded` |
///
/// client-go's `leader_election_slowpath_total` is not exported: it counts a leader's
/// renewals that had to read the Lease before writing it (its optimistic write over the cached
/// record failed or was not possible), and tenure's elector has no such event to count; the
/// Kubernetes backend makes the same fast-path/slow-path choice internally, below the elector.
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
    retried_campaigns: Family<NameLabel, Counter>,
    transitions: Family<NameLabel, Counter>,
    terms_lost: Family<NameLabel, Counter>,
    fencing_token: Family<NameLabel, Gauge>,
    acquire_latency: HistogramFamily,
    renew_latency: HistogramFamily,
    remaining_validity: Family<NameLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    fence_enforced: Family<NameLabel, Gauge>,
    fence_checks: Family<CheckLabels, Counter>,
}

impl ElectionMetrics {
    /// Creates the metrics and registers them into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            master_status: Family::default(),
            retried_campaigns: Family::default(),
            transitions: Family::default(),
            terms_lost: Family::default(),
            fencing_token: Family::default(),
            acquire_latency: HistogramFamily::new_with_constructor(latency_histogram),
            renew_latency: HistogramFamily::new_with_constructor(latency_histogram),
            remaining_validity: Family::default(),
            fence_enforced: Family::default(),
            fence_checks: Family::default(),
        };
        // client-go's help text, word for word (the registry appends the final '.').
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates \
             backup, 1 indicates master. 'name' is the string used to identify the lease. \
             Please make sure to group by name",
            m.master_status.clone(),
        );
        registry.register(
            "tenure_retried_campaigns",
            "Terms won by a campaign that had already gone one whole acquire window \
             (4 x lease duration) without the lease",
            m.retried_campaigns.clone(),
        );
        registry.register(
            "tenure_leader_transitions",
            "Terms this process has started",
            m.transitions.clone(),
        );
        registry.register(
            "tenure_fencing_token",
            "The fencing token of this process's latest term",
            m.fencing_token.clone(),
        );
        registry.register(
            "tenure_terms_lost",
            "Terms this process lost to the store (not ended by itself)",
            m.terms_lost.clone(),
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
        registry.register(
            "tenure_fence_enforced",
            "1 when the latest proof of this process's term found the API server enforcing \
             the fence, 0 when it did not (fenced writes fail closed)",
            m.fence_enforced.clone(),
        );
        registry.register(
            "tenure_fence_checks",
            "Fence proofs by result",
            m.fence_checks.clone(),
        );
        m
    }

    /// A fence proof of a term of `name` ended with `result`; `enforced` when it says
    /// whether the fence holds (not when a newer term was seen).
    // Only the Kubernetes fence proves itself; the metric family exists with `metrics` alone.
    #[cfg_attr(not(feature = "kube"), allow(dead_code))]
    pub(crate) fn fence_checked(&self, name: &str, result: &'static str, enforced: Option<bool>) {
        self.fence_checks
            .get_or_create(&CheckLabels {
                name: name.to_owned(),
                result,
            })
            .inc();
        if let Some(enforced) = enforced {
            self.fence_enforced
                .get_or_create(&Self::label(name))
                .set(i64::from(enforced));
        }
    }

    fn label(name: &str) -> NameLabel {
        NameLabel {
            name: name.to_owned(),
        }
    }

    /// A term with `token` began, `latency` after its campaign started; `retried` if one of
    /// the campaign's acquire windows had already ended without the lease.
    pub(super) fn acquired(&self, name: &str, token: u64, latency: Duration, retried: bool) {
        let l = Self::label(name);
        // Tokens of every backend stay below 2^63 (Redis INCR, a Kubernetes resourceVersion
        // read as i64 by the API server's clients); a larger one shows as i64::MAX.
        self.fencing_token
            .get_or_create(&l)
            .set(i64::try_from(token).unwrap_or(i64::MAX));
        self.acquire_latency
            .get_or_create(&l)
            .observe(latency.as_secs_f64());
        // Created at 0 on the first term, so a dashboard sees the series before it moves.
        let retried_campaigns = self.retried_campaigns.get_or_create(&l);
        if retried {
            retried_campaigns.inc();
        }
        self.transitions.get_or_create(&l).inc();
        // At 0 from the first term, so that an alert's `increase()` sees the first loss.
        let _ = self.terms_lost.get_or_create(&l);
    }

    /// A term of `name` ended because its lease was lost, not because this process ended it.
    pub(super) fn term_lost(&self, name: &str) {
        self.terms_lost.get_or_create(&Self::label(name)).inc();
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;

    use super::ElectionMetrics;
    use crate::Locker;
    use crate::backend::memory::MemoryBackend;
    use crate::backend::{AcquireRequest, Backend, HolderToken};
    use crate::election::{ElectionConfig, LeaderElector};

    fn text(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).expect("encode");
        text
    }

    /// The value of the sample `series` (name and labels) in `text`.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// The rows of the table in [`ElectionMetrics`]'s docs, as written in this file.
    fn doc_table() -> Vec<&'static str> {
        include_str!("metrics.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("/// "))
            .filter(|l| l.starts_with("| `"))
            .collect()
    }

    #[test]
    fn the_exported_names_types_and_help_are_the_documented_ones() {
        let mut registry = Registry::default();
        let metrics = ElectionMetrics::register(&mut registry);
        // A family is encoded (HELP and TYPE) only once it has a series.
        metrics.acquired("x", 7, Duration::from_millis(5), false);
        metrics.term_lost("x");
        metrics.leading("x", true);
        metrics.renewed("x", Duration::from_millis(5));
        metrics.remaining_validity("x", Duration::from_secs(10));
        metrics.fence_checked("x", "enforced", Some(true));
        let text = text(&registry);
        // name (as in the `# TYPE` line) → type, from the registry…
        let exported: BTreeMap<&str, &str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
            .collect();
        // …and from the table: counters are typed without their `_total` suffix.
        let documented: BTreeMap<&str, &str> = doc_table()
            .iter()
            .map(|row| {
                let cells: Vec<&str> = row.split(" | ").collect();
                let name = cells[0].trim_start_matches("| `").trim_end_matches('`');
                let name = name.split_once('{').map_or(name, |(n, _)| n);
                let kind = cells[1];
                let name = if kind == "counter" {
                    name.strip_suffix("_total")
                        .expect("a counter ends in _total")
                } else {
                    name
                };
                (name, kind)
            })
            .collect();
        assert_eq!(exported, documented, "{text}");
        assert!(
            !text.contains("slowpath"),
            "client-go's slow-path counter means something tenure does not count: {text}"
        );
        // client-go's help text, word for word (k8s.io/component-base/metrics/prometheus/
        // clientgo/leaderelection).
        assert!(
            text.contains(
                "# HELP leader_election_master_status Gauge of if the reporting system is \
                 master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' \
                 is the string used to identify the lease. Please make sure to group by name.\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_readme_mirrors_the_table() {
        let readme = include_str!("../../docs/metrics.md");
        let rows = doc_table();
        assert_eq!(rows.len(), 10, "{rows:#?}");
        for row in rows {
            assert!(
                readme.lines().any(|l| l == row),
                "docs/metrics.md's metrics table lacks (or words differently) the row\n{row}"
            );
        }
        let readme_rows = readme
            .lines()
            // The elector's rows (labelled by lease name); the sharded group's follow apart.
            .filter(|l| l.starts_with("| `leader_election_") || l.starts_with("| `tenure_"))
            .filter(|l| l.contains("{name"))
            .count();
        assert_eq!(
            readme_rows, 10,
            "docs/metrics.md has metric rows the docs do not"
        );
    }

    /// Another holder takes `name` for `ttl`; then an elector campaigns for it and leads once.
    async fn lead_after_holder(metrics: &ElectionMetrics, name: &str, ttl: Option<Duration>) {
        let store = MemoryBackend::new();
        if let Some(ttl) = ttl {
            let req = AcquireRequest {
                name: name.into(),
                holder: HolderToken::random(),
                identity: "other".into(),
                ttl,
            };
            store.try_acquire(&req).await.expect("memory never fails");
        }
        let locker = Locker::with_identity(store, "me").expect("identity");
        let elector = LeaderElector::new(locker, name, ElectionConfig::new())
            .expect("valid config")
            .with_metrics(metrics.clone());
        elector.run(|_term| async {}).await.expect("led once");
    }

    /// A term whose lease another replica took counts as lost; a term whose workload
    /// returned (and released) does not.
    #[tokio::test(start_paused = true)]
    async fn terms_lost_counts_only_terms_the_store_ended() {
        let mut registry = Registry::default();
        let metrics = ElectionMetrics::register(&mut registry);
        let store = MemoryBackend::new();
        let elector = |name: &str| {
            let locker = Locker::with_identity(store.clone(), "me").expect("identity");
            LeaderElector::new(locker, name, ElectionConfig::new())
                .expect("valid config")
                .with_metrics(metrics.clone())
        };
        elector("kept")
            .run(|_term| async {})
            .await
            .expect("returned");
        let thief = store.clone();
        let lost = elector("taken")
            .run(|term| {
                thief.steal("taken", "other", Duration::from_secs(15));
                async move { term.cancellation().cancelled().await }
            })
            .await;
        assert!(lost.is_err(), "the stolen term ends as lost: {lost:?}");
        let text = text(&registry);
        let lost = |name: &str| {
            sample(
                &text,
                &format!("tenure_terms_lost_total{{name=\"{name}\"}}"),
            )
        };
        assert_eq!(
            lost("kept"),
            Some(0.0),
            "a released term is not lost: {text}"
        );
        assert_eq!(lost("taken"), Some(1.0), "{text}");
        let token = |name: &str| sample(&text, &format!("tenure_fencing_token{{name=\"{name}\"}}"));
        let (kept, taken) = (
            token("kept").expect("a term"),
            token("taken").expect("a term"),
        );
        assert!(
            kept >= 1.0 && taken > kept,
            "tokens rise across terms of one store: {text}"
        );
    }

    /// With the default 15 s lease duration the acquire window is 60 s.
    #[tokio::test(start_paused = true)]
    async fn retried_campaigns_count_terms_won_after_a_whole_acquire_window() {
        let mut registry = Registry::default();
        let metrics = ElectionMetrics::register(&mut registry);
        let started = tokio::time::Instant::now();
        lead_after_holder(&metrics, "free", None).await;
        lead_after_holder(&metrics, "short", Some(Duration::from_secs(40))).await;
        lead_after_holder(&metrics, "long", Some(Duration::from_secs(90))).await;
        assert!(started.elapsed() >= Duration::from_secs(130));
        let text = text(&registry);
        let count = |name: &str| {
            sample(
                &text,
                &format!("tenure_retried_campaigns_total{{name=\"{name}\"}}"),
            )
        };
        assert_eq!(count("free"), Some(0.0), "won at once: {text}");
        assert_eq!(
            count("short"),
            Some(0.0),
            "won within the first window (a 40 s wait is not a retry): {text}"
        );
        assert_eq!(count("long"), Some(1.0), "won in the second window: {text}");
        for name in ["free", "short", "long"] {
            assert_eq!(
                sample(
                    &text,
                    &format!("tenure_leader_transitions_total{{name=\"{name}\"}}")
                ),
                Some(1.0),
                "{text}"
            );
        }
        let waited = |name: &str| {
            sample(
                &text,
                &format!("tenure_acquire_latency_seconds_sum{{name=\"{name}\"}}"),
            )
            .expect("one campaign")
        };
        assert!(waited("free") < 1.0, "{text}");
        assert!((40.0..60.0).contains(&waited("short")), "{text}");
        assert!(waited("long") >= 90.0, "{text}");
    }
}
