//! Operator metrics, kept in `prometheus-client` counters and a histogram
//! and written in the Prometheus text format (0.0.4) by that library.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// `kind` of a reconcile.
type KindLabel = [(&'static str, &'static str); 1];
/// `kind` and `reason` (failures) or `kind` and `verb` (writes).
type PairLabels = [(&'static str, &'static str); 2];

/// Upper bounds (seconds) of the reconcile duration buckets: a no-op
/// reconcile takes milliseconds, one that applies a whole store a second or more.
const DURATION_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Counters of one operator process; shared by both controllers and the HTTP endpoint.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<KindLabel, Counter>,
    failures: Family<PairLabels, Counter>,
    writes: Family<PairLabels, Counter>,
    /// The sum of `writes` (the family cannot be iterated).
    all_writes: AtomicU64,
    duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let reconciles = Family::<KindLabel, Counter>::default();
        let failures = Family::<PairLabels, Counter>::default();
        let writes = Family::<PairLabels, Counter>::default();
        let duration = Histogram::new(DURATION_BUCKETS);
        let mut registry = Registry::default();
        // The library appends `_total` to counters and a `.` to help texts.
        registry.register(
            "kiln_operator_reconciles",
            "Reconciles run, by kind",
            reconciles.clone(),
        );
        registry.register(
            "kiln_operator_reconcile_failures",
            "Failed reconciles, by kind and reason",
            failures.clone(),
        );
        registry.register(
            "kiln_operator_writes",
            "API writes, by object kind and verb; flat while nothing changes",
            writes.clone(),
        );
        registry.register(
            "kiln_operator_reconcile_duration_seconds",
            "Time spent reconciling",
            duration.clone(),
        );
        Metrics {
            registry,
            reconciles,
            failures,
            writes,
            all_writes: AtomicU64::new(0),
            duration,
        }
    }
}

impl Metrics {
    /// Counts one reconcile of `kind` and how long it took.
    pub fn reconciled(&self, kind: &'static str, took: Duration) {
        self.reconciles.get_or_create(&[("kind", kind)]).inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// Counts one failed reconcile of `kind` with the error's fixed reason.
    pub fn failed(&self, kind: &'static str, reason: &'static str) {
        self.failures
            .get_or_create(&[("kind", kind), ("reason", reason)])
            .inc();
    }

    /// Counts one write (apply, patch, delete) of an object of `kind` by `verb`.
    pub fn wrote(&self, kind: &'static str, verb: &'static str) {
        self.writes
            .get_or_create(&[("kind", kind), ("verb", verb)])
            .inc();
        self.all_writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Total writes so far, for tests that prove no-op reconciles write nothing.
    pub fn total_writes(&self) -> u64 {
        self.all_writes.load(Ordering::Relaxed)
    }

    /// Failures of one kind and reason so far.
    pub fn failures(&self, kind: &'static str, reason: &'static str) -> u64 {
        self.failures
            .get(&[("kind", kind), ("reason", reason)])
            .map_or(0, |counter| counter.get())
    }

    /// Renders every metric in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(2048);
        // Writing into a String never fails.
        if let Err(error) = prometheus_text::encode(&mut out, &self.registry) {
            tracing::error!(%error, "encoding the metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_lists_counters_with_labels() {
        let metrics = Metrics::default();
        metrics.reconciled("ProfileStore", Duration::from_millis(1500));
        metrics.failed("ProfileStore", "kube");
        metrics.wrote("StatefulSet", "apply");
        metrics.wrote("StatefulSet", "apply");
        metrics.wrote("Service", "apply");
        let text = metrics.render();
        assert!(
            text.contains("kiln_operator_reconciles_total{kind=\"ProfileStore\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "kiln_operator_reconcile_failures_total{kind=\"ProfileStore\",reason=\"kube\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("kiln_operator_writes_total{kind=\"StatefulSet\",verb=\"apply\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "# HELP kiln_operator_writes_total API writes, by object kind and verb; flat while nothing changes.\n\
                 # TYPE kiln_operator_writes_total counter\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("kiln_operator_reconcile_duration_seconds_sum 1.5\n"),
            "{text}"
        );
        assert!(
            text.contains("kiln_operator_reconcile_duration_seconds_count 1\n"),
            "{text}"
        );
        assert!(
            text.contains("kiln_operator_reconcile_duration_seconds_bucket{le=\"1\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("kiln_operator_reconcile_duration_seconds_bucket{le=\"2.5\"} 1\n"),
            "{text}"
        );
        assert_eq!(metrics.total_writes(), 3);
        assert_eq!(metrics.failures("ProfileStore", "kube"), 1);
        assert_eq!(metrics.failures("ProfileStore", "other"), 0);
    }
}
