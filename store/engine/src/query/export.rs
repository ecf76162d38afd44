//! Exporting a merge as a valid pprof profile. Unsymbolized frames keep
//! their mapping, address and build id so they can be symbolized later.

use std::collections::BTreeMap;

use hashbrown::{HashMap, HashSet};
use kiln_pprof::{FunctionSpec, LabelValue, MappingSpec, ProfileBuilder, proto};

use super::flamegraph::{MAX_UNWOUND_FRAMES, OTHER_NODE_NAME};
use super::merged::{MergedProfile, frame_names};
use crate::model::ProfileType;

impl MergedProfile {
    /// Builds a pprof profile with one sample type, `profile_type`'s.
    pub fn to_pprof(&self, profile_type: &ProfileType) -> proto::Profile {
        self.export(profile_type, None)
    }

    /// [`MergedProfile::to_pprof`] with at most `max_functions` functions
    /// and one [`OTHER_NODE_NAME`] function more: the functions with the
    /// largest inclusive totals are kept, and each stack is cut at its
    /// rootmost frame of another function, which becomes one
    /// [`OTHER_NODE_NAME`] leaf. Values still add up to the total, and
    /// stacks cut the same way become one sample. This is Pyroscope's
    /// `max_nodes` for whole profiles: a client asking for 16 nodes gets a
    /// profile it can draw, not every function of the range.
    pub fn to_pprof_trimmed(
        &self,
        profile_type: &ProfileType,
        max_functions: usize,
    ) -> proto::Profile {
        let kept = self.heaviest_functions(max_functions);
        self.export(profile_type, Some(&kept))
    }

    /// The ids of the `max_functions` functions with the largest inclusive
    /// totals (each counted once per stack), ties to the lower id.
    fn heaviest_functions(&self, max_functions: usize) -> HashSet<u32> {
        let symbols = &self.symbols;
        let mut totals: HashMap<u32, i64> = HashMap::new();
        let mut locations = Vec::new();
        let mut in_stack = HashSet::new();
        for (&(node, _), &value) in &self.values {
            if value == 0 {
                continue;
            }
            locations.clear();
            in_stack.clear();
            symbols.stack_locations(node, &mut locations);
            for location in locations.iter().filter_map(|&id| symbols.location(id)) {
                for line in symbols.location_lines(location) {
                    if in_stack.insert(line.function) {
                        let total = totals.entry(line.function).or_default();
                        *total = total.saturating_add(value.saturating_abs());
                    }
                }
            }
        }
        let mut ranked: Vec<(u32, i64)> = totals.into_iter().collect();
        ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked
            .into_iter()
            .take(max_functions)
            .map(|(function, _)| function)
            .collect()
    }

    /// The pprof of the merge; with `kept`, stacks cut at their rootmost
    /// frame of a function not in it.
    fn export(&self, profile_type: &ProfileType, kept: Option<&HashSet<u32>>) -> proto::Profile {
        let symbols = &self.symbols;
        let mut builder =
            ProfileBuilder::new(&[(&profile_type.sample_type, &profile_type.sample_unit)]);
        if !profile_type.period_type.is_empty() || !profile_type.period_unit.is_empty() {
            builder.period(&profile_type.period_type, &profile_type.period_unit, 0);
        }
        let mut mapping_ids: HashMap<u32, u64> = HashMap::new();
        let mut function_ids: HashMap<u32, u64> = HashMap::new();
        let mut location_ids: HashMap<u32, u64> = HashMap::new();
        let mut locations = Vec::new();
        let mut stack = Vec::new();
        let mut lines = Vec::new();
        let mut entries: Vec<(&(u32, u32), &i64)> = self.values.iter().collect();
        // Deterministic output: same merge, same bytes.
        entries.sort_unstable();
        // Cut stacks, merged by (stack, label set), in a deterministic order.
        let mut cut_samples: BTreeMap<(Vec<u64>, u32), i64> = BTreeMap::new();
        let mut other_location = None;
        for (&(node, label_set), &value) in entries {
            if value == 0 {
                continue;
            }
            locations.clear();
            symbols.stack_locations(node, &mut locations);
            // Leaf first: the frames rootward of the rootmost frame of a
            // function not kept stay; that frame and all leafward of it
            // become one `other` frame.
            let cut = kept.and_then(|kept| {
                locations.iter().rposition(|&id| {
                    symbols.location(id).is_some_and(|location| {
                        symbols
                            .location_lines(location)
                            .iter()
                            .any(|line| !kept.contains(&line.function))
                    })
                })
            });
            stack.clear();
            let rootward = cut.map_or(0, |at| at + 1);
            if cut.is_some() {
                let id = *other_location.get_or_insert_with(|| {
                    let function = builder.function(&FunctionSpec {
                        name: OTHER_NODE_NAME.to_owned(),
                        system_name: OTHER_NODE_NAME.to_owned(),
                        filename: String::new(),
                        start_line: 0,
                    });
                    builder.location(0, 0, &[(function, 0)])
                });
                stack.push(id);
            }
            for &location_id in &locations[rootward..] {
                if let Some(&id) = location_ids.get(&location_id) {
                    stack.push(id);
                    continue;
                }
                let Some(location) = symbols.location(location_id) else {
                    continue;
                };
                let mapping_id = match symbols.mapping(location.mapping) {
                    None => 0,
                    Some(mapping) => *mapping_ids.entry(location.mapping).or_insert_with(|| {
                        builder.mapping(&MappingSpec {
                            memory_start: mapping.memory_start,
                            memory_limit: mapping.memory_limit,
                            file_offset: mapping.file_offset,
                            filename: symbols.string(mapping.filename).to_owned(),
                            build_id: symbols.string(mapping.build_id).to_owned(),
                            has_functions: mapping.has_functions,
                        })
                    }),
                };
                lines.clear();
                for line in symbols.location_lines(location) {
                    let function_id = *function_ids.entry(line.function).or_insert_with(|| {
                        let function = symbols.function(line.function);
                        builder.function(&FunctionSpec {
                            name: function.map_or("", |f| symbols.string(f.name)).to_owned(),
                            system_name: function
                                .map_or("", |f| symbols.string(f.system_name))
                                .to_owned(),
                            filename: function
                                .map_or("", |f| symbols.string(f.filename))
                                .to_owned(),
                            start_line: function.map_or(0, |f| f.start_line),
                        })
                    });
                    lines.push((function_id, line.line));
                }
                let id = builder.location(mapping_id, location.address, &lines);
                location_ids.insert(location_id, id);
                stack.push(id);
            }
            if kept.is_some() {
                let merged = cut_samples.entry((stack.clone(), label_set)).or_default();
                *merged = merged.saturating_add(value);
                continue;
            }
            let labels = self.pprof_labels(label_set);
            builder.sample(&stack, &[value], &labels);
        }
        for ((stack, label_set), value) in cut_samples {
            let labels = self.pprof_labels(label_set);
            builder.sample(&stack, &[value], &labels);
        }
        builder.finish()
    }

    /// A label set's labels, as the pprof builder takes them.
    fn pprof_labels(&self, label_set: u32) -> Vec<(&str, LabelValue)> {
        let symbols = &self.symbols;
        symbols
            .label_set(label_set)
            .iter()
            .map(|label| {
                let value = if label.str != 0 {
                    LabelValue::Str(symbols.string(label.str).to_owned())
                } else {
                    LabelValue::Num {
                        value: label.num,
                        unit: symbols.string(label.unit).to_owned(),
                    }
                };
                (symbols.string(label.key), value)
            })
            .collect()
    }
}

impl MergedProfile {
    /// Every stack as one folded line, `root;...;leaf value`, with sample
    /// labels merged away, sorted; stacks summing to zero are left out.
    /// Untrimmed, so the values add up to [`MergedProfile::total`]. Frame
    /// names are made safe with
    /// [`folded_frame_name`](kiln_contract::query_json::folded_frame_name).
    ///
    /// A stack deeper than [`MAX_UNWOUND_FRAMES`] keeps its outermost frames
    /// and ends in one [`OTHER_NODE_NAME`] frame for the rest, so a stored
    /// stack of millions of frames is a line of bounded length.
    pub fn folded(&self) -> String {
        let mut text = String::new();
        for (frames, value) in self.stacks_within(MAX_UNWOUND_FRAMES) {
            if value == 0 {
                continue;
            }
            for (depth, frame) in frames.iter().rev().enumerate() {
                if depth > 0 {
                    text.push(';');
                }
                text.push_str(&kiln_contract::query_json::folded_frame_name(frame));
            }
            text.push(' ');
            text.push_str(&value.to_string());
            text.push('\n');
        }
        text
    }

    /// [`MergedProfile::stacks`], each stack cut to its outermost
    /// `max_depth` frames plus one [`OTHER_NODE_NAME`] frame where it was
    /// deeper. Frame names are resolved once per location and a stack is
    /// walked from the root, so the work per stack is bounded by
    /// `max_depth`, not by its depth.
    pub(crate) fn stacks_within(&self, max_depth: usize) -> Vec<(Vec<String>, i64)> {
        let symbols = &self.symbols;
        let mut by_stack: HashMap<Vec<String>, i64> = HashMap::new();
        let mut locations = Vec::new();
        let mut names = Vec::new();
        for (&(stack, _), &value) in &self.values {
            locations.clear();
            symbols.stack_locations(stack, &mut locations);
            // Root first, outermost inlined line first.
            let mut frames: Vec<String> = Vec::new();
            'stack: for &location in locations.iter().rev() {
                let Some(location) = symbols.location(location) else {
                    continue;
                };
                names.clear();
                frame_names(symbols, location, &mut names);
                for name in names.drain(..).rev() {
                    if frames.len() == max_depth {
                        frames.push(OTHER_NODE_NAME.to_owned());
                        break 'stack;
                    }
                    frames.push(name);
                }
            }
            frames.reverse();
            let sum = by_stack.entry(frames).or_insert(0);
            *sum = sum.wrapping_add(value);
        }
        let mut out: Vec<_> = by_stack.into_iter().collect();
        out.sort();
        out
    }
}
