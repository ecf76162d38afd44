//! Opening a store: list the bucket, then replay the WAL into a fresh head,
//! skipping segments whose data a flush already put into a block.
//!
//! A flush writes a marker `flush-<block id>.marker` naming the WAL segment
//! range `[first, end)` the block replaces *before* uploading it, and
//! removes the marker only after those segments are deleted. So after a
//! crash, a marker whose block is in the bucket means "those segments are
//! already in a block, skip them"; a marker whose block is missing means
//! "the upload did not finish, replay them". Nothing is lost or counted twice.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kiln_engine::Head;
use kiln_engine::model::BlockMeta;

use super::quarantine::quarantine_dir;
use super::replay::{ReplayPass, Replayer};
use super::{Frozen, Store, StoreConfig, lock, read, write};
use crate::bucket::{Bucket, Listing};
use crate::error::StorageError;
use crate::wal::{ReplayReport, Wal};

const MARKER_PREFIX: &str = "flush-";
const MARKER_SUFFIX: &str = ".marker";

/// What `open` hands to the new store.
pub(super) struct Recovered {
    pub(super) wal: Wal,
    pub(super) head: Head,
    pub(super) first_segment: u64,
    pub(super) report: ReplayReport,
    /// `None` when the bucket could not be listed in time.
    pub(super) listing: Option<Listing>,
    /// Why the bucket did not answer, if it did not.
    pub(super) listing_error: Option<String>,
    /// Heads cut during replay, waiting for upload.
    pub(super) frozen: Vec<Frozen>,
    /// Markers whose block's state is unknown; their segments are kept.
    pub(super) held: Vec<Marker>,
}

pub(super) fn wal_dir(config: &StoreConfig) -> PathBuf {
    config.data_dir.join("wal")
}

fn marker_io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StorageError {
    let path = path.to_path_buf();
    move |source| StorageError::Wal { op, path, source }
}

/// Durably records that block `id` will replace WAL segments `[first, end)`.
pub(super) fn write_marker(
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
pub(super) struct Marker {
    path: PathBuf,
    block_id: String,
    pub(super) first: u64,
    pub(super) end: u64,
}

/// What the bucket says of the block a flush marker names.
enum MarkerBlock {
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
async fn marker_block(
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

fn replayer(config: &StoreConfig) -> Replayer {
    Replayer {
        decode_limits: config.decode_limits.clone(),
        // Every logged record passed the head-dependent checks before it
        // was logged; replay must not refuse what was acknowledged.
        ingest_limits: config.ingest_limits.for_logged_records(),
        quarantine_dir: quarantine_dir(config),
    }
}

fn in_ranges(ranges: &[(u64, u64)], id: u64) -> bool {
    ranges.iter().any(|&(first, end)| first <= id && id < end)
}

/// Replays what `pass` has taken in again into fresh heads while a record
/// panicked mid-apply, skipping every record set aside so far. Each round
/// sets aside at least one more record, so this ends.
fn replay_until_clean(
    pass: &mut ReplayPass<'_>,
    dir: &Path,
    segments: &[u64],
) -> Result<(), StorageError> {
    while pass.head_damaged() {
        pass.restart();
        crate::wal::reread(dir, segments, |replayed| pass.replay(replayed))?;
    }
    Ok(())
}

fn read_markers(dir: &Path) -> Result<Vec<Marker>, StorageError> {
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

pub(super) async fn recover(
    config: &StoreConfig,
    bucket: &Bucket,
) -> Result<Recovered, StorageError> {
    let empty = (Default::default(), Default::default());
    let (mut listing, mut listing_error) = match tokio::time::timeout(
        config.open_listing_timeout,
        bucket.list_blocks(&empty.0, &empty.1),
    )
    .await
    {
        Ok(Ok(listing)) => (Some(listing), None),
        Ok(Err(err)) => (None, Some(err.to_string())),
        Err(_elapsed) => (
            None,
            Some(format!(
                "listing the bucket took longer than {:?}",
                config.open_listing_timeout
            )),
        ),
    };
    if let Some(error) = &listing_error {
        tracing::warn!(%error, "opening without the bucket's blocks; listing again in the background");
    }
    for corrupt in listing.iter().flat_map(|l| &l.corrupt) {
        tracing::warn!(block = %corrupt.id, error = %corrupt.error, "skipping corrupt block");
    }
    let dir = wal_dir(config);
    fs::create_dir_all(&dir).map_err(marker_io("create directory", &dir))?;
    let markers = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || read_markers(&dir))
            .await
            .map_err(|e| StorageError::task("read flush markers", e))??
    };
    let mut covered: Vec<(u64, u64)> = Vec::new();
    let mut held: Vec<Marker> = Vec::new();
    let mut settled: Vec<Marker> = Vec::new();
    for marker in markers {
        let Some(listing) = listing.as_mut() else {
            held.push(marker);
            continue;
        };
        match marker_block(
            bucket,
            &config.replica,
            &mut listing.blocks,
            &marker.block_id,
        )
        .await
        {
            MarkerBlock::Uploaded => {
                covered.push((marker.first, marker.end));
                settled.push(marker);
            }
            MarkerBlock::Missing => settled.push(marker),
            MarkerBlock::Unknown(error) => {
                tracing::warn!(block = %marker.block_id, %error, "cannot tell whether a flushed block was uploaded; keeping its WAL segments until the bucket answers");
                listing_error = Some(error.to_string());
                held.push(marker);
            }
        }
    }
    let held_ranges: Vec<(u64, u64)> = held.iter().map(|m| (m.first, m.end)).collect();
    let segment_bytes = config.wal_segment_bytes;
    let cut_bytes = config.max_head_bytes;
    let replayer = replayer(config);
    let replay_dir = dir.clone();
    let (wal, frozen, head, first_segment, report) = tokio::task::spawn_blocking(move || {
        let skip = |id: u64| in_ranges(&covered, id) || in_ranges(&held_ranges, id);
        // Every other segment, even one without records (a crash right
        // after creating it), belongs to the replayed heads, so their
        // flushes delete it.
        let uncovered: Vec<u64> = crate::wal::list_segments(&replay_dir)?
            .into_iter()
            .filter(|&id| !skip(id))
            .collect();
        let start = uncovered.first().copied();
        let mut pass = ReplayPass::new(&replayer, start.unwrap_or(0), cut_bytes);
        let (wal, mut report) = Wal::open(&replay_dir, segment_bytes, |replayed| {
            if !skip(replayed.segment) {
                pass.replay(replayed);
            }
        })?;
        replay_until_clean(&mut pass, &replay_dir, &uncovered)?;
        let (cut, head, head_first, quarantined) = pass.finish()?;
        report.quarantined_records = quarantined;
        wal.remove_segments(|id| in_ranges(&covered, id) && !in_ranges(&held_ranges, id))?;
        let first = if start.is_some() {
            head_first
        } else {
            wal.current_segment()
        };
        let frozen: Vec<Frozen> = cut
            .into_iter()
            .map(|c| Frozen::new(vec![c.head], c.first_segment, c.end_segment))
            .collect();
        Ok::<_, StorageError>((wal, frozen, head, first, report))
    })
    .await
    .map_err(|e| StorageError::task("WAL replay", e))??;
    for marker in settled {
        fs::remove_file(&marker.path).map_err(marker_io("remove marker", &marker.path))?;
    }
    tracing::info!(
        blocks = listing.as_ref().map_or(0, |l| l.blocks.len()),
        corrupt_blocks = listing.as_ref().map_or(0, |l| l.corrupt.len()),
        wal_records = report.records,
        wal_truncated_bytes = report.truncated_bytes,
        wal_quarantined = report.quarantined_records,
        heads_waiting_for_upload = frozen.len(),
        held_wal_ranges = held.len(),
        "store recovered"
    );
    Ok(Recovered {
        wal,
        head,
        first_segment,
        report,
        listing,
        listing_error,
        frozen,
        held,
    })
}

impl Store {
    /// Settles the flush markers held at open, now that the bucket answers:
    /// a marker whose block is there has its segments deleted; one whose
    /// block is not has its segments replayed into heads waiting for upload.
    /// A marker the bucket still says nothing about stays held. Caller holds
    /// `maintenance`.
    pub(super) async fn settle_held_markers(&self) {
        let shared = &self.shared;
        let markers: Vec<Marker> = lock(&shared.held).clone();
        for marker in markers {
            let mut blocks = read(&shared.view).blocks.clone();
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
                shared.note_bucket::<()>(&failed);
                return failed;
            }
            MarkerBlock::Uploaded => {
                let mut view = write(&shared.view);
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
                    let (cut, head, head_first, quarantined) = pass.finish()?;
                    let mut frozen: Vec<Frozen> = cut
                        .into_iter()
                        .map(|c| Frozen::new(vec![c.head], c.first_segment, c.end_segment))
                        .collect();
                    if !head.is_empty() {
                        frozen.push(Frozen::new(vec![head], head_first, end));
                    }
                    Ok::<_, StorageError>((frozen, quarantined))
                })
                .await
                .map_err(|e| StorageError::task("replaying held WAL segments", e))??;
                shared
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
            let mut view = write(&shared.view);
            view.frozen.splice(0..0, frozen.into_iter().map(Arc::new));
        }
        lock(&shared.held).retain(|m| m.block_id != marker.block_id);
        let (first, end, path) = (marker.first, marker.end, marker.path.clone());
        let in_block = !replayed;
        tokio::task::spawn_blocking(move || {
            if in_block {
                // The block holds these records, or none of them replayed.
                shared
                    .wal
                    .remove_segments(|id| first <= id && id < end && !shared.is_held(id))?;
            }
            fs::remove_file(&path).map_err(marker_io("remove marker", &path))
        })
        .await
        .map_err(|e| StorageError::task("settling a flush marker", e))??;
        tracing::info!(block = %marker.block_id, replayed, "settled a flush marker held at open");
        Ok(())
    }
}
