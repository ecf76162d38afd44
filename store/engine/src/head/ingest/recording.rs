//! The values a checked profile gives each recording rule: read from the
//! plan the checks resolved (each sample's series labels per profile
//! type), so evaluating rules costs one pass over the samples and no
//! second label resolution.

use hashbrown::HashMap;
use kiln_pprof::ProfileView;

use super::CheckedIngest;
use crate::model::LabelSet;
use crate::recording::{FunctionFilter, RecordedValue, RecordingRule};

impl CheckedIngest {
    /// What this profile adds to each rule's series: per rule, per
    /// recorded label set, the sum of the values of the samples counted.
    /// A sample counts once even when several of its frames match.
    pub fn recorded_values(&self, rules: &[RecordingRule]) -> Vec<RecordedValue> {
        let profile = &self.profile;
        let plan = &self.plan;
        let type_count = plan.types.len();
        let mut recorded = Vec::new();
        for rule in rules {
            // Per slot (signature, profile type): the recorded labels, when
            // the rule selects the slot's series.
            let slots: Vec<Option<LabelSet>> = plan
                .slot_labels
                .iter()
                .enumerate()
                .map(|(slot, labels)| {
                    let labels = labels.as_ref()?;
                    rule.selects(&plan.types[slot % type_count], labels)
                        .then(|| rule.recorded_labels(labels))
                })
                .collect();
            if slots.iter().all(Option::is_none) {
                continue;
            }
            let mut frames = FrameMatches::new(profile, rule.function());
            let mut sums: HashMap<&LabelSet, i64> = HashMap::new();
            for (index, &signature) in plan.sample_signature.iter().enumerate() {
                let base = signature as usize * type_count;
                let sample = profile.sample(index);
                let mut counted = None;
                for (t, &value) in sample.values.iter().enumerate() {
                    let Some(Some(labels)) = slots.get(base + t) else {
                        continue;
                    };
                    if value == 0 {
                        continue;
                    }
                    if !*counted.get_or_insert_with(|| frames.sample_matches(sample.location_ids)) {
                        break;
                    }
                    let sum = sums.entry(labels).or_insert(0);
                    *sum = sum.saturating_add(value);
                }
            }
            recorded.extend(sums.into_iter().map(|(labels, value)| RecordedValue {
                labels: labels.clone(),
                value,
            }));
        }
        recorded
    }
}

/// Whether a location holds a frame the filter matches, computed once per
/// location of the profile.
struct FrameMatches<'p, P: ProfileView> {
    profile: &'p P,
    filter: &'p FunctionFilter,
    /// Per location position: unknown, or whether it matches.
    known: Vec<Option<bool>>,
}

impl<'p, P: ProfileView> FrameMatches<'p, P> {
    fn new(profile: &'p P, filter: &'p FunctionFilter) -> Self {
        let known = match filter {
            FunctionFilter::Any => Vec::new(),
            _ => vec![None; profile.location_count()],
        };
        Self {
            profile,
            filter,
            known,
        }
    }

    fn sample_matches(&mut self, location_ids: &[u64]) -> bool {
        if matches!(self.filter, FunctionFilter::Any) {
            return true;
        }
        location_ids.iter().any(|&id| self.location_matches(id))
    }

    fn location_matches(&mut self, id: u64) -> bool {
        let Some(position) = self.profile.location_position(id) else {
            return false;
        };
        if let Some(Some(known)) = self.known.get(position) {
            return *known;
        }
        let profile = self.profile;
        let matches = profile.location_at(position).is_some_and(|location| {
            location.lines.iter().any(|line| {
                profile
                    .function_position(line.function_id)
                    .and_then(|f| profile.function_at(f))
                    .is_some_and(|function| self.filter.matches(profile.string(function.name)))
            })
        });
        if let Some(slot) = self.known.get_mut(position) {
            *slot = Some(matches);
        }
        matches
    }
}
