//! Why a pprof input was refused.

/// A pprof input that Kiln refuses, with what was wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum PprofError {
    /// The input is larger than the configured limit before decompression.
    #[error("profile is {size} bytes, over the limit of {limit} bytes")]
    InputTooLarge {
        /// Size of the input.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The gzip stream is corrupt or truncated.
    #[error("gzip stream is corrupt or truncated")]
    Gzip {
        /// What the gzip decoder reported.
        #[source]
        source: std::io::Error,
    },
    /// The input decompresses to more than the limit (a gzip bomb, or just too big).
    #[error("profile decompresses to more than {limit} bytes")]
    DecompressedTooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// The bytes are not a pprof protobuf (legacy text or binary formats end up here).
    #[error(
        "not a pprof protobuf profile (legacy gperftools, Java or text formats are not accepted)"
    )]
    Protobuf {
        /// What the protobuf decoder reported.
        #[source]
        source: prost::DecodeError,
    },
    /// The bytes break protobuf's wire rules (found by the flat decoder,
    /// which reads the wire itself).
    #[error(
        "not a pprof protobuf profile (legacy gperftools, Java or text formats are not accepted): {what}"
    )]
    Wire {
        /// Which rule, e.g. `invalid varint`.
        what: &'static str,
    },
    /// `string_table` is empty or its first entry is not the empty string.
    #[error("string_table[0] must be the empty string")]
    FirstStringNotEmpty,
    /// A string index points outside `string_table`.
    #[error("{field} refers to string {index}, but the string table has {len} entries")]
    StringIndexOutOfRange {
        /// Which field held the index, e.g. `function.name`.
        field: &'static str,
        /// The offending index.
        index: i64,
        /// Length of the string table.
        len: usize,
    },
    /// An id of 0, which pprof reserves for "none".
    #[error("{table} id 0 is reserved")]
    ZeroId {
        /// The table, e.g. `location`.
        table: &'static str,
    },
    /// Two entries of one table share an id.
    #[error("{table} id {id} appears more than once")]
    DuplicateId {
        /// The table, e.g. `function`.
        table: &'static str,
        /// The repeated id.
        id: u64,
    },
    /// A sample refers to a location that does not exist.
    #[error("sample {sample_index} refers to unknown location {location_id}")]
    UnknownLocation {
        /// Position of the sample in the profile.
        sample_index: usize,
        /// The missing location id.
        location_id: u64,
    },
    /// A line refers to a function that does not exist.
    #[error("location {location_id} refers to unknown function {function_id}")]
    UnknownFunction {
        /// The location holding the line.
        location_id: u64,
        /// The missing function id.
        function_id: u64,
    },
    /// A sample does not carry one value per sample type.
    #[error(
        "sample {sample_index} has {values} values but the profile has {sample_types} sample types"
    )]
    ValueCountMismatch {
        /// Position of the sample in the profile.
        sample_index: usize,
        /// How many values it carries.
        values: usize,
        /// How many sample types the profile declares.
        sample_types: usize,
    },
    /// The profile declares no sample types, so its samples mean nothing.
    #[error("profile has no sample types")]
    NoSampleTypes,
    /// A count exceeds its configured limit.
    #[error("profile has {count} {what}, over the limit of {limit}")]
    LimitExceeded {
        /// What was counted, e.g. `samples` or `frames in one stack`.
        what: &'static str,
        /// How many there were.
        count: usize,
        /// The configured limit.
        limit: usize,
    },
}

impl PprofError {
    /// A short, fixed name for metrics and logs, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InputTooLarge { .. } => "input_too_large",
            Self::Gzip { .. } => "gzip",
            Self::DecompressedTooLarge { .. } => "decompressed_too_large",
            Self::Protobuf { .. } | Self::Wire { .. } => "not_protobuf",
            Self::FirstStringNotEmpty => "first_string_not_empty",
            Self::StringIndexOutOfRange { .. } => "string_index_out_of_range",
            Self::ZeroId { .. } => "zero_id",
            Self::DuplicateId { .. } => "duplicate_id",
            Self::UnknownLocation { .. } => "unknown_location",
            Self::UnknownFunction { .. } => "unknown_function",
            Self::ValueCountMismatch { .. } => "value_count_mismatch",
            Self::NoSampleTypes => "no_sample_types",
            Self::LimitExceeded { .. } => "limit_exceeded",
        }
    }
}
