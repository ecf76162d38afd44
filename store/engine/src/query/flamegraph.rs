//! Flame graphs: the merged stacks as a tree of frame names (inlined frames
//! expanded), with total and self values, trimmed server-side to a node
//! budget. Trimmed siblings fold into one [`OTHER_NODE_NAME`] node so every
//! total is kept.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use hashbrown::HashMap;

use super::merged::{MergedProfile, frame_names};

pub use kiln_contract::query_json::{FlameGraph, FlameNode, OTHER_NODE_NAME, ROOT_NODE_NAME};

/// Most nodes a frame tree is built with, whatever the query's own
/// `max_nodes`. A merge whose tree would have more keeps the first nodes it
/// meets; the frames it could not add are counted in an [`OTHER_NODE_NAME`]
/// node under the deepest frame they reached, so totals are kept.
///
/// NB: the tree is built before it is trimmed to `max_nodes` (the largest
/// subtrees are kept, so every node's total must be known first), and one
/// stored stack can unwind into millions of frames: a location holding
/// thousands of inlined lines, repeated thousands of times. Built whole,
/// such a tree took gigabytes before any trimming. At about 80 bytes a node
/// (with its lookup entry), this cap bounds a tree near 80 MiB, and no
/// merge smaller than it is answered any differently.
pub const MAX_FRAME_TREE_NODES: usize = 1 << 20;

/// Most frames of one stack that the folded export and the top table
/// read, root first for folded stacks and leaf first for the top table:
/// twice the depth that ingest accepts (with its inlined lines unwound),
/// so that every stack stored since, with its group frames, is read whole,
/// while a stack stored before that cap, millions of frames deep, costs no
/// more than this.
pub const MAX_UNWOUND_FRAMES: usize = 8192;

/// Marks a stack node whose frames ran past the node cap (in `tree_of`).
const CUT: u32 = 1 << 31;
/// No node (an empty child or sibling link).
const NONE: u32 = u32::MAX;

/// A frame tree, built within a node cap, with up to two value slots,
/// shared by flame graphs (slot 0) and diffs (slots 0 and 1). Nodes are
/// numbered parents first; children are linked lists, so a node costs the
/// same whatever its number of children and nothing here recurses.
#[derive(Debug)]
pub(crate) struct FrameTree {
    pub(crate) names: Vec<String>,
    name_lookup: HashMap<String, u32>,
    pub(crate) nodes: Vec<TreeNode>,
    child_lookup: HashMap<(u32, u32), u32>,
    /// Per node, the value of frames below it that the cap left unbuilt.
    cut: HashMap<u32, [i64; 2]>,
    node_cap: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct TreeNode {
    pub(crate) name: u32,
    pub(crate) parent: u32,
    first_child: u32,
    next_sibling: u32,
    pub(crate) total: [i64; 2],
    pub(crate) self_value: [i64; 2],
}

/// One node of a laid-out tree: a frame-tree node, or the
/// [`OTHER_NODE_NAME`] node of its parent with the values it stands for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Laid {
    Node(u32),
    Other([i64; 2]),
}

/// A node in breadth-first order with its children's positions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaidNode {
    pub(crate) what: Laid,
    pub(crate) first_child: u32,
    pub(crate) child_count: u32,
}

impl FrameTree {
    /// An empty tree (a root) that grows to at most `node_cap` nodes
    /// (itself at most [`MAX_FRAME_TREE_NODES`]).
    pub(crate) fn new(node_cap: usize) -> Self {
        let mut tree = Self {
            names: Vec::new(),
            name_lookup: HashMap::new(),
            nodes: Vec::new(),
            child_lookup: HashMap::new(),
            cut: HashMap::new(),
            node_cap: node_cap.clamp(1, MAX_FRAME_TREE_NODES),
        };
        let root_name = tree.name(ROOT_NODE_NAME);
        tree.nodes.push(TreeNode {
            name: root_name,
            parent: 0,
            first_child: NONE,
            next_sibling: NONE,
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

    /// The id of [`OTHER_NODE_NAME`] when `laid` holds an "other" node,
    /// interned only then: a client reads a name in the table as a frame
    /// that was trimmed, so a tree that kept every frame must not list it.
    pub(crate) fn other_name(&mut self, laid: &[LaidNode]) -> u32 {
        if laid.iter().any(|l| matches!(l.what, Laid::Other(_))) {
            self.name(OTHER_NODE_NAME)
        } else {
            // Never read: no node is `Laid::Other`.
            u32::MAX
        }
    }

    /// The child of `parent` named `name`, added if missing; `None` when
    /// it is missing and the tree is full.
    fn child(&mut self, parent: u32, name: u32) -> Option<u32> {
        if let Some(&id) = self.child_lookup.get(&(parent, name)) {
            return Some(id);
        }
        if self.nodes.len() >= self.node_cap {
            return None;
        }
        let id = self.nodes.len() as u32;
        let parent_node = &mut self.nodes[parent as usize];
        let next_sibling = std::mem::replace(&mut parent_node.first_child, id);
        self.nodes.push(TreeNode {
            name,
            parent,
            first_child: NONE,
            next_sibling,
            total: [0; 2],
            self_value: [0; 2],
        });
        self.child_lookup.insert((parent, name), id);
        Some(id)
    }

    /// The children of node `id` (most recently added first).
    pub(crate) fn children(&self, id: u32) -> impl Iterator<Item = u32> + '_ {
        let first = self.nodes.get(id as usize).map_or(NONE, |n| n.first_child);
        std::iter::successors((first != NONE).then_some(first), move |&c| {
            let next = self.nodes.get(c as usize).map_or(NONE, |n| n.next_sibling);
            (next != NONE).then_some(next)
        })
    }

    /// Adds `merged` into value slot `slot`.
    pub(crate) fn add(&mut self, merged: &MergedProfile, slot: usize) {
        let symbols = &merged.symbols;
        // Stack nodes are numbered parents first, so one pass maps each
        // stack node to its frame-tree node (with `CUT` set where the
        // stack's frames ran past the cap).
        let mut tree_of: Vec<u32> = vec![0; symbols.node_count()];
        // Frame names are resolved once per location, not once per stack node.
        let mut location_frames: Vec<Option<(u32, u32)>> = vec![None; symbols.location_count()];
        let mut frame_ids: Vec<u32> = Vec::new();
        let mut names = Vec::new();
        for stack_node in 1..symbols.node_count() {
            let Some(entry) = symbols.node(stack_node as u32) else {
                continue;
            };
            let parent = tree_of.get(entry.parent as usize).copied().unwrap_or(0);
            if parent & CUT != 0 {
                tree_of[stack_node] = parent;
                continue;
            }
            let mut current = parent;
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
                match self.child(current, name) {
                    Some(child) => current = child,
                    None => {
                        current |= CUT;
                        break;
                    }
                }
            }
            tree_of[stack_node] = current;
        }
        for (&(stack, _), &value) in &merged.values {
            let node = tree_of.get(stack as usize).copied().unwrap_or(0);
            let entry = if node & CUT != 0 {
                &mut self.cut.entry(node & !CUT).or_insert([0; 2])[slot]
            } else {
                &mut self.nodes[node as usize].self_value[slot]
            };
            *entry = entry.wrapping_add(value);
        }
    }

    /// Reserves room for the nodes `merged` could add, within the cap, so
    /// that the tables do not double (and briefly hold both copies) while
    /// they grow.
    pub(crate) fn reserve_for(&mut self, merged: &MergedProfile) {
        let symbols = &merged.symbols;
        let mut bound = 0usize;
        for stack_node in 1..symbols.node_count() {
            let frames = symbols
                .node(stack_node as u32)
                .and_then(|entry| symbols.location(entry.location))
                .map_or(1, |location| symbols.location_lines(location).len().max(1));
            bound = bound.saturating_add(frames);
            if bound >= self.node_cap {
                break;
            }
        }
        let wanted = bound.min(self.node_cap.saturating_sub(self.nodes.len()));
        self.nodes.reserve(wanted);
        self.child_lookup.reserve(wanted);
    }

    /// Computes totals from self values (children always follow parents),
    /// and frees the child lookup, which only building needs.
    pub(crate) fn finish(&mut self) {
        self.child_lookup = HashMap::new();
        for node in &mut self.nodes {
            node.total = node.self_value;
        }
        for (&id, cut) in &self.cut {
            if let Some(node) = self.nodes.get_mut(id as usize) {
                for (sum, value) in node.total.iter_mut().zip(cut) {
                    *sum = sum.wrapping_add(*value);
                }
            }
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
    /// node per kept node that loses children or had frames cut), largest
    /// weight first.
    pub(crate) fn keep(&self, max_nodes: usize, weight: impl Fn(&TreeNode) -> i64) -> Vec<bool> {
        let mut kept = vec![false; self.nodes.len()];
        let mut excluded_children: Vec<u32> = vec![0; self.nodes.len()];
        kept[0] = true;
        excluded_children[0] = self.children(0).count() as u32;
        let needs_other =
            |id: usize, excluded: u32| excluded > 0 || self.cut.contains_key(&(id as u32));
        let mut used = 1 + usize::from(needs_other(0, excluded_children[0]));
        let mut heap: BinaryHeap<(i64, Reverse<u32>)> = self
            .children(0)
            .map(|c| (weight(&self.nodes[c as usize]), Reverse(c)))
            .collect();
        while let Some((_, Reverse(id))) = heap.pop() {
            let node = &self.nodes[id as usize];
            let parent = node.parent as usize;
            let parent_loses_other = !needs_other(parent, excluded_children[parent] - 1);
            let child_count = self.children(id).count() as u32;
            let gains_other = needs_other(id as usize, child_count);
            let after = used + 1 + usize::from(gains_other) - usize::from(parent_loses_other);
            if after > max_nodes.max(1) {
                break;
            }
            used = after;
            kept[id as usize] = true;
            excluded_children[parent] -= 1;
            excluded_children[id as usize] = child_count;
            for c in self.children(id) {
                heap.push((weight(&self.nodes[c as usize]), Reverse(c)));
            }
        }
        kept
    }

    /// Lays the kept nodes out breadth first, each node's kept children
    /// side by side in `order`, then one [`Laid::Other`] for the values of
    /// its trimmed children and cut frames, if it has any.
    pub(crate) fn lay_out(
        &self,
        kept: &[bool],
        order: impl Fn(&TreeNode, &TreeNode) -> std::cmp::Ordering,
    ) -> Vec<LaidNode> {
        let kept_count = kept.iter().filter(|&&k| k).count();
        let mut out = Vec::with_capacity(kept_count.saturating_add(1));
        out.push(LaidNode {
            what: Laid::Node(0),
            first_child: 0,
            child_count: 0,
        });
        let mut children = Vec::new();
        let mut at = 0;
        while at < out.len() {
            if let Laid::Node(id) = out[at].what {
                children.clear();
                let cut = self.cut.get(&id);
                let mut has_other = cut.is_some();
                let mut other = cut.copied().unwrap_or([0; 2]);
                for child in self.children(id) {
                    if kept.get(child as usize).copied().unwrap_or(false) {
                        children.push(child);
                    } else {
                        has_other = true;
                        let total = self.nodes[child as usize].total;
                        other[0] = other[0].wrapping_add(total[0]);
                        other[1] = other[1].wrapping_add(total[1]);
                    }
                }
                children.sort_by(|&a, &b| order(&self.nodes[a as usize], &self.nodes[b as usize]));
                let first = out.len();
                out.extend(children.iter().map(|&c| LaidNode {
                    what: Laid::Node(c),
                    first_child: 0,
                    child_count: 0,
                }));
                if has_other {
                    out.push(LaidNode {
                        what: Laid::Other(other),
                        first_child: 0,
                        child_count: 0,
                    });
                }
                out[at].first_child = first as u32;
                out[at].child_count = (out.len() - first) as u32;
            }
            at += 1;
        }
        out
    }
}

impl MergedProfile {
    /// Renders the merge as a flame graph of at most `max_nodes` nodes.
    pub fn flamegraph(&self, max_nodes: usize) -> FlameGraph {
        let mut tree = FrameTree::new(MAX_FRAME_TREE_NODES);
        tree.reserve_for(self);
        tree.add(self, 0);
        tree.finish();
        let kept = tree.keep(max_nodes, |n| n.total[0].saturating_abs());
        // Ties go by the frame's name, not its id: ids follow the order the merge met the stacks,
        // which differs between two runs of the same query, and a reloaded link must draw the same
        // graph.
        let laid = tree.lay_out(&kept, |a, b| {
            b.total[0]
                .cmp(&a.total[0])
                .then_with(|| tree.names[a.name as usize].cmp(&tree.names[b.name as usize]))
        });
        let other = tree.other_name(&laid);
        let nodes = laid
            .iter()
            .map(|laid| {
                let (name, total, self_value) = match laid.what {
                    Laid::Node(id) => {
                        let node = &tree.nodes[id as usize];
                        (node.name, node.total[0], node.self_value[0])
                    }
                    Laid::Other(values) => (other, values[0], values[0]),
                };
                FlameNode {
                    name,
                    total,
                    self_value,
                    first_child: laid.first_child,
                    child_count: laid.child_count,
                }
            })
            .collect();
        FlameGraph {
            names: tree.names,
            nodes,
        }
    }
}
