//! The vocabulary shared by the engine, the storage layer and the server:
//! labels, matchers, profile types, time ranges and block metadata.

use std::fmt;

/// The label holding a profile's name, e.g. `process_cpu` or `memory`.
pub const NAME_LABEL: &str = kiln_contract::labels::PROFILE_NAME;
/// The label the engine adds to every series, holding its full profile type id.
pub const PROFILE_TYPE_LABEL: &str = "__profile_type__";
/// The label whose value is a series' tenant for the per-namespace series
/// limit (the agent sets it to the pod's Kubernetes namespace).
pub const NAMESPACE_LABEL: &str = kiln_contract::labels::NAMESPACE;

/// Labels that tell apart running instances of one workload rather than
/// workloads: replicas differ only in these (and the profile's name, which
/// differs between a process's CPU and memory profiles), and run the same
/// code, so their profiles share most symbols.
pub const INSTANCE_LABELS: [&str; 8] = [
    NAME_LABEL,
    kiln_contract::labels::NODE,
    kiln_contract::labels::POD,
    kiln_contract::labels::POD_UID,
    kiln_contract::labels::CONTAINER_ID,
    "instance",
    "hostname",
    "pid",
];

/// One `name=value` pair.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Label {
    /// Label name, e.g. `pod`.
    pub name: String,
    /// Label value, e.g. `checkout-7d9f`.
    pub value: String,
}

impl Label {
    /// Builds a label from anything string-like.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
        }
    }
}

/// A set of labels, kept sorted by name with unique names, so equal sets
/// compare and hash equal.
#[derive(
    Debug,
    Clone,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct LabelSet(Vec<Label>);

impl LabelSet {
    /// Sorts `labels` by name; a later duplicate name replaces an earlier one.
    pub fn new(mut labels: Vec<Label>) -> Self {
        labels.reverse();
        labels.sort_by(|a, b| a.name.cmp(&b.name));
        labels.dedup_by(|later, earlier| later.name == earlier.name);
        Self(labels)
    }

    /// The value of label `name`, if present.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .binary_search_by(|l| l.name.as_str().cmp(name))
            .ok()
            .map(|i| self.0[i].value.as_str())
    }

    /// The labels that name the workload: all but [`INSTANCE_LABELS`], in
    /// name order. Replicas of one workload have equal workload labels.
    pub fn workload_labels(&self) -> impl Iterator<Item = &Label> {
        self.0
            .iter()
            .filter(|label| !INSTANCE_LABELS.contains(&label.name.as_str()))
    }

    /// Labels in name order.
    pub fn iter(&self) -> std::slice::Iter<'_, Label> {
        self.0.iter()
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are no labels.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds or replaces one label.
    pub fn insert(&mut self, label: Label) {
        match self.0.binary_search_by(|l| l.name.cmp(&label.name)) {
            Ok(i) => self.0[i] = label,
            Err(i) => self.0.insert(i, label),
        }
    }
}

impl fmt::Display for LabelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, label) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}={:?}", label.name, label.value)?;
        }
        f.write_str("}")
    }
}

/// How a matcher compares a label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum MatchOp {
    /// `=`
    Equal,
    /// `!=`
    NotEqual,
    /// `=~`, a fully anchored regular expression.
    Regex,
    /// `!~`
    NotRegex,
}

/// One label matcher. A missing label matches as the empty string, as in Prometheus.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Matcher {
    /// Label name.
    pub name: String,
    /// Comparison.
    pub op: MatchOp,
    /// Value or pattern.
    pub value: String,
}

/// A profile type: `name:sample_type:sample_unit:period_type:period_unit[:delta]`,
/// one per pprof sample type (Parca's convention).
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ProfileType {
    /// Profile name (the `__name__` label), e.g. `process_cpu`.
    pub name: String,
    /// Sample type, e.g. `cpu`.
    pub sample_type: String,
    /// Sample unit, e.g. `nanoseconds`.
    pub sample_unit: String,
    /// Period type, e.g. `cpu`; may be empty.
    pub period_type: String,
    /// Period unit, e.g. `nanoseconds`; may be empty.
    pub period_unit: String,
    /// True when the profile covers a duration (its values are deltas).
    pub delta: bool,
}

impl ProfileType {
    /// True for a level measured at one instant (heap in use, goroutines
    /// now) rather than work over a period: summing several of its
    /// profiles over time means nothing, their mean does.
    pub fn is_gauge(&self) -> bool {
        self.sample_type.starts_with("inuse_")
            || matches!(self.sample_type.as_str(), "goroutine" | "goroutines")
    }

    /// Parses `name:sample_type:sample_unit:period_type:period_unit[:delta]`,
    /// the form [`fmt::Display`] writes. Returns `None` for anything else.
    pub fn parse(id: &str) -> Option<Self> {
        let parts: Vec<&str> = id.split(':').collect();
        let delta = match parts.len() {
            5 => false,
            6 if parts[5] == "delta" => true,
            _ => return None,
        };
        if parts[0].is_empty() {
            return None;
        }
        Some(Self {
            name: parts[0].to_owned(),
            sample_type: parts[1].to_owned(),
            sample_unit: parts[2].to_owned(),
            period_type: parts[3].to_owned(),
            period_unit: parts[4].to_owned(),
            delta,
        })
    }
}

impl fmt::Display for ProfileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}:{}",
            self.name, self.sample_type, self.sample_unit, self.period_type, self.period_unit
        )?;
        if self.delta {
            f.write_str(":delta")?;
        }
        Ok(())
    }
}

/// A half-open range of unix time in milliseconds: `start <= t < end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct TimeRange {
    /// Inclusive start, unix ms.
    pub start_ms: i64,
    /// Exclusive end, unix ms.
    pub end_ms: i64,
}

impl TimeRange {
    /// True when `t_ms` falls inside the range.
    pub fn contains(&self, t_ms: i64) -> bool {
        self.start_ms <= t_ms && t_ms < self.end_ms
    }

    /// True when the two ranges share at least one instant.
    pub fn overlaps(&self, other: &TimeRange) -> bool {
        self.start_ms < other.end_ms && other.start_ms < self.end_ms
    }
}

/// What a query selects: a profile type plus label matchers over a time range.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Selector {
    /// The profile type to read.
    pub profile_type: ProfileType,
    /// Matchers on series labels; all must match.
    pub matchers: Vec<Matcher>,
}

/// What the storage layer knows about one immutable block without opening it.
/// Serialized as `meta.json` beside the block's data; its presence marks the
/// block as complete.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlockMeta {
    /// Version of the block format; readers refuse versions they do not know.
    pub format_version: u32,
    /// The block's ULID, which also orders blocks by creation.
    pub id: String,
    /// Earliest sample time in the block, unix ms (inclusive).
    pub min_time_ms: i64,
    /// Latest sample time in the block, unix ms (inclusive).
    pub max_time_ms: i64,
    /// 0 for a block cut from the head; each compaction adds one.
    pub compaction_level: u32,
    /// The replica that wrote the block, so replicas sharing a bucket never collide.
    pub replica: String,
    /// Ids of the blocks this one was compacted from (empty at level 0).
    pub sources: Vec<String>,
    /// Number of series.
    pub series: u64,
    /// Number of stored (series, stack, time) values.
    pub samples: u64,
    /// Number of profiles ingested into the block.
    pub profiles: u64,
    /// Size of the block's data object in bytes.
    pub size_bytes: u64,
}
