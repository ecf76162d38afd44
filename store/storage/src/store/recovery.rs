//! Opening a store: list the bucket, then replay the WAL into a fresh head,
//! skipping segments whose data a flush already put into a block (see
//! `upkeep::markers` for how a flush marker says which).

use std::fs;

use kiln_engine::Head;
use kiln_engine::recording::RecordedPoints;

use super::StoreConfig;
use super::catalog::Frozen;
use super::ingest::peer_lookup::{ReplayKeys, ReplayedKeys};
use super::ingest::replay::{ReplayPass, replay_until_clean, replayer};
use super::ingest::wal_dir;
use super::recorded::delete_unmatched_flush_file;
use super::upkeep::markers::{Marker, MarkerBlock, marker_block, marker_io, read_markers};
use crate::bucket::{Bucket, Listing};
use crate::error::StorageError;
use crate::wal::{ReplayReport, Wal};

/// What `open` hands to the new store.
pub(super) struct Recovered {
    pub(super) wal: Wal,
    pub(super) head: Head,
    /// What recording rules made of the live head's records.
    pub(super) recorded: RecordedPoints,
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
    /// Keyed records dropped as stored at a peer, or kept unverified.
    pub(super) keyed: ReplayedKeys,
}

fn in_ranges(ranges: &[(u64, u64)], id: u64) -> bool {
    ranges.iter().any(|&(first, end)| first <= id && id < end)
}

/// Recovers the store; `keys` says which keyed records peers stored while
/// this replica was down, which replay drops.
pub(super) async fn recover(
    config: &StoreConfig,
    bucket: &Bucket,
    keys: ReplayKeys,
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
            MarkerBlock::Missing => {
                // Its segments are replayed, and their points recorded
                // again: a points file the flush wrote first would count
                // them twice.
                if let Err(error) =
                    delete_unmatched_flush_file(bucket, &config.replica, &marker.block_id).await
                {
                    tracing::warn!(block = %marker.block_id, %error, "cannot delete the recorded points of a block that was never uploaded; they may be counted twice");
                }
                settled.push(marker);
            }
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
    let mut replayer = replayer(config);
    replayer.keys = keys;
    let replay_dir = dir.clone();
    let (wal, frozen, head, recorded, first_segment, report, keyed) =
        tokio::task::spawn_blocking(move || {
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
            let keyed = pass.take_keyed();
            let (cut, last, quarantined) = pass.finish()?;
            let head_first = last.first_segment;
            report.quarantined_records = quarantined;
            wal.remove_segments(|id| in_ranges(&covered, id) && !in_ranges(&held_ranges, id))?;
            let first = if start.is_some() {
                head_first
            } else {
                wal.current_segment()
            };
            let frozen: Vec<Frozen> = cut
                .into_iter()
                .map(|c| Frozen::new(vec![c.head], c.recorded, c.first_segment, c.end_segment))
                .collect();
            Ok::<_, StorageError>((wal, frozen, last.head, last.recorded, first, report, keyed))
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
        wal_skipped_bytes = report.skipped_bytes,
        wal_quarantined_segments = report.quarantined_segments,
        wal_quarantined = report.quarantined_records,
        heads_waiting_for_upload = frozen.len(),
        held_wal_ranges = held.len(),
        wal_dropped_stored_elsewhere = keyed.dropped.len(),
        wal_kept_unverified = keyed.kept_unverified,
        "store recovered"
    );
    Ok(Recovered {
        wal,
        head,
        recorded,
        first_segment,
        report,
        listing,
        listing_error,
        frozen,
        held,
        keyed,
    })
}
