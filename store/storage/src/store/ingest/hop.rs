//! One write in one blocking hop: decode, check, log and apply on the same
//! blocking-pool thread.
//!
//! A write used to hop three times between the async workers and the
//! blocking pool: decode and check, then the WAL append awaited on an async
//! worker (its record framed there), then the apply. At 32 clients on 16
//! cores the blocking pool's own mutex was 5.5 % of the store's context
//! switches (issue 50). Here the thread that decodes also frames the
//! record, waits for its fsync and applies it. It gives its ingest turn
//! back before it waits, for the log and for its shard's apply turn, and
//! takes one again to apply: a turn is a core, and one held asleep is a
//! core left idle. A server that decodes a request itself (`/ingest`,
//! Push, OTLP) calls [`Store::ingest_blocking`] from its own hop, so an
//! upload takes one hop in all.
//!
//! NB: a write waits for the log on its thread, so the blocking pool holds
//! up to one thread per write in flight (`max_inflight_ingests`, 256 by
//! default; tokio's pool has 512).

use std::sync::atomic::Ordering;

use kiln_engine::{CheckedIngest, IngestStats};
use kiln_pprof::{DecodedProfile, ProfileView};

use super::IngestTurn;
use super::time_window::check_profile_time;
use crate::error::StorageError;
use crate::memory_gate::Reservation;
use crate::store::{AcceptedTimes, IngestRequest, Store, now_ms, read};
use crate::wal::{WalFrame, WalRecord};

/// The request's time, else the profile's, else now.
fn resolve_time_ms(request: Option<i64>, profile: &impl ProfileView) -> i64 {
    match request {
        Some(t) => t,
        None if profile.time_nanos() > 0 => profile.time_nanos() / 1_000_000,
        None => now_ms(),
    }
}

impl Store {
    /// [`Store::ingest`] on this thread, for a server already on the
    /// blocking pool that decoded the request itself: `turn` is the ingest
    /// turn it decoded under, and `decoded`, when given, is what
    /// `request.pprof` decodes to (as for [`Store::ingest_decoded`]). The
    /// caller holds the write's admission until this returns.
    ///
    /// Blocking: never call it on an async worker.
    pub fn ingest_blocking(
        &self,
        turn: IngestTurn,
        request: IngestRequest,
        decoded: Option<DecodedProfile>,
    ) -> Result<IngestStats, StorageError> {
        self.ingest_in_hop(turn, request, decoded, None)
    }

    /// The whole write, holding `turn` until the record is framed.
    pub(super) fn ingest_in_hop(
        &self,
        turn: IngestTurn,
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
        let config = &shared.config;
        let shard = shared.ingest.head.shard_of(&request.labels);
        let pprof = &request.pprof;
        // Decode and run every engine check before the record is logged, so
        // nothing in the WAL can be refused on replay: a logged record that
        // replay cannot apply would stop every restart the same way.
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
            None => kiln_pprof::decode_flat_reserving(pprof, &config.decode_limits, |bytes| {
                shared.ingest.memory.reserve(&mut reservation, bytes)
            })?
            .map_err(|source| StorageError::InvalidProfile { source })?
            .into(),
        };
        let time_ms = resolve_time_ms(request.time_ms, &profile);
        if let AcceptedTimes::Recent { max_future_skew } = config.accepted_times {
            check_profile_time(time_ms, now_ms(), config.retention, max_future_skew)?;
        }
        let duration_nanos = request
            .duration_nanos
            .unwrap_or_else(|| profile.duration_nanos());
        // What the checks resolve is kept and applied after logging, so a
        // shard's write lock covers only the apply. All but the series
        // count read no head, so they hold no lock; the count reads the
        // profile's shard, and every shard only for a new series.
        let checked = CheckedIngest::prepare(
            profile,
            &request.labels,
            duration_nanos,
            &config.ingest_limits,
        )
        .map_err(|source| StorageError::Rejected { source })?;
        // Before the count: a series the writer may not write must not be
        // counted, or refused, as another namespace's.
        request.writer.check(checked.series_namespaces())?;
        shared
            .ingest
            .head
            .count_series(shard, &checked, &config.ingest_limits)
            .map_err(|source| StorageError::Rejected { source })?;
        shared
            .ingest
            .memory
            .reserve(&mut reservation, checked.approx_plan_bytes())?;
        let recorded = checked.recorded_values(&config.recording_rules);
        let pprof_bytes = request.pprof.len() as u64;
        // Framed here, under the turn: the copy and the CRC are CPU work,
        // which the log's one writer thread should not do for every write.
        let frame = WalFrame::encode(&WalRecord {
            labels: request.labels,
            time_ms,
            duration_nanos,
            pprof: request.pprof.to_vec(),
            idempotency_key: idempotency_key.map(str::to_string),
        });
        // The WAL wait holds no turn; the apply takes one again, once the
        // applies ahead of it in its shard are done.
        drop(turn);
        let gate = shared.ingest.cut_gate.blocking_read();
        if shared.ingest.closed.load(Ordering::SeqCst) {
            return Err(StorageError::ShuttingDown);
        }
        shared.ingest.wal.append_frame_blocking(frame)?;
        let shard_turn = shared.ingest.head.apply_turn_blocking(shard);
        let turn = self.ingest_turn_blocking()?;
        let (stats, head_bytes) = shared
            .ingest
            .head
            .apply(shard, |head| head.apply_checked(checked, time_ms));
        drop((turn, shard_turn));
        // Under the gate, so a cut takes these with the profile's head.
        shared.recorded.note_ingest(&recorded, time_ms);
        drop(gate);
        // The decoded profile is gone; so is what it reserved.
        drop(reservation);
        let counters = &shared.ingest.counters;
        counters.profiles.fetch_add(1, Ordering::Relaxed);
        counters.samples.fetch_add(stats.samples, Ordering::Relaxed);
        counters.bytes.fetch_add(pprof_bytes, Ordering::Relaxed);
        if head_bytes >= shared.config.max_head_bytes {
            shared.upkeep.flush_now.notify_one();
        }
        Ok(stats)
    }
}
