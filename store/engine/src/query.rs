//! Queries over heads and blocks: the [`Queryable`] trait, the
//! symbol-independent [`MergedProfile`], and what it renders into
//! (flame graphs, top tables, diffs, pprof) plus [`Timeline`]s.

mod diff;
mod exemplars;
mod export;
mod flamegraph;
mod group;
pub mod interrupt;
mod merged;
mod sample_filter;
mod sources;
mod symbolize;
mod timeline;
mod top;

use hashbrown::HashMap;
use roaring::RoaringBitmap;

pub use diff::{DiffFlameGraph, DiffNode, diff};
pub(crate) use exemplars::offer_series;
pub use exemplars::{ProfileExemplar, StepExemplars};
pub use flamegraph::{
    FlameGraph, FlameNode, MAX_FRAME_TREE_NODES, MAX_UNWOUND_FRAMES, OTHER_NODE_NAME,
};
pub use merged::MergedProfile;
pub use symbolize::{SymbolizedFrame, UnsymbolizedAddress, file_offset};
pub use timeline::{MAX_TIMELINE_STEPS, Timeline};
pub use top::TopEntry;

use crate::error::QueryError;
use crate::head::Head;
use crate::index::{CompiledMatcher, compile_matchers};
use crate::model::{
    LabelSet, MatchOp, Matcher, PROFILE_TYPE_LABEL, ProfileType, Selector, TimeRange,
};

/// Anything that can answer queries: the head and decoded blocks.
///
/// Results from several queryables combine: label lists are unioned by the
/// caller, merges and timelines accumulate into the same target.
///
/// Matchers arrive compiled: a query visits the head, every head awaiting
/// upload and every block in its range, and compiling each `=~`/`!~` per
/// visit multiplied the cost of a heavy pattern by their number, which let
/// one query with a costly pattern over a long range take a core for long.
pub trait Queryable {
    /// Profile types with data in `range`, sorted.
    fn profile_types(&self, range: TimeRange) -> Vec<ProfileType>;
    /// Label names of series matching `matchers` with data in `range`, sorted.
    fn label_names(
        &self,
        matchers: &[CompiledMatcher],
        range: TimeRange,
    ) -> Result<Vec<String>, QueryError>;
    /// Values of label `name` on matching series with data in `range`, sorted.
    fn label_values(
        &self,
        name: &str,
        matchers: &[CompiledMatcher],
        range: TimeRange,
    ) -> Result<Vec<String>, QueryError>;
    /// Label sets of matching series with data in `range`, sorted.
    fn series(
        &self,
        matchers: &[CompiledMatcher],
        range: TimeRange,
    ) -> Result<Vec<LabelSet>, QueryError>;
    /// Merges the selection's stacks in `range` into `into`.
    fn merge_into(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut MergedProfile,
    ) -> Result<(), QueryError>;
    /// Adds the selection's per-profile totals in `range` into `into`'s steps.
    fn timeline_into(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut Timeline,
    ) -> Result<(), QueryError>;
    /// Offers each selected profile in `range` (a series at one
    /// millisecond) to `into`, which keeps the heaviest per step.
    fn exemplars_into(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut StepExemplars,
    ) -> Result<(), QueryError>;
    /// The immutable block this is, if it is one: a caller may then keep
    /// what it read from it ([`crate::Block::merge_partial`]) for later
    /// queries. Heads change and are not blocks.
    fn as_block(&self) -> Option<&crate::Block> {
        None
    }
}

/// A [`Selector`] ready to evaluate: its matchers compiled, plus one on
/// `__profile_type__`. Built once per query and passed to every queryable
/// the query visits.
#[derive(Debug, Clone)]
pub struct CompiledSelector {
    matchers: Vec<CompiledMatcher>,
}

impl CompiledSelector {
    /// Compiles the selector's matchers, failing on the first invalid regex.
    pub fn new(selector: &Selector) -> Result<Self, QueryError> {
        let mut matchers = compile_matchers(&selector.matchers)?;
        matchers.push(CompiledMatcher::new(&Matcher {
            name: PROFILE_TYPE_LABEL.to_owned(),
            op: MatchOp::Equal,
            value: selector.profile_type.to_string(),
        })?);
        Ok(Self { matchers })
    }

    /// Every matcher, the profile type's included.
    pub fn matchers(&self) -> &[CompiledMatcher] {
        &self.matchers
    }
}

/// The label sets of the `selected` series ids, sorted; `labels_of` reads
/// one series' labels from the queryable's own series table.
pub(crate) fn sorted_label_sets<'a>(
    selected: &RoaringBitmap,
    labels_of: impl Fn(usize) -> Option<&'a LabelSet>,
) -> Vec<LabelSet> {
    let mut out: Vec<LabelSet> = selected
        .iter()
        .filter_map(|id| labels_of(id as usize).cloned())
        .collect();
    out.sort();
    out
}

pub(crate) fn check_range(range: TimeRange) -> Result<(), QueryError> {
    if range.start_ms >= range.end_ms {
        return Err(QueryError::EmptyRange {
            start_ms: range.start_ms,
            end_ms: range.end_ms,
        });
    }
    Ok(())
}

impl Head {
    fn series_in_range(&self, selected: RoaringBitmap, range: TimeRange) -> RoaringBitmap {
        selected
            .into_iter()
            .filter(|&id| {
                self.series
                    .get(id as usize)
                    .is_some_and(|s| s.runs.iter().any(|run| range.contains(run.time_ms)))
            })
            .collect()
    }

    /// Calls `each` with every selected series and its runs `(time,
    /// total)` within `range`.
    fn each_series_runs(
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
            each(
                &series.labels,
                &mut series
                    .runs
                    .iter()
                    .filter(|run| range.contains(run.time_ms))
                    .map(|run| (run.time_ms, run.total, u64::from(run.count))),
            );
        }
        Ok(())
    }

    fn select(&self, matchers: &[CompiledMatcher], range: TimeRange) -> RoaringBitmap {
        self.series_in_range(self.index.select(matchers), range)
    }
}

impl Queryable for Head {
    fn profile_types(&self, range: TimeRange) -> Vec<ProfileType> {
        let mut types: Vec<ProfileType> = self
            .series
            .iter()
            .filter(|s| s.runs.iter().any(|run| range.contains(run.time_ms)))
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
        let selected = self.select(matchers, range);
        Ok(self.index.label_names(&selected))
    }

    fn label_values(
        &self,
        name: &str,
        matchers: &[CompiledMatcher],
        range: TimeRange,
    ) -> Result<Vec<String>, QueryError> {
        let selected = self.select(matchers, range);
        Ok(self.index.label_values(name, &selected))
    }

    fn series(
        &self,
        matchers: &[CompiledMatcher],
        range: TimeRange,
    ) -> Result<Vec<LabelSet>, QueryError> {
        let selected = self.select(matchers, range);
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
        check_range(range)?;
        let mut sums: HashMap<(u32, u32), i64> = HashMap::new();
        let held = into.approx_bytes();
        for id in self.index.select(selector.matchers()) {
            interrupt::check()?;
            interrupt::check_held(held + interrupt::sums_bytes(sums.capacity()))?;
            let Some(series) = self.series.get(id as usize) else {
                continue;
            };
            for (run, points) in series.runs_with_points() {
                if !range.contains(run.time_ms) {
                    continue;
                }
                for point in points {
                    let sum = sums.entry((point.stack, point.labels)).or_insert(0);
                    *sum = sum.wrapping_add(point.value);
                }
            }
        }
        into.add_from(&self.symbols, sums);
        interrupt::check_held(into.approx_bytes())
    }

    fn timeline_into(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut Timeline,
    ) -> Result<(), QueryError> {
        self.each_series_runs(selector, range, |_, runs| {
            runs.for_each(|(time_ms, total, profiles)| into.add(time_ms, total, profiles));
        })
    }

    fn exemplars_into(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut StepExemplars,
    ) -> Result<(), QueryError> {
        self.each_series_runs(selector, range, |labels, runs| {
            offer_series(into, labels, runs.map(|(t, total, _)| (t, total)).collect());
        })
    }
}
