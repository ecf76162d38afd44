//! Every valid real fixture ingests, and what comes out merged keeps the
//! input's total per sample type and its set of stacks: checked against the
//! input itself, after a block round trip, and against `go tool pprof -raw`
//! reading the exported pprof.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_engine::{
    Block, Head, IngestLimits, Label, LabelSet, MergedProfile, ProfileType, Queryable, Selector,
    TimeRange, encode_block,
};
use kiln_pprof::{DecodeLimits, Profile, decode, encode_gzip};
use kiln_testkit::fixtures::{VALID_PROFILES, shared_testdata};
use kiln_testkit::prerequisites::visible_skip;
use kiln_testkit::{go_programs, tools};

const TIME_MS: i64 = 1_700_000_000_000;

fn fixtures_dir() -> Option<PathBuf> {
    let dir = shared_testdata("profiles");
    if dir.is_none() {
        visible_skip(
            "the fixture round trips ran only on the live Go program's profiles, not on ../shared",
        );
    }
    dir
}

type Stacks = BTreeMap<Vec<String>, i64>;

/// How a frame without a function name is written.
#[derive(Clone, Copy)]
enum Naming {
    /// The engine's `libfoo.so+0x1a2b` (offset in the file).
    Engine,
    /// Just `0x1a2b`, as read back from `go tool pprof -raw`.
    Address,
}

/// The input's stacks for sample type `t`, computed straight from the pprof.
fn input_stacks(profile: &Profile, t: usize, naming: Naming) -> (Stacks, i64) {
    let mut stacks = Stacks::new();
    let mut total = 0i64;
    for sample in profile.samples() {
        let value = sample.value[t];
        if value == 0 {
            continue;
        }
        total = total.wrapping_add(value);
        let mut names = Vec::new();
        for &id in &sample.location_id {
            let location = profile.location(id).unwrap();
            let unsymbolized = || match naming {
                Naming::Address => format!("0x{:x}", location.address),
                Naming::Engine => {
                    let mapping = profile.mapping(location.mapping_id);
                    let file = mapping.map(|m| profile.string(m.filename)).unwrap_or("");
                    let base = file.rsplit('/').next().unwrap_or(file);
                    // The engine names a frame by its offset in the file when
                    // the mapping says where the file was loaded.
                    let offset = mapping
                        .filter(|m| {
                            m.memory_start <= location.address && location.address < m.memory_limit
                        })
                        .map_or(location.address, |m| {
                            location.address - m.memory_start + m.file_offset
                        });
                    // Never a bare address: a mapping without a file name
                    // is named by its build id, no mapping by `[unknown]`.
                    let build_id = mapping.map(|m| profile.string(m.build_id)).unwrap_or("");
                    let module = if !base.is_empty() {
                        base.to_owned()
                    } else if !build_id.is_empty() {
                        format!("build-id:{}", &build_id[..build_id.len().min(16)])
                    } else {
                        "[unknown]".to_owned()
                    };
                    format!("{module}+0x{offset:x}")
                }
            };
            if location.line.is_empty() {
                names.push(unsymbolized());
            }
            for line in &location.line {
                let function = profile.function(line.function_id).unwrap();
                let mut name = profile.string(function.name);
                if name.is_empty() {
                    name = profile.string(function.system_name);
                }
                names.push(if name.is_empty() {
                    unsymbolized()
                } else {
                    name.to_owned()
                });
            }
        }
        *stacks.entry(names).or_insert(0) += value;
    }
    stacks.retain(|_, v| *v != 0);
    (stacks, total)
}

fn merged_stacks(merged: &MergedProfile) -> Stacks {
    merged
        .stacks()
        .into_iter()
        .filter(|(_, v)| *v != 0)
        .collect()
}

fn everything() -> TimeRange {
    TimeRange {
        start_ms: TIME_MS - 1,
        end_ms: TIME_MS + 1,
    }
}

/// Whether Go is installed (a failure in CI); without it the go tool pprof
/// and live Go profile checks do not run.
fn go_available() -> bool {
    tools::go().is_some()
}

/// Runs `go tool pprof -raw` and parses samples into stacks of names.
fn go_pprof_stacks(path: &Path, home: &Path) -> (Stacks, i64) {
    let output = Command::new("go")
        .args(["tool", "pprof", "-raw", "-symbolize=none"])
        .arg(path)
        .env("HOME", home)
        .env("PPROF_TMPDIR", home)
        // `go tool pprof` is built into the Go build cache on first use: a
        // fresh cache under `home` would rebuild it each time (a minute).
        .env(
            "GOCACHE",
            kiln_testkit::binaries::target_dir().join("tmp/go-build-cache"),
        )
        .output()
        .expect("running go tool pprof");
    assert!(
        output.status.success(),
        "go tool pprof failed on {}: {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let line_re = regex::Regex::new(r"^(?:(.*) )?(\S*):(-?\d+) s=-?\d+(?:\(.*\))?$").unwrap();
    let loc_re = regex::Regex::new(r"^\s*(\d+): 0x([0-9a-f]+)(?: M=\d+)? ?(.*)$").unwrap();
    // `name file:line s=start[(system name)]`; an empty name reads as the address.
    let function_name = |text: &str, address: &str| {
        let name = line_re
            .captures(text)
            .map_or(text, |l| l.get(1).map_or("", |m| m.as_str()))
            .trim()
            .to_owned();
        if name.is_empty() {
            address.to_owned()
        } else {
            name
        }
    };
    let mut samples: Vec<(i64, Vec<u64>)> = Vec::new();
    let mut locations: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut section = "";
    let mut current_location = None;
    for line in text.lines() {
        match line.trim_end() {
            "Samples:" => {
                section = "samples-header";
                continue;
            }
            "Locations" => {
                section = "locations";
                continue;
            }
            "Mappings" => {
                section = "mappings";
                continue;
            }
            _ => {}
        }
        match section {
            "samples-header" => section = "samples",
            "samples" => {
                // Lines that do not start with a number are labels such as `bytes:[144]`.
                if let Some((Ok(value), ids)) = line
                    .split_once(':')
                    .map(|(values, ids)| (values.trim().parse::<i64>(), ids))
                {
                    let ids = ids.split_whitespace().map(|s| s.parse().unwrap()).collect();
                    samples.push((value, ids));
                }
            }
            "locations" => {
                if let Some(c) = loc_re.captures(line) {
                    let id: u64 = c[1].parse().unwrap();
                    let address = format!("0x{}", &c[2]);
                    let rest = c[3].trim();
                    let names = if rest.is_empty() {
                        vec![address.clone()]
                    } else {
                        vec![function_name(rest, &address)]
                    };
                    locations.insert(id, names);
                    current_location = Some((id, address));
                } else if let Some((id, address)) = &current_location {
                    let name = function_name(line.trim(), address);
                    locations.get_mut(id).unwrap().push(name);
                }
            }
            _ => {}
        }
    }
    let mut stacks = Stacks::new();
    let mut total = 0;
    for (value, ids) in samples {
        total += value;
        let names: Vec<String> = ids
            .iter()
            .flat_map(|id| {
                locations
                    .get(id)
                    .unwrap_or_else(|| panic!("location {id} missing in go pprof output:\n{text}"))
                    .clone()
            })
            .collect();
        *stacks.entry(names).or_insert(0) += value;
    }
    stacks.retain(|_, v| *v != 0);
    (stacks, total)
}

fn ingest(profile: &Profile) -> Head {
    let mut head = Head::new();
    let labels = LabelSet::new(vec![
        Label::new("__name__", "fixture"),
        Label::new("service_name", "svc"),
    ]);
    head.ingest(
        profile,
        &labels,
        TIME_MS,
        profile.duration_nanos(),
        &IngestLimits::default(),
    )
    .unwrap();
    head
}

fn merge(source: &dyn Queryable, profile_type: &ProfileType) -> MergedProfile {
    let mut merged = MergedProfile::new();
    let selector = kiln_engine::CompiledSelector::new(&Selector {
        profile_type: profile_type.clone(),
        matchers: vec![],
    })
    .unwrap();
    source
        .merge_into(&selector, everything(), &mut merged)
        .unwrap();
    merged
}

#[test]
fn every_valid_fixture_keeps_totals_and_stacks_through_head_block_and_go_pprof() {
    let Some(dir) = fixtures_dir() else { return };
    let go = go_available();
    let tmp = tempfile::tempdir().unwrap();
    for name in VALID_PROFILES {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        check_round_trip(name, &bytes, go, tmp.path());
    }
}

/// Builds `tests/programs/burner` with the Go toolchain and runs it, which
/// writes a CPU and a heap profile with `runtime/pprof`. Returns them, or
/// `None` (said so on stderr) when Go is missing outside CI.
fn go_runtime_profiles(tmp: &Path) -> Option<Vec<(String, Vec<u8>)>> {
    if !go_available() {
        return None;
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/burner/main.go");
    let binary = go_programs::build(&source, tmp, "burner")?;
    let (cpu, heap) = (tmp.join("cpu.pprof"), tmp.join("heap.pprof"));
    let run = Command::new(&binary).arg(&cpu).arg(&heap).output().unwrap();
    assert!(
        run.status.success(),
        "burner failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    Some(vec![
        (
            "go runtime/pprof cpu".to_owned(),
            std::fs::read(cpu).unwrap(),
        ),
        (
            "go runtime/pprof heap".to_owned(),
            std::fs::read(heap).unwrap(),
        ),
    ])
}

/// The same round trip on profiles a real Go runtime writes at test time, so
/// the coverage does not depend on `../shared` being checked out (issue 13).
#[test]
fn profiles_from_a_live_go_program_keep_totals_and_stacks_through_head_block_and_go_pprof() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(profiles) = go_runtime_profiles(tmp.path()) else {
        return;
    };
    for (name, bytes) in &profiles {
        check_round_trip(name, bytes, true, tmp.path());
    }
    // It really is the program's own work: its CPU frames are in the stacks.
    let cpu = decode(&profiles[0].1, &DecodeLimits::default()).unwrap();
    let head = ingest(&cpu);
    let cpu_type = head
        .profile_types(everything())
        .into_iter()
        .find(|t| t.sample_type == "cpu")
        .expect("a cpu sample type");
    let merged = merge(&head, &cpu_type);
    assert!(merged.total() > 0, "the CPU profile holds samples");
    let frames: Vec<String> = merged_stacks(&merged).into_keys().flatten().collect();
    for function in ["main.burnHash", "main.burnSort", "main.main"] {
        assert!(
            frames.iter().any(|f| f == function),
            "{function} missing from the CPU profile's stacks"
        );
    }
}

/// Ingests `bytes`, encodes and decodes a block, and checks per sample type
/// that totals and stacks equal the input's from the head, from the block,
/// and (with `go`) from `go tool pprof -raw` reading the exported pprof.
fn check_round_trip(name: &str, bytes: &[u8], go: bool, tmp: &Path) {
    let profile = decode(bytes, &DecodeLimits::default()).unwrap();
    let head = ingest(&profile);
    let (_, block_bytes) = encode_block(&head, "01TEST", "r0").unwrap();
    let block = Block::decode(&block_bytes).unwrap();
    let types = head.profile_types(everything());
    assert_eq!(types, block.profile_types(everything()), "{name}");
    for (t, sample_type) in profile.sample_types().iter().enumerate() {
        let (expected, expected_total) = input_stacks(&profile, t, Naming::Engine);
        let type_name = profile.string(sample_type.r#type);
        let Some(profile_type) = types.iter().find(|pt| pt.sample_type == type_name) else {
            assert!(
                expected.is_empty(),
                "{name}: {type_name} has values but no profile type"
            );
            continue;
        };
        let from_head = merge(&head, profile_type);
        assert_eq!(
            from_head.total(),
            expected_total,
            "{name} {type_name}: head total"
        );
        assert_eq!(
            merged_stacks(&from_head),
            expected,
            "{name} {type_name}: head stacks"
        );
        let from_block = merge(&block, profile_type);
        assert_eq!(
            from_block.total(),
            expected_total,
            "{name} {type_name}: block total"
        );
        assert_eq!(
            merged_stacks(&from_block),
            expected,
            "{name} {type_name}: block stacks"
        );

        if go {
            let exported = from_block.to_pprof(profile_type);
            let path = tmp.join(format!("{}-{t}.pb.gz", name.replace(['/', ' '], "_")));
            std::fs::write(&path, encode_gzip(&exported)).unwrap();
            let (go_stacks, go_total) = go_pprof_stacks(&path, tmp);
            let (expected, _) = input_stacks(&profile, t, Naming::Address);
            assert_eq!(
                go_total, expected_total,
                "{name} {type_name}: go pprof total"
            );
            // NB: `-raw` is line-oriented text, so names holding line breaks
            // (invalid_utf8.pb.gz has them) cannot be read back from it.
            let names_are_printable = expected
                .keys()
                .flatten()
                .all(|n| !n.contains(['\n', '\r', '\t', '\u{b}', '\u{c}']));
            if names_are_printable {
                assert_eq!(go_stacks, expected, "{name} {type_name}: go pprof stacks");
            }
        }
    }
}

#[test]
fn exported_pprof_keeps_unsymbolized_mappings_and_build_ids() {
    let Some(dir) = fixtures_dir() else { return };
    let bytes = std::fs::read(dir.join("parca/stripped-cpu.stripped.pprof")).unwrap();
    let profile = decode(&bytes, &DecodeLimits::default()).unwrap();
    assert_export_keeps_mappings_and_build_ids(&profile);
}

/// Ingests the unsymbolized `profile`, merges and exports it, and checks
/// that the export keeps every build ID and gives every location its
/// address and mapping.
fn assert_export_keeps_mappings_and_build_ids(profile: &Profile) {
    let head = ingest(profile);
    let profile_type = head.profile_types(everything()).remove(0);
    let exported = merge(&head, &profile_type).to_pprof(&profile_type);
    let reread = Profile::validate(exported, &DecodeLimits::default()).unwrap();
    let input_build_ids: Vec<&str> = profile
        .mappings()
        .iter()
        .map(|m| profile.string(m.build_id))
        .filter(|b| !b.is_empty())
        .collect();
    assert!(!input_build_ids.is_empty());
    for build_id in input_build_ids {
        assert!(
            reread
                .mappings()
                .iter()
                .any(|m| reread.string(m.build_id) == build_id),
            "build id {build_id} lost"
        );
    }
    assert!(
        reread
            .locations()
            .iter()
            .all(|l| l.address != 0 && l.mapping_id != 0)
    );
}

/// The stacks of a stripped C program as `perf` recorded them, as an eBPF
/// agent reports them: addresses in mappings with build IDs, and no
/// symbols. Kernel frames, outside the process's mappings, are left out.
fn unsymbolized_profile_from_perf(
    recording: &kiln_testkit::real_inputs::perf_recordings::PerfRecording,
) -> Profile {
    let mut builder =
        kiln_pprof::ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    let period = recording.samples.first().map_or(1, |s| s.period);
    builder
        .period("cpu", "nanoseconds", i64::try_from(period).unwrap())
        .time(TIME_MS * 1_000_000, 10_000_000_000);
    // Only the mappings that samples land in, as an agent reports them (an
    // export keeps no mapping without a location either).
    let mut mappings = BTreeMap::new();
    for sample in &recording.samples {
        let locations: Vec<u64> = sample
            .frames
            .iter()
            .filter_map(|frame| recording.resolve(frame))
            .map(|(index, address)| {
                let mapping = *mappings.entry(index).or_insert_with(|| {
                    let m = &recording.mappings[index];
                    builder.mapping(&kiln_pprof::MappingSpec {
                        memory_start: m.start,
                        memory_limit: m.start + m.len,
                        file_offset: m.file_offset,
                        filename: m.filename.clone(),
                        build_id: m.build_id.clone(),
                        has_functions: false,
                    })
                });
                builder.location(mapping, address, &[])
            })
            .collect();
        if !locations.is_empty() {
            let cpu = i64::try_from(sample.period).unwrap();
            builder.sample(&locations, &[1, cpu], &[]);
        }
    }
    Profile::validate(builder.finish(), &DecodeLimits::default()).unwrap()
}

/// Twin of `exported_pprof_keeps_unsymbolized_mappings_and_build_ids` that
/// needs no `../shared`: instead of parca's stripped Go profile, a stripped
/// C program that `perf` records now, whose build ID perf reads from the
/// file.
#[test]
fn exported_pprof_keeps_the_mappings_and_build_ids_of_a_stripped_program_recorded_now() {
    use kiln_testkit::real_inputs::perf_recordings::record_busy_c_program;
    let tmp = tempfile::tempdir().unwrap();
    let Some(recording) = record_busy_c_program(tmp.path(), true, 0.3) else {
        return;
    };
    let binary = recording.binary.display().to_string();
    assert!(
        recording
            .mappings
            .iter()
            .any(|m| m.filename == binary && !m.build_id.is_empty()),
        "perf read no build ID of {binary}: {:?}",
        recording.mappings
    );
    let profile = unsymbolized_profile_from_perf(&recording);
    assert!(profile.functions().is_empty(), "stripped: no symbols");
    assert!(!profile.samples().is_empty(), "no sample in the program");
    assert_export_keeps_mappings_and_build_ids(&profile);
}

/// Twin of `every_valid_fixture_keeps_totals_and_stacks_through_head_block_and_go_pprof`
/// that needs no `../shared`: Go profiles of every kind made now (CPU with
/// labels, inlined frames and a label that is not UTF-8; heap with four
/// types, thousands of stacks and truncated deep ones; block; mutex;
/// goroutine), and the unsymbolized stacks of a stripped program that
/// `perf` records now, through the head, a block and `go tool pprof -raw`.
#[test]
fn real_inputs_made_now_keep_totals_and_stacks_through_head_block_and_go_pprof() {
    use kiln_testkit::real_inputs::{go_profiles, perf_recordings};
    let tmp = tempfile::tempdir().unwrap();
    let Some(go) = go_profiles::write_go_profiles(tmp.path()) else {
        return;
    };
    for (name, path) in go.pprof_files() {
        check_round_trip(name, &std::fs::read(path).unwrap(), true, tmp.path());
    }
    if let Some(recording) = perf_recordings::record_busy_c_program(tmp.path(), true, 0.3) {
        let profile = unsymbolized_profile_from_perf(&recording);
        let bytes = encode_gzip(&profile.into_raw());
        check_round_trip("perf, stripped", &bytes, true, tmp.path());
    }
}
