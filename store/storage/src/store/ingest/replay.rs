//! Applying logged records to a head during recovery, one at a time and
//! isolated: a record that does not parse, is refused, or panics the engine
//! is set aside (see `quarantine`) and replay goes on with the next one.

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use kiln_engine::recording::{RecordedPoints, RecordingRules};
use kiln_engine::{Head, IngestLimits};
use kiln_pprof::{DecodeLimits, FlatProfile};

use super::peer_lookup::{ReplayKey, ReplayKeys, ReplayedKeys};
use super::quarantine::{self, quarantine_dir};
use crate::error::StorageError;
use crate::store::StoreConfig;
use crate::wal::Replayed;

/// What replay needs to apply records.
pub(in crate::store) struct Replayer {
    pub(in crate::store) decode_limits: DecodeLimits,
    pub(in crate::store) recording_rules: Arc<RecordingRules>,
    pub(in crate::store) ingest_limits: IngestLimits,
    pub(in crate::store) quarantine_dir: PathBuf,
    /// Which keyed records peers stored meanwhile (at open; none later).
    pub(in crate::store) keys: ReplayKeys,
}

/// A head filled by replay and cut at a segment boundary: it holds exactly
/// the records of segments `[first_segment, end_segment)`.
pub(in crate::store) struct ReplayedHead {
    pub(in crate::store) head: Head,
    /// What recording rules made of its records.
    pub(in crate::store) recorded: RecordedPoints,
    pub(in crate::store) first_segment: u64,
    pub(in crate::store) end_segment: u64,
}

/// One replay into heads, with the records set aside so far. The head is
/// cut whenever it has reached `cut_bytes` and a new segment begins, so a
/// long WAL becomes heads of a block's size waiting for upload instead of
/// one head of any size: after a long bucket outage, one head would need
/// more memory than the store has, and every restart would run out of it.
pub(in crate::store) struct ReplayPass<'r> {
    replayer: &'r Replayer,
    head: Head,
    /// What recording rules made of `head`'s records.
    recorded: RecordedPoints,
    /// The first segment of `head`'s range.
    head_first: u64,
    /// The segment of the last record handed over.
    last_segment: Option<u64>,
    /// Where the pass started, for a restart.
    start_segment: u64,
    cut_bytes: usize,
    /// Heads cut so far, oldest first.
    cut: Vec<ReplayedHead>,
    /// (segment, ordinal) of every record set aside.
    quarantined: BTreeSet<(u64, u64)>,
    /// A record panicked mid-apply; the head may hold part of it.
    damaged: bool,
    /// The first IO error while setting a record aside; recovery fails with it.
    error: Option<StorageError>,
    /// Keyed records dropped as stored at a peer, or kept unverified.
    keyed: ReplayedKeys,
}

/// Why one record was not applied.
enum Refusal {
    /// Decoding or the engine refused it; the head is untouched.
    Refused(String),
    /// The engine panicked; the head may be partly changed.
    Panicked(String),
}

impl<'r> ReplayPass<'r> {
    /// A pass whose first head starts at segment `start_segment`.
    pub(in crate::store) fn new(
        replayer: &'r Replayer,
        start_segment: u64,
        cut_bytes: usize,
    ) -> Self {
        Self {
            replayer,
            head: Head::new(),
            recorded: RecordedPoints::new(),
            head_first: start_segment,
            last_segment: None,
            start_segment,
            cut_bytes,
            cut: Vec::new(),
            quarantined: BTreeSet::new(),
            damaged: false,
            error: None,
            keyed: ReplayedKeys::default(),
        }
    }

    /// Applies one record, or sets it aside.
    pub(in crate::store) fn replay(&mut self, replayed: Replayed<'_>) {
        let key = (replayed.segment, replayed.ordinal);
        if self.damaged || self.error.is_some() || self.quarantined.contains(&key) {
            return;
        }
        if self.last_segment != Some(replayed.segment) {
            self.last_segment = Some(replayed.segment);
            if self.head.approx_bytes() >= self.cut_bytes {
                let head = std::mem::replace(&mut self.head, Head::new());
                self.cut.push(ReplayedHead {
                    head,
                    recorded: std::mem::take(&mut self.recorded),
                    first_segment: self.head_first,
                    end_segment: replayed.segment,
                });
                self.head_first = replayed.segment;
            }
        }
        let refusal = match replayed.record {
            Err(err) => Refusal::Refused(format!("unreadable record: {err}")),
            Ok(record) => {
                let replayer = self.replayer;
                if let Some(key) = &record.idempotency_key {
                    match replayer.keys.decide(key) {
                        // The client retried at a peer while this replica
                        // was down, and the peer stored it.
                        ReplayKey::Drop => {
                            self.keyed.dropped.push(key.clone());
                            return;
                        }
                        ReplayKey::KeepUnverified => self.keyed.kept_unverified += 1,
                        ReplayKey::Keep => {}
                    }
                }
                let head = &mut self.head;
                let recorded = &mut self.recorded;
                // NB: AssertUnwindSafe is sound here because a panic marks
                // the head (and its points) damaged and they are thrown
                // away, never read.
                match catch_unwind(AssertUnwindSafe(|| {
                    decode_profile(&record.pprof, &replayer.decode_limits).and_then(|profile| {
                        let checked = head
                            .check(
                                profile,
                                &record.labels,
                                record.duration_nanos,
                                &replayer.ingest_limits,
                            )
                            .map_err(|source| StorageError::Rejected { source })?;
                        let values = checked.recorded_values(&replayer.recording_rules);
                        head.apply_checked(checked, record.time_ms);
                        for value in values {
                            recorded.add(&value.labels, record.time_ms, value.value);
                        }
                        Ok(())
                    })
                })) {
                    Ok(Ok(())) => return,
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
    pub(in crate::store) fn head_damaged(&self) -> bool {
        self.damaged && self.error.is_none()
    }

    /// Starts over with an empty head, keeping the records set aside.
    pub(in crate::store) fn restart(&mut self) {
        self.head = Head::new();
        self.recorded = RecordedPoints::new();
        self.head_first = self.start_segment;
        self.last_segment = None;
        self.cut.clear();
        self.damaged = false;
        self.keyed = ReplayedKeys::default();
    }

    /// What the pass did with keyed records so far (call before
    /// [`ReplayPass::finish`]).
    pub(in crate::store) fn take_keyed(&mut self) -> ReplayedKeys {
        std::mem::take(&mut self.keyed)
    }

    /// The heads cut on the way (oldest first), the last head (its
    /// `first_segment` the first of its range; its end is not final, the
    /// live head goes on), and how many records were set aside.
    pub(in crate::store) fn finish(
        self,
    ) -> Result<(Vec<ReplayedHead>, ReplayedHead, u64), StorageError> {
        match self.error {
            Some(err) => Err(err),
            None => Ok((
                self.cut,
                ReplayedHead {
                    head: self.head,
                    recorded: self.recorded,
                    first_segment: self.head_first,
                    end_segment: self.last_segment.map_or(self.head_first, |s| s + 1),
                },
                self.quarantined.len() as u64,
            )),
        }
    }
}

pub(in crate::store) fn replayer(config: &StoreConfig) -> Replayer {
    Replayer {
        decode_limits: config.decode_limits.clone(),
        recording_rules: Arc::clone(&config.recording_rules),
        // Every logged record passed the head-dependent checks before it
        // was logged; replay must not refuse what was acknowledged.
        ingest_limits: config.ingest_limits.for_logged_records(),
        quarantine_dir: quarantine_dir(config),
        keys: ReplayKeys::default(),
    }
}

/// Replays what `pass` has taken in again into fresh heads while a record
/// panicked mid-apply, skipping every record set aside so far. Each round
/// sets aside at least one more record, so this ends.
pub(in crate::store) fn replay_until_clean(
    pass: &mut ReplayPass<'_>,
    dir: &Path,
    segments: &[u64],
) -> Result<(), StorageError> {
    while pass.head_damaged() {
        pass.restart();
        crate::wal::reread(dir, segments, |replayed| pass.replay(replayed))?;
    }
    Ok(())
}

/// Decodes and validates pprof bytes (gzipped or not), straight from the
/// wire into flat tables.
fn decode_profile(bytes: &[u8], limits: &DecodeLimits) -> Result<FlatProfile, StorageError> {
    kiln_pprof::decode_flat(bytes, limits).map_err(|source| StorageError::InvalidProfile { source })
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
