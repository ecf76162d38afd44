//! Compaction: merging blocks into one bigger block, series by series.
//!
//! Series with equal labels merge, metadata is deduplicated again across the
//! sources (only entries still referenced survive) and rollups are rebuilt
//! for the larger span. The merge streams: the output is written one series
//! at a time straight from the sources' compressed columns into the output
//! block's symbol space, so besides the sources (compressed data, decoded
//! symbol tables) it holds only the output's symbols and encoded bytes and
//! one series' values, never a decoded copy of every point.
//!
//! [`compact_streaming`] holds less than its sources: it reads them by range
//! ([`BlockRanges`]) and writes its output as it goes ([`BlockSink`]), so
//! besides the output's symbols and directory it holds one id remap per
//! source stack node and label set, a bounded read window per source and
//! one series.

use std::collections::BTreeMap;

use crate::block::encode::{BlockIdentity, BlockWriter, SeriesValues};
use crate::block::format::BlockCompression;
use crate::block::source::{SeriesCursor, SourceData, SourceHeader, open_source};
use crate::block::{Block, BlockRanges, BlockSeries, BlockSink, COLUMN_CHUNK_MS};
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

/// Why a streaming compaction failed, and whose fault it was.
#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    /// A source block could not be read or is corrupt.
    #[error("source block {index} of the compaction cannot be merged")]
    Source {
        /// The source's position in the list given.
        index: usize,
        /// What went wrong reading it.
        #[source]
        source: BlockError,
    },
    /// The merged block could not be built or written out.
    #[error("the merged block cannot be written")]
    Output {
        /// What went wrong.
        #[source]
        source: BlockError,
    },
}

impl CompactionError {
    /// The block error underneath.
    pub fn block_error(&self) -> &BlockError {
        match self {
            Self::Source { source, .. } | Self::Output { source } => source,
        }
    }
}

/// Merges the blocks `sources` read into one block at level
/// `max(source levels) + 1`, compressed as `compression` says and written
/// to `out` as it is built (the header last, at the start); returns its
/// metadata. Each source's data section is
/// read forward `read_window` bytes at a time (more for a larger blob).
/// The output equals [`compact_blocks`]'s in content (series, values,
/// stacks, labels); symbol ids may be numbered differently.
pub fn compact_streaming<R: BlockRanges>(
    mut sources: Vec<R>,
    id: &str,
    replica: &str,
    read_window: usize,
    compression: BlockCompression,
    out: &mut dyn BlockSink,
) -> Result<BlockMeta, CompactionError> {
    let source_err = |index| move |source| CompactionError::Source { index, source };
    let output_err = |source| CompactionError::Output { source };
    let mut headers = Vec::with_capacity(sources.len());
    for (index, ranges) in sources.iter_mut().enumerate() {
        headers.push(SourceHeader::read(ranges).map_err(source_err(index))?);
    }
    let min_ms = headers.iter().map(|h| h.meta.min_time_ms).min();
    let max_ms = headers.iter().map(|h| h.meta.max_time_ms).max();
    let (Some(min_ms), Some(max_ms)) = (min_ms, max_ms) else {
        return Err(output_err(BlockError::Empty));
    };
    let mut writer = BlockWriter::spilling(min_ms, max_ms, compression, out).map_err(output_err)?;
    let mut cursors: Vec<SeriesCursor> = Vec::with_capacity(sources.len());
    let mut readers: Vec<SourceData<R>> = Vec::with_capacity(sources.len());
    for (index, (ranges, header)) in sources.into_iter().zip(&headers).enumerate() {
        let (cursor, reader) = open_source(ranges, header, &mut writer.symbols, read_window)
            .map_err(source_err(index))?;
        cursors.push(cursor);
        readers.push(reader);
    }
    // A merge of the sources' directories, each in label order: the output
    // series in label order, each source's data read forward.
    let mut heads: Vec<Option<BlockSeries>> = Vec::with_capacity(cursors.len());
    for (index, cursor) in cursors.iter_mut().enumerate() {
        heads.push(cursor.next(&writer.symbols).map_err(source_err(index))?);
    }
    while let Some(labels) = heads.iter().flatten().map(|s| &s.labels).min().cloned() {
        let mut values = SeriesValues::default();
        let mut profile_type = None;
        for (index, head) in heads.iter_mut().enumerate() {
            while let Some(series) = head.take_if(|s| s.labels == labels) {
                read_source_series(
                    &mut readers[index],
                    &series,
                    headers[index].meta.min_time_ms,
                    &mut values,
                )
                .map_err(source_err(index))?;
                profile_type.get_or_insert(series.profile_type);
                *head = cursors[index]
                    .next(&writer.symbols)
                    .map_err(source_err(index))?;
            }
        }
        let Some(profile_type) = profile_type else {
            break;
        };
        writer
            .add_series(&labels, &profile_type, values)
            .map_err(output_err)?;
    }
    for (index, reader) in readers.into_iter().enumerate() {
        reader.finish().map_err(source_err(index))?;
    }
    drop(cursors);
    writer
        .finish_spilled(BlockIdentity {
            id,
            replica,
            level: headers
                .iter()
                .map(|h| h.meta.compaction_level)
                .max()
                .unwrap_or(0)
                .saturating_add(1),
            sources: headers.iter().map(|h| h.meta.id.clone()).collect(),
            profiles: headers.iter().map(|h| h.meta.profiles).sum(),
        })
        .map_err(output_err)
}

/// Adds one series of a source read by range to `values`: its raw points
/// (stack keys remapped into the output), then its totals, in the order
/// the block lays them out.
fn read_source_series<R: BlockRanges>(
    source: &mut SourceData<R>,
    series: &BlockSeries,
    block_min_ms: i64,
    values: &mut SeriesValues,
) -> Result<(), BlockError> {
    for &(chunk, blob) in &series.columns {
        let bytes = source.blob(blob)?.into_owned();
        let mut r = Reader::new(&bytes);
        let columns = r.count(3).map_err(|_| corrupt("columns"))?;
        for _ in 0..columns {
            let stack = r.u32().map_err(|_| corrupt("columns"))?;
            let labels = r.u32().map_err(|_| corrupt("columns"))?;
            let key = source.key(stack, labels)?;
            decode_points(&mut r, chunk, |ts, value| values.add_point(key, ts, value))
                .map_err(|_| corrupt("column points"))?;
        }
    }
    for (time_ms, total, profiles) in source.totals(series, block_min_ms)? {
        values.add_total(time_ms, total, profiles);
    }
    Ok(())
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
