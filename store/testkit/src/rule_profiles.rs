//! A CPU profile whose parts a recording rule must find exactly: three
//! stacks, one through `fn_3_a` (30 ms), one elsewhere (50 ms) and one
//! through both `fn_3_b` and `fn_3_c` (20 ms), which a rule on `fn_3_.*`
//! counts once, not twice.

use kiln_pprof::{FunctionSpec, ProfileBuilder};

/// The profile and what a rule should record of it.
#[derive(Debug, Clone)]
pub struct RuleProfile {
    /// The gzipped pprof.
    pub pprof: Vec<u8>,
    /// All its CPU time, ns.
    pub total: i64,
    /// The CPU time of the samples with an `fn_3_*` frame, ns.
    pub fn3: i64,
}

/// The profile described in the module docs, a 10 s CPU profile.
pub fn three_stack_cpu_profile() -> RuleProfile {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder.period("cpu", "nanoseconds", 10_000_000);
    builder.time(0, 10_000_000_000);
    let mut frame = |name: &str| {
        let function = builder.function(&FunctionSpec {
            name: name.to_owned(),
            ..FunctionSpec::default()
        });
        builder.location(0, 0x1000 + function * 16, &[(function, 1)])
    };
    let (main, work, a, other, b, c) = (
        frame("main"),
        frame("work"),
        frame("fn_3_a"),
        frame("other"),
        frame("fn_3_b"),
        frame("fn_3_c"),
    );
    builder.sample(&[a, work, main], &[30_000_000], &[]);
    builder.sample(&[other, main], &[50_000_000], &[]);
    builder.sample(&[c, b, main], &[20_000_000], &[]);
    RuleProfile {
        pprof: kiln_pprof::encode_gzip(&builder.finish()),
        total: 100_000_000,
        fn3: 50_000_000,
    }
}
