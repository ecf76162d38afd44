//! The catalog: what queries see besides the live head, and what the store
//! knows of its bucket. This part guards the view (heads waiting for
//! upload and the bucket's blocks), the decoded-block cache, the blocks
//! found corrupt, the bucket listing and what it last said, and the query
//! turns. Its locks take their place in the store's one lock order, written
//! in the `store` module's documentation.
//!
//! - `read`: the queries, over the live head, the view and the cache;
//! - `merge`: merges, answered from cached partials where they can be;
//! - `peer_head`: answering a peer's query with this replica's unflushed
//!   data, and choosing what a query reads from its peers' answers;
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
mod peer_head;
mod read;
mod series_census;
mod series_queries;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use kiln_engine::Head;
use kiln_engine::model::BlockMeta;
use kiln_engine::recording::RecordedPoints;
use tokio::sync::Semaphore;

use super::{StoreConfig, lock};
use crate::error::StorageError;
use crate::peers::PeerSource;
use cache::BlockCache;
pub use deadline::with_request_deadline;
pub use incomplete::{Incomplete, note_incomplete, note_symbols_pending, record_incomplete};
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
    /// Peers' requests for this replica's heads being answered now: a pool
    /// apart from `query_runners`, so replicas whose queries all wait on
    /// each other's answers never hold each other's turns.
    pub(super) peer_runners: Arc<Semaphore>,
    /// The other replicas, asked for their unflushed data by every query;
    /// unset for a store alone.
    pub(super) peers: std::sync::OnceLock<Arc<dyn PeerSource>>,
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
            peer_runners: Arc::new(Semaphore::new(config.max_running_queries.div_ceil(2))),
            peers: std::sync::OnceLock::new(),
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

/// Recent uploads remembered at most: ten minutes of one-second flushes.
const MAX_RECENT_UPLOADS: usize = 600;

/// What queries see besides the live head. Replaced as a whole under one
/// lock, so a head moving to a block is never seen twice or not at all.
#[derive(Debug, Default, Clone)]
pub(super) struct View {
    pub(super) frozen: Vec<Arc<Frozen>>,
    /// Every complete block in the bucket by id.
    pub(super) blocks: BTreeMap<String, BlockMeta>,
    /// Blocks superseded by a compacted block that lists them as sources.
    pub(super) hidden: BTreeSet<String>,
    /// Blocks this replica uploaded in the last
    /// [`crate::peers::RECENT_UPLOADS_KEPT`], oldest first, for peers that
    /// have not listed them yet.
    pub(super) recent_uploads: VecDeque<(Instant, BlockMeta)>,
}

impl View {
    pub(super) fn set_blocks(&mut self, blocks: BTreeMap<String, BlockMeta>) {
        self.hidden = crate::planner::superseded_blocks(&blocks);
        self.blocks = blocks;
    }

    /// Records a block this replica just uploaded, forgetting those past
    /// [`crate::peers::RECENT_UPLOADS_KEPT`].
    pub(super) fn note_upload(&mut self, meta: BlockMeta) {
        let now = Instant::now();
        while let Some((at, _)) = self.recent_uploads.front() {
            if now.duration_since(*at) < crate::peers::RECENT_UPLOADS_KEPT
                && self.recent_uploads.len() < MAX_RECENT_UPLOADS
            {
                break;
            }
            self.recent_uploads.pop_front();
        }
        self.recent_uploads.push_back((now, meta));
    }

    /// Remembers, at open, the blocks an earlier process of this replica
    /// uploaded in the last [`crate::peers::RECENT_UPLOADS_KEPT`] (by the
    /// time in their ULIDs): a peer that has not listed them since would
    /// otherwise miss what the replica flushed just before a crash.
    pub(super) fn remember_own_uploads(&mut self, replica: &str, now_ms: i64) {
        let kept_ms = crate::peers::RECENT_UPLOADS_KEPT.as_millis() as i64;
        let now = Instant::now();
        let mut own: Vec<(i64, &BlockMeta)> = self
            .blocks
            .values()
            .filter(|meta| meta.replica == replica)
            .filter_map(|meta| {
                let made_ms = ulid::Ulid::from_string(&meta.id).ok()?.timestamp_ms() as i64;
                let age_ms = now_ms.saturating_sub(made_ms).max(0);
                (age_ms < kept_ms).then_some((age_ms, meta))
            })
            .collect();
        // Oldest first, as uploads are noted.
        own.sort_by_key(|(age_ms, _)| std::cmp::Reverse(*age_ms));
        let skip = own.len().saturating_sub(MAX_RECENT_UPLOADS);
        self.recent_uploads = own
            .into_iter()
            .skip(skip)
            .map(|(age_ms, meta)| {
                let age = std::time::Duration::from_millis(age_ms as u64);
                (now.checked_sub(age).unwrap_or(now), meta.clone())
            })
            .collect();
    }

    /// The blocks uploaded in the last [`crate::peers::RECENT_UPLOADS_KEPT`].
    pub(super) fn recent_uploads(&self) -> Vec<BlockMeta> {
        let now = Instant::now();
        self.recent_uploads
            .iter()
            .filter(|(at, _)| now.duration_since(*at) < crate::peers::RECENT_UPLOADS_KEPT)
            .map(|(_, meta)| meta.clone())
            .collect()
    }

    pub(super) fn visible(&self) -> impl Iterator<Item = &BlockMeta> {
        self.blocks
            .values()
            .filter(|b| !self.hidden.contains(&b.id))
    }
}
