//! Errors of parsing and validating a targets file.

/// Why a targets file was rejected. The agent keeps its previous targets when this happens.
#[derive(Debug, thiserror::Error)]
pub enum TargetsError {
    /// The file is larger than a ConfigMap can be, so it was not produced by the operator.
    #[error("targets file is {size} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        /// Size of the rejected input.
        size: usize,
        /// The limit it exceeded.
        limit: usize,
    },
    /// The file is not JSON of the expected shape (unknown field, wrong type, bad syntax).
    #[error("targets file is not valid JSON of the expected shape (line {line}, column {column})")]
    Syntax {
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
        /// The parser's description.
        #[source]
        source: serde_json::Error,
    },
    /// The file was written by a newer (or older) operator with a format this agent cannot read.
    #[error("targets file has format version {found}, this agent reads version {supported}")]
    UnsupportedVersion {
        /// Version in the file.
        found: u32,
        /// Version this crate understands.
        supported: u32,
    },
    /// A target's field holds a value outside its allowed range or pattern.
    #[error("target {source_name:?}: field {field} is invalid: {problem}")]
    InvalidField {
        /// The `source` of the offending target.
        source_name: String,
        /// Path of the field inside the target, e.g. `selector.matchExpressions[0].values`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Two targets have the same `source`, so the file is ambiguous.
    #[error("target {source_name:?} appears more than once")]
    DuplicateSource {
        /// The repeated source.
        source_name: String,
    },
    /// Serializing failed; cannot happen for values built by this crate, reported rather than panicking.
    #[error("targets file could not be serialized")]
    Serialize {
        /// The serializer's description.
        #[source]
        source: serde_json::Error,
    },
}

impl TargetsError {
    /// A fixed, low-cardinality name of the error kind, for metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::Syntax { .. } => "syntax",
            Self::UnsupportedVersion { .. } => "unsupported_version",
            Self::InvalidField { .. } => "invalid_field",
            Self::DuplicateSource { .. } => "duplicate_source",
            Self::Serialize { .. } => "serialize",
        }
    }
}
