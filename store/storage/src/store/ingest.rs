//! Ingest: what a write goes through, from admission to the live head. This
//! part guards the write-ahead log, the cut gate, the live head's shards,
//! the turns and the memory budget writes take, and the idempotency keys
//! of recent writes. Its locks take their place in the store's one lock
//! order, written in the `store` module's documentation.
//!
//! - `admission`: a write's in-flight slot and memory, and its turns;
//! - `write`: `Store::ingest` and its variants (decode, check, log, apply);
//! - `hop`: the write itself, in one blocking hop;
//! - `live_head`: the sharded head writes apply to;
//! - `idempotency`: the keys of recently stored profiles;
//! - `peer_lookup`: those keys looked up at the peers, for resent requests
//!   and at replay;
//! - `time_window`: which profile times are accepted;
//! - `writer_scope`: which namespaces a writer may write;
//! - `replay` and `quarantine`: the WAL replayed into heads at open, with
//!   the records that cannot be applied set aside.

mod admission;
mod hop;
pub(super) mod idempotency;
mod live_head;
pub(super) mod peer_lookup;
mod quarantine;
pub(super) mod replay;
mod time_window;
mod write;
mod writer_scope;

pub use idempotency::{check_key, check_profile_key, profile_key};
pub use peer_lookup::KeyStats;
pub use writer_scope::WriterScope;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use super::StoreConfig;
use crate::wal::{ReplayReport, Wal};
pub use admission::{IngestAdmission, IngestTurn};
pub(super) use live_head::LiveHead;
pub(super) use write::recover_keys;

/// The state every write goes through.
#[derive(Debug)]
pub(super) struct Ingest {
    /// Every write is appended here and fsynced before it is applied.
    pub(super) wal: Wal,
    /// What WAL replay found at open.
    pub(super) replay: ReplayReport,
    /// Spans each ingest's WAL append and head apply (read) and each head
    /// cut (write), so a cut head holds exactly the segments it replaces.
    pub(super) cut_gate: tokio::sync::RwLock<()>,
    /// The live head, in shards.
    pub(super) head: LiveHead,
    /// Write slots (`max_inflight_ingests`), taken by `admit_ingest`.
    pub(super) inflight: Arc<Semaphore>,
    /// Turns to decode or apply an ingest (`ingest_workers`), taken by
    /// `ingest_turn`.
    pub(super) turns: Arc<Semaphore>,
    /// Bytes reserved by ingests being decoded and applied.
    pub(super) memory: crate::memory_gate::MemoryGate,
    /// Idempotency keys of recently stored profiles, so a resent profile
    /// is stored once.
    pub(super) recent_keys: Mutex<idempotency::RecentKeys>,
    /// The peers keys unknown here are looked up at, and the counts.
    pub(super) peer_keys: peer_lookup::PeerKeys,
    /// Set by shutdown: no write is logged after it.
    pub(super) closed: AtomicBool,
    pub(super) counters: IngestCounters,
}

/// What ingest has done since start, for metrics.
#[derive(Debug, Default)]
pub(super) struct IngestCounters {
    pub(super) profiles: AtomicU64,
    pub(super) samples: AtomicU64,
    pub(super) bytes: AtomicU64,
}

impl Ingest {
    /// Ingest over what recovery left: the WAL, what its replay found, the
    /// live head it filled, and the keys it knows.
    pub(super) fn new(
        config: &StoreConfig,
        wal: Wal,
        replay: ReplayReport,
        head: LiveHead,
        recent_keys: idempotency::RecentKeys,
        peer_keys: peer_lookup::PeerKeys,
    ) -> Self {
        Self {
            wal,
            replay,
            cut_gate: tokio::sync::RwLock::new(()),
            head,
            inflight: Arc::new(Semaphore::new(config.max_inflight_ingests)),
            turns: Arc::new(Semaphore::new(config.ingest_workers)),
            memory: crate::memory_gate::MemoryGate::new(config.ingest_memory_bytes),
            recent_keys: Mutex::new(recent_keys),
            peer_keys,
            closed: AtomicBool::new(false),
            counters: IngestCounters::default(),
        }
    }
}

/// The WAL's directory under the data directory.
pub(super) fn wal_dir(config: &StoreConfig) -> PathBuf {
    config.data_dir.join("wal")
}
