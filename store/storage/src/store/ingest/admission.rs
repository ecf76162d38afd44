//! Write admission: one budget for every write, whichever protocol brought
//! it. A write takes one of `max_inflight_ingests` slots and reserves its
//! body's bytes in the ingest memory budget before the body is read;
//! decoding reserves more in the same budget (`memory_gate`), step by
//! step. The server admits each write request here, once, and holds the
//! admission until the store has answered. Counting requests alone let many
//! large bodies together take more memory than the store has, and admitting
//! after the body was read or decoded let that memory be taken before any
//! limit applied.
//!
//! An admitted write then takes a turn (`ingest_workers` of them) for each
//! step that keeps a core busy: the server's inflating or converting, the
//! store's decode, its apply. Admission bounds what waits; turns bound what
//! runs. Without them, 256 admitted writes would all decode at once on the
//! blocking pool: no faster on a few cores, with every decoded profile
//! alive together.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use crate::error::StorageError;
use crate::memory_gate::Reservation;
use crate::store::Store;

/// One turn to decode or apply an ingest, given back on drop. Hold it only
/// around work that keeps a core busy, never across a wait on another turn.
#[derive(Debug)]
pub struct IngestTurn {
    _turn: OwnedSemaphorePermit,
}

/// One admitted write: its in-flight slot and the ingest memory it holds,
/// both released on drop.
#[derive(Debug)]
pub struct IngestAdmission {
    _slot: OwnedSemaphorePermit,
    memory: Reservation,
}

impl Store {
    /// Admits one write whose body takes `body_bytes`: takes an in-flight
    /// slot and reserves the bytes, or refuses at once (overload when all
    /// slots or the budget are in use, a client error when the budget
    /// could never hold the body), so overload never queues.
    pub fn admit_ingest(&self, body_bytes: usize) -> Result<IngestAdmission, StorageError> {
        let shared = &self.shared;
        let slot = Arc::clone(&shared.ingest.inflight)
            .try_acquire_owned()
            .map_err(|_| StorageError::Overloaded {
                limit: shared.config.max_inflight_ingests,
            })?;
        let mut memory = Reservation::default();
        shared.ingest.memory.reserve(&mut memory, body_bytes)?;
        Ok(IngestAdmission {
            _slot: slot,
            memory,
        })
    }

    /// Adds `bytes` to what `admission` holds of the ingest memory budget,
    /// under the same rules, before the caller allocates them (a body read
    /// in chunks, inflated, or decoded by the server).
    pub fn reserve_more_ingest_memory(
        &self,
        admission: &mut IngestAdmission,
        bytes: usize,
    ) -> Result<(), StorageError> {
        self.shared
            .ingest
            .memory
            .reserve(&mut admission.memory, bytes)
    }

    /// Waits for one of the `ingest_workers` turns. Writes are admitted
    /// (or refused) before they wait here, so the queue is bounded by
    /// `max_inflight_ingests`.
    pub async fn ingest_turn(&self) -> Result<IngestTurn, StorageError> {
        Arc::clone(&self.shared.ingest.turns)
            .acquire_owned()
            .await
            .map(|turn| IngestTurn { _turn: turn })
            .map_err(|_| StorageError::ShuttingDown)
    }

    /// [`Store::ingest_turn`] from blocking code: an ingest on a
    /// blocking-pool thread takes its apply's turn here, after its WAL
    /// wait, instead of hopping back to the runtime for it.
    ///
    /// Blocking: never call it on an async worker.
    pub fn ingest_turn_blocking(&self) -> Result<IngestTurn, StorageError> {
        let turns = Arc::clone(&self.shared.ingest.turns);
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| StorageError::Task {
            what: "ingest turn",
            message: e.to_string(),
        })?;
        runtime
            .block_on(turns.acquire_owned())
            .map(|turn| IngestTurn { _turn: turn })
            .map_err(|_| StorageError::ShuttingDown)
    }

    /// Writes admitted and not yet answered.
    pub fn ingests_in_flight(&self) -> usize {
        self.shared
            .config
            .max_inflight_ingests
            .saturating_sub(self.shared.ingest.inflight.available_permits())
    }
}
