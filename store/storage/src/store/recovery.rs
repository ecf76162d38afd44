//! Opening a store: list the bucket, then replay the WAL into a fresh head,
//! skipping segments whose data a flush already put into a block.
//!
//! A flush writes a marker `flush-<block id>.marker` naming the WAL segment
//! range `[first, end)` the block replaces *before* uploading it, and
//! removes the marker only after those segments are deleted. So after a
//! crash, a marker whose block is in the bucket means "those segments are
//! already in a block, skip them"; a marker whose block is missing means
//! "the upload did not finish, replay them". Nothing is lost or counted twice.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use kiln_engine::Head;

use super::StoreConfig;
use super::quarantine::quarantine_dir;
use super::replay::{ReplayPass, Replayer};
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
    pub(super) listing: Listing,
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

struct Marker {
    path: PathBuf,
    block_id: String,
    first: u64,
    end: u64,
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
    let listing = bucket
        .list_blocks(&Default::default(), &Default::default())
        .await?;
    for corrupt in &listing.corrupt {
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
    let covered: Vec<(u64, u64)> = markers
        .iter()
        .filter(|m| listing.blocks.contains_key(&m.block_id))
        .map(|m| (m.first, m.end))
        .collect();
    let segment_bytes = config.wal_segment_bytes;
    let replayer = Replayer {
        decode_limits: config.decode_limits.clone(),
        // Every logged record passed the head-dependent checks before it
        // was logged; replay must not refuse what was acknowledged.
        ingest_limits: config.ingest_limits.for_logged_records(),
        quarantine_dir: quarantine_dir(config),
    };
    let replay_dir = dir.clone();
    let (wal, head, first_segment, report) = tokio::task::spawn_blocking(move || {
        let is_covered = |id: u64| covered.iter().any(|&(first, end)| first <= id && id < end);
        // Every uncovered segment, even one without records (a crash right
        // after creating it), belongs to the new head, so its flush deletes it.
        let uncovered: Vec<u64> = crate::wal::list_segments(&replay_dir)?
            .into_iter()
            .filter(|&id| !is_covered(id))
            .collect();
        let first_segment = uncovered.first().copied();
        let mut pass = ReplayPass::new(&replayer);
        let (wal, mut report) = Wal::open(&replay_dir, segment_bytes, |replayed| {
            if !is_covered(replayed.segment) {
                pass.replay(replayed);
            }
        })?;
        // A panic may have left the head half-applied: replay again into a
        // fresh head, skipping every record set aside so far. Each round sets
        // aside at least one more record, so this ends.
        while pass.head_damaged() {
            pass.restart();
            crate::wal::reread(&replay_dir, &uncovered, |replayed| pass.replay(replayed))?;
        }
        let (head, quarantined) = pass.finish()?;
        report.quarantined_records = quarantined;
        wal.remove_segments(is_covered)?;
        let first = first_segment.unwrap_or_else(|| wal.current_segment());
        Ok::<_, StorageError>((wal, head, first, report))
    })
    .await
    .map_err(|e| StorageError::task("WAL replay", e))??;
    for marker in markers {
        fs::remove_file(&marker.path).map_err(marker_io("remove marker", &marker.path))?;
    }
    tracing::info!(
        blocks = listing.blocks.len(),
        corrupt_blocks = listing.corrupt.len(),
        wal_records = report.records,
        wal_truncated_bytes = report.truncated_bytes,
        wal_quarantined = report.quarantined_records,
        "store recovered"
    );
    Ok(Recovered {
        wal,
        head,
        first_segment,
        report,
        listing,
    })
}
