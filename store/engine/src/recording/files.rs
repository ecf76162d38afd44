//! Reading recorded-series files together. A merged file lists the files
//! it replaces; until those are deleted (a merge that crashed before its
//! deletes leaves them), their points within the merged file's range are
//! already counted in it and are skipped. Merging reads through the same
//! rule, so a merge after such a crash does not count them twice either.

use std::collections::HashMap;
use std::sync::Arc;

use super::RecordedPoints;
use crate::index::CompiledMatcher;

/// One recorded-series file as read from the bucket.
#[derive(Debug, Clone)]
pub struct RecordedFile {
    /// Its object name (what other files' `replaces` lists name).
    pub name: String,
    /// The times its points fall in, `[start, end)` unix ms.
    pub range: (i64, i64),
    /// Its points.
    pub points: Arc<RecordedPoints>,
    /// The files whose points within `range` it holds.
    pub replaces: Vec<String>,
}

/// Adds the points of `files` that the series `matchers` select, in
/// `[start_ms, end_ms)`, to `into`, each point counted once.
pub fn select_recorded(
    files: &[RecordedFile],
    matchers: &[CompiledMatcher],
    start_ms: i64,
    end_ms: i64,
    into: &mut RecordedPoints,
) {
    let mut covered: HashMap<&str, Vec<(i64, i64)>> = HashMap::new();
    for file in files {
        for replaced in &file.replaces {
            covered
                .entry(replaced.as_str())
                .or_default()
                .push(file.range);
        }
    }
    for file in files {
        let skipped = covered.get(file.name.as_str());
        if skipped.is_none() {
            file.points.select_into(matchers, start_ms, end_ms, into);
            continue;
        }
        let mut kept = RecordedPoints::new();
        file.points
            .select_into(matchers, start_ms, end_ms, &mut kept);
        for (labels, points) in kept.series() {
            for (&time_ms, &value) in points {
                let counted_elsewhere = skipped
                    .is_some_and(|ranges| ranges.iter().any(|&(s, e)| s <= time_ms && time_ms < e));
                if !counted_elsewhere {
                    into.add(labels, time_ms, value);
                }
            }
        }
    }
}
