//! The symbolizer's metrics, registered on the store's `/metrics` by
//! [`crate::metrics::Metrics`]: lookups by source and result, debuginfod
//! fetch latency, the cache's size and the answers sent before their
//! symbols were ready.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of the debuginfod fetch buckets: a local server
/// answers in milliseconds, a large file from afar in tens of seconds,
/// and `--debuginfod-timeout` ends it at 30 s by default.
const FETCH_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];

/// Where a lookup looked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupSource {
    /// The resolved-address cache, once per distinct address of a merge.
    Cache,
    /// The debug files kept in the bucket (uploaded, or fetched from
    /// debuginfod before), once per build id a job looks for.
    Bucket,
    /// One debuginfod server, once per build id and server asked.
    Debuginfod,
}

impl LookupSource {
    const ALL: [Self; 3] = [Self::Cache, Self::Bucket, Self::Debuginfod];

    fn label(self) -> &'static str {
        match self {
            Self::Cache => "cache",
            Self::Bucket => "bucket",
            Self::Debuginfod => "debuginfod",
        }
    }
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupResult {
    /// The names, or the debug file.
    Hit,
    /// Nothing there (for the cache: the address must be looked up).
    Miss,
    /// The source failed to answer (a bucket or server error, a timeout,
    /// a file over the size cap).
    Error,
}

impl LookupResult {
    const ALL: [Self; 3] = [Self::Hit, Self::Miss, Self::Error];

    fn label(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::Error => "error",
        }
    }
}

/// `source` and `result` of a lookup.
type LookupLabels = [(&'static str, &'static str); 2];

/// The symbolizer's counters; updated from any task.
#[derive(Debug)]
pub struct SymbolizationMetrics {
    lookups: Family<LookupLabels, Counter>,
    fetch_seconds: Histogram,
    cache_bytes: Gauge<u64, AtomicU64>,
    pending_answers: Counter,
}

impl Default for SymbolizationMetrics {
    fn default() -> Self {
        let lookups = Family::default();
        // Every combination is exposed from the start, at 0, so a rate
        // over a fresh store reads 0, not "no data".
        for source in LookupSource::ALL {
            for result in LookupResult::ALL {
                drop(
                    lookups
                        .get_or_create(&[("source", source.label()), ("result", result.label())]),
                );
            }
        }
        Self {
            lookups,
            fetch_seconds: Histogram::new(FETCH_BUCKETS),
            cache_bytes: Gauge::default(),
            pending_answers: Counter::default(),
        }
    }
}

impl SymbolizationMetrics {
    /// Registers every metric in `registry` (the library appends `_total`
    /// to counter names).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_symbolization_lookups",
            "Symbol lookups at query time, by source (cache: per distinct address of a merge; bucket: per build id, uploaded or fetched before; debuginfod: per build id and server) and result (hit, miss, error)",
            self.lookups.clone(),
        );
        registry.register(
            "kiln_symbolization_debuginfod_fetch_seconds",
            "Time of each debuginfod request, whatever it answered",
            self.fetch_seconds.clone(),
        );
        registry.register(
            "kiln_symbolization_cache_bytes",
            "Approximate bytes of resolved addresses the symbol cache holds (bounded by --symbol-cache-bytes)",
            self.cache_bytes.clone(),
        );
        registry.register(
            "kiln_symbolization_pending_answers",
            "Query answers sent before their symbols were ready (marked Kiln-Partial: symbols_pending)",
            self.pending_answers.clone(),
        );
    }

    /// Counts `count` lookups in `source` that ended in `result`.
    pub fn lookups(&self, source: LookupSource, result: LookupResult, count: u64) {
        if count > 0 {
            self.lookups
                .get_or_create(&[("source", source.label()), ("result", result.label())])
                .inc_by(count);
        }
    }

    /// Records one debuginfod request's time.
    pub fn debuginfod_fetch(&self, elapsed: Duration) {
        self.fetch_seconds.observe(elapsed.as_secs_f64());
    }

    /// Sets the cache's size.
    pub fn cache_bytes(&self, bytes: usize) {
        self.cache_bytes.set(bytes as u64);
    }

    /// Counts one answer sent with symbols pending.
    pub fn pending_answer(&self) {
        self.pending_answers.inc();
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::prometheus_text::encode;

    use super::*;

    #[test]
    fn every_lookup_label_is_exposed_and_counts_move() {
        let metrics = SymbolizationMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.lookups(LookupSource::Cache, LookupResult::Hit, 3);
        metrics.lookups(LookupSource::Debuginfod, LookupResult::Miss, 1);
        metrics.debuginfod_fetch(Duration::from_millis(7));
        metrics.cache_bytes(1234);
        metrics.pending_answer();
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        for line in [
            "kiln_symbolization_lookups_total{source=\"cache\",result=\"hit\"} 3\n",
            "kiln_symbolization_lookups_total{source=\"debuginfod\",result=\"miss\"} 1\n",
            "kiln_symbolization_lookups_total{source=\"bucket\",result=\"error\"} 0\n",
            "kiln_symbolization_debuginfod_fetch_seconds_bucket{le=\"0.01\"} 1\n",
            "kiln_symbolization_debuginfod_fetch_seconds_bucket{le=\"0.005\"} 0\n",
            "kiln_symbolization_cache_bytes 1234\n",
            "kiln_symbolization_pending_answers_total 1\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
