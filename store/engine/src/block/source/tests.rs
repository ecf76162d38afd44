use super::*;
use crate::block::format::{BlobCompressor, BlockCompression, write_blob};

/// A block held in memory, read by range.
struct Bytes(Vec<u8>);

impl BlockRanges for Bytes {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_range(&mut self, offset: u64, len: usize, buf: &mut Vec<u8>) -> std::io::Result<()> {
        let start = offset as usize;
        buf.extend_from_slice(&self.0[start..start + len]);
        Ok(())
    }
}

/// A raw data section of `count` blobs (some compressed, some not) after
/// a 7-byte prefix, with each blob's raw bytes.
fn data_section(count: usize) -> (Bytes, SectionEntry, Vec<(BlobRef, Vec<u8>)>) {
    let prefix = 7;
    let mut compressor = BlobCompressor::new(BlockCompression::Working).expect("zstd");
    let mut section = Vec::new();
    let mut blobs = Vec::new();
    for i in 0..count {
        let raw: Vec<u8> = (0..(i * 37) % 400).map(|j| (i * 7 + j / 3) as u8).collect();
        let offset = section.len();
        write_blob(&raw, &mut compressor, &mut section).expect("blob");
        let blob = BlobRef {
            offset,
            len: section.len() - offset,
        };
        blobs.push((blob, raw));
    }
    let entry = SectionEntry {
        kind: SectionKind::Data,
        compression: 0,
        offset: prefix as u64,
        len: section.len() as u64,
        raw_len: section.len() as u64,
        crc: crc32fast::hash(&section),
    };
    let mut block = vec![0xAA; prefix];
    block.extend_from_slice(&section);
    (Bytes(block), entry, blobs)
}

#[test]
fn a_window_serves_blobs_forward_repeated_skipped_and_behind_it() {
    let (block, entry, blobs) = data_section(200);
    // Forward, each blob twice, then some skipped, then one behind.
    let mut order: Vec<usize> = (0..100).flat_map(|i| [i, i]).collect();
    order.extend((100..200).step_by(7));
    order.extend([5, 199, 198]);
    let mut window = DataWindow::open(block, entry, 4096, BlobCheck::ByBlob).expect("open");
    // The window is at least 4096 bytes; the section must span several.
    assert!(entry.len > 3 * 4096, "section of {} bytes", entry.len);
    for i in order {
        let (blob, raw) = &blobs[i];
        let read = window.blob(*blob).expect("blob");
        assert_eq!(read.as_ref(), raw.as_slice(), "blob {i}");
    }
    window.finish().expect("the section's CRC checks");
}

#[test]
fn a_window_refuses_a_section_whose_bytes_do_not_match_its_crc() {
    let (mut block, entry, blobs) = data_section(60);
    let last = block.0.len() - 1;
    block.0[last] ^= 0xFF;
    let mut window = DataWindow::open(block, entry, 4096, BlobCheck::ByBlob).expect("open");
    let (blob, _) = &blobs[0];
    window.blob(*blob).expect("the first blob is intact");
    assert!(matches!(
        window.finish(),
        Err(BlockError::ChecksumMismatch { section: "data" })
    ));
}
