//! The in-memory, mutable head: what ingest writes into and what gets cut
//! into a block. Plain vectors, no locks (the caller owns synchronisation).

mod ingest;

use hashbrown::HashMap;

use crate::index::LabelIndex;
use crate::model::{LabelSet, ProfileType};
use crate::symbols::SymbolTable;

pub use ingest::{IngestLimits, IngestStats};

/// The in-memory head.
#[derive(Debug, Default)]
pub struct Head {
    pub(crate) symbols: SymbolTable,
    pub(crate) index: LabelIndex,
    pub(crate) series: Vec<HeadSeries>,
    series_lookup: HashMap<LabelSet, u32>,
    series_per_name: HashMap<String, usize>,
    profiles: u64,
    points: u64,
    bounds: Option<(i64, i64)>,
    /// Compaction level a block encoded from this head gets (0 for ingest heads).
    pub(crate) level: u32,
    /// Source block ids a block encoded from this head records.
    pub(crate) sources: Vec<String>,
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

    /// Approximate heap bytes held, for cutting by size and for metrics.
    pub fn approx_bytes(&self) -> usize {
        let series: usize = self
            .series
            .iter()
            .map(|s| {
                s.points.capacity() * size_of::<HeadPoint>()
                    + s.runs.capacity() * size_of::<Run>()
                    + s.labels
                        .iter()
                        .map(|l| 2 * (l.name.len() + l.value.len()) + 96)
                        .sum::<usize>()
                    + 256
            })
            .sum();
        self.symbols.approx_bytes() + series
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
        *self
            .series_per_name
            .entry(profile_type.name.clone())
            .or_default() += 1;
        id
    }

    /// Appends one run of already-interned points (used by ingest and compaction).
    pub(crate) fn push_run(
        &mut self,
        series: u32,
        time_ms: i64,
        count: u32,
        points: impl IntoIterator<Item = HeadPoint>,
    ) {
        let Some(target) = self.series.get_mut(series as usize) else {
            return;
        };
        let start = target.points.len();
        let mut total = 0i64;
        for point in points {
            total = total.wrapping_add(point.value);
            target.points.push(point);
        }
        let added = target.points.len() - start;
        if added == 0 {
            return;
        }
        target.runs.push(Run {
            time_ms,
            start: u32::try_from(start).expect("a series holds fewer than 2^32 points"),
            total,
            count,
        });
        self.points += added as u64;
        self.note_time(time_ms);
    }

    /// Counts profiles merged in from elsewhere (compaction).
    pub(crate) fn add_profiles(&mut self, profiles: u64) {
        self.profiles += profiles;
    }

    pub(crate) fn existing_series(&self, labels: &LabelSet) -> Option<u32> {
        self.series_lookup.get(labels).copied()
    }

    pub(crate) fn series_for_name(&self, name: &str) -> usize {
        self.series_per_name.get(name).copied().unwrap_or(0)
    }
}
