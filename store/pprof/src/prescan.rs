//! Counting what a pprof protobuf would allocate, straight from the wire,
//! before prost decodes anything.
//!
//! NB: protobuf amplifies when decoded. An empty `Sample` is 2 bytes on the
//! wire and 72 decoded, an empty `Label` 2 and 32, a packed location id 1
//! and 8, an empty `Line` 2 and 24. Counting only top-level entries missed
//! the nested ones: a 32 KB gzip holding one sample with 16M empty labels
//! raised a store's RSS from 12 MB to 586 MB before validation refused it,
//! and a few hundred KB could allocate gigabytes. So the scan descends into
//! samples and locations, enforces the per-sample and per-location limits
//! there, and bounds the estimated decoded size of the whole profile.
//! Malformed framing is left for prost to report; the scan only stops early.

use crate::error::PprofError;
use crate::limits::DecodeLimits;
use crate::proto;
use crate::protobuf_fields::{WireValue, fields, scalar_entries};

/// In-memory sizes of decoded prost messages on 64-bit targets (a `Vec`
/// header is 24 bytes); estimates, slightly above the real layouts.
const VEC_BYTES: usize = 24;
const SAMPLE_BYTES: usize = 3 * VEC_BYTES;
const LABEL_BYTES: usize = 32;
const LOCATION_BYTES: usize = 3 * 8 + VEC_BYTES + 8;
const LINE_BYTES: usize = 24;
const FUNCTION_BYTES: usize = 40;
const MAPPING_BYTES: usize = 6 * 8 + 8;
const VALUE_TYPE_BYTES: usize = 16;
const STRING_BYTES: usize = VEC_BYTES;
const SCALAR_BYTES: usize = 8;

fn check(what: &'static str, count: usize, limit: usize) -> Result<(), PprofError> {
    if count > limit {
        return Err(PprofError::LimitExceeded { what, count, limit });
    }
    Ok(())
}

/// Checks one sample's repeated fields and adds their entries to
/// `tables`; returns its estimated decoded size.
fn scan_sample(
    sample: &[u8],
    limits: &DecodeLimits,
    tables: &mut TableCounts,
) -> Result<usize, PprofError> {
    let (mut locations, mut values, mut labels) = (0usize, 0usize, 0usize);
    for (field, value) in fields(sample) {
        match field {
            1 => locations += scalar_entries(&value),
            2 => values += scalar_entries(&value),
            3 => labels += 1,
            _ => {}
        }
    }
    check("frames in one stack", locations, limits.max_stack_depth)?;
    check("values in one sample", values, limits.max_sample_types)?;
    check("labels in one sample", labels, limits.max_labels_per_sample)?;
    tables.location_ids += locations;
    tables.values += values;
    tables.labels += labels;
    Ok(SAMPLE_BYTES + (locations + values) * SCALAR_BYTES + labels * LABEL_BYTES)
}

/// Checks one location's lines and adds them to `tables`; returns its
/// estimated decoded size.
fn scan_location(
    location: &[u8],
    limits: &DecodeLimits,
    tables: &mut TableCounts,
) -> Result<usize, PprofError> {
    let lines = fields(location).filter(|(field, _)| *field == 4).count();
    // Inlined lines unwind into frames, so they share the stack depth limit.
    check("lines in one location", lines, limits.max_stack_depth)?;
    tables.lines += lines;
    Ok(LOCATION_BYTES + lines * LINE_BYTES)
}

/// [`check_profile_wire_counted`]'s estimate alone.
#[cfg(test)]
pub(crate) fn check_profile_wire(
    protobuf: &[u8],
    limits: &DecodeLimits,
) -> Result<usize, PprofError> {
    check_profile_wire_counted(protobuf, limits).map(|(decoded, _)| decoded)
}

/// How many entries each table of a profile holds, as the wire scan
/// counted them (each within its limit), so a decoder reserves them once
/// instead of growing. The nested lists (a sample's location ids, values
/// and labels, a location's lines) are counted over the whole profile;
/// packed scalars count one per varint, so reserving them costs no more
/// than the decoded-size estimate that was checked.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TableCounts {
    pub(crate) samples: usize,
    pub(crate) mappings: usize,
    pub(crate) locations: usize,
    pub(crate) functions: usize,
    pub(crate) strings: usize,
    pub(crate) location_ids: usize,
    pub(crate) values: usize,
    pub(crate) labels: usize,
    pub(crate) lines: usize,
}

/// Counts the profile's tables and nested entries and estimates its decoded
/// size; refuses it before decoding when any limit would be exceeded, else
/// returns the estimate and the tables' counts.
pub(crate) fn check_profile_wire_counted(
    protobuf: &[u8],
    limits: &DecodeLimits,
) -> Result<(usize, TableCounts), PprofError> {
    let mut counts = [0usize; 7];
    let mut tables = TableCounts::default();
    let mut decoded = 0usize;
    for (field, value) in fields(protobuf) {
        if let Some(count) = usize::try_from(field).ok().and_then(|f| counts.get_mut(f)) {
            *count += 1;
        }
        decoded = decoded.saturating_add(match (field, &value) {
            (1, _) => VALUE_TYPE_BYTES,
            (2, WireValue::Bytes(sample)) => scan_sample(sample, limits, &mut tables)?,
            (3, _) => MAPPING_BYTES,
            (4, WireValue::Bytes(location)) => scan_location(location, limits, &mut tables)?,
            (5, _) => FUNCTION_BYTES,
            (6, WireValue::Bytes(string)) => STRING_BYTES + string.len(),
            (13, value) => scalar_entries(value) * SCALAR_BYTES,
            _ => 0,
        });
        // Checked as the scan goes, so the count of a huge table is not
        // needed to refuse it.
        if counts[2] > limits.max_samples {
            break;
        }
    }
    check("sample types", counts[1], limits.max_sample_types)?;
    check("samples", counts[2], limits.max_samples)?;
    check("mappings", counts[3], limits.max_table_entries)?;
    check("locations", counts[4], limits.max_table_entries)?;
    check("functions", counts[5], limits.max_table_entries)?;
    check("strings", counts[6], limits.max_table_entries)?;
    check(
        "decoded bytes (estimated)",
        decoded,
        limits.max_decoded_bytes,
    )?;
    let tables = TableCounts {
        samples: counts[2],
        mappings: counts[3],
        locations: counts[4],
        functions: counts[5],
        strings: counts[6],
        ..tables
    };
    Ok((decoded, tables))
}

/// [`check_profile_wire`] for a profile built in memory rather than read
/// from bytes (folded text, an upload edited by the server): the same
/// limits and the same size estimate, so that its encoding passes the wire
/// scan when the write-ahead log is replayed.
pub(crate) fn check_profile_message(
    profile: &proto::Profile,
    limits: &DecodeLimits,
) -> Result<usize, PprofError> {
    check(
        "sample types",
        profile.sample_type.len(),
        limits.max_sample_types,
    )?;
    check("samples", profile.sample.len(), limits.max_samples)?;
    check("mappings", profile.mapping.len(), limits.max_table_entries)?;
    check(
        "locations",
        profile.location.len(),
        limits.max_table_entries,
    )?;
    check(
        "functions",
        profile.function.len(),
        limits.max_table_entries,
    )?;
    check(
        "strings",
        profile.string_table.len(),
        limits.max_table_entries,
    )?;
    let mut decoded = profile.sample_type.len() * VALUE_TYPE_BYTES
        + profile.mapping.len() * MAPPING_BYTES
        + profile.function.len() * FUNCTION_BYTES
        + profile.comment.len() * SCALAR_BYTES;
    for sample in &profile.sample {
        let (locations, values, labels) = (
            sample.location_id.len(),
            sample.value.len(),
            sample.label.len(),
        );
        check("frames in one stack", locations, limits.max_stack_depth)?;
        check("values in one sample", values, limits.max_sample_types)?;
        check("labels in one sample", labels, limits.max_labels_per_sample)?;
        decoded = decoded.saturating_add(
            SAMPLE_BYTES + (locations + values) * SCALAR_BYTES + labels * LABEL_BYTES,
        );
    }
    for location in &profile.location {
        check(
            "lines in one location",
            location.line.len(),
            limits.max_stack_depth,
        )?;
        decoded = decoded.saturating_add(LOCATION_BYTES + location.line.len() * LINE_BYTES);
    }
    for string in &profile.string_table {
        decoded = decoded.saturating_add(STRING_BYTES + string.len());
    }
    check(
        "decoded bytes (estimated)",
        decoded,
        limits.max_decoded_bytes,
    )?;
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    fn profile_with_sample(sample: proto::Sample) -> Vec<u8> {
        proto::Profile {
            sample_type: vec![proto::ValueType { r#type: 1, unit: 2 }],
            sample: vec![sample],
            string_table: vec![Vec::new(), b"cpu".to_vec(), b"ns".to_vec()],
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn the_scan_counts_every_nested_list_entry_of_a_packed_profile() {
        let sample = |ids: Vec<u64>, labels: usize| proto::Sample {
            location_id: ids,
            value: vec![1, 300],
            label: vec![proto::Label::default(); labels],
        };
        let location = |lines: usize| proto::Location {
            id: 1,
            line: vec![proto::Line::default(); lines],
            ..Default::default()
        };
        let profile = proto::Profile {
            sample_type: vec![proto::ValueType { r#type: 1, unit: 2 }; 2],
            sample: vec![sample(vec![1, 2, 200_000], 2), sample(vec![7], 0)],
            location: vec![location(3), location(1), location(0)],
            string_table: vec![Vec::new(), b"cpu".to_vec(), b"ns".to_vec()],
            ..Default::default()
        };
        let (_, tables) =
            check_profile_wire_counted(&profile.encode_to_vec(), &DecodeLimits::default())
                .expect("within limits");
        assert_eq!(
            (tables.samples, tables.locations, tables.strings),
            (2, 3, 3)
        );
        assert_eq!(
            (
                tables.location_ids,
                tables.values,
                tables.labels,
                tables.lines
            ),
            (4, 4, 2, 4)
        );
    }

    #[test]
    fn one_sample_with_too_many_empty_labels_is_refused_by_the_scan() {
        let limits = DecodeLimits::default();
        let sample = proto::Sample {
            value: vec![1],
            label: vec![proto::Label::default(); limits.max_labels_per_sample + 1],
            ..Default::default()
        };
        let err = check_profile_wire(&profile_with_sample(sample), &limits).unwrap_err();
        assert!(
            matches!(
                err,
                PprofError::LimitExceeded {
                    what: "labels in one sample",
                    count: 65,
                    limit: 64
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn packed_and_unpacked_location_ids_are_both_counted() {
        let limits = DecodeLimits {
            max_stack_depth: 3,
            ..DecodeLimits::default()
        };
        let packed = profile_with_sample(proto::Sample {
            location_id: vec![1, 300, 70_000, 2],
            value: vec![1],
            ..Default::default()
        });
        let err = check_profile_wire(&packed, &limits).unwrap_err();
        assert!(
            matches!(err, PprofError::LimitExceeded { count: 4, .. }),
            "{err}"
        );
        // Unpacked: each id its own field (key 0x08), as old encoders wrote.
        let mut unpacked = vec![0x0a, 0x02, 0x08, 0x01];
        let mut sample = Vec::new();
        for id in 1..=4u8 {
            sample.extend_from_slice(&[0x08, id]);
        }
        unpacked.push(0x12);
        unpacked.push(sample.len() as u8);
        unpacked.extend_from_slice(&sample);
        let err = check_profile_wire(&unpacked, &limits).unwrap_err();
        assert!(
            matches!(err, PprofError::LimitExceeded { count: 4, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_location_with_too_many_lines_is_refused() {
        let limits = DecodeLimits {
            max_stack_depth: 2,
            ..DecodeLimits::default()
        };
        let plain = proto::Profile {
            location: vec![proto::Location {
                id: 1,
                line: vec![proto::Line::default(); 3],
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec();
        let err = check_profile_wire(&plain, &limits).unwrap_err();
        assert!(
            matches!(
                err,
                PprofError::LimitExceeded {
                    what: "lines in one location",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn the_decoded_size_estimate_bounds_many_small_entries() {
        // 100k empty strings: 200 KB on the wire, 2.4 MB decoded.
        let mut plain = Vec::new();
        for _ in 0..100_000 {
            plain.extend_from_slice(&[0x32, 0x00]);
        }
        let limits = DecodeLimits {
            max_decoded_bytes: 1 << 20,
            ..DecodeLimits::default()
        };
        let err = check_profile_wire(&plain, &limits).unwrap_err();
        assert!(
            matches!(
                err,
                PprofError::LimitExceeded {
                    what: "decoded bytes (estimated)",
                    count: 2_400_000,
                    ..
                }
            ),
            "{err}"
        );
        check_profile_wire(&plain, &DecodeLimits::default()).expect("within the defaults");
    }

    /// A message and its encoding get the same verdict and the same
    /// estimate, so a profile built in memory and checked as a message is
    /// not refused when its encoding is read back (WAL replay).
    #[test]
    fn a_message_and_its_encoding_get_the_same_estimate_and_limits() {
        let profile = proto::Profile {
            sample_type: vec![proto::ValueType { r#type: 1, unit: 2 }; 2],
            sample: vec![
                proto::Sample {
                    location_id: vec![1, 2, 300],
                    value: vec![5, 70_000],
                    label: vec![proto::Label::default(); 3],
                };
                4
            ],
            mapping: vec![proto::Mapping::default(); 2],
            location: vec![
                proto::Location {
                    id: 1,
                    line: vec![proto::Line::default(); 2],
                    ..Default::default()
                };
                3
            ],
            function: vec![proto::Function::default(); 5],
            string_table: vec![Vec::new(), b"cpu".to_vec(), b"nanoseconds".to_vec()],
            comment: vec![1, 2],
            ..Default::default()
        };
        let limits = DecodeLimits::default();
        let wire = check_profile_wire(&profile.encode_to_vec(), &limits).expect("fits");
        let message = check_profile_message(&profile, &limits).expect("fits");
        assert_eq!(message, wire);
        let verdicts = |limits: &DecodeLimits| {
            (
                check_profile_message(&profile, limits).map_err(|e| e.to_string()),
                check_profile_wire(&profile.encode_to_vec(), limits).map_err(|e| e.to_string()),
            )
        };
        let tight = DecodeLimits {
            max_decoded_bytes: wire - 1,
            ..DecodeLimits::default()
        };
        let (message, wire) = verdicts(&tight);
        assert!(message.is_err(), "{message:?}");
        assert_eq!(message, wire);
        let shallow = DecodeLimits {
            max_stack_depth: 2,
            ..DecodeLimits::default()
        };
        let (message, wire) = verdicts(&shallow);
        assert!(message.is_err(), "{message:?}");
        assert_eq!(message, wire);
    }
}
