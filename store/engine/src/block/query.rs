//! Answering queries from a block: rollup pieces where the range fully
//! covers aligned windows, raw column chunks for the rest.

use hashbrown::HashMap;
use roaring::RoaringBitmap;

use super::encode::rollup_chunk_ms;
use super::rollup::{ROLLUP_WINDOWS_MS, plan};
use super::{Block, BlockSeries, COLUMN_CHUNK_MS};
use crate::columns::decode_points;
use crate::error::{BlockError, QueryError};
use crate::index::CompiledMatcher;
use crate::model::{LabelSet, ProfileType, TimeRange};
use crate::query::{
    CompiledSelector, MergedProfile, Queryable, StepExemplars, Timeline, check_range, interrupt,
    offer_series, sorted_label_sets,
};
use crate::wire::Reader;

type Sums = HashMap<(u32, u32), i64>;

fn corrupt(what: &'static str) -> BlockError {
    BlockError::Corrupt { what }
}

fn overlaps(start: i64, len: i64, range: &TimeRange) -> bool {
    range.overlaps(&TimeRange {
        start_ms: start,
        end_ms: start.saturating_add(len),
    })
}

impl Block {
    pub(super) fn corrupt_block(&self, source: BlockError) -> QueryError {
        QueryError::CorruptBlock {
            block_id: self.meta().id.clone(),
            source,
        }
    }

    /// Every totals row `(time, total, profiles)` of a series.
    pub(crate) fn totals(&self, series: &BlockSeries) -> Result<Vec<(i64, i64, u64)>, BlockError> {
        let raw = self.blob(series.totals)?;
        let mut r = Reader::new(&raw);
        let count = r.count(3).map_err(|_| corrupt("totals"))?;
        let mut out = Vec::with_capacity(count);
        let mut previous = self.meta().min_time_ms;
        for _ in 0..count {
            let ts = previous.wrapping_add(r.signed().map_err(|_| corrupt("totals"))?);
            let total = r.signed().map_err(|_| corrupt("totals"))?;
            let profiles = r.varint().map_err(|_| corrupt("totals"))?;
            out.push((ts, total, profiles));
            previous = ts;
        }
        Ok(out)
    }

    /// Calls `each` with every selected series whose span meets `range`,
    /// and its rows `(time, total)` within the range.
    fn each_series_totals(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        mut each: impl FnMut(&LabelSet, &mut dyn Iterator<Item = (i64, i64, u64)>),
    ) -> Result<(), QueryError> {
        check_range(range)?;
        for id in self.index.select(selector.matchers()) {
            interrupt::check()?;
            let Some(series) = self.series.get(id as usize) else {
                continue;
            };
            if !range.overlaps(&TimeRange {
                start_ms: series.min_ms,
                end_ms: series.max_ms.saturating_add(1),
            }) {
                continue;
            }
            let totals = self.totals(series).map_err(|e| self.corrupt_block(e))?;
            each(
                &series.labels,
                &mut totals.into_iter().filter(|&(ts, ..)| range.contains(ts)),
            );
        }
        Ok(())
    }

    fn has_data_in(&self, series: &BlockSeries, range: TimeRange) -> Result<bool, BlockError> {
        if range.contains(series.min_ms) || range.contains(series.max_ms) {
            return Ok(true);
        }
        if !range.overlaps(&TimeRange {
            start_ms: series.min_ms,
            end_ms: series.max_ms.saturating_add(1),
        }) {
            return Ok(false);
        }
        Ok(self
            .totals(series)?
            .iter()
            .any(|&(ts, ..)| range.contains(ts)))
    }

    fn select(
        &self,
        matchers: &[CompiledMatcher],
        range: TimeRange,
    ) -> Result<RoaringBitmap, QueryError> {
        let mut out = RoaringBitmap::new();
        for id in self.index.select(matchers) {
            let Some(series) = self.series.get(id as usize) else {
                continue;
            };
            if self
                .has_data_in(series, range)
                .map_err(|e| self.corrupt_block(e))?
            {
                out.insert(id);
            }
        }
        Ok(out)
    }

    fn sum_raw(
        &self,
        series: &BlockSeries,
        raw: &[TimeRange],
        sums: &mut Sums,
    ) -> Result<(), BlockError> {
        for &(chunk, blob) in &series.columns {
            if !raw.iter().any(|r| overlaps(chunk, COLUMN_CHUNK_MS, r)) {
                continue;
            }
            let bytes = self.blob(blob)?;
            let mut r = Reader::new(&bytes);
            let columns = r.count(3).map_err(|_| corrupt("columns"))?;
            for _ in 0..columns {
                let stack = r.u32().map_err(|_| corrupt("columns"))?;
                let labels = r.u32().map_err(|_| corrupt("columns"))?;
                self.check_key(stack, labels)?;
                let mut sum = 0i64;
                let mut any = false;
                decode_points(&mut r, chunk, |ts, value| {
                    if raw.iter().any(|range| range.contains(ts)) {
                        sum = sum.wrapping_add(value);
                        any = true;
                    }
                })
                .map_err(|_| corrupt("column points"))?;
                if any {
                    let entry = sums.entry((stack, labels)).or_insert(0);
                    *entry = entry.wrapping_add(sum);
                }
            }
        }
        Ok(())
    }

    fn check_key(&self, stack: u32, labels: u32) -> Result<(), BlockError> {
        if stack as usize >= self.symbols.node_count()
            || labels as usize >= self.symbols.label_sets.len()
        {
            return Err(corrupt("stack key out of range"));
        }
        Ok(())
    }

    fn sum_rollups(
        &self,
        series: &BlockSeries,
        level: u8,
        piece: TimeRange,
        sums: &mut Sums,
    ) -> Result<(), BlockError> {
        let window = ROLLUP_WINDOWS_MS[level as usize];
        let chunk_ms = rollup_chunk_ms(level);
        for &(blob_level, chunk, blob) in &series.rollups {
            if blob_level != level || !overlaps(chunk, chunk_ms, &piece) {
                continue;
            }
            let bytes = self.blob(blob)?;
            let mut r = Reader::new(&bytes);
            let windows = r.count(2).map_err(|_| corrupt("rollup"))?;
            let mut window_start = chunk;
            for _ in 0..windows {
                let delta = r.varint().map_err(|_| corrupt("rollup"))?;
                let delta = i64::try_from(delta).map_err(|_| corrupt("rollup"))?;
                window_start = window_start
                    .checked_add(delta.checked_mul(window).ok_or(corrupt("rollup"))?)
                    .ok_or(corrupt("rollup"))?;
                let take = piece.contains(window_start);
                let entries = r.count(3).map_err(|_| corrupt("rollup"))?;
                let mut stack = 0i64;
                for _ in 0..entries {
                    stack = stack.wrapping_add(r.signed().map_err(|_| corrupt("rollup"))?);
                    let labels = r.u32().map_err(|_| corrupt("rollup"))?;
                    let value = r.signed().map_err(|_| corrupt("rollup"))?;
                    let stack = u32::try_from(stack).map_err(|_| corrupt("rollup"))?;
                    self.check_key(stack, labels)?;
                    if take {
                        let entry = sums.entry((stack, labels)).or_insert(0);
                        *entry = entry.wrapping_add(value);
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn merge_series(
        &self,
        series: &BlockSeries,
        range: TimeRange,
        sums: &mut Sums,
    ) -> Result<(), BlockError> {
        let mut levels: Vec<u8> = series.rollups.iter().map(|&(level, ..)| level).collect();
        levels.sort_unstable();
        levels.dedup();
        let plan = plan(range, &levels);
        let data_range = TimeRange {
            start_ms: series.min_ms,
            end_ms: series.max_ms.saturating_add(1),
        };
        let raw: Vec<TimeRange> = plan
            .raw
            .into_iter()
            .filter(|r| r.overlaps(&data_range))
            .collect();
        if !raw.is_empty() {
            self.sum_raw(series, &raw, sums)?;
        }
        for (level, piece) in plan.pieces {
            if piece.overlaps(&data_range) {
                self.sum_rollups(series, level, piece, sums)?;
            }
        }
        Ok(())
    }

    /// Merges like [`Queryable::merge_into`] but from raw columns only,
    /// ignoring rollups (used to check that rollups change nothing).
    pub fn merge_into_without_rollups(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut MergedProfile,
    ) -> Result<(), QueryError> {
        self.merge_selected(selector, range, into, |series, sums| {
            self.sum_raw(series, &[range], sums)
        })
    }

    /// Adds the stacks of every selected series in `range`, summed by
    /// `sum_series` (from rollups where they cover or from raw columns
    /// only), into `into`.
    fn merge_selected(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut MergedProfile,
        sum_series: impl Fn(&BlockSeries, &mut Sums) -> Result<(), BlockError>,
    ) -> Result<(), QueryError> {
        check_range(range)?;
        let mut sums = Sums::new();
        let held = into.approx_bytes();
        for id in self.index.select(selector.matchers()) {
            interrupt::check()?;
            interrupt::check_held(held + interrupt::sums_bytes(sums.capacity()))?;
            if let Some(series) = self.series.get(id as usize) {
                sum_series(series, &mut sums).map_err(|e| self.corrupt_block(e))?;
            }
        }
        into.add_from(&self.symbols, sums);
        interrupt::check_held(into.approx_bytes())?;
        Ok(())
    }
}

impl Queryable for Block {
    fn profile_types(&self, range: TimeRange) -> Vec<ProfileType> {
        let mut types: Vec<ProfileType> = self
            .series
            .iter()
            // A series whose totals cannot be read has no readable data either.
            .filter(|s| self.has_data_in(s, range).unwrap_or(false))
            .map(|s| s.profile_type.clone())
            .collect();
        types.sort();
        types.dedup();
        types
    }

    fn label_names(
        &self,
        matchers: &[CompiledMatcher],
        range: TimeRange,
    ) -> Result<Vec<String>, QueryError> {
        let selected = self.select(matchers, range)?;
        Ok(self.index.label_names(&selected))
    }

    fn label_values(
        &self,
        name: &str,
        matchers: &[CompiledMatcher],
        range: TimeRange,
    ) -> Result<Vec<String>, QueryError> {
        let selected = self.select(matchers, range)?;
        Ok(self.index.label_values(name, &selected))
    }

    fn series(
        &self,
        matchers: &[CompiledMatcher],
        range: TimeRange,
    ) -> Result<Vec<LabelSet>, QueryError> {
        let selected = self.select(matchers, range)?;
        Ok(sorted_label_sets(&selected, |id| {
            self.series.get(id).map(|s| &s.labels)
        }))
    }

    fn merge_into(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut MergedProfile,
    ) -> Result<(), QueryError> {
        self.merge_selected(selector, range, into, |series, sums| {
            self.merge_series(series, range, sums)
        })
    }

    fn as_block(&self) -> Option<&Block> {
        Some(self)
    }

    fn timeline_into(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut Timeline,
    ) -> Result<(), QueryError> {
        self.each_series_totals(selector, range, |_, rows| {
            rows.for_each(|(ts, total, profiles)| into.add(ts, total, profiles));
        })
    }

    fn exemplars_into(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut StepExemplars,
    ) -> Result<(), QueryError> {
        self.each_series_totals(selector, range, |labels, rows| {
            offer_series(into, labels, rows.map(|(t, total, _)| (t, total)).collect());
        })
    }
}
