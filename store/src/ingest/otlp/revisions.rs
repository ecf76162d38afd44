//! Decoding an export request as each known `v1development` wire layout,
//! and choosing among the layouts that fit.

use std::ops::Range;

use kiln_api::kiln::otlp::{v1_8, v1_9, v1_10};
use kiln_api::opentelemetry::proto::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;

use super::model::{
    Attribute, AttributeValue, Batch, Dictionary, Function, Location, Mapping, Profile,
    ResourceProfiles, Sample, ScopeProfiles, SpanLink, check_index, check_indices,
    mapping_build_id, sample_link, sample_values,
};
use super::{OtlpError, OtlpLimits, wire};

mod v1_7_layout;
use v1_7_layout::from_v1_7;

/// A wire layout of `opentelemetry.proto.profiles.v1development`, named by
/// the first opentelemetry-proto release that used it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Revision {
    /// 1.7: dictionary in the request, samples slice `Profile.location_indices`.
    V1_7,
    /// 1.8: stack table, one sample type, KeyValueAndUnit attributes.
    V1_8,
    /// 1.9: `Profile.comment_strindices` dropped, later fields renumbered.
    V1_9,
    /// 1.10 and 1.11: Sample fields renumbered (`values` is field 4).
    V1_10,
}

impl Revision {
    /// Every layout, oldest first.
    pub const ALL: [Revision; 4] = [Self::V1_7, Self::V1_8, Self::V1_9, Self::V1_10];

    /// The releases using this layout, for errors, logs and metric labels.
    pub fn label(self) -> &'static str {
        match self {
            Self::V1_7 => "1.7",
            Self::V1_8 => "1.8",
            Self::V1_9 => "1.9",
            Self::V1_10 => "1.10-1.11",
        }
    }
}

/// A request decoded, with every layout that reads it the same way.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedExport {
    /// The contents.
    pub batch: Batch,
    /// The layouts that decode to exactly `batch`, oldest first (more than
    /// one when the fields that differ between them are all unset).
    pub revisions: Vec<Revision>,
}

impl DecodedExport {
    /// A metric label naming the matching layouts, e.g. `1.8+1.9+1.10-1.11`.
    pub fn revision_label(&self) -> String {
        let labels: Vec<&str> = self.revisions.iter().map(|r| r.label()).collect();
        labels.join("+")
    }
}

/// Decodes `bytes` as every layout; see the module docs of [`super`].
pub fn decode_export(bytes: &[u8], limits: &OtlpLimits) -> Result<DecodedExport, OtlpError> {
    match decode_export_reserving(bytes, limits, |_| Ok::<(), std::convert::Infallible>(())) {
        Ok(result) => result,
        Err(never) => match never {},
    }
}

/// [`decode_export`], asking `reserve` for the memory decoding takes before
/// anything is decoded: each layout is first counted on the wire, where
/// tables, stacks and samples over their limits are refused, and then
/// twice the largest decoded size is reserved (the request being decoded
/// and the first batch kept). When `reserve` refuses, nothing is decoded
/// and its error is the outer `Err`.
pub fn decode_export_reserving<E>(
    bytes: &[u8],
    limits: &OtlpLimits,
    mut reserve: impl FnMut(usize) -> Result<(), E>,
) -> Result<Result<DecodedExport, OtlpError>, E> {
    // The validation error of the newest layout whose wire format fits: an
    // out-of-range index or a bad sample in a body that is otherwise that
    // layout is reported as such, not as an unknown revision.
    let mut invalid: Vec<(Revision, OtlpError)> = Vec::new();
    let mut fitting: Vec<Revision> = Vec::new();
    let mut largest = 0usize;
    for revision in Revision::ALL {
        match wire::scan(bytes, revision, limits) {
            Ok(decoded_bytes) => {
                largest = largest.max(decoded_bytes);
                fitting.push(revision);
            }
            Err(error) => invalid.push((revision, error)),
        }
    }
    if !fitting.is_empty() {
        reserve(largest.saturating_mul(2))?;
    }
    // Only the first fitting batch is kept; later ones are compared with it
    // and dropped, so at most two decoded copies exist at a time.
    let mut first: Option<Batch> = None;
    let mut revisions: Vec<Revision> = Vec::new();
    let mut differs = false;
    let mut refusals: Vec<String> = Vec::new();
    for revision in fitting {
        match decode_as(revision, bytes, limits) {
            Ok(batch) => {
                match &first {
                    None => first = Some(batch),
                    Some(kept) => differs |= *kept != batch,
                }
                revisions.push(revision);
            }
            Err(DecodeFailure::Invalid(error)) => invalid.push((revision, error)),
            Err(DecodeFailure::Wire(message)) => {
                refusals.push(format!("{}: {message}", revision.label()));
            }
        }
    }
    let Some(batch) = first else {
        let newest = invalid.into_iter().max_by_key(|(revision, _)| *revision);
        return Ok(Err(match newest {
            Some((_, error)) => error,
            None => OtlpError::UnsupportedRevision {
                details: refusals.join("; "),
            },
        }));
    };
    if differs {
        let names: Vec<&str> = revisions.iter().map(|r| r.label()).collect();
        return Ok(Err(OtlpError::Ambiguous {
            revisions: names.join(", "),
        }));
    }
    Ok(Ok(DecodedExport { batch, revisions }))
}

/// Why one layout does not fit.
enum DecodeFailure {
    /// The protobuf does not decode with this layout's field types.
    Wire(String),
    /// It decodes but is invalid under this layout.
    Invalid(OtlpError),
}

impl From<OtlpError> for DecodeFailure {
    fn from(error: OtlpError) -> Self {
        Self::Invalid(error)
    }
}

fn decode_message<M: Message + Default>(bytes: &[u8]) -> Result<M, DecodeFailure> {
    M::decode(bytes).map_err(|e| DecodeFailure::Wire(e.to_string()))
}

/// Decodes `$bytes` as the 1.8+ layout `$layout` and assembles its batch.
/// The 1.8, 1.9 and 1.10 messages are distinct generated types nested the
/// same way; only the name of the samples field and the `Sample` type
/// differ, so one body written as a macro reads all three.
macro_rules! decode_1_8_plus {
    ($bytes:expr, $limits:expr, $layout:ident, $samples:ident, $read_sample:path) => {{
        let limits: &OtlpLimits = $limits;
        let request: $layout::ExportRequest = decode_message($bytes)?;
        let (dictionary, stacks) = dictionary_v1_8(request.dictionary.unwrap_or_default(), limits)?;
        let mut resources = Vec::with_capacity(request.resource_profiles.len());
        let mut profile_index = 0;
        for r in request.resource_profiles {
            let mut scopes = Vec::with_capacity(r.scope_profiles.len());
            for s in r.scope_profiles {
                let mut profiles = Vec::with_capacity(s.profiles.len());
                for p in s.profiles {
                    // Counted before any sample is read.
                    check_sample_count(profile_index, p.$samples.len(), limits)?;
                    profile_index += 1;
                    profiles.push(WireProfile {
                        sample_type: p.sample_type,
                        period_type: p.period_type,
                        period: p.period,
                        time_unix_nano: p.time_unix_nano,
                        duration_nano: p.duration_nano,
                        samples: p.$samples.iter().map($read_sample).collect(),
                    });
                }
                scopes.push((s.scope.map(|s| s.attributes), profiles));
            }
            resources.push((r.resource.map(|r| r.attributes), scopes));
        }
        Ok(assemble(dictionary, &stacks, resources)?)
    }};
}

/// Refuses profile `profile` when it has more than the allowed samples.
fn check_sample_count(profile: usize, count: usize, limits: &OtlpLimits) -> Result<(), OtlpError> {
    if count > limits.max_samples {
        return Err(OtlpError::TooManySamples {
            profile,
            count,
            limit: limits.max_samples,
        });
    }
    Ok(())
}

/// Refuses a stack of `count` locations deeper than the store keeps.
pub(super) fn check_stack_depth(
    field: &'static str,
    count: usize,
    limits: &OtlpLimits,
) -> Result<(), OtlpError> {
    if count > limits.max_stack_depth {
        return Err(OtlpError::StackTooDeep {
            field,
            count,
            limit: limits.max_stack_depth,
        });
    }
    Ok(())
}

fn decode_as(
    revision: Revision,
    bytes: &[u8],
    limits: &OtlpLimits,
) -> Result<Batch, DecodeFailure> {
    match revision {
        Revision::V1_7 => Ok(from_v1_7(decode_message(bytes)?, limits)?),
        Revision::V1_8 => decode_1_8_plus!(bytes, limits, v1_8, sample, WireSample::from_v1_8),
        Revision::V1_9 => decode_1_8_plus!(bytes, limits, v1_9, samples, WireSample::from_v1_8),
        Revision::V1_10 => decode_1_8_plus!(bytes, limits, v1_10, samples, WireSample::from_v1_10),
    }
}

/// A 1.8+ profile with only what Kiln reads (the same in 1.8, 1.9 and 1.10).
struct WireProfile {
    sample_type: Option<v1_8::ValueType>,
    period_type: Option<v1_8::ValueType>,
    period: i64,
    time_unix_nano: u64,
    duration_nano: u64,
    samples: Vec<WireSample>,
}

/// A 1.8+ sample, whichever field numbers carried it.
struct WireSample {
    stack_index: i32,
    values: Vec<i64>,
    timestamps: usize,
    attributes: Vec<i32>,
    link_index: i32,
}

impl WireSample {
    fn from_v1_8(s: &v1_8::Sample) -> Self {
        Self {
            stack_index: s.stack_index,
            values: s.values.clone(),
            timestamps: s.timestamps_unix_nano.len(),
            attributes: s.attribute_indices.clone(),
            link_index: s.link_index,
        }
    }

    fn from_v1_10(s: &v1_10::Sample) -> Self {
        Self {
            stack_index: s.stack_index,
            values: s.values.clone(),
            timestamps: s.timestamps_unix_nano.len(),
            attributes: s.attribute_indices.clone(),
            link_index: s.link_index,
        }
    }
}

type WireResource = (Option<Vec<KeyValue>>, Vec<WireScope>);
type WireScope = (Option<Vec<KeyValue>>, Vec<WireProfile>);

/// Builds the batch of a 1.8+ request, checking every index. A sample
/// refers to its stack's locations in the dictionary; they are never
/// copied per sample.
fn assemble(
    dictionary: Dictionary,
    stacks: &[Range<usize>],
    resources: Vec<WireResource>,
) -> Result<Batch, OtlpError> {
    let strings = dictionary.strings.len();
    let value_type = |field, vt: &v1_8::ValueType| -> Result<(i32, i32), OtlpError> {
        check_index(field, vt.type_strindex.into(), "string_table", strings)?;
        check_index(field, vt.unit_strindex.into(), "string_table", strings)?;
        Ok((vt.type_strindex, vt.unit_strindex))
    };
    let mut batch_resources = Vec::new();
    let mut profile_index = 0;
    for (resource_attributes, scopes) in resources {
        let mut batch_scopes = Vec::new();
        for (scope_attributes, profiles) in scopes {
            let mut batch_profiles = Vec::new();
            for profile in profiles {
                let sample_type = value_type(
                    "profile.sample_type",
                    &profile.sample_type.unwrap_or_default(),
                )?;
                let period_type = profile
                    .period_type
                    .as_ref()
                    .map(|vt| value_type("profile.period_type", vt))
                    .transpose()?;
                let mut samples = Vec::with_capacity(profile.samples.len());
                for (sample_index, sample) in profile.samples.into_iter().enumerate() {
                    let stack = check_index(
                        "sample.stack_index",
                        sample.stack_index.into(),
                        "stack_table",
                        stacks.len(),
                    )?;
                    check_indices(
                        "sample.attribute_indices",
                        &sample.attributes,
                        "attribute_table",
                        dictionary.attributes.len(),
                    )?;
                    samples.push(Sample {
                        stack: stacks[stack].clone(),
                        values: sample_values(
                            &sample.values,
                            sample.timestamps,
                            1,
                            (profile_index, sample_index),
                        )?,
                        attributes: sample.attributes,
                        link: sample_link(sample.link_index, dictionary.links.len())?,
                    });
                }
                batch_profiles.push(Profile {
                    sample_types: vec![sample_type],
                    period_type,
                    period: profile.period,
                    time_nanos: i64::try_from(profile.time_unix_nano).unwrap_or(i64::MAX),
                    duration_nanos: i64::try_from(profile.duration_nano).unwrap_or(i64::MAX),
                    samples,
                });
                profile_index += 1;
            }
            batch_scopes.push(ScopeProfiles {
                attributes: attributes(&scope_attributes.unwrap_or_default(), &dictionary.strings)?,
                profiles: batch_profiles,
            });
        }
        batch_resources.push(ResourceProfiles {
            attributes: attributes(
                &resource_attributes.unwrap_or_default(),
                &dictionary.strings,
            )?,
            scopes: batch_scopes,
        });
    }
    Ok(Batch {
        dictionary,
        resources: batch_resources,
    })
}

/// Resolves an attribute value; strings may be string-table references (1.10+).
fn attribute_value(
    value: Option<&AnyValue>,
    strings: &[String],
) -> Result<AttributeValue, OtlpError> {
    Ok(match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => AttributeValue::Text(s.clone()),
        Some(any_value::Value::StringValueStrindex(i)) => {
            let i = check_index(
                "string_value_strindex",
                (*i).into(),
                "string_table",
                strings.len(),
            )?;
            AttributeValue::Text(strings[i].clone())
        }
        Some(any_value::Value::BoolValue(b)) => AttributeValue::Text(b.to_string()),
        Some(any_value::Value::IntValue(n)) => AttributeValue::Int(*n),
        Some(any_value::Value::DoubleValue(d)) => AttributeValue::Text(d.to_string()),
        _ => AttributeValue::Unsupported,
    })
}

/// Resource or scope attributes; keys may be string-table references (1.10+).
fn attributes(pairs: &[KeyValue], strings: &[String]) -> Result<Vec<Attribute>, OtlpError> {
    pairs
        .iter()
        .map(|pair| {
            let key = if pair.key.is_empty() && pair.key_strindex != 0 {
                let i = check_index(
                    "key_strindex",
                    pair.key_strindex.into(),
                    "string_table",
                    strings.len(),
                )?;
                strings[i].clone()
            } else {
                pair.key.clone()
            };
            Ok(Attribute {
                key,
                value: attribute_value(pair.value.as_ref(), strings)?,
            })
        })
        .collect()
}

/// Checks the shared tables (1.8 layout, also 1.9 and 1.10) and resolves
/// attributes; returns each stack's range of the dictionary's stack
/// locations, every stack's depth checked as it is read.
fn dictionary_v1_8(
    d: v1_8::ProfilesDictionary,
    limits: &OtlpLimits,
) -> Result<(Dictionary, Vec<Range<usize>>), OtlpError> {
    let strings = d.string_table;
    let s = strings.len();
    let functions = d
        .function_table
        .iter()
        .map(|f| {
            checked_function(
                Function {
                    name: f.name_strindex,
                    system_name: f.system_name_strindex,
                    filename: f.filename_strindex,
                    start_line: f.start_line,
                },
                s,
            )
        })
        .collect::<Result<Vec<_>, OtlpError>>()?;
    let attributes = d
        .attribute_table
        .iter()
        .map(|a| {
            let key = check_index(
                "attribute.key_strindex",
                a.key_strindex.into(),
                "string_table",
                s,
            )?;
            Ok(Attribute {
                key: strings[key].clone(),
                value: attribute_value(a.value.as_ref(), &strings)?,
            })
        })
        .collect::<Result<Vec<_>, OtlpError>>()?;
    let mappings = d
        .mapping_table
        .iter()
        .map(|m| {
            checked_mapping(
                Mapping {
                    memory_start: m.memory_start,
                    memory_limit: m.memory_limit,
                    file_offset: m.file_offset,
                    filename: m.filename_strindex,
                    build_id: mapping_build_id(&m.attribute_indices, &attributes),
                },
                s,
            )
        })
        .collect::<Result<Vec<_>, OtlpError>>()?;
    let locations = d
        .location_table
        .iter()
        .map(|l| {
            location(
                l.mapping_index,
                l.address,
                l.lines.iter().map(|x| (x.function_index, x.line)),
                (mappings.len(), functions.len()),
                limits,
            )
        })
        .collect::<Result<Vec<_>, OtlpError>>()?;
    let mut stack_locations = Vec::new();
    let mut stacks = Vec::with_capacity(d.stack_table.len());
    for stack in &d.stack_table {
        check_stack_depth(
            "stack.location_indices",
            stack.location_indices.len(),
            limits,
        )?;
        check_indices(
            "stack.location_indices",
            &stack.location_indices,
            "location_table",
            locations.len(),
        )?;
        let start = stack_locations.len();
        stack_locations.extend_from_slice(&stack.location_indices);
        stacks.push(start..stack_locations.len());
    }
    let links = d
        .link_table
        .iter()
        .map(|l| SpanLink::from_wire(&l.trace_id, &l.span_id))
        .collect::<Result<Vec<_>, OtlpError>>()?;
    Ok((
        Dictionary {
            strings,
            functions,
            mappings,
            locations,
            attributes,
            links,
            stack_locations,
        },
        stacks,
    ))
}

/// `function` once its string indices are inside a table of `strings`
/// entries (the 1.7 and 1.8+ layouts carry the same fields).
fn checked_function(function: Function, strings: usize) -> Result<Function, OtlpError> {
    for i in [function.name, function.system_name, function.filename] {
        check_index("function.*_strindex", i.into(), "string_table", strings)?;
    }
    Ok(function)
}

/// `mapping` once its file name index is inside a table of `strings`
/// entries.
fn checked_mapping(mapping: Mapping, strings: usize) -> Result<Mapping, OtlpError> {
    check_index(
        "mapping.filename_strindex",
        mapping.filename.into(),
        "string_table",
        strings,
    )?;
    Ok(mapping)
}

/// A checked location: its mapping (0 means none, even when the mapping
/// table is empty) and its lines' functions inside their tables of
/// `tables` = (mappings, functions) entries, and no more lines than a
/// stack may have frames (inlined lines unwind into frames).
pub(super) fn location(
    mapping: i32,
    address: u64,
    lines: impl ExactSizeIterator<Item = (i32, i64)>,
    tables: (usize, usize),
    limits: &OtlpLimits,
) -> Result<Location, OtlpError> {
    let (mappings, functions) = tables;
    if mapping != 0 {
        check_index(
            "location.mapping_index",
            mapping.into(),
            "mapping_table",
            mappings,
        )?;
    }
    check_stack_depth("location.lines", lines.len(), limits)?;
    let lines = lines
        .map(|(function, line)| {
            check_index(
                "line.function_index",
                function.into(),
                "function_table",
                functions,
            )?;
            Ok((function, line))
        })
        .collect::<Result<Vec<_>, OtlpError>>()?;
    Ok(Location {
        mapping,
        address,
        lines,
    })
}

#[cfg(test)]
mod tests;
