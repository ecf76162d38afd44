//! Debug files and this replica's symbol cache in the bucket, for the
//! server's symbolizer: one shared copy of each debug file per build id,
//! whichever replica took the upload or fetched it.

use bytes::Bytes;

use super::Store;
use crate::error::StorageError;

impl Store {
    /// Keeps `build_id`'s debug file (lowercase hex id) for every replica.
    pub async fn put_debuginfo(&self, build_id: &str, data: Bytes) -> Result<(), StorageError> {
        self.shared.bucket.put_debuginfo(build_id, data).await
    }

    /// `build_id`'s debug file, `None` when none was kept; one over
    /// `max_bytes` is an error, never read.
    pub async fn debuginfo(
        &self,
        build_id: &str,
        max_bytes: u64,
    ) -> Result<Option<Bytes>, StorageError> {
        self.shared.bucket.get_debuginfo(build_id, max_bytes).await
    }

    /// Replaces this replica's symbol cache.
    pub async fn put_symbol_cache(&self, data: Bytes) -> Result<(), StorageError> {
        let replica = &self.shared.config.replica;
        self.shared.bucket.put_symbol_cache(replica, data).await
    }

    /// This replica's symbol cache as last written, `None` when it wrote
    /// none; one over `max_bytes` is an error, never read.
    pub async fn symbol_cache(&self, max_bytes: u64) -> Result<Option<Bytes>, StorageError> {
        let replica = &self.shared.config.replica;
        self.shared
            .bucket
            .get_symbol_cache(replica, max_bytes)
            .await
    }
}
