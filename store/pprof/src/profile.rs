//! A pprof profile whose references have all been checked.

use std::collections::HashMap;

use crate::error::PprofError;
use crate::limits::DecodeLimits;
use crate::proto;

/// Maps pprof ids to positions in their table. Producers almost always number
/// entries `index + 1`, which needs no map at all.
#[derive(Debug, Clone)]
pub(crate) enum IdIndex {
    Sequential { len: usize },
    Sparse(HashMap<u64, usize>),
}

impl IdIndex {
    pub(crate) fn build(
        table: &'static str,
        ids: impl ExactSizeIterator<Item = u64> + Clone,
    ) -> Result<Self, PprofError> {
        let len = ids.len();
        if ids
            .clone()
            .enumerate()
            .all(|(index, id)| id == index as u64 + 1)
        {
            return Ok(Self::Sequential { len });
        }
        let mut map = HashMap::with_capacity(len);
        for (index, id) in ids.enumerate() {
            if id == 0 {
                return Err(PprofError::ZeroId { table });
            }
            if map.insert(id, index).is_some() {
                return Err(PprofError::DuplicateId { table, id });
            }
        }
        Ok(Self::Sparse(map))
    }

    pub(crate) fn get(&self, id: u64) -> Option<usize> {
        match self {
            Self::Sequential { len } => {
                let index = usize::try_from(id.checked_sub(1)?).ok()?;
                (index < *len).then_some(index)
            }
            Self::Sparse(map) => map.get(&id).copied(),
        }
    }
}

/// A decoded pprof profile in which every string index, id reference and
/// value count has been checked, so accessors cannot fail.
///
/// Locations that name a missing mapping are tolerated (as `go tool pprof`
/// does) and read as having no mapping.
#[derive(Debug, Clone)]
pub struct Profile {
    raw: proto::Profile,
    strings: Vec<String>,
    mappings: IdIndex,
    locations: IdIndex,
    functions: IdIndex,
}

impl Profile {
    /// Checks `raw` against pprof's rules and `limits`.
    pub fn validate(mut raw: proto::Profile, limits: &DecodeLimits) -> Result<Self, PprofError> {
        let string_bytes = std::mem::take(&mut raw.string_table);
        if string_bytes.first().is_none_or(|first| !first.is_empty()) {
            return Err(PprofError::FirstStringNotEmpty);
        }
        if let Some(longest) = string_bytes
            .iter()
            .map(Vec::len)
            .max()
            .filter(|&l| l > limits.max_string_bytes)
        {
            return Err(PprofError::LimitExceeded {
                what: "bytes in one string",
                count: longest,
                limit: limits.max_string_bytes,
            });
        }
        // NB: invalid UTF-8 occurs in real profiles; replacing it keeps the profile.
        let strings: Vec<String> = string_bytes
            .into_iter()
            .map(|b| {
                String::from_utf8(b)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
            })
            .collect();
        let checker = StringChecker { len: strings.len() };

        if raw.sample_type.is_empty() {
            return Err(PprofError::NoSampleTypes);
        }
        check_limit(
            "sample types",
            raw.sample_type.len(),
            limits.max_sample_types,
        )?;
        check_limit("samples", raw.sample.len(), limits.max_samples)?;
        for value_type in raw.sample_type.iter().chain(raw.period_type.iter()) {
            checker.check("sample_type.type", value_type.r#type)?;
            checker.check("sample_type.unit", value_type.unit)?;
        }
        for &comment in &raw.comment {
            checker.check("comment", comment)?;
        }
        checker.check("drop_frames", raw.drop_frames)?;
        checker.check("keep_frames", raw.keep_frames)?;
        checker.check("doc_url", raw.doc_url)?;

        let mappings = IdIndex::build("mapping", raw.mapping.iter().map(|m| m.id))?;
        for mapping in &raw.mapping {
            checker.check("mapping.filename", mapping.filename)?;
            checker.check("mapping.build_id", mapping.build_id)?;
        }
        let functions = IdIndex::build("function", raw.function.iter().map(|f| f.id))?;
        for function in &raw.function {
            checker.check("function.name", function.name)?;
            checker.check("function.system_name", function.system_name)?;
            checker.check("function.filename", function.filename)?;
        }
        let locations = IdIndex::build("location", raw.location.iter().map(|l| l.id))?;
        let location_frames: Vec<usize> = raw
            .location
            .iter()
            .map(|l| frames_of_location(l.line.len()))
            .collect();
        for location in &raw.location {
            for line in &location.line {
                if functions.get(line.function_id).is_none() {
                    return Err(PprofError::UnknownFunction {
                        location_id: location.id,
                        function_id: line.function_id,
                    });
                }
            }
        }

        let sample_types = raw.sample_type.len();
        for (sample_index, sample) in raw.sample.iter().enumerate() {
            if sample.value.len() != sample_types {
                return Err(PprofError::ValueCountMismatch {
                    sample_index,
                    values: sample.value.len(),
                    sample_types,
                });
            }
            check_limit(
                "frames in one stack",
                sample.location_id.len(),
                limits.max_stack_depth,
            )?;
            check_limit(
                "labels on one sample",
                sample.label.len(),
                limits.max_labels_per_sample,
            )?;
            let mut positions = Vec::with_capacity(sample.location_id.len());
            for &location_id in &sample.location_id {
                let Some(position) = locations.get(location_id) else {
                    return Err(PprofError::UnknownLocation {
                        sample_index,
                        location_id,
                    });
                };
                positions.push(position);
            }
            check_expanded_depth(&positions, &location_frames, limits.max_stack_depth)?;
            for label in &sample.label {
                checker.check("label.key", label.key)?;
                checker.check("label.str", label.str)?;
                checker.check("label.num_unit", label.num_unit)?;
            }
        }

        Ok(Self {
            raw,
            strings,
            mappings,
            locations,
            functions,
        })
    }

    /// Returns the string at `index`; validation guarantees it exists.
    pub fn string(&self, index: i64) -> &str {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.strings.get(i))
            .map_or("", String::as_str)
    }

    /// The whole string table, index 0 being `""`.
    pub fn strings(&self) -> &[String] {
        &self.strings
    }

    /// The profile's sample types, one per value in each sample.
    pub fn sample_types(&self) -> &[proto::ValueType] {
        &self.raw.sample_type
    }

    /// The samples. Their location ids and value counts are valid.
    pub fn samples(&self) -> &[proto::Sample] {
        &self.raw.sample
    }

    /// Looks a location up by id; every id a sample holds resolves.
    pub fn location(&self, id: u64) -> Option<&proto::Location> {
        self.locations
            .get(id)
            .and_then(|i| self.raw.location.get(i))
    }

    /// The table position of location `id`; every id a sample holds resolves.
    pub fn location_position(&self, id: u64) -> Option<usize> {
        self.locations.get(id)
    }

    /// The table position of function `id`; every id a line holds resolves.
    pub fn function_position(&self, id: u64) -> Option<usize> {
        self.functions.get(id)
    }

    /// Looks a function up by id; every id a line holds resolves.
    pub fn function(&self, id: u64) -> Option<&proto::Function> {
        self.functions
            .get(id)
            .and_then(|i| self.raw.function.get(i))
    }

    /// Looks a mapping up by id; `None` for id 0 or a dangling id.
    pub fn mapping(&self, id: u64) -> Option<&proto::Mapping> {
        self.mappings.get(id).and_then(|i| self.raw.mapping.get(i))
    }

    /// All mappings, in table order.
    pub fn mappings(&self) -> &[proto::Mapping] {
        &self.raw.mapping
    }

    /// All locations, in table order.
    pub fn locations(&self) -> &[proto::Location] {
        &self.raw.location
    }

    /// All functions, in table order.
    pub fn functions(&self) -> &[proto::Function] {
        &self.raw.function
    }

    /// Wall time at which the profile was collected, in nanoseconds since the epoch (0 if unset).
    pub fn time_nanos(&self) -> i64 {
        self.raw.time_nanos
    }

    /// How long the profile covers, in nanoseconds (0 for point-in-time profiles).
    pub fn duration_nanos(&self) -> i64 {
        self.raw.duration_nanos
    }

    /// The kind of event between samples, if declared.
    pub fn period_type(&self) -> Option<&proto::ValueType> {
        self.raw.period_type.as_ref()
    }

    /// Events between samples; 0 is common and means unknown.
    pub fn period(&self) -> i64 {
        self.raw.period
    }

    /// Index of the default sample type's name in the string table (0 if unset).
    pub fn default_sample_type(&self) -> i64 {
        self.raw.default_sample_type
    }

    /// Comment string indices.
    pub fn comments(&self) -> &[i64] {
        &self.raw.comment
    }

    /// The underlying protobuf message, with an empty string table (see [`Profile::strings`]).
    pub fn raw(&self) -> &proto::Profile {
        &self.raw
    }

    /// The whole protobuf message back, string table included, to edit
    /// without decoding the bytes again (the strings move, nothing is
    /// copied). Invalid UTF-8 stays replaced as validation left it.
    pub fn into_raw(self) -> proto::Profile {
        let mut raw = self.raw;
        raw.string_table = self.strings.into_iter().map(String::into_bytes).collect();
        raw
    }
}

struct StringChecker {
    len: usize,
}

impl StringChecker {
    fn check(&self, field: &'static str, index: i64) -> Result<(), PprofError> {
        check_string(self.len, field, index)
    }
}

/// Checks that `index` is within a string table of `len` entries.
pub(crate) fn check_string(len: usize, field: &'static str, index: i64) -> Result<(), PprofError> {
    match usize::try_from(index) {
        Ok(i) if i < len => Ok(()),
        _ => Err(PprofError::StringIndexOutOfRange { field, index, len }),
    }
}

/// Frames a location with `lines` lines unwinds into: one per inlined
/// line, or one (named by its address) when it has none.
pub(crate) fn frames_of_location(lines: usize) -> usize {
    lines.max(1)
}

/// Refuses a stack whose frames, once every location's inlined lines are
/// unwound, are more than `limit`.
///
/// NB: the locations of one stack and the lines of one location are each
/// capped at `limit`, but not their product: one location holding 4096
/// inlined lines, repeated 4096 times in one sample, is 30 KB on the wire
/// and 16.7 million frames in every flame graph, diff and folded export of
/// its range afterwards. Checking the product here gives such a stack the
/// same depth limit as any other at ingest, on every path that decodes
/// pprof. `positions` are table positions into `frames_per_location`.
pub(crate) fn check_expanded_depth(
    positions: &[usize],
    frames_per_location: &[usize],
    limit: usize,
) -> Result<(), PprofError> {
    let mut frames = 0usize;
    for &position in positions {
        frames = frames.saturating_add(frames_per_location.get(position).copied().unwrap_or(1));
    }
    check_limit(EXPANDED_FRAMES, frames, limit)
}

/// What [`check_expanded_depth`] names in its error.
pub(crate) const EXPANDED_FRAMES: &str = "frames in one stack with inlined lines unwound";

pub(crate) fn check_limit(
    what: &'static str,
    count: usize,
    limit: usize,
) -> Result<(), PprofError> {
    if count > limit {
        return Err(PprofError::LimitExceeded { what, count, limit });
    }
    Ok(())
}
