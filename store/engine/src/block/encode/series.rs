//! Encoding one series an hour chunk at a time.
//!
//! A series' raw points are stored in hour chunks ([`COLUMN_CHUNK_MS`]) and
//! its rollups in chunks of the next level's window, so a writer that is
//! given the points chunk by chunk, in time order, needs to hold only one
//! hour of points. Rollup windows no longer than an hour are complete when
//! their hour is, and are encoded into their rollup chunk then; a day
//! window sums the stacks of its hours (distinct stacks, not points) until
//! it ends. A merge of day or week blocks so holds one hour of its largest
//! series, not the whole series over the merged span.

use std::collections::BTreeMap;

use hashbrown::HashMap;

use super::{ColumnKey, DataWriter, EncodedSeries, SeriesValues, rollup_chunk_ms};
use crate::block::rollup::{ROLLUP_WINDOWS_MS, window_start};
use crate::block::{BlobRef, COLUMN_CHUNK_MS};
use crate::columns::encode_points;
use crate::error::BlockError;
use crate::wire::Writer;

/// One rollup chunk being written: its finished windows, encoded, and the
/// sums of the window still open when windows span several column chunks.
struct OpenRollup {
    level: u8,
    chunk: i64,
    /// Finished windows in `encode_rollup_chunk`'s layout, without the
    /// leading window count.
    body: Writer,
    windows: u64,
    previous_window: i64,
    /// The window whose sums are in `sums`, for windows longer than a
    /// column chunk.
    summing: Option<i64>,
    sums: HashMap<ColumnKey, i64>,
}

impl OpenRollup {
    fn new(level: u8, chunk: i64) -> Self {
        Self {
            level,
            chunk,
            body: Writer::new(),
            windows: 0,
            previous_window: chunk,
            summing: None,
            sums: HashMap::new(),
        }
    }

    /// Appends one finished window; `entries` sorted by key, one per key.
    fn push_window(&mut self, start: i64, entries: &[(ColumnKey, i64)]) {
        if entries.is_empty() {
            return;
        }
        let window = ROLLUP_WINDOWS_MS[self.level as usize];
        self.body
            .varint(((start - self.previous_window) / window) as u64);
        self.previous_window = start;
        self.body.varint(entries.len() as u64);
        let mut previous_stack = 0i64;
        for &((stack, labels), value) in entries {
            self.body.signed(i64::from(stack) - previous_stack);
            previous_stack = i64::from(stack);
            self.body.varint(u64::from(labels));
            self.body.signed(value);
        }
        self.windows += 1;
    }

    /// Appends the window being summed, if any.
    fn close_summing(&mut self) {
        let Some(start) = self.summing.take() else {
            return;
        };
        let mut entries: Vec<(ColumnKey, i64)> = self.sums.drain().collect();
        entries.sort_unstable_by_key(|&(key, _)| key);
        self.push_window(start, &entries);
    }
}

/// One series being encoded: points arrive chunk by chunk in ascending
/// chunk order ([`SeriesEncoder::begin_chunk`]), totals in any order.
pub(crate) struct SeriesEncoder {
    levels: Vec<u8>,
    block_min_ms: i64,
    chunk: Option<i64>,
    /// The current chunk's points by column, in arrival order.
    points: HashMap<ColumnKey, Vec<(i64, i64)>>,
    totals: BTreeMap<i64, (i64, u64)>,
    point_count: u64,
    columns: Vec<(i64, BlobRef)>,
    rollups: Vec<(u8, i64, BlobRef)>,
    open: Vec<OpenRollup>,
}

impl SeriesEncoder {
    /// An encoder for a series of a block starting at `block_min_ms` that
    /// stores rollups at `levels`.
    pub(super) fn new(levels: &[u8], block_min_ms: i64) -> Self {
        Self {
            levels: levels.to_vec(),
            block_min_ms,
            chunk: None,
            points: HashMap::new(),
            totals: BTreeMap::new(),
            point_count: 0,
            columns: Vec::new(),
            rollups: Vec::new(),
            open: Vec::new(),
        }
    }

    /// Adds one totals row (one run, or one row of a source block).
    pub(crate) fn add_total(&mut self, time_ms: i64, total: i64, profiles: u64) {
        let row = self.totals.entry(time_ms).or_insert((0, 0));
        row.0 = row.0.wrapping_add(total);
        row.1 += profiles;
    }

    /// Starts the column chunk at `chunk` (a multiple of [`COLUMN_CHUNK_MS`]),
    /// writing the one before: chunks must come in ascending order.
    pub(super) fn begin_chunk(
        &mut self,
        chunk: i64,
        data: &mut DataWriter,
    ) -> Result<(), BlockError> {
        if chunk.rem_euclid(COLUMN_CHUNK_MS) != 0 || self.chunk.is_some_and(|c| chunk <= c) {
            return Err(BlockError::Corrupt {
                what: "column chunks out of order",
            });
        }
        self.end_chunk(data)?;
        self.chunk = Some(chunk);
        Ok(())
    }

    /// Adds one value of column `key` at `time_ms`, which must lie in the
    /// current chunk.
    pub(crate) fn add_point(
        &mut self,
        key: ColumnKey,
        time_ms: i64,
        value: i64,
    ) -> Result<(), BlockError> {
        if self.chunk != Some(window_start(time_ms, COLUMN_CHUNK_MS)) {
            return Err(BlockError::Corrupt {
                what: "column point outside its chunk",
            });
        }
        self.points.entry(key).or_default().push((time_ms, value));
        Ok(())
    }

    /// Writes the current chunk's columns and adds its points to the open
    /// rollup chunks, writing those it has moved past.
    fn end_chunk(&mut self, data: &mut DataWriter) -> Result<(), BlockError> {
        let Some(chunk) = self.chunk.take() else {
            return Ok(());
        };
        let mut columns: Vec<(ColumnKey, Vec<(i64, i64)>)> = self.points.drain().collect();
        if columns.is_empty() {
            return Ok(());
        }
        columns.sort_unstable_by_key(|(key, _)| *key);
        let mut w = Writer::new();
        w.varint(columns.len() as u64);
        for ((stack, labels), points) in &mut columns {
            points.sort_unstable_by_key(|&(ts, _)| ts);
            points.dedup_by(|later, earlier| {
                if later.0 == earlier.0 {
                    earlier.1 = earlier.1.wrapping_add(later.1);
                    true
                } else {
                    false
                }
            });
            self.point_count += points.len() as u64;
            w.varint(u64::from(*stack));
            w.varint(u64::from(*labels));
            encode_points(points, chunk, &mut w);
        }
        self.columns.push((chunk, data.push_blob(w.as_slice())?));
        for index in 0..self.levels.len() {
            let level = self.levels[index];
            let window = ROLLUP_WINDOWS_MS[level as usize];
            let rollup_chunk = window_start(chunk, rollup_chunk_ms(level));
            let position = match self.open.iter().position(|o| o.level == level) {
                Some(position) if self.open[position].chunk == rollup_chunk => position,
                Some(position) => {
                    let done = std::mem::replace(
                        &mut self.open[position],
                        OpenRollup::new(level, rollup_chunk),
                    );
                    self.write_rollup(done, data)?;
                    position
                }
                None => {
                    self.open.push(OpenRollup::new(level, rollup_chunk));
                    self.open.len() - 1
                }
            };
            let open = &mut self.open[position];
            if window <= COLUMN_CHUNK_MS {
                // Every window of this level inside the chunk ends with it.
                let points_in_chunk = columns.iter().map(|(_, p)| p.len()).sum();
                let mut entries: Vec<(i64, ColumnKey, i64)> = Vec::with_capacity(points_in_chunk);
                for (key, points) in &columns {
                    for &(ts, value) in points {
                        let start = window_start(ts, window);
                        match entries.last_mut() {
                            Some(last) if last.0 == start && last.1 == *key => {
                                last.2 = last.2.wrapping_add(value);
                            }
                            _ => entries.push((start, *key, value)),
                        }
                    }
                }
                entries.sort_unstable_by_key(|&(start, key, _)| (start, key));
                for group in entries.chunk_by(|a, b| a.0 == b.0) {
                    let mut summed: Vec<(ColumnKey, i64)> = Vec::with_capacity(group.len());
                    for &(_, key, value) in group {
                        match summed.last_mut() {
                            Some(last) if last.0 == key => last.1 = last.1.wrapping_add(value),
                            _ => summed.push((key, value)),
                        }
                    }
                    open.push_window(group[0].0, &summed);
                }
            } else {
                // A window spanning several chunks: sum its stacks until a
                // chunk of the next window starts.
                let start = window_start(chunk, window);
                if open.summing != Some(start) {
                    open.close_summing();
                    open.summing = Some(start);
                }
                for (key, points) in &columns {
                    for &(_, value) in points {
                        let sum = open.sums.entry(*key).or_insert(0);
                        *sum = sum.wrapping_add(value);
                    }
                }
            }
        }
        Ok(())
    }

    fn write_rollup(
        &mut self,
        mut open: OpenRollup,
        data: &mut DataWriter,
    ) -> Result<(), BlockError> {
        open.close_summing();
        if open.windows == 0 {
            return Ok(());
        }
        let mut blob = Writer::new();
        blob.varint(open.windows);
        blob.raw(open.body.as_slice());
        self.rollups
            .push((open.level, open.chunk, data.push_blob(blob.as_slice())?));
        Ok(())
    }

    /// Writes what is left (the last chunk, the open rollups, the totals);
    /// `None` for a series without totals, which is not stored.
    pub(super) fn finish(
        mut self,
        data: &mut DataWriter,
    ) -> Result<Option<EncodedSeries>, BlockError> {
        self.end_chunk(data)?;
        for open in std::mem::take(&mut self.open) {
            self.write_rollup(open, data)?;
        }
        if self.totals.is_empty() {
            return Ok(None);
        }
        // Readers look rollups up by level, then chunk.
        self.rollups
            .sort_unstable_by_key(|&(level, chunk, _)| (level, chunk));
        let mut w = Writer::new();
        w.varint(self.totals.len() as u64);
        let mut previous = self.block_min_ms;
        for (&ts, &(total, count)) in &self.totals {
            w.signed(ts.wrapping_sub(previous));
            w.signed(total);
            w.varint(count);
            previous = ts;
        }
        let totals = data.push_blob(w.as_slice())?;
        let min_ms = self
            .totals
            .keys()
            .next()
            .copied()
            .unwrap_or(self.block_min_ms);
        let max_ms = self
            .totals
            .keys()
            .next_back()
            .copied()
            .unwrap_or(self.block_min_ms);
        Ok(Some(EncodedSeries {
            points: self.point_count,
            min_ms,
            max_ms,
            columns: self.columns,
            totals,
            rollups: self.rollups,
        }))
    }
}

/// Encodes a series held whole (a head's, or an in-memory merge's): its
/// points go through a [`SeriesEncoder`] chunk by chunk.
pub(super) fn encode_series(
    values: SeriesValues,
    levels: &[u8],
    block_min_ms: i64,
    data: &mut DataWriter,
) -> Result<Option<EncodedSeries>, BlockError> {
    let SeriesValues { columns, totals } = values;
    let mut encoder = SeriesEncoder::new(levels, block_min_ms);
    encoder.totals = totals;
    let mut by_chunk: BTreeMap<i64, Vec<(ColumnKey, i64, i64)>> = BTreeMap::new();
    for (key, points) in columns {
        for (ts, value) in points {
            by_chunk
                .entry(window_start(ts, COLUMN_CHUNK_MS))
                .or_default()
                .push((key, ts, value));
        }
    }
    for (chunk, points) in by_chunk {
        encoder.begin_chunk(chunk, data)?;
        for (key, ts, value) in points {
            encoder.add_point(key, ts, value)?;
        }
    }
    encoder.finish(data)
}
