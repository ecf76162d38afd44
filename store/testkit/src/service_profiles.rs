//! Large CPU profiles shaped like a Go service's: deep stacks over many
//! functions in many packages, so that a run of them fills memory and
//! spills as real traffic does. The store's memory and crash tests send
//! them; each picks the shape that fits its budget.

use kiln_pprof::{FunctionSpec, MappingSpec, ProfileBuilder, encode_gzip};

/// How [`service_profile`] draws its stacks.
#[derive(Debug, Clone, Copy)]
pub struct ServiceShape {
    /// Distinct build ids the profiles' mapping cycles through.
    pub build_ids: usize,
    /// Shallowest stack.
    pub min_depth: usize,
    /// Stacks are `min_depth` to `min_depth + depth_spread - 1` deep.
    pub depth_spread: usize,
    /// Distinct functions drawn from.
    pub functions: usize,
    /// Distinct packages the functions belong to.
    pub packages: usize,
    /// What goes between package and function name: `""` for
    /// `pkg3.step42`, `"(*Worker)."` for `pkg3.(*Worker).step42`.
    pub receiver: &'static str,
    /// The source file's name in each package's folder.
    pub file: &'static str,
}

/// A CPU profile of `stacks` distinct stacks drawn from `seed` in `shape`;
/// returns it gzipped and its cpu total in nanoseconds.
pub fn service_profile(shape: &ServiceShape, seed: usize, stacks: usize) -> (Vec<u8>, i64) {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    b.time(0, 10_000_000_000);
    let mapping = b.mapping(&MappingSpec {
        memory_start: 0x400000,
        memory_limit: 0x4000000,
        filename: "/usr/bin/service".into(),
        build_id: format!("build-{}", seed % shape.build_ids),
        has_functions: true,
        ..MappingSpec::default()
    });
    let mut total = 0;
    for s in 0..stacks {
        let depth = shape.min_depth + (s * 7 + seed) % shape.depth_spread;
        let mut frames = Vec::with_capacity(depth);
        for d in 0..depth {
            let f = (s * 31 + d * 17 + seed * 13) % shape.functions;
            let package = f % shape.packages;
            let function = b.function(&FunctionSpec {
                name: format!("pkg{package}.{}step{f}", shape.receiver),
                system_name: String::new(),
                filename: format!("/src/pkg{package}/{}", shape.file),
                start_line: f as i64,
            });
            frames.push(b.location(
                mapping,
                0x400000 + f as u64 * 64,
                &[(function, d as i64 + 1)],
            ));
        }
        let value = 10_000_000 * (1 + (s + seed) as i64 % 5);
        b.sample(&frames, &[value / 10_000_000, value], &[]);
        total += value;
    }
    (encode_gzip(&b.finish()), total)
}
