//! A block opened by range (`Block::open_ranged`: tables, directory and
//! index held, blobs read from the stored block as queries ask) answers
//! exactly as the block decoded whole, holds less than its data section,
//! reads little for a narrow query, and refuses damaged data: a damaged
//! blob when a query reads it, a format 1 block's damaged data section at
//! open.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kiln_engine::block::format::section_sizes;
use kiln_engine::{
    Block, BlockCompression, BlockError, BlockRanges, CompiledSelector, MatchOp, Matcher,
    MergedProfile, Queryable, Selector, TimeRange, compact_streaming, projected_ranged_hold,
};
use kiln_testkit::blocks::content::{content, everything};
use kiln_testkit::blocks::streaming::{FileRanges, HOUR, go_profiles, write_hour_blocks};

/// The read window: small, so that the test's blocks are many windows long.
const WINDOW: usize = 4096;

/// The smallest rollup window.
const MINUTE: i64 = 60_000;

/// A block file that counts the bytes read from it.
struct Counted {
    file: FileRanges,
    read: Arc<AtomicU64>,
}

impl BlockRanges for Counted {
    fn size(&self) -> u64 {
        self.file.size()
    }

    fn read_range(&mut self, offset: u64, len: usize, buf: &mut Vec<u8>) -> std::io::Result<()> {
        self.read.fetch_add(len as u64, Ordering::Relaxed);
        self.file.read_range(offset, len, buf)
    }
}

/// The block at `path` opened by range, the count of bytes read from it
/// (so far: what opening it read) and its size.
fn open_counted(path: &Path) -> (Block, Arc<AtomicU64>, u64) {
    let read = Arc::new(AtomicU64::new(0));
    let file = FileRanges::open(path);
    let size = file.size();
    let counted = Counted {
        file,
        read: Arc::clone(&read),
    };
    (Block::open_ranged(counted, WINDOW).unwrap(), read, size)
}

/// One block of 12 pods over 3 hours of real Go profiles (merged from hour
/// blocks, as compaction writes it), or `None` (said in the output; a
/// failure in CI) when Go is missing.
fn merged_block(dir: &Path) -> Option<std::path::PathBuf> {
    let profiles = go_profiles(dir)?;
    let (paths, _) = write_hour_blocks(dir, &profiles, 12, 3, 60_000);
    let sources: Vec<FileRanges> = paths.iter().map(|p| FileRanges::open(p)).collect();
    let mut out = std::io::Cursor::new(Vec::new());
    compact_streaming(
        sources,
        "merged",
        "test",
        64 << 10,
        BlockCompression::Working,
        &mut out,
    )
    .unwrap();
    let path = dir.join("merged.block");
    std::fs::write(&path, out.into_inner()).unwrap();
    Some(path)
}

fn one_pod(block: &Block) -> CompiledSelector {
    let profile_type = block
        .profile_types(everything())
        .into_iter()
        .next()
        .unwrap();
    let labels = block.series(&[], everything()).unwrap();
    let pod = labels[0].iter().find(|l| l.name == "pod").unwrap();
    CompiledSelector::new(&Selector {
        profile_type,
        matchers: vec![Matcher {
            name: "pod".into(),
            op: MatchOp::Equal,
            value: pod.value.clone(),
        }],
    })
    .unwrap()
}

#[test]
fn a_block_read_by_range_answers_as_the_block_decoded_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(path) = merged_block(tmp.path()) else {
        return;
    };
    let whole = Block::decode(&std::fs::read(&path).unwrap()).unwrap();
    let ranged = Block::open_ranged(FileRanges::open(&path), WINDOW).unwrap();
    assert!(ranged.reads_data_by_range() && !whole.reads_data_by_range());
    assert_eq!(ranged.meta(), whole.meta());
    let answers = content(&whole);
    assert!(answers.len() >= 12, "every pod's series: {}", answers.len());
    assert_eq!(content(&ranged), answers);
    // Ranges that cut hours and minutes read raw chunks and rollups alike.
    let meta = whole.meta();
    for (from, to) in [
        (0, HOUR),
        (HOUR / 2 + 7_000, 2 * HOUR + 90_000),
        (0, 3 * HOUR),
    ] {
        let range = TimeRange {
            start_ms: meta.min_time_ms + from,
            end_ms: meta.min_time_ms + to,
        };
        let selector = one_pod(&whole);
        let (mut a, mut b) = (MergedProfile::new(), MergedProfile::new());
        whole.merge_into(&selector, range, &mut a).unwrap();
        ranged.merge_into(&selector, range, &mut b).unwrap();
        let (mut a, mut b) = (a.stacks(), b.stacks());
        a.sort();
        b.sort();
        assert!(!a.is_empty());
        assert_eq!(a, b, "range {from}..{to}");
    }
    // What it holds: its tables, not its data.
    let sections = section_sizes(&std::fs::read(&path).unwrap()).unwrap();
    let data = sections.iter().find(|s| s.kind == "data").unwrap();
    assert!(
        data.stored > 4 * WINDOW as u64,
        "the data section ({} bytes) is larger than a few windows",
        data.stored
    );
    let (held, decoded) = (ranged.approx_decoded_bytes(), whole.approx_decoded_bytes());
    assert!(
        held as u64 + data.stored <= decoded as u64 + WINDOW as u64,
        "read by range it holds {held} bytes, decoded whole {decoded}"
    );
    // The cache and compaction charge a large block what this projects.
    let projected = projected_ranged_hold(&sections);
    assert!(
        held as u64 <= projected + WINDOW as u64,
        "held {held} bytes, projected {projected}"
    );
}

#[test]
fn a_narrow_query_reads_a_window_not_the_block() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(path) = merged_block(tmp.path()) else {
        return;
    };
    let data = data_section(&std::fs::read(&path).unwrap());
    let (block, read, size) = open_counted(&path);
    // Its blobs carry their own CRCs, so opening reads the header, tables,
    // directory and index, and none of the data section.
    let at_open = read.load(Ordering::Relaxed);
    assert!(
        at_open <= size - data.stored + 4096,
        "{at_open} of {size} bytes read at open, {} of them data",
        data.stored
    );
    let meta = block.meta();
    let range = TimeRange {
        start_ms: meta.min_time_ms,
        end_ms: meta.min_time_ms + HOUR,
    };
    let mut merged = MergedProfile::new();
    block
        .merge_into(&one_pod(&block), range, &mut merged)
        .unwrap();
    assert!(!merged.stacks().is_empty());
    let by_query = read.load(Ordering::Relaxed) - at_open;
    assert!(
        by_query <= 2 * WINDOW as u64 && by_query < size / 4,
        "one pod's hour read {by_query} bytes of a {size}-byte block"
    );
}

fn data_section(block: &[u8]) -> kiln_engine::block::format::SectionSize {
    section_sizes(block)
        .unwrap()
        .into_iter()
        .find(|s| s.kind == "data")
        .unwrap()
}

/// `bytes` with one bit flipped in the middle of the data section.
fn damage_data(bytes: &[u8]) -> Vec<u8> {
    let data = data_section(bytes);
    let mut damaged = bytes.to_vec();
    let at = usize::try_from(data.offset + data.stored / 2).unwrap();
    damaged[at] ^= 0x40;
    damaged
}

#[test]
fn a_damaged_blob_is_refused_by_the_query_that_reads_it() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(path) = merged_block(tmp.path()) else {
        return;
    };
    let bytes = damage_data(&std::fs::read(&path).unwrap());
    let damaged = tmp.path().join("damaged.block");
    std::fs::write(&damaged, &bytes).unwrap();
    // Decoded whole, the data section's own CRC refuses it at once.
    assert!(matches!(
        Block::decode(&bytes),
        Err(BlockError::ChecksumMismatch { section: "data" })
    ));
    // Opened by range, it opens (its data is not read). Between them, a
    // merge from raw columns only, a timeline (from totals) and merges of
    // every rollup window read every blob; the one that reaches the
    // damaged blob is refused, never answered from it.
    let block = Block::open_ranged(FileRanges::open(&damaged), WINDOW).unwrap();
    let meta = block.meta();
    let span = TimeRange {
        start_ms: meta.min_time_ms,
        end_ms: meta.max_time_ms + 1,
    };
    let mut answers = Vec::new();
    for profile_type in block.profile_types(everything()) {
        let selector = CompiledSelector::new(&Selector {
            profile_type,
            matchers: vec![],
        })
        .unwrap();
        answers.push(block.merge_into_without_rollups(&selector, span, &mut MergedProfile::new()));
        let mut timeline = kiln_engine::Timeline::new(span, 60_000).unwrap();
        answers.push(block.timeline_into(&selector, span, &mut timeline));
        // Every aligned minute and hour of the span on its own: each one
        // is answered from its rollup window, so every rollup chunk of
        // every level is read by one of them.
        for window in [MINUTE, HOUR] {
            let mut start = span.start_ms - span.start_ms.rem_euclid(window);
            while start < span.end_ms {
                let range = TimeRange {
                    start_ms: start,
                    end_ms: start + window,
                };
                answers.push(block.merge_into(&selector, range, &mut MergedProfile::new()));
                start += window;
            }
        }
    }
    let refused = |answer: &Result<(), kiln_engine::QueryError>| {
        matches!(
            answer,
            Err(kiln_engine::QueryError::CorruptBlock {
                source: BlockError::ChecksumMismatch {
                    section: "data blob"
                },
                ..
            })
        )
    };
    assert!(answers.iter().any(refused), "{answers:?}");
    assert!(
        answers.iter().all(|a| a.is_ok() || refused(a)),
        "{answers:?}"
    );
    // A block cut short is refused at open.
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    assert!(Block::open_ranged(FileRanges::open(&damaged), WINDOW).is_err());
}

/// A format 1 block: its blobs have no CRC of their own, so opening it by
/// range still reads and checks the whole data section. Made by relabelling
/// a block of this build as format 1; it is only opened, never queried
/// (its blobs' trailing CRCs would read as payload).
#[test]
fn a_format_1_block_with_a_damaged_data_section_is_refused_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(path) = merged_block(tmp.path()) else {
        return;
    };
    let mut bytes = std::fs::read(&path).unwrap();
    let count = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let header_len = 16 + count * (4 + 1 + 8 + 8 + 8 + 4);
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32fast::hash(&bytes[..header_len]);
    bytes[header_len..header_len + 4].copy_from_slice(&crc.to_le_bytes());
    let relabelled = tmp.path().join("format-1.block");
    std::fs::write(&relabelled, &bytes).unwrap();
    let (_, read, size) = open_counted(&relabelled);
    let at_open = read.load(Ordering::Relaxed);
    assert!(
        at_open >= size,
        "{at_open} of {size}: the data section is read"
    );
    std::fs::write(&relabelled, damage_data(&bytes)).unwrap();
    let opened = Block::open_ranged(FileRanges::open(&relabelled), WINDOW);
    assert!(
        matches!(
            opened,
            Err(BlockError::ChecksumMismatch { section: "data" })
        ),
        "{opened:?}"
    );
}
