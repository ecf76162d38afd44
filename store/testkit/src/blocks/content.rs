//! What a block answers, in one comparable value: every series' totals
//! per step and its stacks with values.

use std::collections::BTreeMap;

use kiln_engine::{
    Block, CompiledSelector, MatchOp, Matcher, MergedProfile, Queryable, Selector, TimeRange,
    Timeline, compile_matchers,
};

/// A range that covers every time a test writes.
pub fn everything() -> TimeRange {
    TimeRange {
        start_ms: i64::MIN / 4,
        end_ms: i64::MAX / 4,
    }
}

/// Per (profile type, series): totals per 10 s step and stacks with values.
pub type Content = BTreeMap<(String, String), (Vec<i64>, Vec<(Vec<String>, i64)>)>;

/// Everything `block` answers, for comparing two blocks.
pub fn content(block: &Block) -> Content {
    let meta = block.meta();
    let range = TimeRange {
        start_ms: meta.min_time_ms,
        end_ms: meta.max_time_ms + 1,
    };
    let mut out = Content::new();
    for profile_type in block.profile_types(everything()) {
        for labels in block.series(&[], everything()).expect("series") {
            let matchers: Vec<Matcher> = labels
                .iter()
                .map(|l| Matcher {
                    name: l.name.clone(),
                    op: MatchOp::Equal,
                    value: l.value.clone(),
                })
                .collect();
            compile_matchers(&matchers).expect("matchers compile");
            let selector = CompiledSelector::new(&Selector {
                profile_type: profile_type.clone(),
                matchers,
            })
            .expect("selector compiles");
            let mut merged = MergedProfile::new();
            block
                .merge_into(&selector, range, &mut merged)
                .expect("merge");
            let mut timeline = Timeline::new(range, 10_000).expect("timeline");
            block
                .timeline_into(&selector, range, &mut timeline)
                .expect("timeline");
            let mut stacks = merged.stacks();
            stacks.retain(|(_, v)| *v != 0);
            stacks.sort();
            if stacks.is_empty() && timeline.total() == 0 {
                continue;
            }
            out.insert(
                (format!("{profile_type:?}"), format!("{labels:?}")),
                (timeline.values, stacks),
            );
        }
    }
    out
}
