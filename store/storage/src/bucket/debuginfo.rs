//! Debug files and the symbol cache, beside the blocks:
//! `debuginfo/<build id>/debuginfo` holds a debug file (uploaded, or
//! fetched from a debuginfod server) for every replica sharing the bucket,
//! and `symbol-cache/<replica>` one replica's resolved addresses. A build
//! id is lowercase hex only, so a key never carries a path.

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use super::{Bucket, bucket_err};
use crate::error::StorageError;

const DEBUGINFO_PREFIX: &str = "debuginfo";
const SYMBOL_CACHE_PREFIX: &str = "symbol-cache";

/// The key of `build_id`'s debug file, when the id is 4 to 128 lowercase
/// hex digits.
fn debuginfo_path(build_id: &str) -> Result<Path, StorageError> {
    let hex = (4..=128).contains(&build_id.len())
        && build_id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex {
        return Err(StorageError::DebugInfoObject {
            key: format!("{DEBUGINFO_PREFIX}/?"),
            message: "a build id is 4 to 128 lowercase hex digits".to_owned(),
        });
    }
    Ok(Path::from(format!(
        "{DEBUGINFO_PREFIX}/{build_id}/debuginfo"
    )))
}

impl Bucket {
    /// Writes `build_id`'s debug file, replacing any before it.
    pub async fn put_debuginfo(&self, build_id: &str, data: Bytes) -> Result<(), StorageError> {
        let path = debuginfo_path(build_id)?;
        self.store
            .put(&path, PutPayload::from_bytes(data))
            .await
            .map_err(bucket_err("put", &path))?;
        Ok(())
    }

    /// `build_id`'s debug file, `None` when there is none; one larger than
    /// `max_bytes` is refused before it is read.
    pub async fn get_debuginfo(
        &self,
        build_id: &str,
        max_bytes: u64,
    ) -> Result<Option<Bytes>, StorageError> {
        let path = debuginfo_path(build_id)?;
        self.get_capped(&path, max_bytes).await
    }

    /// Writes this replica's symbol cache.
    pub async fn put_symbol_cache(&self, replica: &str, data: Bytes) -> Result<(), StorageError> {
        let path = Path::from(format!("{SYMBOL_CACHE_PREFIX}/{replica}"));
        self.store
            .put(&path, PutPayload::from_bytes(data))
            .await
            .map_err(bucket_err("put", &path))?;
        Ok(())
    }

    /// This replica's symbol cache, `None` when it has written none.
    pub async fn get_symbol_cache(
        &self,
        replica: &str,
        max_bytes: u64,
    ) -> Result<Option<Bytes>, StorageError> {
        let path = Path::from(format!("{SYMBOL_CACHE_PREFIX}/{replica}"));
        self.get_capped(&path, max_bytes).await
    }

    async fn get_capped(&self, path: &Path, max_bytes: u64) -> Result<Option<Bytes>, StorageError> {
        let head = match self.store.head(path).await {
            Ok(head) => head,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(source) => return Err(bucket_err("head", path)(source)),
        };
        if head.size > max_bytes {
            return Err(StorageError::DebugInfoObject {
                key: path.to_string(),
                message: format!("{} bytes is over the limit of {max_bytes}", head.size),
            });
        }
        let result = match self.store.get(path).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(source) => return Err(bucket_err("get", path)(source)),
        };
        let bytes = result.bytes().await.map_err(bucket_err("get", path))?;
        if bytes.len() as u64 > max_bytes {
            return Err(StorageError::DebugInfoObject {
                key: path.to_string(),
                message: format!("{} bytes is over the limit of {max_bytes}", bytes.len()),
            });
        }
        Ok(Some(bytes))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn debug_files_are_kept_by_build_id_and_read_within_a_cap() {
        let bucket = Bucket::new(Arc::new(object_store::memory::InMemory::new()));
        assert_eq!(bucket.get_debuginfo("abcd", 10).await.unwrap(), None);
        bucket
            .put_debuginfo("abcd", Bytes::from_static(b"\x7fELF..."))
            .await
            .unwrap();
        assert_eq!(
            bucket.get_debuginfo("abcd", 10).await.unwrap().as_deref(),
            Some(&b"\x7fELF..."[..])
        );
        assert!(bucket.get_debuginfo("abcd", 3).await.is_err());
        for bad in ["", "ABCD", "../x", "ab/cd", "abc"] {
            assert!(
                bucket.put_debuginfo(bad, Bytes::new()).await.is_err(),
                "{bad}"
            );
        }
        bucket
            .put_symbol_cache("kiln-0", Bytes::from_static(b"cache"))
            .await
            .unwrap();
        assert_eq!(
            bucket
                .get_symbol_cache("kiln-0", 10)
                .await
                .unwrap()
                .as_deref(),
            Some(&b"cache"[..])
        );
        assert_eq!(bucket.get_symbol_cache("kiln-1", 10).await.unwrap(), None);
    }
}
