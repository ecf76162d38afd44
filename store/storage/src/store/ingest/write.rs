//! The write path: ingest (decode, check, log, apply).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kiln_engine::{CheckedIngest, IngestStats};
use kiln_pprof::{DecodedProfile, ProfileView};

use super::idempotency;
use super::time_window::check_profile_time;
use super::wal_dir;
use crate::error::StorageError;
use crate::memory_gate::Reservation;
use crate::peer_keys::KeysAtPeers;
use crate::store::{AcceptedTimes, IngestRequest, Store, StoreConfig, lock, now_ms, read};
use crate::wal::WalRecord;

/// The request's time, else the profile's, else now.
fn resolve_time_ms(request: Option<i64>, profile: &impl ProfileView) -> i64 {
    match request {
        Some(t) => t,
        None if profile.time_nanos() > 0 => profile.time_nanos() / 1_000_000,
        None => now_ms(),
    }
}

/// The keys of profiles stored recently, at open: the keys file written by
/// the last flush, plus the keys of every record still in the WAL; and
/// those of the WAL's records apart, which replay may drop (a peer stored
/// them meanwhile).
pub(in crate::store) async fn recover_keys(
    config: &StoreConfig,
) -> Result<(idempotency::RecentKeys, Vec<String>), StorageError> {
    let dir = wal_dir(config);
    tokio::task::spawn_blocking(move || {
        let now = now_ms();
        // Read before recovery creates it, on a store's first start.
        std::fs::create_dir_all(&dir).map_err(|source| StorageError::Wal {
            op: "create directory",
            path: dir.clone(),
            source,
        })?;
        let mut keys = idempotency::RecentKeys::decode(&idempotency::load(&dir)?, now);
        let mut in_wal = Vec::new();
        let segments = crate::wal::list_segments(&dir)?;
        crate::wal::reread(&dir, &segments, |replayed| {
            if let Ok(WalRecord {
                idempotency_key: Some(key),
                ..
            }) = replayed.record
            {
                in_wal.push(key.clone());
                keys.remember(key, now);
            }
        })?;
        Ok((keys, in_wal))
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
    /// idempotency key (a key that passed [`idempotency::check_key`], or
    /// one [`idempotency::profile_key`] derived from it; else a client error): a profile
    /// with a key stored in
    /// the last 15 minutes is not stored again, and the answer is success
    /// (with empty stats), so a client that resends what it did not hear
    /// acknowledged (a batch cut short by a restart) stores it once instead
    /// of doubling the profiles that did arrive.
    pub async fn ingest_once(
        &self,
        request: IngestRequest,
        key: &str,
    ) -> Result<IngestStats, StorageError> {
        self.ingest_keyed(request, key, None).await
    }

    /// [`Store::ingest_once`], and for a resent profile what the peers
    /// said of its key (`peer_lookup`).
    pub(in crate::store) async fn ingest_keyed(
        &self,
        request: IngestRequest,
        key: &str,
        at_peers: Option<&KeysAtPeers>,
    ) -> Result<IngestStats, StorageError> {
        // The key is client text kept in memory, in the WAL and in the
        // keys file: bounded, and printable, so no key reads as more.
        idempotency::check_profile_key(key)
            .map_err(|message| StorageError::InvalidIdempotencyKey { message })?;
        match lock(&self.shared.ingest.recent_keys).begin(key, now_ms()) {
            idempotency::Begin::Stored => {
                self.count_repeat_here();
                return Ok(IngestStats::default());
            }
            idempotency::Begin::InFlight => {
                return Err(StorageError::IdempotencyKeyInFlight {
                    key: key.to_string(),
                });
            }
            idempotency::Begin::New => {}
        }
        // Not remembered as stored here when a peer holds it: this replica
        // must never tell a peer it holds a profile it does not.
        if let Some(settled) = at_peers.and_then(|found| self.settled_at_peers(key, found)) {
            lock(&self.shared.ingest.recent_keys).abort(key);
            return settled;
        }
        let result = self.ingest_profile(request, None, Some(key)).await;
        let mut keys = lock(&self.shared.ingest.recent_keys);
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
        if shared.ingest.closed.load(Ordering::SeqCst) {
            return Err(StorageError::ShuttingDown);
        }
        // A byte budget for data not yet in the bucket: while uploads fail,
        // the live head and the heads waiting for upload grow only up to it,
        // then writes are refused (retryably) until they drain. Without it
        // a long bucket outage grows memory until the store is killed, and
        // the restart replays the same WAL into the same memory.
        let (pending, frozen_bytes) = {
            let view = read(&shared.catalog.view);
            let bytes: u64 = view.frozen.iter().map(|f| f.bytes).sum();
            (view.frozen.len(), bytes)
        };
        let unuploaded_bytes = frozen_bytes + shared.ingest.head.approx_bytes() as u64;
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
        let writer = request.writer;
        let shard = shared.ingest.head.shard_of(&labels);
        let turn = self.ingest_turn().await?;
        // Decode and run every engine check before the record is logged, so
        // nothing in the WAL can be refused on replay: a logged record that
        // replay cannot apply would stop every restart the same way.
        let (checked, labels, time_ms, reservation, recorded) =
            tokio::task::spawn_blocking(move || {
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
                            checker.ingest.memory.reserve(&mut reservation, bytes)
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
                        .map_err(|source| StorageError::Rejected { source })?;
                // Before the count: a series the writer may not write must not
                // be counted, or refused, as another namespace's.
                writer.check(checked.series_namespaces())?;
                checker
                    .ingest
                    .head
                    .count_series(shard, &checked, &config.ingest_limits)
                    .map_err(|source| StorageError::Rejected { source })?;
                checker
                    .ingest
                    .memory
                    .reserve(&mut reservation, checked.approx_plan_bytes())?;
                let recorded = checked.recorded_values(&config.recording_rules);
                Ok::<_, StorageError>((checked, labels, time_ms, reservation, recorded))
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
        let gate = shared.ingest.cut_gate.read().await;
        if shared.ingest.closed.load(Ordering::SeqCst) {
            return Err(StorageError::ShuttingDown);
        }
        shared.ingest.wal.append(&record).await?;
        // The WAL wait held no turn; the apply takes one again, once the
        // applies ahead of it in its shard are done: a turn is a core, and
        // one held while asleep on a shard's lock is a core left idle.
        let shard_turn = shared.ingest.head.apply_turn(shard).await;
        let turn = self.ingest_turn().await?;
        let applier = Arc::clone(shared);
        let stats = tokio::task::spawn_blocking(move || {
            let _turns = (turn, shard_turn);
            applier
                .ingest
                .head
                .apply(shard, |head| head.apply_checked(checked, time_ms))
        })
        .await
        .map_err(|e| StorageError::task("head ingest", e))?;
        // Under the gate, so a cut takes these with the profile's head.
        shared.recorded.note_ingest(&recorded, time_ms);
        drop(gate);
        // The decoded profile is gone; so is what it reserved.
        drop(reservation);
        let (stats, head_bytes) = stats;
        shared
            .ingest
            .counters
            .profiles
            .fetch_add(1, Ordering::Relaxed);
        shared
            .ingest
            .counters
            .samples
            .fetch_add(stats.samples, Ordering::Relaxed);
        shared
            .ingest
            .counters
            .bytes
            .fetch_add(request.pprof.len() as u64, Ordering::Relaxed);
        if head_bytes >= shared.config.max_head_bytes {
            shared.upkeep.flush_now.notify_one();
        }
        Ok(stats)
    }
}
