//! Keeping the census of retained series (`ingest::live_head`'s
//! `SeriesLedger`) in step with the view: at open and after each listing,
//! the series of blocks it has not counted (other replicas' blocks, blocks
//! of an earlier run) are read from their string table and series
//! directory alone, and series whose newest data is past retention are
//! forgotten.
//!
//! Reading a block's series holds its strings and directory, reserved
//! from the ingest memory budget first; a block that cannot be read (the
//! bucket fails, the budget is busy, the block is damaged) never stops
//! ingest: its series are unknown until a later listing reads them, and
//! counted in `SeriesCensusStats::unreadable_blocks` meanwhile. One pass
//! reads blocks for at most `StoreConfig::open_listing_timeout`, so a slow
//! bucket cannot hold up open or the maintenance loop; the blocks it did
//! not reach wait for the next pass.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use kiln_engine::BlockSeriesDirectory;
use kiln_engine::model::BlockMeta;

use crate::bucket::BucketRanges;
use crate::memory_gate::Reservation;
use crate::store::config::millis;
use crate::store::{Shared, Store, now_ms, read};

/// What the ledger holds, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeriesCensusStats {
    /// Series retained (live head, heads waiting for upload, blocks).
    pub series: u64,
    /// Namespaces with a retained series.
    pub namespaces: u64,
    /// Approximate heap bytes of the census.
    pub bytes: u64,
    /// Blocks whose series could not be read at the last listing.
    pub unreadable_blocks: u64,
    /// Series not recorded because the census was full.
    pub dropped_series: u64,
}

impl Store {
    /// Counts the series of the heads waiting for upload and of every
    /// listed block not counted yet, and forgets series past retention.
    pub(in crate::store) async fn count_retained_series(&self) {
        let shared = Arc::clone(&self.shared);
        let runtime = tokio::runtime::Handle::current();
        let counted =
            tokio::task::spawn_blocking(move || count_retained_series(&shared, &runtime)).await;
        if let Err(err) = counted {
            tracing::warn!(error = %err, "counting the retained series failed");
        }
    }

    /// What the census of retained series holds, for metrics.
    pub fn series_census(&self) -> SeriesCensusStats {
        self.shared.ingest.head.census().stats()
    }
}

fn count_retained_series(shared: &Shared, runtime: &tokio::runtime::Handle) {
    let started = Instant::now();
    let oldest_kept_ms = now_ms().saturating_sub(millis(shared.config.retention));
    let (frozen, blocks) = {
        let view = read(&shared.catalog.view);
        let blocks: Vec<BlockMeta> = view.visible().cloned().collect();
        (view.frozen.clone(), blocks)
    };
    // Heads waiting for upload: at open, what replay cut; later, cuts of
    // the live head, whose series were noted as they were created.
    for pending in &frozen {
        shared.ingest.head.note_heads(&pending.heads);
    }
    let mut read_blocks = 0usize;
    let mut deferred = 0usize;
    for meta in &blocks {
        if meta.max_time_ms < oldest_kept_ms || shared.ingest.head.census().counts_block(&meta.id) {
            continue;
        }
        if started.elapsed() >= shared.config.open_listing_timeout {
            deferred += 1;
            continue;
        }
        match count_block(shared, runtime, meta, oldest_kept_ms) {
            Ok(()) => {
                read_blocks += 1;
                shared.ingest.head.census().note_block(&meta.id);
            }
            Err(error) => {
                tracing::warn!(block = %meta.id, %error, "a block's series could not be read for the series census; its series are not counted until a later listing reads them");
                shared.ingest.head.census().note_unreadable(&meta.id);
            }
        }
    }
    let mut census = shared.ingest.head.census();
    let listed: HashSet<&str> = blocks.iter().map(|b| b.id.as_str()).collect();
    census.keep_blocks(|id| listed.contains(id));
    let expired = census.expire(oldest_kept_ms);
    let stats = census.stats();
    drop(census);
    tracing::debug!(
        read_blocks,
        deferred,
        expired,
        series = stats.series,
        unreadable_blocks = stats.unreadable_blocks,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "series census updated"
    );
}

/// Notes block `meta`'s series within retention in the census.
fn count_block(
    shared: &Shared,
    runtime: &tokio::runtime::Handle,
    meta: &BlockMeta,
    oldest_kept_ms: i64,
) -> Result<(), String> {
    let ranges = BucketRanges::open(&shared.bucket, meta, runtime).map_err(|e| e.to_string())?;
    let directory = BlockSeriesDirectory::open(ranges).map_err(|e| e.to_string())?;
    let mut reservation = Reservation::default();
    let bytes = usize::try_from(directory.read_bytes()).unwrap_or(usize::MAX);
    shared
        .ingest
        .memory
        .reserve(&mut reservation, bytes)
        .map_err(|e| e.to_string())?;
    directory
        .for_each_series(|series| {
            if series.max_ms >= oldest_kept_ms {
                shared.ingest.head.census().note(
                    &series.labels,
                    &series.profile_name,
                    series.max_ms,
                );
            }
        })
        .map_err(|e| e.to_string())
}
