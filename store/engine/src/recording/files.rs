//! Reading recorded-series files together. A merged file lists the files
//! it replaces; until those are deleted (a merge that crashed before its
//! deletes leaves them), their points within the merged file's range are
//! already counted in it and are skipped. Merging reads through the same
//! rule, so a merge after such a crash does not count them twice either.

use std::collections::HashMap;
use std::sync::Arc;

use super::{RecordedPoints, Steps};
use crate::index::CompiledMatcher;
use crate::model::LabelSet;

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

/// Adds the points of `files` that the series `matchers` select and
/// `steps` takes to `into`, each point counted once.
pub fn select_recorded(
    files: &[RecordedFile],
    matchers: &[CompiledMatcher],
    steps: &Steps,
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
    let keep = |labels: &LabelSet| matchers.iter().all(|m| m.matches_labels(labels));
    for file in files {
        let skipped = covered.get(file.name.as_str());
        let counted_elsewhere = |bucket_ms: i64| {
            skipped
                .is_some_and(|ranges| ranges.iter().any(|&(s, e)| s <= bucket_ms && bucket_ms < e))
        };
        file.points
            .select_into(keep, steps, counted_elsewhere, into);
    }
}
