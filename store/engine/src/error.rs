//! The engine's error enums, one per subsystem: ingest, blocks and queries.

/// Why a profile was refused by [`crate::Head::ingest`]. Nothing of a refused
/// profile is applied: ingest checks everything before it mutates the head.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The series labels carry no `__name__`, or it is empty.
    #[error("series labels have no non-empty __name__ label")]
    MissingName,
    /// A label name is empty.
    #[error("a label name is empty")]
    EmptyLabelName,
    /// A label name is longer than allowed.
    #[error("label name of {len} bytes exceeds the limit of {limit}: {name_prefix:?}")]
    LabelNameTooLong {
        /// The first bytes of the name.
        name_prefix: String,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A label value is longer than allowed.
    #[error("value of label {name:?} has {len} bytes, over the limit of {limit}")]
    LabelValueTooLong {
        /// The label name.
        name: String,
        /// The value's length in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A series would carry more labels than allowed.
    #[error("a series would have {count} labels, over the limit of {limit}")]
    TooManyLabels {
        /// Labels the series would have.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The profile would create more series for its profile name than allowed.
    #[error("profile name {name:?} would have {count} series, over the limit of {limit}")]
    TooManySeries {
        /// The profile name.
        name: String,
        /// Series the name would have after this profile.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The profile would create more series in its namespace (the
    /// `namespace` label; none counts as `""`) than allowed.
    #[error(
        "namespace {namespace:?} would have {count} series, over the limit of {limit}; existing series still ingest"
    )]
    TooManySeriesInNamespace {
        /// The namespace label's value (at most 256 characters of it).
        namespace: String,
        /// Series the namespace would have after this profile.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The profile would create more series than the head may hold in all.
    #[error(
        "the store would hold {count} series, over the limit of {limit}; existing series still ingest"
    )]
    TooManySeriesInStore {
        /// Series the head would hold after this profile.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The series label sets the profile would create are too large
    /// (many distinct promoted sample labels on long request labels).
    #[error(
        "profile would create about {bytes} bytes of series labels, over the limit of {limit}; send fewer distinct string sample labels or shorter series labels"
    )]
    SeriesLabelsTooLarge {
        /// Estimated bytes of the label sets, counted up to the first excess.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The profile holds more samples than allowed.
    #[error("profile has {count} samples, over the limit of {limit}")]
    TooManySamples {
        /// Samples in the profile.
        count: usize,
        /// The limit.
        limit: usize,
    },
}

impl IngestError {
    /// A fixed, low-cardinality name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingName => "missing_name",
            Self::EmptyLabelName => "empty_label_name",
            Self::LabelNameTooLong { .. } => "label_name_too_long",
            Self::LabelValueTooLong { .. } => "label_value_too_long",
            Self::TooManyLabels { .. } => "too_many_labels",
            Self::TooManySeries { .. } => "too_many_series",
            Self::TooManySeriesInNamespace { .. } => "too_many_series_in_namespace",
            Self::TooManySeriesInStore { .. } => "too_many_series_in_store",
            Self::TooManySamples { .. } => "too_many_samples",
            Self::SeriesLabelsTooLarge { .. } => "series_labels_too_large",
        }
    }
}

/// Why a block could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The bytes do not start with the block magic.
    #[error("not a kiln block: bad magic")]
    BadMagic,
    /// The block was written by a format version this build does not read.
    #[error("unsupported block format version {version} (this build reads {oldest} to {newest})")]
    UnsupportedVersion {
        /// Version found in the block.
        version: u32,
        /// The oldest version this build reads.
        oldest: u32,
        /// The newest version this build reads (the one it writes).
        newest: u32,
    },
    /// The bytes end before a structure they announce.
    #[error("block truncated while reading {what}")]
    Truncated {
        /// What was being read.
        what: &'static str,
    },
    /// A section's checksum does not match its bytes.
    #[error("checksum mismatch in section {section}")]
    ChecksumMismatch {
        /// The section's name.
        section: &'static str,
    },
    /// A required section is absent.
    #[error("block has no {section} section")]
    MissingSection {
        /// The section's name.
        section: &'static str,
    },
    /// A structure inside the block is inconsistent (bad reference, bad count, ...).
    #[error("corrupt block: {what}")]
    Corrupt {
        /// What is wrong.
        what: &'static str,
    },
    /// A compressed part of the block could not be decompressed.
    #[error("corrupt compressed data in {what}")]
    Decompress {
        /// Which part.
        what: &'static str,
        /// The decompressor's error.
        #[source]
        source: std::io::Error,
    },
    /// A compressor failed while encoding.
    #[error("compression failed while encoding {what}")]
    Compress {
        /// Which part.
        what: &'static str,
        /// The compressor's error.
        #[source]
        source: std::io::Error,
    },
    /// There is nothing to encode.
    #[error("nothing to encode: no series with samples")]
    Empty,
    /// Reading a stored block by range, or writing a block out, failed.
    #[error("input/output failed on {what}")]
    Io {
        /// What was being read or written.
        what: &'static str,
        /// The reader's or writer's error.
        #[source]
        source: std::io::Error,
    },
}

impl BlockError {
    /// A fixed, low-cardinality name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadMagic => "bad_magic",
            Self::UnsupportedVersion { .. } => "unsupported_version",
            Self::Truncated { .. } => "truncated",
            Self::ChecksumMismatch { .. } => "checksum_mismatch",
            Self::MissingSection { .. } => "missing_section",
            Self::Corrupt { .. } => "corrupt",
            Self::Decompress { .. } => "decompress",
            Self::Compress { .. } => "compress",
            Self::Empty => "empty",
            Self::Io { .. } => "io",
        }
    }
}

/// Why a `=~`/`!~` pattern was not compiled (by
/// [`crate::index::compile_anchored_regex`]).
#[derive(Debug, thiserror::Error)]
pub enum RegexRejection {
    /// The pattern is longer than allowed.
    #[error("pattern of {len} bytes is over the limit of {limit}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The regex crate refused it (syntax, or compiled size over the limit).
    #[error("the regex compiler refused it")]
    Invalid {
        /// The regex crate's error.
        #[source]
        source: regex::Error,
    },
}

/// Why a query could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// A `=~` or `!~` matcher holds an invalid regular expression.
    #[error("invalid regular expression {pattern:?} for label {name:?}")]
    InvalidRegex {
        /// The label name.
        name: String,
        /// The pattern (its first 256 characters).
        pattern: String,
        /// Why it was refused: too long, invalid, or too large compiled.
        #[source]
        source: RegexRejection,
    },
    /// The timeline step is zero or negative.
    #[error("timeline step must be positive, got {step_ms} ms")]
    InvalidStep {
        /// The step asked for.
        step_ms: i64,
    },
    /// The time range is empty or inverted.
    #[error("time range is empty: start {start_ms} >= end {end_ms}")]
    EmptyRange {
        /// Range start.
        start_ms: i64,
        /// Range end.
        end_ms: i64,
    },
    /// The timeline would have more points than allowed.
    #[error("timeline would have {steps} steps, over the limit of {limit}")]
    TooManySteps {
        /// Steps the range and step would produce.
        steps: i64,
        /// The limit.
        limit: i64,
    },
    /// A timeline was merged into one built for a different range or step.
    #[error("timeline shape mismatch: built for another range or step")]
    TimelineShape,
    /// The query's scan stopped part way: its deadline passed or its
    /// request was dropped ([`crate::query::interrupt`]).
    #[error("query stopped part way: {reason:?}")]
    Stopped {
        /// Deadline or cancellation.
        reason: crate::query::interrupt::StopReason,
    },
    /// The query would hold more memory than its share: its range and
    /// selection hold too many distinct stacks to merge at once.
    #[error(
        "the query would hold over {limit_bytes} bytes ({held_bytes} so far): its range and \
         selection hold too many distinct stacks; narrow the range or the selector"
    )]
    TooLarge {
        /// What it held when it stopped.
        held_bytes: usize,
        /// Its share of the query memory.
        limit_bytes: usize,
    },
    /// Part of a block turned out corrupt while being read lazily.
    #[error("block {block_id} is corrupt")]
    CorruptBlock {
        /// The block's id.
        block_id: String,
        /// The decoding error.
        #[source]
        source: BlockError,
    },
}

impl QueryError {
    /// A fixed, low-cardinality name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidRegex { .. } => "invalid_regex",
            Self::InvalidStep { .. } => "invalid_step",
            Self::EmptyRange { .. } => "empty_range",
            Self::TooManySteps { .. } => "too_many_steps",
            Self::TimelineShape => "timeline_shape",
            Self::CorruptBlock { .. } => "corrupt_block",
            Self::Stopped { .. } => "query_stopped",
            Self::TooLarge { .. } => "query_too_large",
        }
    }
}
