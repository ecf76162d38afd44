//! Compaction: merging blocks into one bigger block, series by series.
//!
//! Series with equal labels merge, metadata is deduplicated again across the
//! sources (only entries still referenced survive) and rollups are rebuilt
//! for the larger span. The merge streams: the output is written one series
//! at a time straight from the sources' compressed columns into the output
//! block's symbol space, so besides the sources (compressed data, decoded
//! symbol tables) it holds only the output's symbols and encoded bytes and
//! one series' values, never a decoded copy of every point.

use std::collections::BTreeMap;

use crate::block::encode::{BlockIdentity, BlockWriter, SeriesValues};
use crate::block::{Block, BlockSeries, COLUMN_CHUNK_MS};
use crate::columns::decode_points;
use crate::error::BlockError;
use crate::model::{BlockMeta, LabelSet};
use crate::symbols::{SymbolTable, SymbolTranslator};
use crate::wire::Reader;

fn corrupt(what: &'static str) -> BlockError {
    BlockError::Corrupt { what }
}

/// Merges `blocks` into one block at level `max(source levels) + 1`.
pub fn compact_blocks(
    blocks: &[&Block],
    id: &str,
    replica: &str,
) -> Result<(BlockMeta, Vec<u8>), BlockError> {
    let min_ms = blocks.iter().map(|b| b.meta().min_time_ms).min();
    let max_ms = blocks.iter().map(|b| b.meta().max_time_ms).max();
    let (Some(min_ms), Some(max_ms)) = (min_ms, max_ms) else {
        return Err(BlockError::Empty);
    };
    // Every output series and where it lives in each source, in label
    // order (the order a block's directory and index need).
    let mut merged: BTreeMap<&LabelSet, Vec<(usize, &BlockSeries)>> = BTreeMap::new();
    for (source, block) in blocks.iter().enumerate() {
        for series in &block.series {
            merged
                .entry(&series.labels)
                .or_default()
                .push((source, series));
        }
    }
    let mut writer = BlockWriter::new(min_ms, max_ms)?;
    let mut translators: Vec<SymbolTranslator> = blocks
        .iter()
        .map(|b| SymbolTranslator::new(&b.symbols))
        .collect();
    for (labels, parts) in merged {
        let mut values = SeriesValues::default();
        for &(source, series) in &parts {
            read_series(
                blocks[source],
                series,
                &mut translators[source],
                &mut writer.symbols,
                &mut values,
            )?;
        }
        let profile_type = &parts[0].1.profile_type;
        writer.add_series(labels, profile_type, values)?;
    }
    // The translation memos are not needed to assemble the container.
    drop(translators);
    writer.finish(BlockIdentity {
        id,
        replica,
        level: blocks
            .iter()
            .map(|b| b.meta().compaction_level)
            .max()
            .unwrap_or(0)
            .saturating_add(1),
        sources: blocks.iter().map(|b| b.meta().id.clone()).collect(),
        profiles: blocks.iter().map(|b| b.meta().profiles).sum(),
    })
}

/// Adds one source series' totals and raw points to `values`, translating
/// its stack keys into `output`.
fn read_series(
    block: &Block,
    series: &BlockSeries,
    translator: &mut SymbolTranslator,
    output: &mut SymbolTable,
    values: &mut SeriesValues,
) -> Result<(), BlockError> {
    for (time_ms, total, profiles) in block.totals(series)? {
        values.add_total(time_ms, total, profiles);
    }
    for &(chunk, blob) in &series.columns {
        debug_assert_eq!(chunk.rem_euclid(COLUMN_CHUNK_MS), 0);
        let bytes = block.blob(blob)?;
        let mut r = Reader::new(&bytes);
        let columns = r.count(3).map_err(|_| corrupt("columns"))?;
        for _ in 0..columns {
            let stack = r.u32().map_err(|_| corrupt("columns"))?;
            let labels = r.u32().map_err(|_| corrupt("columns"))?;
            if stack as usize >= block.symbols.node_count()
                || labels as usize >= block.symbols.label_sets.len()
            {
                return Err(corrupt("stack key out of range"));
            }
            let key = (
                translator.node(&block.symbols, output, stack),
                translator.label_set(&block.symbols, output, labels),
            );
            decode_points(&mut r, chunk, |ts, value| values.add_point(key, ts, value))
                .map_err(|_| corrupt("column points"))?;
        }
    }
    Ok(())
}
