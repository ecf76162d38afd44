//! The small valid profile that the pprof decoder's tests start from and
//! damage (`mod sample_profiles;` in each test target).

use kiln_pprof::{LabelValue, ProfileBuilder, proto};

/// A small valid profile: two stacks, one inlined frame, a string and a numeric label.
pub fn valid_profile() -> proto::Profile {
    let mut builder = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    builder
        .period("cpu", "nanoseconds", 10_000_000)
        .time(1_700_000_000_000_000_000, 10_000_000_000);
    let mapping = builder.mapping(&kiln_pprof::MappingSpec {
        memory_start: 0x1000,
        memory_limit: 0x9000,
        filename: "/bin/app".into(),
        build_id: "abc123".into(),
        ..Default::default()
    });
    let main = builder.function(&kiln_pprof::FunctionSpec {
        name: "main".into(),
        ..Default::default()
    });
    let work = builder.function(&kiln_pprof::FunctionSpec {
        name: "work".into(),
        ..Default::default()
    });
    let inlined = builder.function(&kiln_pprof::FunctionSpec {
        name: "inlined".into(),
        ..Default::default()
    });
    let main_loc = builder.location(mapping, 0x1100, &[(main, 10)]);
    let work_loc = builder.location(mapping, 0x1200, &[(inlined, 3), (work, 20)]);
    builder.sample(
        &[work_loc, main_loc],
        &[3, 30_000_000],
        &[("api", LabelValue::Str("query".into()))],
    );
    builder.sample(
        &[main_loc],
        &[1, 10_000_000],
        &[(
            "bytes",
            LabelValue::Num {
                value: 64,
                unit: "bytes".into(),
            },
        )],
    );
    builder.finish()
}
