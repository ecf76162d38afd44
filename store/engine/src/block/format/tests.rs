//! Layout tests: section order, and blocks laid out by earlier builds.

use super::*;
use crate::model::{Label, LabelSet};
use crate::{Block, Head, IngestLimits, encode_block};
use kiln_pprof::ProfileBuilder;

fn block_bytes() -> Vec<u8> {
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    for i in 0..40u64 {
        let f = b.function(&kiln_pprof::FunctionSpec {
            name: format!("function_{i}"),
            system_name: String::new(),
            filename: "main.go".into(),
            start_line: 1,
        });
        let loc = b.location(0, 0x1000 + i, &[(f, 10)]);
        b.sample(&[loc], &[10 + i as i64], &[]);
    }
    let profile = kiln_pprof::decode(
        &kiln_pprof::encode_gzip(&b.finish()),
        &kiln_pprof::DecodeLimits::default(),
    )
    .expect("built profile decodes");
    let mut head = Head::new();
    for pod in 0..5 {
        let labels = LabelSet::new(vec![
            Label::new("__name__", "process_cpu"),
            Label::new("pod", format!("pod-{pod}")),
        ]);
        for t in 0..30 {
            head.ingest(&profile, &labels, t * 10_000, 10, &IngestLimits::default())
                .expect("ingest");
        }
    }
    encode_block(&head, "01LAYOUT", "test").expect("encode").1
}

/// Every totals row of every series of `block`.
fn totals(block: &Block) -> Vec<(i64, i64, u64)> {
    block
        .series
        .iter()
        .flat_map(|s| block.totals(s).expect("totals read"))
        .collect()
}

/// The section table: `(kind, compression, offset, len, raw len, crc)`.
fn entries(bytes: &[u8]) -> Vec<(u32, u8, u64, u64, u64, u32)> {
    let mut r = Reader::new(&bytes[MAGIC.len() + 4..]);
    let count = r.u32_le().expect("count");
    (0..count)
        .map(|_| {
            (
                r.u32_le().expect("kind"),
                r.byte().expect("compression"),
                r.u64_le().expect("offset"),
                r.u64_le().expect("len"),
                r.u64_le().expect("raw len"),
                r.u32_le().expect("crc"),
            )
        })
        .collect()
}

/// Rewrites a block with its data section last, as builds before the
/// in-place assembly laid blocks out.
fn data_last(bytes: &[u8]) -> Vec<u8> {
    let mut sections = entries(bytes);
    sections.sort_by_key(|e| e.0 == SectionKind::Data as u32);
    let header_len = header_len(sections.len());
    let mut header = Writer::new();
    header.raw(MAGIC);
    header.u32_le(FORMAT_VERSION);
    header.u32_le(sections.len() as u32);
    let mut offset = header_len as u64;
    let mut body = Vec::new();
    for &(kind, compression, old_offset, len, raw_len, crc) in &sections {
        header.u32_le(kind);
        header.byte(compression);
        header.u64_le(offset);
        header.u64_le(len);
        header.u64_le(raw_len);
        header.u32_le(crc);
        offset += len;
        body.extend_from_slice(&bytes[old_offset as usize..(old_offset + len) as usize]);
    }
    let crc = crc32fast::hash(header.as_slice());
    header.u32_le(crc);
    let mut out = header.into_vec();
    out.extend_from_slice(&body);
    out
}

/// A block held in memory, read by range as compaction reads one.
struct InMemory(Vec<u8>);

impl crate::BlockRanges for InMemory {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_range(&mut self, offset: u64, len: usize, buf: &mut Vec<u8>) -> std::io::Result<()> {
        let start = offset as usize;
        let bytes = self
            .0
            .get(start..start + len)
            .ok_or_else(|| std::io::Error::other("read past the end"))?;
        buf.extend_from_slice(bytes);
        Ok(())
    }
}

#[test]
fn blocks_with_their_data_section_last_compact_by_range_alike() {
    let bytes = block_bytes();
    let merge = |sources: Vec<InMemory>| {
        let mut out = std::io::Cursor::new(Vec::new());
        crate::compact_streaming(
            sources,
            "01MERGED",
            "test",
            4096,
            crate::BlockCompression::Working,
            &mut out,
        )
        .expect("compacts");
        out.into_inner()
    };
    let new_layout = merge(vec![InMemory(bytes.clone()), InMemory(bytes.clone())]);
    let old_layout = merge(vec![
        InMemory(data_last(&bytes)),
        InMemory(data_last(&bytes)),
    ]);
    assert_eq!(new_layout, old_layout);
    let source = Block::decode(&bytes).expect("source decodes");
    let merged = Block::decode(&new_layout).expect("merged decodes");
    let total = |block: &Block| -> i64 {
        block
            .series
            .iter()
            .flat_map(|s| block.totals(s).expect("totals read"))
            .map(|(_, total, _)| total)
            .sum()
    };
    assert_eq!(total(&merged), 2 * total(&source));
    assert!(total(&source) > 0);
}

#[test]
fn data_section_comes_first_and_blocks_with_it_last_still_read_alike() {
    let bytes = block_bytes();
    let table = entries(&bytes);
    let data = table
        .iter()
        .find(|e| e.0 == SectionKind::Data as u32)
        .expect("a data section");
    assert_eq!(
        data.2,
        header_len(table.len()) as u64,
        "data right after the header"
    );
    let old_layout = data_last(&bytes);
    assert_eq!(old_layout.len(), bytes.len());
    assert_ne!(old_layout, bytes);
    let new = Block::decode(&bytes).expect("new layout decodes");
    let old = Block::decode(&old_layout).expect("old layout decodes");
    assert_eq!(new.meta(), old.meta());
    assert_eq!(new.data.loaded_bytes(), old.data.loaded_bytes());
    assert!(new.data.loaded_bytes().is_some());
    assert_eq!(format!("{:?}", new.series), format!("{:?}", old.series));
    assert_eq!(
        format!("{:?}", new.symbols.nodes),
        format!("{:?}", old.symbols.nodes)
    );
    assert_eq!(totals(&new), totals(&old));
    assert!(!totals(&new).is_empty());
}

#[test]
fn section_sizes_match_the_section_table_and_add_up_to_the_block() {
    let bytes = block_bytes();
    let sizes = section_sizes(&bytes).expect("sizes");
    let table = entries(&bytes);
    assert_eq!(sizes.len(), table.len());
    for (size, &(kind, _, offset, len, raw_len, _)) in sizes.iter().zip(&table) {
        let kind = SectionKind::from_u32(kind).expect("known kind");
        assert_eq!(
            (size.kind, size.offset, size.stored, size.raw),
            (kind.name(), offset, len, raw_len)
        );
    }
    let stored: u64 = sizes.iter().map(|s| s.stored).sum();
    let header = header_len(table.len()) as u64;
    assert_eq!(
        stored + header,
        bytes.len() as u64,
        "sections and header are the block"
    );
    // A header whose table was damaged is refused, not misread.
    let mut damaged = bytes.clone();
    damaged[PREAMBLE_LEN + 3] ^= 0xff;
    assert!(section_sizes(&damaged).is_err());
}

/// A block decoded from a fetched buffer it may keep holds its data section
/// in that buffer, not in a copy, is charged the whole buffer, and answers
/// exactly as one decoded from a borrowed slice.
#[test]
fn a_shared_decode_holds_the_fetched_buffer_and_reads_alike() {
    let bytes = bytes::Bytes::from(block_bytes());
    let shared = Block::decode_shared(bytes.clone()).expect("shared decode");
    let copied = Block::decode(&bytes).expect("decode");
    let data = shared.data.loaded_bytes().expect("data held");
    let within = bytes.as_ptr_range();
    assert!(within.contains(&data.as_ptr()), "the section is not a copy");
    assert_eq!(Some(data), copied.data.loaded_bytes());
    assert_eq!(shared.data.held_bytes(), bytes.len());
    assert!(copied.data.held_bytes() < bytes.len());
    assert!(!totals(&shared).is_empty());
    assert_eq!(totals(&shared), totals(&copied));
    // A damaged buffer is refused the same way either way.
    let mut damaged = bytes.to_vec();
    let last = damaged.len() - 1;
    damaged[last] ^= 0xff;
    assert!(Block::decode_shared(bytes::Bytes::from(damaged.clone())).is_err());
    assert!(Block::decode(&damaged).is_err());
}
