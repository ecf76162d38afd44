//! Synthetic pprof profiles with known totals, and the small `Store`
//! helpers the storage tests share: a config without background loops, a
//! local bucket, selectors and ingest requests for one pod.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kiln_engine::model::{Label, LabelSet, MatchOp, Matcher, ProfileType, Selector, TimeRange};
use kiln_pprof::{FunctionSpec, MappingSpec, ProfileBuilder, encode_gzip};
use kiln_storage::{BucketConfig, IngestRequest, Store, StoreConfig};

/// 2023-11-14T22:13:20Z, a fixed base time for simulated data.
pub const BASE_MS: i64 = 1_700_000_000_000;
/// A minute ago, for tests where background retention runs on the real clock.
pub fn recent_ms() -> i64 {
    crate::clock::now_ms() - 60_000
}

pub const DURATION_NANOS: i64 = 10_000_000_000;

/// A CPU profile whose samples are `seed`-dependent stacks; returns the
/// gzipped bytes and the total value.
pub fn cpu_profile(seed: u64, samples: usize) -> (Vec<u8>, i64) {
    let mut builder = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    builder.period("cpu", "nanoseconds", 10_000_000);
    builder.time(0, DURATION_NANOS);
    let mapping = builder.mapping(&MappingSpec {
        memory_start: 0x400000,
        memory_limit: 0x800000,
        filename: "/usr/bin/app".into(),
        build_id: "abc123".into(),
        has_functions: true,
        ..MappingSpec::default()
    });
    let mut total = 0;
    for i in 0..samples {
        let depth = 3 + (i % 5);
        let mut stack = Vec::with_capacity(depth);
        for d in 0..depth {
            let f = builder.function(&FunctionSpec {
                name: format!("fn_{}_{}", (seed as usize + i) % 17, d),
                system_name: String::new(),
                filename: "main.go".into(),
                start_line: 1,
            });
            let loc = builder.location(mapping, 0x400000 + (f * 16), &[(f, d as i64 + 1)]);
            stack.push(loc);
        }
        let value = 10_000_000 * (1 + (seed as i64 + i as i64) % 7);
        builder.sample(&stack, &[value / 10_000_000, value], &[]);
        total += value;
    }
    (encode_gzip(&builder.finish()), total)
}

pub fn cpu_type() -> ProfileType {
    ProfileType {
        name: "process_cpu".into(),
        sample_type: "cpu".into(),
        sample_unit: "nanoseconds".into(),
        period_type: "cpu".into(),
        period_unit: "nanoseconds".into(),
        delta: true,
    }
}

pub fn labels(pod: &str) -> LabelSet {
    LabelSet::new(vec![
        Label::new("__name__", "process_cpu"),
        Label::new("namespace", "shop"),
        Label::new("pod", pod),
    ])
}

pub fn request(pod: &str, time_ms: i64, pprof: Vec<u8>) -> IngestRequest {
    IngestRequest {
        labels: labels(pod),
        time_ms: Some(time_ms),
        duration_nanos: Some(DURATION_NANOS),
        pprof: pprof.into(),
        writer: Default::default(),
    }
}

pub fn pod_selector(pod: &str) -> Selector {
    Selector {
        profile_type: cpu_type(),
        matchers: vec![Matcher {
            name: "pod".into(),
            op: MatchOp::Equal,
            value: pod.into(),
        }],
    }
}

pub fn all_selector() -> Selector {
    Selector {
        profile_type: cpu_type(),
        matchers: vec![],
    }
}

pub fn everything() -> TimeRange {
    TimeRange {
        start_ms: 0,
        end_ms: i64::MAX,
    }
}

/// A config for tests: no background loops unless asked.
pub fn config(data_dir: &Path, replica: &str) -> StoreConfig {
    let mut config = StoreConfig::new(data_dir, replica);
    config.background = false;
    // The fixtures use fixed 2023 timestamps (BASE_MS).
    config.accepted_times = kiln_storage::AcceptedTimes::Any;
    config.compaction_settle = Duration::from_secs(60);
    config
}

pub fn local_bucket(dir: &Path) -> Arc<dyn object_store::ObjectStore> {
    BucketConfig::Local {
        dir: dir.to_path_buf(),
    }
    .build()
    .expect("local bucket")
}

pub async fn open_local(root: &Path) -> Store {
    Store::open(
        config(&root.join("data"), "r1"),
        local_bucket(&root.join("bucket")),
    )
    .await
    .expect("open store")
}

pub async fn total(store: &Store, selector: &Selector, range: TimeRange) -> i64 {
    store.merge(selector, range).await.expect("merge").total()
}
