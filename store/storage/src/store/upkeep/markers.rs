//! Flush markers: what ties a block to the WAL segments it replaces.
//!
//! A flush writes a marker `flush-<block id>.marker` naming the WAL segment
//! range `[first, end)` the block replaces *before* uploading it, and
//! removes the marker only after those segments are deleted. So after a
//! crash, a marker whose block is in the bucket means "those segments are
//! already in a block, skip them"; a marker whose block is missing means
//! "the upload did not finish, replay them". Nothing is lost or counted twice.
//! A marker the bucket could not answer for at open is held (neither
//! replayed nor deleted) and settled here once the bucket answers.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kiln_engine::model::BlockMeta;

use crate::bucket::Bucket;
use crate::error::StorageError;
use crate::store::catalog::Frozen;
use crate::store::ingest::replay::{ReplayPass, replay_until_clean, replayer};
use crate::store::ingest::wal_dir;
use crate::store::{Store, lock, read, write};

const MARKER_PREFIX: &str = "flush-";
const MARKER_SUFFIX: &str = ".marker";

pub(in crate::store) fn marker_io(
    op: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> StorageError {
    let path = path.to_path_buf();
    move |source| StorageError::Wal { op, path, source }
}

/// Durably records that block `id` will replace WAL segments `[first, end)`.
pub(in crate::store) fn write_marker(
    dir: &Path,
    id: &str,
    first: u64,
    end: u64,
) -> Result<PathBuf, StorageError> {
    let path = dir.join(format!("{MARKER_PREFIX}{id}{MARKER_SUFFIX}"));
    let tmp = path.with_extension("tmp");
    let mut file = fs::File::create(&tmp).map_err(marker_io("create marker", &tmp))?;
    writeln!(file, "{first} {end}").map_err(marker_io("write marker", &tmp))?;
    file.sync_all().map_err(marker_io("fsync marker", &tmp))?;
    fs::rename(&tmp, &path).map_err(marker_io("rename marker", &path))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(marker_io("fsync directory", dir))?;
    Ok(path)
}

/// A flush marker: block `block_id` replaces WAL segments `[first, end)`.
#[derive(Debug, Clone)]
pub(in crate::store) struct Marker {
    pub(in crate::store) path: PathBuf,
    pub(in crate::store) block_id: String,
    pub(in crate::store) first: u64,
    pub(in crate::store) end: u64,
}

/// What the bucket says of the block a flush marker names.
pub(in crate::store) enum MarkerBlock {
    /// It is there: the marker's segments are in it.
    Uploaded,
    /// It is not, or its `meta.json` is unusable so it is never read: the
    /// segments are the only copy.
    Missing,
    /// The bucket did not say (an error that may pass).
    Unknown(StorageError),
}

/// Asks the bucket about a marker's block. A block missing from a listing
/// may only have had its `meta.json` fail to load just then; guessing
/// "absent" would replay segments whose block exists and count their data
/// twice, so the block is asked for directly, and an error other than "not
/// found" leaves the answer unknown.
pub(in crate::store) async fn marker_block(
    bucket: &Bucket,
    replica: &str,
    blocks: &mut BTreeMap<String, BlockMeta>,
    block_id: &str,
) -> MarkerBlock {
    if blocks.contains_key(block_id) {
        return MarkerBlock::Uploaded;
    }
    match bucket.get_own_meta(replica, block_id).await {
        Ok(meta) => {
            blocks.insert(meta.id.clone(), meta);
            MarkerBlock::Uploaded
        }
        Err(StorageError::Bucket {
            source: object_store::Error::NotFound { .. },
            ..
        }) => MarkerBlock::Missing,
        Err(err @ StorageError::Bucket { .. }) => MarkerBlock::Unknown(err),
        Err(err) => {
            tracing::warn!(block = %block_id, error = %err, "flush marker names a block with an unusable meta.json; replaying its segments");
            MarkerBlock::Missing
        }
    }
}

pub(in crate::store) fn read_markers(dir: &Path) -> Result<Vec<Marker>, StorageError> {
    let mut markers = Vec::new();
    for entry in fs::read_dir(dir).map_err(marker_io("list", dir))? {
        let entry = entry.map_err(marker_io("list", dir))?;
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.ends_with(".tmp") {
            // A marker that never got renamed guarded nothing: its upload
            // had not started.
            fs::remove_file(&path).map_err(marker_io("remove marker", &path))?;
            continue;
        }
        let Some(block_id) = name
            .strip_prefix(MARKER_PREFIX)
            .and_then(|n| n.strip_suffix(MARKER_SUFFIX))
        else {
            continue;
        };
        let text = fs::read_to_string(&path).map_err(marker_io("read marker", &path))?;
        let mut numbers = text.split_whitespace().map(str::parse::<u64>);
        match (numbers.next(), numbers.next()) {
            (Some(Ok(first)), Some(Ok(end))) => markers.push(Marker {
                block_id: block_id.to_string(),
                path,
                first,
                end,
            }),
            _ => {
                // Markers are written atomically (rename), so this is outside
                // interference; treat it as guarding nothing and replay.
                tracing::warn!(path = %path.display(), "ignoring unreadable flush marker");
            }
        }
    }
    Ok(markers)
}

impl Store {
    /// Settles the flush markers held at open, now that the bucket answers:
    /// a marker whose block is there has its segments deleted; one whose
    /// block is not has its segments replayed into heads waiting for upload.
    /// A marker the bucket still says nothing about stays held. Caller holds
    /// `maintenance`.
    pub(in crate::store) async fn settle_held_markers(&self) {
        let shared = &self.shared;
        let markers: Vec<Marker> = lock(&shared.upkeep.held).clone();
        for marker in markers {
            let mut blocks = read(&shared.catalog.view).blocks.clone();
            let state = marker_block(
                &shared.bucket,
                &shared.config.replica,
                &mut blocks,
                &marker.block_id,
            )
            .await;
            if let Err(err) = self.settle(&marker, state, blocks).await {
                tracing::warn!(block = %marker.block_id, error = %err, "cannot settle a held flush marker yet");
            }
        }
    }

    async fn settle(
        &self,
        marker: &Marker,
        state: MarkerBlock,
        blocks: BTreeMap<String, BlockMeta>,
    ) -> Result<(), StorageError> {
        let shared = Arc::clone(&self.shared);
        let frozen = match state {
            MarkerBlock::Unknown(error) => {
                let failed = Err(error);
                shared.catalog.note_bucket::<()>(&failed);
                return failed;
            }
            MarkerBlock::Uploaded => {
                let mut view = write(&shared.catalog.view);
                if let Some(meta) = blocks.get(&marker.block_id)
                    && !view.blocks.contains_key(&marker.block_id)
                {
                    let mut known = view.blocks.clone();
                    known.insert(meta.id.clone(), meta.clone());
                    view.set_blocks(known);
                }
                Vec::new()
            }
            MarkerBlock::Missing => {
                // Replayed points would be counted beside those of a
                // points file written before the block upload failed.
                crate::store::recorded::delete_unmatched_flush_file(
                    &shared.bucket,
                    &shared.config.replica,
                    &marker.block_id,
                )
                .await?;
                let replayer = replayer(&shared.config);
                let (first, end) = (marker.first, marker.end);
                let dir = wal_dir(&shared.config);
                let cut_bytes = shared.config.max_head_bytes;
                let (frozen, quarantined) = tokio::task::spawn_blocking(move || {
                    let segments: Vec<u64> = crate::wal::list_segments(&dir)?
                        .into_iter()
                        .filter(|&id| first <= id && id < end)
                        .collect();
                    let mut pass = ReplayPass::new(&replayer, first, cut_bytes);
                    crate::wal::reread(&dir, &segments, |replayed| pass.replay(replayed))?;
                    replay_until_clean(&mut pass, &dir, &segments)?;
                    let (cut, last, quarantined) = pass.finish()?;
                    let mut frozen: Vec<Frozen> = cut
                        .into_iter()
                        .map(|c| {
                            Frozen::new(vec![c.head], c.recorded, c.first_segment, c.end_segment)
                        })
                        .collect();
                    if !last.head.is_empty() {
                        frozen.push(Frozen::new(
                            vec![last.head],
                            last.recorded,
                            last.first_segment,
                            end,
                        ));
                    }
                    Ok::<_, StorageError>((frozen, quarantined))
                })
                .await
                .map_err(|e| StorageError::task("replaying held WAL segments", e))??;
                shared
                    .upkeep
                    .counters
                    .late_quarantined
                    .fetch_add(quarantined, Ordering::Relaxed);
                frozen
            }
        };
        // Settled: the segments are no longer held. Heads replayed from them
        // go first in the upload queue (they are the oldest data); until they
        // are uploaded their segments stay, with no marker, so a crash now
        // replays them at the next open.
        let replayed = !frozen.is_empty();
        {
            let mut view = write(&shared.catalog.view);
            view.frozen.splice(0..0, frozen.into_iter().map(Arc::new));
        }
        lock(&shared.upkeep.held).retain(|m| m.block_id != marker.block_id);
        let (first, end, path) = (marker.first, marker.end, marker.path.clone());
        let in_block = !replayed;
        tokio::task::spawn_blocking(move || {
            if in_block {
                // The block holds these records, or none of them replayed.
                shared
                    .ingest
                    .wal
                    .remove_segments(|id| first <= id && id < end && !shared.upkeep.is_held(id))?;
            }
            fs::remove_file(&path).map_err(marker_io("remove marker", &path))
        })
        .await
        .map_err(|e| StorageError::task("settling a flush marker", e))??;
        tracing::info!(block = %marker.block_id, replayed, "settled a flush marker held at open");
        Ok(())
    }
}
