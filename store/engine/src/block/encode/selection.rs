//! A block of only what a query selects from a head: what a replica hands
//! a peer that queries its unflushed data. Symbols are rebuilt from the
//! selected points alone, so a narrow selection of a large head is small.

use std::collections::BTreeMap;

use super::{BlockIdentity, BlockWriter, SeriesValues};
use crate::error::BlockError;
use crate::head::{Head, HeadSeries};
use crate::index::CompiledMatcher;
use crate::model::{BlockMeta, LabelSet, TimeRange};
use crate::symbols::SymbolTranslator;

/// Encodes the series of `heads` that match `matchers`, with only their
/// profiles inside `range`, into one block named `id`. `None` when nothing
/// is selected. The block's level is 0 and it has no sources: it is a view
/// of live data, never uploaded.
///
/// Without `stacks`, series keep only their per-profile totals: enough for
/// listings, timelines and exemplars, and a fraction of the bytes and time
/// (a listing selects every series).
pub fn encode_selection(
    heads: &[&Head],
    matchers: &[CompiledMatcher],
    range: TimeRange,
    stacks: bool,
    (id, replica): (&str, &str),
) -> Result<Option<(BlockMeta, Vec<u8>)>, BlockError> {
    let mut order: BTreeMap<&LabelSet, Vec<(usize, &HeadSeries)>> = BTreeMap::new();
    let mut bounds: Option<(i64, i64)> = None;
    let mut profiles = 0u64;
    for (shard, head) in heads.iter().enumerate() {
        for series_id in head.index.select(matchers) {
            let Some(series) = head.series.get(series_id as usize) else {
                continue;
            };
            let mut selected = false;
            for run in series.runs.iter().filter(|r| range.contains(r.time_ms)) {
                let (min, max) = bounds.unwrap_or((run.time_ms, run.time_ms));
                bounds = Some((min.min(run.time_ms), max.max(run.time_ms)));
                profiles += u64::from(run.count);
                selected = true;
            }
            if selected {
                order
                    .entry(&series.labels)
                    .or_default()
                    .push((shard, series));
            }
        }
    }
    let Some((min_ms, max_ms)) = bounds else {
        return Ok(None);
    };
    let mut writer = BlockWriter::new(min_ms, max_ms)?;
    let mut translators: Vec<SymbolTranslator> = heads
        .iter()
        .map(|head| SymbolTranslator::new(&head.symbols))
        .collect();
    for (labels, parts) in order {
        let mut values = SeriesValues::default();
        for &(shard, series) in &parts {
            let symbols = &heads[shard].symbols;
            let Some(translator) = translators.get_mut(shard) else {
                continue;
            };
            for (run, points) in series.runs_with_points() {
                if !range.contains(run.time_ms) {
                    continue;
                }
                values.add_total(run.time_ms, run.total, u64::from(run.count));
                if !stacks {
                    continue;
                }
                for point in points {
                    let key = (
                        translator.node(symbols, &mut writer.symbols, point.stack),
                        translator.label_set(symbols, &mut writer.symbols, point.labels),
                    );
                    values.add_point(key, run.time_ms, point.value);
                }
            }
        }
        writer.add_series(labels, &parts[0].1.profile_type, values)?;
    }
    drop(translators);
    writer
        .finish(BlockIdentity {
            id,
            replica,
            level: 0,
            sources: Vec::new(),
            // Profile-series pairs: a profile of several sample types is
            // counted once per type here.
            profiles,
        })
        .map(Some)
}
