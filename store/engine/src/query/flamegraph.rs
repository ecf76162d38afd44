//! Flame graphs: the merged stacks as a tree of frame names (inlined frames
//! expanded), with total and self values, trimmed server-side to a node
//! budget. Trimmed siblings fold into one [`OTHER_NODE_NAME`] node so every
//! total is kept.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use hashbrown::HashMap;

use super::merged::{MergedProfile, frame_names};

pub use kiln_contract::query_json::{FlameGraph, FlameNode, OTHER_NODE_NAME, ROOT_NODE_NAME};

/// A full (untrimmed) frame tree with up to two value slots, shared by
/// flame graphs (slot 0) and diffs (slots 0 and 1).
#[derive(Debug, Default)]
pub(crate) struct FrameTree {
    pub(crate) names: Vec<String>,
    name_lookup: HashMap<String, u32>,
    pub(crate) nodes: Vec<TreeNode>,
    child_lookup: HashMap<(u32, u32), u32>,
}

#[derive(Debug, Clone)]
pub(crate) struct TreeNode {
    pub(crate) name: u32,
    pub(crate) parent: u32,
    pub(crate) children: Vec<u32>,
    pub(crate) total: [i64; 2],
    pub(crate) self_value: [i64; 2],
}

impl FrameTree {
    pub(crate) fn new() -> Self {
        let mut tree = Self::default();
        let root_name = tree.name(ROOT_NODE_NAME);
        tree.nodes.push(TreeNode {
            name: root_name,
            parent: 0,
            children: Vec::new(),
            total: [0; 2],
            self_value: [0; 2],
        });
        tree
    }

    pub(crate) fn name(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.name_lookup.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_owned());
        self.name_lookup.insert(name.to_owned(), id);
        id
    }

    fn child(&mut self, parent: u32, name: u32) -> u32 {
        if let Some(&id) = self.child_lookup.get(&(parent, name)) {
            return id;
        }
        let id = self.nodes.len() as u32;
        self.nodes.push(TreeNode {
            name,
            parent,
            children: Vec::new(),
            total: [0; 2],
            self_value: [0; 2],
        });
        self.nodes[parent as usize].children.push(id);
        self.child_lookup.insert((parent, name), id);
        id
    }

    /// Adds `merged` into value slot `slot`.
    pub(crate) fn add(&mut self, merged: &MergedProfile, slot: usize) {
        let symbols = &merged.symbols;
        // Stack nodes are numbered parents first, so one pass maps each
        // stack node to its frame-tree node.
        let mut tree_of: Vec<u32> = vec![0; symbols.node_count()];
        // Frame names are resolved once per location, not once per stack node.
        let mut location_frames: Vec<Option<(u32, u32)>> = vec![None; symbols.location_count()];
        let mut frame_ids: Vec<u32> = Vec::new();
        let mut names = Vec::new();
        for stack_node in 1..symbols.node_count() {
            let Some(entry) = symbols.node(stack_node as u32) else {
                continue;
            };
            let mut current = tree_of.get(entry.parent as usize).copied().unwrap_or(0);
            let Some(slot_for_location) = location_frames.get_mut(entry.location as usize) else {
                continue;
            };
            let (start, len) = match *slot_for_location {
                Some(range) => range,
                None => {
                    names.clear();
                    if let Some(location) = symbols.location(entry.location) {
                        frame_names(symbols, location, &mut names);
                    }
                    let start = frame_ids.len() as u32;
                    for frame in &names {
                        let id = self.name(frame);
                        frame_ids.push(id);
                    }
                    let range = (start, names.len() as u32);
                    location_frames[entry.location as usize] = Some(range);
                    range
                }
            };
            // Lines are innermost first; the tree grows from the root outward.
            for &name in frame_ids[start as usize..(start + len) as usize]
                .iter()
                .rev()
            {
                current = self.child(current, name);
            }
            tree_of[stack_node] = current;
        }
        for (&(stack, _), &value) in &merged.values {
            let node = tree_of.get(stack as usize).copied().unwrap_or(0);
            let entry = &mut self.nodes[node as usize].self_value[slot];
            *entry = entry.wrapping_add(value);
        }
    }

    /// Computes totals from self values (children always follow parents).
    pub(crate) fn finish(&mut self) {
        for node in &mut self.nodes {
            node.total = node.self_value;
        }
        for id in (1..self.nodes.len()).rev() {
            let (parent, total) = (self.nodes[id].parent as usize, self.nodes[id].total);
            let parent_total = &mut self.nodes[parent].total;
            for (sum, value) in parent_total.iter_mut().zip(total) {
                *sum = sum.wrapping_add(value);
            }
        }
    }

    /// Picks which nodes to keep within `max_nodes` (counting one "other"
    /// node per kept node that loses children), largest weight first.
    pub(crate) fn keep(&self, max_nodes: usize, weight: impl Fn(&TreeNode) -> i64) -> Vec<bool> {
        let mut kept = vec![false; self.nodes.len()];
        let mut excluded_children: Vec<usize> = vec![0; self.nodes.len()];
        kept[0] = true;
        excluded_children[0] = self.nodes[0].children.len();
        let mut used = 1 + usize::from(excluded_children[0] > 0);
        let mut heap: BinaryHeap<(i64, Reverse<u32>)> = self.nodes[0]
            .children
            .iter()
            .map(|&c| (weight(&self.nodes[c as usize]), Reverse(c)))
            .collect();
        while let Some((_, Reverse(id))) = heap.pop() {
            let node = &self.nodes[id as usize];
            let parent = node.parent as usize;
            let parent_loses_other = excluded_children[parent] == 1;
            let gains_other = !node.children.is_empty();
            let after = used + 1 + usize::from(gains_other) - usize::from(parent_loses_other);
            if after > max_nodes.max(1) {
                break;
            }
            used = after;
            kept[id as usize] = true;
            excluded_children[parent] -= 1;
            excluded_children[id as usize] = node.children.len();
            for &c in &node.children {
                heap.push((weight(&self.nodes[c as usize]), Reverse(c)));
            }
        }
        kept
    }
}

impl MergedProfile {
    /// Renders the merge as a flame graph of at most `max_nodes` nodes.
    pub fn flamegraph(&self, max_nodes: usize) -> FlameGraph {
        let mut tree = FrameTree::new();
        tree.add(self, 0);
        tree.finish();
        let kept = tree.keep(max_nodes, |n| n.total[0].saturating_abs());
        let other = tree.name(OTHER_NODE_NAME);
        let mut node_count = 0;
        let root = build(&tree, &kept, 0, other, &mut node_count);
        FlameGraph {
            names: tree.names,
            root,
            node_count,
        }
    }
}

fn build(tree: &FrameTree, kept: &[bool], id: u32, other: u32, count: &mut usize) -> FlameNode {
    *count += 1;
    let node = &tree.nodes[id as usize];
    let mut children = Vec::new();
    let mut trimmed = 0i64;
    for &child in &node.children {
        if kept[child as usize] {
            children.push(build(tree, kept, child, other, count));
        } else {
            trimmed = trimmed.wrapping_add(tree.nodes[child as usize].total[0]);
        }
    }
    // Ties go by the frame's name, not its id: ids follow the order the merge met the stacks,
    // which differs between two runs of the same query, and a reloaded link must draw the same
    // graph.
    children.sort_by(|a, b| {
        b.total
            .cmp(&a.total)
            .then_with(|| tree.names[a.name as usize].cmp(&tree.names[b.name as usize]))
    });
    if node.children.iter().any(|&c| !kept[c as usize]) {
        *count += 1;
        children.push(FlameNode {
            name: other,
            total: trimmed,
            self_value: trimmed,
            children: Vec::new(),
        });
    }
    FlameNode {
        name: node.name,
        total: node.total[0],
        self_value: node.self_value[0],
        children,
    }
}
