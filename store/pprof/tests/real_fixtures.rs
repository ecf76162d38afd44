//! Real profiles decode, validate and survive a re-encode with their totals:
//! ones a live Go program writes with `runtime/pprof` at test time (so the
//! coverage needs nothing outside the repository), and, where
//! `../shared/testdata/profiles` is checked out, every fixture there, which
//! either decodes or is refused with a clear error as SOURCES.md says.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_pprof::{DecodeLimits, PprofError, Profile, decode, encode_gzip, validate_message};

fn fixtures_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/profiles");
    if dir.is_dir() {
        Some(dir)
    } else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: ../shared/testdata/profiles is not present; the real-profile checks \
             ran only on the live Go program's profiles"
        );
        None
    }
}

const VALID: &[&str] = &[
    "google-pprof/large.cpu.pb.gz",
    "google-pprof/sample.cpu.pb.gz",
    "google-pprof/go.nomappings.crash.pb.gz",
    "google-pprof/cppbench.cpu.pb.gz",
    "google-pprof/cppbench.heap.pb.gz",
    "google-pprof/java.cpu.pb.gz",
    "parca/alloc_objects.pb.gz",
    "parca/labels.pb.gz",
    "parca/profile-with-labels.pb.gz",
    "parca/node-profile.pb.gz",
    "parca/stripped-cpu.stripped.pprof",
    "parca/fgprof.pb.gz",
    "parca/two-stacks.pb.gz",
    "parca/many/1644509272337470000.pb.gz",
    "parca/many/1644509287338709000.pb.gz",
    "parca/many/1644509299337903000.pb.gz",
    "grafana-pyroscope/go.cpu.labels.pb.gz",
    "grafana-pyroscope/heap.pb.gz",
    "grafana-pyroscope/heap_go_truncated_3.pb.gz",
    "grafana-pyroscope/profile_java.pb.gz",
    "grafana-pyroscope/profile_python.pb.gz",
    "grafana-pyroscope/profile_rust.pb.gz",
    "grafana-pyroscope/dotnet.labels.pb",
    "grafana-pyroscope/cpu-unknown.pb.gz",
    // Invalid UTF-8 in the string table is replaced, not refused.
    "grafana-pyroscope/invalid_utf8.pb.gz",
];

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
    for name in VALID {
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

/// Builds `tests/programs/profiled` with the Go toolchain and runs it, which
/// writes CPU, heap and goroutine profiles with `runtime/pprof` into `tmp`.
/// Returns `false` (said so on stderr) when Go is missing outside CI.
fn write_go_runtime_profiles(tmp: &Path) -> bool {
    let go = Command::new("go").arg("version").output();
    if !go.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var("CI").is_err(),
            "go (golang-go) is required in CI: ./kiln-dev installs it"
        );
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: go is not installed; no live runtime/pprof profiles were checked"
        );
        return false;
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/profiled/main.go");
    let binary = tmp.join("profiled");
    // The build cache lives in the target directory so reruns are quick.
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-build-cache");
    let build = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .env("GOCACHE", &cache)
        .env("HOME", tmp)
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "go build failed: {}",
        String::from_utf8_lossy(&build.stderr)
    );
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
