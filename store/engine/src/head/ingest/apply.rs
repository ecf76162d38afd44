//! Phase 4 of ingest: a checked plan applied to the head. Symbols are
//! interned once per profile (`interner`), points appended to each series
//! with one run per series, and the head's byte count kept by delta.

use hashbrown::HashMap;
use kiln_pprof::ProfileView;

use super::interner::ProfileInterner;
use super::{IngestStats, Plan, UNSEEN};
use crate::head::{Head, HeadPoint, Run};

impl Head {
    /// Pass 2: applies a checked plan. Nothing here can fail.
    pub(super) fn apply(
        &mut self,
        profile: &impl ProfileView,
        plan: Plan,
        time_ms: i64,
    ) -> IngestStats {
        let type_count = plan.types.len();
        let series_before = self.series.len();
        let mut slot_series: Vec<u32> = vec![UNSEEN; plan.slot_labels.len()];
        for (slot, labels) in plan.slot_labels.iter().enumerate() {
            if let Some(labels) = labels {
                slot_series[slot] = self.series_id(labels, &plan.types[slot % type_count]);
            }
        }
        let slot_start: Vec<usize> = slot_series
            .iter()
            .map(|&s| self.series.get(s as usize).map_or(0, |s| s.points.len()))
            .collect();
        // Sizes before this profile, to keep the head's byte count by delta.
        let mut touched: Vec<(u32, usize)> = slot_series
            .iter()
            .filter(|&&s| s != UNSEEN)
            .map(|&s| (s, 0))
            .collect();
        touched.sort_unstable();
        touched.dedup();
        for (series, before) in &mut touched {
            *before = self.series_heap_bytes(*series);
        }
        let mut interner = ProfileInterner::new(profile);
        interner.find_known_locations(self);
        let mut stats = IngestStats {
            profile_types: type_count as u64,
            ..IngestStats::default()
        };
        let mut totals: Vec<i64> = vec![0; slot_series.len()];
        let promoted = |key: i64, str_index: i64| plan.is_promoted(key, str_index);
        for (index, &signature) in plan.sample_signature.iter().enumerate() {
            let sample = profile.sample(index);
            if sample.values.iter().all(|&v| v == 0) {
                stats.zero_values_dropped += sample.values.len() as u64;
                continue;
            }
            let stack = interner.stack(self, sample.location_ids);
            let sample_labels = interner.sample_labels(self, sample.labels, &promoted);
            let base = signature as usize * type_count;
            for (t, &value) in sample.values.iter().enumerate() {
                if value == 0 {
                    stats.zero_values_dropped += 1;
                    continue;
                }
                let Some(series) = self.series.get_mut(slot_series[base + t] as usize) else {
                    continue;
                };
                series.points.push(HeadPoint {
                    stack,
                    labels: sample_labels,
                    value,
                });
                totals[base + t] = totals[base + t].wrapping_add(value);
                stats.samples += 1;
            }
        }
        // NB: two slots can resolve to the same series (a string table may hold
        // the same label value twice), so runs are made per series, not per slot.
        let mut runs: HashMap<u32, (usize, i64)> = HashMap::new();
        for (slot, &series_id) in slot_series.iter().enumerate() {
            if series_id == UNSEEN {
                continue;
            }
            let run = runs.entry(series_id).or_insert((slot_start[slot], 0));
            run.0 = run.0.min(slot_start[slot]);
            run.1 = run.1.wrapping_add(totals[slot]);
        }
        for (series_id, (start, total)) in runs {
            let Some(series) = self.series.get_mut(series_id as usize) else {
                continue;
            };
            if series.points.len() > start {
                series.runs.push(Run {
                    time_ms,
                    start: u32::try_from(start).expect("a series holds fewer than 2^32 points"),
                    total,
                    count: 1,
                });
            }
        }
        for (series, before) in touched {
            self.recount_series(series, before);
        }
        stats.series_created = (self.series.len() - series_before) as u64;
        self.points += stats.samples;
        self.profiles += 1;
        if stats.samples > 0 {
            self.note_time(time_ms);
        }
        stats
    }
}
