//! Diff of two selections: one frame tree carrying both sides' values.

pub use kiln_contract::query_json::{DiffFlameGraph, DiffNode};

use super::flamegraph::{FrameTree, OTHER_NODE_NAME};
use super::merged::MergedProfile;

/// Diffs `compare` against `base` as one tree of at most `max_nodes` nodes.
pub fn diff(base: &MergedProfile, compare: &MergedProfile, max_nodes: usize) -> DiffFlameGraph {
    let mut tree = FrameTree::new();
    tree.add(base, 0);
    tree.add(compare, 1);
    tree.finish();
    let kept = tree.keep(max_nodes, |n| {
        n.total[0]
            .saturating_abs()
            .saturating_add(n.total[1].saturating_abs())
    });
    let other = tree.name(OTHER_NODE_NAME);
    let mut node_count = 0;
    let root = build(&tree, &kept, 0, other, &mut node_count);
    DiffFlameGraph {
        names: tree.names,
        root,
        node_count,
    }
}

fn build(tree: &FrameTree, kept: &[bool], id: u32, other: u32, count: &mut usize) -> DiffNode {
    *count += 1;
    let node = &tree.nodes[id as usize];
    let mut children = Vec::new();
    let mut trimmed = [0i64; 2];
    for &child in &node.children {
        if kept[child as usize] {
            children.push(build(tree, kept, child, other, count));
        } else {
            let total = tree.nodes[child as usize].total;
            trimmed[0] = trimmed[0].wrapping_add(total[0]);
            trimmed[1] = trimmed[1].wrapping_add(total[1]);
        }
    }
    children.sort_by(|a, b| {
        (b.base_total.saturating_add(b.compare_total))
            .cmp(&a.base_total.saturating_add(a.compare_total))
            .then(a.name.cmp(&b.name))
    });
    if node.children.iter().any(|&c| !kept[c as usize]) {
        *count += 1;
        children.push(DiffNode {
            name: other,
            base_total: trimmed[0],
            base_self: trimmed[0],
            compare_total: trimmed[1],
            compare_self: trimmed[1],
            children: Vec::new(),
        });
    }
    DiffNode {
        name: node.name,
        base_total: node.total[0],
        base_self: node.self_value[0],
        compare_total: node.total[1],
        compare_self: node.self_value[1],
        children,
    }
}
