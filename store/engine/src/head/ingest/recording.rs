//! The values a checked profile gives each recording rule, read from the
//! plan the checks resolved (each sample's series labels per profile
//! type). One pass over the samples serves every rule: a sample's frames
//! are matched once, as a bit per rule ([`RecordingRules`]), and values are
//! summed per (rule, slot) before any label set is touched.

use hashbrown::HashMap;
use kiln_pprof::ProfileView;

use super::CheckedIngest;
use crate::model::LabelSet;
use crate::recording::{RecordedValue, RecordingRules};

impl CheckedIngest {
    /// What this profile adds to each rule's series: per rule, per
    /// recorded label set, the sum of the values of the samples counted.
    /// A sample counts once per rule even when several frames match.
    pub fn recorded_values(&self, rules: &RecordingRules) -> Vec<RecordedValue> {
        if rules.is_empty() {
            return Vec::new();
        }
        let profile = &self.profile;
        let plan = &self.plan;
        let type_count = plan.types.len();
        let slot_count = plan.slot_labels.len();
        // Per rule, per slot (signature, profile type): whether the rule
        // reads the slot's series; `None` for a rule that reads none.
        let selected: Vec<Option<Vec<bool>>> = rules
            .rules()
            .iter()
            .map(|rule| {
                let slots: Vec<bool> = plan
                    .slot_labels
                    .iter()
                    .enumerate()
                    .map(|(slot, labels)| {
                        labels
                            .as_ref()
                            .is_some_and(|l| rule.selects(&plan.types[slot % type_count], l))
                    })
                    .collect();
                slots.iter().any(|&s| s).then_some(slots)
            })
            .collect();
        let reading: Vec<usize> = (0..selected.len())
            .filter(|&r| selected[r].is_some())
            .collect();
        if reading.is_empty() {
            return Vec::new();
        }
        let unfiltered = rules.unfiltered_bits();
        let mut frames = FrameBits::new(profile, rules);
        let mut sums = vec![0i64; rules.rules().len() * slot_count];
        for (index, &signature) in plan.sample_signature.iter().enumerate() {
            let sample = profile.sample(index);
            let bits = unfiltered | frames.sample_bits(sample.location_ids);
            if bits == 0 {
                continue;
            }
            let base = signature as usize * type_count;
            for &r in &reading {
                if bits & (1 << r) == 0 {
                    continue;
                }
                let Some(slots) = &selected[r] else { continue };
                for (t, &value) in sample.values.iter().enumerate() {
                    if value != 0 && slots.get(base + t).copied().unwrap_or(false) {
                        let sum = &mut sums[r * slot_count + base + t];
                        *sum = sum.saturating_add(value);
                    }
                }
            }
        }
        let mut recorded = Vec::new();
        for &r in &reading {
            let rule = &rules.rules()[r];
            let mut by_labels: HashMap<LabelSet, i64> = HashMap::new();
            for (slot, labels) in plan.slot_labels.iter().enumerate() {
                let sum = sums[r * slot_count + slot];
                if sum == 0 {
                    continue;
                }
                if let Some(labels) = labels {
                    let total = by_labels.entry(rule.recorded_labels(labels)).or_insert(0);
                    *total = total.saturating_add(sum);
                }
            }
            recorded.extend(
                by_labels
                    .into_iter()
                    .map(|(labels, value)| RecordedValue { labels, value }),
            );
        }
        recorded
    }
}

/// The rule bits of each location's frames, computed once per location
/// (and once per function) of the profile.
struct FrameBits<'p, P: ProfileView> {
    profile: &'p P,
    rules: &'p RecordingRules,
    /// Per location position, when known.
    locations: Vec<Option<u64>>,
    /// Per function position, when known.
    functions: Vec<Option<u64>>,
    /// No rule filters by function: nothing to match.
    idle: bool,
}

impl<'p, P: ProfileView> FrameBits<'p, P> {
    fn new(profile: &'p P, rules: &'p RecordingRules) -> Self {
        let idle = !rules.filters_functions();
        Self {
            profile,
            rules,
            locations: if idle {
                Vec::new()
            } else {
                vec![None; profile.location_count()]
            },
            functions: if idle {
                Vec::new()
            } else {
                vec![None; profile.function_count()]
            },
            idle,
        }
    }

    fn sample_bits(&mut self, location_ids: &[u64]) -> u64 {
        if self.idle {
            return 0;
        }
        location_ids
            .iter()
            .fold(0, |bits, &id| bits | self.location_bits(id))
    }

    fn location_bits(&mut self, id: u64) -> u64 {
        let Some(position) = self.profile.location_position(id) else {
            return 0;
        };
        if let Some(Some(bits)) = self.locations.get(position) {
            return *bits;
        }
        let profile = self.profile;
        let mut bits = 0;
        if let Some(location) = profile.location_at(position) {
            for line in location.lines {
                if let Some(function) = profile.function_position(line.function_id) {
                    bits |= self.function_bits(function);
                }
            }
        }
        if let Some(slot) = self.locations.get_mut(position) {
            *slot = Some(bits);
        }
        bits
    }

    fn function_bits(&mut self, position: usize) -> u64 {
        if let Some(Some(bits)) = self.functions.get(position) {
            return *bits;
        }
        let bits = self
            .profile
            .function_at(position)
            .map_or(0, |f| self.rules.function_bits(self.profile.string(f.name)));
        if let Some(slot) = self.functions.get_mut(position) {
            *slot = Some(bits);
        }
        bits
    }
}
