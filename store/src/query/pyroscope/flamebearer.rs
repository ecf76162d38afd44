//! Kiln's flame graph trees in Pyroscope's flamebearer layout: one row per
//! depth, each node a run of integers whose first (x offset) is counted from
//! the end of the previous node on the same row, so rows need no padding.

use kiln_engine::{DiffFlameGraph, DiffNode, FlameGraph, FlameNode, MergedProfile};
use kiln_storage::{StorageError, Store};

/// A single flame graph as flamebearer rows of quads
/// `[x offset, total, self, name index]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Levels {
    /// Frame names; quads index into them.
    pub names: Vec<String>,
    /// Rows, the root (`total`) first.
    pub levels: Vec<Vec<i64>>,
    /// The root's total.
    pub total: i64,
    /// The largest self value of any node.
    pub max_self: i64,
}

/// A diff as flamebearer rows of 7-tuples `[left offset, left total, left
/// self, right offset, right total, right self, name index]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffLevels {
    /// Frame names.
    pub names: Vec<String>,
    /// Rows, the root first.
    pub levels: Vec<Vec<i64>>,
    /// Left plus right totals.
    pub total: i64,
    /// The largest self value on either side.
    pub max_self: i64,
    /// The left (base) total.
    pub left_ticks: i64,
    /// The right (compared) total.
    pub right_ticks: i64,
}

/// Builds the flame graph of `merged` and lays it out, on the blocking pool
/// under one of the store's query runners: a tree of up to a million nodes
/// takes long enough to stall every request sharing an async worker.
pub async fn single_levels_off_workers(
    store: &Store,
    merged: MergedProfile,
    max_nodes: usize,
) -> Result<Levels, StorageError> {
    store
        .run_query_work(move || single_levels(&merged.flamegraph(max_nodes)))
        .await
}

/// [`single_levels_off_workers`] for a diff of `compare` against `base`.
pub async fn diff_levels_off_workers(
    store: &Store,
    base: MergedProfile,
    compare: MergedProfile,
    max_nodes: usize,
) -> Result<DiffLevels, StorageError> {
    store
        .run_query_work(move || diff_levels(&kiln_engine::diff(&base, &compare, max_nodes)))
        .await
}

/// Lays out `graph`; children keep the engine's order (largest first).
pub fn single_levels(graph: &FlameGraph) -> Levels {
    let mut levels: Vec<Vec<i64>> = Vec::new();
    let mut row_ends: Vec<i64> = Vec::new();
    let mut max_self = 0;
    // Depth-first, left to right: each row is filled in x order.
    let mut pending: Vec<(&FlameNode, usize, i64)> = vec![(graph.root(), 0, 0)];
    while let Some((node, depth, x)) = pending.pop() {
        if levels.len() <= depth {
            levels.push(Vec::new());
            row_ends.push(0);
        }
        levels[depth].extend([
            x - row_ends[depth],
            node.total,
            node.self_value,
            i64::from(node.name),
        ]);
        row_ends[depth] = x + node.total;
        max_self = max_self.max(node.self_value);
        let mut child_x = x;
        let mut children = Vec::with_capacity(graph.children(node).len());
        for child in graph.children(node) {
            children.push((child, depth + 1, child_x));
            child_x += child.total;
        }
        pending.extend(children.into_iter().rev());
    }
    Levels {
        names: graph.names.clone(),
        levels,
        total: graph.root().total,
        max_self,
    }
}

/// Lays out a diff; each side's offsets count along that side's totals.
pub fn diff_levels(graph: &DiffFlameGraph) -> DiffLevels {
    let mut levels: Vec<Vec<i64>> = Vec::new();
    let mut row_ends: Vec<[i64; 2]> = Vec::new();
    let mut max_self = 0;
    let mut pending: Vec<(&DiffNode, usize, [i64; 2])> = vec![(graph.root(), 0, [0, 0])];
    while let Some((node, depth, x)) = pending.pop() {
        if levels.len() <= depth {
            levels.push(Vec::new());
            row_ends.push([0, 0]);
        }
        let ends = row_ends[depth];
        levels[depth].extend([
            x[0] - ends[0],
            node.base_total,
            node.base_self,
            x[1] - ends[1],
            node.compare_total,
            node.compare_self,
            i64::from(node.name),
        ]);
        row_ends[depth] = [x[0] + node.base_total, x[1] + node.compare_total];
        max_self = max_self.max(node.base_self).max(node.compare_self);
        let mut child_x = x;
        let mut children = Vec::with_capacity(graph.children(node).len());
        for child in graph.children(node) {
            children.push((child, depth + 1, child_x));
            child_x = [
                child_x[0] + child.base_total,
                child_x[1] + child.compare_total,
            ];
        }
        pending.extend(children.into_iter().rev());
    }
    DiffLevels {
        names: graph.names.clone(),
        levels,
        total: graph.root().base_total + graph.root().compare_total,
        max_self,
        left_ticks: graph.root().base_total,
        right_ticks: graph.root().compare_total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: u32, total: i64, self_value: i64, children: std::ops::Range<u32>) -> FlameNode {
        FlameNode {
            name,
            total,
            self_value,
            first_child: children.start,
            child_count: children.end - children.start,
        }
    }

    #[test]
    fn rows_are_delta_encoded_per_depth() {
        // total(10) -> a(6: self 1) -> c(5), and total -> b(4) -> d(4) with a
        // one-tick gap before d's row neighbour: c ends at 5, d starts at 6.
        let graph = FlameGraph {
            names: vec![
                "total".into(),
                "a".into(),
                "b".into(),
                "c".into(),
                "d".into(),
            ],
            nodes: vec![
                node(0, 10, 0, 1..3),
                node(1, 6, 1, 3..4),
                node(2, 4, 0, 4..5),
                node(3, 5, 5, 5..5),
                node(4, 4, 4, 5..5),
            ],
        };
        let levels = single_levels(&graph);
        assert_eq!(
            levels.levels,
            vec![
                vec![0, 10, 0, 0],
                vec![0, 6, 1, 1, 0, 4, 0, 2],
                vec![0, 5, 5, 3, 1, 4, 4, 4],
            ]
        );
        assert_eq!(levels.total, 10);
        assert_eq!(levels.max_self, 5);
    }

    #[test]
    fn diff_rows_carry_both_sides() {
        let graph = DiffFlameGraph {
            names: vec!["total".into(), "a".into()],
            nodes: vec![
                DiffNode {
                    name: 0,
                    base_total: 3,
                    base_self: 0,
                    compare_total: 5,
                    compare_self: 0,
                    first_child: 1,
                    child_count: 1,
                },
                DiffNode {
                    name: 1,
                    base_total: 3,
                    base_self: 3,
                    compare_total: 5,
                    compare_self: 5,
                    first_child: 2,
                    child_count: 0,
                },
            ],
        };
        let levels = diff_levels(&graph);
        assert_eq!(levels.levels[1], vec![0, 3, 3, 0, 5, 5, 1]);
        assert_eq!(
            (levels.left_ticks, levels.right_ticks, levels.total),
            (3, 5, 8)
        );
        assert_eq!(levels.max_self, 5);
    }
}
