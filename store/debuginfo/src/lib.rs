#![doc = include_str!("../README.md")]

mod build_id;
pub mod cache_file;
mod elf;
mod lookup;

pub use build_id::BuildId;
pub use elf::{DebugFile, DebugInfoLimits, FileKind};
pub use lookup::Frame;

/// Why a debug file (or a cache file) cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DebugInfoError {
    /// The bytes are not an ELF file this reader understands.
    #[error("not a readable ELF file: {message}")]
    NotElf {
        /// What the ELF reader said.
        message: String,
    },
    /// The file is larger than the limit.
    #[error("{bytes} bytes is over the limit of {limit}")]
    TooLarge {
        /// Its size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// A section could not be read or inflated.
    #[error("section {section}: {message}")]
    Section {
        /// The section's name.
        section: String,
        /// What went wrong.
        message: String,
    },
    /// Its sections, inflated, would pass the byte budget.
    #[error("debug sections of more than {limit} bytes")]
    SectionBudget {
        /// The budget.
        limit: u64,
    },
    /// It has more function symbols than the limit.
    #[error("more than {limit} function symbols")]
    TooManySymbols {
        /// The limit.
        limit: usize,
    },
    /// Its DWARF nests entries deeper than the limit, or has more entries.
    #[error("DWARF {what} over the limit of {limit}")]
    DwarfLimit {
        /// "nesting" or "entries".
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// Its DWARF is malformed.
    #[error("malformed DWARF: {source}")]
    Dwarf {
        /// What gimli said.
        #[source]
        source: gimli::Error,
    },
    /// A build id is not 2 to 64 bytes of hex.
    #[error("{text:?} is not a build id (2 to 64 bytes as hex)")]
    BadBuildId {
        /// The text, cut short.
        text: String,
    },
    /// A cache file is damaged or from another format.
    #[error("symbol cache file: {message}")]
    CacheFile {
        /// What is wrong.
        message: String,
    },
}

impl DebugInfoError {
    /// A short, fixed name for metrics and logs, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotElf { .. } => "not_elf",
            Self::TooLarge { .. } => "too_large",
            Self::Section { .. } => "section",
            Self::SectionBudget { .. } => "section_budget",
            Self::TooManySymbols { .. } => "too_many_symbols",
            Self::DwarfLimit { .. } => "dwarf_limit",
            Self::Dwarf { .. } => "dwarf",
            Self::BadBuildId { .. } => "bad_build_id",
            Self::CacheFile { .. } => "cache_file",
        }
    }
}
