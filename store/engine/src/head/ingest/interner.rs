//! The per-profile memo that turns pprof table positions into head symbol
//! ids, so each string, function, location and label set is interned once.

use hashbrown::HashMap;
use kiln_pprof::ProfileView;

use super::UNSEEN;
use super::location_keys::LocationKeys;
use crate::head::Head;
use crate::symbols::{Function, Line, Mapping, NO_MAPPING, SampleLabel};

/// Per-profile memo from pprof table positions to head symbol ids.
pub(super) struct ProfileInterner<'p, P> {
    profile: &'p P,
    strings: Vec<u32>,
    locations: Vec<u32>,
    location_keys: LocationKeys,
    /// Content keys by location position, once computed.
    location_content: Vec<Option<u128>>,
    functions: Vec<u32>,
    mappings: HashMap<u64, u32>,
    /// Head location ids of the stack being interned, root first.
    frames: Vec<u32>,
    lines: Vec<Line>,
    label_sets: HashMap<Vec<[i64; 4]>, u32>,
    label_scratch: Vec<[i64; 4]>,
    labels: Vec<SampleLabel>,
}

impl<'p, P: ProfileView> ProfileInterner<'p, P> {
    pub(super) fn new(profile: &'p P) -> Self {
        Self {
            profile,
            strings: vec![UNSEEN; profile.string_count()],
            locations: vec![UNSEEN; profile.location_count()],
            location_keys: LocationKeys::new(profile),
            location_content: Vec::new(),
            functions: vec![UNSEEN; profile.function_count()],
            mappings: HashMap::new(),
            frames: Vec::new(),
            lines: Vec::new(),
            label_sets: HashMap::new(),
            label_scratch: Vec::new(),
            labels: Vec::new(),
        }
    }

    /// Finds every location of the profile that the head already holds:
    /// all content keys first, then all lookups.
    ///
    /// NB: each lookup is a cache miss in a large table. With no hashing
    /// between them, the CPU runs several of these independent misses at
    /// once; one at a time, between the keys of a stack's frames, they
    /// were the largest single cost of `apply`.
    pub(super) fn find_known_locations(&mut self, head: &Head) {
        let profile = self.profile;
        let keys: Vec<Option<u128>> = (0..profile.location_count())
            .map(|position| {
                let location = profile.location_at(position)?;
                self.location_keys.location(profile, &location)
            })
            .collect();
        for (slot, key) in self.locations.iter_mut().zip(&keys) {
            if let Some(id) = key.and_then(|key| head.symbols.location_by_content(key)) {
                *slot = id;
            }
        }
        self.location_content = keys;
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
        let Some(position) = self.profile.function_position(id) else {
            return 0;
        };
        if self.functions[position] == UNSEEN {
            let Some(&f) = self.profile.function_at(position) else {
                return 0;
            };
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
            let Some(location) = self.profile.location_at(position) else {
                return 0;
            };
            let key = match self.location_content.get(position) {
                // Looked up by `find_known_locations` already: not there.
                Some(&key) => key,
                None => {
                    let key = self.location_keys.location(self.profile, &location);
                    if let Some(id) = key.and_then(|key| head.symbols.location_by_content(key)) {
                        self.locations[position] = id;
                        return id;
                    }
                    key
                }
            };
            let mapping = self.mapping(head, location.mapping_id);
            let mut lines = std::mem::take(&mut self.lines);
            lines.clear();
            for line in location.lines {
                lines.push(Line {
                    function: self.function(head, line.function_id),
                    line: line.line,
                });
            }
            let id = head
                .symbols
                .intern_location(mapping, location.address, &lines);
            if let Some(key) = key {
                head.symbols.remember_location_content(key, id);
            }
            self.locations[position] = id;
            self.lines = lines;
        }
        self.locations[position]
    }

    /// Interns a stack given leaf-first pprof location ids.
    pub(super) fn stack(&mut self, head: &mut Head, location_ids: &[u64]) -> u32 {
        let mut frames = std::mem::take(&mut self.frames);
        frames.clear();
        for &id in location_ids.iter().rev() {
            // Validation guarantees every id resolves.
            if let Some(position) = self.profile.location_position(id) {
                frames.push(self.location(head, position));
            }
        }
        let node = head.symbols.intern_stack(&frames);
        self.frames = frames;
        node
    }

    /// Interns the labels of `sample` that stay per sample.
    pub(super) fn sample_labels(
        &mut self,
        head: &mut Head,
        sample_labels: &[kiln_pprof::proto::Label],
        is_promoted: &impl Fn(i64, i64) -> bool,
    ) -> u32 {
        self.label_scratch.clear();
        for label in sample_labels {
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
