//! Building pprof profiles: interned strings, deduplicated functions,
//! mappings and locations, and samples merged by stack and labels.

use std::collections::HashMap;
use std::io::Write;

use prost::Message;

use crate::proto;

/// A mapping to add: an executable or library loaded into memory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct MappingSpec {
    /// Start of the mapped range.
    pub memory_start: u64,
    /// End of the mapped range (exclusive).
    pub memory_limit: u64,
    /// File offset that `memory_start` maps.
    pub file_offset: u64,
    /// Path of the mapped file.
    pub filename: String,
    /// Build id (GNU build id as hex, or any stable id).
    pub build_id: String,
    /// Whether its locations carry function names.
    pub has_functions: bool,
}

/// A function to add.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct FunctionSpec {
    /// Human-readable (demangled) name.
    pub name: String,
    /// Name as the system knows it (mangled), often equal to `name`.
    pub system_name: String,
    /// Source file.
    pub filename: String,
    /// Line where the function starts.
    pub start_line: i64,
}

/// One sample label: a string or a number with an optional unit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LabelValue {
    /// A string label.
    Str(String),
    /// A numeric label and its unit (empty when unitless).
    Num {
        /// The number.
        value: i64,
        /// Its unit, e.g. `bytes`.
        unit: String,
    },
}

/// Accumulates a profile and emits a valid [`proto::Profile`].
///
/// Ids are sequential (`index + 1`), identical entries share one id, and
/// samples with the same stack and labels are summed into one.
#[derive(Debug, Default)]
pub struct ProfileBuilder {
    profile: proto::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<FunctionSpec, u64>,
    mappings: HashMap<MappingSpec, u64>,
    locations: HashMap<LocationKey, u64>,
    samples: HashMap<SampleKey, usize>,
}

/// Flattened `(mapping, address, (function, line)...)`, the identity of a location.
#[derive(Debug, Hash, PartialEq, Eq)]
struct LocationKey(Vec<u64>);

/// Flattened `(depth, location ids..., (key, str, num, unit)...)`, the identity of a sample.
#[derive(Debug, Hash, PartialEq, Eq)]
struct SampleKey(Vec<i64>);

impl ProfileBuilder {
    /// Starts a profile with the given `(type, unit)` sample types.
    pub fn new(sample_types: &[(&str, &str)]) -> Self {
        let mut builder = Self::default();
        builder.profile.string_table.push(Vec::new());
        builder.strings.insert(String::new(), 0);
        for &(kind, unit) in sample_types {
            let value_type = builder.value_type(kind, unit);
            builder.profile.sample_type.push(value_type);
        }
        builder
    }

    /// Sets the period type and the period (events between samples).
    pub fn period(&mut self, kind: &str, unit: &str, period: i64) -> &mut Self {
        self.profile.period_type = Some(self.value_type(kind, unit));
        self.profile.period = period;
        self
    }

    /// Sets collection time and covered duration, both in nanoseconds.
    pub fn time(&mut self, time_nanos: i64, duration_nanos: i64) -> &mut Self {
        self.profile.time_nanos = time_nanos;
        self.profile.duration_nanos = duration_nanos;
        self
    }

    /// Sets the default sample type by its type name.
    pub fn default_sample_type(&mut self, kind: &str) -> &mut Self {
        self.profile.default_sample_type = self.string(kind);
        self
    }

    /// Adds a comment line.
    pub fn comment(&mut self, text: &str) -> &mut Self {
        let index = self.string(text);
        self.profile.comment.push(index);
        self
    }

    /// Interns `s` and returns its string-table index.
    pub fn string(&mut self, s: &str) -> i64 {
        if let Some(&index) = self.strings.get(s) {
            return index;
        }
        let index = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.as_bytes().to_vec());
        self.strings.insert(s.to_owned(), index);
        index
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    /// Adds a mapping (deduplicated) and returns its id.
    pub fn mapping(&mut self, spec: &MappingSpec) -> u64 {
        if let Some(&id) = self.mappings.get(spec) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let mapping = proto::Mapping {
            id,
            memory_start: spec.memory_start,
            memory_limit: spec.memory_limit,
            file_offset: spec.file_offset,
            filename: self.string(&spec.filename),
            build_id: self.string(&spec.build_id),
            has_functions: spec.has_functions,
            ..proto::Mapping::default()
        };
        self.profile.mapping.push(mapping);
        self.mappings.insert(spec.clone(), id);
        id
    }

    /// Adds a function (deduplicated) and returns its id.
    pub fn function(&mut self, spec: &FunctionSpec) -> u64 {
        if let Some(&id) = self.functions.get(spec) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let function = proto::Function {
            id,
            name: self.string(&spec.name),
            system_name: self.string(&spec.system_name),
            filename: self.string(&spec.filename),
            start_line: spec.start_line,
        };
        self.profile.function.push(function);
        self.functions.insert(spec.clone(), id);
        id
    }

    /// Adds a location (deduplicated) and returns its id. `lines` are
    /// `(function id, line)`, innermost (inlined) first; `mapping_id` 0 means none.
    pub fn location(&mut self, mapping_id: u64, address: u64, lines: &[(u64, i64)]) -> u64 {
        let mut flat = Vec::with_capacity(2 + 2 * lines.len());
        flat.extend([mapping_id, address]);
        for &(function_id, line) in lines {
            flat.extend([function_id, line as u64]);
        }
        let key = LocationKey(flat);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        let location = proto::Location {
            id,
            mapping_id,
            address,
            line: lines
                .iter()
                .map(|&(function_id, line)| proto::Line {
                    function_id,
                    line,
                    column: 0,
                })
                .collect(),
            is_folded: false,
        };
        self.profile.location.push(location);
        self.locations.insert(key, id);
        id
    }

    /// Adds `values` (one per sample type) for the stack `location_ids`
    /// (leaf first), summing into an existing sample with the same stack and labels.
    ///
    /// # Panics
    /// In debug builds, when `values` does not have one entry per sample type.
    pub fn sample(&mut self, location_ids: &[u64], values: &[i64], labels: &[(&str, LabelValue)]) {
        debug_assert_eq!(
            values.len(),
            self.profile.sample_type.len(),
            "one value per sample type"
        );
        let mut proto_labels: Vec<proto::Label> = labels
            .iter()
            .map(|(key, value)| {
                let key = self.string(key);
                match value {
                    LabelValue::Str(s) => proto::Label {
                        key,
                        str: self.string(s),
                        num: 0,
                        num_unit: 0,
                    },
                    LabelValue::Num { value, unit } => proto::Label {
                        key,
                        str: 0,
                        num: *value,
                        num_unit: self.string(unit),
                    },
                }
            })
            .collect();
        proto_labels.sort_by_key(|l| (l.key, l.str, l.num, l.num_unit));
        let mut flat = Vec::with_capacity(1 + location_ids.len() + 4 * proto_labels.len());
        flat.push(location_ids.len() as i64);
        flat.extend(location_ids.iter().map(|&id| id as i64));
        for label in &proto_labels {
            flat.extend([label.key, label.str, label.num, label.num_unit]);
        }
        let key = SampleKey(flat);
        if let Some(&index) = self.samples.get(&key) {
            let sample = &mut self.profile.sample[index];
            for (total, value) in sample.value.iter_mut().zip(values) {
                *total = total.saturating_add(*value);
            }
            return;
        }
        let index = self.profile.sample.len();
        self.profile.sample.push(proto::Sample {
            location_id: location_ids.to_vec(),
            value: values.to_vec(),
            label: proto_labels,
        });
        self.samples.insert(key, index);
    }

    /// Number of samples so far (after merging).
    pub fn sample_count(&self) -> usize {
        self.profile.sample.len()
    }

    /// Finishes the profile.
    pub fn finish(self) -> proto::Profile {
        self.profile
    }
}

/// Encodes a profile as gzipped protobuf, the form pprof tools expect.
pub fn encode_gzip(profile: &proto::Profile) -> Vec<u8> {
    let plain = profile.encode_to_vec();
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(plain.len() / 3),
        // NB: zlib-rs level 1 is a "quick" mode whose output is ~20 % larger
        // than miniz_oxide's level 1; level 2 matches it in size and speed.
        flate2::Compression::new(2),
    );
    // Writing into a Vec cannot fail.
    encoder
        .write_all(&plain)
        .expect("writing to a Vec cannot fail");
    encoder.finish().expect("writing to a Vec cannot fail")
}
