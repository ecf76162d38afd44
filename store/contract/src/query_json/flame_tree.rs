//! Flame graph trees as flat vectors of nodes, with the nested JSON of
//! `/api/v1/flamegraph` and `/api/v1/diff` written and read without
//! recursion.
//!
//! NB: a tree of boxed or vector-held children recurses once per level when
//! it is built, serialized by a derived `Serialize`, or dropped. A stored
//! stack thousands of frames deep (or millions, from an older store that
//! did not cap unwound inlined lines) then overflows the stack of the thread
//! that answers, which aborts the whole process, not only the request. Here
//! the nodes live in one vector in breadth-first order, each node's callees
//! side by side, so dropping is one free, and the JSON is written with an
//! explicit stack whose size is on the heap.

use std::fmt::Write as _;
use std::ops::Range;

use serde::ser::{Error as _, SerializeStruct};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A merged call tree; nodes name frames by index into `names`.
///
/// `nodes[0]` is the root ([`super::ROOT_NODE_NAME`]), whose total is the
/// merge's total. Nodes are in breadth-first order: the callees of a node
/// are `nodes[first_child..first_child + child_count]`, largest total first.
/// In JSON the tree nests, one object per node, as `root`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlameGraph {
    /// Frame names.
    pub names: Vec<String>,
    /// Every node, the root first, including [`super::OTHER_NODE_NAME`] nodes.
    pub nodes: Vec<FlameNode>,
}

/// One flame graph node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlameNode {
    /// Index into [`FlameGraph::names`].
    pub name: u32,
    /// Value of this frame and everything it called.
    pub total: i64,
    /// Value of this frame alone.
    pub self_value: i64,
    /// Position in [`FlameGraph::nodes`] of the first callee.
    pub first_child: u32,
    /// Number of callees, which follow the first one.
    pub child_count: u32,
}

/// A diff flame graph; nodes name frames by index into `names`, laid out
/// as in [`FlameGraph`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiffFlameGraph {
    /// Frame names.
    pub names: Vec<String>,
    /// Every node, the root ([`super::ROOT_NODE_NAME`]) first.
    pub nodes: Vec<DiffNode>,
}

/// One node of a diff flame graph.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiffNode {
    /// Index into [`DiffFlameGraph::names`].
    pub name: u32,
    /// Total in the base selection.
    pub base_total: i64,
    /// Self value in the base selection.
    pub base_self: i64,
    /// Total in the compared selection.
    pub compare_total: i64,
    /// Self value in the compared selection.
    pub compare_self: i64,
    /// Position in [`DiffFlameGraph::nodes`] of the first callee.
    pub first_child: u32,
    /// Number of callees (largest combined total first).
    pub child_count: u32,
}

/// What the flat layout needs of a node.
trait TreeNode: Copy {
    fn children(&self) -> Range<usize>;
    fn set_children(&mut self, children: Range<usize>);
    /// The node's own JSON fields, `"name":..,...`, without braces.
    fn write_fields(&self, out: &mut String);
}

impl TreeNode for FlameNode {
    fn children(&self) -> Range<usize> {
        let first = self.first_child as usize;
        first..first.saturating_add(self.child_count as usize)
    }
    fn set_children(&mut self, children: Range<usize>) {
        self.first_child = u32::try_from(children.start).unwrap_or(u32::MAX);
        self.child_count = u32::try_from(children.len()).unwrap_or(0);
    }
    fn write_fields(&self, out: &mut String) {
        let _ = write!(
            out,
            r#""name":{},"total":{},"self":{}"#,
            self.name, self.total, self.self_value
        );
    }
}

impl TreeNode for DiffNode {
    fn children(&self) -> Range<usize> {
        let first = self.first_child as usize;
        first..first.saturating_add(self.child_count as usize)
    }
    fn set_children(&mut self, children: Range<usize>) {
        self.first_child = u32::try_from(children.start).unwrap_or(u32::MAX);
        self.child_count = u32::try_from(children.len()).unwrap_or(0);
    }
    fn write_fields(&self, out: &mut String) {
        let _ = write!(
            out,
            r#""name":{},"base_total":{},"base_self":{},"compare_total":{},"compare_self":{}"#,
            self.name, self.base_total, self.base_self, self.compare_total, self.compare_self
        );
    }
}

const NO_NODES: &[FlameNode] = &[FlameNode {
    name: 0,
    total: 0,
    self_value: 0,
    first_child: 0,
    child_count: 0,
}];
const NO_DIFF_NODES: &[DiffNode] = &[DiffNode {
    name: 0,
    base_total: 0,
    base_self: 0,
    compare_total: 0,
    compare_self: 0,
    first_child: 0,
    child_count: 0,
}];

/// The callees of `node` in `nodes` (empty when the range is out of bounds).
fn children_of<'n, N: TreeNode>(nodes: &'n [N], node: &N) -> &'n [N] {
    nodes.get(node.children()).unwrap_or(&[])
}

impl FlameGraph {
    /// The root (an empty node when the graph has none).
    pub fn root(&self) -> &FlameNode {
        self.nodes.first().unwrap_or(&NO_NODES[0])
    }

    /// The callees of `node`, largest total first.
    pub fn children(&self, node: &FlameNode) -> &[FlameNode] {
        children_of(&self.nodes, node)
    }

    /// Nodes in the tree, including the root and [`super::OTHER_NODE_NAME`] nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The name of `node`.
    pub fn name(&self, node: &FlameNode) -> &str {
        self.names
            .get(node.name as usize)
            .map_or("", String::as_str)
    }

    /// The tree's nested JSON (`{"name":..,"children":[..]}`), written
    /// iteratively.
    pub fn root_json(&self) -> String {
        nested_json(if self.nodes.is_empty() {
            NO_NODES
        } else {
            &self.nodes[..]
        })
    }
}

impl DiffFlameGraph {
    /// The root (an empty node when the graph has none).
    pub fn root(&self) -> &DiffNode {
        self.nodes.first().unwrap_or(&NO_DIFF_NODES[0])
    }

    /// The callees of `node`, largest combined total first.
    pub fn children(&self, node: &DiffNode) -> &[DiffNode] {
        children_of(&self.nodes, node)
    }

    /// Nodes in the tree, including the root and [`super::OTHER_NODE_NAME`] nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The tree's nested JSON, written iteratively.
    pub fn root_json(&self) -> String {
        nested_json(if self.nodes.is_empty() {
            NO_DIFF_NODES
        } else {
            &self.nodes[..]
        })
    }
}

/// Writes `nodes[0]` and everything under it as nested JSON objects with a
/// `children` array each, depth first, with the pending levels on the heap.
/// A child range out of bounds, or one that does not lie after its parent
/// (which could loop), is written as no children.
fn nested_json<N: TreeNode>(nodes: &[N]) -> String {
    // About 50 bytes a node for small values; one growth at most beyond.
    let mut out = String::with_capacity(nodes.len().saturating_mul(56));
    // Each open node: the rest of its children still to write.
    let mut open: Vec<Range<usize>> = Vec::new();
    let mut next = Some(0usize);
    loop {
        if let Some(id) = next.take() {
            let Some(node) = nodes.get(id) else { break };
            out.push('{');
            node.write_fields(&mut out);
            out.push_str(r#","children":["#);
            let children = node.children();
            let children = if children.start > id && children.end <= nodes.len() {
                children
            } else {
                0..0
            };
            open.push(children);
        }
        let Some(rest) = open.last_mut() else { break };
        match rest.next() {
            Some(child) => {
                if !out.ends_with('[') {
                    out.push(',');
                }
                next = Some(child);
            }
            None => {
                out.push_str("]}");
                open.pop();
            }
        }
    }
    out
}

/// Serializes a graph as `{"names":[..],"root":{nested},"node_count":n}`.
fn serialize_graph<S: Serializer>(
    serializer: S,
    type_name: &'static str,
    names: &[String],
    root_json: String,
    node_count: usize,
) -> Result<S::Ok, S::Error> {
    // The nested text goes out as it is: `RawValue` checks it with a parser
    // that keeps its own stack on the heap.
    let root = serde_json::value::RawValue::from_string(root_json).map_err(S::Error::custom)?;
    let mut graph = serializer.serialize_struct(type_name, 3)?;
    graph.serialize_field("names", names)?;
    graph.serialize_field("root", &root)?;
    graph.serialize_field("node_count", &node_count)?;
    graph.end()
}

impl Serialize for FlameGraph {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_graph(
            serializer,
            "FlameGraph",
            &self.names,
            self.root_json(),
            self.node_count().max(1),
        )
    }
}

impl Serialize for DiffFlameGraph {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_graph(
            serializer,
            "DiffFlameGraph",
            &self.names,
            self.root_json(),
            self.node_count().max(1),
        )
    }
}

/// A nested node as JSON holds it, read by clients; flattened at once.
#[derive(Deserialize)]
struct NestedFlameNode {
    name: u32,
    total: i64,
    #[serde(rename = "self")]
    self_value: i64,
    #[serde(default)]
    children: Vec<NestedFlameNode>,
}

#[derive(Deserialize)]
struct NestedDiffNode {
    name: u32,
    base_total: i64,
    base_self: i64,
    compare_total: i64,
    compare_self: i64,
    #[serde(default)]
    children: Vec<NestedDiffNode>,
}

#[derive(Deserialize)]
struct NestedGraph<N> {
    names: Vec<String>,
    root: N,
    node_count: usize,
}

/// A nested node that can give up its children.
trait Nested: Sized {
    type Flat: TreeNode;
    fn take_children(&mut self) -> Vec<Self>;
    fn flat(&self) -> Self::Flat;
}

impl Nested for NestedFlameNode {
    type Flat = FlameNode;
    fn take_children(&mut self) -> Vec<Self> {
        std::mem::take(&mut self.children)
    }
    fn flat(&self) -> FlameNode {
        FlameNode {
            name: self.name,
            total: self.total,
            self_value: self.self_value,
            first_child: 0,
            child_count: 0,
        }
    }
}

impl Nested for NestedDiffNode {
    type Flat = DiffNode;
    fn take_children(&mut self) -> Vec<Self> {
        std::mem::take(&mut self.children)
    }
    fn flat(&self) -> DiffNode {
        DiffNode {
            name: self.name,
            base_total: self.base_total,
            base_self: self.base_self,
            compare_total: self.compare_total,
            compare_self: self.compare_self,
            first_child: 0,
            child_count: 0,
        }
    }
}

/// Lays a nested tree out breadth first. Each node's children are moved out
/// before it is dropped, so no drop recurses.
fn flatten<N: Nested>(root: N) -> Vec<N::Flat> {
    let mut nodes = vec![root.flat()];
    let mut queue = std::collections::VecDeque::from([(0usize, root)]);
    while let Some((id, mut nested)) = queue.pop_front() {
        let children = nested.take_children();
        let start = nodes.len();
        for child in children {
            nodes.push(child.flat());
            queue.push_back((nodes.len() - 1, child));
        }
        let end = nodes.len();
        if let Some(node) = nodes.get_mut(id) {
            node.set_children(start..end);
        }
    }
    nodes
}

fn check_count<E: serde::de::Error>(declared: usize, nodes: usize) -> Result<(), E> {
    if declared != nodes {
        return Err(E::custom(format!(
            "node_count is {declared} but the tree has {nodes} nodes"
        )));
    }
    Ok(())
}

impl<'de> Deserialize<'de> for FlameGraph {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let graph = NestedGraph::<NestedFlameNode>::deserialize(deserializer)?;
        let nodes = flatten(graph.root);
        check_count::<D::Error>(graph.node_count, nodes.len())?;
        Ok(Self {
            names: graph.names,
            nodes,
        })
    }
}

impl<'de> Deserialize<'de> for DiffFlameGraph {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let graph = NestedGraph::<NestedDiffNode>::deserialize(deserializer)?;
        let nodes = flatten(graph.root);
        check_count::<D::Error>(graph.node_count, nodes.len())?;
        Ok(Self {
            names: graph.names,
            nodes,
        })
    }
}

#[cfg(test)]
mod tests;
