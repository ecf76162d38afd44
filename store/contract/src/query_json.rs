//! The JSON bodies of the store's query API under `/api/v1/`
//! (`docs/api.md`), defined once: the engine builds the trees, the server
//! serializes these types, and the CLI deserializes them. The UI's unit
//! tests read fixtures the real server wrote from them
//! (`store/ui/tests/fixtures/`, kept by a drift test).

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod flame_tree;

pub use flame_tree::{DiffFlameGraph, DiffNode, FlameGraph, FlameNode};

/// Name of the flame graph node that stands for trimmed siblings.
pub const OTHER_NODE_NAME: &str = "(other)";
/// Name of the flame graph root.
pub const ROOT_NODE_NAME: &str = "total";
/// Response header of `/api/v1/folded` and `/api/v1/pprof` naming the
/// resolved profile type id, whose third part is the sample unit.
pub const PROFILE_TYPE_HEADER: &str = "kiln-profile-type";
/// Response header (and gRPC metadata) of an answer that lacks data the
/// store could not read, naming what: `peers_unanswered=kiln-1`,
/// `skipped_blocks=2`, ... (docs/api.md, "Partial answers"); absent from a
/// complete answer.
pub const PARTIAL_HEADER: &str = "kiln-partial";
/// Value shown in a group frame for series and samples without the label.
pub const MISSING_GROUP_VALUE: &str = "(none)";

/// The frame that stands for one group of a `group_by` query: `label=value`,
/// or `label=(none)` where the label is missing.
pub fn group_frame_name(label: &str, value: &str) -> String {
    if value.is_empty() {
        format!("{label}={MISSING_GROUP_VALUE}")
    } else {
        format!("{label}={value}")
    }
}

/// A frame name made safe for folded stacks: `;` separates frames and a line
/// ends a stack, so `;` becomes `:` and line breaks and tabs become spaces.
/// Values are never touched, so totals survive exactly.
pub fn folded_frame_name(name: &str) -> Cow<'_, str> {
    if !name.contains([';', '\n', '\r', '\t']) {
        return Cow::Borrowed(name);
    }
    Cow::Owned(
        name.chars()
            .map(|c| match c {
                ';' => ':',
                '\n' | '\r' | '\t' => ' ',
                c => c,
            })
            .collect(),
    )
}

/// Any failed request: `{"error": "...", "reason": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// What went wrong, naming the parameter and, for selectors, the position.
    pub error: String,
    /// A stable machine-readable reason, e.g. `bad_selector`.
    pub reason: String,
}

/// `GET /api/v1/profile-types`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileTypes {
    /// Every profile type with data in the range, sorted.
    pub profile_types: Vec<ProfileTypeEntry>,
}

/// One profile type, as its id and its parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileTypeEntry {
    /// `name:sample_type:sample_unit:period_type:period_unit[:delta]`.
    pub id: String,
    /// The profile name (`__name__`), e.g. `process_cpu`.
    pub name: String,
    /// e.g. `cpu`.
    pub sample_type: String,
    /// e.g. `nanoseconds`.
    pub sample_unit: String,
    /// e.g. `cpu`; may be empty.
    pub period_type: String,
    /// e.g. `nanoseconds`; may be empty.
    pub period_unit: String,
    /// True when values are deltas over a duration.
    pub delta: bool,
}

/// `GET /api/v1/labels`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelNames {
    /// Label names, sorted.
    pub names: Vec<String>,
    /// True when `limit` left names out.
    pub truncated: bool,
}

/// `GET /api/v1/labels/{name}/values`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelValues {
    /// The label asked about.
    pub name: String,
    /// Its values, sorted.
    pub values: Vec<String>,
    /// True when `limit` left values out.
    pub truncated: bool,
}

/// `GET /api/v1/series`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeriesList {
    /// One label map per series, sorted.
    pub series: Vec<BTreeMap<String, String>>,
    /// True when `limit` left series out.
    pub truncated: bool,
}

/// `GET /api/v1/flamegraph`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlameGraphResponse {
    /// The resolved profile type id.
    pub profile_type: String,
    /// Sample unit, e.g. `nanoseconds`.
    pub unit: String,
    /// Start of the range, unix ms.
    pub from_ms: i64,
    /// End of the range (inclusive), unix ms.
    pub to_ms: i64,
    /// Sum of the whole selection.
    pub total: i64,
    /// The labels each root frame groups by, outermost first; empty when
    /// the query did not group.
    #[serde(default)]
    pub group_by: Vec<String>,
    /// The merged tree.
    pub flamegraph: FlameGraph,
    /// Where the functions of the tree's frames are in the source, by
    /// frame name: those whose profile or debug info names a file.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sources: BTreeMap<String, FrameSource>,
}

/// Where a function is in the source: its file and the line it starts at,
/// or, where the profile or debug info gives no start, the first of its
/// lines that the samples hit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameSource {
    /// The source file, as the debug info or the profile names it.
    pub file: String,
    /// The line; 0 (and absent in JSON) when unknown.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub line: u32,
}

fn is_zero(line: &u32) -> bool {
    *line == 0
}

impl std::fmt::Display for FrameSource {
    /// `file:line`, or the file alone when the line is unknown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            f.write_str(&self.file)
        } else {
            write!(f, "{}:{}", self.file, self.line)
        }
    }
}

/// `GET /api/v1/top`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopResponse {
    /// The resolved profile type id.
    pub profile_type: String,
    /// Sample unit.
    pub unit: String,
    /// Sum of the whole selection.
    pub total: i64,
    /// The labels grouped by (each group is a `label=value` row); empty
    /// when the query did not group.
    #[serde(default)]
    pub group_by: Vec<String>,
    /// Rows, largest flat value first.
    pub top: Vec<TopEntry>,
}

/// One row of the top table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopEntry {
    /// Function (frame) name.
    pub name: String,
    /// Value where this function is the leaf frame.
    pub flat: i64,
    /// Value of every stack this function appears in (counted once per stack).
    pub cumulative: i64,
    /// Where the function is in the source, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<FrameSource>,
}

/// `GET /api/v1/timeline`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineResponse {
    /// The resolved profile type id.
    pub profile_type: String,
    /// Sample unit.
    pub unit: String,
    /// The totals per step.
    pub timeline: Timeline,
    /// How each step's profiles were combined: `sum`, or `average` (their
    /// mean, the default for gauges such as heap in use and goroutines).
    #[serde(default = "sum_aggregation")]
    pub aggregation: String,
}

fn sum_aggregation() -> String {
    "sum".to_owned()
}

/// Per-step totals; step `i` covers
/// `[start_ms + i * step_ms, start_ms + (i + 1) * step_ms)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// Start of the first step, unix ms.
    pub start_ms: i64,
    /// Step length in ms.
    pub step_ms: i64,
    /// Profile totals per step, summed or averaged (rounded) as the
    /// response's `aggregation` says.
    pub values: Vec<i64>,
    /// Profiles per step.
    #[serde(default)]
    pub profiles: Vec<u64>,
}

/// `GET /api/v1/diff`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_frame_names_keep_plain_names_and_neutralize_separators() {
        assert!(matches!(
            folded_frame_name("main.work"),
            Cow::Borrowed("main.work")
        ));
        assert_eq!(folded_frame_name("a;b\nc\td"), "a:b c d");
    }

    #[test]
    fn group_frames_name_the_label_and_a_missing_value() {
        assert_eq!(group_frame_name("comm", "nginx"), "comm=nginx");
        assert_eq!(group_frame_name("pod", ""), "pod=(none)");
    }
}

/// `POST /api/v1/debuginfo`: what the store kept of an uploaded ELF file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DebugInfoUploaded {
    /// The build id the file records, lowercase hex: frames of this build
    /// id are named from it.
    pub build_id: String,
    /// `binary` (a binary, stripped or not) or `debug` (debug info alone,
    /// as `objcopy --only-keep-debug` makes it).
    pub kind: String,
    /// Whether it has DWARF (static and inlined functions, files, lines).
    pub dwarf: bool,
    /// Its function symbols.
    pub symbols: usize,
    /// Its size.
    pub bytes: usize,
}
