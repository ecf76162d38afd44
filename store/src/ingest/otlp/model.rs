//! The revision-independent form of an OTLP profiles export, and its
//! conversion into decoded profiles with series labels.

use std::collections::HashMap;

use kiln_contract::sample_labels::{SPAN_ID, TRACE_ID};
use kiln_engine::model::NAME_LABEL;
use kiln_pprof::{DecodeLimits, FunctionSpec, LabelValue, MappingSpec, ProfileBuilder};
use kiln_storage::StorageError;
use prost::Message;

use super::{OtlpError, OtlpLimits};
use crate::config::Limits;
use crate::error::ApiError;
use crate::ingest::pyroscope::Reserve;
use crate::ingest::upload::{ProfileUpload, SERVICE_NAME_LABEL, checked_labels};

/// A decoded export request; every index has been checked against its table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// The shared dictionary.
    pub dictionary: Dictionary,
    /// Profiles grouped by resource and scope.
    pub resources: Vec<ResourceProfiles>,
}

/// The shared lookup tables (indices into `strings` are `i32` as on the wire).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dictionary {
    /// The string table.
    pub strings: Vec<String>,
    /// Functions.
    pub functions: Vec<Function>,
    /// Mappings.
    pub mappings: Vec<Mapping>,
    /// Locations.
    pub locations: Vec<Location>,
    /// Attributes with their keys and values resolved.
    pub attributes: Vec<Attribute>,
    /// Links from samples to the trace spans they ran in.
    pub links: Vec<SpanLink>,
    /// Every stack's location indices, end to end; a sample refers to its
    /// stack's range, shared by every sample of that stack.
    pub stack_locations: Vec<i32>,
}

impl Dictionary {
    /// The location indices of `sample`'s stack, leaf first.
    pub fn stack(&self, sample: &Sample) -> &[i32] {
        self.stack_locations
            .get(sample.stack.clone())
            .unwrap_or_default()
    }
}

/// A function; names are string-table indices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Function {
    /// Display name.
    pub name: i32,
    /// System (mangled) name.
    pub system_name: i32,
    /// Source file.
    pub filename: i32,
    /// First line.
    pub start_line: i64,
}

/// A mapped binary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mapping {
    /// Start address.
    pub memory_start: u64,
    /// End address.
    pub memory_limit: u64,
    /// File offset of `memory_start`.
    pub file_offset: u64,
    /// File name (string index).
    pub filename: i32,
    /// The GNU build id its attributes name
    /// (`process.executable.build_id.gnu`), lowercase hex; empty when
    /// they name none. The store symbolizes the frames of unnamed
    /// locations in it at query time by this id.
    pub build_id: String,
}

/// The attribute OpenTelemetry's semantic conventions give a mapping's
/// GNU build id under.
pub const BUILD_ID_GNU_ATTRIBUTE: &str = "process.executable.build_id.gnu";

/// The GNU build id among a mapping's attributes: the text of the first
/// `process.executable.build_id.gnu` that is 2 to 128 hex digits, in
/// lowercase; empty when there is none. Indices outside the table and
/// values of another form are passed over: the id only lets the store
/// name frames later, and its absence refuses nothing.
pub fn mapping_build_id(indices: &[i32], attributes: &[Attribute]) -> String {
    indices
        .iter()
        .filter_map(|&i| usize::try_from(i).ok().and_then(|i| attributes.get(i)))
        .filter(|a| a.key == BUILD_ID_GNU_ATTRIBUTE)
        .find_map(|a| match &a.value {
            AttributeValue::Text(text)
                if (2..=128).contains(&text.len())
                    && text.len().is_multiple_of(2)
                    && text.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                Some(text.to_ascii_lowercase())
            }
            _ => None,
        })
        .unwrap_or_default()
}

/// A code location: mapping index (0 = none), address, inlined lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Location {
    /// Index into the mapping table; 0 means unknown.
    pub mapping: i32,
    /// Instruction address.
    pub address: u64,
    /// (function index, line), innermost first.
    pub lines: Vec<(i32, i64)>,
}

/// A sample's link to the trace span it ran in, its ids as lowercase hex
/// (OpenTelemetry's text form); an id that was not sent is empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpanLink {
    /// 32 hex digits, or empty.
    pub trace_id: String,
    /// 16 hex digits, or empty.
    pub span_id: String,
}

impl SpanLink {
    /// The link of a `link_table` entry: each id empty, all zero (OTLP's
    /// "no id") or of its length; anything else is refused.
    pub fn from_wire(trace_id: &[u8], span_id: &[u8]) -> Result<Self, OtlpError> {
        Ok(Self {
            trace_id: hex_id("link.trace_id", trace_id, 16)?,
            span_id: hex_id("link.span_id", span_id, 8)?,
        })
    }
}

fn hex_id(field: &'static str, bytes: &[u8], expected: usize) -> Result<String, OtlpError> {
    if bytes.iter().all(|&b| b == 0) {
        return Ok(String::new());
    }
    if bytes.len() != expected {
        return Err(OtlpError::BadLink {
            field,
            len: bytes.len(),
            expected,
        });
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The link table entry of a sample's `link_index`: `None` for index 0 of
/// an empty table (a sender that sends no links need not send the table's
/// empty first entry either).
pub(super) fn sample_link(index: i32, links: usize) -> Result<Option<usize>, OtlpError> {
    if index == 0 && links == 0 {
        return Ok(None);
    }
    check_index("sample.link_index", index.into(), "link_table", links).map(Some)
}

/// An attribute value Kiln keeps.
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeValue {
    /// A string (also bools and doubles, as text).
    Text(String),
    /// An integer.
    Int(i64),
    /// Arrays, key/value lists, bytes and unset values: not kept.
    Unsupported,
}

/// One attribute.
#[derive(Debug, Clone, PartialEq)]
pub struct Attribute {
    /// The key.
    pub key: String,
    /// The value.
    pub value: AttributeValue,
}

/// Profiles from one resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResourceProfiles {
    /// Resource attributes.
    pub attributes: Vec<Attribute>,
    /// Per scope.
    pub scopes: Vec<ScopeProfiles>,
}

/// Profiles from one instrumentation scope.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScopeProfiles {
    /// Scope attributes.
    pub attributes: Vec<Attribute>,
    /// The profiles.
    pub profiles: Vec<Profile>,
}

/// One profile: one or more sample types (several only in 1.7).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profile {
    /// (type, unit) string indices, one per value of each sample.
    pub sample_types: Vec<(i32, i32)>,
    /// (type, unit) string indices of the sampling period, if given.
    pub period_type: Option<(i32, i32)>,
    /// The sampling period.
    pub period: i64,
    /// Collection time, unix ns.
    pub time_nanos: i64,
    /// Covered duration, ns.
    pub duration_nanos: i64,
    /// The samples.
    pub samples: Vec<Sample>,
}

/// One sample: a stack and one value per sample type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// Its stack: a range of [`Dictionary::stack_locations`] (see
    /// [`Dictionary::stack`]), checked against the tables.
    pub stack: std::ops::Range<usize>,
    /// One value per sample type.
    pub values: Vec<i64>,
    /// Indices into the attribute table.
    pub attributes: Vec<i32>,
    /// Index into [`Dictionary::links`], when the sample has a link.
    pub link: Option<usize>,
}

/// Checks that `index` is inside a table of `len` entries.
pub(super) fn check_index(
    field: &'static str,
    index: i64,
    table: &'static str,
    len: usize,
) -> Result<usize, OtlpError> {
    usize::try_from(index)
        .ok()
        .filter(|&i| i < len)
        .ok_or(OtlpError::IndexOutOfRange {
            field,
            index,
            table,
            len,
        })
}

/// Checks that every one of `indices` is inside a table of `len` entries.
pub(super) fn check_indices(
    field: &'static str,
    indices: &[i32],
    table: &'static str,
    len: usize,
) -> Result<(), OtlpError> {
    for &index in indices {
        check_index(field, index.into(), table, len)?;
    }
    Ok(())
}

/// The values of one sample from its wire form: explicit values, or one
/// event per timestamp when only timestamps are sent. With both, the counts
/// must agree (1.8+), and the values are what is stored.
pub(super) fn sample_values(
    values: &[i64],
    timestamps: usize,
    sample_types: usize,
    position: (usize, usize),
) -> Result<Vec<i64>, OtlpError> {
    let bad = |message: String| OtlpError::BadSample {
        profile: position.0,
        sample: position.1,
        message,
    };
    if values.is_empty() {
        if timestamps == 0 {
            return Err(bad("neither values nor timestamps are set".to_owned()));
        }
        if sample_types != 1 {
            return Err(bad(format!(
                "timestamps alone cannot fill {sample_types} sample types"
            )));
        }
        return Ok(vec![i64::try_from(timestamps).unwrap_or(i64::MAX)]);
    }
    if sample_types == 1 {
        if timestamps != 0 && timestamps != values.len() {
            return Err(bad(format!(
                "{} values but {timestamps} timestamps",
                values.len()
            )));
        }
        return Ok(vec![values.iter().fold(0i64, |a, v| a.saturating_add(*v))]);
    }
    if values.len() != sample_types {
        return Err(bad(format!(
            "{} values for {sample_types} sample types",
            values.len()
        )));
    }
    Ok(values.to_vec())
}

/// Series label names for well-known OpenTelemetry resource attributes.
const LABEL_RENAMES: [(&str, &str); 7] = [
    ("service.name", SERVICE_NAME_LABEL),
    ("k8s.namespace.name", "namespace"),
    ("k8s.pod.name", "pod"),
    ("container.name", "container"),
    ("k8s.container.name", "container"),
    ("host.name", "node"),
    ("k8s.node.name", "node"),
];

/// OpenTelemetry's default when a resource has no `service.name`.
const UNKNOWN_SERVICE: &str = "unknown_service";

/// A series label name for an attribute key: renamed when well known, else
/// the key with characters outside `[A-Za-z0-9_.]` replaced by `_`.
pub fn label_name_for_attribute(key: &str) -> String {
    if let Some((_, name)) = LABEL_RENAMES.iter().find(|(k, _)| *k == key) {
        return (*name).to_owned();
    }
    sanitized_attribute_key(key)
}

/// `key` with characters outside `[A-Za-z0-9_.]` replaced by `_`, and a
/// `_` in front of a leading digit or dot.
fn sanitized_attribute_key(key: &str) -> String {
    let mut name: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit() || c == '.') || name.is_empty() {
        name.insert(0, '_');
    }
    name
}

fn attribute_text(value: &AttributeValue) -> Option<String> {
    match value {
        AttributeValue::Text(text) => Some(text.clone()),
        AttributeValue::Int(n) => Some(n.to_string()),
        AttributeValue::Unsupported => None,
    }
}

/// Series labels of one resource + scope: attributes renamed, the scope's
/// overriding the resource's, `service_name` defaulted and `__name__` set.
fn series_labels(
    resource: &[Attribute],
    scope: &[Attribute],
    profile_name: &str,
) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = Vec::new();
    let mut set = |name: String, value: String| {
        if name == NAME_LABEL {
            return;
        }
        match labels.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => labels.push((name, value)),
        }
    };
    for attribute in resource.iter().chain(scope) {
        let Some(value) = attribute_text(&attribute.value) else {
            continue;
        };
        let name = label_name_for_attribute(&attribute.key);
        // A well-known attribute keeps its own dotted name beside Kiln's
        // short one, as Pyroscope keeps it, so a selector written for
        // either (`{"k8s.pod.name"="..."}`, `{pod="..."}`) finds it.
        let dotted = sanitized_attribute_key(&attribute.key);
        if dotted != name {
            set(dotted, value.clone());
        }
        set(name, value);
    }
    if !labels.iter().any(|(n, _)| n == SERVICE_NAME_LABEL) {
        labels.push((SERVICE_NAME_LABEL.to_owned(), UNKNOWN_SERVICE.to_owned()));
    }
    labels.push((NAME_LABEL.to_owned(), profile_name.to_owned()));
    labels
}

/// One profile of a batch ready for the store, or why it cannot be stored.
/// A profile the pprof checks refuse is refused alone, as when the store
/// decoded it, so the profiles before it are still stored.
pub type Converted = Result<ProfileUpload, ApiError>;

/// Turns a batch into one upload per profile with samples, each checked by
/// the pprof limits and handed to the store decoded, with its encoding for
/// the store to log. Series labels are checked against `limits` (a bad
/// label set refuses the batch); samples keep string attributes as pprof
/// string labels and integer ones as numeric labels. `reserve` is asked
/// for each profile's memory, which is held until the store has it.
pub fn uploads_from_batch(
    batch: &Batch,
    limits: &Limits,
    otlp_limits: &OtlpLimits,
    decode_limits: &DecodeLimits,
    reserve: Reserve<'_>,
) -> Result<Vec<Converted>, ApiError> {
    let mut uploads = Vec::new();
    let mut profile_index = 0;
    'batch: for resource in &batch.resources {
        for scope in &resource.scopes {
            for profile in &scope.profiles {
                let index = profile_index;
                profile_index += 1;
                if profile.samples.is_empty() {
                    continue;
                }
                if profile.samples.len() > otlp_limits.max_samples {
                    return Err(OtlpError::TooManySamples {
                        profile: index,
                        count: profile.samples.len(),
                        limit: otlp_limits.max_samples,
                    }
                    .into());
                }
                let dictionary = &batch.dictionary;
                let text = |i: i32| dictionary_string(dictionary, i);
                let type_names: Vec<&str> =
                    profile.sample_types.iter().map(|(t, _)| text(*t)).collect();
                let name = crate::ingest::pyroscope::profile_name_for_sample_types(&type_names);
                let labels = checked_labels(
                    index,
                    series_labels(&resource.attributes, &scope.attributes, name),
                    limits,
                )?;
                let pprof = profile_to_pprof(dictionary, profile);
                let encoded = pprof.encode_to_vec();
                let (decoded, decoded_bytes) =
                    match kiln_pprof::validate_message(pprof, decode_limits) {
                        Ok(checked) => checked,
                        Err(source) => {
                            uploads.push(Err(StorageError::InvalidProfile { source }.into()));
                            continue;
                        }
                    };
                if let Err(err) = reserve(decoded_bytes.saturating_add(encoded.len())) {
                    // Out of memory budget: the rest would be refused too.
                    uploads.push(Err(err.into()));
                    break 'batch;
                }
                uploads.push(Ok(ProfileUpload {
                    labels: std::sync::Arc::new(labels),
                    time_ms: None,
                    duration_nanos: None,
                    pprof: encoded.into(),
                    decoded: Some(decoded.into()),
                }));
            }
        }
    }
    if uploads.is_empty() {
        return Err(OtlpError::Empty.into());
    }
    Ok(uploads)
}

/// A string by index; indices were checked when the batch was built.
fn dictionary_string(dictionary: &Dictionary, index: i32) -> &str {
    usize::try_from(index)
        .ok()
        .and_then(|i| dictionary.strings.get(i))
        .map_or("", String::as_str)
}

/// Builds the pprof of one profile, converting only the dictionary entries
/// it references.
fn profile_to_pprof(dictionary: &Dictionary, profile: &Profile) -> kiln_pprof::proto::Profile {
    let text = |i: i32| dictionary_string(dictionary, i);
    let types: Vec<(&str, &str)> = profile
        .sample_types
        .iter()
        .map(|(t, u)| (text(*t), text(*u)))
        .collect();
    let mut builder = ProfileBuilder::new(&types);
    if let Some((kind, unit)) = profile.period_type {
        builder.period(text(kind), text(unit), profile.period);
    }
    builder.time(profile.time_nanos, profile.duration_nanos);
    let mut mapping_ids: HashMap<i32, u64> = HashMap::new();
    let mut function_ids: HashMap<i32, u64> = HashMap::new();
    let mut location_ids: HashMap<i32, u64> = HashMap::new();
    let mut stack: Vec<u64> = Vec::new();
    for sample in &profile.samples {
        stack.clear();
        for &location_index in dictionary.stack(sample) {
            let id = match location_ids.get(&location_index) {
                Some(&id) => id,
                None => {
                    let location = &dictionary.locations[location_index as usize];
                    let mapping_id = if location.mapping > 0 {
                        *mapping_ids.entry(location.mapping).or_insert_with(|| {
                            let m = &dictionary.mappings[location.mapping as usize];
                            builder.mapping(&MappingSpec {
                                memory_start: m.memory_start,
                                memory_limit: m.memory_limit,
                                file_offset: m.file_offset,
                                filename: text(m.filename).to_owned(),
                                build_id: m.build_id.clone(),
                                has_functions: !location.lines.is_empty(),
                            })
                        })
                    } else {
                        0
                    };
                    let lines: Vec<(u64, i64)> = location
                        .lines
                        .iter()
                        .map(|&(function, line)| {
                            let id = *function_ids.entry(function).or_insert_with(|| {
                                let f = &dictionary.functions[function as usize];
                                builder.function(&FunctionSpec {
                                    name: text(f.name).to_owned(),
                                    system_name: text(f.system_name).to_owned(),
                                    filename: text(f.filename).to_owned(),
                                    start_line: f.start_line,
                                })
                            });
                            (id, line)
                        })
                        .collect();
                    let id = builder.location(mapping_id, location.address, &lines);
                    location_ids.insert(location_index, id);
                    id
                }
            };
            stack.push(id);
        }
        let mut labels: Vec<(&str, LabelValue)> = sample
            .attributes
            .iter()
            .filter_map(|&i| dictionary.attributes.get(i as usize))
            .filter_map(|attribute| {
                let value = match &attribute.value {
                    AttributeValue::Text(text) => LabelValue::Str(text.clone()),
                    AttributeValue::Int(value) => LabelValue::Num {
                        value: *value,
                        unit: String::new(),
                    },
                    AttributeValue::Unsupported => return None,
                };
                Some((attribute.key.as_str(), value))
            })
            .collect();
        // The span a sample ran in becomes the per-sample labels that span
        // profiles select on (`kiln_contract::sample_labels`).
        if let Some(link) = sample.link.and_then(|i| dictionary.links.get(i)) {
            for (name, id) in [(SPAN_ID, &link.span_id), (TRACE_ID, &link.trace_id)] {
                if !id.is_empty() {
                    labels.push((name, LabelValue::Str(id.clone())));
                }
            }
        }
        builder.sample(&stack, &sample.values, &labels);
    }
    builder.finish()
}

#[cfg(test)]
mod tests;
