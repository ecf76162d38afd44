//! Encoding a head into a block. Symbols are rebuilt from what the series
//! reference, so unreferenced entries never reach a block.

use std::collections::BTreeMap;

use hashbrown::HashMap;

use super::format::{BlobCompressor, ContainerWriter, SectionKind, write_blob};
use super::rollup::{ROLLUP_WINDOWS_MS, levels_for_span, window_start};
use super::{BlobRef, COLUMN_CHUNK_MS, encode_meta, encode_postings, tables, write_blob_ref};
use crate::columns::encode_points;
use crate::error::BlockError;
use crate::head::{Head, HeadSeries};
use crate::index::LabelIndex;
use crate::model::BlockMeta;
use crate::symbols::{SymbolTable, SymbolTranslator};
use crate::wire::Writer;

/// Rollup chunks of the top level span this long.
const TOP_LEVEL_CHUNK_MS: i64 = 30 * 86_400_000;

/// Windows of `level` are stored in chunks this long (the next level's window).
pub(crate) fn rollup_chunk_ms(level: u8) -> i64 {
    ROLLUP_WINDOWS_MS
        .get(level as usize + 1)
        .copied()
        .unwrap_or(TOP_LEVEL_CHUNK_MS)
}

/// Encodes `head` into one block object; returns its metadata and bytes.
pub fn encode_block(
    head: &Head,
    id: &str,
    replica: &str,
) -> Result<(BlockMeta, Vec<u8>), BlockError> {
    let (min_ms, max_ms) = head.time_bounds().ok_or(BlockError::Empty)?;
    let mut order: Vec<&HeadSeries> = head
        .series
        .iter()
        .filter(|s| !s.points.is_empty())
        .collect();
    if order.is_empty() {
        return Err(BlockError::Empty);
    }
    order.sort_by(|a, b| a.labels.cmp(&b.labels));

    let levels = levels_for_span(min_ms, max_ms);
    let mut symbols = SymbolTable::new();
    let mut translator = SymbolTranslator::new(&head.symbols);
    let mut data = DataWriter {
        bytes: Vec::new(),
        compressor: BlobCompressor::new()?,
    };
    let mut directory = Writer::new();
    directory.varint(order.len() as u64);
    let mut index = LabelIndex::new();
    let mut samples = 0u64;
    for (series_id, series) in order.iter().enumerate() {
        index.add(series_id as u32, &series.labels);
        let encoded = encode_series(
            series,
            head,
            &mut symbols,
            &mut translator,
            &levels,
            min_ms,
            &mut data,
        )?;
        samples += encoded.points;
        directory.varint(series.labels.len() as u64);
        for label in series.labels.iter() {
            directory.varint(u64::from(symbols.intern_string(&label.name)));
            directory.varint(u64::from(symbols.intern_string(&label.value)));
        }
        encoded.write_entry(series, &mut symbols, &mut directory);
    }
    let postings = encode_postings(&index, &mut symbols)?;

    let meta = BlockMeta {
        format_version: super::format::FORMAT_VERSION,
        id: id.to_owned(),
        min_time_ms: min_ms,
        max_time_ms: max_ms,
        compaction_level: head.level,
        replica: replica.to_owned(),
        sources: head.sources.clone(),
        series: order.len() as u64,
        samples,
        profiles: head.profiles(),
        size_bytes: 0,
    };
    let encoded_tables = tables::encode_tables(&symbols);
    let mut container = ContainerWriter::default();
    container.add(SectionKind::Meta, encode_meta(&meta), false)?;
    container.add(SectionKind::Strings, encoded_tables.strings, true)?;
    container.add(SectionKind::Mappings, encoded_tables.mappings, true)?;
    container.add(SectionKind::Functions, encoded_tables.functions, true)?;
    container.add(SectionKind::Locations, encoded_tables.locations, true)?;
    container.add(SectionKind::Stacks, encoded_tables.stacks, true)?;
    container.add(SectionKind::LabelSets, encoded_tables.label_sets, true)?;
    container.add(SectionKind::Series, directory.into_vec(), true)?;
    container.add(SectionKind::Postings, postings, true)?;
    // Blobs inside are compressed one by one so queries decompress only what they read.
    container.add(SectionKind::Data, data.bytes, false)?;
    let bytes = container.finish();
    let meta = BlockMeta {
        size_bytes: bytes.len() as u64,
        ..meta
    };
    Ok((meta, bytes))
}

struct EncodedSeries {
    points: u64,
    min_ms: i64,
    max_ms: i64,
    columns: Vec<(i64, BlobRef)>,
    totals: BlobRef,
    rollups: Vec<(u8, i64, BlobRef)>,
}

impl EncodedSeries {
    /// Writes the rest of the series' directory entry (the caller wrote its labels).
    fn write_entry(&self, series: &HeadSeries, symbols: &mut SymbolTable, w: &mut Writer) {
        let t = &series.profile_type;
        for s in [
            &t.name,
            &t.sample_type,
            &t.sample_unit,
            &t.period_type,
            &t.period_unit,
        ] {
            w.varint(u64::from(symbols.intern_string(s)));
        }
        w.byte(u8::from(t.delta));
        w.signed(self.min_ms);
        w.signed(self.max_ms);
        w.varint(self.columns.len() as u64);
        for &(start, blob) in &self.columns {
            w.signed(start);
            write_blob_ref(w, blob);
        }
        write_blob_ref(w, self.totals);
        w.varint(self.rollups.len() as u64);
        for &(level, start, blob) in &self.rollups {
            w.byte(level);
            w.signed(start);
            write_blob_ref(w, blob);
        }
    }
}

/// The data section being built, with one zstd context for all blobs.
struct DataWriter {
    bytes: Vec<u8>,
    compressor: BlobCompressor,
}

impl DataWriter {
    fn push_blob(&mut self, raw: &[u8]) -> Result<BlobRef, BlockError> {
        let offset = self.bytes.len();
        write_blob(raw, &mut self.compressor, &mut self.bytes)?;
        Ok(BlobRef {
            offset,
            len: self.bytes.len() - offset,
        })
    }
}

type ColumnKey = (u32, u32);

fn encode_series(
    series: &HeadSeries,
    head: &Head,
    symbols: &mut SymbolTable,
    translator: &mut SymbolTranslator,
    levels: &[u8],
    block_min_ms: i64,
    data: &mut DataWriter,
) -> Result<EncodedSeries, BlockError> {
    let mut columns: HashMap<ColumnKey, Vec<(i64, i64)>> = HashMap::new();
    let mut totals: BTreeMap<i64, (i64, u64)> = BTreeMap::new();
    for (run, points) in series.runs_with_points() {
        let total = totals.entry(run.time_ms).or_insert((0, 0));
        total.0 = total.0.wrapping_add(run.total);
        total.1 += u64::from(run.count);
        for point in points {
            let key = (
                translator.node(&head.symbols, symbols, point.stack),
                translator.label_set(&head.symbols, symbols, point.labels),
            );
            columns
                .entry(key)
                .or_default()
                .push((run.time_ms, point.value));
        }
    }
    let mut columns: Vec<(ColumnKey, Vec<(i64, i64)>)> = columns.into_iter().collect();
    columns.sort_unstable_by_key(|(key, _)| *key);
    let mut point_count = 0u64;
    for (_, points) in &mut columns {
        points.sort_unstable_by_key(|&(ts, _)| ts);
        points.dedup_by(|later, earlier| {
            if later.0 == earlier.0 {
                earlier.1 = earlier.1.wrapping_add(later.1);
                true
            } else {
                false
            }
        });
        point_count += points.len() as u64;
    }

    // Raw columns, chunked by hour.
    let mut pieces: Vec<(i64, usize, usize, usize)> = Vec::new();
    for (column, (_, points)) in columns.iter().enumerate() {
        let mut start = 0;
        while start < points.len() {
            let chunk = window_start(points[start].0, COLUMN_CHUNK_MS);
            let end = start
                + points[start..]
                    .iter()
                    .take_while(|(ts, _)| window_start(*ts, COLUMN_CHUNK_MS) == chunk)
                    .count();
            pieces.push((chunk, column, start, end));
            start = end;
        }
    }
    pieces.sort_unstable();
    let mut column_blobs = Vec::new();
    let mut i = 0;
    while i < pieces.len() {
        let chunk = pieces[i].0;
        let group_end = i + pieces[i..].iter().take_while(|p| p.0 == chunk).count();
        let mut w = Writer::new();
        w.varint((group_end - i) as u64);
        for &(_, column, start, end) in &pieces[i..group_end] {
            let ((stack, labels), points) = &columns[column];
            w.varint(u64::from(*stack));
            w.varint(u64::from(*labels));
            encode_points(&points[start..end], chunk, &mut w);
        }
        column_blobs.push((chunk, data.push_blob(w.as_slice())?));
        i = group_end;
    }

    // Totals: one row per profile time.
    let mut w = Writer::new();
    w.varint(totals.len() as u64);
    let mut previous = block_min_ms;
    for (&ts, &(total, count)) in &totals {
        w.signed(ts.wrapping_sub(previous));
        w.signed(total);
        w.varint(count);
        previous = ts;
    }
    let totals_blob = data.push_blob(w.as_slice())?;
    let min_ms = totals.keys().next().copied().unwrap_or(block_min_ms);
    let max_ms = totals.keys().next_back().copied().unwrap_or(block_min_ms);

    // Rollups per level, chunked by the next level's window.
    let mut rollups = Vec::new();
    for &level in levels {
        let window = ROLLUP_WINDOWS_MS[level as usize];
        let mut entries: Vec<(i64, ColumnKey, i64)> = Vec::new();
        for (key, points) in &columns {
            for &(ts, value) in points {
                let w = window_start(ts, window);
                match entries.last_mut() {
                    Some(last) if last.0 == w && last.1 == *key => {
                        last.2 = last.2.wrapping_add(value)
                    }
                    _ => entries.push((w, *key, value)),
                }
            }
        }
        entries.sort_unstable_by_key(|&(w, key, _)| (w, key));
        entries.dedup_by(|later, earlier| {
            if later.0 == earlier.0 && later.1 == earlier.1 {
                earlier.2 = earlier.2.wrapping_add(later.2);
                true
            } else {
                false
            }
        });
        let chunk_ms = rollup_chunk_ms(level);
        let mut i = 0;
        while i < entries.len() {
            let chunk = window_start(entries[i].0, chunk_ms);
            let chunk_end = i + entries[i..]
                .iter()
                .take_while(|e| window_start(e.0, chunk_ms) == chunk)
                .count();
            let blob = encode_rollup_chunk(&entries[i..chunk_end], chunk, window);
            rollups.push((level, chunk, data.push_blob(blob.as_slice())?));
            i = chunk_end;
        }
    }
    Ok(EncodedSeries {
        points: point_count,
        min_ms,
        max_ms,
        columns: column_blobs,
        totals: totals_blob,
        rollups,
    })
}

/// `windows; per window: window index delta, entries; per entry: stack delta, labels, value`.
fn encode_rollup_chunk(entries: &[(i64, ColumnKey, i64)], chunk: i64, window: i64) -> Writer {
    let mut w = Writer::new();
    let window_count = entries.chunk_by(|a, b| a.0 == b.0).count();
    w.varint(window_count as u64);
    let mut previous_window = chunk;
    for group in entries.chunk_by(|a, b| a.0 == b.0) {
        let start = group[0].0;
        w.varint(((start - previous_window) / window) as u64);
        previous_window = start;
        w.varint(group.len() as u64);
        let mut previous_stack = 0i64;
        for &(_, (stack, labels), value) in group {
            w.signed(i64::from(stack) - previous_stack);
            previous_stack = i64::from(stack);
            w.varint(u64::from(labels));
            w.signed(value);
        }
    }
    w
}
