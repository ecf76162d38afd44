//! Counting what a protobuf request would allocate once decoded, straight
//! from the wire, before prost decodes anything.
//!
//! Protobuf amplifies when decoded: an empty `RawProfileSeries` is two
//! bytes on the wire (`12 00`) and a 48-byte struct in memory, an empty OTLP
//! sample two bytes and about 80, a packed zero one byte and four or eight.
//! prost allocates every entry before a handler can count them, so a 33 KB
//! gzipped body of empty series decoded into gigabytes. Here a request is
//! walked once along a static description of its message types ([`Shape`]):
//! the repeated fields that a limit bounds are counted on the wire and
//! refused as soon as one passes its limit, and the decoded size is
//! estimated so that the caller can reserve it from the ingest budget
//! before decoding. Fields the description leaves out are skipped, as prost
//! skips unknown fields; malformed framing ends the walk, for prost to
//! report with its own message.

use std::mem::size_of;

use kiln_pprof::protobuf_fields::{WireValue, fields, scalar_entries};

/// prost's recursion limit: deeper nesting is refused by prost itself, so
/// the walk stops there too.
const MAX_DEPTH: usize = 100;

/// A message type as far as its decoded size goes.
#[derive(Debug)]
pub struct Shape {
    /// The size of the generated struct.
    pub struct_bytes: usize,
    /// The fields that allocate, by number; others are skipped.
    pub fields: &'static [Field],
}

/// One field of a [`Shape`].
#[derive(Debug)]
pub struct Field {
    /// Its field number.
    pub number: u32,
    /// What one occurrence decodes to.
    pub kind: Kind,
    /// The limit on its entries, if any.
    pub cap: Option<Cap>,
}

/// What one occurrence of a field decodes to.
#[derive(Debug)]
pub enum Kind {
    /// A (repeated or optional) message of this shape.
    Message(&'static Shape),
    /// Scalars of this many bytes each, packed or not.
    Scalars(usize),
    /// A string or bytes field: its payload, copied.
    Bytes,
}

/// A limit on a field's entries.
#[derive(Debug, Clone, Copy)]
pub struct Cap {
    /// What is counted, for the error, e.g. `series`.
    pub what: &'static str,
    /// Which configured limit applies.
    pub limit: Limit,
    /// Whether entries are counted in each message apart or over the
    /// whole request.
    pub per_request: bool,
}

/// The configured limits a [`Cap`] can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Series in one request.
    Series,
    /// Profiles in one request.
    Profiles,
    /// Samples in one profile.
    Samples,
    /// Frames in one stack.
    StackDepth,
    /// Entries in one table.
    TableEntries,
}

/// The values of every [`Limit`] for one scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// [`Limit::Series`].
    pub series: usize,
    /// [`Limit::Profiles`].
    pub profiles: usize,
    /// [`Limit::Samples`].
    pub samples: usize,
    /// [`Limit::StackDepth`].
    pub stack_depth: usize,
    /// [`Limit::TableEntries`].
    pub table_entries: usize,
}

impl Limits {
    fn of(&self, limit: Limit) -> usize {
        match limit {
            Limit::Series => self.series,
            Limit::Profiles => self.profiles,
            Limit::Samples => self.samples,
            Limit::StackDepth => self.stack_depth,
            Limit::TableEntries => self.table_entries,
        }
    }
}

/// A field passed its limit on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{count} {what}, over the limit of {limit}")]
pub struct OverLimit {
    /// What was counted.
    pub what: &'static str,
    /// Which limit.
    pub limit_kind: Limit,
    /// Counted when the walk stopped (the limit plus one).
    pub count: usize,
    /// The limit.
    pub limit: usize,
}

/// What a scan found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scan {
    /// The estimated bytes the decoded message takes, its `Vec`s' spare
    /// capacity included.
    pub decoded_bytes: usize,
    /// The entries of each field capped per request, by what it counts.
    counts: Vec<(&'static str, usize)>,
}

impl Scan {
    /// The entries counted of a field capped per request, e.g. `series`.
    pub fn count(&self, what: &str) -> usize {
        self.counts
            .iter()
            .find(|(counted, _)| *counted == what)
            .map_or(0, |(_, count)| *count)
    }
}

/// Walks `message` as `shape`, refusing it at the first field over its
/// limit; returns the decoded-size estimate.
pub fn scan(message: &[u8], shape: &'static Shape, limits: &Limits) -> Result<Scan, OverLimit> {
    let mut counts = Vec::new();
    let decoded_bytes =
        walk(message, shape, limits, &mut counts, 0)?.saturating_add(shape.struct_bytes);
    Ok(Scan {
        decoded_bytes,
        counts,
    })
}

/// The decoded bytes of `message`'s fields (its own struct is its parent's
/// to count, as a `Vec` element or inline).
fn walk(
    message: &[u8],
    shape: &'static Shape,
    limits: &Limits,
    totals: &mut Vec<(&'static str, usize)>,
    depth: usize,
) -> Result<usize, OverLimit> {
    if depth >= MAX_DEPTH {
        return Ok(0);
    }
    let mut bytes = 0usize;
    // Per-message counts of the capped fields, by their index in the shape
    // (shapes list at most a few fields; a later one counts per request).
    let mut here = [0usize; 16];
    for (number, value) in fields(message) {
        let Some(index) = shape
            .fields
            .iter()
            .position(|f| u64::from(f.number) == number)
        else {
            continue;
        };
        let field = &shape.fields[index];
        let (entries, cost) = match (&field.kind, &value) {
            // Twice the struct: a `Vec` may hold up to twice its length.
            (Kind::Message(sub), WireValue::Bytes(payload)) => (
                1,
                walk(payload, sub, limits, totals, depth + 1)?
                    .saturating_add(sub.struct_bytes.saturating_mul(2)),
            ),
            (Kind::Scalars(each), value) => {
                let entries = scalar_entries(value);
                (entries, entries.saturating_mul(each.saturating_mul(2)))
            }
            (Kind::Bytes, WireValue::Bytes(payload)) => (1, payload.len()),
            // The wrong wire type: prost refuses the message.
            _ => (0, 0),
        };
        bytes = bytes.saturating_add(cost);
        if let Some(cap) = field.cap {
            let count = match here.get_mut(index).filter(|_| !cap.per_request) {
                Some(slot) => {
                    *slot = slot.saturating_add(entries);
                    *slot
                }
                None => match totals.iter_mut().find(|(what, _)| *what == cap.what) {
                    Some((_, total)) => {
                        *total = total.saturating_add(entries);
                        *total
                    }
                    None => {
                        totals.push((cap.what, entries));
                        entries
                    }
                },
            };
            let limit = limits.of(cap.limit);
            if count > limit {
                return Err(OverLimit {
                    what: cap.what,
                    limit_kind: cap.limit,
                    count,
                    limit,
                });
            }
        }
    }
    Ok(bytes)
}

/// Shapes of the requests the ingest paths decode with prost.
pub mod shapes {
    use super::*;
    use kiln_api::parca::profilestore::v1alpha1 as parca;
    use kiln_api::push::v1 as push;
    use kiln_api::types::v1::LabelPair;

    const fn capped(number: u32, kind: Kind, what: &'static str, limit: Limit) -> Field {
        Field {
            number,
            kind,
            cap: Some(Cap {
                what,
                limit,
                per_request: true,
            }),
        }
    }

    const fn plain(number: u32, kind: Kind) -> Field {
        Field {
            number,
            kind,
            cap: None,
        }
    }

    static PARCA_LABEL: Shape = Shape {
        struct_bytes: size_of::<parca::Label>(),
        fields: &[plain(1, Kind::Bytes), plain(2, Kind::Bytes)],
    };
    static PARCA_LABEL_SET: Shape = Shape {
        struct_bytes: size_of::<parca::LabelSet>(),
        fields: &[plain(1, Kind::Message(&PARCA_LABEL))],
    };
    static PARCA_LOAD_SEGMENT: Shape = Shape {
        struct_bytes: size_of::<parca::LoadSegment>(),
        fields: &[],
    };
    static PARCA_EXECUTABLE_INFO: Shape = Shape {
        struct_bytes: size_of::<parca::ExecutableInfo>(),
        fields: &[plain(2, Kind::Message(&PARCA_LOAD_SEGMENT))],
    };
    static PARCA_SAMPLE: Shape = Shape {
        struct_bytes: size_of::<parca::RawSample>(),
        fields: &[
            plain(1, Kind::Bytes),
            plain(2, Kind::Message(&PARCA_EXECUTABLE_INFO)),
        ],
    };
    static PARCA_SERIES: Shape = Shape {
        struct_bytes: size_of::<parca::RawProfileSeries>(),
        fields: &[
            plain(1, Kind::Message(&PARCA_LABEL_SET)),
            capped(2, Kind::Message(&PARCA_SAMPLE), "profiles", Limit::Profiles),
        ],
    };
    /// `parca.profilestore.v1alpha1.WriteRawRequest`: series and profiles
    /// bounded per request (every series must hold a profile, so there
    /// can be no more series than profiles).
    pub static WRITE_RAW: Shape = Shape {
        struct_bytes: size_of::<parca::WriteRawRequest>(),
        fields: &[
            plain(1, Kind::Bytes),
            capped(2, Kind::Message(&PARCA_SERIES), "series", Limit::Series),
            capped(1000, Kind::Bytes, "idempotency keys", Limit::Series),
        ],
    };

    static PUSH_LABEL: Shape = Shape {
        struct_bytes: size_of::<LabelPair>(),
        fields: &[plain(1, Kind::Bytes), plain(2, Kind::Bytes)],
    };
    static PUSH_SAMPLE: Shape = Shape {
        struct_bytes: size_of::<push::RawSample>(),
        fields: &[plain(1, Kind::Bytes), plain(2, Kind::Bytes)],
    };
    static PUSH_SERIES: Shape = Shape {
        struct_bytes: size_of::<push::RawProfileSeries>(),
        fields: &[
            plain(1, Kind::Message(&PUSH_LABEL)),
            capped(2, Kind::Message(&PUSH_SAMPLE), "profiles", Limit::Profiles),
        ],
    };
    /// `push.v1.PushRequest`, bounded like [`WRITE_RAW`].
    pub static PUSH: Shape = Shape {
        struct_bytes: size_of::<push::PushRequest>(),
        fields: &[capped(
            1,
            Kind::Message(&PUSH_SERIES),
            "series",
            Limit::Series,
        )],
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_api::parca::profilestore::v1alpha1 as parca;
    use prost::Message;

    fn limits() -> Limits {
        Limits {
            series: 4,
            profiles: 6,
            samples: 10,
            stack_depth: 10,
            table_entries: 10,
        }
    }

    fn series(profiles: usize) -> parca::RawProfileSeries {
        parca::RawProfileSeries {
            labels: Some(parca::LabelSet {
                labels: vec![parca::Label {
                    name: "__name__".into(),
                    value: "cpu".into(),
                }],
            }),
            samples: (0..profiles)
                .map(|_| parca::RawSample {
                    raw_profile: vec![1; 100],
                    executable_info: Vec::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn empty_series_are_refused_at_the_series_limit() {
        // The shape of the amplification attack: nothing but `12 00`.
        let body = [0x12, 0x00].repeat(1_000);
        let err = scan(&body, &shapes::WRITE_RAW, &limits()).unwrap_err();
        assert_eq!(
            err,
            OverLimit {
                what: "series",
                limit_kind: Limit::Series,
                count: 5,
                limit: 4
            }
        );
    }

    #[test]
    fn profiles_are_counted_over_the_whole_request() {
        let ok = parca::WriteRawRequest {
            series: vec![series(3), series(3)],
            ..Default::default()
        };
        let scan_ok = scan(&ok.encode_to_vec(), &shapes::WRITE_RAW, &limits()).unwrap();
        assert_eq!((scan_ok.count("series"), scan_ok.count("profiles")), (2, 6));
        // At least what the payloads and the structs take.
        assert!(scan_ok.decoded_bytes >= 600 + 8 * size_of::<parca::RawSample>());
        let over = parca::WriteRawRequest {
            series: vec![series(3), series(4)],
            ..Default::default()
        };
        let err = scan(&over.encode_to_vec(), &shapes::WRITE_RAW, &limits()).unwrap_err();
        assert_eq!((err.what, err.count, err.limit), ("profiles", 7, 6));
    }

    #[test]
    fn the_estimate_covers_the_decoded_structs() {
        let body = [0x12, 0x00].repeat(4);
        let scan = scan(&body, &shapes::WRITE_RAW, &limits()).unwrap();
        assert!(scan.decoded_bytes >= 4 * size_of::<parca::RawProfileSeries>());
    }

    #[test]
    fn malformed_bytes_end_the_walk_for_prost_to_report() {
        assert!(scan(&[0x12, 0x7f], &shapes::WRITE_RAW, &limits()).is_ok());
        assert!(scan(&[0xff], &shapes::PUSH, &limits()).is_ok());
    }
}
