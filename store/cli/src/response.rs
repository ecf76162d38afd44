//! The store's JSON answers (`docs/api.md`), as the CLI reads them.

use serde::{Deserialize, Serialize};

/// `GET /api/v1/profile-types`.
#[derive(Debug, Deserialize)]
pub struct ProfileTypes {
    /// Every stored profile type.
    pub profile_types: Vec<ProfileTypeEntry>,
}

/// One profile type; only its id matters here.
#[derive(Debug, Deserialize)]
pub struct ProfileTypeEntry {
    /// `name:sample_type:sample_unit:period_type:period_unit[:delta]`.
    pub id: String,
}

/// `GET /api/v1/labels`.
#[derive(Debug, Deserialize)]
pub struct LabelNames {
    /// Label names, sorted.
    pub names: Vec<String>,
}

/// `GET /api/v1/labels/{name}/values`.
#[derive(Debug, Deserialize)]
pub struct LabelValues {
    /// Label values, sorted.
    pub values: Vec<String>,
}

/// `GET /api/v1/series`.
#[derive(Debug, Deserialize)]
pub struct Series {
    /// One label map per series.
    pub series: Vec<std::collections::BTreeMap<String, String>>,
}

/// `GET /api/v1/top`.
#[derive(Debug, Deserialize, Serialize)]
pub struct Top {
    /// The resolved profile type id.
    pub profile_type: String,
    /// Sample unit, e.g. `nanoseconds`.
    pub unit: String,
    /// Sum of the whole selection.
    pub total: i64,
    /// Rows, largest flat value first.
    pub top: Vec<TopEntry>,
}

/// One top-table row.
#[derive(Debug, Deserialize, Serialize)]
pub struct TopEntry {
    /// Function name.
    pub name: String,
    /// Value where the function is the leaf.
    pub flat: i64,
    /// Value of every stack containing the function.
    pub cumulative: i64,
}

/// `GET /api/v1/flamegraph`.
#[derive(Debug, Deserialize, Serialize)]
pub struct FlameGraphResponse {
    /// The resolved profile type id.
    pub profile_type: String,
    /// Sample unit.
    pub unit: String,
    /// Sum of the whole selection.
    pub total: i64,
    /// The merged tree.
    pub flamegraph: FlameGraph,
}

/// A merged call tree; nodes name frames by index.
#[derive(Debug, Deserialize, Serialize)]
pub struct FlameGraph {
    /// Frame names.
    pub names: Vec<String>,
    /// The root (`total`).
    pub root: FlameNode,
    /// Nodes in the tree.
    pub node_count: usize,
}

/// One flame graph node.
#[derive(Debug, Deserialize, Serialize)]
pub struct FlameNode {
    /// Index into [`FlameGraph::names`].
    pub name: u32,
    /// Value of the frame and its callees.
    pub total: i64,
    /// Value of the frame alone.
    #[serde(rename = "self")]
    pub self_value: i64,
    /// Callees.
    #[serde(default)]
    pub children: Vec<FlameNode>,
}

/// `GET /api/v1/diff`.
#[derive(Debug, Deserialize, Serialize)]
pub struct DiffResponse {
    /// The resolved profile type id.
    pub profile_type: String,
    /// Sample unit.
    pub unit: String,
    /// Total of the base (left) selection.
    pub left_total: i64,
    /// Total of the compared (right) selection.
    pub right_total: i64,
    /// The tree carrying both sides.
    pub diff: DiffFlameGraph,
}

/// A diff tree.
#[derive(Debug, Deserialize, Serialize)]
pub struct DiffFlameGraph {
    /// Frame names.
    pub names: Vec<String>,
    /// The root (`total`).
    pub root: DiffNode,
    /// Nodes in the tree.
    pub node_count: usize,
}

/// One diff node.
#[derive(Debug, Deserialize, Serialize)]
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
    /// Callees.
    #[serde(default)]
    pub children: Vec<DiffNode>,
}
