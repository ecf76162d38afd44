//! Applying logged records to a head during recovery, one at a time and
//! isolated: a record that does not parse, is refused, or panics the engine
//! is set aside (see `quarantine`) and replay goes on with the next one.

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use kiln_engine::{Head, IngestLimits};
use kiln_pprof::DecodeLimits;

use super::quarantine;
use super::write::decode_profile;
use crate::error::StorageError;
use crate::wal::Replayed;

/// What replay needs to apply records.
pub(super) struct Replayer {
    pub(super) decode_limits: DecodeLimits,
    pub(super) ingest_limits: IngestLimits,
    pub(super) quarantine_dir: PathBuf,
}

/// One replay into one head, with the records set aside so far.
pub(super) struct ReplayPass<'r> {
    replayer: &'r Replayer,
    head: Head,
    /// (segment, ordinal) of every record set aside.
    quarantined: BTreeSet<(u64, u64)>,
    /// A record panicked mid-apply; the head may hold part of it.
    damaged: bool,
    /// The first IO error while setting a record aside; recovery fails with it.
    error: Option<StorageError>,
}

/// Why one record was not applied.
enum Refusal {
    /// Decoding or the engine refused it; the head is untouched.
    Refused(String),
    /// The engine panicked; the head may be partly changed.
    Panicked(String),
}

impl<'r> ReplayPass<'r> {
    pub(super) fn new(replayer: &'r Replayer) -> Self {
        Self {
            replayer,
            head: Head::new(),
            quarantined: BTreeSet::new(),
            damaged: false,
            error: None,
        }
    }

    /// Applies one record, or sets it aside.
    pub(super) fn replay(&mut self, replayed: Replayed<'_>) {
        let key = (replayed.segment, replayed.ordinal);
        if self.damaged || self.error.is_some() || self.quarantined.contains(&key) {
            return;
        }
        let refusal = match replayed.record {
            Err(err) => Refusal::Refused(format!("unreadable record: {err}")),
            Ok(record) => {
                let replayer = self.replayer;
                let head = &mut self.head;
                // NB: AssertUnwindSafe is sound here because a panic marks
                // the head damaged and it is thrown away, never read.
                match catch_unwind(AssertUnwindSafe(|| {
                    decode_profile(&record.pprof, &replayer.decode_limits).and_then(|profile| {
                        head.ingest(
                            &profile,
                            &record.labels,
                            record.time_ms,
                            record.duration_nanos,
                            &replayer.ingest_limits,
                        )
                        .map_err(|source| StorageError::Rejected { source })
                    })
                })) {
                    Ok(Ok(_)) => return,
                    Ok(Err(err)) => Refusal::Refused(err.to_string()),
                    Err(panic) => Refusal::Panicked(panic_message(panic.as_ref())),
                }
            }
        };
        let reason = match &refusal {
            Refusal::Refused(reason) => reason.clone(),
            Refusal::Panicked(message) => {
                self.damaged = true;
                format!("the engine panicked applying it: {message}")
            }
        };
        tracing::warn!(
            segment = replayed.segment,
            ordinal = replayed.ordinal,
            reason = %reason,
            "WAL record could not be replayed; quarantined"
        );
        self.quarantined.insert(key);
        if let Err(err) = quarantine::put(
            &self.replayer.quarantine_dir,
            replayed.segment,
            replayed.ordinal,
            replayed.payload,
            &reason,
        ) {
            self.error = Some(err);
        }
    }

    /// True when a record panicked and the head must be rebuilt.
    pub(super) fn head_damaged(&self) -> bool {
        self.damaged && self.error.is_none()
    }

    /// Starts over with an empty head, keeping the records set aside.
    pub(super) fn restart(&mut self) {
        self.head = Head::new();
        self.damaged = false;
    }

    /// The replayed head and how many records were set aside.
    pub(super) fn finish(self) -> Result<(Head, u64), StorageError> {
        match self.error {
            Some(err) => Err(err),
            None => Ok((self.head, self.quarantined.len() as u64)),
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else {
        "a panic without a message".to_owned()
    }
}
