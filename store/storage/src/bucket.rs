//! Blocks in object storage. Layout: `blocks/<replica>/<ulid>/data`, then
//! `blocks/<replica>/<ulid>/meta.json`, written last, so a block without
//! `meta.json` is incomplete (an upload in progress or interrupted) and is
//! not listed. The replica in the path owns the block: only that replica
//! cleans up its incomplete uploads, and it can tell them apart from a
//! listing alone. Another replica cannot know whether an upload is still
//! being retried: deleting one it took for abandoned (after an outage of
//! more than an hour) would lose data whose WAL segments were already gone.
//!
//! Migration: buckets written before per-replica prefixes hold
//! `blocks/<ulid>/...`. Those blocks stay readable by every replica, and
//! are compacted, cleaned up and expired like the others, owned by the
//! replica named in their `meta.json`; new blocks (compaction outputs
//! included) are always written under the owner's prefix. An incomplete
//! upload at the old layout has no owner to ask; it is deleted only once
//! retention would have deleted it as a block (see `Store::refresh_blocks`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use kiln_engine::model::BlockMeta;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::error::StorageError;

mod config;
mod debuginfo;
mod local_files;
mod ranges;
mod recorded;

pub use config::BucketConfig;
use local_files::LocalFiles;
pub(crate) use ranges::BucketRanges;
pub use recorded::{RecordedKind, RecordedName};

const BLOCKS_PREFIX: &str = "blocks";
const DATA_FILE: &str = "data";
const META_FILE: &str = "meta.json";

/// A block that is listed but could not be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CorruptBlock {
    /// The block id.
    pub id: String,
    /// What went wrong reading it.
    pub error: String,
}

/// The result of listing the bucket.
#[derive(Debug, Default)]
pub struct Listing {
    /// Complete blocks by id.
    pub blocks: BTreeMap<String, BlockMeta>,
    /// Blocks whose `meta.json` exists but cannot be read or parsed.
    pub corrupt: Vec<CorruptBlock>,
    /// Blocks with data but no `meta.json` (uploads in progress or abandoned).
    pub incomplete: Vec<IncompleteUpload>,
}

/// A block directory with data but no `meta.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncompleteUpload {
    /// The block id.
    pub id: String,
    /// The replica whose prefix holds it; `None` at the old layout
    /// (`blocks/<ulid>/`), which names no owner.
    pub owner: Option<String>,
}

/// Parts of a block uploaded from a file: at least the 5 MiB S3 asks of
/// every part but the last.
pub const UPLOAD_PART_BYTES: usize = 5 << 20;

/// Reads `file` part by part into `upload` and completes it.
async fn upload_parts(
    upload: &mut dyn object_store::MultipartUpload,
    file: &std::path::Path,
    object: &Path,
) -> Result<(), StorageError> {
    let spill = |op| {
        let path = file.to_path_buf();
        move |source| StorageError::Spill { op, path, source }
    };
    let mut reader = Some(std::fs::File::open(file).map_err(spill("open"))?);
    loop {
        let Some(mut from) = reader.take() else {
            break;
        };
        // Reading a part from local disk blocks; keep it off the runtime.
        let (from, part) = tokio::task::spawn_blocking(move || {
            let mut part = Vec::with_capacity(UPLOAD_PART_BYTES);
            let read = std::io::Read::read_to_end(
                &mut std::io::Read::take(&mut from, UPLOAD_PART_BYTES as u64),
                &mut part,
            );
            (from, read.map(|_| part))
        })
        .await
        .map_err(|e| StorageError::task("reading a block part", e))?;
        let part = part.map_err(spill("read"))?;
        let last = part.len() < UPLOAD_PART_BYTES;
        if !part.is_empty() {
            upload
                .put_part(PutPayload::from(part))
                .await
                .map_err(bucket_err("put", object))?;
        }
        if !last {
            reader = Some(from);
        }
    }
    upload.complete().await.map_err(bucket_err("put", object))?;
    Ok(())
}

/// Block storage over any [`ObjectStore`].
#[derive(Debug, Clone)]
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// Ids of blocks found at the old layout (`blocks/<ulid>/`); every other
    /// block lives under its replica's prefix. Only ever learnt from
    /// listings, since no block is written at the old layout any more.
    legacy: Arc<Mutex<BTreeSet<String>>>,
    /// A local directory's files, read by range without the object store.
    files: Option<Arc<LocalFiles>>,
}

impl From<Arc<dyn ObjectStore>> for Bucket {
    fn from(store: Arc<dyn ObjectStore>) -> Self {
        Self::new(store)
    }
}

/// Where a block's files are: under its owner's prefix, or at the old
/// layout when `owner` is `None`.
fn block_path(owner: Option<&str>, id: &str, file: &str) -> Path {
    match owner {
        Some(replica) => Path::from(format!("{BLOCKS_PREFIX}/{replica}/{id}/{file}")),
        None => Path::from(format!("{BLOCKS_PREFIX}/{id}/{file}")),
    }
}

/// One block directory found by a listing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Located {
    id: String,
    owner: Option<String>,
}

/// The block directory an object path is in, and the file's name:
/// `blocks/<ulid>/<file>` (old layout) or `blocks/<replica>/<ulid>/<file>`.
fn locate(path: &Path) -> Option<(Located, String)> {
    let parts: Vec<String> = path.parts().map(|p| p.as_ref().to_string()).collect();
    match parts.as_slice() {
        [blocks, id, file] if blocks == BLOCKS_PREFIX && is_block_id(id) => Some((
            Located {
                id: id.clone(),
                owner: None,
            },
            file.clone(),
        )),
        [blocks, owner, id, file] if blocks == BLOCKS_PREFIX && is_block_id(id) => Some((
            Located {
                id: id.clone(),
                owner: Some(owner.clone()),
            },
            file.clone(),
        )),
        _ => None,
    }
}

fn bucket_err(op: &'static str, path: &Path) -> impl FnOnce(object_store::Error) -> StorageError {
    let path = path.to_string();
    move |source| StorageError::Bucket { op, path, source }
}

/// True for ids we created: ULIDs (so a stray `blocks/../` entry cannot
/// smuggle a path).
fn is_block_id(id: &str) -> bool {
    ulid::Ulid::from_string(id).is_ok()
}

impl Bucket {
    /// Wraps an object store.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            store,
            legacy: Arc::default(),
            files: None,
        }
    }

    /// The object store underneath, for leases.
    pub(crate) fn object_store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.store)
    }

    /// Where a listed or uploaded block lives.
    fn owner_of<'a>(&self, meta: &'a BlockMeta) -> Option<&'a str> {
        let legacy = self.legacy.lock().unwrap_or_else(|e| e.into_inner());
        (!legacy.contains(&meta.id)).then_some(meta.replica.as_str())
    }

    /// Uploads a block under its replica's prefix: data first, then
    /// `meta.json`, which makes it visible.
    pub async fn put_block(&self, meta: &BlockMeta, data: Bytes) -> Result<(), StorageError> {
        let owner = Some(meta.replica.as_str());
        let data_path = block_path(owner, &meta.id, DATA_FILE);
        self.store
            .put(&data_path, PutPayload::from_bytes(data))
            .await
            .map_err(bucket_err("put", &data_path))?;
        let meta_path = block_path(owner, &meta.id, META_FILE);
        let json = serde_json::to_vec_pretty(meta).map_err(|source| StorageError::BlockMeta {
            id: meta.id.clone(),
            source,
        })?;
        self.store
            .put(&meta_path, PutPayload::from(json))
            .await
            .map_err(bucket_err("put", &meta_path))?;
        Ok(())
    }

    /// Reads a block's data object.
    pub async fn get_block_data(&self, meta: &BlockMeta) -> Result<Bytes, StorageError> {
        let path = block_path(self.owner_of(meta), &meta.id, DATA_FILE);
        let result = self
            .store
            .get(&path)
            .await
            .map_err(bucket_err("get", &path))?;
        result.bytes().await.map_err(bucket_err("get", &path))
    }

    /// The size of a block's data object.
    pub async fn block_data_size(&self, meta: &BlockMeta) -> Result<u64, StorageError> {
        let path = block_path(self.owner_of(meta), &meta.id, DATA_FILE);
        let object = self
            .store
            .head(&path)
            .await
            .map_err(bucket_err("head", &path))?;
        Ok(object.size)
    }

    /// Reads `range` of a block's data object (compaction reads its
    /// sources this way, never whole).
    pub async fn get_block_range(
        &self,
        meta: &BlockMeta,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, StorageError> {
        let path = block_path(self.owner_of(meta), &meta.id, DATA_FILE);
        self.store
            .get_range(&path, range)
            .await
            .map_err(bucket_err("get", &path))
    }

    /// Appends `len` bytes of a block's data object at `offset` to `buf`
    /// from a local directory's file, on the calling thread; `None` when
    /// the bucket is not a local directory (ask [`Self::get_block_range`]).
    pub fn read_local_block_range(
        &self,
        meta: &BlockMeta,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Option<std::io::Result<()>> {
        let files = self.files.as_ref()?;
        let path = block_path(self.owner_of(meta), &meta.id, DATA_FILE);
        Some(files.read_range(&path, offset, len, buf))
    }

    /// Uploads a block whose data lies in the local file `data` (a
    /// compaction's spilled output) in parts of [`UPLOAD_PART_BYTES`], so
    /// at most one part is in memory; then `meta.json`, which makes it
    /// visible. An interrupted part upload is aborted.
    pub async fn put_block_file(
        &self,
        meta: &BlockMeta,
        data: &std::path::Path,
    ) -> Result<(), StorageError> {
        let owner = Some(meta.replica.as_str());
        let data_path = block_path(owner, &meta.id, DATA_FILE);
        let mut upload = self
            .store
            .put_multipart(&data_path)
            .await
            .map_err(bucket_err("put", &data_path))?;
        match upload_parts(upload.as_mut(), data, &data_path).await {
            Ok(()) => {}
            Err(err) => {
                if let Err(abort) = upload.abort().await {
                    tracing::warn!(path = %data_path, error = %abort, "aborting a failed part upload failed");
                }
                return Err(err);
            }
        }
        self.put_meta(meta).await
    }

    async fn put_meta(&self, meta: &BlockMeta) -> Result<(), StorageError> {
        let meta_path = block_path(Some(meta.replica.as_str()), &meta.id, META_FILE);
        let json = serde_json::to_vec_pretty(meta).map_err(|source| StorageError::BlockMeta {
            id: meta.id.clone(),
            source,
        })?;
        self.store
            .put(&meta_path, PutPayload::from(json))
            .await
            .map_err(bucket_err("put", &meta_path))?;
        Ok(())
    }

    /// Reads and parses one block's `meta.json`; under a replica's prefix,
    /// the meta must name that replica.
    async fn get_meta(&self, block: &Located) -> Result<BlockMeta, StorageError> {
        let id = &block.id;
        let path = block_path(block.owner.as_deref(), id, META_FILE);
        let bytes = self
            .store
            .get(&path)
            .await
            .map_err(bucket_err("get", &path))?
            .bytes()
            .await
            .map_err(bucket_err("get", &path))?;
        let meta: BlockMeta =
            serde_json::from_slice(&bytes).map_err(|source| StorageError::BlockMeta {
                id: id.to_string(),
                source,
            })?;
        if meta.id != *id {
            return Err(StorageError::MetaMismatch {
                id: id.to_string(),
                found: meta.id,
            });
        }
        if let Some(owner) = &block.owner
            && *owner != meta.replica
        {
            return Err(StorageError::OwnerMismatch {
                id: id.to_string(),
                prefix: owner.clone(),
                replica: meta.replica,
            });
        }
        Ok(meta)
    }

    /// The `meta.json` of a block `replica` wrote: under its prefix, or at
    /// the old layout when a release before per-replica prefixes wrote it.
    pub async fn get_own_meta(&self, replica: &str, id: &str) -> Result<BlockMeta, StorageError> {
        let owned = Located {
            id: id.to_string(),
            owner: Some(replica.to_string()),
        };
        match self.get_meta(&owned).await {
            Err(StorageError::Bucket {
                source: object_store::Error::NotFound { .. },
                ..
            }) => {}
            found => return found,
        }
        let legacy = Located {
            id: id.to_string(),
            owner: None,
        };
        let meta = self.get_meta(&legacy).await?;
        self.legacy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string());
        Ok(meta)
    }

    /// Block directories with a `meta.json`, and those without.
    async fn list_ids(&self) -> Result<(Vec<Located>, Vec<Located>), StorageError> {
        let prefix = Path::from(BLOCKS_PREFIX);
        let mut with_meta = BTreeSet::new();
        let mut seen = BTreeSet::new();
        let mut stream = self.store.list(Some(&prefix));
        while let Some(item) = stream.next().await {
            let object = item.map_err(bucket_err("list", &prefix))?;
            let Some((block, file)) = locate(&object.location) else {
                continue;
            };
            if file == META_FILE {
                with_meta.insert(block.clone());
            }
            seen.insert(block);
        }
        {
            let mut legacy = self.legacy.lock().unwrap_or_else(|e| e.into_inner());
            legacy.extend(
                seen.iter()
                    .filter(|b| b.owner.is_none())
                    .map(|b| b.id.clone()),
            );
        }
        let incomplete = seen.difference(&with_meta).cloned().collect();
        Ok((with_meta.into_iter().collect(), incomplete))
    }

    /// Lists complete blocks. Metas already known (`known`) are reused
    /// rather than fetched again, since blocks are immutable, and ids in
    /// `skip` (already known to be corrupt) are not fetched at all. A listing
    /// failure is an error; an unparsable meta is reported in
    /// [`Listing::corrupt`] and skipped.
    pub async fn list_blocks(
        &self,
        known: &BTreeMap<String, BlockMeta>,
        skip: &BTreeSet<String>,
    ) -> Result<Listing, StorageError> {
        let (complete, incomplete) = self.list_ids().await?;
        let mut listing = Listing {
            incomplete: incomplete
                .into_iter()
                .map(|b| IncompleteUpload {
                    id: b.id,
                    owner: b.owner,
                })
                .collect(),
            ..Listing::default()
        };
        for block in complete {
            let id = block.id.clone();
            if skip.contains(&id) {
                continue;
            }
            if let Some(meta) = known.get(&id) {
                listing.blocks.insert(id, meta.clone());
                continue;
            }
            match self.get_meta(&block).await {
                Ok(meta) => {
                    listing.blocks.insert(id, meta);
                }
                Err(StorageError::Bucket {
                    source: object_store::Error::NotFound { .. },
                    ..
                }) => {
                    // Deleted between list and get (compaction or retention elsewhere).
                }
                Err(err @ StorageError::Bucket { .. }) => {
                    // Possibly transient: not corrupt, just not visible until
                    // a later listing reads it.
                    tracing::warn!(block = %id, error = %err, "cannot read block meta; will retry");
                }
                Err(err) => {
                    tracing::warn!(block = %id, error = %err, "skipping unreadable block meta");
                    listing.corrupt.push(CorruptBlock {
                        id,
                        error: err.to_string(),
                    });
                }
            }
        }
        Ok(listing)
    }

    /// Deletes a block: `meta.json` first (so it disappears from listings
    /// atomically), then its data. Missing objects are not an error.
    pub async fn delete_block(&self, meta: &BlockMeta) -> Result<(), StorageError> {
        let owner = self.owner_of(meta).map(str::to_string);
        self.delete_files(owner.as_deref(), &meta.id).await?;
        if owner.is_none() {
            let mut legacy = self.legacy.lock().unwrap_or_else(|e| e.into_inner());
            legacy.remove(&meta.id);
        }
        Ok(())
    }

    /// Deletes what an incomplete upload left.
    pub async fn delete_incomplete(&self, upload: &IncompleteUpload) -> Result<(), StorageError> {
        self.delete_files(upload.owner.as_deref(), &upload.id).await
    }

    async fn delete_files(&self, owner: Option<&str>, id: &str) -> Result<(), StorageError> {
        for file in [META_FILE, DATA_FILE] {
            let path = block_path(owner, id, file);
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(source) => return Err(bucket_err("delete", &path)(source)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
