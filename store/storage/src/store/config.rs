//! Everything a [`Store`](crate::Store) can be tuned with, and the defaults.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kiln_engine::IngestLimits;
use kiln_engine::recording::RecordingRules;
use kiln_pprof::DecodeLimits;

use crate::error::StorageError;

/// Which profile times ingest accepts. A profile time far in the future
/// would keep its block, and every block compacted from it, past retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptedTimes {
    /// `[now - retention, now + max_future_skew]` on the store's clock: a
    /// later time would give its block (and every block compacted from it)
    /// a `max_time` retention never reaches; an older one would be deleted
    /// by the next retention pass.
    Recent {
        /// How far past the store's clock a profile's time may be.
        max_future_skew: Duration,
    },
    /// Any time: for loading history on purpose (tests and benchmarks with
    /// fixed timestamps). Retention still applies to the blocks.
    Any,
}

/// Store configuration. Build with [`StoreConfig::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Local directory for this replica's write-ahead log (`<data_dir>/wal`).
    pub data_dir: PathBuf,
    /// This replica's name, stored in every block it writes and the prefix
    /// its blocks are written under. Replicas sharing a bucket must use
    /// distinct names: each compacts only its own blocks. A store refuses to
    /// open while another live process holds the name's lease.
    pub replica: String,
    /// The store these replicas form, claimed in the bucket prefix
    /// (`kiln-store.json`): a store of another name refuses the prefix.
    /// `None` claims and checks nothing.
    pub store_name: Option<String>,
    /// How long a lease in the bucket (this replica name's, or retention's)
    /// lasts without renewal; the holder renews it every third of this. A
    /// store that crashed on another disk frees its name once another
    /// process has seen its last generation unrenewed for this long plus a
    /// third (`lease::takeover_after`), measured on that process's clock.
    pub lease_ttl: Duration,
    /// How often the head is cut into a block and uploaded. This bounds how
    /// stale other replicas' view of this replica's data can be.
    pub flush_interval: Duration,
    /// Cut the head early once it holds about this many bytes.
    pub max_head_bytes: usize,
    /// Shards of the live head (1 to 16): ingests bound for different
    /// shards apply in parallel. Default: the cores available, at most 8.
    pub head_shards: usize,
    /// Start a new WAL segment once the current one exceeds this size.
    pub wal_segment_bytes: u64,
    /// How often the bucket is listed again to see other replicas' blocks.
    pub relist_interval: Duration,
    /// How often compaction is planned.
    pub compaction_interval: Duration,
    /// How long after an hour (or day) ends before it is compacted, so
    /// every replica has flushed its level-0 blocks for it.
    pub compaction_settle: Duration,
    /// Blocks whose newest sample is older than this are deleted; ingest
    /// refuses profiles older than this.
    pub retention: Duration,
    /// Which profile times ingest accepts.
    pub accepted_times: AcceptedTimes,
    /// How long one query may read heads and blocks before it is stopped
    /// with an error (never answered partially).
    pub query_timeout: Duration,
    /// Optional cap on the bucket's total block bytes; oldest blocks go first.
    pub max_total_bytes: Option<u64>,
    /// How often retention is enforced.
    pub retention_interval: Duration,
    /// Budget for decoded blocks kept in memory, counted by their decoded
    /// size (`Block::approx_decoded_bytes`). A single block larger than the
    /// budget is still kept while it is the only entry. Blocks larger than
    /// an eighth of it are opened by range: their tables, series directory
    /// and index are held, and queries read the blobs they need from the
    /// bucket. Compaction stops merging sources before what the merged
    /// block would hold opened that way passes the budget.
    pub block_cache_bytes: u64,
    /// Memory one compaction may use: the merge takes a group's blocks,
    /// smallest first, while its projected peak fits
    /// (`kiln_engine::compact_streaming_within`), so compaction memory does
    /// not grow with the data.
    pub compaction_memory_bytes: u64,
    /// Limits applied while decoding pprof.
    pub decode_limits: DecodeLimits,
    /// Limits applied by the engine while ingesting. Its series limits
    /// count every series the store retains (the live head, the heads
    /// waiting for upload and the blocks within retention), not only the
    /// live head's.
    pub ingest_limits: IngestLimits,
    /// Bytes that cut heads waiting for upload may hold on top of the live
    /// head's `max_head_bytes`. Once the live head and the waiting heads
    /// together reach both, ingest is refused as overload (retryable) until
    /// uploads drain, so a bucket outage cannot grow memory without bound
    /// until the store is killed. It also bounds what the WAL holds beyond
    /// the bucket, and so what a replay rebuilds.
    pub max_pending_upload_bytes: u64,
    /// How long `Store::open` waits for the bucket's first listing. Past it
    /// (or when the listing fails) the store opens with the WAL replayed and
    /// no blocks, lists again in the background, and says so in its health.
    pub open_listing_timeout: Duration,
    /// Ingests allowed in flight at once; more are refused as overload.
    pub max_inflight_ingests: usize,
    /// Ingests decoding or applying at once; the rest of those in flight
    /// wait for a turn (reading their bodies and waiting on the WAL take
    /// none). More turns than cores buy no speed, only more decoded
    /// profiles alive at once. Default: the cores available.
    pub ingest_workers: usize,
    /// Queries reading heads and blocks at once; more wait for a turn
    /// within their deadline. Each holds a core while it runs; the default,
    /// half the cores (at least one), leaves the rest to ingest and
    /// compaction however many queries arrive.
    pub max_running_queries: usize,
    /// Memory all ingests in flight may reserve together for their bodies
    /// and decoded profiles; an ingest that does not fit now is refused as
    /// overload, one that can never fit as a client error.
    pub ingest_memory_bytes: u64,
    /// Memory the queries running at once may hold for what they build:
    /// each may hold its share, this over `max_running_queries`
    /// ([`StoreConfig::query_held_bytes`]), and one that would hold more
    /// is refused as too large instead of growing until the store is
    /// killed.
    pub query_memory_bytes: u64,
    /// Recording rules, evaluated at ingest and on replay.
    pub recording_rules: Arc<RecordingRules>,
    /// How long recorded series are kept (their own retention, usually
    /// longer than the profiles').
    pub recorded_retention: Duration,
    /// Run the background loops (flush, compaction, retention, re-listing).
    /// Benchmarks and some tests drive these by hand instead.
    pub background: bool,
}

impl StoreConfig {
    /// Defaults: flush every 60 s (or at 256 MiB), re-list every 15 s,
    /// compact every 5 min, keep 14 days, accept times up to 10 min ahead, 256 MiB block cache (counted in
    /// decoded bytes).
    pub fn new(data_dir: impl Into<PathBuf>, replica: impl Into<String>) -> Self {
        Self {
            data_dir: data_dir.into(),
            replica: replica.into(),
            store_name: None,
            lease_ttl: Duration::from_secs(30),
            flush_interval: Duration::from_secs(60),
            max_head_bytes: 256 << 20,
            head_shards: std::thread::available_parallelism().map_or(1, |n| n.get().min(8)),
            wal_segment_bytes: 64 << 20,
            relist_interval: Duration::from_secs(15),
            compaction_interval: Duration::from_secs(300),
            compaction_settle: Duration::from_secs(300),
            retention: Duration::from_secs(14 * 24 * 3600),
            query_timeout: Duration::from_secs(30),
            accepted_times: AcceptedTimes::Recent {
                max_future_skew: Duration::from_secs(600),
            },
            max_total_bytes: None,
            retention_interval: Duration::from_secs(600),
            block_cache_bytes: 256 << 20,
            compaction_memory_bytes: 1 << 30,
            decode_limits: DecodeLimits::default(),
            ingest_limits: IngestLimits::default(),
            max_inflight_ingests: 256,
            ingest_workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            max_running_queries: std::thread::available_parallelism()
                .map_or(1, |cores| (cores.get() / 2).max(1)),
            ingest_memory_bytes: 512 << 20,
            query_memory_bytes: 256 << 20,
            max_pending_upload_bytes: 256 << 20,
            open_listing_timeout: Duration::from_secs(10),
            recording_rules: Arc::new(RecordingRules::none()),
            recorded_retention: Duration::from_secs(90 * 24 * 3600),
            background: true,
        }
    }

    /// Splits one memory budget (the store's whole allowance, e.g. its
    /// container's limit less headroom) over the parts that scale with
    /// configuration: an eighth for the live head, a sixteenth more for cut
    /// heads waiting for upload (`max_pending_upload_bytes`), three
    /// sixteenths for the block cache, and a quarter each for one
    /// compaction, for ingests being decoded (`ingest_memory_bytes`) and
    /// for what running queries build (`query_memory_bytes`). That is two
    /// sixteenths more than the whole: a compaction, a burst of large
    /// uploads and a query as large as its bound seldom peak at once, and
    /// each is bounded on its own; the runtime and the allocator's slack
    /// live in the headroom left outside the budget.
    pub fn apply_memory_budget(&mut self, budget_bytes: u64) {
        self.max_head_bytes = usize::try_from(budget_bytes / 8).unwrap_or(usize::MAX);
        self.max_pending_upload_bytes = budget_bytes / 16;
        self.block_cache_bytes = budget_bytes / 16 * 3;
        self.compaction_memory_bytes = budget_bytes / 4;
        self.ingest_memory_bytes = budget_bytes / 4;
        self.query_memory_bytes = budget_bytes / 4;
    }

    /// What one running query may hold: its share of `query_memory_bytes`.
    pub fn query_held_bytes(&self) -> usize {
        let share = self.query_memory_bytes / self.max_running_queries.max(1) as u64;
        usize::try_from(share).unwrap_or(usize::MAX)
    }

    pub(crate) fn validate(&self) -> Result<(), StorageError> {
        let bad = |message: &str| {
            Err(StorageError::Config {
                message: message.to_string(),
            })
        };
        // The name is a bucket path segment (`blocks/<replica>/`), read back
        // from listings: only characters no object store escapes.
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if self.replica.is_empty()
            || self.replica.len() > 253
            || !self.replica.chars().all(plain)
            || self.replica == "."
            || self.replica == ".."
        {
            return bad(
                "replica name must be 1 to 253 characters of letters, digits, '.', '_' and '-' (a host name is)",
            );
        }
        if let Some(name) = &self.store_name
            && (name.is_empty() || name.len() > 253 || name.chars().any(char::is_control))
        {
            return bad("store name must be 1 to 253 characters without control characters");
        }
        if self.lease_ttl < Duration::from_secs(3) {
            return bad("lease_ttl must be at least 3 s");
        }
        if self.flush_interval.is_zero() || self.relist_interval.is_zero() {
            return bad("flush and re-list intervals must be positive");
        }
        if self.compaction_interval.is_zero() || self.retention_interval.is_zero() {
            return bad("compaction and retention intervals must be positive");
        }
        if self.retention.is_zero() || self.recorded_retention.is_zero() {
            return bad("retention and recorded_retention must be positive");
        }
        if self.compaction_memory_bytes == 0
            || self.max_head_bytes == 0
            || self.max_pending_upload_bytes == 0
            || self.ingest_memory_bytes == 0
        {
            return bad(
                "compaction memory, ingest memory, head size and pending upload bytes must be positive",
            );
        }
        if self.max_inflight_ingests == 0
            || self.max_running_queries == 0
            || self.ingest_workers == 0
        {
            return bad(
                "max_inflight_ingests, max_running_queries and ingest_workers must be at least 1",
            );
        }
        Ok(())
    }
}

impl StoreConfig {
    /// Most series the census of retained series holds: twice
    /// `max_series`, so it holds everything this store's limits let in
    /// with room for the blocks other replicas write into a shared bucket.
    /// Full, it holds more series than the limit, so new ones are refused.
    pub(crate) fn series_census_capacity(&self) -> usize {
        self.ingest_limits.max_series.saturating_mul(2).max(1024)
    }
}

/// Milliseconds of a duration, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_names_are_plain_path_segments() {
        for good in ["kiln", "kiln-store-0", "node.example.com", "r_1"] {
            assert!(StoreConfig::new("/d", good).validate().is_ok(), "{good}");
        }
        for bad in ["", "a/b", "..", "name with space", "caf\u{e9}", "50%"] {
            assert!(StoreConfig::new("/d", bad).validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ingest_needs_at_least_one_worker() {
        let mut config = StoreConfig::new("/d", "kiln");
        assert!(config.ingest_workers >= 1);
        config.ingest_workers = 0;
        let err = config.validate().expect_err("no workers is refused");
        assert!(err.to_string().contains("ingest_workers"), "{err}");
    }
}
