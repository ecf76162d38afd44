//! Keeping the bucket tidy: re-listing with this replica's cleanup,
//! compaction and retention. (The listing itself is the catalog's.)

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kiln_engine::model::BlockMeta;
use kiln_engine::{BlockCompression, BlockError, CompactionError, MergeLimits, MergeOutput};

use super::spill::{SpillFile, room_to_spill};
use crate::bucket::{BucketRanges, IncompleteUpload};
use crate::error::StorageError;
use crate::planner::{
    CompactionGroup, order_smallest_first, plan_compaction, plan_retention, read_window_bytes,
};
use crate::store::config::millis;
use crate::store::{Store, lock, now_ms, read, write};

/// This replica's incomplete uploads (data without meta.json, not being
/// uploaded now) older than this are garbage from a crashed process.
const ABANDONED_UPLOAD_MS: i64 = 3_600_000;

/// Beyond retention, how old an upload at the old layout must be before it
/// is deleted: its block's newest sample may be up to the accepted future
/// skew past its cut, so a day covers any configured skew.
const LEGACY_UPLOAD_SLACK_MS: i64 = 24 * 3_600_000;

/// When an upload's head was cut: its ULID's time.
fn started_ms(id: &str) -> i64 {
    ulid::Ulid::from_string(id).map_or(i64::MAX, |u| {
        i64::try_from(u.timestamp_ms()).unwrap_or(i64::MAX)
    })
}

/// What one compaction pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CompactionReport {
    /// Blocks written.
    pub written: Vec<BlockMeta>,
    /// Source blocks deleted.
    pub deleted: usize,
    /// Groups skipped because a source could not be read.
    pub skipped_groups: usize,
}

impl Store {
    /// Lists the bucket again so blocks written (or deleted) by other
    /// replicas become visible (or disappear). Then, holding this replica
    /// name's lease, removes this replica's leftovers: sources of its
    /// interrupted compactions and its abandoned uploads. Holding the
    /// retention lease, it also removes uploads at the old layout that
    /// retention would have deleted anyway (see `bucket`'s migration rule).
    pub async fn refresh_blocks(&self) -> Result<(), StorageError> {
        let shared = &self.shared;
        let _maintenance = shared.upkeep.maintenance.lock().await;
        let incomplete = self.relist().await?;
        self.count_retained_series().await;
        let own = &shared.config.replica;
        let leftovers: Vec<BlockMeta> = {
            let view = read(&shared.catalog.view);
            view.hidden
                .iter()
                .filter_map(|id| view.blocks.get(id))
                .filter(|m| m.replica == *own)
                .cloned()
                .collect()
        };
        let now = now_ms();
        let in_flight: BTreeSet<String> = read(&shared.catalog.view)
            .frozen
            .iter()
            .map(|f| f.id.clone())
            .collect();
        let mut abandoned: Vec<IncompleteUpload> = Vec::new();
        let mut legacy: Vec<IncompleteUpload> = Vec::new();
        for upload in incomplete {
            match &upload.owner {
                Some(owner) if owner == own && !in_flight.contains(&upload.id) => {
                    if started_ms(&upload.id).saturating_add(ABANDONED_UPLOAD_MS) < now {
                        abandoned.push(upload);
                    }
                }
                // Another replica's: only it knows whether the upload is
                // still being retried.
                Some(_) => {}
                None => {
                    let expired = now
                        .saturating_sub(millis(shared.config.retention))
                        .saturating_sub(LEGACY_UPLOAD_SLACK_MS);
                    if started_ms(&upload.id) < expired {
                        legacy.push(upload);
                    }
                }
            }
        }
        if (!leftovers.is_empty() || !abandoned.is_empty()) && self.confirm_replica_lease().await {
            let lease = &shared.upkeep.replica_lease;
            for meta in leftovers {
                tracing::info!(block = %meta.id, "deleting a block superseded by compaction");
                lease
                    .fenced(
                        "delete a block superseded by compaction",
                        shared.bucket.delete_block(&meta),
                    )
                    .await?;
                write(&shared.catalog.view).blocks.remove(&meta.id);
            }
            for upload in abandoned {
                tracing::info!(block = %upload.id, "deleting an abandoned upload");
                lease
                    .fenced(
                        "delete an abandoned upload",
                        shared.bucket.delete_incomplete(&upload),
                    )
                    .await?;
            }
        }
        if !legacy.is_empty() && self.confirm_retention_lease().await {
            let lease = &shared.upkeep.retention_lease;
            for upload in legacy {
                tracing::info!(block = %upload.id, "deleting an upload at the old layout older than retention");
                lease
                    .fenced(
                        "delete an old-layout upload past retention",
                        shared.bucket.delete_incomplete(&upload),
                    )
                    .await?;
            }
        }
        // The bucket answers again: settle the flush markers open could not
        // (their segments are neither replayed nor deleted until then).
        self.settle_held_markers().await;
        Ok(())
    }

    /// Compacts this replica's blocks: level-0 blocks of each complete hour
    /// into one, then blocks of each complete day into one. `now_ms` is a
    /// parameter so simulated-time benchmarks and tests can drive it.
    pub async fn compact(&self, now_ms: i64) -> Result<CompactionReport, StorageError> {
        let shared = &self.shared;
        let _maintenance = shared.upkeep.maintenance.lock().await;
        let mut report = CompactionReport::default();
        if !self.hold_replica_lease().await {
            // Another live process acts for this replica name (or the
            // bucket cannot be reached): compacting here too would write a
            // second block from the same sources, and both would count.
            return Ok(report);
        }
        // Hours first, then days over the fresh hour blocks.
        for _stage in 0..2 {
            let own: Vec<BlockMeta> = read(&shared.catalog.view)
                .visible()
                .filter(|m| m.replica == shared.config.replica)
                .filter(|m| !lock(&shared.catalog.corrupt).contains_key(&m.id))
                .cloned()
                .collect();
            let groups: Vec<CompactionGroup> =
                plan_compaction(&own, now_ms, millis(shared.config.compaction_settle))
                    .into_iter()
                    .map(|group| order_smallest_first(group, &own))
                    .collect();
            if groups.is_empty() {
                break;
            }
            for group in groups {
                let compression =
                    group.output_compression(now_ms, millis(shared.config.compaction_settle));
                match self.compact_group(&group, compression).await? {
                    Some((meta, deleted)) => {
                        report.deleted += deleted;
                        report.written.push(meta);
                    }
                    None => report.skipped_groups += 1,
                }
            }
        }
        shared
            .upkeep
            .counters
            .compactions
            .fetch_add(report.written.len() as u64, Ordering::Relaxed);
        if !report.written.is_empty() {
            // Sources and merge state are freed by now.
            crate::store::allocator::release_free_memory().await;
        }
        Ok(report)
    }

    /// Merges one group; `None` when a source is unreadable (a corrupt one
    /// is then reported as such) and the group is left alone. The merge
    /// reads its sources by range and spills its output to a file under
    /// the data directory, which is uploaded in parts: it holds neither
    /// its sources nor its output whole.
    async fn compact_group(
        &self,
        group: &CompactionGroup,
        compression: BlockCompression,
    ) -> Result<Option<(BlockMeta, usize)>, StorageError> {
        let shared = Arc::clone(&self.shared);
        let runtime = tokio::runtime::Handle::current();
        let ids = group.block_ids.clone();
        let replica = shared.config.replica.clone();
        let encoded = tokio::task::spawn_blocking(move || {
            let metas: Vec<BlockMeta> = {
                let view = read(&shared.catalog.view);
                ids.iter()
                    .filter_map(|id| view.blocks.get(id).cloned())
                    .collect()
            };
            // Every planned source must still be known: the sources are
            // deleted after the merge, so one missing from the view now (a
            // re-listing raced a flush) would be deleted unmerged. Leave the
            // group for the next round instead.
            if metas.len() != ids.len() {
                return Ok(None);
            }
            let mut sources = Vec::with_capacity(metas.len());
            for meta in &metas {
                if lock(&shared.catalog.corrupt).contains_key(&meta.id) {
                    return Ok(None);
                }
                match BucketRanges::open(&shared.bucket, meta, &runtime) {
                    Ok(source) => sources.push(source),
                    Err(err) => {
                        tracing::warn!(block = %meta.id, error = %err, "compaction source unreadable; merging later");
                        return Ok(None);
                    }
                }
            }
            // The merged block is about its sources' size; the WAL keeps
            // room for what may wait for the bucket besides.
            let spill_bytes: u64 = metas.iter().map(|m| m.size_bytes).sum();
            let reserve = shared.unuploaded_budget();
            if !room_to_spill(&shared.config.data_dir, spill_bytes, reserve) {
                shared
                    .upkeep
                    .counters
                    .compactions_skipped_low_disk
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    blocks = ids.len(),
                    spill_bytes,
                    reserve_bytes = reserve,
                    "compaction skipped: its spill file would leave the data directory's disk with less free space than the write-ahead log may need; retried next round"
                );
                return Ok(None);
            }
            let id = ulid::Ulid::new().to_string();
            let mut spill = SpillFile::create(&shared.config.data_dir, &id)?;
            let window = read_window_bytes(shared.config.compaction_memory_bytes, metas.len());
            let merged = kiln_engine::compact_streaming_within(
                sources,
                &MergeOutput {
                    id: &id,
                    replica: &replica,
                    read_window: window,
                    compression,
                },
                MergeLimits {
                    memory_bytes: shared.config.compaction_memory_bytes,
                    output_held_bytes: shared.config.block_cache_bytes,
                },
                &mut spill.file,
            );
            let (mut meta, sources_merged) = match merged {
                Ok(Some(merge)) => (merge.meta, merge.sources_merged),
                Ok(None) => {
                    tracing::debug!(
                        blocks = ids.len(),
                        "no two blocks of the group fit the compaction budget; left as they are"
                    );
                    return Ok(None);
                }
                Err(CompactionError::Source { index, source }) => {
                    let source_id = &metas[index].id;
                    if matches!(source, BlockError::Io { .. }) {
                        // The bucket did not answer (or the block went):
                        // nothing is known to be wrong with the block.
                        tracing::warn!(block = %source_id, error = %source, "compaction source unreadable; merging later");
                    } else {
                        shared.mark_corrupt(source_id, source.to_string());
                    }
                    return Ok(None);
                }
                Err(CompactionError::Output { source }) => {
                    return Err(StorageError::Block { id, source });
                }
            };
            // Readers hide blocks named as sources; make sure they are
            // named, and only those merged: the rest stay for a later pass.
            let mut ids = ids;
            ids.truncate(sources_merged);
            meta.sources = ids;
            Ok(Some((meta, spill)))
        })
        .await
        .map_err(|e| StorageError::task("compaction", e))??;
        let Some((meta, spill)) = encoded else {
            return Ok(None);
        };
        let shared = &self.shared;
        // The merge may have taken a while: the lease must still be held,
        // by the generation the bucket names, when the block that
        // supersedes the sources appears; otherwise a process that took the
        // name over may be merging the same sources, and both would count.
        if !self.confirm_replica_lease().await {
            return Ok(None);
        }
        let lease = &shared.upkeep.replica_lease;
        lease
            .fenced(
                "upload a compacted block",
                shared.bucket.put_block_file(&meta, &spill.path),
            )
            .await?;
        drop(spill);
        {
            let mut view = write(&shared.catalog.view);
            let mut blocks = view.blocks.clone();
            blocks.insert(meta.id.clone(), meta.clone());
            view.set_blocks(blocks);
        }
        {
            // The merge holds its sources' series: counted once they are.
            let mut census = shared.ingest.head.census();
            if meta.sources.iter().all(|id| census.counts_block(id)) {
                census.note_block(&meta.id);
            }
        }
        let mut deleted = 0;
        // The upload may have been slow: a holder that lost the lease
        // meanwhile leaves the sources (hidden by the new block) to the
        // name's new holder, which deletes them as leftovers.
        if !self.confirm_replica_lease().await {
            return Ok(Some((meta, deleted)));
        }
        for source in &meta.sources {
            let Some(source_meta) = read(&shared.catalog.view).blocks.get(source).cloned() else {
                continue;
            };
            lease
                .fenced(
                    "delete a compacted block's sources",
                    shared.bucket.delete_block(&source_meta),
                )
                .await?;
            write(&shared.catalog.view).blocks.remove(source);
            lock(&shared.catalog.cache).remove(source);
            deleted += 1;
        }
        tracing::info!(
            block = %meta.id,
            level = meta.compaction_level,
            sources = deleted,
            bytes = meta.size_bytes,
            "compacted blocks"
        );
        Ok(Some((meta, deleted)))
    }

    /// Deletes blocks (of any replica) past retention or over the size
    /// budget, when this process holds the retention lease: one replica at
    /// a time applies its retention settings to the whole bucket, so two
    /// replicas configured differently (a rollout) do not each delete by
    /// their own, the shortest retention deleting what the others keep.
    /// Returns the deleted ids.
    pub async fn enforce_retention(&self, now_ms: i64) -> Result<Vec<String>, StorageError> {
        let shared = &self.shared;
        let _maintenance = shared.upkeep.maintenance.lock().await;
        if !self.confirm_retention_lease().await {
            return Ok(Vec::new());
        }
        let lease = &shared.upkeep.retention_lease;
        let metas: Vec<BlockMeta> = read(&shared.catalog.view)
            .blocks
            .values()
            .cloned()
            .collect();
        let doomed = plan_retention(
            &metas,
            now_ms,
            millis(shared.config.retention),
            shared.config.max_total_bytes,
        );
        for id in &doomed {
            let Some(meta) = metas.iter().find(|m| &m.id == id) else {
                continue;
            };
            lease
                .fenced(
                    "delete a block past retention",
                    shared.bucket.delete_block(meta),
                )
                .await?;
            {
                let mut view = write(&shared.catalog.view);
                let mut blocks = view.blocks.clone();
                blocks.remove(id);
                view.set_blocks(blocks);
            }
            lock(&shared.catalog.cache).remove(id);
            lock(&shared.catalog.corrupt).remove(id);
        }
        if !doomed.is_empty() {
            tracing::info!(blocks = doomed.len(), "retention deleted blocks");
        }
        shared
            .upkeep
            .counters
            .retention_deleted
            .fetch_add(doomed.len() as u64, Ordering::Relaxed);
        Ok(doomed)
    }
}
