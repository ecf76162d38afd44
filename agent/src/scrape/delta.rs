//! What is stored of a scraped pprof (pure): the sample types kept per
//! profile, and cumulative profiles turned into deltas against the previous
//! scrape of the same endpoint and profile.
//!
//! Go's `allocs`, `mutex` and `block` profiles count since the process
//! started. Stored as scraped, a range query would sum the process's whole
//! history once per scrape; stored as the difference between two scrapes
//! (as Parca and Pyroscope do), a range query means "in this range". Heap
//! `inuse_*` and goroutine counts are already gauges and are stored as
//! scraped.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use kiln_pprof::{Profile, proto};
use kiln_targets::PprofProfile;

/// Why a scraped profile cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// None of the profile's sample types is one this profile keeps (a
    /// heap profile without `inuse_*`, not a Go endpoint).
    #[error("the {profile} profile has none of the sample types {wanted} (it has {found})")]
    SampleTypes {
        /// The profile scraped.
        profile: &'static str,
        /// The prefix or names kept.
        wanted: &'static str,
        /// The sample types it had, comma-separated.
        found: String,
    },
}

impl PrepareError {
    /// A fixed metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            PrepareError::SampleTypes { .. } => "sample_types",
        }
    }
}

/// A scraped profile reduced to what is stored, with each sample's stack
/// identity (not its ids, which a process may renumber between scrapes).
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The profile, only the kept sample types left in it.
    pub profile: proto::Profile,
    /// Per sample: a hash of its frames (function, file, line; the address
    /// where a location has no lines) and its labels.
    pub stack_keys: Vec<u64>,
}

/// The sample types `profile` keeps: `heap` its `inuse_*` (a gauge; the
/// `alloc_*` it also carries are the `allocs` profile's), `allocs` its
/// `alloc_*`, the others every type.
fn keeps(profile: PprofProfile, sample_type: &str) -> bool {
    match profile {
        PprofProfile::Heap => sample_type.starts_with("inuse_"),
        PprofProfile::Allocs => sample_type.starts_with("alloc_"),
        PprofProfile::Goroutine | PprofProfile::Mutex | PprofProfile::Block => true,
    }
}

fn wanted(profile: PprofProfile) -> &'static str {
    match profile {
        PprofProfile::Heap => "inuse_*",
        PprofProfile::Allocs => "alloc_*",
        PprofProfile::Goroutine | PprofProfile::Mutex | PprofProfile::Block => "any",
    }
}

/// Keeps `kind`'s sample types of `profile` and keys its samples by stack.
pub fn prepare(kind: PprofProfile, profile: Profile) -> Result<Prepared, PrepareError> {
    let names: Vec<&str> = profile
        .sample_types()
        .iter()
        .map(|t| profile.string(t.r#type))
        .collect();
    let kept: Vec<usize> = (0..names.len())
        .filter(|&i| names.get(i).is_some_and(|name| keeps(kind, name)))
        .collect();
    if kept.is_empty() {
        return Err(PrepareError::SampleTypes {
            profile: kind.path(),
            wanted: wanted(kind),
            found: names.join(","),
        });
    }
    let stack_keys = profile
        .samples()
        .iter()
        .map(|s| stack_key(&profile, s))
        .collect();
    // The default type must stay one of the kept ones: the first kept
    // `*_space` (bytes) if any, as `go tool pprof` would pick, else the last.
    let default_name = kept
        .iter()
        .filter_map(|&i| names.get(i).copied())
        .find(|name| name.ends_with("_space"))
        .or_else(|| kept.last().and_then(|&i| names.get(i).copied()))
        .unwrap_or_default()
        .to_owned();
    let mut raw = profile.into_raw();
    if kept.len() != raw.sample_type.len() {
        raw.sample_type = kept
            .iter()
            .filter_map(|&i| raw.sample_type.get(i).copied())
            .collect();
        for sample in &mut raw.sample {
            sample.value = kept
                .iter()
                .map(|&i| sample.value.get(i).copied().unwrap_or(0))
                .collect();
        }
    }
    raw.default_sample_type = raw
        .string_table
        .iter()
        .position(|s| s.as_slice() == default_name.as_bytes())
        .and_then(|i| i64::try_from(i).ok())
        .unwrap_or(0);
    Ok(Prepared {
        profile: raw,
        stack_keys,
    })
}

/// A sample's identity across scrapes: its frames by name, file and line
/// (the address for a location without lines), then its labels sorted.
fn stack_key(profile: &Profile, sample: &proto::Sample) -> u64 {
    let mut hasher = DefaultHasher::new();
    for &id in &sample.location_id {
        let Some(location) = profile.location(id) else {
            continue;
        };
        if location.line.is_empty() {
            (0u8, location.address).hash(&mut hasher);
        }
        for line in &location.line {
            let function = profile.function(line.function_id);
            1u8.hash(&mut hasher);
            profile
                .string(function.map_or(0, |f| f.name))
                .hash(&mut hasher);
            profile
                .string(function.map_or(0, |f| f.filename))
                .hash(&mut hasher);
            line.line.hash(&mut hasher);
        }
        2u8.hash(&mut hasher);
    }
    let mut labels: Vec<(&str, &str, i64, &str)> = sample
        .label
        .iter()
        .map(|l| {
            (
                profile.string(l.key),
                profile.string(l.str),
                l.num,
                profile.string(l.num_unit),
            )
        })
        .collect();
    labels.sort_unstable();
    labels.hash(&mut hasher);
    hasher.finish()
}

/// What became of one scrape of a cumulative profile.
#[derive(Debug, Clone, PartialEq)]
pub enum DeltaOutcome {
    /// The first scrape of this endpoint and profile: only a baseline, since
    /// it counts from a process start at an unknown time.
    Baseline,
    /// What happened since the previous scrape (samples that did not change
    /// are left out).
    Delta(proto::Profile),
    /// A stack's value fell or a stack vanished, so the process restarted
    /// since the previous scrape: everything it counted happened since
    /// then, and the scrape is stored whole over that interval.
    Restarted(proto::Profile),
    /// The previous scrape could not be kept within the state budget, so no
    /// delta can be taken; this scrape is not kept either.
    OverBudget,
}

/// The previous scrape of one endpoint's profile.
#[derive(Debug)]
struct Previous {
    scraped_unix_ns: i64,
    values: HashMap<u64, Vec<i64>>,
    bytes: usize,
}

/// Bytes one kept stack costs: its key, its values, the map's overhead.
fn entry_bytes(values: usize) -> usize {
    8 + 24 + 8 * values + 16
}

/// The previous scrape of every (endpoint, cumulative profile), bounded in
/// bytes. The endpoint names the process: a pod and container, or a URL.
#[derive(Debug)]
pub struct DeltaState {
    previous: HashMap<(String, PprofProfile), Previous>,
    bytes: usize,
    budget_bytes: usize,
}

impl DeltaState {
    /// State of at most `budget_bytes`.
    pub fn new(budget_bytes: usize) -> DeltaState {
        DeltaState {
            previous: HashMap::new(),
            bytes: 0,
            budget_bytes,
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Forgets every endpoint `keep` refuses (gone pods, removed targets).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let mut freed = 0;
        self.previous.retain(|(endpoint, _), previous| {
            let kept = keep(endpoint);
            if !kept {
                freed += previous.bytes;
            }
            kept
        });
        self.bytes = self.bytes.saturating_sub(freed);
    }

    /// The delta of `scrape` (of cumulative `kind` from `endpoint`, taken at
    /// `scraped_unix_ns`) against the previous scrape, which it replaces.
    pub fn delta(
        &mut self,
        endpoint: &str,
        kind: PprofProfile,
        scrape: Prepared,
        scraped_unix_ns: i64,
    ) -> DeltaOutcome {
        let Prepared {
            profile,
            stack_keys,
        } = scrape;
        // Sum samples of equal identity; `first` keeps where each was first
        // seen, the sample written out for it.
        let mut current: HashMap<u64, Vec<i64>> = HashMap::with_capacity(stack_keys.len());
        let mut first: Vec<(u64, usize)> = Vec::new();
        for (index, (key, sample)) in stack_keys.iter().zip(&profile.sample).enumerate() {
            // Go lists buckets it has not published yet as zeros without
            // their `bytes` label, which they gain once counted: a zero
            // sample names no stack yet, and its vanishing is no restart.
            if sample.value.iter().all(|v| *v == 0) {
                continue;
            }
            match current.get_mut(key) {
                Some(sum) => {
                    for (total, value) in sum.iter_mut().zip(&sample.value) {
                        *total = total.saturating_add(*value);
                    }
                }
                None => {
                    current.insert(*key, sample.value.clone());
                    first.push((*key, index));
                }
            }
        }
        let id = (endpoint.to_owned(), kind);
        let previous = self.previous.remove(&id);
        if let Some(previous) = &previous {
            self.bytes = self.bytes.saturating_sub(previous.bytes);
        }
        let outcome = match &previous {
            None => DeltaOutcome::Baseline,
            Some(previous) => {
                let restarted = previous.values.iter().any(|(key, before)| {
                    current
                        .get(key)
                        .is_none_or(|now| now.iter().zip(before).any(|(now, before)| now < before))
                });
                let zero = Vec::new();
                let mut out = profile.clone();
                out.sample = first
                    .iter()
                    .filter_map(|&(key, index)| {
                        let now = current.get(&key)?;
                        let before = if restarted {
                            &zero
                        } else {
                            previous.values.get(&key).unwrap_or(&zero)
                        };
                        let value: Vec<i64> = now
                            .iter()
                            .enumerate()
                            .map(|(i, v)| v.saturating_sub(before.get(i).copied().unwrap_or(0)))
                            .collect();
                        if value.iter().all(|v| *v == 0) {
                            return None;
                        }
                        let mut sample = profile.sample.get(index)?.clone();
                        sample.value = value;
                        Some(sample)
                    })
                    .collect();
                out.time_nanos = previous.scraped_unix_ns;
                out.duration_nanos = scraped_unix_ns
                    .saturating_sub(previous.scraped_unix_ns)
                    .max(1);
                if restarted {
                    DeltaOutcome::Restarted(out)
                } else {
                    DeltaOutcome::Delta(out)
                }
            }
        };
        let bytes = current
            .values()
            .map(|v| entry_bytes(v.len()))
            .sum::<usize>()
            .saturating_add(endpoint.len());
        if self.bytes.saturating_add(bytes) > self.budget_bytes {
            return DeltaOutcome::OverBudget;
        }
        self.bytes += bytes;
        self.previous.insert(
            id,
            Previous {
                scraped_unix_ns,
                values: current,
                bytes,
            },
        );
        outcome
    }
}

/// A gauge as stored: stamped at the scrape, with no duration, so the store
/// files it as a point in time (a profile with a duration is a delta).
pub fn as_gauge(mut profile: proto::Profile, scraped_unix_ns: i64) -> proto::Profile {
    profile.time_nanos = scraped_unix_ns;
    profile.duration_nanos = 0;
    profile
}

#[cfg(test)]
mod tests {
    use kiln_pprof::{DecodeLimits, FunctionSpec, LabelValue, MappingSpec, ProfileBuilder};

    use super::*;

    /// A Go-like heap profile: per function, (alloc_objects, alloc_space,
    /// inuse_objects, inuse_space), with ids numbered from `id_offset` so
    /// that identity by ids would fail.
    fn heap(stacks: &[(&str, [i64; 4])], reversed: bool) -> Profile {
        let mut builder = ProfileBuilder::new(&[
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ]);
        builder.period("space", "bytes", 1).time(5, 1);
        let mapping = builder.mapping(&MappingSpec::default());
        let mut ordered: Vec<_> = stacks.to_vec();
        if reversed {
            ordered.reverse();
        }
        for (name, values) in ordered {
            let function = builder.function(&FunctionSpec {
                name: name.to_owned(),
                filename: "main.go".to_owned(),
                ..FunctionSpec::default()
            });
            let leaf = builder.location(mapping, 0, &[(function, 10)]);
            builder.sample(
                &[leaf],
                &values,
                &[(
                    "bytes",
                    LabelValue::Num {
                        value: 64,
                        unit: "bytes".to_owned(),
                    },
                )],
            );
        }
        let bytes = kiln_pprof::encode_gzip(&builder.finish());
        kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("valid")
    }

    fn names(profile: &proto::Profile) -> Vec<String> {
        profile
            .sample_type
            .iter()
            .map(|t| {
                let index = usize::try_from(t.r#type).expect("index");
                String::from_utf8_lossy(&profile.string_table[index]).into_owned()
            })
            .collect()
    }

    fn values(outcome: &DeltaOutcome) -> Vec<Vec<i64>> {
        match outcome {
            DeltaOutcome::Delta(p) | DeltaOutcome::Restarted(p) => {
                p.sample.iter().map(|s| s.value.clone()).collect()
            }
            other => panic!("no profile: {other:?}"),
        }
    }

    #[test]
    fn heap_keeps_inuse_and_allocs_keeps_alloc() {
        let stacks = [("main.grow", [4, 400, 1, 100])];
        let heap_kept = prepare(PprofProfile::Heap, heap(&stacks, false)).expect("kept");
        assert_eq!(names(&heap_kept.profile), ["inuse_objects", "inuse_space"]);
        assert_eq!(heap_kept.profile.sample[0].value, [1, 100]);
        let default = usize::try_from(heap_kept.profile.default_sample_type).expect("index");
        assert_eq!(heap_kept.profile.string_table[default], b"inuse_space");
        let allocs = prepare(PprofProfile::Allocs, heap(&stacks, false)).expect("kept");
        assert_eq!(names(&allocs.profile), ["alloc_objects", "alloc_space"]);
        assert_eq!(allocs.profile.sample[0].value, [4, 400]);
    }

    #[test]
    fn a_profile_without_the_kept_types_is_refused() {
        let mut builder = ProfileBuilder::new(&[("goroutine", "count")]);
        let mapping = builder.mapping(&MappingSpec::default());
        let leaf = builder.location(mapping, 0x10, &[]);
        builder.sample(&[leaf], &[3], &[]);
        let bytes = kiln_pprof::encode_gzip(&builder.finish());
        let profile = kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("valid");
        let error = prepare(PprofProfile::Heap, profile).expect_err("no inuse_*");
        assert_eq!(error.reason(), "sample_types");
        assert!(error.to_string().contains("goroutine"), "{error}");
    }

    #[test]
    fn the_first_scrape_is_a_baseline_then_deltas_by_stack_not_by_id() {
        let mut state = DeltaState::new(1 << 20);
        let first = prepare(
            PprofProfile::Allocs,
            heap(
                &[("main.a", [1, 100, 0, 0]), ("main.b", [2, 200, 0, 0])],
                false,
            ),
        )
        .expect("kept");
        assert_eq!(
            state.delta("pod/c", PprofProfile::Allocs, first, 1_000),
            DeltaOutcome::Baseline
        );
        // The same stacks in another order (other ids), `main.a` unchanged.
        let second = prepare(
            PprofProfile::Allocs,
            heap(
                &[("main.a", [1, 100, 0, 0]), ("main.b", [5, 500, 0, 0])],
                true,
            ),
        )
        .expect("kept");
        let outcome = state.delta("pod/c", PprofProfile::Allocs, second, 3_000);
        assert!(matches!(outcome, DeltaOutcome::Delta(_)), "{outcome:?}");
        assert_eq!(values(&outcome), [[3, 300]]);
        if let DeltaOutcome::Delta(p) = &outcome {
            assert_eq!((p.time_nanos, p.duration_nanos), (1_000, 2_000));
        }
        // Another endpoint has a baseline of its own.
        let other = prepare(
            PprofProfile::Allocs,
            heap(&[("main.a", [9, 9, 0, 0])], false),
        )
        .expect("kept");
        assert_eq!(
            state.delta("pod/d", PprofProfile::Allocs, other, 3_000),
            DeltaOutcome::Baseline
        );
    }

    #[test]
    fn a_value_that_falls_is_a_restart_and_the_scrape_is_stored_whole() {
        let mut state = DeltaState::new(1 << 20);
        let scrape = |stacks: &[(&str, [i64; 4])]| {
            prepare(PprofProfile::Allocs, heap(stacks, false)).expect("kept")
        };
        state.delta(
            "e",
            PprofProfile::Allocs,
            scrape(&[("main.a", [9, 900, 0, 0])]),
            1,
        );
        let restarted = state.delta(
            "e",
            PprofProfile::Allocs,
            scrape(&[("main.a", [2, 200, 0, 0]), ("main.b", [1, 10, 0, 0])]),
            2,
        );
        assert!(
            matches!(restarted, DeltaOutcome::Restarted(_)),
            "{restarted:?}"
        );
        assert_eq!(values(&restarted), [[2, 200], [1, 10]]);
        // A vanished stack is a restart too (cumulative stacks never go).
        let vanished = state.delta(
            "e",
            PprofProfile::Allocs,
            scrape(&[("main.b", [3, 30, 0, 0])]),
            3,
        );
        assert!(
            matches!(vanished, DeltaOutcome::Restarted(_)),
            "{vanished:?}"
        );
        // And deltas resume against the new baseline.
        let next = state.delta(
            "e",
            PprofProfile::Allocs,
            scrape(&[("main.b", [4, 40, 0, 0])]),
            4,
        );
        assert_eq!(values(&next), [[1, 10]]);
    }

    #[test]
    fn a_zero_sample_that_gains_a_label_is_no_restart() {
        let mut state = DeltaState::new(1 << 20);
        let scrape = |stacks: &[(&str, [i64; 4])]| {
            prepare(PprofProfile::Allocs, heap(stacks, false)).expect("kept")
        };
        state.delta(
            "e",
            PprofProfile::Allocs,
            scrape(&[("main.a", [1, 10, 0, 0]), ("main.later", [0, 0, 0, 0])]),
            1,
        );
        // `main.later` now counted, under another label set in Go; here it
        // is simply gone as a zero: no restart, `main.a` a plain delta.
        let next = state.delta(
            "e",
            PprofProfile::Allocs,
            scrape(&[("main.a", [2, 20, 0, 0])]),
            2,
        );
        assert!(matches!(next, DeltaOutcome::Delta(_)), "{next:?}");
        assert_eq!(values(&next), [[1, 10]]);
    }

    #[test]
    fn state_stays_within_its_budget_and_forgets_gone_endpoints() {
        let one = || {
            prepare(
                PprofProfile::Allocs,
                heap(&[("main.a", [1, 1, 0, 0])], false),
            )
        };
        let mut state = DeltaState::new(200);
        state.delta("a", PprofProfile::Allocs, one().expect("kept"), 1);
        let held = state.bytes();
        assert!(held > 0 && held <= 200, "{held}");
        let many: Vec<(String, [i64; 4])> = (0..10)
            .map(|i| (format!("main.f{i}"), [1, 1, 0, 0]))
            .collect();
        let many: Vec<(&str, [i64; 4])> = many.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        let big = prepare(PprofProfile::Allocs, heap(&many, false)).expect("kept");
        assert_eq!(
            state.delta("b", PprofProfile::Allocs, big, 1),
            DeltaOutcome::OverBudget
        );
        assert_eq!(state.bytes(), held);
        state.retain(|endpoint| endpoint != "a");
        assert_eq!(state.bytes(), 0);
        assert_eq!(
            state.delta("a", PprofProfile::Allocs, one().expect("kept"), 2),
            DeltaOutcome::Baseline
        );
    }

    #[test]
    fn a_gauge_has_no_duration() {
        let kept =
            prepare(PprofProfile::Heap, heap(&[("main.a", [1, 1, 1, 1])], false)).expect("kept");
        let gauge = as_gauge(kept.profile, 42);
        assert_eq!((gauge.time_nanos, gauge.duration_nanos), (42, 0));
    }
}
