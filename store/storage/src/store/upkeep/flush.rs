//! Flushing: cut the live head into a head waiting for upload, encode and
//! upload it as a block, then drop the WAL segments the block replaces.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::markers::write_marker;
use crate::error::StorageError;
use crate::store::catalog::Frozen;
use crate::store::ingest::{idempotency, wal_dir};
use crate::store::{Store, lock, now_ms, read, write};

impl Store {
    /// Cuts the head into a block, uploads every pending block, and deletes
    /// the WAL segments they replace. A failed upload leaves the data in
    /// memory (still queried) and in the WAL, and is retried next flush.
    pub async fn flush(&self) -> Result<(), StorageError> {
        let shared = &self.shared;
        // While earlier heads wait for upload (the bucket is failing), the
        // live head is cut only once full: one block per failed attempt
        // would leave hundreds of tiny blocks after a long outage.
        let backlog = !read(&shared.catalog.view).frozen.is_empty();
        let cut_first =
            !backlog || shared.ingest.head.approx_bytes() >= shared.config.max_head_bytes;
        if cut_first {
            self.cut_head().await?;
        }
        let _maintenance = shared.upkeep.maintenance.lock().await;
        let mut result = self.upload_pending().await;
        if result.is_ok() && !cut_first {
            // The backlog drained: the live head goes up too.
            self.cut_head().await?;
            result = self.upload_pending().await;
        }
        // The cut head and its encoded block are freed by now.
        crate::store::allocator::release_free_memory().await;
        if result.is_err() {
            shared
                .upkeep
                .counters
                .flush_failures
                .fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Moves the head's contents into a new frozen head awaiting upload.
    async fn cut_head(&self) -> Result<(), StorageError> {
        let shared = &self.shared;
        if shared.ingest.head.is_empty() {
            return Ok(());
        }
        // No ingest is between its WAL append and head apply while we hold
        // this: the frozen head holds exactly segments [first, new).
        let _gate = shared.ingest.cut_gate.write().await;
        let rotator = Arc::clone(shared);
        let new_segment = tokio::task::spawn_blocking(move || rotator.ingest.wal.rotate())
            .await
            .map_err(|e| StorageError::task("WAL rotate", e))??;
        // Pushed while every shard's write lock is held, so a query that
        // snapshots the view under the shards' read locks sees the data
        // exactly once.
        shared.ingest.head.cut(new_segment, |heads, first_segment| {
            let recorded = shared.recorded.take_live();
            let frozen = Frozen::new(heads, recorded, first_segment, new_segment);
            write(&shared.catalog.view).frozen.push(Arc::new(frozen));
        });
        Ok(())
    }

    /// Uploads frozen heads oldest first; stops at the first failure so WAL
    /// segments are only ever deleted in order. Caller holds `maintenance`.
    async fn upload_pending(&self) -> Result<(), StorageError> {
        let shared = &self.shared;
        if !read(&shared.catalog.view).frozen.is_empty() && !self.bucket_is_ours().await? {
            return Err(StorageError::Lease {
                path: super::bucket_claim::CLAIM_FILE.to_owned(),
                message: "the bucket's store claim could not be checked yet; uploads wait".into(),
            });
        }
        loop {
            let Some(frozen) = read(&shared.catalog.view).frozen.first().cloned() else {
                return Ok(());
            };
            if frozen.is_empty() {
                // Its segments hold only records the engine refused.
                write(&shared.catalog.view)
                    .frozen
                    .retain(|f| !Arc::ptr_eq(f, &frozen));
                let cleaner = Arc::clone(shared);
                let (first, end) = (frozen.first_segment, frozen.end_segment);
                tokio::task::spawn_blocking(move || {
                    cleaner.ingest.wal.remove_segments(|id| {
                        first <= id && id < end && !cleaner.upkeep.is_held(id)
                    })
                })
                .await
                .map_err(|e| StorageError::task("WAL cleanup", e))??;
                continue;
            }
            let encoder = Arc::clone(&frozen);
            let replica = shared.config.replica.clone();
            let dir = wal_dir(&shared.config);
            let (meta, data, marker) = tokio::task::spawn_blocking(move || {
                let marker = write_marker(
                    &dir,
                    &encoder.id,
                    encoder.first_segment,
                    encoder.end_segment,
                )?;
                let heads: Vec<&kiln_engine::Head> =
                    encoder.heads.iter().filter(|h| !h.is_empty()).collect();
                let (meta, data) = kiln_engine::encode_heads(&heads, &encoder.id, &replica)
                    .map_err(|source| StorageError::Block {
                        id: encoder.id.clone(),
                        source,
                    })?;
                Ok::<_, StorageError>((meta, data, marker))
            })
            .await
            .map_err(|e| StorageError::task("block encode", e))??;
            // The points go first, named after the block: a crash before
            // the block is up leaves a file recovery deletes (its segments
            // are replayed), never a block whose points are missing.
            let recorded = self.upload_recorded(&meta.id, &frozen.recorded).await;
            shared.catalog.note_bucket(&recorded);
            if let Err(err) = recorded {
                tracing::warn!(block = %meta.id, error = %err, "recorded series upload failed; will retry");
                return Err(err);
            }
            let put = shared.bucket.put_block(&meta, data.into()).await;
            shared.catalog.note_bucket(&put);
            if let Err(err) = put {
                tracing::warn!(block = %meta.id, error = %err, "block upload failed; will retry");
                return Err(err);
            }
            {
                let mut view = write(&shared.catalog.view);
                view.frozen.retain(|f| !Arc::ptr_eq(f, &frozen));
                let mut blocks = view.blocks.clone();
                blocks.insert(meta.id.clone(), meta.clone());
                view.set_blocks(blocks);
                view.note_upload(meta.clone());
            }
            // Its series were counted as the head created them: the census
            // need not read them back.
            shared.ingest.head.census().note_block(&meta.id);
            shared
                .upkeep
                .counters
                .blocks_written
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(block = %meta.id, bytes = meta.size_bytes, "block uploaded");
            let cleaner = Arc::clone(shared);
            let (first, end) = (frozen.first_segment, frozen.end_segment);
            // The keys logged in these segments outlive them in the keys
            // file, so a restart still knows them.
            let keys = lock(&shared.ingest.recent_keys).encode(now_ms());
            let keys_dir = wal_dir(&shared.config);
            tokio::task::spawn_blocking(move || {
                idempotency::save(&keys_dir, &keys)?;
                cleaner
                    .ingest
                    .wal
                    .remove_segments(|id| first <= id && id < end && !cleaner.upkeep.is_held(id))?;
                std::fs::remove_file(&marker).map_err(|source| StorageError::Wal {
                    op: "remove marker",
                    path: marker.clone(),
                    source,
                })
            })
            .await
            .map_err(|e| StorageError::task("WAL cleanup", e))??;
        }
    }
}
