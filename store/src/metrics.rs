//! Prometheus metrics, kept in `prometheus-client` counters, gauges and a
//! latency histogram family and written in the Prometheus text format
//! (0.0.4) by that library.

mod idempotency;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::symbolize::metrics::SymbolizationMetrics;

/// Upper bounds (seconds) of the query latency buckets.
const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// One fixed label (`protocol`, `endpoint`, `reason`).
type OneLabel = [(&'static str, &'static str); 1];
/// `endpoint` and `reason` of a refused request.
type RejectionLabels = [(&'static str, &'static str); 2];
/// The OTLP revisions that read an export the same way (a handful of
/// combinations of the known layouts).
type RevisionLabel = [(&'static str, String); 1];
/// A gauge read as an unsigned total.
type U64Gauge = Gauge<u64, AtomicU64>;

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The server's metrics; cheap to update from any task.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    ingested_profiles: Family<OneLabel, Counter>,
    ingested_samples: Family<OneLabel, Counter>,
    ingested_bytes: Family<OneLabel, Counter>,
    rejections: Family<RejectionLabels, Counter>,
    otlp_revisions: Family<RevisionLabel, Counter>,
    query_latency: Family<OneLabel, Histogram, fn() -> Histogram>,
    /// Storage state, set from [`StorageGauges`] at each scrape.
    storage: [U64Gauge; STORAGE_GAUGES.len()],
    connections: Arc<ConnectionStats>,
    symbolization: Arc<SymbolizationMetrics>,
    idempotency: idempotency::IdempotencyMetrics,
}

/// Connections of the store's ports, counted by the accept loop.
#[derive(Debug)]
pub struct ConnectionStats {
    open: U64Gauge,
    closed: Family<OneLabel, Counter>,
}

/// One open connection; counted until dropped.
#[derive(Debug)]
pub struct OpenConnection(Arc<ConnectionStats>);

impl ConnectionStats {
    fn new() -> Self {
        let closed = Family::default();
        // Every reason is exposed from the start, at 0.
        for reason in ["no_request", "idle", "evicted"] {
            drop(closed.get_or_create(&[("reason", reason)]));
        }
        ConnectionStats {
            open: U64Gauge::default(),
            closed,
        }
    }

    /// Counts a connection open until the guard is dropped.
    pub fn opened(self: &Arc<Self>) -> OpenConnection {
        self.open.inc();
        OpenConnection(Arc::clone(self))
    }

    /// Counts a connection closed because no request started in time.
    pub fn closed_without_request(&self) {
        self.closed.get_or_create(&[("reason", "no_request")]).inc();
    }

    /// Counts a connection closed after its idle timeout.
    pub fn closed_idle(&self) {
        self.closed.get_or_create(&[("reason", "idle")]).inc();
    }

    /// Counts an idle connection closed at the cap to make room for a
    /// client that was waiting.
    pub fn closed_evicted(&self) {
        self.closed.get_or_create(&[("reason", "evicted")]).inc();
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.dec();
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
    /// Damaged WAL segments moved aside at recovery.
    pub quarantined_wal_segments: u64,
    /// WAL writes and fsyncs that failed since start.
    pub wal_failed_writes: u64,
    /// Compactions skipped for want of free disk space since start.
    pub compactions_skipped_low_disk: u64,
    /// Heads cut but not uploaded yet.
    pub pending_uploads: u64,
    /// Requests in flight (ingest and queries).
    pub inflight_requests: u64,
    /// Queries in flight.
    pub inflight_queries: u64,
    /// The retention in effect (`--retention`), in seconds; 0 until open.
    pub retention_seconds: u64,
    /// The size retention in effect (`--retention-bytes`); 0 when none.
    pub retention_bytes: u64,
    /// Series the store retains (heads and blocks), which the series
    /// limits count.
    pub retained_series: u64,
    /// Approximate bytes of the census of retained series.
    pub series_census_bytes: u64,
    /// Blocks whose series the census could not read at the last listing.
    pub series_census_unreadable_blocks: u64,
    /// What idempotency keys did since start (counters, not gauges).
    pub keys: kiln_storage::store::KeyStats,
}

/// Name and help of each storage gauge, in [`StorageGauges::values`] order.
const STORAGE_GAUGES: [(&str, &str); 19] = [
    (
        "kiln_ready",
        "1 while /readyz is 200: recovered, the WAL takes writes, the bucket answers",
    ),
    ("kiln_head_bytes", "Approximate bytes in the in-memory head"),
    ("kiln_head_profiles", "Profiles in the in-memory head"),
    ("kiln_blocks", "Blocks visible to queries (all replicas)"),
    (
        "kiln_storage_bytes",
        "Bytes of stored blocks (all replicas)",
    ),
    (
        "kiln_corrupt_blocks",
        "Blocks skipped because they are corrupt",
    ),
    (
        "kiln_ingest_memory_reserved_bytes",
        "Bytes reserved by ingests being decoded and applied (bounded by a quarter of --memory-budget)",
    ),
    (
        "kiln_wal_quarantined_records",
        "WAL records set aside at recovery (under <data dir>/wal-quarantine) because they could not be replayed",
    ),
    (
        "kiln_wal_quarantined_segments",
        "Damaged WAL segments (torn or corrupt tail, no header) moved whole to <data dir>/wal-quarantine/segments at recovery; their records before the damage were replayed",
    ),
    (
        "kiln_wal_failed_writes",
        "WAL writes and fsyncs that failed since start; each refused writes until a fresh segment was started",
    ),
    (
        "kiln_compactions_skipped_low_disk",
        "Compactions skipped since start because their spill file would have left too little free space on the data directory's disk",
    ),
    ("kiln_pending_uploads", "Heads cut but not yet uploaded"),
    (
        "kiln_inflight_requests",
        "Requests being processed (ingest and queries)",
    ),
    (
        "kiln_inflight_queries",
        "Queries being processed (at most --max-inflight-queries)",
    ),
    (
        "kiln_retention_seconds",
        "Profiles older than this are deleted (--retention); 0 until the store is open",
    ),
    (
        "kiln_retention_bytes",
        "The oldest blocks are deleted past this many bytes (--retention-bytes); 0 when unset",
    ),
    (
        "kiln_retained_series",
        "Series the store retains (live head, heads waiting for upload, blocks within retention): what --max-series and the other series limits count",
    ),
    (
        "kiln_series_census_bytes",
        "Approximate bytes of the census of retained series",
    ),
    (
        "kiln_series_census_unreadable_blocks",
        "Blocks whose series could not be read for the series census at the last listing (their series are not counted; retried at the next)",
    ),
];

impl StorageGauges {
    fn values(&self) -> [u64; STORAGE_GAUGES.len()] {
        [
            u64::from(self.ready),
            self.head_bytes,
            self.head_profiles,
            self.blocks,
            self.block_bytes,
            self.corrupt_blocks,
            self.ingest_memory_reserved_bytes,
            self.quarantined_wal_records,
            self.quarantined_wal_segments,
            self.wal_failed_writes,
            self.compactions_skipped_low_disk,
            self.pending_uploads,
            self.inflight_requests,
            self.inflight_queries,
            self.retention_seconds,
            self.retention_bytes,
            self.retained_series,
            self.series_census_bytes,
            self.series_census_unreadable_blocks,
        ]
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Metrics {
            registry: Registry::default(),
            ingested_profiles: Family::default(),
            ingested_samples: Family::default(),
            ingested_bytes: Family::default(),
            rejections: Family::default(),
            otlp_revisions: Family::default(),
            query_latency: Family::new_with_constructor(latency_histogram),
            storage: Default::default(),
            connections: Arc::new(ConnectionStats::new()),
            symbolization: Arc::new(SymbolizationMetrics::default()),
            idempotency: idempotency::IdempotencyMetrics::default(),
        };
        metrics.registered()
    }
}

impl Metrics {
    /// Registers every metric. The library appends `_total` to counter
    /// names and a `.` to help texts.
    fn registered(mut self) -> Self {
        let registry = &mut self.registry;
        registry.register(
            "kiln_ingested_profiles",
            "Profiles accepted, by protocol",
            self.ingested_profiles.clone(),
        );
        registry.register(
            "kiln_ingested_samples",
            "Sample values stored, by protocol",
            self.ingested_samples.clone(),
        );
        registry.register(
            "kiln_ingested_bytes",
            "Profile bytes accepted (as received), by protocol",
            self.ingested_bytes.clone(),
        );
        registry.register(
            "kiln_rejected_requests",
            "Requests refused, by endpoint and reason",
            self.rejections.clone(),
        );
        registry.register(
            "kiln_otlp_export_requests",
            "OTLP profiles exports decoded, by the v1development revisions that read them the same way",
            self.otlp_revisions.clone(),
        );
        registry.register(
            "kiln_query_duration_seconds",
            "Query latency, by endpoint",
            self.query_latency.clone(),
        );
        for ((name, help), gauge) in STORAGE_GAUGES.iter().zip(&self.storage) {
            registry.register(*name, *help, gauge.clone());
        }
        registry.register(
            "kiln_open_connections",
            "Connections open on the store's ports",
            self.connections.open.clone(),
        );
        registry.register(
            "kiln_closed_connections",
            "Connections the store closed, by reason: no request started within --header-read-timeout, or none in flight for --idle-timeout",
            self.connections.closed.clone(),
        );
        self.symbolization.register(registry);
        self.idempotency.register(registry);
        self
    }

    /// The counts the symbolizer updates.
    pub fn symbolization(&self) -> Arc<SymbolizationMetrics> {
        Arc::clone(&self.symbolization)
    }

    /// The connection counts the accept loop updates.
    pub fn connections(&self) -> Arc<ConnectionStats> {
        Arc::clone(&self.connections)
    }

    /// Counts one accepted profile.
    pub fn record_ingest(&self, protocol: &'static str, samples: u64, bytes: u64) {
        let label = [("protocol", protocol)];
        self.ingested_profiles.get_or_create(&label).inc();
        self.ingested_samples.get_or_create(&label).inc_by(samples);
        self.ingested_bytes.get_or_create(&label).inc_by(bytes);
    }

    /// Counts one refused request.
    pub fn record_rejection(&self, endpoint: &'static str, reason: &'static str) {
        self.rejections
            .get_or_create(&[("endpoint", endpoint), ("reason", reason)])
            .inc();
    }

    /// Counts one OTLP export request decoded as `revision` (a
    /// `DecodedExport::revision_label`).
    pub fn record_otlp_revision(&self, revision: String) {
        self.otlp_revisions
            .get_or_create(&[("revision", revision)])
            .inc();
    }

    /// Records how long one query took.
    pub fn record_query(&self, endpoint: &'static str, elapsed: Duration) {
        self.query_latency
            .get_or_create(&[("endpoint", endpoint)])
            .observe(elapsed.as_secs_f64());
    }

    /// The exposition text, with `gauges` as the storage gauges.
    pub fn render(&self, gauges: &StorageGauges) -> String {
        for (gauge, value) in self.storage.iter().zip(gauges.values()) {
            gauge.set(value);
        }
        self.idempotency.set(&gauges.keys);
        let mut out = String::with_capacity(4096);
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
    fn exposition_contains_counters_histogram_and_gauges() {
        let metrics = Metrics::default();
        metrics.record_ingest("push", 20, 700);
        metrics.record_ingest("push", 5, 300);
        metrics.record_rejection("ingest", "bad_name");
        metrics.record_query("flamegraph", Duration::from_millis(3));
        let text = metrics.render(&StorageGauges {
            ready: true,
            block_bytes: 1234,
            retention_seconds: 259_200,
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
        assert!(text.contains("kiln_retention_seconds 259200\n"), "{text}");
        assert!(text.contains("kiln_retention_bytes 0\n"), "{text}");
        assert!(text.contains(
            "# HELP kiln_ingested_profiles_total Profiles accepted, by protocol.\n\
             # TYPE kiln_ingested_profiles_total counter\n"
        ));
        assert!(text.contains("# TYPE kiln_query_duration_seconds histogram\n"));
        assert!(text.contains(
            "kiln_query_duration_seconds_bucket{endpoint=\"flamegraph\",le=\"+Inf\"} 1\n"
        ));
        assert!(text.contains("kiln_query_duration_seconds_count{endpoint=\"flamegraph\"} 1\n"));
        assert!(text.contains("# TYPE kiln_head_bytes gauge\nkiln_head_bytes 0\n"));
        assert!(text.contains("# TYPE kiln_retained_series gauge\nkiln_retained_series 0\n"));
        assert!(
            text.contains("kiln_closed_connections_total{reason=\"no_request\"} 0\n"),
            "both reasons are there from the start: {text}"
        );
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
