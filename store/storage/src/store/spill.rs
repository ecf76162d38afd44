//! The IO around a streaming compaction: source blocks read from the
//! bucket by range, and the merged block spilled to a file under the data
//! directory (`compaction-spill/`) until it is uploaded from there.

use std::path::{Path, PathBuf};

use kiln_engine::BlockRanges;
use kiln_engine::model::BlockMeta;
use object_store::Error as ObjectError;

use crate::bucket::Bucket;
use crate::error::StorageError;

/// Where merged blocks wait for upload, under the data directory.
const SPILL_DIR: &str = "compaction-spill";

/// The spill directory of a data directory.
pub(super) fn spill_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(SPILL_DIR)
}

/// Removes what a killed process left in the spill directory (a merge
/// interrupted before its upload; its sources are untouched and merge again)
/// and creates it. Called at open, before any compaction can run.
pub(super) fn reset_spill_dir(data_dir: &Path) -> Result<(), StorageError> {
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

/// A source block read through the bucket by range, from a blocking task
/// (compaction runs on the blocking pool).
pub(super) struct BucketRanges {
    bucket: Bucket,
    meta: BlockMeta,
    size: u64,
    runtime: tokio::runtime::Handle,
}

impl BucketRanges {
    /// Asks the bucket for the block's size; an error means the block
    /// cannot be read now (gone, or the bucket unreachable).
    pub(super) fn open(
        bucket: &Bucket,
        meta: &BlockMeta,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Self, StorageError> {
        let size = runtime.block_on(bucket.block_data_size(meta))?;
        Ok(Self {
            bucket: bucket.clone(),
            meta: meta.clone(),
            size,
            runtime: runtime.clone(),
        })
    }
}

impl BlockRanges for BucketRanges {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_range(&mut self, offset: u64, len: usize, buf: &mut Vec<u8>) -> std::io::Result<()> {
        if let Some(read) = self
            .bucket
            .read_local_block_range(&self.meta, offset, len, buf)
        {
            return read;
        }
        let end = offset.saturating_add(len as u64);
        match self
            .runtime
            .block_on(self.bucket.get_block_range(&self.meta, offset..end))
        {
            Ok(bytes) => {
                buf.extend_from_slice(&bytes);
                Ok(())
            }
            Err(
                err @ StorageError::Bucket {
                    source: ObjectError::NotFound { .. },
                    ..
                },
            ) => Err(std::io::Error::new(std::io::ErrorKind::NotFound, err)),
            Err(err) => Err(std::io::Error::other(err)),
        }
    }
}
