//! The byte layout of write-ahead-log segments and records. Pure: bytes in,
//! bytes out, so torn and corrupt inputs are unit-testable.
//!
//! A segment starts with [`SEGMENT_MAGIC`], then holds frames:
//! `payload length (u32 LE) | crc32 of payload (u32 LE) | payload`.
//! A payload is one ingest request as received: format version, time,
//! duration, series labels and the raw pprof bytes (compressed or not), so
//! replay re-runs exactly the validated ingest path. Version 2 adds the
//! client's idempotency key after the pprof; a record without one is still
//! written as version 1, which earlier releases read.

use kiln_engine::model::{Label, LabelSet};

/// First bytes of every segment file; also identifies the format version.
pub const SEGMENT_MAGIC: &[u8; 8] = b"KILNWAL1";
/// Bytes of a frame header (length + crc).
pub const FRAME_HEADER_BYTES: usize = 8;
/// Largest payload a frame may claim; anything larger is treated as a torn
/// or corrupt length field rather than an allocation request.
pub const MAX_PAYLOAD_BYTES: usize = 512 << 20;
const PAYLOAD_VERSION: u8 = 1;
const PAYLOAD_VERSION_KEYED: u8 = 2;

/// One ingest request as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalRecord {
    /// Series labels as the client sent them (including `__name__`).
    pub labels: LabelSet,
    /// Resolved profile time, unix ms (fixed at ingest, so replay is deterministic).
    pub time_ms: i64,
    /// Resolved profile duration in ns (0 for instant profiles).
    pub duration_nanos: i64,
    /// The pprof payload exactly as received.
    pub pprof: Vec<u8>,
    /// The client's idempotency key, if it sent one: a retry with the same
    /// key is not stored again, so a client that resends a batch after an
    /// answer it could not judge (a restart, a broken connection) does not
    /// store the profiles that did arrive twice.
    pub idempotency_key: Option<String>,
}

/// Why a payload that passed its CRC could not be parsed (a format bug or
/// an unknown future version, never a torn write).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The payload ended before a field it announces.
    #[error("record payload truncated while reading {field}")]
    Truncated {
        /// The field being read.
        field: &'static str,
    },
    /// The payload uses a version this build does not know.
    #[error("record payload version {version} is unknown")]
    UnknownVersion {
        /// The version byte found.
        version: u8,
    },
    /// A label name or value is not UTF-8.
    #[error("record label is not valid UTF-8")]
    LabelNotUtf8,
}

impl RecordError {
    /// A short, fixed name for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Truncated { .. } => "truncated",
            Self::UnknownVersion { .. } => "unknown_version",
            Self::LabelNotUtf8 => "label_not_utf8",
        }
    }
}

/// Encodes `record` as one complete frame (header + payload).
pub fn encode_frame(record: &WalRecord) -> Vec<u8> {
    let label_bytes: usize = record
        .labels
        .iter()
        .map(|l| 8 + l.name.len() + l.value.len())
        .sum();
    let key_bytes = record.idempotency_key.as_ref().map_or(0, |k| 4 + k.len());
    let payload_len = 1 + 8 + 8 + 4 + label_bytes + 4 + record.pprof.len() + key_bytes;
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + payload_len);
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    out.push(if record.idempotency_key.is_some() {
        PAYLOAD_VERSION_KEYED
    } else {
        PAYLOAD_VERSION
    });
    out.extend_from_slice(&record.time_ms.to_le_bytes());
    out.extend_from_slice(&record.duration_nanos.to_le_bytes());
    push_len(&mut out, record.labels.len());
    for label in record.labels.iter() {
        push_len(&mut out, label.name.len());
        out.extend_from_slice(label.name.as_bytes());
        push_len(&mut out, label.value.len());
        out.extend_from_slice(label.value.as_bytes());
    }
    push_len(&mut out, record.pprof.len());
    out.extend_from_slice(&record.pprof);
    if let Some(key) = &record.idempotency_key {
        push_len(&mut out, key.len());
        out.extend_from_slice(key.as_bytes());
    }
    let payload = &out[FRAME_HEADER_BYTES..];
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let crc = crc32fast::hash(payload);
    out[0..4].copy_from_slice(&len.to_le_bytes());
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out
}

fn push_len(out: &mut Vec<u8>, len: usize) {
    // Lengths are bounded by the ingest size limits far below 4 GiB; a
    // saturated value would fail the CRC-protected parse rather than wrap.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
}

/// Parses a frame payload back into a record.
pub fn decode_payload(payload: &[u8]) -> Result<WalRecord, RecordError> {
    let mut reader = Reader { rest: payload };
    let version = reader.take(1, "version")?[0];
    if version != PAYLOAD_VERSION && version != PAYLOAD_VERSION_KEYED {
        return Err(RecordError::UnknownVersion { version });
    }
    let time_ms = reader.i64("time")?;
    let duration_nanos = reader.i64("duration")?;
    let count = reader.u32("label count")? as usize;
    // Each label needs at least 8 bytes, which bounds the allocation.
    let mut labels = Vec::with_capacity(count.min(reader.rest.len() / 8));
    for _ in 0..count {
        let name = reader.string("label name")?;
        let value = reader.string("label value")?;
        labels.push(Label { name, value });
    }
    let pprof_len = reader.u32("pprof length")? as usize;
    let pprof = reader.take(pprof_len, "pprof")?.to_vec();
    let idempotency_key = if version == PAYLOAD_VERSION_KEYED {
        Some(reader.string("idempotency key")?)
    } else {
        None
    };
    Ok(WalRecord {
        labels: LabelSet::new(labels),
        time_ms,
        duration_nanos,
        pprof,
        idempotency_key,
    })
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], RecordError> {
        if self.rest.len() < n {
            return Err(RecordError::Truncated { field });
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, RecordError> {
        let bytes = self.take(4, field)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn i64(&mut self, field: &'static str) -> Result<i64, RecordError> {
        let bytes = self.take(8, field)?;
        let mut array = [0u8; 8];
        array.copy_from_slice(bytes);
        Ok(i64::from_le_bytes(array))
    }

    fn string(&mut self, field: &'static str) -> Result<String, RecordError> {
        let len = self.u32(field)? as usize;
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| RecordError::LabelNotUtf8)
    }
}

/// Why parsing a segment stopped before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailProblem {
    /// The segment does not start with [`SEGMENT_MAGIC`].
    BadMagic,
    /// A frame header or payload is cut short (a crash mid-write).
    Torn,
    /// A frame's length is absurd or its CRC does not match.
    Corrupt,
}

/// The frames found in one segment's bytes.
#[derive(Debug)]
pub struct ParsedSegment<'a> {
    /// CRC-verified payloads, in order.
    pub payloads: Vec<&'a [u8]>,
    /// Length of the valid prefix (magic + whole good frames); the file
    /// should be truncated to this when `problem` is set.
    pub valid_len: usize,
    /// Why parsing stopped early, if it did.
    pub problem: Option<TailProblem>,
}

/// Splits a segment into CRC-verified payloads, stopping at the first torn
/// or corrupt frame.
pub fn parse_segment(bytes: &[u8]) -> ParsedSegment<'_> {
    if bytes.len() < SEGMENT_MAGIC.len() {
        // A crash right after creating the file can leave a partial magic.
        let problem = (!SEGMENT_MAGIC.starts_with(bytes)).then_some(TailProblem::BadMagic);
        return ParsedSegment {
            payloads: Vec::new(),
            valid_len: 0,
            problem: problem.or((!bytes.is_empty()).then_some(TailProblem::Torn)),
        };
    }
    if &bytes[..SEGMENT_MAGIC.len()] != SEGMENT_MAGIC {
        return ParsedSegment {
            payloads: Vec::new(),
            valid_len: 0,
            problem: Some(TailProblem::BadMagic),
        };
    }
    let mut payloads = Vec::new();
    let mut offset = SEGMENT_MAGIC.len();
    let problem = loop {
        let rest = &bytes[offset..];
        if rest.is_empty() {
            break None;
        }
        if rest.len() < FRAME_HEADER_BYTES {
            break Some(TailProblem::Torn);
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len > MAX_PAYLOAD_BYTES {
            break Some(TailProblem::Corrupt);
        }
        if rest.len() < FRAME_HEADER_BYTES + len {
            break Some(TailProblem::Torn);
        }
        let payload = &rest[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len];
        if crc32fast::hash(payload) != crc {
            break Some(TailProblem::Corrupt);
        }
        payloads.push(payload);
        offset += FRAME_HEADER_BYTES + len;
    };
    ParsedSegment {
        payloads,
        valid_len: offset,
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: i64) -> WalRecord {
        WalRecord {
            labels: LabelSet::new(vec![
                Label::new("__name__", "process_cpu"),
                Label::new("pod", format!("pod-{n}")),
            ]),
            time_ms: 1_700_000_000_000 + n,
            duration_nanos: 10_000_000_000,
            pprof: vec![n as u8; 100 + n as usize],
            idempotency_key: None,
        }
    }

    #[test]
    fn a_keyed_record_round_trips_and_an_unkeyed_one_stays_version_1() {
        let plain = record(1);
        let frame = encode_frame(&plain);
        assert_eq!(
            frame[FRAME_HEADER_BYTES], PAYLOAD_VERSION,
            "readable by earlier releases"
        );
        assert_eq!(decode_payload(&frame[FRAME_HEADER_BYTES..]), Ok(plain));
        let keyed = WalRecord {
            idempotency_key: Some("agent-7/01HZX".into()),
            ..record(2)
        };
        let frame = encode_frame(&keyed);
        assert_eq!(frame[FRAME_HEADER_BYTES], PAYLOAD_VERSION_KEYED);
        assert_eq!(decode_payload(&frame[FRAME_HEADER_BYTES..]), Ok(keyed));
        // A keyed record cut before its key is truncated, not misread.
        let cut = &frame[FRAME_HEADER_BYTES..frame.len() - 3];
        assert_eq!(
            decode_payload(cut),
            Err(RecordError::Truncated {
                field: "idempotency key"
            })
        );
    }

    fn segment(records: &[WalRecord]) -> Vec<u8> {
        let mut bytes = SEGMENT_MAGIC.to_vec();
        for r in records {
            bytes.extend_from_slice(&encode_frame(r));
        }
        bytes
    }

    #[test]
    fn records_round_trip_through_frames() {
        let records: Vec<_> = (0..5).map(record).collect();
        let bytes = segment(&records);
        let parsed = parse_segment(&bytes);
        assert_eq!(parsed.problem, None);
        assert_eq!(parsed.valid_len, bytes.len());
        let decoded: Vec<_> = parsed
            .payloads
            .iter()
            .map(|p| decode_payload(p).expect("valid payload"))
            .collect();
        assert_eq!(decoded, records);
    }

    #[test]
    fn every_truncation_point_yields_the_whole_frames_before_it() {
        let records: Vec<_> = (0..3).map(record).collect();
        let bytes = segment(&records);
        let frame_ends: Vec<usize> = {
            let mut ends = vec![SEGMENT_MAGIC.len()];
            for r in &records {
                let last = *ends.last().expect("non-empty");
                ends.push(last + encode_frame(r).len());
            }
            ends
        };
        for cut in SEGMENT_MAGIC.len()..bytes.len() {
            let parsed = parse_segment(&bytes[..cut]);
            let whole = frame_ends.iter().filter(|&&end| end <= cut).count() - 1;
            assert_eq!(parsed.payloads.len(), whole, "cut at {cut}");
            assert_eq!(parsed.valid_len, frame_ends[whole]);
            let expect_problem = (cut != frame_ends[whole]).then_some(TailProblem::Torn);
            assert_eq!(parsed.problem, expect_problem, "cut at {cut}");
        }
    }

    #[test]
    fn a_flipped_byte_stops_parsing_at_the_damaged_frame() {
        let records: Vec<_> = (0..3).map(record).collect();
        let mut bytes = segment(&records);
        let second_frame = SEGMENT_MAGIC.len() + encode_frame(&records[0]).len();
        bytes[second_frame + FRAME_HEADER_BYTES + 5] ^= 0xff;
        let parsed = parse_segment(&bytes);
        assert_eq!(parsed.payloads.len(), 1);
        assert_eq!(parsed.valid_len, second_frame);
        assert_eq!(parsed.problem, Some(TailProblem::Corrupt));
    }

    #[test]
    fn an_absurd_length_is_corruption_not_an_allocation() {
        let mut bytes = SEGMENT_MAGIC.to_vec();
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        let parsed = parse_segment(&bytes);
        assert_eq!(parsed.problem, Some(TailProblem::Corrupt));
        assert_eq!(parsed.valid_len, SEGMENT_MAGIC.len());
    }

    #[test]
    fn a_foreign_file_is_reported_as_bad_magic() {
        let parsed = parse_segment(b"hello world, not a wal");
        assert_eq!(parsed.problem, Some(TailProblem::BadMagic));
        assert!(parsed.payloads.is_empty());
    }

    #[test]
    fn truncated_payloads_are_refused_with_the_field_name() {
        let frame = encode_frame(&record(1));
        let payload = &frame[FRAME_HEADER_BYTES..];
        for cut in 0..payload.len() {
            assert!(decode_payload(&payload[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(
            decode_payload(&[9]),
            Err(RecordError::UnknownVersion { version: 9 })
        );
    }
}
