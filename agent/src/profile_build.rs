//! Building one pprof per target and window from symbolized samples (pure).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use kiln_contract::labels as label;
use kiln_contract::sample_labels::{COMM, PID, TID};
use kiln_pprof::proto;
use kiln_pprof::{FunctionSpec, LabelValue, MappingSpec, ProfileBuilder};

use crate::symbolize::{Frame, FrameMapping};

/// The `__name__` of the agent's profiles. `process_cpu` is what Pyroscope
/// and Grafana call on-CPU profiles of processes, so their UIs recognise the
/// series, and Parca accepts any name.
pub const PROFILE_NAME: &str = "process_cpu";

/// The `__name__` of the agent's off-CPU profiles (time threads spent
/// blocked, weighed at their wakeup): a profile type of its own, so that it
/// is never merged with CPU time.
pub const OFF_CPU_PROFILE_NAME: &str = "off_cpu";

/// Name given to a sample whose user and kernel stacks were both lost.
pub const LOST_STACK_FUNCTION: &str = "[lost stack]";

/// One stack with its count and process, frames leaf first (kernel frames,
/// then user frames).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedSample {
    /// Process id.
    pub pid: u32,
    /// Thread id, or 0 when not recorded.
    pub tid: u32,
    /// Process name.
    pub comm: String,
    /// The process's runtime (`language` label: python, java, node, native).
    pub language: &'static str,
    /// Frames, leaf first.
    pub frames: Vec<Frame>,
    /// Number of samples (CPU) or captured blocks (off-CPU).
    pub count: u64,
    /// Off-CPU time the blocks stand for, ns (0 in CPU profiles).
    pub off_cpu_ns: u64,
}

/// What every profile of a window shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowMeta {
    /// Sampling period in ns of CPU time per sample (1e9 / Hz, times any
    /// per-target subsampling).
    pub period_ns: i64,
    /// Window start, ns since the Unix epoch.
    pub start_unix_ns: i64,
    /// Window length, ns.
    pub duration_ns: i64,
    /// Node name, set as the `node` label.
    pub node: String,
    /// Whether samples carry a `tid` label.
    pub record_tid: bool,
}

/// The sampling period in ns for a frequency and a subsampling divisor.
pub fn period_ns(frequency_hz: u32, keep_one_in: u32) -> i64 {
    let base = 1_000_000_000 / i64::from(frequency_hz.max(1));
    base.saturating_mul(i64::from(keep_one_in.max(1)))
}

/// Builds the pprof of one target for one window: sample types
/// `samples/count` and `cpu/nanoseconds`, period `cpu/nanoseconds`, labels
/// `comm`, `pid`, `node`, `language` (and `tid` when recorded) on every sample.
pub fn build_profile(meta: &WindowMeta, samples: &[ResolvedSample]) -> proto::Profile {
    let mut builder = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    builder
        .period("cpu", "nanoseconds", meta.period_ns)
        .time(meta.start_unix_ns, meta.duration_ns)
        .default_sample_type("cpu");
    add_samples(builder, meta, samples, |sample| {
        let count = i64::try_from(sample.count).unwrap_or(i64::MAX);
        [count, count.saturating_mul(meta.period_ns)]
    })
}

/// Builds the off-CPU pprof of one target for one window: sample types
/// `blocks/count` (captured blocks) and `off_cpu/nanoseconds` (the time they
/// stand for: each block's length times the one-in-N it was chosen by),
/// period `off_cpu/nanoseconds` 1, the same labels as [`build_profile`].
pub fn build_off_cpu_profile(meta: &WindowMeta, samples: &[ResolvedSample]) -> proto::Profile {
    let mut builder = ProfileBuilder::new(&[("blocks", "count"), ("off_cpu", "nanoseconds")]);
    builder
        .period("off_cpu", "nanoseconds", 1)
        .time(meta.start_unix_ns, meta.duration_ns)
        .default_sample_type("off_cpu");
    add_samples(builder, meta, samples, |sample| {
        [
            i64::try_from(sample.count).unwrap_or(i64::MAX),
            i64::try_from(sample.off_cpu_ns).unwrap_or(i64::MAX),
        ]
    })
}

/// Adds every sample, with `values` as its two values, and finishes.
fn add_samples(
    mut builder: ProfileBuilder,
    meta: &WindowMeta,
    samples: &[ResolvedSample],
    values: impl Fn(&ResolvedSample) -> [i64; 2],
) -> proto::Profile {
    // A mapping says it has functions when any of its frames got a name.
    let symbolized_mappings: HashSet<*const FrameMapping> = samples
        .iter()
        .flat_map(|s| &s.frames)
        .filter(|f| f.function.is_some())
        .filter_map(|f| f.mapping.as_ref().map(Arc::as_ptr))
        .collect();
    let mut mapping_ids: BTreeMap<*const FrameMapping, u64> = BTreeMap::new();
    let mut location_ids = Vec::new();
    for sample in samples {
        location_ids.clear();
        for frame in &sample.frames {
            let mapping_id = match &frame.mapping {
                Some(mapping) => *mapping_ids.entry(Arc::as_ptr(mapping)).or_insert_with(|| {
                    builder.mapping(&MappingSpec {
                        memory_start: mapping.start,
                        memory_limit: mapping.end,
                        file_offset: mapping.file_offset,
                        filename: mapping.name.clone(),
                        build_id: mapping.build_id.clone(),
                        has_functions: symbolized_mappings.contains(&Arc::as_ptr(mapping)),
                    })
                }),
                None => 0,
            };
            let lines: Vec<(u64, i64)> = frame
                .function
                .iter()
                .map(|name| {
                    let id = builder.function(&FunctionSpec {
                        name: name.to_string(),
                        system_name: name.to_string(),
                        filename: frame.file.as_deref().unwrap_or_default().to_owned(),
                        ..FunctionSpec::default()
                    });
                    (id, i64::from(frame.line))
                })
                .collect();
            location_ids.push(builder.location(mapping_id, frame.address, &lines));
        }
        if location_ids.is_empty() {
            let id = builder.function(&FunctionSpec {
                name: LOST_STACK_FUNCTION.to_owned(),
                system_name: LOST_STACK_FUNCTION.to_owned(),
                ..FunctionSpec::default()
            });
            location_ids.push(builder.location(0, 0, &[(id, 0)]));
        }
        // `comm`, `pid` and `tid` stay per sample in the store (they are
        // named in `kiln_contract::sample_labels`). `node` and `language`
        // repeat series labels, which the store drops as redundant, but a
        // file written by `--output-dir` is the pprof alone and they are its
        // only record; a process whose runtime is not the group's busiest
        // keeps its own `language` (as `exported_language` in the store).
        let mut labels = vec![
            (COMM, LabelValue::Str(sample.comm.clone())),
            (PID, LabelValue::Str(sample.pid.to_string())),
            (label::NODE, LabelValue::Str(meta.node.clone())),
            (label::LANGUAGE, LabelValue::Str(sample.language.to_owned())),
        ];
        if meta.record_tid {
            labels.push((TID, LabelValue::Str(sample.tid.to_string())));
        }
        builder.sample(&location_ids, &values(sample), &labels);
    }
    builder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> WindowMeta {
        WindowMeta {
            period_ns: period_ns(19, 1),
            start_unix_ns: 1_700_000_000_000_000_000,
            duration_ns: 10_000_000_000,
            node: "node-a".into(),
            record_tid: false,
        }
    }

    fn mapping(name: &str) -> Arc<FrameMapping> {
        Arc::new(FrameMapping {
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
            name: name.into(),
            build_id: "abcd".into(),
        })
    }

    #[test]
    fn profile_is_valid_with_both_sample_types_and_values_from_the_period() {
        let exe = mapping("/bin/hot");
        let frame = |address, name: Option<&str>| Frame {
            address,
            mapping: Some(Arc::clone(&exe)),
            function: name.map(Arc::from),
            file: None,
            line: 0,
        };
        let samples = vec![
            ResolvedSample {
                pid: 7,
                tid: 0,
                comm: "hot".into(),
                language: "native",
                frames: vec![frame(0x1010, Some("hot_a")), frame(0x1100, Some("main"))],
                count: 3,
                off_cpu_ns: 0,
            },
            ResolvedSample {
                pid: 7,
                tid: 0,
                comm: "hot".into(),
                language: "native",
                frames: vec![frame(0x1500, None)],
                count: 1,
                off_cpu_ns: 0,
            },
        ];
        let profile = build_profile(&meta(), &samples);
        let bytes = kiln_pprof::encode_gzip(&profile);
        let decoded = kiln_pprof::decode(&bytes, &kiln_pprof::DecodeLimits::default())
            .expect("the built profile is valid");
        let _ = decoded;
        assert_eq!(profile.sample.len(), 2);
        assert_eq!(profile.sample[0].value, vec![3, 3 * 52_631_578]);
        assert_eq!(profile.mapping.len(), 1);
        assert!(profile.mapping[0].has_functions);
        let build_id = &profile.string_table[profile.mapping[0].build_id as usize];
        assert_eq!(build_id, b"abcd");
        let unsymbolized = profile
            .location
            .iter()
            .find(|l| l.address == 0x1500)
            .expect("unsymbolized frame kept");
        assert!(unsymbolized.line.is_empty());
        assert_eq!(unsymbolized.mapping_id, 1);
        let label_keys: Vec<&[u8]> = profile.sample[0]
            .label
            .iter()
            .map(|l| profile.string_table[l.key as usize].as_slice())
            .collect();
        for key in [&b"comm"[..], b"pid", b"node", b"language"] {
            assert!(label_keys.contains(&key));
        }
        assert!(!label_keys.contains(&&b"tid"[..]));
    }

    #[test]
    fn a_sample_without_frames_gets_a_lost_stack_location() {
        let samples = vec![ResolvedSample {
            pid: 1,
            tid: 9,
            comm: "x".into(),
            language: "native",
            frames: vec![],
            count: 2,
            off_cpu_ns: 0,
        }];
        let mut with_tid = meta();
        with_tid.record_tid = true;
        let profile = build_profile(&with_tid, &samples);
        assert_eq!(profile.location.len(), 1);
        let name = profile.function[0].name as usize;
        assert_eq!(profile.string_table[name], LOST_STACK_FUNCTION.as_bytes());
        assert_eq!(
            profile.sample[0].label.len(),
            5,
            "comm, pid, node, language, tid"
        );
    }

    #[test]
    fn off_cpu_profile_carries_blocks_and_their_time_under_its_own_types() {
        let samples = vec![ResolvedSample {
            pid: 3,
            tid: 0,
            comm: "sleepy".into(),
            language: "native",
            frames: vec![],
            count: 4,
            off_cpu_ns: 40_000_000,
        }];
        let profile = build_off_cpu_profile(&meta(), &samples);
        let bytes = kiln_pprof::encode_gzip(&profile);
        let decoded = kiln_pprof::decode(&bytes, &kiln_pprof::DecodeLimits::default())
            .expect("the built profile is valid");
        let types: Vec<(&str, &str)> = decoded
            .sample_types()
            .iter()
            .map(|t| (decoded.string(t.r#type), decoded.string(t.unit)))
            .collect();
        assert_eq!(types, vec![("blocks", "count"), ("off_cpu", "nanoseconds")]);
        assert_eq!(profile.sample[0].value, vec![4, 40_000_000]);
    }

    #[test]
    fn period_scales_with_subsampling() {
        assert_eq!(period_ns(100, 1), 10_000_000);
        assert_eq!(period_ns(100, 5), 50_000_000);
        assert_eq!(period_ns(0, 0), 1_000_000_000);
    }
}
