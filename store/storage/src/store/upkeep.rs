//! Upkeep: what keeps the bucket tidy and the live head small while writes
//! and queries go on. This part guards the maintenance lock, the leases,
//! the flush markers held at open, the flush trigger, and the background
//! tasks with their shutdown signal. Its locks take their place in the
//! store's one lock order, written in the `store` module's documentation.
//!
//! - `flush`: cutting the live head and uploading the heads waiting for it;
//! - `markers`: the flush markers that tie a block to the WAL segments it
//!   replaces, and settling those open could not;
//! - `maintenance`: re-listing with cleanup, compaction and retention;
//! - `spill`: the files a compaction's output waits in until uploaded;
//! - `ownership`: the data directory's lock and the bucket's leases;
//! - `bucket_claim`: which store the bucket prefix belongs to;
//! - `loops`: the background tasks that run all of the above.

pub(super) mod bucket_claim;
mod flush;
mod loops;
mod maintenance;
pub(super) mod markers;
mod ownership;
mod spill;

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::lock;
use crate::lease::Lease;
pub(super) use loops::spawn_loops;
pub use maintenance::CompactionReport;
use markers::Marker;
pub(super) use ownership::{
    claim_replica_name, holder_id, lock_data_dir, replica_lease, retention_lease,
};
pub(super) use spill::reset_spill_dir;

/// The state of the work done beside writes and queries.
#[derive(Debug)]
pub(super) struct Upkeep {
    /// Serializes bucket listing, uploads, compaction and retention, so a
    /// listing never overwrites a block added while it ran.
    pub(super) maintenance: tokio::sync::Mutex<()>,
    /// Whether the bucket prefix is this store's (see `bucket_claim`).
    pub(super) bucket_claim: bucket_claim::BucketClaim,
    /// This process's claim on its replica name: only its holder cleans up
    /// and compacts that replica's blocks.
    pub(super) replica_lease: Lease,
    /// Whether this process runs retention for the bucket: one replica at
    /// a time applies its settings to every block.
    pub(super) retention_lease: Lease,
    /// Flush markers whose block's state was unknown at open (the bucket
    /// did not answer): their WAL segments are neither replayed nor
    /// deleted until a listing says. Replaying them on a guess would count
    /// their data twice if the block was there after all; deleting them
    /// would lose it if it was not.
    pub(super) held: Mutex<Vec<Marker>>,
    /// Wakes the flush loop before its interval (a full head, heads cut
    /// at open).
    pub(super) flush_now: Notify,
    /// Tells the background tasks to stop.
    pub(super) shutdown_tx: watch::Sender<bool>,
    /// The background tasks, joined at shutdown.
    pub(super) tasks: Mutex<Vec<JoinHandle<()>>>,
    pub(super) counters: UpkeepCounters,
}

/// What upkeep has done since start, for metrics and health.
#[derive(Debug, Default)]
pub(super) struct UpkeepCounters {
    pub(super) blocks_written: AtomicU64,
    pub(super) flush_failures: AtomicU64,
    pub(super) compactions: AtomicU64,
    /// Compactions not started for want of free disk space.
    pub(super) compactions_skipped_low_disk: AtomicU64,
    pub(super) retention_deleted: AtomicU64,
    /// Records set aside while replaying WAL ranges held at open.
    pub(super) late_quarantined: AtomicU64,
}

impl Upkeep {
    /// Upkeep with the leases taken at open and the markers it could not
    /// settle; no task runs yet.
    pub(super) fn new(
        claim: bucket_claim::ClaimState,
        replica_lease: Lease,
        retention_lease: Lease,
        held: Vec<Marker>,
    ) -> Self {
        let (shutdown_tx, _) = watch::channel(false);
        Self {
            bucket_claim: bucket_claim::BucketClaim::new(claim),
            maintenance: tokio::sync::Mutex::new(()),
            replica_lease,
            retention_lease,
            held: Mutex::new(held),
            flush_now: Notify::new(),
            shutdown_tx,
            tasks: Mutex::new(Vec::new()),
            counters: UpkeepCounters::default(),
        }
    }

    /// True for a WAL segment held back at open; never deleted.
    pub(super) fn is_held(&self, segment: u64) -> bool {
        lock(&self.held)
            .iter()
            .any(|m| m.first <= segment && segment < m.end)
    }
}
