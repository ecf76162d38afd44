//! What the store can say about its own health: whether its write-ahead log
//! still accepts writes and whether its bucket answers. The server turns
//! this into `/readyz` and `/healthz`. It reads all three parts of the store; what it
//! reports of the bucket (the catalog's `BucketState`) is only ever set
//! from the outcomes of real bucket operations.

use std::sync::atomic::Ordering;

use super::{Store, lock, read};

/// One reason the store cannot do its job now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HealthProblem {
    /// A fixed name: `wal_failed`, `bucket_unreachable`,
    /// `bucket_not_listed`, `wal_held` or `upload_backlog`.
    pub reason: &'static str,
    /// What happened, for people.
    pub message: String,
    /// True when waiting will not fix it and a restart may: the store
    /// then reports itself not live, so an orchestrator restarts it.
    pub fails_liveness: bool,
}

/// A snapshot of the store's health.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StoreHealth {
    /// Why the store is not fully working; empty when it is.
    pub problems: Vec<HealthProblem>,
    /// Records set aside by WAL replay at open.
    pub wal_quarantined_records: u64,
    /// Heads cut and waiting for upload.
    pub pending_uploads: u64,
    /// Bytes held by the live head and the heads waiting for upload.
    pub unuploaded_bytes: u64,
    /// Where ingest is refused: `max_head_bytes + max_pending_upload_bytes`.
    pub unuploaded_budget_bytes: u64,
}

impl StoreHealth {
    /// True when nothing is wrong: writes are durable and the bucket answers.
    pub fn is_ready(&self) -> bool {
        self.problems.is_empty()
    }

    /// True unless a problem calls for a restart.
    pub fn is_live(&self) -> bool {
        !self.problems.iter().any(|p| p.fails_liveness)
    }
}

impl Store {
    /// Whether the store can take writes and see its bucket now, and why
    /// not. A write-ahead log that failed a write refuses writes until it
    /// has started a fresh segment, which it tries at the next write and
    /// every second; while that fails too (a full disk, a dead volume) the
    /// store is not live either, so an orchestrator restarts it, which
    /// also clears a compaction's spill files. A bucket problem clears by
    /// itself once an upload or a listing (retried by the background
    /// loops) succeeds, and a restart would not bring the bucket back.
    pub fn health(&self) -> StoreHealth {
        let shared = &self.shared;
        let mut problems = Vec::new();
        if let Some(failure) = shared.ingest.wal.failure() {
            let (message, fails_liveness) = match &failure.reopen_error {
                None => (
                    format!(
                        "the write-ahead log refuses writes after a failed write or fsync ({}); \
                         it starts a fresh segment at the next write",
                        failure.message
                    ),
                    false,
                ),
                Some(reopen) => (
                    format!(
                        "the write-ahead log refuses writes after a failed write or fsync ({}), \
                         and starting a fresh segment failed too ({reopen}); retried every {} s",
                        failure.message,
                        crate::wal::REOPEN_EVERY.as_secs()
                    ),
                    true,
                ),
            };
            problems.push(HealthProblem {
                reason: "wal_failed",
                message,
                fails_liveness,
            });
        }
        {
            let state = lock(&shared.catalog.bucket_state);
            if let Some(error) = &state.last_error {
                problems.push(HealthProblem {
                    reason: "bucket_unreachable",
                    message: error.clone(),
                    fails_liveness: false,
                });
            }
            if !state.listed {
                problems.push(HealthProblem {
                    reason: "bucket_not_listed",
                    message: "the bucket has not been listed since the store opened; \
                              queries see no blocks until it is"
                        .to_owned(),
                    fails_liveness: false,
                });
            }
        }
        let held = lock(&shared.upkeep.held).len();
        if held > 0 {
            problems.push(HealthProblem {
                reason: "wal_held",
                message: format!(
                    "{held} WAL segment ranges wait for the bucket to say whether their block \
                     was uploaded before they are replayed or deleted"
                ),
                fails_liveness: false,
            });
        }
        let (pending_uploads, frozen_bytes) = {
            let view = read(&shared.catalog.view);
            (
                view.frozen.len() as u64,
                view.frozen.iter().map(|f| f.bytes).sum::<u64>(),
            )
        };
        let head_bytes = shared.ingest.head.approx_bytes() as u64;
        let unuploaded_bytes = frozen_bytes + head_bytes;
        if unuploaded_bytes >= shared.unuploaded_budget() {
            problems.push(HealthProblem {
                reason: "upload_backlog",
                message: format!(
                    "{unuploaded_bytes} bytes wait for upload to the bucket, the budget is {}; \
                     ingest is refused until uploads drain",
                    shared.unuploaded_budget()
                ),
                fails_liveness: false,
            });
        }
        StoreHealth {
            problems,
            wal_quarantined_records: shared.ingest.replay.quarantined_records.saturating_add(
                shared
                    .upkeep
                    .counters
                    .late_quarantined
                    .load(Ordering::Relaxed),
            ),
            pending_uploads,
            unuploaded_bytes,
            unuploaded_budget_bytes: shared.unuploaded_budget(),
        }
    }
}
