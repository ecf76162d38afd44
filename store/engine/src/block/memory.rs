//! How much memory a decoded block holds, so callers that keep blocks in
//! memory (the store's block cache) can budget by what a block really costs
//! rather than by its encoded size.

use std::mem::size_of;

use super::{Block, BlockSeries};
use crate::model::{Label, LabelSet, ProfileType};
use crate::symbols::{Function, Line, Location, Mapping, SampleLabel, StackNode};

/// Per-allocation overhead assumed for small heap objects (allocator
/// header and rounding): a guess, but the same guess everywhere.
const ALLOC_OVERHEAD: usize = 16;

impl Block {
    /// Approximate heap bytes this decoded block holds: the owned data
    /// section (or the read window of one read by range), the decoded symbol tables, the series directory and the
    /// label index. Counts capacities, not lengths, since that is what the
    /// allocator hands out. Deterministic for a given block.
    pub fn approx_decoded_bytes(&self) -> usize {
        size_of::<Block>()
            + self.data.held_bytes()
            + self.symbols_bytes()
            + self.series_bytes()
            + self.index_bytes()
            + self.meta_bytes()
    }

    fn symbols_bytes(&self) -> usize {
        let s = &self.symbols;
        let strings: usize = s
            .strings
            .iter()
            .map(|string| string.len() + ALLOC_OVERHEAD)
            .sum::<usize>()
            + s.strings.capacity() * size_of::<Box<str>>();
        let label_sets: usize = s
            .label_sets
            .iter()
            .map(|set| set.len() * size_of::<SampleLabel>() + ALLOC_OVERHEAD)
            .sum::<usize>()
            + s.label_sets.capacity() * size_of::<Box<[SampleLabel]>>();
        strings
            + label_sets
            + s.mappings.capacity() * size_of::<Mapping>()
            + s.functions.capacity() * size_of::<Function>()
            + s.locations.capacity() * size_of::<Location>()
            + s.lines.capacity() * size_of::<Line>()
            + s.nodes.capacity() * size_of::<StackNode>()
    }

    fn series_bytes(&self) -> usize {
        self.series.capacity() * size_of::<BlockSeries>()
            + self
                .series
                .iter()
                .map(|series| {
                    label_set_bytes(&series.labels)
                        + profile_type_bytes(&series.profile_type)
                        + series.columns.capacity() * size_of::<(i64, super::BlobRef)>()
                        + series.rollups.capacity() * size_of::<(u8, i64, super::BlobRef)>()
                })
                .sum::<usize>()
    }

    fn index_bytes(&self) -> usize {
        // BTreeMap nodes hold up to 11 entries; charge each entry its key
        // and value plus a share of the node, as a flat per-entry cost.
        const BTREE_ENTRY: usize = 32;
        self.index
            .postings()
            .iter()
            .map(|(name, values)| {
                name.capacity()
                    + ALLOC_OVERHEAD
                    + BTREE_ENTRY
                    + values
                        .iter()
                        .map(|(value, bitmap)| {
                            value.capacity()
                                + ALLOC_OVERHEAD
                                + BTREE_ENTRY
                                + size_of::<roaring::RoaringBitmap>()
                                + bitmap.serialized_size()
                        })
                        .sum::<usize>()
            })
            .sum()
    }

    fn meta_bytes(&self) -> usize {
        let meta = &self.meta;
        meta.id.capacity()
            + meta.replica.capacity()
            + meta
                .sources
                .iter()
                .map(|s| s.capacity() + size_of::<String>())
                .sum::<usize>()
    }
}

fn label_set_bytes(labels: &LabelSet) -> usize {
    labels
        .iter()
        .map(|label| {
            size_of::<Label>() + label.name.capacity() + label.value.capacity() + 2 * ALLOC_OVERHEAD
        })
        .sum::<usize>()
        + ALLOC_OVERHEAD
}

fn profile_type_bytes(profile_type: &ProfileType) -> usize {
    [
        &profile_type.name,
        &profile_type.sample_type,
        &profile_type.sample_unit,
        &profile_type.period_type,
        &profile_type.period_unit,
    ]
    .iter()
    .map(|s| s.capacity() + ALLOC_OVERHEAD)
    .sum()
}

#[cfg(test)]
mod tests {
    use crate::model::{Label, LabelSet};
    use crate::{Block, Head, IngestLimits, encode_block};
    use kiln_pprof::ProfileBuilder;

    fn profile(stacks: usize) -> kiln_pprof::Profile {
        let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
        for i in 0..stacks {
            let f = b.function(&kiln_pprof::FunctionSpec {
                name: format!("function_{i}"),
                system_name: String::new(),
                filename: "main.go".into(),
                start_line: 1,
            });
            let loc = b.location(0, 0x1000 + i as u64, &[(f, 10)]);
            b.sample(&[loc], &[10], &[]);
        }
        kiln_pprof::decode(
            &kiln_pprof::encode_gzip(&b.finish()),
            &kiln_pprof::DecodeLimits::default(),
        )
        .expect("built profile decodes")
    }

    fn block_with(series: usize, stacks: usize) -> Block {
        let mut head = Head::new();
        let p = profile(stacks);
        for s in 0..series {
            let labels = LabelSet::new(vec![
                Label::new("__name__", "process_cpu"),
                Label::new("pod", format!("pod-{s}")),
            ]);
            head.ingest(&p, &labels, 1_000 + s as i64, 10, &IngestLimits::default())
                .expect("ingest");
        }
        let (_, bytes) = encode_block(&head, "01TEST", "test").expect("encode");
        Block::decode(&bytes).expect("decode")
    }

    #[test]
    fn decoded_size_is_at_least_the_data_section_and_grows_with_content() {
        let small = block_with(2, 5);
        let large = block_with(50, 200);
        assert!(small.approx_decoded_bytes() >= small.data.held_bytes());
        assert!(large.approx_decoded_bytes() >= large.data.held_bytes());
        assert!(large.approx_decoded_bytes() > small.approx_decoded_bytes());
    }
}
