//! A block read by range through the bucket, for code on the blocking pool:
//! compaction reads its sources this way, and queries the blocks too large
//! to fetch whole.

use kiln_engine::BlockRanges;
use kiln_engine::model::BlockMeta;
use object_store::Error as ObjectError;

use super::Bucket;
use crate::error::StorageError;

/// A source block read through the bucket by range, from a blocking task
/// (compaction runs on the blocking pool).
pub(crate) struct BucketRanges {
    bucket: Bucket,
    meta: BlockMeta,
    size: u64,
    runtime: tokio::runtime::Handle,
}

impl BucketRanges {
    /// Asks the bucket for the block's size; an error means the block
    /// cannot be read now (gone, or the bucket unreachable).
    pub(crate) fn open(
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
