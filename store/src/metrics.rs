//! Prometheus metrics in the text exposition format, hand-written: a few
//! counters keyed by small label tuples and one latency histogram family.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Upper bounds (seconds) of the query latency buckets.
const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum_seconds: f64,
}

#[derive(Debug, Default)]
struct Inner {
    ingested_profiles: BTreeMap<&'static str, u64>,
    ingested_samples: BTreeMap<&'static str, u64>,
    ingested_bytes: BTreeMap<&'static str, u64>,
    rejections: BTreeMap<(&'static str, &'static str), u64>,
    query_latency: BTreeMap<&'static str, Histogram>,
    /// OTLP export requests by detected revision label (a handful of values:
    /// combinations of the known layouts).
    otlp_revisions: BTreeMap<String, u64>,
}

/// The server's metrics; cheap to update from any task.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
    connections: Arc<ConnectionStats>,
}

/// Connections of the store's ports, counted by the accept loop.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    open: AtomicU64,
    closed_without_request: AtomicU64,
    closed_idle: AtomicU64,
}

/// One open connection; counted until dropped.
#[derive(Debug)]
pub struct OpenConnection(Arc<ConnectionStats>);

impl ConnectionStats {
    /// Counts a connection open until the guard is dropped.
    pub fn opened(self: &Arc<Self>) -> OpenConnection {
        self.open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(Arc::clone(self))
    }

    /// Counts a connection closed because no request started in time.
    pub fn closed_without_request(&self) {
        self.closed_without_request.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection closed after its idle timeout.
    pub fn closed_idle(&self) {
        self.closed_idle.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String) {
        let open = self.open.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP kiln_open_connections Connections open on the store's ports.\n# TYPE kiln_open_connections gauge\nkiln_open_connections {open}"
        );
        let _ = writeln!(
            out,
            "# HELP kiln_closed_connections_total Connections the store closed, by reason: no request started within --header-read-timeout, or none in flight for --idle-timeout.\n# TYPE kiln_closed_connections_total counter"
        );
        for (reason, counter) in [
            ("no_request", &self.closed_without_request),
            ("idle", &self.closed_idle),
        ] {
            let value = counter.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "kiln_closed_connections_total{{reason=\"{reason}\"}} {value}"
            );
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Storage gauges read at scrape time.
#[derive(Debug, Clone, Copy, Default)]
pub struct StorageGauges {
    /// 1 once the store has recovered.
    pub ready: bool,
    /// Bytes in the head.
    pub head_bytes: u64,
    /// Profiles in the head.
    pub head_profiles: u64,
    /// Blocks visible to queries.
    pub blocks: u64,
    /// Bytes of those blocks.
    pub block_bytes: u64,
    /// Blocks skipped as corrupt.
    pub corrupt_blocks: u64,
    /// Bytes reserved by ingests being decoded.
    pub ingest_memory_reserved_bytes: u64,
    /// WAL records set aside at recovery because they could not be replayed.
    pub quarantined_wal_records: u64,
    /// Heads cut but not uploaded yet.
    pub pending_uploads: u64,
    /// Requests in flight (ingest and queries).
    pub inflight_requests: u64,
    /// Queries in flight.
    pub inflight_queries: u64,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave counters inconsistent
        // in a way that matters, so keep serving them.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection counts the accept loop updates.
    pub fn connections(&self) -> Arc<ConnectionStats> {
        Arc::clone(&self.connections)
    }

    /// Counts one accepted profile.
    pub fn record_ingest(&self, protocol: &'static str, samples: u64, bytes: u64) {
        let mut inner = self.lock();
        *inner.ingested_profiles.entry(protocol).or_default() += 1;
        *inner.ingested_samples.entry(protocol).or_default() += samples;
        *inner.ingested_bytes.entry(protocol).or_default() += bytes;
    }

    /// Counts one refused request.
    pub fn record_rejection(&self, endpoint: &'static str, reason: &'static str) {
        *self
            .lock()
            .rejections
            .entry((endpoint, reason))
            .or_default() += 1;
    }

    /// Counts one OTLP export request decoded as `revision` (a
    /// `DecodedExport::revision_label`).
    pub fn record_otlp_revision(&self, revision: String) {
        *self.lock().otlp_revisions.entry(revision).or_default() += 1;
    }

    /// Records how long one query took.
    pub fn record_query(&self, endpoint: &'static str, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let mut inner = self.lock();
        let histogram = inner.query_latency.entry(endpoint).or_default();
        histogram.count += 1;
        histogram.sum_seconds += seconds;
        for (bucket, bound) in histogram.buckets.iter_mut().zip(LATENCY_BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
    }

    /// The exposition text, with `gauges` appended.
    pub fn render(&self, gauges: &StorageGauges) -> String {
        let inner = self.lock().clone_for_render();
        let mut out = String::with_capacity(4096);
        counter_family(
            &mut out,
            "kiln_ingested_profiles_total",
            "Profiles accepted, by protocol.",
            &inner.ingested_profiles,
        );
        counter_family(
            &mut out,
            "kiln_ingested_samples_total",
            "Sample values stored, by protocol.",
            &inner.ingested_samples,
        );
        counter_family(
            &mut out,
            "kiln_ingested_bytes_total",
            "Profile bytes accepted (as received), by protocol.",
            &inner.ingested_bytes,
        );
        out.push_str(
            "# HELP kiln_rejected_requests_total Requests refused, by endpoint and reason.\n",
        );
        out.push_str("# TYPE kiln_rejected_requests_total counter\n");
        for ((endpoint, reason), value) in &inner.rejections {
            let _ = writeln!(
                out,
                "kiln_rejected_requests_total{{endpoint=\"{endpoint}\",reason=\"{reason}\"}} {value}"
            );
        }
        out.push_str(
            "# HELP kiln_otlp_export_requests_total OTLP profiles exports decoded, by the v1development revisions that read them the same way.\n",
        );
        out.push_str("# TYPE kiln_otlp_export_requests_total counter\n");
        for (revision, value) in &inner.otlp_revisions {
            let _ = writeln!(
                out,
                "kiln_otlp_export_requests_total{{revision=\"{revision}\"}} {value}"
            );
        }
        out.push_str("# HELP kiln_query_duration_seconds Query latency, by endpoint.\n");
        out.push_str("# TYPE kiln_query_duration_seconds histogram\n");
        for (endpoint, histogram) in &inner.query_latency {
            for (bound, count) in LATENCY_BUCKETS.iter().zip(histogram.buckets) {
                let _ = writeln!(
                    out,
                    "kiln_query_duration_seconds_bucket{{endpoint=\"{endpoint}\",le=\"{bound}\"}} {count}"
                );
            }
            let _ = writeln!(
                out,
                "kiln_query_duration_seconds_bucket{{endpoint=\"{endpoint}\",le=\"+Inf\"}} {}",
                histogram.count
            );
            let _ = writeln!(
                out,
                "kiln_query_duration_seconds_sum{{endpoint=\"{endpoint}\"}} {}",
                histogram.sum_seconds
            );
            let _ = writeln!(
                out,
                "kiln_query_duration_seconds_count{{endpoint=\"{endpoint}\"}} {}",
                histogram.count
            );
        }
        let gauge_rows: [(&str, &str, u64); 11] = [
            (
                "kiln_ready",
                "1 while /readyz is 200: recovered, the WAL takes writes, the bucket answers.",
                u64::from(gauges.ready),
            ),
            (
                "kiln_head_bytes",
                "Approximate bytes in the in-memory head.",
                gauges.head_bytes,
            ),
            (
                "kiln_head_profiles",
                "Profiles in the in-memory head.",
                gauges.head_profiles,
            ),
            (
                "kiln_blocks",
                "Blocks visible to queries (all replicas).",
                gauges.blocks,
            ),
            (
                "kiln_storage_bytes",
                "Bytes of stored blocks (all replicas).",
                gauges.block_bytes,
            ),
            (
                "kiln_corrupt_blocks",
                "Blocks skipped because they are corrupt.",
                gauges.corrupt_blocks,
            ),
            (
                "kiln_ingest_memory_reserved_bytes",
                "Bytes reserved by ingests being decoded and applied (bounded by a quarter of --memory-budget).",
                gauges.ingest_memory_reserved_bytes,
            ),
            (
                "kiln_wal_quarantined_records",
                "WAL records set aside at recovery (under <data dir>/wal-quarantine) because they could not be replayed.",
                gauges.quarantined_wal_records,
            ),
            (
                "kiln_pending_uploads",
                "Heads cut but not yet uploaded.",
                gauges.pending_uploads,
            ),
            (
                "kiln_inflight_requests",
                "Requests being processed (ingest and queries).",
                gauges.inflight_requests,
            ),
            (
                "kiln_inflight_queries",
                "Queries being processed (at most --max-inflight-queries).",
                gauges.inflight_queries,
            ),
        ];
        for (name, help, value) in gauge_rows {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        self.connections.render(&mut out);
        out
    }
}

impl Inner {
    fn clone_for_render(&self) -> Inner {
        Inner {
            ingested_profiles: self.ingested_profiles.clone(),
            ingested_samples: self.ingested_samples.clone(),
            ingested_bytes: self.ingested_bytes.clone(),
            rejections: self.rejections.clone(),
            query_latency: self.query_latency.clone(),
            otlp_revisions: self.otlp_revisions.clone(),
        }
    }
}

fn counter_family(out: &mut String, name: &str, help: &str, values: &BTreeMap<&'static str, u64>) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (protocol, value) in values {
        let _ = writeln!(out, "{name}{{protocol=\"{protocol}\"}} {value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_contains_counters_histogram_and_gauges() {
        let metrics = Metrics::default();
        metrics.record_ingest("push", 20, 700);
        metrics.record_ingest("push", 5, 300);
        metrics.record_rejection("ingest", "bad_name");
        metrics.record_query("flamegraph", Duration::from_millis(3));
        let text = metrics.render(&StorageGauges {
            ready: true,
            block_bytes: 1234,
            ..StorageGauges::default()
        });
        assert!(
            text.contains("kiln_ingested_profiles_total{protocol=\"push\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("kiln_ingested_samples_total{protocol=\"push\"} 25\n"));
        assert!(
            text.contains(
                "kiln_rejected_requests_total{endpoint=\"ingest\",reason=\"bad_name\"} 1\n"
            )
        );
        assert!(text.contains(
            "kiln_query_duration_seconds_bucket{endpoint=\"flamegraph\",le=\"0.0025\"} 0\n"
        ));
        assert!(text.contains(
            "kiln_query_duration_seconds_bucket{endpoint=\"flamegraph\",le=\"0.005\"} 1\n"
        ));
        assert!(text.contains("kiln_storage_bytes 1234\n"));
        assert!(text.contains("kiln_ready 1\n"));
        let open = metrics.connections().opened();
        metrics.connections().closed_idle();
        let text = metrics.render(&StorageGauges::default());
        assert!(text.contains("kiln_open_connections 1\n"), "{text}");
        assert!(text.contains("kiln_closed_connections_total{reason=\"idle\"} 1\n"));
        drop(open);
        let text = metrics.render(&StorageGauges::default());
        assert!(text.contains("kiln_open_connections 0\n"), "{text}");
    }
}
