//! Folded text from a real producer at test time: `perf record -g` samples
//! the Rust compiler building a small program, and perf's own
//! `stackcollapse` report writes the folded lines (Brendan Gregg's format,
//! as inferno and the `stackcollapse-*` scripts write it). Demangled C++
//! and Rust names carry spaces, commas and angle brackets, so the count
//! must be read after the last space. This keeps the coverage of the
//! `../shared` inferno fixtures (`folded.rs`) without `../shared` (issue 13).

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use kiln_pprof::folded::{FoldedSpec, folded_to_profile};
use kiln_pprof::{DecodeLimits, validate_message};

/// The sum of the trailing counts of folded text, read without kiln-pprof.
fn folded_count_sum(text: &str) -> i64 {
    text.lines()
        .filter_map(|line| line.rsplit_once(' '))
        .map(|(_, count)| count.trim().parse::<i64>().unwrap())
        .sum()
}

/// True when `perf` runs at all; false (after a visible note) when it is
/// absent, which fails in CI: `./kiln-dev test` installs `linux-perf`.
fn perf_is_installed() -> bool {
    if Command::new("perf").arg("--version").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var("CI").is_err(),
        "perf is required in CI: ./kiln-dev test installs linux-perf"
    );
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: perf is not installed; no perf-collapsed folded text was checked"
    );
    false
}

/// Records the compiler building a small program in `dir` and returns
/// perf's folded stacks, or `None` (after a visible note) where the kernel
/// refuses perf events to this process.
fn perf_folded_stacks_of_rustc(dir: &Path) -> Option<String> {
    let source = dir.join("small.rs");
    std::fs::write(
        &source,
        "fn main() { let v: Vec<u64> = (0..100).map(|i| i * i).collect(); println!(\"{}\", v.iter().sum::<u64>()); }\n",
    )
    .unwrap();
    let record = Command::new("perf")
        .current_dir(dir)
        .args([
            "record",
            "-F",
            "2999",
            "-g",
            "-o",
            "perf.data",
            "--",
            "rustc",
            "-O",
        ])
        .arg(&source)
        .arg("-o")
        .arg(dir.join("small"))
        .output()
        .unwrap();
    if !record.status.success() {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: perf record could not sample here ({}): {}",
            record.status,
            String::from_utf8_lossy(&record.stderr)
        );
        return None;
    }
    // The report script reads ./perf.data.
    let report = Command::new("perf")
        .current_dir(dir)
        .args(["script", "report", "stackcollapse"])
        .output()
        .unwrap();
    assert!(
        report.status.success(),
        "perf script report stackcollapse: {}",
        String::from_utf8_lossy(&report.stderr)
    );
    Some(String::from_utf8(report.stdout).unwrap())
}

#[test]
fn perf_collapsed_stacks_of_a_real_compiler_convert_with_their_totals_and_frame_names() {
    if !perf_is_installed() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(folded) = perf_folded_stacks_of_rustc(tmp.path()) else {
        return;
    };
    let expected = folded_count_sum(&folded);
    assert!(expected > 0, "perf sampled nothing: {folded}");

    let spec = FoldedSpec {
        max_depth: 1 << 16,
        ..FoldedSpec::default()
    };
    let (message, stats) =
        folded_to_profile(folded.as_bytes(), &spec).unwrap_or_else(|e| panic!("perf folded: {e}"));
    assert_eq!(stats.total_count, expected);
    let sum: i64 = message.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(sum, expected);

    // Every frame of the text is a function of the profile, spaces and
    // commas in demangled names included.
    let names: HashSet<&[u8]> = message
        .function
        .iter()
        .filter_map(|f| message.string_table.get(f.name as usize))
        .map(Vec::as_slice)
        .collect();
    let mut frames_with_spaces = 0;
    for line in folded.lines() {
        let (stack, _) = line.rsplit_once(' ').unwrap();
        for frame in stack.split(';') {
            assert!(
                names.contains(frame.as_bytes()),
                "frame {frame:?} is missing"
            );
            frames_with_spaces += usize::from(frame.contains(' '));
        }
    }
    // rustc's LLVM frames (`llvm::DenseMap<..., int>` and the like) put
    // names with spaces on most stacks; without them the case this test
    // exists for was not exercised.
    assert!(
        frames_with_spaces > 0,
        "no frame with a space was sampled: {folded}"
    );
    validate_message(message, &DecodeLimits::default())
        .unwrap_or_else(|e| panic!("perf folded: {e}"));
}

/// Twin of `folded::tests::inferno_fixtures_convert_with_their_recorded_totals`
/// that needs no `../shared`: folded stacks whose counts are perf's event
/// periods (nanoseconds of `cpu-clock`), so the totals are large, as in the
/// perf-rust-Yamakaky fixture, from a recording made now. The totals come
/// from perf's samples, read apart from the folded text.
#[test]
fn perf_samples_folded_by_period_convert_with_their_large_totals() {
    use kiln_testkit::real_inputs::perf_recordings::{
        FUNCTIONS, fold_by_period, record_busy_c_program,
    };
    let tmp = tempfile::tempdir().unwrap();
    let Some(recording) = record_busy_c_program(tmp.path(), false, 0.3) else {
        return;
    };
    let expected = i64::try_from(recording.total_period()).unwrap();
    // Each sample weighs about a million (nanoseconds at 999 Hz).
    assert!(
        expected > 1_000_000 * 10,
        "perf recorded {expected} over {} samples",
        recording.samples.len()
    );
    let folded = fold_by_period(&recording.samples);
    assert_eq!(folded_count_sum(&folded), expected);

    let (message, stats) = folded_to_profile(folded.as_bytes(), &FoldedSpec::default())
        .unwrap_or_else(|e| panic!("perf folded by period: {e}"));
    assert_eq!(stats.total_count, expected);
    let sum: i64 = message.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(sum, expected);
    let names: HashSet<&[u8]> = message
        .function
        .iter()
        .filter_map(|f| message.string_table.get(f.name as usize))
        .map(Vec::as_slice)
        .collect();
    for function in FUNCTIONS {
        assert!(names.contains(function.as_bytes()), "{function} missing");
    }
    validate_message(message, &DecodeLimits::default())
        .unwrap_or_else(|e| panic!("perf folded by period: {e}"));
}
