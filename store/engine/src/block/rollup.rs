//! Rollups: per series, pre-merged stack-key -> value maps for aligned
//! windows of 1 minute, 1 hour and 1 day (the segment-tree idea).
//!
//! A query range is split into the largest aligned windows it fully covers
//! (days in the middle, hours and minutes towards the edges) plus raw
//! leftovers at both ends, so a long merge reads O(log n) pieces. Window
//! sums are exact integer (wrapping) sums, so results equal the raw ones.

use crate::model::TimeRange;

/// Rollup window sizes in ms, smallest first.
pub(crate) const ROLLUP_WINDOWS_MS: [i64; 3] = [60_000, 3_600_000, 86_400_000];

/// Which window levels a block covering `[min_ms, max_ms]` stores: only
/// windows no larger than the block's span.
pub(crate) fn levels_for_span(min_ms: i64, max_ms: i64) -> Vec<u8> {
    let span = i128::from(max_ms) - i128::from(min_ms) + 1;
    ROLLUP_WINDOWS_MS
        .iter()
        .enumerate()
        .filter(|&(_, &w)| i128::from(w) <= span)
        .map(|(level, _)| level as u8)
        .collect()
}

/// Start of the window of size `window_ms` holding `t_ms`.
pub(crate) fn window_start(t_ms: i64, window_ms: i64) -> i64 {
    t_ms.div_euclid(window_ms).saturating_mul(window_ms)
}

/// How to answer one range: window pieces per level plus raw ranges.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct CoveragePlan {
    /// `(level, [first window start, end))`: every window of `level` starting in the range.
    pub(crate) pieces: Vec<(u8, TimeRange)>,
    /// Ranges to read from raw points.
    pub(crate) raw: Vec<TimeRange>,
}

/// Splits `range` using the window levels in `levels` (ascending).
pub(crate) fn plan(range: TimeRange, levels: &[u8]) -> CoveragePlan {
    let mut out = CoveragePlan::default();
    split(range, levels, &mut out);
    out
}

fn split(range: TimeRange, levels: &[u8], out: &mut CoveragePlan) {
    if range.start_ms >= range.end_ms {
        return;
    }
    let Some((&level, smaller)) = levels.split_last() else {
        out.raw.push(range);
        return;
    };
    let window = ROLLUP_WINDOWS_MS[level as usize];
    let first = {
        let start = window_start(range.start_ms, window);
        if start < range.start_ms {
            start.saturating_add(window)
        } else {
            start
        }
    };
    let last_end = window_start(range.end_ms, window);
    if first >= last_end {
        split(range, smaller, out);
        return;
    }
    split(
        TimeRange {
            start_ms: range.start_ms,
            end_ms: first,
        },
        smaller,
        out,
    );
    out.pieces.push((
        level,
        TimeRange {
            start_ms: first,
            end_ms: last_end,
        },
    ));
    split(
        TimeRange {
            start_ms: last_end,
            end_ms: range.end_ms,
        },
        smaller,
        out,
    );
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn covered(plan: &CoveragePlan, t: i64) -> usize {
        plan.pieces.iter().filter(|(_, r)| r.contains(t)).count()
            + plan.raw.iter().filter(|r| r.contains(t)).count()
    }

    #[test]
    fn a_week_uses_days_in_the_middle() {
        let day = 86_400_000;
        let range = TimeRange {
            start_ms: 10 * day + 1_234,
            end_ms: 17 * day + 5_000_000,
        };
        let plan = plan(range, &[0, 1, 2]);
        assert!(
            plan.pieces
                .iter()
                .any(|&(level, r)| level == 2 && r.end_ms - r.start_ms == 6 * day)
        );
        assert!(plan.raw.iter().all(|r| r.end_ms - r.start_ms < 60_000));
    }

    proptest! {
        #[test]
        fn plan_covers_every_instant_exactly_once(
            start in -200_000_000i64..200_000_000,
            len in 1i64..400_000_000,
            probe in 0i64..400_000_000,
            levels in prop::sample::select(vec![vec![], vec![0u8], vec![0, 1], vec![0, 1, 2], vec![1, 2]]),
        ) {
            let range = TimeRange { start_ms: start, end_ms: start + len };
            let plan = plan(range, &levels);
            let t = start + probe % len;
            prop_assert_eq!(covered(&plan, t), 1);
            prop_assert_eq!(covered(&plan, start - 1), 0);
            prop_assert_eq!(covered(&plan, start + len), 0);
            for (level, r) in &plan.pieces {
                let w = ROLLUP_WINDOWS_MS[*level as usize];
                prop_assert_eq!(r.start_ms.rem_euclid(w), 0);
                prop_assert_eq!(r.end_ms.rem_euclid(w), 0);
            }
        }
    }
}
