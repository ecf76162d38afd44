//! The `Store` facade: durable ingest into the engine's head, blocks in a
//! bucket, queries over both, and the background loops that keep it tidy.
//!
//! Concurrency: the head is sharded (`live_head`), each shard behind a std
//! `RwLock` that is never held across an `.await`; CPU work (decode, ingest,
//! encode, query) runs on the blocking pool. A tokio `RwLock` (the cut gate) spans each ingest's WAL append and
//! head apply, so a head cut sees every logged record either entirely before
//! or entirely after it: a block holds exactly the WAL segments it replaces.

mod admission;
mod allocator;
mod cache;
mod config;
mod health;
mod idempotency;
mod incomplete;
mod live_head;
mod maintenance;
mod memory_gate;
mod ownership;
mod quarantine;
mod read;
mod recovery;
mod replay;
mod spill;
mod time_window;
mod write;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kiln_engine::Head;
use kiln_engine::model::{BlockMeta, LabelSet};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinHandle;

use crate::bucket::{Bucket, CorruptBlock};
use crate::error::StorageError;
use crate::lease::Lease;
use crate::wal::{ReplayReport, Wal};
pub use admission::{IngestAdmission, IngestTurn};
use cache::BlockCache;
pub use config::{AcceptedTimes, StoreConfig};
pub use health::{HealthProblem, StoreHealth};
pub use incomplete::{Incomplete, record_incomplete};
pub use maintenance::CompactionReport;

/// One profile to ingest, as a client sent it.
#[derive(Debug, Clone)]
pub struct IngestRequest {
    /// Series labels; must include `__name__`.
    pub labels: LabelSet,
    /// Profile time, unix ms. `None`: the pprof's `time_nanos`, else now.
    pub time_ms: Option<i64>,
    /// Profile duration in ns. `None`: the pprof's `duration_nanos`.
    pub duration_nanos: Option<i64>,
    /// The pprof bytes as received, gzipped or not.
    pub pprof: bytes::Bytes,
}

/// A snapshot of the store's state, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    /// Approximate bytes held by the head.
    pub head_bytes: u64,
    /// Profiles in the head.
    pub head_profiles: u64,
    /// Heads cut but not yet uploaded (upload failures keep them here).
    pub pending_uploads: u64,
    /// Bytes those heads held when they were cut.
    pub pending_upload_bytes: u64,
    /// Blocks visible to queries (all replicas).
    pub blocks: u64,
    /// Total bytes of those blocks.
    pub block_bytes: u64,
    /// Blocks skipped because they are corrupt.
    pub corrupt_blocks: u64,
    /// Bytes reserved right now by ingests being decoded and applied.
    pub ingest_memory_reserved_bytes: u64,
    /// Memory held by decoded blocks in the cache (their approximate
    /// decoded size, the same measure the cache budget counts).
    pub cache_bytes: u64,
    /// Decoded blocks held in the cache.
    pub cache_blocks: u64,
    /// Profiles acknowledged since start.
    pub profiles_ingested: u64,
    /// Sample values stored since start.
    pub samples_ingested: u64,
    /// Bytes of pprof acknowledged since start.
    pub bytes_ingested: u64,
    /// Records replayed from the WAL at open.
    pub wal_replayed: u64,
    /// Blocks uploaded by this process.
    pub blocks_written: u64,
    /// Failed flush attempts.
    pub flush_failures: u64,
    /// Compactions done by this process.
    pub compactions: u64,
    /// Blocks deleted by retention in this process.
    pub retention_deleted: u64,
}

#[derive(Debug, Default)]
struct Counters {
    profiles: AtomicU64,
    samples: AtomicU64,
    bytes: AtomicU64,
    blocks_written: AtomicU64,
    flush_failures: AtomicU64,
    compactions: AtomicU64,
    retention_deleted: AtomicU64,
    /// Records set aside while replaying WAL ranges held at open.
    late_quarantined: AtomicU64,
}

/// A head that was cut and awaits upload, as the shards it was cut from
/// (one head for what WAL replay cut); still queried until its block is
/// visible. `id` is fixed at cut time so retried uploads are idempotent.
#[derive(Debug)]
struct Frozen {
    id: String,
    heads: Vec<Head>,
    first_segment: u64,
    end_segment: u64,
    /// The heads' size when they were cut, for the upload budget.
    bytes: u64,
}

impl Frozen {
    fn new(heads: Vec<Head>, first_segment: u64, end_segment: u64) -> Self {
        Self {
            id: ulid::Ulid::new().to_string(),
            bytes: heads.iter().map(|h| h.approx_bytes() as u64).sum(),
            heads,
            first_segment,
            end_segment,
        }
    }

    /// True when no head holds a value (its segments held only refused records).
    fn is_empty(&self) -> bool {
        self.heads.iter().all(Head::is_empty)
    }
}

/// What queries see besides the live head. Replaced as a whole under one
/// lock, so a head moving to a block is never seen twice or not at all.
#[derive(Debug, Default, Clone)]
struct View {
    frozen: Vec<Arc<Frozen>>,
    /// Every complete block in the bucket by id.
    blocks: BTreeMap<String, BlockMeta>,
    /// Blocks superseded by a compacted block that lists them as sources.
    hidden: BTreeSet<String>,
}

impl View {
    fn set_blocks(&mut self, blocks: BTreeMap<String, BlockMeta>) {
        self.hidden = crate::planner::superseded_blocks(&blocks);
        self.blocks = blocks;
    }

    fn visible(&self) -> impl Iterator<Item = &BlockMeta> {
        self.blocks
            .values()
            .filter(|b| !self.hidden.contains(&b.id))
    }
}

#[derive(Debug)]
struct Shared {
    config: StoreConfig,
    bucket: Bucket,
    wal: Wal,
    cut_gate: tokio::sync::RwLock<()>,
    head: live_head::LiveHead,
    view: RwLock<View>,
    cache: Mutex<BlockCache>,
    corrupt: Mutex<BTreeMap<String, String>>,
    /// What the store last learned of its bucket, for health.
    bucket_state: Mutex<health::BucketState>,
    /// Flush markers whose block's state was unknown at open (the bucket
    /// did not answer): their WAL segments are neither replayed nor
    /// deleted until a listing says (audit D4).
    held: Mutex<Vec<recovery::Marker>>,
    /// Serializes bucket listing, uploads, compaction and retention, so a
    /// listing never overwrites a block added while it ran.
    maintenance: tokio::sync::Mutex<()>,
    /// Serializes re-listings.
    listing: tokio::sync::Mutex<()>,
    /// Re-listings completed, so queries that found a block gone at once
    /// share one re-listing (read without waiting for one in progress).
    listings_done: AtomicU64,
    /// This process's claim on its replica name (audit D5).
    replica_lease: Lease,
    /// Whether this process runs retention for the bucket (audit D5).
    retention_lease: Lease,
    /// Idempotency keys of recently stored profiles (audit G7).
    recent_keys: Mutex<idempotency::RecentKeys>,
    /// The data directory's lock, held open until shutdown.
    data_dir_lock: Mutex<Option<std::fs::File>>,
    /// Write slots (`max_inflight_ingests`), taken by `admit_ingest`.
    inflight: Arc<Semaphore>,
    /// Turns to decode or apply an ingest (`ingest_workers`), taken by
    /// `ingest_turn`.
    ingest_turns: Arc<Semaphore>,
    /// Queries reading heads and blocks now (`max_running_queries`).
    query_runners: Arc<Semaphore>,
    /// Bytes reserved by ingests being decoded and applied.
    ingest_memory: memory_gate::MemoryGate,
    closed: AtomicBool,
    shutdown_tx: watch::Sender<bool>,
    flush_now: Notify,
    counters: Counters,
    replay: ReplayReport,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    /// Bytes the live head and the heads waiting for upload may hold
    /// together before ingest is refused.
    fn unuploaded_budget(&self) -> u64 {
        (self.config.max_head_bytes as u64).saturating_add(self.config.max_pending_upload_bytes)
    }

    /// True for a WAL segment held back at open; never deleted.
    fn is_held(&self, segment: u64) -> bool {
        lock(&self.held)
            .iter()
            .any(|m| m.first <= segment && segment < m.end)
    }
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // Poisoning means a panic elsewhere mid-update; the data structures are
    // replaced wholesale, so continuing beats cascading the panic.
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The profile store: cheap to clone, all clones share one store.
#[derive(Debug, Clone)]
pub struct Store {
    shared: Arc<Shared>,
}

impl Store {
    /// Opens the store: lists the bucket's blocks, replays the WAL into the
    /// head (cut into heads waiting for upload every `max_head_bytes`), and
    /// starts the background loops (if enabled). When the bucket answers,
    /// every acknowledged write is queryable when this returns. When it
    /// cannot be listed within `open_listing_timeout`, the store opens
    /// anyway: it takes writes and answers from the WAL, keeps the WAL
    /// ranges whose upload it cannot confirm, and lists again in the
    /// background; [`Store::health`] says what is missing meanwhile.
    ///
    /// `bucket` is a [`Bucket`] ([`crate::bucket::BucketConfig::open`]
    /// reads a local directory's blocks without the object store) or any
    /// object store.
    pub async fn open(
        config: StoreConfig,
        bucket: impl Into<Bucket>,
    ) -> Result<Store, StorageError> {
        config.validate()?;
        allocator::bound_allocator_retention();
        let data_dir_lock = ownership::lock_data_dir(&config)?;
        // Merges a killed process left half-written; their sources remain.
        spill::reset_spill_dir(&config.data_dir)?;
        let holder = ownership::holder_id(&config)?;
        let bucket = bucket.into();
        let replica_lease = ownership::replica_lease(&bucket, &config, &holder);
        ownership::claim_replica_name(&replica_lease, &config).await?;
        let retention_lease = ownership::retention_lease(&bucket, &config, &holder);
        let recovered = recovery::recover(&config, &bucket).await?;
        let recent_keys = write::recover_keys(&config).await?;
        let (shutdown_tx, _) = watch::channel(false);
        let mut view = View::default();
        let listed = recovered.listing.is_some();
        let listing = recovered.listing.unwrap_or_default();
        view.set_blocks(listing.blocks);
        view.frozen = recovered.frozen.into_iter().map(Arc::new).collect();
        let upload_now = !view.frozen.is_empty();
        let corrupt = listing
            .corrupt
            .into_iter()
            .map(|c| (c.id, c.error))
            .collect();
        let head =
            live_head::LiveHead::new(config.head_shards, recovered.head, recovered.first_segment);
        let shared = Arc::new(Shared {
            inflight: Arc::new(Semaphore::new(config.max_inflight_ingests)),
            ingest_turns: Arc::new(Semaphore::new(config.ingest_workers)),
            query_runners: Arc::new(Semaphore::new(config.max_running_queries)),
            ingest_memory: memory_gate::MemoryGate::new(config.ingest_memory_bytes),
            cache: Mutex::new(BlockCache::new(config.block_cache_bytes)),
            config,
            bucket,
            wal: recovered.wal,
            cut_gate: tokio::sync::RwLock::new(()),
            head,
            view: RwLock::new(view),
            corrupt: Mutex::new(corrupt),
            bucket_state: Mutex::new(health::BucketState::new(listed, recovered.listing_error)),
            held: Mutex::new(recovered.held),
            maintenance: tokio::sync::Mutex::new(()),
            listing: tokio::sync::Mutex::new(()),
            listings_done: AtomicU64::new(0),
            replica_lease,
            retention_lease,
            recent_keys: Mutex::new(recent_keys),
            data_dir_lock: Mutex::new(Some(data_dir_lock)),
            closed: AtomicBool::new(false),
            shutdown_tx,
            flush_now: Notify::new(),
            counters: Counters::default(),
            replay: recovered.report,
            tasks: Mutex::new(Vec::new()),
        });
        let store = Store { shared };
        if store.shared.config.background {
            maintenance::spawn_loops(&store);
            if upload_now {
                // Heads cut during replay go to the bucket now, not a
                // flush interval later.
                store.shared.flush_now.notify_one();
            }
        }
        Ok(store)
    }

    /// The configuration the store was opened with.
    pub fn config(&self) -> &StoreConfig {
        &self.shared.config
    }

    /// What WAL replay found at open.
    pub fn replay_report(&self) -> &ReplayReport {
        &self.shared.replay
    }

    /// Blocks that were skipped because they could not be read or decoded.
    pub fn corrupt_blocks(&self) -> Vec<CorruptBlock> {
        lock(&self.shared.corrupt)
            .iter()
            .map(|(id, error)| CorruptBlock {
                id: id.clone(),
                error: error.clone(),
            })
            .collect()
    }

    /// Metadata of the blocks queries currently read, oldest id first.
    pub fn blocks(&self) -> Vec<BlockMeta> {
        read(&self.shared.view).visible().cloned().collect()
    }

    /// A snapshot of counters and sizes for metrics.
    pub fn stats(&self) -> StoreStats {
        let shared = &self.shared;
        let (head_bytes, head_profiles) =
            (shared.head.approx_bytes() as u64, shared.head.profiles());
        let (cache_bytes, cache_blocks) = {
            let cache = lock(&shared.cache);
            (cache.used_bytes(), cache.len() as u64)
        };
        let view = read(&shared.view);
        let c = &shared.counters;
        StoreStats {
            head_bytes,
            head_profiles,
            pending_uploads: view.frozen.len() as u64,
            pending_upload_bytes: view.frozen.iter().map(|f| f.bytes).sum(),
            blocks: view.visible().count() as u64,
            block_bytes: view.visible().map(|b| b.size_bytes).sum(),
            corrupt_blocks: lock(&shared.corrupt).len() as u64,
            ingest_memory_reserved_bytes: shared.ingest_memory.reserved_bytes(),
            cache_bytes,
            cache_blocks,
            profiles_ingested: c.profiles.load(Ordering::Relaxed),
            samples_ingested: c.samples.load(Ordering::Relaxed),
            bytes_ingested: c.bytes.load(Ordering::Relaxed),
            wal_replayed: shared.replay.records,
            blocks_written: c.blocks_written.load(Ordering::Relaxed),
            flush_failures: c.flush_failures.load(Ordering::Relaxed),
            compactions: c.compactions.load(Ordering::Relaxed),
            retention_deleted: c.retention_deleted.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting writes, stops the background loops, and flushes the
    /// head to the bucket. Data that cannot be uploaded stays in the WAL
    /// and is recovered at the next open.
    pub async fn shutdown(&self) -> Result<(), StorageError> {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.shutdown_tx.send_replace(true);
        let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.shared.tasks));
        for task in tasks {
            if let Err(err) = task.await {
                tracing::warn!(error = %err, "background task ended abnormally");
            }
        }
        // Wait for in-flight ingests: they hold the gate while logging.
        drop(self.shared.cut_gate.write().await);
        let flushed = self.flush().await;
        self.release_leases().await;
        // Nothing writes to the data directory any more.
        drop(lock(&self.shared.data_dir_lock).take());
        flushed
    }
}
