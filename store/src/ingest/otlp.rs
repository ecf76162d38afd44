//! OTLP profiles ingest (`opentelemetry.proto.collector.profiles.v1development`).
//!
//! The `v1development` layout changed on the wire between releases, so a
//! request is decoded as every layout Kiln knows ([`revisions`]); the
//! layouts that decode and validate are the candidates. When several do and
//! they yield the same profiles the request is accepted (the bytes cannot
//! say which release sent them, and it does not matter); when they disagree
//! the request is refused as ambiguous. Each decoded request becomes the
//! revision-independent [`model::Batch`], which [`model::uploads_from_batch`]
//! turns into one checked pprof profile per OTLP profile, with series labels
//! from the resource and scope attributes. The store gets each profile as
//! decoded, with its encoding to log, as from every other ingest path. The
//! IO edges are in [`service`].

pub mod model;
pub mod revisions;
pub mod service;
mod wire;

pub use revisions::{DecodedExport, Revision, decode_export, decode_export_reserving};

/// Why an OTLP export request was refused; all are `INVALID_ARGUMENT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OtlpError {
    /// No known revision decodes the body.
    #[error(
        "the body does not decode as an OTLP profiles export of any supported v1development revision (opentelemetry-proto 1.7 to 1.11); it is truncated, corrupt or of another revision: {details}"
    )]
    UnsupportedRevision {
        /// Why each revision's decoder refused, e.g. `1.7: invalid wire type`.
        details: String,
    },
    /// Several revisions decode the body and read it differently.
    #[error(
        "the body decodes as OTLP profiles revisions {revisions} with different contents; refusing to guess"
    )]
    Ambiguous {
        /// The revisions, e.g. `1.8, 1.10`.
        revisions: String,
    },
    /// A dictionary table has more entries than allowed.
    #[error("dictionary {table} has {count} entries, over the limit of {limit}")]
    TableTooLarge {
        /// The table, e.g. `string_table`.
        table: &'static str,
        /// Entries counted.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// An index points outside its table.
    #[error("{field} = {index} is outside {table} (length {len})")]
    IndexOutOfRange {
        /// Which field holds the index, e.g. `sample.stack_index`.
        field: &'static str,
        /// The index.
        index: i64,
        /// The table it indexes.
        table: &'static str,
        /// The table's length.
        len: usize,
    },
    /// A sample's values do not fit its profile.
    #[error("profile {profile}, sample {sample}: {message}")]
    BadSample {
        /// Profile index in the request (depth-first).
        profile: usize,
        /// Sample index in the profile.
        sample: usize,
        /// What is wrong.
        message: String,
    },
    /// A profile has more samples than allowed.
    #[error("profile {profile} has {count} samples, over the limit of {limit}")]
    TooManySamples {
        /// Profile index in the request.
        profile: usize,
        /// Samples in it.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// A stack is deeper than the store keeps.
    #[error("{field} holds {count} locations, over the limit of {limit} frames in one stack")]
    StackTooDeep {
        /// Which field holds the stack, e.g. `stack.location_indices`.
        field: &'static str,
        /// Its locations.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// A repeated field holds more entries than allowed, counted on the
    /// wire before decoding.
    #[error("{count} {what}, over the limit of {limit}")]
    TooMany {
        /// What was counted, e.g. `samples in one profile`.
        what: &'static str,
        /// Counted when the count stopped.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// A link's trace or span id has the wrong length.
    #[error("{field} is {len} bytes; an id of its kind is {expected} bytes (or empty)")]
    BadLink {
        /// `link.trace_id` or `link.span_id`.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The length of such an id.
        expected: usize,
    },
    /// The request holds no profile with samples.
    #[error("the request contains no profiles with samples")]
    Empty,
}

impl OtlpError {
    /// A short, fixed name for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UnsupportedRevision { .. } => "otlp_unsupported_revision",
            Self::Ambiguous { .. } => "otlp_ambiguous",
            Self::TableTooLarge { .. } => "otlp_table_too_large",
            Self::IndexOutOfRange { .. } => "otlp_index_out_of_range",
            Self::BadSample { .. } => "otlp_bad_sample",
            Self::TooManySamples { .. } => "otlp_too_many_samples",
            Self::StackTooDeep { .. } => "otlp_stack_too_deep",
            Self::TooMany { .. } => "otlp_too_many",
            Self::BadLink { .. } => "otlp_bad_link",
            Self::Empty => "otlp_empty",
        }
    }
}

/// Bounds applied while decoding, on top of the request size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OtlpLimits {
    /// Entries in any one dictionary table, counted before decoding so a
    /// body of millions of tiny entries cannot inflate into gigabytes.
    pub max_table_entries: usize,
    /// Samples in one profile (the pprof limit).
    pub max_samples: usize,
    /// Locations in one stack: the store's deepest stack, as the pprof
    /// decoder and the agent cap it. Checked on the wire and again where a
    /// stack is read, before any sample refers to it.
    pub max_stack_depth: usize,
}

impl Default for OtlpLimits {
    fn default() -> Self {
        Self {
            max_table_entries: 1 << 20,
            max_samples: 1_000_000,
            max_stack_depth: kiln_pprof::DecodeLimits::default().max_stack_depth,
        }
    }
}
