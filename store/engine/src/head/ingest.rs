//! Normalizing one pprof profile into series, stacks and values.
//!
//! - each sample type becomes its own profile type (and so its own series);
//! - string sample labels are promoted to series labels (a name colliding
//!   with a series label becomes `exported_<name>`), except span labels;
//! - span and numeric labels stay per sample, as a deduplicated label set
//!   that is part of the stack key;
//! - zero values are dropped.
//!
//! Everything is checked before the head is touched, so a refused profile
//! leaves no trace.

use hashbrown::HashMap;
use kiln_pprof::Profile;

use super::{Head, HeadPoint, Run};
use crate::error::IngestError;
use crate::model::{Label, LabelSet, NAME_LABEL, PROFILE_TYPE_LABEL, ProfileType};
use crate::symbols::{Function, Line, Mapping, NO_MAPPING, SampleLabel};

/// Sample labels that stay per sample: unbounded ids would explode series.
const SPAN_LABELS: [&str; 3] = ["span_id", "profile_id", "trace_id"];
const UNSEEN: u32 = u32::MAX;

/// Bounds on what one profile may add to the head.
#[derive(Debug, Clone)]
pub struct IngestLimits {
    /// Most labels on one series, including `__name__` and `__profile_type__`.
    pub max_labels_per_series: usize,
    /// Longest label name in bytes.
    pub max_label_name_bytes: usize,
    /// Longest label value in bytes.
    pub max_label_value_bytes: usize,
    /// Most series per profile name (`__name__`) in the head.
    pub max_series_per_profile_name: usize,
    /// Most samples in one profile.
    pub max_samples_per_profile: usize,
}

impl Default for IngestLimits {
    fn default() -> Self {
        Self {
            max_labels_per_series: 48,
            max_label_name_bytes: 256,
            max_label_value_bytes: 2048,
            max_series_per_profile_name: 100_000,
            max_samples_per_profile: 1_000_000,
        }
    }
}

/// What one ingest did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct IngestStats {
    /// Values stored (one per sample, sample type and non-zero value).
    pub samples: u64,
    /// Values dropped because they were zero.
    pub zero_values_dropped: u64,
    /// Series created by this profile.
    pub series_created: u64,
    /// Profile types (sample types) in the profile.
    pub profile_types: u64,
}

/// Maps pprof ids to table positions; producers almost always use `index + 1`.
enum PositionById {
    Sequential(usize),
    Sparse(HashMap<u64, usize>),
}

impl PositionById {
    fn build(ids: impl ExactSizeIterator<Item = u64> + Clone) -> Self {
        let len = ids.len();
        if ids.clone().enumerate().all(|(i, id)| id == i as u64 + 1) {
            return Self::Sequential(len);
        }
        Self::Sparse(ids.enumerate().map(|(i, id)| (id, i)).collect())
    }

    fn get(&self, id: u64) -> Option<usize> {
        match self {
            Self::Sequential(len) => {
                let i = usize::try_from(id.checked_sub(1)?).ok()?;
                (i < *len).then_some(i)
            }
            Self::Sparse(map) => map.get(&id).copied(),
        }
    }
}

fn check_label(name: &str, value: &str, limits: &IngestLimits) -> Result<(), IngestError> {
    if name.is_empty() {
        return Err(IngestError::EmptyLabelName);
    }
    if name.len() > limits.max_label_name_bytes {
        return Err(IngestError::LabelNameTooLong {
            name_prefix: name.chars().take(64).collect(),
            len: name.len(),
            limit: limits.max_label_name_bytes,
        });
    }
    if value.len() > limits.max_label_value_bytes {
        return Err(IngestError::LabelValueTooLong {
            name: name.chars().take(256).collect(),
            len: value.len(),
            limit: limits.max_label_value_bytes,
        });
    }
    Ok(())
}

/// The profile types of `profile`, one per sample type.
pub(crate) fn profile_types_of(
    profile: &Profile,
    name: &str,
    duration_nanos: i64,
) -> Vec<ProfileType> {
    let (period_type, period_unit) =
        profile
            .period_type()
            .map_or((String::new(), String::new()), |p| {
                (
                    profile.string(p.r#type).to_owned(),
                    profile.string(p.unit).to_owned(),
                )
            });
    profile
        .sample_types()
        .iter()
        .map(|st| ProfileType {
            name: name.to_owned(),
            sample_type: profile.string(st.r#type).to_owned(),
            sample_unit: profile.string(st.unit).to_owned(),
            period_type: period_type.clone(),
            period_unit: period_unit.clone(),
            delta: duration_nanos != 0,
        })
        .collect()
}

impl Head {
    /// Ingests one validated profile under `labels` (which must hold
    /// `__name__`) at `time_ms`. `duration_nanos != 0` marks delta profiles.
    pub fn ingest(
        &mut self,
        profile: &Profile,
        labels: &LabelSet,
        time_ms: i64,
        duration_nanos: i64,
        limits: &IngestLimits,
    ) -> Result<IngestStats, IngestError> {
        let name = labels
            .get(NAME_LABEL)
            .filter(|n| !n.is_empty())
            .ok_or(IngestError::MissingName)?
            .to_owned();
        for label in labels.iter() {
            check_label(&label.name, &label.value, limits)?;
        }
        let samples = profile.samples();
        if samples.len() > limits.max_samples_per_profile {
            return Err(IngestError::TooManySamples {
                count: samples.len(),
                limit: limits.max_samples_per_profile,
            });
        }
        let types = profile_types_of(profile, &name, duration_nanos);
        let type_count = types.len();

        // Pass 1: group samples by their promoted labels ("signature") and
        // find which (signature, type) slots receive a non-zero value.
        let mut signatures: HashMap<Vec<(i64, i64)>, u32> = HashMap::new();
        let mut signature_keys: Vec<Vec<(i64, i64)>> = vec![Vec::new()];
        signatures.insert(Vec::new(), 0);
        let mut sample_signature: Vec<u32> = Vec::with_capacity(samples.len());
        let mut slot_used: Vec<bool> = vec![false; type_count];
        let mut scratch: Vec<(i64, i64)> = Vec::new();
        let span_keys: Vec<bool> = profile
            .strings()
            .iter()
            .map(|s| SPAN_LABELS.contains(&s.as_str()))
            .collect();
        let is_promoted = |key: i64, str_index: i64| {
            str_index != 0 && !span_keys.get(key as usize).copied().unwrap_or(false)
        };
        for sample in samples {
            scratch.clear();
            for label in &sample.label {
                if is_promoted(label.key, label.str) {
                    scratch.push((label.key, label.str));
                }
            }
            let signature = if scratch.is_empty() {
                0
            } else {
                scratch.sort_unstable();
                match signatures.get(scratch.as_slice()) {
                    Some(&s) => s,
                    None => {
                        let s = signature_keys.len() as u32;
                        signatures.insert(scratch.clone(), s);
                        signature_keys.push(scratch.clone());
                        slot_used.extend(std::iter::repeat_n(false, type_count));
                        s
                    }
                }
            };
            sample_signature.push(signature);
            let base = signature as usize * type_count;
            for (t, &value) in sample.value.iter().enumerate() {
                if value != 0 {
                    slot_used[base + t] = true;
                }
            }
        }

        // Resolve every used slot's series labels and check limits.
        let mut slot_labels: Vec<Option<LabelSet>> = vec![None; slot_used.len()];
        let mut new_series = 0usize;
        for (signature, key) in signature_keys.iter().enumerate() {
            let base = signature * type_count;
            if !slot_used[base..base + type_count].iter().any(|&u| u) {
                continue;
            }
            let mut set = labels.clone();
            for &(k, v) in key {
                let (k, v) = (profile.string(k), profile.string(v));
                let promoted_name = if labels.get(k).is_some() || k == PROFILE_TYPE_LABEL {
                    format!("exported_{k}")
                } else {
                    k.to_owned()
                };
                check_label(&promoted_name, v, limits)?;
                set.insert(Label::new(promoted_name, v));
            }
            if set.len() + 1 > limits.max_labels_per_series {
                return Err(IngestError::TooManyLabels {
                    count: set.len() + 1,
                    limit: limits.max_labels_per_series,
                });
            }
            for (t, profile_type) in types.iter().enumerate() {
                if !slot_used[base + t] {
                    continue;
                }
                let mut full = set.clone();
                full.insert(Label::new(PROFILE_TYPE_LABEL, profile_type.to_string()));
                if self.existing_series(&full).is_none() {
                    new_series += 1;
                }
                slot_labels[base + t] = Some(full);
            }
        }
        let would_have = self.series_for_name(&name) + new_series;
        if new_series > 0 && would_have > limits.max_series_per_profile_name {
            return Err(IngestError::TooManySeries {
                name,
                count: would_have,
                limit: limits.max_series_per_profile_name,
            });
        }

        // Pass 2: apply. Nothing below can fail.
        let series_before = self.series.len();
        let mut slot_series: Vec<u32> = vec![UNSEEN; slot_used.len()];
        for (slot, labels) in slot_labels.iter().enumerate() {
            if let Some(labels) = labels {
                slot_series[slot] = self.series_id(labels, &types[slot % type_count]);
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
        let mut stats = IngestStats {
            profile_types: type_count as u64,
            ..IngestStats::default()
        };
        let mut totals: Vec<i64> = vec![0; slot_used.len()];
        for (sample, &signature) in samples.iter().zip(&sample_signature) {
            if sample.value.iter().all(|&v| v == 0) {
                stats.zero_values_dropped += sample.value.len() as u64;
                continue;
            }
            let stack = interner.stack(self, &sample.location_id);
            let sample_labels = interner.sample_labels(self, sample, &is_promoted);
            let base = signature as usize * type_count;
            for (t, &value) in sample.value.iter().enumerate() {
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
        Ok(stats)
    }
}

/// Per-profile memo from pprof table positions to head symbol ids.
struct ProfileInterner<'p> {
    profile: &'p Profile,
    strings: Vec<u32>,
    location_positions: PositionById,
    locations: Vec<u32>,
    function_positions: PositionById,
    functions: Vec<u32>,
    mappings: HashMap<u64, u32>,
    /// Head location ids of the stack being interned, root first.
    frames: Vec<u32>,
    lines: Vec<Line>,
    label_sets: HashMap<Vec<[i64; 4]>, u32>,
    label_scratch: Vec<[i64; 4]>,
    labels: Vec<SampleLabel>,
}

impl<'p> ProfileInterner<'p> {
    fn new(profile: &'p Profile) -> Self {
        Self {
            profile,
            strings: vec![UNSEEN; profile.strings().len()],
            location_positions: PositionById::build(profile.locations().iter().map(|l| l.id)),
            locations: vec![UNSEEN; profile.locations().len()],
            function_positions: PositionById::build(profile.functions().iter().map(|f| f.id)),
            functions: vec![UNSEEN; profile.functions().len()],
            mappings: HashMap::new(),
            frames: Vec::new(),
            lines: Vec::new(),
            label_sets: HashMap::new(),
            label_scratch: Vec::new(),
            labels: Vec::new(),
        }
    }

    fn string(&mut self, head: &mut Head, index: i64) -> u32 {
        let Some(slot) = usize::try_from(index)
            .ok()
            .and_then(|i| self.strings.get_mut(i))
        else {
            return 0;
        };
        if *slot == UNSEEN {
            *slot = head.symbols.intern_string(self.profile.string(index));
        }
        *slot
    }

    fn mapping(&mut self, head: &mut Head, id: u64) -> u32 {
        if let Some(&m) = self.mappings.get(&id) {
            return m;
        }
        let translated = match self.profile.mapping(id) {
            None => NO_MAPPING,
            Some(m) => {
                let mapping = Mapping {
                    memory_start: m.memory_start,
                    memory_limit: m.memory_limit,
                    file_offset: m.file_offset,
                    filename: self.string(head, m.filename),
                    build_id: self.string(head, m.build_id),
                    has_functions: m.has_functions,
                };
                head.symbols.intern_mapping(mapping)
            }
        };
        self.mappings.insert(id, translated);
        translated
    }

    fn function(&mut self, head: &mut Head, id: u64) -> u32 {
        let Some(position) = self.function_positions.get(id) else {
            return 0;
        };
        if self.functions[position] == UNSEEN {
            let f = &self.profile.functions()[position];
            let function = Function {
                name: self.string(head, f.name),
                system_name: self.string(head, f.system_name),
                filename: self.string(head, f.filename),
                start_line: f.start_line,
            };
            self.functions[position] = head.symbols.intern_function(function);
        }
        self.functions[position]
    }

    fn location(&mut self, head: &mut Head, position: usize) -> u32 {
        if self.locations[position] == UNSEEN {
            let location = &self.profile.locations()[position];
            let mapping = self.mapping(head, location.mapping_id);
            let mut lines = std::mem::take(&mut self.lines);
            lines.clear();
            for line in &location.line {
                lines.push(Line {
                    function: self.function(head, line.function_id),
                    line: line.line,
                });
            }
            self.locations[position] =
                head.symbols
                    .intern_location(mapping, location.address, &lines);
            self.lines = lines;
        }
        self.locations[position]
    }

    /// Interns a stack given leaf-first pprof location ids.
    fn stack(&mut self, head: &mut Head, location_ids: &[u64]) -> u32 {
        let mut frames = std::mem::take(&mut self.frames);
        frames.clear();
        for &id in location_ids.iter().rev() {
            // Validation guarantees every id resolves.
            if let Some(position) = self.location_positions.get(id) {
                frames.push(self.location(head, position));
            }
        }
        let node = head.symbols.intern_stack(&frames);
        self.frames = frames;
        node
    }

    /// Interns the labels of `sample` that stay per sample.
    fn sample_labels(
        &mut self,
        head: &mut Head,
        sample: &kiln_pprof::proto::Sample,
        is_promoted: &impl Fn(i64, i64) -> bool,
    ) -> u32 {
        self.label_scratch.clear();
        for label in &sample.label {
            if !is_promoted(label.key, label.str) {
                self.label_scratch
                    .push([label.key, label.str, label.num, label.num_unit]);
            }
        }
        if self.label_scratch.is_empty() {
            return crate::symbols::EMPTY_LABEL_SET;
        }
        self.label_scratch.sort_unstable();
        if let Some(&id) = self.label_sets.get(self.label_scratch.as_slice()) {
            return id;
        }
        let mut labels = std::mem::take(&mut self.labels);
        labels.clear();
        let scratch = std::mem::take(&mut self.label_scratch);
        for &[key, str_index, num, unit] in &scratch {
            labels.push(SampleLabel {
                key: self.string(head, key),
                str: self.string(head, str_index),
                num,
                unit: self.string(head, unit),
            });
        }
        labels.sort_unstable();
        let id = head.symbols.intern_label_set(&labels);
        self.label_sets.insert(scratch.clone(), id);
        self.label_scratch = scratch;
        self.labels = labels;
        id
    }
}
