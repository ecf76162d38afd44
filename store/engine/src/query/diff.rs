//! Diff of two selections: one frame tree carrying both sides' values.

pub use kiln_contract::query_json::{DiffFlameGraph, DiffNode};

use super::flamegraph::{FrameTree, Laid, MAX_FRAME_TREE_NODES};
use super::merged::MergedProfile;

/// Diffs `compare` against `base` as one tree of at most `max_nodes` nodes,
/// built within [`MAX_FRAME_TREE_NODES`] nodes like a flame graph; trimmed
/// siblings fold into one [`super::flamegraph::OTHER_NODE_NAME`] node.
pub fn diff(base: &MergedProfile, compare: &MergedProfile, max_nodes: usize) -> DiffFlameGraph {
    let mut tree = FrameTree::new(MAX_FRAME_TREE_NODES);
    tree.reserve_for(base);
    tree.add(base, 0);
    tree.add(compare, 1);
    tree.finish();
    let kept = tree.keep(max_nodes, |n| {
        n.total[0]
            .saturating_abs()
            .saturating_add(n.total[1].saturating_abs())
    });
    let laid = tree.lay_out(&kept, |a, b| {
        (b.total[0].saturating_add(b.total[1]))
            .cmp(&a.total[0].saturating_add(a.total[1]))
            .then(a.name.cmp(&b.name))
    });
    let other = tree.other_name(&laid);
    let nodes = laid
        .iter()
        .map(|laid| {
            let (name, total, self_value) = match laid.what {
                Laid::Node(id) => {
                    let node = &tree.nodes[id as usize];
                    (node.name, node.total, node.self_value)
                }
                Laid::Other(values) => (other, values, values),
            };
            DiffNode {
                name,
                base_total: total[0],
                base_self: self_value[0],
                compare_total: total[1],
                compare_self: self_value[1],
                first_child: laid.first_child,
                child_count: laid.child_count,
            }
        })
        .collect();
    DiffFlameGraph {
        names: tree.names,
        nodes,
    }
}
