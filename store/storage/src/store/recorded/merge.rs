//! Keeping the recorded files few: each replica merges its own files into
//! one per past hour, and those into one per past UTC day, so a query over
//! a month reads about thirty files per replica, not forty thousand; and
//! deletes them once older than `recorded_retention`.
//!
//! A merge writes its file (naming the files it replaces) before deleting
//! them, so a crash in between leaves points counted once (see
//! `kiln_engine::recording::select_recorded`), and the next pass finishes
//! the job.

use std::collections::BTreeSet;

use kiln_engine::recording::{RecordedPoints, Steps, select_recorded};

use super::super::config::millis;
use crate::bucket::{RecordedKind, RecordedName};
use crate::error::StorageError;
use crate::store::{Store, lock, read};

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordedUpkeep {
    /// Merged files written.
    pub merged: usize,
    /// Files deleted (merged into others, or past retention).
    pub deleted: usize,
}

/// The period a point at `time_ms` is kept in once merged, at `now_ms`:
/// its UTC day once the day is over, its hour once the hour is over;
/// `None` within the current hour.
fn period_of(time_ms: i64, now_ms: i64) -> Option<(i64, i64)> {
    let today = now_ms.div_euclid(DAY_MS) * DAY_MS;
    let this_hour = now_ms.div_euclid(HOUR_MS) * HOUR_MS;
    if time_ms < today {
        let day = time_ms.div_euclid(DAY_MS) * DAY_MS;
        Some((day, day + DAY_MS))
    } else if time_ms < this_hour {
        let hour = time_ms.div_euclid(HOUR_MS) * HOUR_MS;
        Some((hour, hour + HOUR_MS))
    } else {
        None
    }
}

/// True for a merged file that already is its period's one file.
fn is_settled(name: &RecordedName, now_ms: i64) -> bool {
    name.kind == RecordedKind::Merged
        && period_of(name.start_ms, now_ms) == Some((name.start_ms, name.end_ms))
}

impl Store {
    /// Merges this replica's recorded files whose time is past (see the
    /// module docs) and deletes those older than `recorded_retention`
    /// (every replica's, while this one holds the retention lease).
    pub async fn maintain_recorded(&self, now_ms: i64) -> Result<RecordedUpkeep, StorageError> {
        let shared = &self.shared;
        let replica = shared.config.replica.as_str();
        let mut upkeep = RecordedUpkeep::default();
        let listed = shared.bucket.list_recorded().await?;
        let horizon = now_ms.saturating_sub(millis(shared.config.recorded_retention));
        // Each replica expires its own files; the one that holds the
        // retention lease (as for blocks) also expires those of replicas
        // that are gone, which no one else would ever delete.
        let sweeps_all = self.hold_retention_lease().await;
        let (expired, rest): (Vec<RecordedName>, Vec<RecordedName>) = listed
            .into_iter()
            .partition(|n| n.end_ms <= horizon && (sweeps_all || n.replica == replica));
        let kept: Vec<RecordedName> = rest.into_iter().filter(|n| n.replica == replica).collect();
        for name in &expired {
            if name.replica == replica {
                shared.bucket.delete_recorded(name).await?;
            } else {
                // Another replica's: only while this one holds retention.
                shared
                    .upkeep
                    .retention_lease
                    .fenced(
                        "delete a gone replica's recorded file",
                        shared.bucket.delete_recorded(name),
                    )
                    .await?;
            }
            shared.recorded.forget(&name.file_name());
            upkeep.deleted += 1;
        }
        // A flush file whose block is not known to be up stays as it is:
        // the flush retries (rewriting the same file) or recovery deletes
        // it and replays its records, and either must find it by its
        // block's name, not merged into a file that would count it again.
        let pending: BTreeSet<String> = {
            let view = read(&shared.catalog.view);
            let held = lock(&shared.upkeep.held);
            view.frozen
                .iter()
                .map(|f| f.id.clone())
                .chain(held.iter().map(|m| m.block_id.clone()))
                .collect()
        };
        let this_hour = now_ms.div_euclid(HOUR_MS) * HOUR_MS;
        let candidates: Vec<&RecordedName> = kept
            .iter()
            .filter(|n| !is_settled(n, now_ms) && n.end_ms <= this_hour)
            .filter(|n| !(n.kind == RecordedKind::Flush && pending.contains(&n.id)))
            .collect();
        if candidates.is_empty() {
            return Ok(upkeep);
        }
        let candidate_files = self.read_recorded_files(&candidates).await?;
        let mut periods = BTreeSet::new();
        for file in &candidate_files {
            for (_, points) in file.points.series() {
                periods.extend(points.keys().filter_map(|&t| period_of(t, now_ms)));
            }
        }
        let settled: Vec<&RecordedName> = kept
            .iter()
            .filter(|n| is_settled(n, now_ms) && periods.contains(&(n.start_ms, n.end_ms)))
            .collect();
        let mut files = candidate_files;
        files.extend(self.read_recorded_files(&settled).await?);
        for &(start_ms, end_ms) in &periods {
            let mut points = RecordedPoints::new();
            select_recorded(&files, &[], &Steps::raw(start_ms, end_ms), &mut points);
            if points.is_empty() {
                continue;
            }
            let replaces: Vec<String> = files
                .iter()
                .filter(|f| f.range.0 < end_ms && start_ms < f.range.1)
                .map(|f| f.name.clone())
                .collect();
            let name = RecordedName {
                replica: replica.to_owned(),
                kind: RecordedKind::Merged,
                id: ulid::Ulid::new().to_string(),
                start_ms,
                end_ms,
            };
            let encoded = tokio::task::spawn_blocking(move || points.encode(&replaces))
                .await
                .map_err(|e| StorageError::task("recorded merge encode", e))?;
            shared.bucket.put_recorded(&name, encoded.into()).await?;
            upkeep.merged += 1;
        }
        // Every point of these is now in a merged file that names them.
        for name in candidates.into_iter().chain(settled) {
            shared.bucket.delete_recorded(name).await?;
            shared.recorded.forget(&name.file_name());
            upkeep.deleted += 1;
        }
        Ok(upkeep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_settle_into_their_hour_then_their_day() {
        let now = 10 * DAY_MS + 5 * HOUR_MS + 30 * 60_000;
        assert_eq!(period_of(now - 60_000, now), None, "this hour");
        let earlier_today = 10 * DAY_MS + 2 * HOUR_MS + 1;
        assert_eq!(
            period_of(earlier_today, now),
            Some((10 * DAY_MS + 2 * HOUR_MS, 10 * DAY_MS + 3 * HOUR_MS))
        );
        assert_eq!(
            period_of(9 * DAY_MS + 23 * HOUR_MS, now),
            Some((9 * DAY_MS, 10 * DAY_MS))
        );
        let hour_file = RecordedName {
            replica: "r".to_owned(),
            kind: RecordedKind::Merged,
            id: ulid::Ulid::new().to_string(),
            start_ms: 10 * DAY_MS + 2 * HOUR_MS,
            end_ms: 10 * DAY_MS + 3 * HOUR_MS,
        };
        assert!(is_settled(&hour_file, now));
        assert!(
            !is_settled(&hour_file, now + DAY_MS),
            "a day later it joins its day"
        );
        let flush = RecordedName {
            kind: RecordedKind::Flush,
            ..hour_file
        };
        assert!(!is_settled(&flush, now));
    }
}
