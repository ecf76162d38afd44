//! Recorded series: what recording rules make of each ingest.
//!
//! An ingest adds its rules' values to the live points, under the cut gate
//! with its head apply; a head cut takes the live points with the head, so
//! a cut head and its points cover the same WAL segments. A flush writes
//! the points as a file beside the block, just before the block, and
//! replay rebuilds the points of what it replays, so a crash neither loses
//! nor doubles them (recovery deletes the file of a block that was never
//! uploaded). Maintenance merges each replica's own files into one per
//! past hour, then per past day (`merge`), and deletes them after
//! `recorded_retention`.
//!
//! Queries read the files their range touches (decoded files are cached;
//! they never change), the heads waiting for upload whose file is not
//! listed yet, and the live points. Like profiles, another replica's
//! points are seen once it has flushed them.
//!
//! Locks: `live` and `totals` are leaves (step 11 of the store's order),
//! `live` taken under the cut gate's read by an ingest and under every
//! shard's write lock by a cut; `files` is a leaf taken by queries.

mod merge;

pub use merge::RecordedUpkeep;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use kiln_engine::model::{LabelSet, Matcher};
use kiln_engine::recording::{RecordedFile, RecordedPoints, RecordedValue, Steps, select_recorded};

use super::{Store, lock, read};
use crate::bucket::{RecordedKind, RecordedName};
use crate::error::StorageError;

/// Largest recorded file read: a day of 10 s points for about 10,000 series.
const MAX_RECORDED_FILE_BYTES: u64 = 256 << 20;

/// The recorded-series state every clone of a store shares.
#[derive(Debug)]
pub(super) struct Recorded {
    /// Points of the live head's profiles; cut with the head.
    pub(super) live: Mutex<RecordedPoints>,
    /// Totals since this process started, per recorded series: the
    /// counters `/metrics/recorded` exposes.
    totals: Mutex<BTreeMap<LabelSet, i64>>,
    /// Decoded files by file name, within a byte budget.
    files: Mutex<FileCache>,
}

#[derive(Debug)]
struct FileCache {
    budget: usize,
    used: usize,
    entries: HashMap<String, Arc<Decoded>>,
}

#[derive(Debug)]
struct Decoded {
    points: Arc<RecordedPoints>,
    replaces: Vec<String>,
    bytes: usize,
}

impl Recorded {
    /// The state at open: `live` is what replay rebuilt for the live head.
    pub(super) fn new(live: RecordedPoints, cache_budget: usize) -> Self {
        Self {
            live: Mutex::new(live),
            totals: Mutex::new(BTreeMap::new()),
            files: Mutex::new(FileCache {
                budget: cache_budget,
                used: 0,
                entries: HashMap::new(),
            }),
        }
    }

    /// Adds an acknowledged ingest's values at `time_ms`. The caller holds
    /// the cut gate's read, so the values land with the profile's head.
    pub(super) fn note_ingest(&self, values: &[RecordedValue], time_ms: i64) {
        if values.is_empty() {
            return;
        }
        {
            let mut live = lock(&self.live);
            for value in values {
                live.add(&value.labels, time_ms, value.value);
            }
        }
        let mut totals = lock(&self.totals);
        for value in values {
            let total = totals.entry(value.labels.clone()).or_insert(0);
            *total = total.saturating_add(value.value);
        }
    }

    /// Takes the live points for a head being cut.
    pub(super) fn take_live(&self) -> RecordedPoints {
        std::mem::take(&mut *lock(&self.live))
    }

    fn cached(&self, name: &str) -> Option<Arc<Decoded>> {
        lock(&self.files).entries.get(name).cloned()
    }

    fn remember(&self, name: String, decoded: Arc<Decoded>) {
        let mut cache = lock(&self.files);
        if decoded.bytes > cache.budget {
            return;
        }
        // Files never change, so any entry may go; the cache is refilled
        // from the bucket at the cost of one read.
        while cache.used + decoded.bytes > cache.budget {
            let Some(victim) = cache.entries.keys().next().cloned() else {
                break;
            };
            if let Some(gone) = cache.entries.remove(&victim) {
                cache.used -= gone.bytes;
            }
        }
        cache.used += decoded.bytes;
        if let Some(old) = cache.entries.insert(name, decoded) {
            cache.used -= old.bytes;
        }
    }

    fn forget(&self, name: &str) {
        let mut cache = lock(&self.files);
        if let Some(gone) = cache.entries.remove(name) {
            cache.used -= gone.bytes;
        }
    }
}

impl Store {
    /// The totals of every recorded series since this process started,
    /// in label order (Prometheus counters).
    pub fn recorded_totals(&self) -> Vec<(LabelSet, i64)> {
        lock(&self.shared.recorded.totals)
            .iter()
            .map(|(labels, total)| (labels.clone(), *total))
            .collect()
    }

    /// The metric names of the configured rules, in order.
    pub fn recorded_metric_names(&self) -> Vec<String> {
        self.shared
            .config
            .recording_rules
            .rules()
            .iter()
            .map(|rule| rule.metric_name().to_owned())
            .collect()
    }

    /// The recorded series `matchers` select, summed into `steps`' output
    /// times: the bucket's files, the heads waiting for upload and the
    /// live points.
    pub async fn recorded_points(
        &self,
        matchers: &[Matcher],
        steps: Steps,
    ) -> Result<RecordedPoints, StorageError> {
        let matchers = kiln_engine::compile_matchers(matchers)
            .map_err(|source| StorageError::Query { source })?;
        let listed = self.shared.bucket.list_recorded().await?;
        let flushed: std::collections::HashSet<&str> = listed
            .iter()
            .filter(|n| n.kind == RecordedKind::Flush)
            .map(|n| n.id.as_str())
            .collect();
        let touched: Vec<&RecordedName> = listed
            .iter()
            .filter(|n| n.start_ms < steps.to_ms && steps.from_ms < n.end_ms)
            .collect();
        // Merges name what they replace; a replaced file outside the range
        // needs no reading, one inside is read and its covered points skipped.
        let files = self.read_recorded_files(&touched).await?;
        let mut points = RecordedPoints::new();
        select_recorded(&files, &matchers, &steps, &mut points);
        let keep = |labels: &LabelSet| matchers.iter().all(|m| m.matches_labels(labels));
        let pending: Vec<Arc<RecordedPoints>> = read(&self.shared.catalog.view)
            .frozen
            .iter()
            .filter(|f| !flushed.contains(f.id.as_str()))
            .map(|f| Arc::clone(&f.recorded))
            .collect();
        for frozen in pending {
            frozen.select_into(keep, &steps, |_| false, &mut points);
        }
        lock(&self.shared.recorded.live).select_into(keep, &steps, |_| false, &mut points);
        Ok(points)
    }

    /// Reads (or takes from the cache) each named file. A file deleted
    /// since the listing (merged or expired) is skipped: its points are in
    /// the merge that replaced it, which the next listing names.
    async fn read_recorded_files(
        &self,
        names: &[&RecordedName],
    ) -> Result<Vec<RecordedFile>, StorageError> {
        let recorded = &self.shared.recorded;
        let mut files = Vec::with_capacity(names.len());
        for name in names {
            let file_name = name.file_name();
            let decoded = match recorded.cached(&file_name) {
                Some(decoded) => decoded,
                None => {
                    let bytes = match self
                        .shared
                        .bucket
                        .get_recorded(name, MAX_RECORDED_FILE_BYTES)
                        .await
                    {
                        Ok(bytes) => bytes,
                        Err(StorageError::Bucket {
                            source: object_store::Error::NotFound { .. },
                            ..
                        }) => continue,
                        Err(StorageError::RecordedFile { name, message }) => {
                            tracing::warn!(file = %name, %message, "skipping a recorded-series file");
                            continue;
                        }
                        Err(err) => return Err(err),
                    };
                    let decoded =
                        tokio::task::spawn_blocking(move || RecordedPoints::decode(&bytes))
                            .await
                            .map_err(|e| StorageError::task("recorded file decode", e))?;
                    let (points, replaces) = match decoded {
                        Ok(decoded) => decoded,
                        Err(error) => {
                            tracing::warn!(file = %file_name, %error, "skipping a damaged recorded-series file");
                            continue;
                        }
                    };
                    let decoded = Arc::new(Decoded {
                        bytes: points.approx_bytes()
                            + replaces.iter().map(String::len).sum::<usize>(),
                        points: Arc::new(points),
                        replaces,
                    });
                    recorded.remember(file_name.clone(), Arc::clone(&decoded));
                    decoded
                }
            };
            files.push(RecordedFile {
                name: file_name,
                range: (name.start_ms, name.end_ms),
                points: Arc::clone(&decoded.points),
                replaces: decoded.replaces.clone(),
            });
        }
        Ok(files)
    }

    /// Writes a cut head's points beside its block, named after it; called
    /// before the block's upload. Nothing to write for no points.
    pub(super) async fn upload_recorded(
        &self,
        block_id: &str,
        points: &RecordedPoints,
    ) -> Result<(), StorageError> {
        let Some((first, last)) = points.time_bounds() else {
            return Ok(());
        };
        let name = RecordedName {
            replica: self.shared.config.replica.clone(),
            kind: RecordedKind::Flush,
            id: block_id.to_owned(),
            start_ms: first,
            end_ms: last + kiln_engine::recording::RECORDED_RESOLUTION_MS,
        };
        self.shared
            .bucket
            .put_recorded(&name, points.encode(&[]).into())
            .await
    }
}

/// Deletes the flush file of a block recovery found missing: its WAL
/// segments are replayed, and replay records their points again.
pub(in crate::store) async fn delete_unmatched_flush_file(
    bucket: &crate::bucket::Bucket,
    replica: &str,
    block_id: &str,
) -> Result<(), StorageError> {
    for name in bucket.list_recorded().await? {
        if name.kind == RecordedKind::Flush && name.replica == replica && name.id == block_id {
            bucket.delete_recorded(&name).await?;
        }
    }
    Ok(())
}
