//! Where a streaming compaction's output waits: the merged block is
//! spilled to a file under the data directory (`compaction-spill/`) until
//! it is uploaded from there. (Its sources are read from the bucket by
//! range, through `bucket::BucketRanges`.)

use std::path::{Path, PathBuf};

use crate::error::StorageError;

/// Where merged blocks wait for upload, under the data directory.
const SPILL_DIR: &str = "compaction-spill";

/// The spill directory of a data directory.
fn spill_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(SPILL_DIR)
}

/// Removes what a killed process left in the spill directory (a merge
/// interrupted before its upload; its sources are untouched and merge again)
/// and creates it. Called at open, before any compaction can run.
pub(in crate::store) fn reset_spill_dir(data_dir: &Path) -> Result<(), StorageError> {
    let dir = spill_dir(data_dir);
    let io = |op| {
        let path = dir.clone();
        move |source| StorageError::Spill { op, path, source }
    };
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(io("clear")(err)),
    }
    std::fs::create_dir_all(&dir).map_err(io("create"))
}

/// A merged block's spill file, removed when dropped (uploaded or not).
pub(super) struct SpillFile {
    pub(super) path: PathBuf,
    pub(super) file: std::fs::File,
}

impl SpillFile {
    pub(super) fn create(data_dir: &Path, id: &str) -> Result<Self, StorageError> {
        let path = spill_dir(data_dir).join(format!("{id}.block"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| StorageError::Spill {
                op: "create",
                path: path.clone(),
                source,
            })?;
        Ok(Self { path, file })
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %err, "removing a compaction spill file failed");
        }
    }
}

/// Bytes free for this process on the filesystem of `data_dir`.
fn free_bytes(data_dir: &Path) -> Result<u64, StorageError> {
    let stats = nix::sys::statvfs::statvfs(data_dir).map_err(|errno| StorageError::Spill {
        op: "statvfs",
        path: data_dir.to_path_buf(),
        source: std::io::Error::from(errno),
    })?;
    let (blocks, block_bytes): (u64, u64) = (stats.blocks_available(), stats.fragment_size());
    Ok(blocks.saturating_mul(block_bytes))
}

/// Whether a spill file of about `spill_bytes` leaves `reserve_bytes` free
/// on the data directory's disk. The write-ahead log shares that disk: a
/// compaction that fills it makes every write fail, and a compaction can
/// always wait for the next round. When the free space cannot be read,
/// the compaction goes ahead (the check is a guard, not a gate that a
/// statvfs quirk may close for good).
pub(super) fn room_to_spill(data_dir: &Path, spill_bytes: u64, reserve_bytes: u64) -> bool {
    match free_bytes(data_dir) {
        Ok(free) => free >= spill_bytes.saturating_add(reserve_bytes),
        Err(err) => {
            tracing::warn!(error = %err, "cannot read the data directory's free space; compacting anyway");
            true
        }
    }
}
