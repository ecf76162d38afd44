//! A validated profile read straight from the wire into flat tables, with
//! no prost message tree: a sample's location ids, values and labels and a
//! location's lines are ranges of a few shared vectors, and the strings
//! share one buffer. Decoding a 300-sample profile this way allocates a
//! dozen vectors instead of a few thousand (one per sample list, location,
//! line list and string), for the same checks and the same answers as
//! [`crate::decode`] (`tests/flat_equivalence.rs` compares them).

mod read;
mod wire;

use crate::error::PprofError;
use crate::limits::DecodeLimits;
use crate::prescan::TableCounts;
use crate::profile::{
    IdIndex, check_expanded_depth, check_limit, check_string, frames_of_location,
};
use crate::proto;
use read::{LocationEntry, Parts, SampleEnds};

/// A decoded pprof profile in which every string index, id reference and
/// value count has been checked, so accessors cannot fail; what
/// [`crate::decode_flat`] returns. Read it through [`crate::ProfileView`].
#[derive(Debug, Clone)]
pub struct FlatProfile {
    /// Every string, one after the other (invalid UTF-8 replaced).
    string_data: String,
    /// Where each string ends in `string_data`.
    string_ends: Vec<usize>,
    sample_types: Vec<proto::ValueType>,
    samples: Vec<SampleEnds>,
    location_ids: Vec<u64>,
    values: Vec<i64>,
    labels: Vec<proto::Label>,
    mappings: Vec<proto::Mapping>,
    mapping_index: IdIndex,
    locations: Vec<LocationEntry>,
    lines: Vec<proto::Line>,
    location_index: IdIndex,
    functions: Vec<proto::Function>,
    function_index: IdIndex,
    drop_frames: i64,
    keep_frames: i64,
    time_nanos: i64,
    duration_nanos: i64,
    period_type: Option<proto::ValueType>,
    period: i64,
    comments: Vec<i64>,
    default_sample_type: i64,
    doc_url: i64,
}

/// One sample of a [`FlatProfile`] or [`crate::Profile`].
#[derive(Debug, Clone, Copy)]
pub struct SampleRef<'p> {
    /// Location ids, leaf first; each resolves.
    pub location_ids: &'p [u64],
    /// One value per sample type.
    pub values: &'p [i64],
    /// Its labels; their string indices are in range.
    pub labels: &'p [proto::Label],
}

/// One location of a [`FlatProfile`] or [`crate::Profile`].
#[derive(Debug, Clone, Copy)]
pub struct LocationRef<'p> {
    /// Its id.
    pub id: u64,
    /// Its mapping's id (0, or one that may not resolve: read as no mapping).
    pub mapping_id: u64,
    /// Instruction address.
    pub address: u64,
    /// Source lines, innermost (inlined) first; every function id resolves.
    pub lines: &'p [proto::Line],
    /// Whether the frames were folded.
    pub is_folded: bool,
}

/// Reads and validates a pprof protobuf (already inflated and passed by the
/// wire scan), applying [`crate::Profile::validate`]'s checks in its order.
/// `tables`: the wire scan's counts, to reserve the tables once.
pub(crate) fn parse(
    protobuf: &[u8],
    limits: &DecodeLimits,
    tables: TableCounts,
) -> Result<FlatProfile, PprofError> {
    let parts = read::profile(protobuf, tables)?;
    validate(parts, limits)
}

fn validate(parts: Parts<'_>, limits: &DecodeLimits) -> Result<FlatProfile, PprofError> {
    if parts.strings.first().is_none_or(|first| !first.is_empty()) {
        return Err(PprofError::FirstStringNotEmpty);
    }
    if let Some(longest) = parts
        .strings
        .iter()
        .map(|s| s.len())
        .max()
        .filter(|&l| l > limits.max_string_bytes)
    {
        return Err(PprofError::LimitExceeded {
            what: "bytes in one string",
            count: longest,
            limit: limits.max_string_bytes,
        });
    }
    let total: usize = parts.strings.iter().map(|s| s.len()).sum();
    let mut string_data = String::with_capacity(total);
    let mut string_ends = Vec::with_capacity(parts.strings.len());
    for bytes in &parts.strings {
        // NB: invalid UTF-8 occurs in real profiles; replacing it keeps the
        // profile. `from_utf8` first: it checks ASCII a word at a time, where
        // the lossy path walks every byte (1.6 % of a decode's CPU).
        match std::str::from_utf8(bytes) {
            Ok(valid) => string_data.push_str(valid),
            Err(_) => string_data.push_str(&String::from_utf8_lossy(bytes)),
        }
        string_ends.push(string_data.len());
    }
    let strings = string_ends.len();

    if parts.sample_types.is_empty() {
        return Err(PprofError::NoSampleTypes);
    }
    check_limit(
        "sample types",
        parts.sample_types.len(),
        limits.max_sample_types,
    )?;
    check_limit("samples", parts.samples.len(), limits.max_samples)?;
    for value_type in parts.sample_types.iter().chain(parts.period_type.iter()) {
        check_string(strings, "sample_type.type", value_type.r#type)?;
        check_string(strings, "sample_type.unit", value_type.unit)?;
    }
    for &comment in &parts.comments {
        check_string(strings, "comment", comment)?;
    }
    check_string(strings, "drop_frames", parts.drop_frames)?;
    check_string(strings, "keep_frames", parts.keep_frames)?;
    check_string(strings, "doc_url", parts.doc_url)?;

    let mapping_index = IdIndex::build("mapping", parts.mappings.iter().map(|m| m.id))?;
    for mapping in &parts.mappings {
        check_string(strings, "mapping.filename", mapping.filename)?;
        check_string(strings, "mapping.build_id", mapping.build_id)?;
    }
    let function_index = IdIndex::build("function", parts.functions.iter().map(|f| f.id))?;
    for function in &parts.functions {
        check_string(strings, "function.name", function.name)?;
        check_string(strings, "function.system_name", function.system_name)?;
        check_string(strings, "function.filename", function.filename)?;
    }
    let location_index = IdIndex::build("location", parts.locations.iter().map(|l| l.id))?;
    let mut location_frames = Vec::with_capacity(parts.locations.len());
    let mut lines_start = 0;
    for location in &parts.locations {
        location_frames.push(frames_of_location(
            location.lines_end.saturating_sub(lines_start),
        ));
        for line in &parts.lines[lines_start..location.lines_end] {
            if function_index.get(line.function_id).is_none() {
                return Err(PprofError::UnknownFunction {
                    location_id: location.id,
                    function_id: line.function_id,
                });
            }
        }
        lines_start = location.lines_end;
    }

    let sample_types = parts.sample_types.len();
    let mut positions = Vec::new();
    let mut start = SampleEnds {
        location_ids: 0,
        values: 0,
        labels: 0,
    };
    for (sample_index, end) in parts.samples.iter().enumerate() {
        let values = end.values - start.values;
        if values != sample_types {
            return Err(PprofError::ValueCountMismatch {
                sample_index,
                values,
                sample_types,
            });
        }
        let location_ids = &parts.location_ids[start.location_ids..end.location_ids];
        let labels = &parts.labels[start.labels..end.labels];
        check_limit(
            "frames in one stack",
            location_ids.len(),
            limits.max_stack_depth,
        )?;
        check_limit(
            "labels on one sample",
            labels.len(),
            limits.max_labels_per_sample,
        )?;
        positions.clear();
        for &location_id in location_ids {
            let Some(position) = location_index.get(location_id) else {
                return Err(PprofError::UnknownLocation {
                    sample_index,
                    location_id,
                });
            };
            positions.push(position);
        }
        check_expanded_depth(&positions, &location_frames, limits.max_stack_depth)?;
        for label in labels {
            check_string(strings, "label.key", label.key)?;
            check_string(strings, "label.str", label.str)?;
            check_string(strings, "label.num_unit", label.num_unit)?;
        }
        start = *end;
    }

    Ok(FlatProfile {
        string_data,
        string_ends,
        sample_types: parts.sample_types,
        samples: parts.samples,
        location_ids: parts.location_ids,
        values: parts.values,
        labels: parts.labels,
        mappings: parts.mappings,
        mapping_index,
        locations: parts.locations,
        lines: parts.lines,
        location_index,
        functions: parts.functions,
        function_index,
        drop_frames: parts.drop_frames,
        keep_frames: parts.keep_frames,
        time_nanos: parts.time_nanos,
        duration_nanos: parts.duration_nanos,
        period_type: parts.period_type,
        period: parts.period,
        comments: parts.comments,
        default_sample_type: parts.default_sample_type,
        doc_url: parts.doc_url,
    })
}

impl FlatProfile {
    /// The string at `index`; validation guarantees it exists.
    pub fn string(&self, index: i64) -> &str {
        let Some(i) = usize::try_from(index).ok() else {
            return "";
        };
        let Some(&end) = self.string_ends.get(i) else {
            return "";
        };
        let start = i
            .checked_sub(1)
            .and_then(|p| self.string_ends.get(p))
            .copied()
            .unwrap_or(0);
        self.string_data.get(start..end).unwrap_or("")
    }

    /// Number of strings, index 0 being `""`.
    pub fn string_count(&self) -> usize {
        self.string_ends.len()
    }

    /// The profile's sample types, one per value in each sample.
    pub fn sample_types(&self) -> &[proto::ValueType] {
        &self.sample_types
    }

    /// Number of samples.
    pub fn sample_count(&self) -> usize {
        self.samples.len()
    }

    /// The sample at position `index` (empty lists past the end).
    pub fn sample(&self, index: usize) -> SampleRef<'_> {
        let start = index
            .checked_sub(1)
            .and_then(|p| self.samples.get(p))
            .copied()
            .unwrap_or(SampleEnds {
                location_ids: 0,
                values: 0,
                labels: 0,
            });
        let end = self.samples.get(index).copied().unwrap_or(start);
        SampleRef {
            location_ids: self
                .location_ids
                .get(start.location_ids..end.location_ids)
                .unwrap_or(&[]),
            values: self.values.get(start.values..end.values).unwrap_or(&[]),
            labels: self.labels.get(start.labels..end.labels).unwrap_or(&[]),
        }
    }

    /// Number of locations.
    pub fn location_count(&self) -> usize {
        self.locations.len()
    }

    /// The location at table position `position`.
    pub fn location_at(&self, position: usize) -> Option<LocationRef<'_>> {
        let entry = self.locations.get(position)?;
        let start = position
            .checked_sub(1)
            .and_then(|p| self.locations.get(p))
            .map_or(0, |previous| previous.lines_end);
        Some(LocationRef {
            id: entry.id,
            mapping_id: entry.mapping_id,
            address: entry.address,
            lines: self.lines.get(start..entry.lines_end).unwrap_or(&[]),
            is_folded: entry.is_folded,
        })
    }

    /// The table position of location `id`; every id a sample holds resolves.
    pub fn location_position(&self, id: u64) -> Option<usize> {
        self.location_index.get(id)
    }

    /// All functions, in table order.
    pub fn functions(&self) -> &[proto::Function] {
        &self.functions
    }

    /// The table position of function `id`; every id a line holds resolves.
    pub fn function_position(&self, id: u64) -> Option<usize> {
        self.function_index.get(id)
    }

    /// Looks a mapping up by id; `None` for id 0 or a dangling id.
    pub fn mapping(&self, id: u64) -> Option<&proto::Mapping> {
        self.mapping_index
            .get(id)
            .and_then(|i| self.mappings.get(i))
    }

    /// Wall time of collection, ns since the epoch (0 if unset).
    pub fn time_nanos(&self) -> i64 {
        self.time_nanos
    }

    /// How long the profile covers, in ns (0 for point-in-time profiles).
    pub fn duration_nanos(&self) -> i64 {
        self.duration_nanos
    }

    /// The kind of event between samples, if declared.
    pub fn period_type(&self) -> Option<&proto::ValueType> {
        self.period_type.as_ref()
    }

    /// The whole profile as a prost message (strings as validation left
    /// them), for a caller that edits or re-encodes it.
    pub fn to_message(&self) -> proto::Profile {
        proto::Profile {
            sample_type: self.sample_types.clone(),
            sample: (0..self.samples.len())
                .map(|i| {
                    let sample = self.sample(i);
                    proto::Sample {
                        location_id: sample.location_ids.to_vec(),
                        value: sample.values.to_vec(),
                        label: sample.labels.to_vec(),
                    }
                })
                .collect(),
            mapping: self.mappings.clone(),
            location: (0..self.locations.len())
                .filter_map(|p| self.location_at(p))
                .map(|l| proto::Location {
                    id: l.id,
                    mapping_id: l.mapping_id,
                    address: l.address,
                    line: l.lines.to_vec(),
                    is_folded: l.is_folded,
                })
                .collect(),
            function: self.functions.clone(),
            string_table: (0..self.string_ends.len())
                .map(|i| self.string(i as i64).as_bytes().to_vec())
                .collect(),
            drop_frames: self.drop_frames,
            keep_frames: self.keep_frames,
            time_nanos: self.time_nanos,
            duration_nanos: self.duration_nanos,
            period_type: self.period_type,
            period: self.period,
            comment: self.comments.clone(),
            default_sample_type: self.default_sample_type,
            doc_url: self.doc_url,
        }
    }
}
