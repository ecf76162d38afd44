//! Real profiles decode, validate and survive a re-encode with their totals:
//! ones a live Go program writes with `runtime/pprof` at test time (so the
//! coverage needs nothing outside the repository), and, where
//! `../shared/testdata/profiles` is checked out, every fixture there, which
//! either decodes or is refused with a clear error as SOURCES.md says.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_pprof::folded::{FoldedSpec, folded_to_profile};
use kiln_pprof::{DecodeLimits, PprofError, Profile, decode, encode_gzip, validate_message};
use kiln_testkit::fixtures::{VALID_PROFILES, shared_testdata};
use kiln_testkit::go_programs;
use kiln_testkit::prerequisites::visible_skip;

fn fixtures_dir() -> Option<PathBuf> {
    let dir = shared_testdata("profiles");
    if dir.is_none() {
        visible_skip("the real-profile checks ran only on the live Go program's profiles");
    }
    dir
}

/// The sum of each sample type's values, in the profile's order.
fn totals(profile: &Profile) -> Vec<i64> {
    let mut totals = vec![0i64; profile.sample_types().len()];
    for sample in profile.samples() {
        for (total, value) in totals.iter_mut().zip(&sample.value) {
            *total = total.wrapping_add(*value);
        }
    }
    totals
}

/// Decodes `bytes`, checks the result holds samples, passes the in-memory
/// validation unchanged, and that its encoding decodes to the same message
/// with the same totals. Returns the decoded profile for further checks.
fn check_real_profile(name: &str, bytes: &[u8]) -> Profile {
    let limits = DecodeLimits::default();
    let profile = decode(bytes, &limits).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(!profile.sample_types().is_empty(), "{name}");
    assert!(!profile.samples().is_empty(), "{name}");
    // The whole message, string table included, as validation left it.
    let message = profile.clone().into_raw();
    let (revalidated, _) = validate_message(message.clone(), &limits)
        .unwrap_or_else(|e| panic!("{name}: validating the decoded message again: {e}"));
    assert!(
        revalidated.into_raw() == message,
        "{name}: validation is stable"
    );
    let again = decode(&encode_gzip(&message), &limits)
        .unwrap_or_else(|e| panic!("{name}: decoding its re-encoding: {e}"));
    assert!(
        again.clone().into_raw() == message,
        "{name}: re-encode round trip"
    );
    assert_eq!(totals(&again), totals(&profile), "{name}: totals");
    profile
}

#[test]
fn every_valid_fixture_decodes_validates_and_round_trips() {
    let Some(dir) = fixtures_dir() else { return };
    for name in VALID_PROFILES {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        check_real_profile(name, &bytes);
    }
}

#[test]
fn legacy_and_foreign_formats_are_refused_as_not_protobuf() {
    let Some(dir) = fixtures_dir() else { return };
    for name in [
        "google-pprof/cppbench.cpu.legacy",
        "grafana-pyroscope/dump2.jfr.gz",
    ] {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let error = decode(&bytes, &DecodeLimits::default()).unwrap_err();
        assert!(
            matches!(error, PprofError::Protobuf { .. }),
            "{name}: {error}"
        );
    }
}

/// Builds `tests/programs/profiled` with the Go toolchain into `tmp`, or
/// returns `None` (said so on stderr) when Go is missing outside CI.
fn build_go_program(tmp: &Path) -> Option<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/profiled/main.go");
    go_programs::build(&source, tmp, "profiled")
}

/// Builds and runs the Go program, which writes CPU, heap and goroutine
/// profiles with `runtime/pprof` into `tmp`. `false` when Go is missing.
fn write_go_runtime_profiles(tmp: &Path) -> bool {
    let Some(binary) = build_go_program(tmp) else {
        return false;
    };
    let run = Command::new(&binary).arg(tmp).output().unwrap();
    assert!(
        run.status.success(),
        "the profiled program failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    true
}

/// Every function name on the stacks of samples matching `keep`.
fn functions_on_stacks(
    profile: &Profile,
    keep: impl Fn(&kiln_pprof::proto::Sample) -> bool,
) -> Vec<&str> {
    let mut names = Vec::new();
    for sample in profile.samples().iter().filter(|s| keep(s)) {
        for &id in &sample.location_id {
            for line in &profile.location(id).unwrap().line {
                names.push(profile.string(profile.function(line.function_id).unwrap().name));
            }
        }
    }
    names
}

/// The same checks on profiles a real Go runtime writes at test time, so the
/// coverage does not depend on `../shared` being checked out (issue 13).
#[test]
fn profiles_from_a_live_go_program_decode_validate_and_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    if !write_go_runtime_profiles(tmp.path()) {
        return;
    }
    let read = |name: &str| std::fs::read(tmp.path().join(name)).unwrap();

    let cpu = check_real_profile("go cpu", &read("cpu.pprof"));
    let types: Vec<(&str, &str)> = cpu
        .sample_types()
        .iter()
        .map(|t| (cpu.string(t.r#type), cpu.string(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    // Go writes each sample's CPU time as its count times the period.
    for sample in cpu.samples() {
        assert_eq!(
            sample.value[1],
            sample.value[0] * cpu.period(),
            "{sample:?}"
        );
    }
    let all = functions_on_stacks(&cpu, |_| true);
    for function in ["main.spinHash", "main.sortFresh", "main.main"] {
        assert!(
            all.contains(&function),
            "{function} missing from the CPU stacks"
        );
    }
    // The label set with pprof.Do is decoded on the labelled work's samples.
    let labelled = functions_on_stacks(&cpu, |s| {
        s.label
            .iter()
            .any(|l| cpu.string(l.key) == "phase" && cpu.string(l.str) == "hash")
    });
    assert!(
        labelled.contains(&"main.spinHash"),
        "labelled samples: {labelled:?}"
    );
    assert!(
        !labelled.contains(&"main.sortFresh"),
        "labelled samples: {labelled:?}"
    );

    let heap = check_real_profile("go heap", &read("heap.pprof"));
    let heap_types: Vec<&str> = heap
        .sample_types()
        .iter()
        .map(|t| heap.string(t.r#type))
        .collect();
    assert_eq!(
        heap_types,
        [
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space"
        ]
    );
    assert!(totals(&heap)[1] > 0, "the heap profile holds allocations");
    assert!(functions_on_stacks(&heap, |_| true).contains(&"main.sortFresh"));

    let goroutine = check_real_profile("go goroutine", &read("goroutine.pprof"));
    assert!(totals(&goroutine)[0] >= 1, "at least the writing goroutine");
    assert!(functions_on_stacks(&goroutine, |_| true).contains(&"main.main"));
}

/// The sum of the trailing counts of folded text, read without kiln-pprof.
fn folded_count_sum(text: &str) -> i64 {
    text.lines()
        .filter_map(|line| line.rsplit_once(' '))
        .map(|(_, count)| count.trim().parse::<i64>().unwrap())
        .sum()
}

/// profile-bee, an eBPF profiler (installed by `./kiln-dev test`), samples
/// the Go program from outside and writes pprof and folded stacks: a second
/// real producer, with frames from the kernel's view of the process.
#[test]
fn profile_bee_output_of_the_go_program_decodes_and_folds_with_its_totals() {
    let tools = std::env::var("KILN_TOOLS_DIR").unwrap_or_else(|_| "/var/tmp/kiln-tools".into());
    let probee = PathBuf::from(tools).join("profile-bee/bin/probee");
    if !probee.is_file() {
        assert!(
            std::env::var("CI").is_err(),
            "{} is required in CI: ./kiln-dev test installs it",
            probee.display()
        );
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {} is absent; no eBPF-sampled profile was checked",
            probee.display()
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(binary) = build_go_program(tmp.path()) else {
        return;
    };
    let (pprof_path, folded_path) = (tmp.path().join("bee.pb.gz"), tmp.path().join("bee.folded"));
    let run = Command::new(&probee)
        .arg("-o")
        .arg(&pprof_path)
        .arg("-o")
        .arg(&folded_path)
        .args(["-f", "499", "-t", "60000", "--"])
        .arg(&binary)
        .arg(tmp.path())
        .output()
        .unwrap();
    if !run.status.success() {
        // eBPF needs root (or CAP_BPF and CAP_PERFMON); ./kiln-dev test runs as root.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: profile-bee could not profile here ({}): {}",
            run.status,
            String::from_utf8_lossy(&run.stderr)
        );
        return;
    }

    let bee = check_real_profile("profile-bee pprof", &std::fs::read(&pprof_path).unwrap());
    let folded = std::fs::read_to_string(&folded_path).unwrap();
    let expected = folded_count_sum(&folded);
    assert!(expected > 0, "profile-bee sampled nothing: {folded}");
    // NB: profile-bee's unwinder sometimes writes a stack of 1,000+
    // `[unknown]` frames, past the default depth limit; all of it is kept here.
    let spec = FoldedSpec {
        max_depth: 1 << 20,
        ..FoldedSpec::default()
    };
    let (message, stats) = folded_to_profile(folded.as_bytes(), &spec)
        .unwrap_or_else(|e| panic!("profile-bee folded: {e}"));
    assert_eq!(stats.total_count, expected);
    let (from_folded, _) = validate_message(message, &DecodeLimits::default()).unwrap();
    assert_eq!(totals(&from_folded), [expected]);
    // Both outputs are the same samples, so they agree on the count.
    assert_eq!(totals(&bee)[0], expected, "pprof and folded sample counts");
    // profile-bee roots each stack at the sampled process's name. (Its Go
    // frames are mostly `[unknown]`, so no function name is asserted.)
    for line in folded.lines() {
        assert!(
            line.starts_with("profiled;") || line.starts_with("profiled "),
            "a stack from another process: {line}"
        );
    }
}

/// The deepest stack of `profile`, in locations.
fn max_depth(profile: &Profile) -> usize {
    profile
        .samples()
        .iter()
        .map(|s| s.location_id.len())
        .max()
        .unwrap_or(0)
}

/// Twin of `every_valid_fixture_decodes_validates_and_round_trips` that
/// needs no `../shared`: the traits those fixtures bring come from profiles
/// a Go program writes now. Inlined frames (sample.cpu), labels
/// (labels, go.cpu.labels), a label that is not UTF-8 (invalid_utf8), four
/// heap types with a numeric `bytes` label (alloc_objects, heap),
/// thousands of samples (large.cpu), stacks truncated at the runtime's
/// depth (heap_go_truncated_3, profile_rust's deep stacks), contention
/// types, and bodies that are not gzipped (dotnet.labels).
#[test]
fn go_profiles_of_every_kind_decode_validate_and_round_trip() {
    use kiln_testkit::real_inputs::go_profiles::{expect, write_go_profiles};
    let tmp = tempfile::tempdir().unwrap();
    let Some(go) = write_go_profiles(tmp.path()) else {
        return;
    };
    let mut decoded = Vec::new();
    for (name, path) in go.pprof_files() {
        let gzipped = std::fs::read(path).unwrap();
        let profile = check_real_profile(name, &gzipped);
        let plain = kiln_pprof::maybe_gunzip(&gzipped, usize::MAX).unwrap();
        assert_ne!(plain, gzipped, "{name}: Go gzips its profiles");
        let from_plain = check_real_profile(&format!("{name}, not gzipped"), &plain);
        assert!(
            from_plain.into_raw() == profile.clone().into_raw(),
            "{name}"
        );
        decoded.push(profile);
    }
    let [cpu, heap, block, mutex, _goroutine] = &decoded[..] else {
        unreachable!("five profiles")
    };

    // An inlined call shares its caller's location, one line each.
    let inlined = cpu.locations().iter().any(|location| {
        let names: Vec<&str> = location
            .line
            .iter()
            .map(|l| cpu.string(cpu.function(l.function_id).unwrap().name))
            .collect();
        names == [expect::INLINED_FUNCTION, expect::CPU_FUNCTION]
    });
    assert!(inlined, "no location holds the inlined call");
    let labelled = functions_on_stacks(cpu, |s| {
        s.label
            .iter()
            .any(|l| (cpu.string(l.key), cpu.string(l.str)) == expect::LABEL)
    });
    assert!(labelled.contains(&expect::CPU_FUNCTION), "{labelled:?}");
    // Bytes that are not UTF-8 are replaced, not refused.
    let raw: Vec<&str> = cpu
        .samples()
        .iter()
        .flat_map(|s| &s.label)
        .filter(|l| cpu.string(l.key) == expect::RAW_LABEL_KEY)
        .map(|l| cpu.string(l.str))
        .collect();
    assert!(!raw.is_empty(), "the raw label is missing");
    assert!(raw.iter().all(|v| v.contains('\u{fffd}')), "{raw:?}");

    let heap_types: Vec<(&str, &str)> = heap
        .sample_types()
        .iter()
        .map(|t| (heap.string(t.r#type), heap.string(t.unit)))
        .collect();
    assert_eq!(
        heap_types,
        [
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes")
        ]
    );
    assert!(
        heap.samples().len() >= expect::MIN_HEAP_SAMPLES,
        "{} heap samples",
        heap.samples().len()
    );
    let with_bytes = heap
        .samples()
        .iter()
        .filter(|s| {
            s.label
                .iter()
                .any(|l| heap.string(l.key) == "bytes" && l.num > 0)
        })
        .count();
    assert!(with_bytes >= expect::MIN_HEAP_SAMPLES, "{with_bytes}");
    let heap_functions = functions_on_stacks(heap, |_| true);
    for function in expect::HEAP_FUNCTIONS
        .iter()
        .chain([&expect::DEEP_FUNCTION])
    {
        assert!(heap_functions.contains(function), "{function} missing");
    }
    assert!(
        max_depth(heap) >= expect::MIN_TRUNCATED_DEPTH,
        "deepest heap stack: {}",
        max_depth(heap)
    );

    for contention in [block, mutex] {
        let types: Vec<(&str, &str)> = contention
            .sample_types()
            .iter()
            .map(|t| (contention.string(t.r#type), contention.string(t.unit)))
            .collect();
        assert_eq!(types, [("contentions", "count"), ("delay", "nanoseconds")]);
        assert!(
            functions_on_stacks(contention, |_| true).contains(&expect::CONTENDED_FUNCTION),
            "{types:?}"
        );
    }
}

/// Twin of `legacy_and_foreign_formats_are_refused_as_not_protobuf` that
/// needs no `../shared`: real profiles in formats that are not pprof, made
/// now. Go's legacy text profiles (as cppbench.cpu.legacy is gperftools'
/// legacy format), a Java Flight Recorder file, plain and gzipped (as
/// dump2.jfr.gz), and a `perf.data` recording.
#[test]
fn legacy_and_foreign_formats_made_now_are_refused_as_not_protobuf() {
    use kiln_testkit::real_inputs::{go_profiles, jfr_recordings, perf_recordings};
    let tmp = tempfile::tempdir().unwrap();
    let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
    if let Some(go) = go_profiles::write_go_profiles(tmp.path()) {
        for path in &go.legacy_text {
            inputs.push((path.display().to_string(), std::fs::read(path).unwrap()));
        }
    }
    if let Some(jfr) = jfr_recordings::record_jfr(tmp.path()) {
        let bytes = std::fs::read(&jfr).unwrap();
        assert_eq!(&bytes[..4], b"FLR\0", "a JFR file");
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gzip.write_all(&bytes).unwrap();
        inputs.push(("jfr, gzipped".into(), gzip.finish().unwrap()));
        inputs.push(("jfr".into(), bytes));
    }
    if let Some(perf) = perf_recordings::record_busy_c_program(tmp.path(), false, 0.2) {
        inputs.push(("perf.data".into(), std::fs::read(&perf.data).unwrap()));
    }
    for (name, bytes) in &inputs {
        let error = decode(bytes, &DecodeLimits::default()).unwrap_err();
        assert!(
            matches!(error, PprofError::Protobuf { .. }),
            "{name}: {error}"
        );
    }
}
