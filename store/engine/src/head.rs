//! The in-memory, mutable head: what ingest writes into and what gets cut
//! into a block. Plain vectors, no locks (the caller owns synchronisation).

mod ingest;

use hashbrown::HashMap;

use crate::index::LabelIndex;
use crate::model::{LabelSet, NAMESPACE_LABEL, ProfileType};
use crate::symbols::SymbolTable;

pub use ingest::{CheckedIngest, IngestLimits, IngestStats};

/// The in-memory head.
#[derive(Debug, Default)]
pub struct Head {
    pub(crate) symbols: SymbolTable,
    pub(crate) index: LabelIndex,
    pub(crate) series: Vec<HeadSeries>,
    series_lookup: HashMap<LabelSet, u32>,
    series_per_name: HashMap<String, usize>,
    /// Series per `namespace` label value (`""` for none).
    series_per_namespace: HashMap<String, usize>,
    profiles: u64,
    points: u64,
    bounds: Option<(i64, i64)>,
    /// Compaction level a block encoded from this head gets (0 for ingest heads).
    pub(crate) level: u32,
    /// Source block ids a block encoded from this head records.
    pub(crate) sources: Vec<String>,
    /// Sum of [`HeadSeries::heap_bytes`] over all series, kept as series
    /// grow so [`Head::approx_bytes`] does no work per series: ingest asks
    /// for it on every profile (it was 8 % of a loaded store's CPU as an
    /// O(series) sum; issue 13).
    series_bytes: usize,
}

/// One series: a profile type plus a label set, and its points.
#[derive(Debug, Clone)]
pub(crate) struct HeadSeries {
    pub(crate) labels: LabelSet,
    pub(crate) profile_type: ProfileType,
    /// One run per ingested profile: its time and where its points start.
    pub(crate) runs: Vec<Run>,
    pub(crate) points: Vec<HeadPoint>,
}

/// The points one profile contributed to one series.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) time_ms: i64,
    pub(crate) start: u32,
    pub(crate) total: i64,
    /// Profiles merged into this run (1 from ingest; more after compaction).
    pub(crate) count: u32,
}

/// One value of one stack key at a run's time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadPoint {
    pub(crate) stack: u32,
    pub(crate) labels: u32,
    pub(crate) value: i64,
}

impl HeadSeries {
    /// Approximate heap bytes of this series: point and run buffers by
    /// capacity, labels held twice (the series and the lookup key).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.points.capacity() * size_of::<HeadPoint>()
            + self.runs.capacity() * size_of::<Run>()
            + self
                .labels
                .iter()
                .map(|l| 2 * (l.name.len() + l.value.len()) + 96)
                .sum::<usize>()
            + 256
    }

    /// Iterates runs with their point slices.
    pub(crate) fn runs_with_points(&self) -> impl Iterator<Item = (&Run, &[HeadPoint])> {
        self.runs.iter().enumerate().map(|(i, run)| {
            let end = self
                .runs
                .get(i + 1)
                .map_or(self.points.len(), |next| next.start as usize);
            let points = self.points.get(run.start as usize..end).unwrap_or(&[]);
            (run, points)
        })
    }
}

impl Head {
    /// An empty head.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when nothing has been ingested that stored a value.
    pub fn is_empty(&self) -> bool {
        self.points == 0
    }

    /// Earliest and latest sample time in ms, if any.
    pub fn time_bounds(&self) -> Option<(i64, i64)> {
        self.bounds
    }

    /// Profiles ingested.
    pub fn profiles(&self) -> u64 {
        self.profiles
    }

    /// Stored (series, stack key, time) values.
    pub fn samples(&self) -> u64 {
        self.points
    }

    /// Number of series.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// The labels and profile name of each series from the `first`th on,
    /// in the order they were created: given [`Head::series_count`] before
    /// an ingest, the series that ingest created.
    pub fn series_from(&self, first: usize) -> impl Iterator<Item = (&LabelSet, &str)> {
        self.series
            .get(first..)
            .unwrap_or(&[])
            .iter()
            .map(|s| (&s.labels, s.profile_type.name.as_str()))
    }

    /// Approximate heap bytes held, for cutting by size and for metrics.
    /// O(1): every part is kept up to date as the head grows.
    pub fn approx_bytes(&self) -> usize {
        self.symbols.approx_bytes() + self.series_bytes
    }

    /// Re-counts one series after it changed; `before` is its
    /// [`HeadSeries::heap_bytes`] from before the change (0 if new).
    pub(crate) fn recount_series(&mut self, series: u32, before: usize) {
        if let Some(s) = self.series.get(series as usize) {
            self.series_bytes = (self.series_bytes + s.heap_bytes()).saturating_sub(before);
        }
    }

    /// The current [`HeadSeries::heap_bytes`] of `series` (0 if unknown).
    pub(crate) fn series_heap_bytes(&self, series: u32) -> usize {
        self.series
            .get(series as usize)
            .map_or(0, HeadSeries::heap_bytes)
    }

    /// The head's symbol table.
    pub fn symbols(&self) -> &SymbolTable {
        &self.symbols
    }

    fn note_time(&mut self, time_ms: i64) {
        self.bounds = Some(match self.bounds {
            None => (time_ms, time_ms),
            Some((min, max)) => (min.min(time_ms), max.max(time_ms)),
        });
    }

    /// Finds or creates a series; the caller has checked limits.
    pub(crate) fn series_id(&mut self, labels: &LabelSet, profile_type: &ProfileType) -> u32 {
        if let Some(&id) = self.series_lookup.get(labels) {
            return id;
        }
        let id = u32::try_from(self.series.len())
            .expect("series count stays below 2^32: limits cap series per name");
        self.series.push(HeadSeries {
            labels: labels.clone(),
            profile_type: profile_type.clone(),
            runs: Vec::new(),
            points: Vec::new(),
        });
        self.index.add(id, labels);
        self.series_lookup.insert(labels.clone(), id);
        self.recount_series(id, 0);
        *self
            .series_per_name
            .entry(profile_type.name.clone())
            .or_default() += 1;
        *self
            .series_per_namespace
            .entry(labels.get(NAMESPACE_LABEL).unwrap_or("").to_owned())
            .or_default() += 1;
        id
    }
}

/// What ingest's series limits read of a head: whether it holds a series,
/// and how many series it holds in all, per profile name and per
/// namespace. A [`Head`] is one; [`ShardCensus`] is the sum of several.
pub trait SeriesCensus {
    /// True when the series with exactly these labels exists.
    fn holds_series(&self, labels: &LabelSet) -> bool;
    /// Series held.
    fn series_total(&self) -> usize;
    /// Series held of profile name `name`.
    fn series_for_name(&self, name: &str) -> usize;
    /// Series held whose `namespace` label is `namespace` (`""`: none).
    fn series_for_namespace(&self, namespace: &str) -> usize;
}

impl SeriesCensus for Head {
    fn holds_series(&self, labels: &LabelSet) -> bool {
        self.series_lookup.contains_key(labels)
    }

    fn series_total(&self) -> usize {
        self.series.len()
    }

    fn series_for_name(&self, name: &str) -> usize {
        self.series_per_name.get(name).copied().unwrap_or(0)
    }

    fn series_for_namespace(&self, namespace: &str) -> usize {
        self.series_per_namespace
            .get(namespace)
            .copied()
            .unwrap_or(0)
    }
}

/// The heads of a sharded head counted as one: counts add up, and a series
/// is held when any shard holds it. A series written through two shards
/// (two request label sets that promote to the same labels) counts twice,
/// which errs on the side of the limits.
#[derive(Debug, Clone, Copy)]
pub struct ShardCensus<'a, H>(pub &'a [H]);

impl<H: std::ops::Deref<Target = Head>> SeriesCensus for ShardCensus<'_, H> {
    fn holds_series(&self, labels: &LabelSet) -> bool {
        self.0.iter().any(|h| h.holds_series(labels))
    }

    fn series_total(&self) -> usize {
        self.0.iter().map(|h| h.series_total()).sum()
    }

    fn series_for_name(&self, name: &str) -> usize {
        self.0.iter().map(|h| h.series_for_name(name)).sum()
    }

    fn series_for_namespace(&self, namespace: &str) -> usize {
        self.0
            .iter()
            .map(|h| h.series_for_namespace(namespace))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IngestLimits;
    use crate::model::Label;
    use kiln_pprof::ProfileBuilder;

    fn profile(stacks: usize, seed: usize) -> kiln_pprof::Profile {
        let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
        for i in 0..stacks {
            let f = b.function(&kiln_pprof::FunctionSpec {
                name: format!("function_{}", i + seed),
                system_name: String::new(),
                filename: "main.go".into(),
                start_line: 1,
            });
            let loc = b.location(0, 0x1000 + i as u64, &[(f, 10)]);
            b.sample(&[loc], &[1, 10], &[]);
        }
        kiln_pprof::decode(
            &kiln_pprof::encode_gzip(&b.finish()),
            &kiln_pprof::DecodeLimits::default(),
        )
        .expect("built profile decodes")
    }

    /// The O(series) sum the kept count replaces.
    fn recounted(head: &Head) -> usize {
        head.symbols.approx_bytes()
            + head
                .series
                .iter()
                .map(HeadSeries::heap_bytes)
                .sum::<usize>()
    }

    #[test]
    fn kept_byte_count_equals_a_full_recount_after_every_ingest() {
        let mut head = Head::new();
        for i in 0..300 {
            let labels = LabelSet::new(vec![
                Label::new("__name__", "process_cpu"),
                Label::new("pod", format!("pod-{}", i % 37)),
            ]);
            head.ingest(
                &profile(1 + i % 9, i % 5),
                &labels,
                1_000 + i as i64,
                10,
                &IngestLimits::default(),
            )
            .expect("ingest");
            assert_eq!(head.approx_bytes(), recounted(&head), "after profile {i}");
        }
    }
}
