//! Operator metrics in the Prometheus text format, kept in plain atomics and a small map.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters of one operator process; shared by both controllers and the HTTP endpoint.
#[derive(Debug, Default)]
pub struct Metrics {
    reconciles: Mutex<BTreeMap<&'static str, u64>>,
    failures: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    writes: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    duration_micros_total: AtomicU64,
    duration_count: AtomicU64,
}

impl Metrics {
    /// Counts one reconcile of `kind` and how long it took.
    pub fn reconciled(&self, kind: &'static str, took: Duration) {
        bump(&self.reconciles, kind);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.duration_micros_total
            .fetch_add(micros, Ordering::Relaxed);
        self.duration_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one failed reconcile of `kind` with the error's fixed reason.
    pub fn failed(&self, kind: &'static str, reason: &'static str) {
        bump(&self.failures, (kind, reason));
    }

    /// Counts one write (apply, patch, delete) of an object of `kind` by `verb`.
    pub fn wrote(&self, kind: &'static str, verb: &'static str) {
        bump(&self.writes, (kind, verb));
    }

    /// Total writes so far, for tests that prove no-op reconciles write nothing.
    pub fn total_writes(&self) -> u64 {
        self.writes
            .lock()
            .map(|map| map.values().sum())
            .unwrap_or_default()
    }

    /// Failures of one kind and reason so far.
    pub fn failures(&self, kind: &'static str, reason: &'static str) -> u64 {
        self.failures
            .lock()
            .map(|map| map.get(&(kind, reason)).copied().unwrap_or_default())
            .unwrap_or_default()
    }

    /// Renders every metric in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP kiln_operator_reconciles_total Reconciles run, by kind.\n");
        out.push_str("# TYPE kiln_operator_reconciles_total counter\n");
        if let Ok(map) = self.reconciles.lock() {
            for (kind, count) in map.iter() {
                let _ = writeln!(
                    out,
                    "kiln_operator_reconciles_total{{kind=\"{kind}\"}} {count}"
                );
            }
        }
        out.push_str("# HELP kiln_operator_reconcile_failures_total Failed reconciles, by kind and reason.\n");
        out.push_str("# TYPE kiln_operator_reconcile_failures_total counter\n");
        if let Ok(map) = self.failures.lock() {
            for ((kind, reason), count) in map.iter() {
                let _ = writeln!(
                    out,
                    "kiln_operator_reconcile_failures_total{{kind=\"{kind}\",reason=\"{reason}\"}} {count}"
                );
            }
        }
        out.push_str("# HELP kiln_operator_writes_total API writes, by object kind and verb; flat while nothing changes.\n");
        out.push_str("# TYPE kiln_operator_writes_total counter\n");
        if let Ok(map) = self.writes.lock() {
            for ((kind, verb), count) in map.iter() {
                let _ = writeln!(
                    out,
                    "kiln_operator_writes_total{{kind=\"{kind}\",verb=\"{verb}\"}} {count}"
                );
            }
        }
        let micros = self.duration_micros_total.load(Ordering::Relaxed);
        let count = self.duration_count.load(Ordering::Relaxed);
        out.push_str("# HELP kiln_operator_reconcile_duration_seconds Time spent reconciling.\n");
        out.push_str("# TYPE kiln_operator_reconcile_duration_seconds summary\n");
        let _ = writeln!(
            out,
            "kiln_operator_reconcile_duration_seconds_sum {}.{:06}",
            micros / 1_000_000,
            micros % 1_000_000
        );
        let _ = writeln!(
            out,
            "kiln_operator_reconcile_duration_seconds_count {count}"
        );
        out
    }
}

fn bump<K: Ord>(map: &Mutex<BTreeMap<K, u64>>, key: K) {
    if let Ok(mut map) = map.lock() {
        *map.entry(key).or_default() += 1;
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
        let text = metrics.render();
        assert!(
            text.contains("kiln_operator_reconciles_total{kind=\"ProfileStore\"} 1"),
            "{text}"
        );
        assert!(text.contains("reason=\"kube\"} 1"), "{text}");
        assert!(
            text.contains("kiln_operator_reconcile_duration_seconds_sum 1.500000"),
            "{text}"
        );
        assert_eq!(metrics.total_writes(), 1);
        assert_eq!(metrics.failures("ProfileStore", "kube"), 1);
    }
}
