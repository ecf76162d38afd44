//! `compact_streaming` (sources read by range, output written as it grows)
//! merges real profiles into the same content as the in-memory
//! `compact_blocks`: the same series, totals, timelines and stacks, and
//! every source value exactly once. Corrupt sources are refused with the
//! source named, never merged.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;

use kiln_engine::block::format::section_sizes;
use kiln_engine::{
    Block, BlockCompression, BlockError, CompactionError, CompiledSelector, MergeLimits,
    MergeOutput, MergedProfile, Queryable, Selector, StreamedMerge, TimeRange, compact_blocks,
    compact_streaming, compact_streaming_within, projected_ranged_hold,
};
use kiln_testkit::blocks::content::{Content, content, everything};
use kiln_testkit::blocks::streaming::{FileRanges, go_profiles, write_hour_blocks};

fn streamed(
    paths: &[std::path::PathBuf],
    window: usize,
) -> (kiln_engine::model::BlockMeta, Vec<u8>) {
    streamed_as(paths, window, BlockCompression::Working)
}

fn streamed_as(
    paths: &[std::path::PathBuf],
    window: usize,
    compression: BlockCompression,
) -> (kiln_engine::model::BlockMeta, Vec<u8>) {
    let sources: Vec<FileRanges> = paths.iter().map(|p| FileRanges::open(p)).collect();
    let mut out = Cursor::new(Vec::new());
    let meta = compact_streaming(sources, "merged", "test", window, compression, &mut out).unwrap();
    (meta, out.into_inner())
}

/// Hour blocks of 12 pods over 3 hours of real Go profiles, or `None`
/// (said in the output; a failure in CI) when Go is missing.
fn twelve_pods_three_hours(dir: &Path) -> Option<Vec<std::path::PathBuf>> {
    let profiles = go_profiles(dir)?;
    Some(write_hour_blocks(dir, &profiles, 12, 3, 60_000).0)
}

#[test]
fn an_archive_merge_holds_the_same_content_in_fewer_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(paths) = twelve_pods_three_hours(tmp.path()) else {
        return;
    };
    let (working_meta, working) = streamed(&paths, 64 << 10);
    let (archive_meta, archive) = streamed_as(&paths, 64 << 10, BlockCompression::Archive);
    assert_eq!(archive_meta.size_bytes, archive.len() as u64);
    assert_eq!(
        (
            archive_meta.series,
            archive_meta.samples,
            archive_meta.profiles
        ),
        (
            working_meta.series,
            working_meta.samples,
            working_meta.profiles
        )
    );
    let working = Block::decode(&working).unwrap();
    let archived = Block::decode(&archive).unwrap();
    assert_eq!(content(&archived), content(&working));
    assert!(
        archive_meta.size_bytes < working_meta.size_bytes,
        "archive {} bytes, working {} bytes",
        archive_meta.size_bytes,
        working_meta.size_bytes
    );
}

fn decode_all(paths: &[std::path::PathBuf]) -> Vec<Block> {
    paths
        .iter()
        .map(|p| Block::decode(&std::fs::read(p).unwrap()).unwrap())
        .collect()
}

#[test]
fn streaming_merge_of_real_go_profiles_equals_the_in_memory_merge() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(paths) = twelve_pods_three_hours(tmp.path()) else {
        return;
    };
    let sources = decode_all(&paths);
    let refs: Vec<&Block> = sources.iter().collect();
    let (old_meta, old_bytes) = compact_blocks(&refs, "merged", "test").unwrap();
    let old = Block::decode(&old_bytes).unwrap();
    let expected = content(&old);
    assert!(
        expected.len() >= 12,
        "every pod's series should be there: {}",
        expected.len()
    );
    // A window far smaller than the blobs, one around their size, and one
    // larger than the sources: the reads differ, the result may not.
    for window in [1, 4096, 64 << 10, 16 << 20] {
        let (meta, bytes) = streamed(&paths, window);
        assert_eq!(meta.size_bytes, bytes.len() as u64);
        let new = Block::decode(&bytes).unwrap();
        assert_eq!(new.meta(), &meta);
        assert_eq!(
            (meta.min_time_ms, meta.max_time_ms, meta.compaction_level),
            (
                old_meta.min_time_ms,
                old_meta.max_time_ms,
                old_meta.compaction_level
            )
        );
        assert_eq!(
            (meta.series, meta.samples, meta.profiles, &meta.sources),
            (
                old_meta.series,
                old_meta.samples,
                old_meta.profiles,
                &old_meta.sources
            )
        );
        assert_eq!(new.symbols().node_count(), old.symbols().node_count());
        assert_eq!(content(&new), expected, "window {window}");
    }
    // And both equal the sources summed.
    let mut summed = Content::new();
    for source in &sources {
        for (key, (_, stacks)) in content(source) {
            let entry = summed.entry(key).or_default();
            let mut all: BTreeMap<Vec<String>, i64> = entry.1.drain(..).collect();
            for (stack, value) in stacks {
                *all.entry(stack).or_default() += value;
            }
            entry.1 = all.into_iter().collect();
        }
    }
    for (key, (_, stacks)) in &expected {
        assert_eq!(&summed[key].1, stacks, "{key:?}");
    }
}

#[test]
fn a_corrupt_source_is_refused_by_its_position() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(profiles) = go_profiles(tmp.path()) else {
        return;
    };
    let (paths, _) = write_hour_blocks(tmp.path(), &profiles, 4, 3, 300_000);
    let victim = &paths[1];
    let mut bytes = std::fs::read(victim).unwrap();
    // The data section follows the header; flip a byte in its middle.
    let header = 8 + 8 + 10 * 33 + 4;
    let at = header + (bytes.len() - header) / 4;
    bytes[at] ^= 0x5a;
    std::fs::write(victim, &bytes).unwrap();
    assert!(
        Block::decode(&bytes).is_err(),
        "the flip must be detectable"
    );
    let sources: Vec<FileRanges> = paths.iter().map(|p| FileRanges::open(p)).collect();
    let mut out = Cursor::new(Vec::new());
    match compact_streaming(
        sources,
        "merged",
        "test",
        4096,
        BlockCompression::Working,
        &mut out,
    ) {
        Err(CompactionError::Source { index: 1, source }) => assert!(
            matches!(
                source,
                BlockError::ChecksumMismatch { .. }
                    | BlockError::Corrupt { .. }
                    | BlockError::Decompress { .. }
                    | BlockError::Truncated { .. }
            ),
            "{source:?}"
        ),
        other => panic!("expected source 1 refused, got {other:?}"),
    }
    // A truncated source too.
    std::fs::write(victim, &bytes[..bytes.len() / 2]).unwrap();
    let sources: Vec<FileRanges> = paths
        .iter()
        .map(|p| FileRanges::open(Path::new(p)))
        .collect();
    let result = compact_streaming(
        sources,
        "merged",
        "test",
        4096,
        BlockCompression::Working,
        &mut Cursor::new(Vec::new()),
    );
    assert!(
        matches!(result, Err(CompactionError::Source { index: 1, .. })),
        "{result:?}"
    );
}

/// Every stack and value `blocks` answer for `range`, per profile type,
/// summed over the blocks.
fn stacks_in(blocks: &[&Block], range: TimeRange) -> BTreeMap<String, Vec<(Vec<String>, i64)>> {
    let mut out: BTreeMap<String, BTreeMap<Vec<String>, i64>> = BTreeMap::new();
    for block in blocks {
        for profile_type in block.profile_types(everything()) {
            let selector = CompiledSelector::new(&Selector {
                profile_type: profile_type.clone(),
                matchers: vec![],
            })
            .unwrap();
            let mut merged = MergedProfile::new();
            block.merge_into(&selector, range, &mut merged).unwrap();
            let entry = out.entry(format!("{profile_type:?}")).or_default();
            for (stack, value) in merged.stacks() {
                *entry.entry(stack).or_default() += value;
            }
        }
    }
    out.into_iter()
        .map(|(key, stacks)| (key, stacks.into_iter().filter(|(_, v)| *v != 0).collect()))
        .collect()
}

fn budgeted(
    paths: &[std::path::PathBuf],
    budget: u64,
    output_held_bytes: u64,
    out: &mut dyn kiln_engine::BlockSink,
) -> Option<StreamedMerge> {
    let sources: Vec<FileRanges> = paths.iter().map(|p| FileRanges::open(p)).collect();
    let output = MergeOutput {
        id: "merged",
        replica: "test",
        read_window: 64 << 10,
        compression: BlockCompression::Working,
    };
    let limits = MergeLimits {
        memory_bytes: budget,
        output_held_bytes,
    };
    compact_streaming_within(sources, &output, limits, out).unwrap()
}

#[test]
fn a_merge_under_a_budget_takes_the_first_sources_that_fit_and_names_only_them() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(profiles) = go_profiles(tmp.path()) else {
        return;
    };
    let (paths, _) = write_hour_blocks(tmp.path(), &profiles, 12, 6, 60_000);
    // What the merge projects for the first three sources, and for all six.
    let three = budgeted(
        &paths[..3],
        u64::MAX,
        u64::MAX,
        &mut Cursor::new(Vec::new()),
    )
    .unwrap();
    let six = budgeted(&paths, u64::MAX, u64::MAX, &mut Cursor::new(Vec::new())).unwrap();
    assert_eq!(six.sources_merged, 6);
    assert!(
        six.projected_peak > three.projected_peak,
        "six sources project more than three: {} vs {}",
        six.projected_peak,
        three.projected_peak
    );
    // Under the three-source projection the same first three fit (the
    // projections are the same), and not all six.
    let mut out = Cursor::new(Vec::new());
    let merge = budgeted(&paths, three.projected_peak, u64::MAX, &mut out).unwrap();
    let taken = merge.sources_merged;
    assert!((3..6).contains(&taken), "merged {taken} of 6");
    assert!(merge.projected_peak <= three.projected_peak);
    let sources = decode_all(&paths);
    let ids: Vec<String> = sources[..taken]
        .iter()
        .map(|b| b.meta().id.clone())
        .collect();
    assert_eq!(merge.meta.sources, ids, "only the merged sources are named");
    let merged = Block::decode(&out.into_inner()).unwrap();
    assert_eq!(merged.meta(), &merge.meta);
    let first: Vec<&Block> = sources[..taken].iter().collect();
    assert_eq!(
        merge.meta.max_time_ms,
        first.iter().map(|b| b.meta().max_time_ms).max().unwrap()
    );
    // The same stacks as the sources it took, over the whole span and over
    // ranges that cut hours and minutes (the merged block answers those
    // from hour and minute windows, the sources from minute windows).
    let start = first[0].meta().min_time_ms;
    for (from, to) in [
        (i64::MIN / 4, i64::MAX / 4),
        (start + 7 * 60_000 + 13, start + 2 * 3_600_000 + 23 * 60_000),
        (start + 3_600_000, start + 3 * 3_600_000),
    ] {
        let range = TimeRange {
            start_ms: from,
            end_ms: to,
        };
        let expected = stacks_in(&first, range);
        assert!(!expected.is_empty());
        assert_eq!(stacks_in(&[&merged], range), expected, "{range:?}");
    }
}

#[test]
fn a_budget_too_small_for_two_sources_merges_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(profiles) = go_profiles(tmp.path()) else {
        return;
    };
    let (paths, _) = write_hour_blocks(tmp.path(), &profiles, 4, 2, 60_000);
    let mut out = Cursor::new(Vec::new());
    assert!(
        budgeted(
            &paths,
            kiln_engine::compact::MERGE_FIXED_BYTES,
            u64::MAX,
            &mut out
        )
        .is_none()
    );
    assert!(out.into_inner().is_empty(), "nothing was written");
}

#[test]
fn a_merge_stops_before_what_its_output_holds_opened_by_range_passes_the_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(profiles) = go_profiles(tmp.path()) else {
        return;
    };
    let (paths, _) = write_hour_blocks(tmp.path(), &profiles, 4, 4, 60_000);
    // What the output of the first two, three and four sources projects.
    let hold = |taken: usize| {
        budgeted(
            &paths[..taken],
            u64::MAX,
            u64::MAX,
            &mut Cursor::new(Vec::new()),
        )
        .unwrap()
        .projected_output_hold
    };
    let (two, three, four) = (hold(2), hold(3), hold(4));
    assert!(two < three && three < four, "{two} {three} {four}");

    // One byte short of the fourth source: the first three are merged.
    let path = tmp.path().join("merged-three");
    let mut out = std::fs::File::create(&path).unwrap();
    let merge = budgeted(&paths, u64::MAX, four - 1, &mut out).unwrap();
    assert_eq!(merge.sources_merged, 3);
    assert_eq!(merge.meta.sources.len(), 3);
    assert_eq!(merge.projected_output_hold, three);
    drop(out);
    // The projection holds for the block written: opened by range, the
    // output holds no more than projected.
    let opened = Block::open_ranged(FileRanges::open(&path), 64 << 10).unwrap();
    let held = opened.approx_decoded_bytes() as u64;
    assert!(held <= three, "the output holds {held}, projected {three}");

    // The hour blocks share their symbols: the output is charged them once,
    // so it projects less than the four sources opened by range each.
    let each: u64 = paths
        .iter()
        .map(|p| projected_ranged_hold(&section_sizes(&std::fs::read(p).unwrap()).unwrap()))
        .sum();
    assert!(four < each, "output {four} against sources {each}");

    // Not even two: nothing is opened or written.
    let mut out = Cursor::new(Vec::new());
    assert!(budgeted(&paths, u64::MAX, two - 1, &mut out).is_none());
    assert!(out.into_inner().is_empty());
}
