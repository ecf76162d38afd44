//! How much one profile may cost to decode: the bounds every decoder
//! (bytes, flat, prost message) checks, in one place they all import.

/// Bounds on what one profile may cost to decode. Every bound is checked
/// before the memory it guards is committed, so hostile input fails fast.
#[derive(Debug, Clone)]
pub struct DecodeLimits {
    /// Largest accepted input, compressed or not.
    pub max_input_bytes: usize,
    /// Largest accepted protobuf after decompression.
    pub max_decompressed_bytes: usize,
    /// Most samples in one profile.
    pub max_samples: usize,
    /// Most sample types (values per sample).
    pub max_sample_types: usize,
    /// Most frames in one sample's stack: its locations, and also the frames
    /// they unwind into (one per inlined line), so no stack that passes is
    /// deeper than this anywhere a query expands it.
    pub max_stack_depth: usize,
    /// Most labels on one sample.
    pub max_labels_per_sample: usize,
    /// Longest single string in the string table.
    pub max_string_bytes: usize,
    /// Most entries in each of the location, function, mapping and string tables.
    pub max_table_entries: usize,
    /// Most bytes the decoded profile may take, estimated from the wire
    /// before decoding (see `prescan`).
    pub max_decoded_bytes: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_input_bytes: 32 << 20,
            max_decompressed_bytes: 64 << 20,
            max_samples: 2_000_000,
            max_sample_types: 32,
            max_stack_depth: 4096,
            max_labels_per_sample: 64,
            max_string_bytes: 64 << 10,
            max_table_entries: 4_000_000,
            max_decoded_bytes: 256 << 20,
        }
    }
}
