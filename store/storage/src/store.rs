//! The `Store` facade: durable ingest into the engine's head, blocks in a
//! bucket, queries over both, and the background loops that keep it tidy.
//!
//! What the store's clones share (`Shared`) is split by concern, one
//! module each, and the `impl Store` files live under the concern they
//! serve:
//! - `ingest`: the write-ahead log, the live head and its shards, the
//!   turns and memory budget writes take, and the idempotency keys;
//! - `catalog`: what queries see (the view of cut heads and blocks), the
//!   decoded-block cache, listing the bucket, and what is known of it;
//! - `upkeep`: the leases, the background tasks, flushes and the
//!   maintenance that compacts, cleans up and applies retention.
//!
//! `recorded` keeps what recording rules make of ingests, beside them.
//! Opening (`recovery`), health, the configuration and the allocator
//! serve all of them.
//!
//! # Concurrency
//!
//! CPU work (decode, ingest, encode, query) runs on the blocking pool. The
//! head is sharded (`ingest::live_head`), each shard behind a std `RwLock`.
//! A tokio `RwLock`, the cut gate, spans each ingest's WAL append and head
//! apply, so a head cut sees every logged record either entirely before or
//! entirely after it: a block holds exactly the WAL segments it replaces.
//!
//! # Lock order
//!
//! This is the one place the lock order is written down; `ingest`,
//! `catalog` and `upkeep` point here. A task or thread that holds a lock
//! of one step never waits for a lock of an earlier step:
//!
//! 1. An ingest's admission: its in-flight slot (`ingest.inflight`), then
//!    its ingest memory (`ingest.memory`). Both are tried, never waited
//!    for: a write that finds them spent is refused.
//! 2. `upkeep.maintenance` (tokio mutex), held across bucket IO by a
//!    flush's uploads, a re-listing with its cleanup, a compaction or a
//!    retention pass; or a query's turn (`catalog.query_runners`), held for
//!    its whole pass on the blocking pool. The two are never held together.
//! 3. `catalog.listing` (tokio mutex): one re-listing at a time; taken
//!    under `maintenance` by `Store::refresh_blocks`, under a query's turn
//!    by a query that found a block gone.
//! 4. `ingest.cut_gate` (tokio `RwLock`): read by an ingest from before its
//!    WAL append until its apply is done (on its blocking-pool thread,
//!    `blocking_read`, with no ingest turn held); written by a head cut
//!    (under `maintenance` when a flush's backlog has drained) and once by
//!    shutdown.
//! 5. The WAL's own lock, inside [`Wal`](crate::wal::Wal): an append or
//!    a rotation, under the cut gate; never held across an `.await`.
//! 6. A shard's apply turn (tokio mutex, one per shard), waited for under
//!    the cut gate's read (by the ingest's blocking-pool thread).
//! 7. An ingest turn (`ingest.turns`, a semaphore): held around a decode,
//!    or around an apply after its shard's apply turn; never held while
//!    waiting for another turn.
//! 8. The head's shards (std `RwLock`s): in index order, all of them for a
//!    cut (write) or a query's snapshot (read), one at a time for an apply
//!    or a profile's series count.
//! 9. `catalog.view` (std `RwLock`): under every shard for a cut (write)
//!    and a query's snapshot (read); never held while waiting for a shard.
//! 10. `catalog.cache` and `catalog.corrupt` (std mutexes): either may be
//!     taken under the view; neither while holding the other.
//! 11. The leaves, each held for a few statements and never while taking
//!     another lock: `catalog.bucket_state`, `upkeep.held`,
//!     `ingest.recent_keys`, `upkeep.tasks`, `Shared::data_dir_lock`,
//!     `recorded.live` (under the cut gate by an ingest, under every shard
//!     by a cut), `recorded.totals`, `recorded.files`, and the
//!     live head's census of retained series (taken under a shard's write
//!     lock by an apply).
//!
//! No std lock (steps 5 and 8 to 11) is held across an `.await`: std locks
//! are taken on the blocking pool or for a few statements on a runtime
//! thread. Atomics (sizes, counters, the leases' expiry) need no order.

mod allocator;
mod catalog;
mod config;
mod debuginfo;
mod health;
mod ingest;
pub(crate) mod recorded;
mod recovery;
mod upkeep;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use kiln_engine::model::{BlockMeta, LabelSet};
use tokio::task::JoinHandle;

use crate::bucket::{Bucket, CorruptBlock};
use crate::error::StorageError;
use crate::wal::ReplayReport;
use catalog::{Catalog, View};
pub use catalog::{
    Incomplete, Listing, MAX_LISTED, note_incomplete, note_symbols_pending, record_incomplete,
    with_request_deadline,
};
pub use config::{AcceptedTimes, StoreConfig};
pub use health::{HealthProblem, StoreHealth};
use ingest::Ingest;
pub use ingest::{
    IngestAdmission, IngestTurn, KeyStats, WriterScope, check_key, check_profile_key, profile_key,
};
pub use recorded::RecordedUpkeep;
pub use upkeep::CompactionReport;
use upkeep::Upkeep;

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
    /// The namespaces the writer may add to; every series the profile
    /// writes is checked against it before the request is logged.
    pub writer: WriterScope,
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
    /// WAL writes and fsyncs that failed since open (each refused its
    /// writes until a fresh segment was started).
    pub wal_failed_writes: u64,
    /// Damaged WAL segments moved to the quarantine directory at open.
    pub wal_quarantined_segments: u64,
    /// Compactions skipped because the data directory had too little free
    /// space for their spill file.
    pub compactions_skipped_low_disk: u64,
}

/// What every clone of a [`Store`] shares: the three concerns, each
/// guarding its own state (see the module documentation for the order
/// their locks are taken in), and what all three use alike.
#[derive(Debug)]
struct Shared {
    /// Read by all three parts; never changes.
    config: StoreConfig,
    /// A cheap handle to the object store. The catalog lists it and
    /// queries read blocks from it; upkeep uploads, compacts and deletes
    /// blocks in it and keeps its leases there; opening reads both.
    bucket: Bucket,
    /// The data directory's lock, held open until shutdown. The directory
    /// holds the WAL (ingest) and the compaction spill files (upkeep); the
    /// lock keeps a second process away from both, so it belongs to the
    /// store as a whole.
    data_dir_lock: Mutex<Option<std::fs::File>>,
    ingest: Ingest,
    catalog: Catalog,
    upkeep: Upkeep,
    /// What recording rules made of the ingests (`recorded`).
    recorded: recorded::Recorded,
}

impl Shared {
    /// Bytes the live head and the heads waiting for upload may hold
    /// together before ingest is refused.
    fn unuploaded_budget(&self) -> u64 {
        (self.config.max_head_bytes as u64).saturating_add(self.config.max_pending_upload_bytes)
    }
}

/// The wall clock in unix ms (0 before 1970, saturating far ahead).
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
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
        Self::open_among_peers(config, bucket, None).await
    }

    /// [`Store::open`] for a replica among `peer_keys`: its replay drops
    /// the keyed records a peer stored while it was down, and resent
    /// requests' keys unknown here are looked up there
    /// ([`crate::peer_keys`]).
    pub async fn open_among_peers(
        config: StoreConfig,
        bucket: impl Into<Bucket>,
        peer_keys: Option<Arc<dyn crate::peer_keys::PeerKeySource>>,
    ) -> Result<Store, StorageError> {
        config.validate()?;
        allocator::bound_allocator_retention();
        let data_dir_lock = upkeep::lock_data_dir(&config)?;
        // Merges a killed process left half-written; their sources remain.
        upkeep::reset_spill_dir(&config.data_dir)?;
        let holder = upkeep::holder_id(&config)?;
        let bucket = bucket.into();
        let claim = upkeep::bucket_claim::claim_at_open(&bucket, &config).await?;
        let replica_lease = upkeep::replica_lease(&bucket, &config, &holder);
        upkeep::claim_replica_name(&replica_lease, &config).await?;
        let retention_lease = upkeep::retention_lease(&bucket, &config, &holder);
        // The keys first: replay drops the records whose key a peer stored.
        let (mut recent_keys, keys_in_wal) = ingest::recover_keys(&config).await?;
        let replay_keys = ingest::peer_lookup::replay_keys(peer_keys.as_ref(), keys_in_wal).await;
        let recovered = recovery::recover(&config, &bucket, replay_keys).await?;
        for key in &recovered.keyed.dropped {
            recent_keys.forget(key);
        }
        let mut view = View::default();
        let listed = recovered.listing.is_some();
        let listing = recovered.listing.unwrap_or_default();
        view.set_blocks(listing.blocks);
        view.remember_own_uploads(&config.replica, now_ms());
        view.frozen = recovered.frozen.into_iter().map(Arc::new).collect();
        let upload_now = !view.frozen.is_empty();
        let corrupt = listing
            .corrupt
            .into_iter()
            .map(|c| (c.id, c.error))
            .collect();
        let shared = Arc::new(Shared {
            ingest: Ingest::new(
                &config,
                recovered.wal,
                recovered.report,
                ingest::LiveHead::new(
                    config.head_shards,
                    recovered.head,
                    recovered.first_segment,
                    config.series_census_capacity(),
                ),
                recent_keys,
                ingest::peer_lookup::PeerKeys::new(peer_keys, &recovered.keyed),
            ),
            catalog: Catalog::new(
                &config,
                view,
                corrupt,
                catalog::BucketState::new(listed, recovered.listing_error),
            ),
            upkeep: Upkeep::new(claim, replica_lease, retention_lease, recovered.held),
            recorded: recorded::Recorded::new(
                recovered.recorded,
                usize::try_from(config.block_cache_bytes / 8).unwrap_or(usize::MAX),
            ),
            config,
            bucket,
            data_dir_lock: Mutex::new(Some(data_dir_lock)),
        });
        let store = Store { shared };
        // The series limits count what the store retains, blocks included.
        store.count_retained_series().await;
        if store.shared.config.background {
            upkeep::spawn_loops(&store);
            if upload_now {
                // Heads cut during replay go to the bucket now, not a
                // flush interval later.
                store.shared.upkeep.flush_now.notify_one();
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
        &self.shared.ingest.replay
    }

    /// Blocks that were skipped because they could not be read or decoded.
    pub fn corrupt_blocks(&self) -> Vec<CorruptBlock> {
        lock(&self.shared.catalog.corrupt)
            .iter()
            .map(|(id, error)| CorruptBlock {
                id: id.clone(),
                error: error.clone(),
            })
            .collect()
    }

    /// Metadata of the blocks queries currently read, oldest id first.
    pub fn blocks(&self) -> Vec<BlockMeta> {
        read(&self.shared.catalog.view).visible().cloned().collect()
    }

    /// A snapshot of counters and sizes for metrics.
    pub fn stats(&self) -> StoreStats {
        let shared = &self.shared;
        let (head_bytes, head_profiles) = (
            shared.ingest.head.approx_bytes() as u64,
            shared.ingest.head.profiles(),
        );
        let (cache_bytes, cache_blocks) = {
            let cache = lock(&shared.catalog.cache);
            (cache.used_bytes(), cache.len() as u64)
        };
        let view = read(&shared.catalog.view);
        let (ingested, upkept) = (&shared.ingest.counters, &shared.upkeep.counters);
        StoreStats {
            head_bytes,
            head_profiles,
            pending_uploads: view.frozen.len() as u64,
            pending_upload_bytes: view.frozen.iter().map(|f| f.bytes).sum(),
            blocks: view.visible().count() as u64,
            block_bytes: view.visible().map(|b| b.size_bytes).sum(),
            corrupt_blocks: lock(&shared.catalog.corrupt).len() as u64,
            ingest_memory_reserved_bytes: shared.ingest.memory.reserved_bytes(),
            cache_bytes,
            cache_blocks,
            profiles_ingested: ingested.profiles.load(Ordering::Relaxed),
            samples_ingested: ingested.samples.load(Ordering::Relaxed),
            bytes_ingested: ingested.bytes.load(Ordering::Relaxed),
            wal_replayed: shared.ingest.replay.records,
            blocks_written: upkept.blocks_written.load(Ordering::Relaxed),
            flush_failures: upkept.flush_failures.load(Ordering::Relaxed),
            compactions: upkept.compactions.load(Ordering::Relaxed),
            retention_deleted: upkept.retention_deleted.load(Ordering::Relaxed),
            wal_failed_writes: shared.ingest.wal.failed_writes(),
            wal_quarantined_segments: shared.ingest.replay.quarantined_segments as u64,
            compactions_skipped_low_disk: upkept
                .compactions_skipped_low_disk
                .load(Ordering::Relaxed),
        }
    }

    /// Stops accepting writes, stops the background loops, and flushes the
    /// head to the bucket. Data that cannot be uploaded stays in the WAL
    /// and is recovered at the next open.
    pub async fn shutdown(&self) -> Result<(), StorageError> {
        self.shared.ingest.closed.store(true, Ordering::SeqCst);
        self.shared.upkeep.shutdown_tx.send_replace(true);
        let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.shared.upkeep.tasks));
        for task in tasks {
            if let Err(err) = task.await {
                tracing::warn!(error = %err, "background task ended abnormally");
            }
        }
        // Wait for in-flight ingests: they hold the gate while logging.
        drop(self.shared.ingest.cut_gate.write().await);
        let flushed = self.flush().await;
        self.release_leases().await;
        // Nothing writes to the data directory any more.
        drop(lock(&self.shared.data_dir_lock).take());
        flushed
    }
}
