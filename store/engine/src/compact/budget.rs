//! What a streaming merge projects its peak memory from, before it opens
//! each source: what it holds, counted, plus what the next source can add
//! at most (from its section table and metadata) and what writing the
//! densest series hour takes. Shared symbols are charged once, since what
//! earlier sources brought is counted in the output's table as it is.

use crate::block::COLUMN_CHUNK_MS;
use crate::block::format::SectionKind;
use crate::block::source::SourceHeader;

/// What a merge holds whatever its sources (zstd contexts, encoders,
/// buffers): the smallest merges measured peaked near it
/// (docs/benchmarks/log/2026-11-23-store-memory-compaction-durability.md).
pub const MERGE_FIXED_BYTES: u64 = 8 << 20;

/// Heap bytes one source's symbol tables take per decompressed section
/// byte, decoded (while the source is opened) and again at most as new
/// entries of the output's table with its lookups. Measured by the
/// `compaction_memory` example (decoded / section bytes).
pub const MERGE_BYTES_PER_SYMBOL_SECTION_BYTE: u64 = 6;

/// Heap bytes held per value of the hour of a series being written: its
/// points as (time, value) pairs with vector slack, their minute-window sums
/// and column encoders (measured: 8.5 MB of heap for a day merge of a
/// 90,000-point-an-hour series, fixed costs included; the
/// `compaction_memory_bound` test). Charged for the densest source's
/// average series hour, doubled for series denser than the average.
pub const MERGE_BYTES_PER_HOUR_VALUE: u64 = 2 * 64;

/// Heap bytes per output series for its directory entry (labels, hour
/// chunks, rollup chunks) and label index: charged for the sources' largest
/// series count, as the output has about as many series as each source.
pub const MERGE_BYTES_PER_OUTPUT_SERIES: u64 = 512;

/// Heap bytes per source series for what merging them costs beyond the
/// output's entries (series seen once per source).
pub const MERGE_BYTES_PER_SOURCE_SERIES: u64 = 64;

/// Symbol table sections of a block.
const SYMBOL_SECTIONS: [SectionKind; 6] = [
    SectionKind::Strings,
    SectionKind::Mappings,
    SectionKind::Functions,
    SectionKind::Locations,
    SectionKind::Stacks,
    SectionKind::LabelSets,
];

/// The projection so far: what the opened sources hold and the series
/// figures of the sources taken.
#[derive(Debug, Default)]
pub(super) struct PeakProjection {
    held: u64,
    densest_hour: u64,
    most_series: u64,
    all_series: u64,
}

/// The projection with one more source.
#[derive(Debug, Clone, Copy)]
pub(super) struct NextSource {
    /// The merge's projected peak with this source opened.
    pub(super) peak: u64,
    /// Decompressed bytes of its symbol sections.
    pub(super) symbol_section_bytes: u64,
    densest_hour: u64,
    most_series: u64,
    all_series: u64,
}

impl PeakProjection {
    /// The peak if `header`'s source is opened next, while the output's
    /// symbol table holds `output_symbols` bytes and each source reads
    /// `window` bytes at a time.
    pub(super) fn with(
        &self,
        header: &SourceHeader,
        output_symbols: u64,
        window: u64,
    ) -> NextSource {
        let meta = &header.meta;
        let hours =
            u64::try_from(meta.max_time_ms.saturating_sub(meta.min_time_ms) / COLUMN_CHUNK_MS)
                .unwrap_or(0)
                .saturating_add(1);
        let hour_values = meta.samples.div_ceil(meta.series.max(1)).div_ceil(hours);
        let densest_hour = self.densest_hour.max(hour_values);
        let most_series = self.most_series.max(meta.series);
        let all_series = self.all_series.saturating_add(meta.series);
        let series_costs = densest_hour
            .saturating_mul(MERGE_BYTES_PER_HOUR_VALUE)
            .saturating_add(most_series.saturating_mul(MERGE_BYTES_PER_OUTPUT_SERIES))
            .saturating_add(all_series.saturating_mul(MERGE_BYTES_PER_SOURCE_SERIES));
        let symbol_section_bytes = header.decompressed_bytes(&SYMBOL_SECTIONS);
        let source = symbol_section_bytes
            .saturating_mul(MERGE_BYTES_PER_SYMBOL_SECTION_BYTE)
            .saturating_add(header.decompressed_bytes(&[SectionKind::Series]))
            .saturating_add(window);
        let peak = output_symbols
            .saturating_add(self.held)
            .saturating_add(source)
            .saturating_add(MERGE_FIXED_BYTES)
            .saturating_add(series_costs);
        NextSource {
            peak,
            symbol_section_bytes,
            densest_hour,
            most_series,
            all_series,
        }
    }

    /// Takes the source `next` projected, which now holds `held` bytes
    /// (its remaps, directory and read window).
    pub(super) fn opened(&mut self, next: NextSource, held: u64) {
        self.held = self.held.saturating_add(held);
        self.densest_hour = next.densest_hour;
        self.most_series = next.most_series;
        self.all_series = next.all_series;
    }

    /// What the opened sources hold.
    pub(super) fn held(&self) -> u64 {
        self.held
    }
}

/// What the output will hold once opened by range
/// ([`crate::Block::open_ranged`]: its symbol tables, series directory and
/// label index), projected as sources are taken. The symbols are what the
/// output's table holds so far, counted (with its lookups, more than the
/// table decoded from the output block takes), plus what the next source
/// can add at most. The directory and index are charged per source, summed:
/// most of a directory is its series' hour chunks, which sources of
/// different hours do not share.
///
/// NB: charging every source its own projected hold, summed, counted the
/// symbols a day's hour blocks share 24 times: a day of 2,000 pods fitted
/// five blocks to a 128 MiB cache, and the store kept 15 blocks where 10
/// held the same (2.86 bytes per value against 2.54;
/// docs/benchmarks/log/2026-12-01-store-merge-cap-output-table.md).
#[derive(Debug, Default)]
pub(super) struct OutputHold {
    directory_bytes: u64,
}

/// The output's projected hold with one more source.
#[derive(Debug, Clone, Copy)]
pub(super) struct NextOutput {
    /// Heap bytes the output would hold opened by range.
    pub(super) hold: u64,
    directory_bytes: u64,
}

/// The sections of a block's directory and label index.
const DIRECTORY_SECTIONS: [SectionKind; 2] = [SectionKind::Series, SectionKind::Postings];

impl OutputHold {
    /// The projected hold if `header`'s source is merged next, while the
    /// output's symbol table holds `output_symbols` bytes.
    pub(super) fn with(&self, header: &SourceHeader, output_symbols: u64) -> NextOutput {
        let directory_bytes = self
            .directory_bytes
            .saturating_add(header.decompressed_bytes(&DIRECTORY_SECTIONS));
        let new_symbols = header.decompressed_bytes(&SYMBOL_SECTIONS);
        let hold = output_symbols.saturating_add(crate::block::projected_hold(
            directory_bytes.saturating_add(new_symbols),
        ));
        NextOutput {
            hold,
            directory_bytes,
        }
    }

    /// Takes the source `next` projected.
    pub(super) fn taken(&mut self, next: NextOutput) {
        self.directory_bytes = next.directory_bytes;
    }
}
