//! The write path: ingest (decode, log, apply) and flush (cut, encode,
//! upload, drop the WAL segments the block replaces).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use kiln_engine::{CheckedIngest, IngestStats};
use kiln_pprof::{DecodeLimits, DecodedProfile, FlatProfile, ProfileView};

use super::AcceptedTimes;
use super::memory_gate::Reservation;
use super::recovery::{wal_dir, write_marker};
use super::time_window::check_profile_time;
use super::{Frozen, IngestRequest, Store, idempotency, lock, read, write};
use crate::error::StorageError;
use crate::wal::WalRecord;

/// Decodes and validates pprof bytes (gzipped or not), straight from the
/// wire into flat tables.
pub(super) fn decode_profile(
    bytes: &[u8],
    limits: &DecodeLimits,
) -> Result<FlatProfile, StorageError> {
    kiln_pprof::decode_flat(bytes, limits).map_err(|source| StorageError::InvalidProfile { source })
}

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The request's time, else the profile's, else now.
fn resolve_time_ms(request: Option<i64>, profile: &impl ProfileView) -> i64 {
    match request {
        Some(t) => t,
        None if profile.time_nanos() > 0 => profile.time_nanos() / 1_000_000,
        None => now_ms(),
    }
}

/// The keys of profiles stored recently, at open: the keys file written by
/// the last flush, plus the keys of every record still in the WAL.
pub(super) async fn recover_keys(
    config: &super::StoreConfig,
) -> Result<idempotency::RecentKeys, StorageError> {
    let dir = wal_dir(config);
    tokio::task::spawn_blocking(move || {
        let now = now_ms();
        let mut keys = idempotency::RecentKeys::decode(&idempotency::load(&dir)?, now);
        let segments = crate::wal::list_segments(&dir)?;
        crate::wal::reread(&dir, &segments, |replayed| {
            if let Ok(WalRecord {
                idempotency_key: Some(key),
                ..
            }) = replayed.record
            {
                keys.remember(key, now);
            }
        })?;
        Ok(keys)
    })
    .await
    .map_err(|e| StorageError::task("idempotency keys", e))?
}

impl Store {
    /// Ingests one profile. Returns once the request is in the WAL on stable
    /// storage and applied to the head, so it survives a crash and is
    /// visible to queries. Every check, series labels included, is the
    /// engine's `check_ingest`, run before the request is logged. Callers
    /// bound concurrent writes and their bodies' memory by admitting each
    /// write first ([`Store::admit_ingest`]).
    pub async fn ingest(&self, request: IngestRequest) -> Result<IngestStats, StorageError> {
        self.ingest_profile(request, None, None).await
    }

    /// [`Store::ingest`] for a request whose pprof the caller has decoded
    /// already (and perhaps edited, then encoded): `profile` is what
    /// `request.pprof` decodes to, which replaying the write-ahead log will
    /// do, so the request is not decoded a second time now. The caller
    /// holds the memory `profile` takes in the ingest budget until this
    /// returns.
    pub async fn ingest_decoded(
        &self,
        request: IngestRequest,
        profile: impl Into<DecodedProfile>,
    ) -> Result<IngestStats, StorageError> {
        self.ingest_profile(request, Some(profile.into()), None)
            .await
    }

    /// Like [`Store::ingest`], for a profile the client named with an
    /// idempotency key (at most 128 bytes): a profile with a key stored in
    /// the last 15 minutes is not stored again, and the answer is success
    /// (with empty stats), so a client that resends what it did not hear
    /// acknowledged (a batch cut short by a restart) stores it once instead
    /// of doubling the profiles that did arrive.
    pub async fn ingest_once(
        &self,
        request: IngestRequest,
        key: &str,
    ) -> Result<IngestStats, StorageError> {
        if key.is_empty() || key.len() > idempotency::MAX_KEY_BYTES {
            return Err(StorageError::InvalidIdempotencyKey {
                message: format!(
                    "{} bytes; a key is 1 to {} bytes",
                    key.len(),
                    idempotency::MAX_KEY_BYTES
                ),
            });
        }
        match lock(&self.shared.recent_keys).begin(key, now_ms()) {
            idempotency::Begin::Stored => return Ok(IngestStats::default()),
            idempotency::Begin::InFlight => {
                return Err(StorageError::IdempotencyKeyInFlight {
                    key: key.to_string(),
                });
            }
            idempotency::Begin::New => {}
        }
        let result = self.ingest_profile(request, None, Some(key)).await;
        let mut keys = lock(&self.shared.recent_keys);
        match &result {
            Ok(_) => keys.commit(key, now_ms()),
            Err(_) => keys.abort(key),
        }
        result
    }

    async fn ingest_profile(
        &self,
        request: IngestRequest,
        decoded: Option<DecodedProfile>,
        idempotency_key: Option<&str>,
    ) -> Result<IngestStats, StorageError> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::SeqCst) {
            return Err(StorageError::ShuttingDown);
        }
        // A byte budget for data not yet in the bucket: while uploads fail,
        // the live head and the heads waiting for upload grow only up to it,
        // then writes are refused (retryably) until they drain. Without it
        // a long bucket outage grows memory until the store is killed, and
        // the restart replays the same WAL into the same memory.
        let (pending, frozen_bytes) = {
            let view = read(&shared.view);
            let bytes: u64 = view.frozen.iter().map(|f| f.bytes).sum();
            (view.frozen.len(), bytes)
        };
        let unuploaded_bytes = frozen_bytes + shared.head.approx_bytes() as u64;
        let budget_bytes = shared.unuploaded_budget();
        if unuploaded_bytes >= budget_bytes {
            return Err(StorageError::UploadBacklog {
                pending,
                unuploaded_bytes,
                budget_bytes,
            });
        }
        // The body's bytes are the admission's (`Store::admit_ingest`); the
        // decode reserves what it allocates, step by step, so many large
        // requests at once cannot decode into more memory than the store has.
        let mut reservation = Reservation::default();
        let checker = Arc::clone(shared);
        let pprof = request.pprof.clone();
        let request_time_ms = request.time_ms;
        let labels = request.labels;
        let shard = shared.head.shard_of(&labels);
        let turn = self.ingest_turn().await?;
        // Decode and run every engine check before the record is logged, so
        // nothing in the WAL can be refused on replay: a logged record that
        // replay cannot apply would stop every restart the same way.
        let (checked, labels, time_ms, reservation) = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let config = &checker.config;
            let profile = match decoded {
                // Replay decodes these bytes under the same limits; the
                // message checks covered all but their length.
                Some(_) if pprof.len() > config.decode_limits.max_input_bytes => {
                    return Err(StorageError::InvalidProfile {
                        source: kiln_pprof::PprofError::InputTooLarge {
                            size: pprof.len(),
                            limit: config.decode_limits.max_input_bytes,
                        },
                    });
                }
                Some(profile) => profile,
                None => {
                    kiln_pprof::decode_flat_reserving(&pprof, &config.decode_limits, |bytes| {
                        checker.ingest_memory.reserve(&mut reservation, bytes)
                    })?
                    .map_err(|source| StorageError::InvalidProfile { source })?
                    .into()
                }
            };
            let time_ms = resolve_time_ms(request_time_ms, &profile);
            if let AcceptedTimes::Recent { max_future_skew } = config.accepted_times {
                check_profile_time(time_ms, now_ms(), config.retention, max_future_skew)?;
            }
            let duration_nanos = request
                .duration_nanos
                .unwrap_or_else(|| profile.duration_nanos());
            // What the checks resolve is kept and applied after logging,
            // so a shard's write lock covers only the apply. All but the
            // series count read no head, so they hold no lock; the count
            // reads the profile's shard, and every shard only for a new
            // series.
            let checked =
                CheckedIngest::prepare(profile, &labels, duration_nanos, &config.ingest_limits)
                    .and_then(|checked| {
                        let limits = &config.ingest_limits;
                        checker.head.count_series(shard, &checked, limits)?;
                        Ok(checked)
                    })
                    .map_err(|source| StorageError::Rejected { source })?;
            checker
                .ingest_memory
                .reserve(&mut reservation, checked.approx_plan_bytes())?;
            Ok::<_, StorageError>((checked, labels, time_ms, reservation))
        })
        .await
        .map_err(|e| StorageError::task("pprof decode", e))??;
        let record = WalRecord {
            labels,
            time_ms,
            duration_nanos: request
                .duration_nanos
                .unwrap_or_else(|| checked.profile().duration_nanos()),
            pprof: request.pprof.to_vec(),
            idempotency_key: idempotency_key.map(str::to_string),
        };
        let gate = shared.cut_gate.read().await;
        if shared.closed.load(Ordering::SeqCst) {
            return Err(StorageError::ShuttingDown);
        }
        shared.wal.append(&record).await?;
        // The WAL wait held no turn; the apply takes one again, once the
        // applies ahead of it in its shard are done: a turn is a core, and
        // one held while asleep on a shard's lock is a core left idle.
        let shard_turn = shared.head.apply_turn(shard).await;
        let turn = self.ingest_turn().await?;
        let applier = Arc::clone(shared);
        let stats = tokio::task::spawn_blocking(move || {
            let _turns = (turn, shard_turn);
            applier
                .head
                .apply(shard, |head| head.apply_checked(checked, time_ms))
        })
        .await
        .map_err(|e| StorageError::task("head ingest", e))?;
        drop(gate);
        // The decoded profile is gone; so is what it reserved.
        drop(reservation);
        let (stats, head_bytes) = stats;
        shared.counters.profiles.fetch_add(1, Ordering::Relaxed);
        shared
            .counters
            .samples
            .fetch_add(stats.samples, Ordering::Relaxed);
        shared
            .counters
            .bytes
            .fetch_add(request.pprof.len() as u64, Ordering::Relaxed);
        if head_bytes >= shared.config.max_head_bytes {
            shared.flush_now.notify_one();
        }
        Ok(stats)
    }

    /// Cuts the head into a block, uploads every pending block, and deletes
    /// the WAL segments they replace. A failed upload leaves the data in
    /// memory (still queried) and in the WAL, and is retried next flush.
    pub async fn flush(&self) -> Result<(), StorageError> {
        let shared = &self.shared;
        // While earlier heads wait for upload (the bucket is failing), the
        // live head is cut only once full: one block per failed attempt
        // would leave hundreds of tiny blocks after a long outage.
        let backlog = !read(&shared.view).frozen.is_empty();
        let cut_first = !backlog || shared.head.approx_bytes() >= shared.config.max_head_bytes;
        if cut_first {
            self.cut_head().await?;
        }
        let _maintenance = shared.maintenance.lock().await;
        let mut result = self.upload_pending().await;
        if result.is_ok() && !cut_first {
            // The backlog drained: the live head goes up too.
            self.cut_head().await?;
            result = self.upload_pending().await;
        }
        // The cut head and its encoded block are freed by now.
        super::allocator::release_free_memory().await;
        if result.is_err() {
            shared
                .counters
                .flush_failures
                .fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Moves the head's contents into a new frozen head awaiting upload.
    async fn cut_head(&self) -> Result<(), StorageError> {
        let shared = &self.shared;
        if shared.head.is_empty() {
            return Ok(());
        }
        // No ingest is between its WAL append and head apply while we hold
        // this: the frozen head holds exactly segments [first, new).
        let _gate = shared.cut_gate.write().await;
        let rotator = Arc::clone(shared);
        let new_segment = tokio::task::spawn_blocking(move || rotator.wal.rotate())
            .await
            .map_err(|e| StorageError::task("WAL rotate", e))??;
        // Pushed while every shard's write lock is held, so a query that
        // snapshots the view under the shards' read locks sees the data
        // exactly once.
        shared.head.cut(new_segment, |heads, first_segment| {
            let frozen = Frozen::new(heads, first_segment, new_segment);
            write(&shared.view).frozen.push(Arc::new(frozen));
        });
        Ok(())
    }

    /// Uploads frozen heads oldest first; stops at the first failure so WAL
    /// segments are only ever deleted in order. Caller holds `maintenance`.
    async fn upload_pending(&self) -> Result<(), StorageError> {
        let shared = &self.shared;
        loop {
            let Some(frozen) = read(&shared.view).frozen.first().cloned() else {
                return Ok(());
            };
            if frozen.is_empty() {
                // Its segments hold only records the engine refused.
                write(&shared.view)
                    .frozen
                    .retain(|f| !Arc::ptr_eq(f, &frozen));
                let cleaner = Arc::clone(shared);
                let (first, end) = (frozen.first_segment, frozen.end_segment);
                tokio::task::spawn_blocking(move || {
                    cleaner
                        .wal
                        .remove_segments(|id| first <= id && id < end && !cleaner.is_held(id))
                })
                .await
                .map_err(|e| StorageError::task("WAL cleanup", e))??;
                continue;
            }
            let encoder = Arc::clone(&frozen);
            let replica = shared.config.replica.clone();
            let dir = wal_dir(&shared.config);
            let (meta, data, marker) = tokio::task::spawn_blocking(move || {
                let marker = write_marker(
                    &dir,
                    &encoder.id,
                    encoder.first_segment,
                    encoder.end_segment,
                )?;
                let heads: Vec<&kiln_engine::Head> =
                    encoder.heads.iter().filter(|h| !h.is_empty()).collect();
                let (meta, data) = kiln_engine::encode_heads(&heads, &encoder.id, &replica)
                    .map_err(|source| StorageError::Block {
                        id: encoder.id.clone(),
                        source,
                    })?;
                Ok::<_, StorageError>((meta, data, marker))
            })
            .await
            .map_err(|e| StorageError::task("block encode", e))??;
            let put = shared.bucket.put_block(&meta, data.into()).await;
            shared.note_bucket(&put);
            if let Err(err) = put {
                tracing::warn!(block = %meta.id, error = %err, "block upload failed; will retry");
                return Err(err);
            }
            {
                let mut view = write(&shared.view);
                view.frozen.retain(|f| !Arc::ptr_eq(f, &frozen));
                let mut blocks = view.blocks.clone();
                blocks.insert(meta.id.clone(), meta.clone());
                view.set_blocks(blocks);
            }
            shared
                .counters
                .blocks_written
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(block = %meta.id, bytes = meta.size_bytes, "block uploaded");
            let cleaner = Arc::clone(shared);
            let (first, end) = (frozen.first_segment, frozen.end_segment);
            // The keys logged in these segments outlive them in the keys
            // file, so a restart still knows them.
            let keys = lock(&shared.recent_keys).encode(now_ms());
            let keys_dir = wal_dir(&shared.config);
            tokio::task::spawn_blocking(move || {
                idempotency::save(&keys_dir, &keys)?;
                cleaner
                    .wal
                    .remove_segments(|id| first <= id && id < end && !cleaner.is_held(id))?;
                std::fs::remove_file(&marker).map_err(|source| StorageError::Wal {
                    op: "remove marker",
                    path: marker.clone(),
                    source,
                })
            })
            .await
            .map_err(|e| StorageError::task("WAL cleanup", e))??;
        }
    }
}
