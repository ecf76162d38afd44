//! The catalog: what queries see besides the live head, and what the store
//! knows of its bucket. This part guards the view (heads waiting for
//! upload and the bucket's blocks), the decoded-block cache, the blocks
//! found corrupt, the bucket listing and what it last said, and the query
//! turns. Its locks take their place in the store's one lock order, written
//! in the `store` module's documentation.
//!
//! - `read`: the queries, over the live head, the view and the cache;
//! - `merge`: merges, answered from cached partials where they can be;
//! - `listing`: listing the bucket again into the view;
//! - `cache`: decoded blocks and merge partials, within a byte budget;
//! - `deadline`: one deadline for all the visits of a request;
//! - `incomplete`: what a query could not read, beside its answer;
//! - `series_census`: the census of retained series kept in step with the
//!   listed blocks.

mod cache;
mod deadline;
mod incomplete;
mod listing;
mod merge;
mod read;
mod series_census;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

use kiln_engine::Head;
use kiln_engine::model::BlockMeta;
use kiln_engine::recording::RecordedPoints;
use tokio::sync::Semaphore;

use super::{StoreConfig, lock};
use crate::error::StorageError;
use cache::BlockCache;
pub use deadline::with_request_deadline;
pub use incomplete::{Incomplete, record_incomplete};
pub use read::{Listing, MAX_LISTED};
pub use series_census::SeriesCensusStats;

/// What queries read besides the live head.
#[derive(Debug)]
pub(super) struct Catalog {
    /// The heads waiting for upload and the bucket's blocks.
    pub(super) view: RwLock<View>,
    /// Decoded blocks and merge partials.
    pub(super) cache: Mutex<BlockCache>,
    /// Blocks that could not be read or decoded, by id, with why.
    pub(super) corrupt: Mutex<BTreeMap<String, String>>,
    /// What the store last learned of its bucket, for health.
    pub(super) bucket_state: Mutex<BucketState>,
    /// Serializes re-listings.
    pub(super) listing: tokio::sync::Mutex<()>,
    /// Re-listings completed, so queries that found a block gone at once
    /// share one re-listing (read without waiting for one in progress).
    pub(super) listings_done: AtomicU64,
    /// Queries reading heads and blocks now (`max_running_queries`).
    pub(super) query_runners: Arc<Semaphore>,
}

impl Catalog {
    /// The catalog as opening found it.
    pub(super) fn new(
        config: &StoreConfig,
        view: View,
        corrupt: BTreeMap<String, String>,
        bucket_state: BucketState,
    ) -> Self {
        Self {
            view: RwLock::new(view),
            cache: Mutex::new(BlockCache::new(config.block_cache_bytes)),
            corrupt: Mutex::new(corrupt),
            bucket_state: Mutex::new(bucket_state),
            listing: tokio::sync::Mutex::new(()),
            listings_done: AtomicU64::new(0),
            query_runners: Arc::new(Semaphore::new(config.max_running_queries)),
        }
    }

    /// True once a listing has succeeded since open.
    pub(super) fn bucket_listed(&self) -> bool {
        lock(&self.bucket_state).listed
    }

    /// Records a listing's outcome and hands the result on.
    pub(super) fn note_listing<T>(
        &self,
        result: Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let mut state = lock(&self.bucket_state);
        match &result {
            Ok(_) => {
                state.listed = true;
                state.last_error = None;
            }
            Err(err) => state.last_error = Some(err.to_string()),
        }
        result
    }

    /// Records the outcome of any other bucket operation (an upload, a
    /// block's metadata): a success shows the bucket answers again.
    pub(super) fn note_bucket<T>(&self, result: &Result<T, StorageError>) {
        let mut state = lock(&self.bucket_state);
        match result {
            Ok(_) => state.last_error = None,
            Err(err @ StorageError::Bucket { .. }) => state.last_error = Some(err.to_string()),
            // Encoding, the local disk: not the bucket's doing.
            Err(_) => {}
        }
    }
}

/// What the store last learned of its bucket.
#[derive(Debug, Default)]
pub(super) struct BucketState {
    /// A listing has succeeded since the store opened, so queries see every
    /// block (before that they see none).
    pub(super) listed: bool,
    /// The latest bucket operation's failure; the next success clears it.
    pub(super) last_error: Option<String>,
}

impl BucketState {
    pub(super) fn new(listed: bool, last_error: Option<String>) -> Self {
        Self { listed, last_error }
    }
}

/// A head that was cut and awaits upload, as the shards it was cut from
/// (one head for what WAL replay cut); still queried until its block is
/// visible. `id` is fixed at cut time so retried uploads are idempotent.
#[derive(Debug)]
pub(super) struct Frozen {
    pub(super) id: String,
    pub(super) heads: Vec<Head>,
    pub(super) first_segment: u64,
    pub(super) end_segment: u64,
    /// The heads' size when they were cut, for the upload budget.
    pub(super) bytes: u64,
    /// What recording rules made of the heads' profiles.
    pub(super) recorded: Arc<RecordedPoints>,
}

impl Frozen {
    pub(super) fn new(
        heads: Vec<Head>,
        recorded: RecordedPoints,
        first_segment: u64,
        end_segment: u64,
    ) -> Self {
        Self {
            recorded: Arc::new(recorded),
            id: ulid::Ulid::new().to_string(),
            bytes: heads.iter().map(|h| h.approx_bytes() as u64).sum(),
            heads,
            first_segment,
            end_segment,
        }
    }

    /// True when no head holds a value (its segments held only refused records).
    pub(super) fn is_empty(&self) -> bool {
        self.heads.iter().all(Head::is_empty)
    }
}

/// What queries see besides the live head. Replaced as a whole under one
/// lock, so a head moving to a block is never seen twice or not at all.
#[derive(Debug, Default, Clone)]
pub(super) struct View {
    pub(super) frozen: Vec<Arc<Frozen>>,
    /// Every complete block in the bucket by id.
    pub(super) blocks: BTreeMap<String, BlockMeta>,
    /// Blocks superseded by a compacted block that lists them as sources.
    pub(super) hidden: BTreeSet<String>,
}

impl View {
    pub(super) fn set_blocks(&mut self, blocks: BTreeMap<String, BlockMeta>) {
        self.hidden = crate::planner::superseded_blocks(&blocks);
        self.blocks = blocks;
    }

    pub(super) fn visible(&self) -> impl Iterator<Item = &BlockMeta> {
        self.blocks
            .values()
            .filter(|b| !self.hidden.contains(&b.id))
    }
}
