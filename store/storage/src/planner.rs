//! Pure planning over block metadata: which blocks retention deletes and
//! which blocks compaction merges. No IO, so every rule is unit-tested.

use std::collections::{BTreeMap, BTreeSet};

use kiln_engine::BlockCompression;
use kiln_engine::model::BlockMeta;

/// One hour in ms: level-0 blocks are merged into blocks aligned to it.
pub const HOUR_MS: i64 = 3_600_000;
/// One day in ms: hour blocks are merged into blocks aligned to it.
pub const DAY_MS: i64 = 24 * HOUR_MS;

/// Blocks to delete so that nothing ends before `now - retention` and, if
/// `max_total_bytes` is set, the remaining blocks fit in it (oldest go first).
/// Returns ids, oldest first.
pub fn plan_retention(
    blocks: &[BlockMeta],
    now_ms: i64,
    retention_ms: i64,
    max_total_bytes: Option<u64>,
) -> Vec<String> {
    let cutoff = now_ms.saturating_sub(retention_ms);
    let mut by_age: Vec<&BlockMeta> = blocks.iter().collect();
    by_age.sort_by(|a, b| (a.max_time_ms, &a.id).cmp(&(b.max_time_ms, &b.id)));
    let mut delete = Vec::new();
    let mut kept_bytes: u64 = 0;
    let mut kept = Vec::new();
    for block in by_age {
        if block.max_time_ms < cutoff {
            delete.push(block.id.clone());
        } else {
            kept_bytes = kept_bytes.saturating_add(block.size_bytes);
            kept.push(block);
        }
    }
    if let Some(limit) = max_total_bytes {
        for block in kept {
            if kept_bytes <= limit {
                break;
            }
            kept_bytes = kept_bytes.saturating_sub(block.size_bytes);
            delete.push(block.id.clone());
        }
    }
    delete
}

/// A set of blocks to merge into one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionGroup {
    /// Start of the aligned window (unix ms) the group belongs to.
    pub window_start_ms: i64,
    /// Window length: [`HOUR_MS`] or [`DAY_MS`].
    pub window_ms: i64,
    /// Ids of the blocks to merge, ordered by id (creation order).
    pub block_ids: Vec<String>,
}

impl CompactionGroup {
    /// True when the group merges a day that ended at least `settle_ms`
    /// before `now_ms`: its block is then usually the day's last, kept
    /// until retention removes it, so it is worth compressing harder. (A
    /// day cut short by the compaction budget is merged again later; that
    /// costs only CPU.)
    pub fn is_settled_day(&self, now_ms: i64, settle_ms: i64) -> bool {
        self.window_ms == DAY_MS
            && self
                .window_start_ms
                .saturating_add(DAY_MS)
                .saturating_add(settle_ms)
                <= now_ms
    }

    /// How the merged block is compressed: [`BlockCompression::Archive`]
    /// for a settled day ([`CompactionGroup::is_settled_day`]),
    /// [`BlockCompression::Working`] for blocks that are merged again.
    pub fn output_compression(&self, now_ms: i64, settle_ms: i64) -> BlockCompression {
        if self.is_settled_day(now_ms, settle_ms) {
            BlockCompression::Archive
        } else {
            BlockCompression::Working
        }
    }
}

/// Hour blocks of the day in progress are merged once this many have
/// accumulated, so a query over today reads a few blocks, not one per hour.
pub const PARTIAL_DAY_MIN_BLOCKS: usize = 4;

/// Plans compaction for the blocks this replica owns.
///
/// - Level-0 blocks whose aligned hour (by `min_time_ms`) ended at least
///   `settle_ms` ago are grouped per hour; groups of two or more become one
///   hour block.
/// - All blocks of an aligned day that ended at least `settle_ms` ago are
///   grouped; two or more become one day block.
/// - In the day still in progress, hour blocks (level 1) are merged once
///   there are [`PARTIAL_DAY_MIN_BLOCKS`] of them, into a block of those
///   hours. Earlier merges of the day are left alone: merging them again
///   rewrote the whole day so far every few hours, so each value was
///   compacted about six times before its day ended (issue 13); now three
///   times (hour, hours, day), and today stays at most six such blocks
///   plus the hours not merged yet.
///
/// A block is in at most one group; day groups are planned only for days
/// with no hour group pending, so an hour is always compacted before its day.
/// `settle_ms` should exceed the flush interval, so no more level-0 blocks
/// arrive for a window once it is compacted.
pub fn plan_compaction(blocks: &[BlockMeta], now_ms: i64, settle_ms: i64) -> Vec<CompactionGroup> {
    let complete =
        |start: i64, len: i64| start.saturating_add(len).saturating_add(settle_ms) <= now_ms;
    let mut hours: BTreeMap<i64, Vec<&BlockMeta>> = BTreeMap::new();
    for block in blocks.iter().filter(|b| b.compaction_level == 0) {
        let start = align_down(block.min_time_ms, HOUR_MS);
        if complete(start, HOUR_MS) {
            hours.entry(start).or_default().push(block);
        }
    }
    let mut groups = Vec::new();
    let mut days_with_pending_hours = BTreeSet::new();
    for (start, members) in hours {
        if members.len() >= 2 {
            days_with_pending_hours.insert(align_down(start, DAY_MS));
            groups.push(group(start, HOUR_MS, &members));
        }
    }
    let mut complete_days: BTreeMap<i64, Vec<&BlockMeta>> = BTreeMap::new();
    let mut partial_days: BTreeMap<i64, Vec<&BlockMeta>> = BTreeMap::new();
    for block in blocks {
        let start = align_down(block.min_time_ms, DAY_MS);
        if days_with_pending_hours.contains(&start) {
            continue;
        }
        if complete(start, DAY_MS) {
            complete_days.entry(start).or_default().push(block);
        } else if block.compaction_level == 1 {
            partial_days.entry(start).or_default().push(block);
        }
    }
    for (start, members) in complete_days {
        if members.len() >= 2 {
            groups.push(group(start, DAY_MS, &members));
        }
    }
    for (start, members) in partial_days {
        if members.len() >= PARTIAL_DAY_MIN_BLOCKS {
            groups.push(group(start, DAY_MS, &members));
        }
    }
    groups
}

/// Orders a group's blocks smallest first, the order the merge takes them
/// in under its memory budget (`kiln_engine::compact_streaming_within`):
/// it merges as many as fit, from the first, so the most blocks merge, and
/// leaves the rest (the largest) to a later pass with the merged block.
/// Memory stays bounded by configuration, not by how much a window holds.
pub fn order_smallest_first(group: CompactionGroup, blocks: &[BlockMeta]) -> CompactionGroup {
    let size_of = |id: &String| {
        blocks
            .iter()
            .find(|b| &b.id == id)
            .map_or(u64::MAX, |b| b.size_bytes)
    };
    let mut by_size: Vec<(u64, String)> = group
        .block_ids
        .iter()
        .map(|id| (size_of(id), id.clone()))
        .collect();
    by_size.sort();
    CompactionGroup {
        block_ids: by_size.into_iter().map(|(_, id)| id).collect(),
        ..group
    }
}

/// How much of each source a streaming compaction reads at a time: an
/// eighth of the compaction budget shared by the sources, between 64 KiB
/// (fewer, larger reads from an object store) and 4 MiB.
pub fn read_window_bytes(budget: u64, sources: usize) -> usize {
    let share = budget / 8 / (sources.max(1) as u64);
    share.clamp(64 << 10, 4 << 20) as usize
}

fn group(start: i64, len: i64, members: &[&BlockMeta]) -> CompactionGroup {
    let mut block_ids: Vec<String> = members.iter().map(|b| b.id.clone()).collect();
    block_ids.sort();
    CompactionGroup {
        window_start_ms: start,
        window_ms: len,
        block_ids,
    }
}

fn align_down(t: i64, step: i64) -> i64 {
    t.div_euclid(step) * step
}

/// Blocks a reader must hide: those named as a source by another listed
/// block. Between a compacted block's upload and its sources' deletion both
/// exist, and counting both would double every value.
pub fn superseded_blocks(blocks: &BTreeMap<String, BlockMeta>) -> BTreeSet<String> {
    blocks
        .values()
        .flat_map(|b| b.sources.iter())
        .filter(|id| blocks.contains_key(*id))
        .cloned()
        .collect()
}

/// Blocks known before a listing that the listing lacks and that no listed
/// block names as a source. A listing is not a snapshot: a compaction
/// elsewhere can write its output after the listing passed the output's
/// place and delete a source before the listing reached the source's, so
/// one listing may hold neither. Queried as is, such a view misses the
/// source's data without any read failing; listed again, the output shows.
/// (A block that retention or a person removed also shows here, in the
/// first listing after its removal only.)
pub fn unexplained_gaps(
    known: &BTreeMap<String, BlockMeta>,
    listed: &BTreeMap<String, BlockMeta>,
) -> Vec<String> {
    let named: BTreeSet<&str> = listed
        .values()
        .flat_map(|b| b.sources.iter().map(String::as_str))
        .collect();
    known
        .keys()
        .filter(|id| !listed.contains_key(*id) && !named.contains(id.as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vanished_block_is_explained_only_by_a_listed_output_naming_it() {
        let known: BTreeMap<String, BlockMeta> = ["s1", "s2", "s3"]
            .iter()
            .map(|id| (id.to_string(), block(id, 0, 10, 0, 1)))
            .collect();
        // s1 deleted, its output not listed yet: s1's data would be missed.
        let mut listed = known.clone();
        listed.remove("s1");
        assert_eq!(unexplained_gaps(&known, &listed), vec!["s1".to_string()]);
        // The output listed: s1 (and s2, also gone now) are in it.
        listed.remove("s2");
        let mut output = block("o", 0, 10, 1, 1);
        output.sources = vec!["s1".into(), "s2".into(), "s3".into()];
        listed.insert("o".into(), output);
        assert!(unexplained_gaps(&known, &listed).is_empty());
        // Nothing vanished: nothing to explain.
        assert!(unexplained_gaps(&known, &known).is_empty());
    }

    fn block(id: &str, min: i64, max: i64, level: u32, size: u64) -> BlockMeta {
        BlockMeta {
            format_version: 1,
            id: id.to_string(),
            min_time_ms: min,
            max_time_ms: max,
            compaction_level: level,
            replica: "r".into(),
            sources: vec![],
            series: 1,
            samples: 1,
            profiles: 1,
            size_bytes: size,
        }
    }

    #[test]
    fn read_windows_share_an_eighth_of_the_budget_within_bounds() {
        assert_eq!(read_window_bytes(256 << 20, 8), 4 << 20);
        assert_eq!(read_window_bytes(64 << 20, 8), 1 << 20);
        assert_eq!(read_window_bytes(48 << 20, 100), 64 << 10);
        assert_eq!(read_window_bytes(1 << 40, 0), 4 << 20);
    }

    #[test]
    fn groups_are_ordered_smallest_block_first() {
        let blocks = vec![
            block("a", 0, 10, 0, 100),
            block("b", 0, 10, 0, 10),
            block("c", 0, 10, 0, 20),
            block("d", 0, 10, 0, 10),
        ];
        let group = CompactionGroup {
            window_start_ms: 0,
            window_ms: HOUR_MS,
            block_ids: vec![
                "a".into(),
                "b".into(),
                "c".into(),
                "d".into(),
                "gone".into(),
            ],
        };
        let ordered = order_smallest_first(group, &blocks);
        // Equal sizes by id; a block no longer listed goes last.
        assert_eq!(ordered.block_ids, vec!["b", "d", "c", "a", "gone"]);
        assert_eq!(ordered.window_ms, HOUR_MS);
    }

    #[test]
    fn retention_deletes_blocks_that_ended_before_the_cutoff() {
        let blocks = vec![
            block("a", 0, 99, 0, 10),
            block("b", 50, 100, 0, 10),
            block("c", 150, 200, 0, 10),
        ];
        assert_eq!(plan_retention(&blocks, 200, 100, None), vec!["a"]);
        assert!(plan_retention(&blocks, 150, 100, None).is_empty());
    }

    #[test]
    fn retention_by_size_deletes_oldest_until_the_rest_fits() {
        let blocks = vec![
            block("new", 300, 400, 0, 50),
            block("old", 0, 100, 0, 50),
            block("mid", 100, 200, 0, 50),
        ];
        assert_eq!(plan_retention(&blocks, 400, 1_000, Some(100)), vec!["old"]);
        assert_eq!(
            plan_retention(&blocks, 400, 1_000, Some(49)),
            vec!["old", "mid", "new"]
        );
        assert!(plan_retention(&blocks, 400, 1_000, Some(150)).is_empty());
    }

    #[test]
    fn retention_by_time_and_size_combine_without_double_listing() {
        let blocks = vec![block("old", 0, 10, 0, 100), block("mid", 20, 30, 0, 100)];
        assert_eq!(
            plan_retention(&blocks, 40, 25, Some(50)),
            vec!["old", "mid"]
        );
    }

    #[test]
    fn level0_blocks_are_grouped_by_complete_aligned_hour() {
        let h = HOUR_MS;
        let blocks = vec![
            block("01", 10, 60_000, 0, 1),
            block("02", 60_000, 120_000, 0, 1),
            block("03", h + 5, h + 60_000, 0, 1),
            block("04", h + 60_000, h + 120_000, 0, 1),
            // The current hour is still open: never compacted.
            block("05", 2 * h, 2 * h + 10, 0, 1),
            block("06", 2 * h + 10, 2 * h + 20, 0, 1),
            // A lone block in a complete hour waits for the day stage.
            block("07", 3 * h + 10, 3 * h + 20, 1, 1),
        ];
        let groups = plan_compaction(&blocks, 2 * h + 30 * 60_000, 5 * 60_000);
        assert_eq!(
            groups,
            vec![
                CompactionGroup {
                    window_start_ms: 0,
                    window_ms: h,
                    block_ids: vec!["01".into(), "02".into()]
                },
                CompactionGroup {
                    window_start_ms: h,
                    window_ms: h,
                    block_ids: vec!["03".into(), "04".into()]
                },
            ]
        );
    }

    #[test]
    fn an_hour_is_not_compacted_until_it_has_settled() {
        let blocks = vec![block("a", 0, 10, 0, 1), block("b", 20, 30, 0, 1)];
        assert!(plan_compaction(&blocks, HOUR_MS + 1_000, 60_000).is_empty());
        assert_eq!(plan_compaction(&blocks, HOUR_MS + 60_000, 60_000).len(), 1);
    }

    #[test]
    fn hour_blocks_and_stragglers_of_a_complete_day_become_one_day_group() {
        let h = HOUR_MS;
        let blocks = vec![
            block("a", 0, h - 1, 1, 1),
            block("b", h, 2 * h - 1, 1, 1),
            block("c", 5 * h, 5 * h + 10, 0, 1),
            // Two day blocks of one day (a late straggler compacted
            // separately) merge too; a lone day block is left alone.
            block("d", DAY_MS, DAY_MS + 10, 2, 1),
            block("e", DAY_MS + 20, DAY_MS + 30, 2, 1),
            block("f", 2 * DAY_MS, 2 * DAY_MS + 10, 2, 1),
        ];
        let groups = plan_compaction(&blocks, 4 * DAY_MS, 60_000);
        assert_eq!(
            groups,
            vec![
                CompactionGroup {
                    window_start_ms: 0,
                    window_ms: DAY_MS,
                    block_ids: vec!["a".into(), "b".into(), "c".into()]
                },
                CompactionGroup {
                    window_start_ms: DAY_MS,
                    window_ms: DAY_MS,
                    block_ids: vec!["d".into(), "e".into()]
                },
            ]
        );
    }

    #[test]
    fn the_day_in_progress_is_merged_once_enough_compacted_blocks_accumulate() {
        let h = HOUR_MS;
        let now = 10 * h;
        let mut blocks: Vec<BlockMeta> = (0..3)
            .map(|i| block(&format!("h{i}"), i * h, i * h + 10, 1, 1))
            .collect();
        // Level-0 blocks of the current hour never join.
        blocks.push(block("live", 9 * h + 5, 9 * h + 10, 0, 1));
        assert!(plan_compaction(&blocks, now, 60_000).is_empty());
        blocks.push(block("h3", 3 * h, 3 * h + 10, 1, 1));
        let groups = plan_compaction(&blocks, now, 60_000);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].window_ms, DAY_MS);
        assert_eq!(groups[0].block_ids, vec!["h0", "h1", "h2", "h3"]);
        // Merged again when the day ends: compressed for work, not for keeping.
        assert_eq!(
            groups[0].output_compression(now, 60_000),
            BlockCompression::Working
        );
        // The merged block of hours 0-3 is not merged again: the next four
        // hours make a block of their own.
        let mut later = vec![block("p", 0, 3 * h + 10, 2, 1)];
        later.extend((4..7).map(|i| block(&format!("h{i}"), i * h, i * h + 10, 1, 1)));
        assert!(plan_compaction(&later, now, 60_000).is_empty());
        later.push(block("h7", 7 * h, 7 * h + 10, 1, 1));
        let groups = plan_compaction(&later, now, 60_000);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].block_ids, vec!["h4", "h5", "h6", "h7"]);
        // Once the day is over, everything of it merges into one day block.
        let groups = plan_compaction(&later, DAY_MS + h, 60_000);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].block_ids.len(), 5);
        // That block stays until retention: compressed for keeping.
        assert_eq!(
            groups[0].output_compression(DAY_MS + h, 60_000),
            BlockCompression::Archive
        );
    }

    #[test]
    fn a_day_waits_while_one_of_its_hours_still_needs_compaction() {
        let blocks = vec![
            block("a", 0, 10, 0, 1),
            block("b", 20, 30, 0, 1),
            block("c", 2 * HOUR_MS, 2 * HOUR_MS + 10, 1, 1),
        ];
        let groups = plan_compaction(&blocks, 2 * DAY_MS, 60_000);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].window_ms, HOUR_MS);
        // An hour's merge of a day long past is still merged again.
        assert_eq!(
            groups[0].output_compression(2 * DAY_MS, 60_000),
            BlockCompression::Working
        );
    }

    #[test]
    fn negative_times_align_down_not_toward_zero() {
        assert_eq!(align_down(-1, HOUR_MS), -HOUR_MS);
        assert_eq!(align_down(HOUR_MS, HOUR_MS), HOUR_MS);
    }

    #[test]
    fn sources_of_a_listed_block_are_hidden() {
        let mut compacted = block("c", 0, 10, 1, 1);
        compacted.sources = vec!["a".into(), "gone".into()];
        let blocks: BTreeMap<String, BlockMeta> = [
            ("a".to_string(), block("a", 0, 5, 0, 1)),
            ("b".to_string(), block("b", 5, 10, 0, 1)),
            ("c".to_string(), compacted),
        ]
        .into_iter()
        .collect();
        let hidden = superseded_blocks(&blocks);
        assert_eq!(hidden.into_iter().collect::<Vec<_>>(), vec!["a"]);
    }
}
