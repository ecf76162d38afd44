//! A stored block's series, read for a store's series census: its string
//! table and series directory, by range, and nothing else. The symbol
//! tables, the label index and the data section are never read, so a
//! census of a large block costs its strings and directory, not the
//! block.

use super::format::SectionKind;
use super::source::SourceHeader;
use super::{BlockRanges, read_series_entry};
use crate::error::BlockError;
use crate::model::{BlockMeta, LabelSet};
use crate::wire::Reader;

/// One series of a stored block, as a census counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSeries {
    /// The series' labels, exactly as the head that wrote it held them.
    pub labels: LabelSet,
    /// The profile type's name (the `__name__` the series was written under).
    pub profile_name: String,
    /// The series' newest sample time in the block, unix ms.
    pub max_ms: i64,
}

/// A stored block opened for its series directory: the header and
/// metadata are read; the directory waits for
/// [`BlockSeriesDirectory::for_each_series`], so a caller can weigh
/// [`BlockSeriesDirectory::read_bytes`] against its budget first.
pub struct BlockSeriesDirectory<R> {
    ranges: R,
    header: SourceHeader,
}

impl<R> std::fmt::Debug for BlockSeriesDirectory<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockSeriesDirectory")
            .field("block", &self.header.meta.id)
            .finish_non_exhaustive()
    }
}

impl<R: BlockRanges> BlockSeriesDirectory<R> {
    /// Reads and checks the block's header and metadata.
    pub fn open(mut ranges: R) -> Result<Self, BlockError> {
        let header = SourceHeader::read(&mut ranges)?;
        Ok(Self { ranges, header })
    }

    /// The block's metadata.
    pub fn meta(&self) -> &BlockMeta {
        &self.header.meta
    }

    /// Bytes that reading the series holds at once, at most: the string
    /// table and the series directory, decompressed, plus one string
    /// reference (16 bytes) per string.
    pub fn read_bytes(&self) -> u64 {
        let sections = self
            .header
            .decompressed_bytes(&[SectionKind::Strings, SectionKind::Series]);
        // A string takes at least its length byte in the section, so the
        // section's length bounds the references.
        sections.saturating_add(
            self.header
                .decompressed_bytes(&[SectionKind::Strings])
                .saturating_mul(16),
        )
    }

    /// Reads the string table and the series directory, both checked
    /// against their CRCs, and calls `visit` with each series.
    pub fn for_each_series(
        mut self,
        mut visit: impl FnMut(StoredSeries),
    ) -> Result<(), BlockError> {
        let strings = self
            .header
            .section(&mut self.ranges, SectionKind::Strings)?;
        let strings = string_table(&strings)?;
        let directory = self.header.section(&mut self.ranges, SectionKind::Series)?;
        let data = self.header.entry(SectionKind::Data)?;
        let data_len = if data.is_raw() {
            data.len
        } else {
            data.raw_len
        };
        let data_len =
            usize::try_from(data_len).map_err(|_| BlockError::Truncated { what: "data" })?;
        let string_of = |id: u32| strings.get(id as usize).copied();
        let mut r = Reader::new(&directory);
        let count = r
            .count(8)
            .map_err(|_| BlockError::Corrupt { what: "series" })?;
        for _ in 0..count {
            let series = read_series_entry(&mut r, &string_of, data_len)?;
            visit(StoredSeries {
                labels: series.labels,
                profile_name: series.profile_type.name,
                max_ms: series.max_ms,
            });
        }
        Ok(())
    }
}

/// The block's strings, borrowed from the section's bytes.
fn string_table(bytes: &[u8]) -> Result<Vec<&str>, BlockError> {
    let what = "strings";
    let mut r = Reader::new(bytes);
    let count = r.count(1).map_err(|_| BlockError::Corrupt { what })?;
    let mut strings = Vec::with_capacity(count);
    for _ in 0..count {
        let raw = r.bytes().map_err(|_| BlockError::Corrupt { what })?;
        strings.push(std::str::from_utf8(raw).map_err(|_| BlockError::Corrupt { what })?);
    }
    Ok(strings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Label;
    use crate::{Head, IngestLimits, SeriesCensus, encode_block};

    /// A block held in memory, read by range.
    struct InMemory(Vec<u8>);

    impl BlockRanges for InMemory {
        fn size(&self) -> u64 {
            self.0.len() as u64
        }

        fn read_range(
            &mut self,
            offset: u64,
            len: usize,
            buf: &mut Vec<u8>,
        ) -> std::io::Result<()> {
            let start = usize::try_from(offset).expect("small block");
            let piece = self.0.get(start..start + len).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "past the block")
            })?;
            buf.extend_from_slice(piece);
            Ok(())
        }
    }

    fn cpu_profile(function: &str) -> kiln_pprof::Profile {
        let mut b = kiln_pprof::ProfileBuilder::new(&[("cpu", "nanoseconds")]);
        let f = b.function(&kiln_pprof::FunctionSpec {
            name: function.into(),
            ..Default::default()
        });
        let loc = b.location(0, 0x1000, &[(f, 1)]);
        b.sample(&[loc], &[10], &[]);
        let bytes = kiln_pprof::encode_gzip(&b.finish());
        kiln_pprof::decode(&bytes, &kiln_pprof::DecodeLimits::default()).expect("decodes")
    }

    #[test]
    fn a_blocks_series_read_by_range_are_the_heads_series_with_their_newest_time() {
        let mut head = Head::new();
        for pod in 0..5 {
            let labels = LabelSet::new(vec![
                Label::new("__name__", "process_cpu"),
                Label::new("namespace", "shop"),
                Label::new("pod", format!("pod-{pod}")),
            ]);
            for (i, time_ms) in [1_000, 9_000 + pod].into_iter().enumerate() {
                head.ingest(
                    &cpu_profile(&format!("f{i}")),
                    &labels,
                    time_ms,
                    10,
                    &IngestLimits::default(),
                )
                .expect("ingest");
            }
        }
        let (meta, bytes) = encode_block(&head, "block-1", "r1").expect("encode");
        let directory = BlockSeriesDirectory::open(InMemory(bytes)).expect("open");
        assert_eq!(directory.meta().id, meta.id);
        assert!(directory.read_bytes() > 0);
        let mut series = Vec::new();
        directory
            .for_each_series(|s| series.push(s))
            .expect("series");
        assert_eq!(series.len(), 5);
        for s in &series {
            assert!(head.holds_series(&s.labels), "{:?}", s.labels);
            assert_eq!(s.profile_name, "process_cpu");
            let pod: i64 = s.labels.get("pod").expect("pod")[4..].parse().expect("n");
            assert_eq!(s.max_ms, 9_000 + pod);
        }
    }

    #[test]
    fn a_damaged_directory_is_an_error_not_a_panic() {
        let mut head = Head::new();
        let labels = LabelSet::new(vec![Label::new("__name__", "process_cpu")]);
        head.ingest(
            &cpu_profile("main"),
            &labels,
            1_000,
            10,
            &IngestLimits::default(),
        )
        .expect("ingest");
        let (_, mut bytes) = encode_block(&head, "block-1", "r1").expect("encode");
        let len = bytes.len();
        for at in (len / 2..len).step_by(7) {
            bytes[at] ^= 0x5a;
        }
        let result =
            BlockSeriesDirectory::open(InMemory(bytes)).and_then(|d| d.for_each_series(|_| {}));
        assert!(result.is_err(), "a damaged block read as good");
    }
}
