//! The workload's profiles: the real fixtures' stacks, resolved to frames,
//! and 10 s profiles redrawn from them with deterministic randomness.

use std::collections::HashMap;
use std::path::Path;

use kiln_pprof::{DecodeLimits, FunctionSpec, MappingSpec, ProfileBuilder, encode_gzip};

/// splitmix64: deterministic, dependency-free randomness for the workload.
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A frame as resolved from a fixture: (mapping index, address, lines).
#[derive(Clone)]
pub(crate) struct Frame {
    mapping: Option<MappingSpec>,
    address: u64,
    lines: Vec<(FunctionSpec, i64)>,
}

/// All stacks of one fixture, resolved to frames, leaf first.
pub(crate) fn fixture_stacks(path: &Path) -> Vec<Vec<Frame>> {
    let bytes = std::fs::read(path).expect("read fixture");
    let profile = kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("fixture decodes");
    let mut stacks = Vec::new();
    for sample in profile.samples() {
        let mut frames = Vec::new();
        for &loc_id in &sample.location_id {
            let Some(loc) = profile.location(loc_id) else {
                continue;
            };
            let mapping = profile.mapping(loc.mapping_id).map(|m| MappingSpec {
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                filename: profile.string(m.filename).to_string(),
                build_id: profile.string(m.build_id).to_string(),
                has_functions: m.has_functions,
            });
            let lines = loc
                .line
                .iter()
                .filter_map(|line| {
                    let f = profile.function(line.function_id)?;
                    Some((
                        FunctionSpec {
                            name: profile.string(f.name).to_string(),
                            system_name: profile.string(f.system_name).to_string(),
                            filename: profile.string(f.filename).to_string(),
                            start_line: f.start_line,
                        },
                        line.line,
                    ))
                })
                .collect();
            frames.push(Frame {
                mapping,
                address: loc.address,
                lines,
            });
        }
        if !frames.is_empty() {
            stacks.push(frames);
        }
    }
    stacks
}

/// A 10 s CPU profile drawing `samples` stacks from `stacks`.
pub(crate) fn reshape(stacks: &[Vec<Frame>], samples: usize, rng: &mut Rng) -> Vec<u8> {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    b.time(0, 10_000_000_000);
    let mut mapping_ids: HashMap<MappingSpec, u64> = HashMap::new();
    for _ in 0..samples {
        let stack = &stacks[rng.below(stacks.len())];
        let mut locations = Vec::with_capacity(stack.len());
        for frame in stack {
            let mapping_id = match &frame.mapping {
                Some(spec) => *mapping_ids
                    .entry(spec.clone())
                    .or_insert_with(|| b.mapping(spec)),
                None => 0,
            };
            let lines: Vec<(u64, i64)> = frame
                .lines
                .iter()
                .map(|(f, line)| (b.function(f), *line))
                .collect();
            locations.push(b.location(mapping_id, frame.address, &lines));
        }
        let count = 1 + rng.below(5) as i64;
        b.sample(&locations, &[count, count * 10_000_000], &[]);
    }
    encode_gzip(&b.finish())
}
