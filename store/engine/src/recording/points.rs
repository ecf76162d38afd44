//! Recorded series: per label set, one summed value per
//! [`RECORDED_RESOLUTION_MS`] bucket, and their file encoding.
//!
//! The file is `KREC`, a version byte, the series (labels, then points as
//! zigzag deltas of bucket index and values), the names of the files whose
//! points it replaces (a merge of files lists them, so a reader can tell
//! which points are already counted here), and a CRC-32 of all before it. A file is read whole and checked before anything is allocated for
//! it: every count is bounded by the bytes left.

use std::collections::BTreeMap;

use crate::model::{Label, LabelSet};
use crate::wire::{Reader, WireError, Writer};

/// The width of one recorded point: values recorded within it are summed.
pub const RECORDED_RESOLUTION_MS: i64 = 10_000;

const MAGIC: &[u8; 4] = b"KREC";
const VERSION: u8 = 1;

/// Why bytes are not a recorded-series file.
#[derive(Debug, thiserror::Error)]
pub enum RecordedFileError {
    /// Not this format, or a version this build does not read.
    #[error("not a recorded-series file (magic or version {version} wrong)")]
    Header {
        /// The version byte found (0 when the file is too short).
        version: u8,
    },
    /// The checksum does not match: the file is damaged.
    #[error("recorded-series file checksum mismatch")]
    Checksum,
    /// The body ends early, holds a malformed number, or a label that is
    /// not UTF-8.
    #[error("recorded-series file is malformed at byte {offset}")]
    Malformed {
        /// Where, from the start.
        offset: usize,
    },
}

/// Recorded series: per label set (metric name included), bucket start
/// (unix ms) to summed value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordedPoints {
    series: BTreeMap<LabelSet, BTreeMap<i64, i64>>,
}

/// Which buckets a read takes and the times it sums them at: bucket `b`
/// in `[from_ms, to_ms)` is added at `origin_ms + k * step_ms`, `k` the
/// number of whole steps from `from_ms` to `b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steps {
    /// First bucket taken.
    pub from_ms: i64,
    /// End of the buckets taken (exclusive).
    pub to_ms: i64,
    /// Width of an output step (a multiple of the resolution reads best).
    pub step_ms: i64,
    /// The first output time.
    pub origin_ms: i64,
}

impl Steps {
    /// A Prometheus-style range: an output at each `start + k * step` up
    /// to `end`, each the sum of the buckets in `[t - step, t)`.
    pub fn range(start_ms: i64, end_ms: i64, step_ms: i64) -> Self {
        let step_ms = step_ms.max(1);
        Self {
            from_ms: start_ms.saturating_sub(step_ms),
            to_ms: end_ms,
            step_ms,
            origin_ms: start_ms,
        }
    }

    /// The buckets in `[from_ms, to_ms)` at their own times.
    pub fn raw(from_ms: i64, to_ms: i64) -> Self {
        Self {
            from_ms,
            to_ms,
            step_ms: RECORDED_RESOLUTION_MS,
            origin_ms: from_ms,
        }
    }

    /// The output time of bucket `bucket_ms`, if the read takes it.
    pub fn output_time(&self, bucket_ms: i64) -> Option<i64> {
        if bucket_ms < self.from_ms || bucket_ms >= self.to_ms {
            return None;
        }
        let steps = (bucket_ms - self.from_ms).div_euclid(self.step_ms);
        Some(
            self.origin_ms
                .saturating_add(steps.saturating_mul(self.step_ms)),
        )
    }
}

/// The start of the bucket holding `time_ms`.
pub fn bucket_of(time_ms: i64) -> i64 {
    time_ms.div_euclid(RECORDED_RESOLUTION_MS) * RECORDED_RESOLUTION_MS
}

impl RecordedPoints {
    /// No series.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// Points over every series.
    pub fn point_count(&self) -> usize {
        self.series.values().map(BTreeMap::len).sum()
    }

    /// Approximate heap bytes, for a cache's budget.
    pub fn approx_bytes(&self) -> usize {
        self.series
            .iter()
            .map(|(labels, points)| {
                labels
                    .iter()
                    .map(|l| l.name.len() + l.value.len() + 48)
                    .sum::<usize>()
                    + points.len() * 40
                    + 64
            })
            .sum()
    }

    /// Adds `value` to the point of series `labels` at `time_ms`'s bucket.
    pub fn add(&mut self, labels: &LabelSet, time_ms: i64, value: i64) {
        let points = match self.series.get_mut(labels) {
            Some(points) => points,
            None => self.series.entry(labels.clone()).or_default(),
        };
        let point = points.entry(bucket_of(time_ms)).or_insert(0);
        *point = point.saturating_add(value);
    }

    /// Adds every point of `other`.
    pub fn merge(&mut self, other: &Self) {
        for (labels, points) in &other.series {
            for (&time_ms, &value) in points {
                self.add(labels, time_ms, value);
            }
        }
    }

    /// The first and last bucket start, if any point is recorded.
    pub fn time_bounds(&self) -> Option<(i64, i64)> {
        let first = self.series.values().filter_map(|p| p.keys().next()).min()?;
        let last = self
            .series
            .values()
            .filter_map(|p| p.keys().next_back())
            .max()?;
        Some((*first, *last))
    }

    /// Each series and its points (bucket start, value), in label order.
    pub fn series(&self) -> impl Iterator<Item = (&LabelSet, &BTreeMap<i64, i64>)> {
        self.series.iter()
    }

    /// Each series' points whose bucket `steps` takes, at their output
    /// times, added to `into`; series `keep` refuses are skipped, and so
    /// are points `counted_elsewhere` names (labels aside, by bucket).
    pub fn select_into(
        &self,
        keep: impl Fn(&LabelSet) -> bool,
        steps: &Steps,
        counted_elsewhere: impl Fn(i64) -> bool,
        into: &mut Self,
    ) {
        for (labels, points) in &self.series {
            if !keep(labels) {
                continue;
            }
            for (&bucket_ms, &value) in points.range(steps.from_ms..steps.to_ms.max(steps.from_ms))
            {
                if counted_elsewhere(bucket_ms) {
                    continue;
                }
                if let Some(time_ms) = steps.output_time(bucket_ms) {
                    into.add_exact(labels, time_ms, value);
                }
            }
        }
    }

    /// Adds `value` at exactly `time_ms` (an output step's time, which
    /// need not be a bucket's start).
    pub fn add_exact(&mut self, labels: &LabelSet, time_ms: i64, value: i64) {
        let points = match self.series.get_mut(labels) {
            Some(points) => points,
            None => self.series.entry(labels.clone()).or_default(),
        };
        let point = points.entry(time_ms).or_insert(0);
        *point = point.saturating_add(value);
    }

    /// Encodes the points as a recorded-series file that replaces the
    /// files named in `replaces` (none for a file of new points).
    pub fn encode(&self, replaces: &[String]) -> Vec<u8> {
        let mut out = Writer::new();
        out.raw(MAGIC);
        out.byte(VERSION);
        out.varint(self.series.len() as u64);
        for (labels, points) in &self.series {
            out.varint(labels.len() as u64);
            for label in labels.iter() {
                out.bytes(label.name.as_bytes());
                out.bytes(label.value.as_bytes());
            }
            out.varint(points.len() as u64);
            let mut previous = 0i64;
            for (&time_ms, &value) in points {
                let index = time_ms.div_euclid(RECORDED_RESOLUTION_MS);
                out.signed(index.wrapping_sub(previous));
                out.signed(value);
                previous = index;
            }
        }
        out.varint(replaces.len() as u64);
        for name in replaces {
            out.bytes(name.as_bytes());
        }
        let crc = crc32fast::hash(out.as_slice());
        out.u32_le(crc);
        out.into_vec()
    }

    /// Reads a recorded-series file written by [`RecordedPoints::encode`]:
    /// its points and the names of the files it replaces.
    pub fn decode(bytes: &[u8]) -> Result<(Self, Vec<String>), RecordedFileError> {
        let version = bytes.get(4).copied().unwrap_or(0);
        if bytes.len() < MAGIC.len() + 1 + 4 || &bytes[..4] != MAGIC || version != VERSION {
            return Err(RecordedFileError::Header { version });
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32fast::hash(body) != stored {
            return Err(RecordedFileError::Checksum);
        }
        let mut reader = Reader::new(&body[5..]);
        let malformed = |reader: &Reader<'_>| RecordedFileError::Malformed {
            offset: body.len() - reader.remaining(),
        };
        let mut decoded = Self::new();
        let series = reader.count(2).map_err(|_| malformed(&reader))?;
        for _ in 0..series {
            let labels = read_labels(&mut reader).map_err(|_| malformed(&reader))?;
            let count = reader.count(2).map_err(|_| malformed(&reader))?;
            let mut points = BTreeMap::new();
            let mut index = 0i64;
            for _ in 0..count {
                let delta = reader.signed().map_err(|_| malformed(&reader))?;
                index = index.checked_add(delta).ok_or_else(|| malformed(&reader))?;
                let time_ms = index
                    .checked_mul(RECORDED_RESOLUTION_MS)
                    .ok_or_else(|| malformed(&reader))?;
                let value = reader.signed().map_err(|_| malformed(&reader))?;
                let point = points.entry(time_ms).or_insert(0i64);
                *point = point.saturating_add(value);
            }
            let merged = decoded.series.entry(labels).or_default();
            for (time_ms, value) in points {
                let point = merged.entry(time_ms).or_insert(0);
                *point = point.saturating_add(value);
            }
        }
        let count = reader.count(1).map_err(|_| malformed(&reader))?;
        let mut replaces = Vec::with_capacity(count);
        for _ in 0..count {
            let name = reader.bytes().map_err(|_| malformed(&reader))?;
            let name = std::str::from_utf8(name).map_err(|_| malformed(&reader))?;
            replaces.push(name.to_owned());
        }
        if !reader.is_empty() {
            return Err(malformed(&reader));
        }
        Ok((decoded, replaces))
    }
}

fn read_labels(reader: &mut Reader<'_>) -> Result<LabelSet, WireError> {
    let count = reader.count(2)?;
    let mut labels = Vec::with_capacity(count);
    for _ in 0..count {
        let name = std::str::from_utf8(reader.bytes()?).map_err(|_| WireError)?;
        let value = std::str::from_utf8(reader.bytes()?).map_err(|_| WireError)?;
        if name.is_empty() {
            return Err(WireError);
        }
        labels.push(Label::new(name, value));
    }
    Ok(LabelSet::new(labels))
}
