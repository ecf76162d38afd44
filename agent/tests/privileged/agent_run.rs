//! Helpers of the privileged agent tests: prerequisites (root, BTF, gcc),
//! workloads, running the real agent binary, and flattening the pprof it
//! writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kiln_pprof::{DecodeLimits, Profile};
use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kiln_testkit::process::KillOnDrop;

/// Whether the privileged prerequisites hold; panics in CI when not.
#[track_caller]
pub fn privileged_prerequisites() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let btf = Path::new("/sys/kernel/btf/vmlinux").is_file();
    let gcc = Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let problem = if !root {
        Some("must run as root (BPF programs and perf events)")
    } else if !btf {
        Some("the kernel exposes no BTF at /sys/kernel/btf/vmlinux")
    } else if !gcc {
        Some("gcc is not installed (./kiln-dev installs build-essential)")
    } else {
        None
    };
    match problem {
        None => true,
        Some(problem) if in_ci() => panic!("privileged agent test cannot run in CI: {problem}"),
        Some(problem) => {
            visible_skip(&format!("privileged agent test: {problem}"));
            false
        }
    }
}

/// Compiles a workload with frame pointers everywhere (see
/// ../shared/research/ebpf-notes.md on leaf functions and tail calls).
#[track_caller]
pub fn build_workload(source: &str, output: &Path) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(source);
    let status = Command::new("gcc")
        .args([
            "-O1",
            "-fno-omit-frame-pointer",
            "-mno-omit-leaf-frame-pointer",
            "-fno-optimize-sibling-calls",
            "-fno-ipa-icf",
            "-o",
        ])
        .arg(output)
        .arg(&source)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed on {}", source.display());
}

pub fn spawn(program: &Path, args: &[&str]) -> KillOnDrop {
    KillOnDrop(
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("workload starts"),
    )
}

/// Runs the agent to completion with `args` plus an output directory, and
/// returns the decoded profiles it wrote.
#[track_caller]
pub fn run_agent(args: &[&str], output_dir: &Path) -> Vec<Profile> {
    let output = Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
        .args(args)
        .arg("--output-dir")
        .arg(output_dir)
        .args(["--metrics-addr", "off"])
        .output()
        .expect("agent runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "agent failed: {stderr}");
    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(output_dir).expect("output dir") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "gz") {
            let bytes = std::fs::read(&path).expect("profile readable");
            let profile = kiln_pprof::decode(&bytes, &DecodeLimits::default())
                .unwrap_or_else(|e| panic!("{} is not a valid pprof: {e}", path.display()));
            profiles.push(profile);
        }
    }
    assert!(
        !profiles.is_empty(),
        "agent wrote no profiles; stderr: {stderr}"
    );
    profiles
}

/// How long a test may keep sampling to collect the samples it needs: many
/// times each test's nominal window. The agent samples on-CPU stacks, so a
/// workload that gets less CPU on a busy machine yields fewer samples per
/// second; the test then takes longer, but judges as many samples as on an
/// idle machine, and fails only if they do not come at all.
pub const SAMPLING_DEADLINE: Duration = Duration::from_secs(120);

/// The samples in `profiles` (the sum of the first value, the sample count).
pub fn sample_count(profiles: &[Profile]) -> i64 {
    profiles
        .iter()
        .flat_map(|p| p.samples())
        .map(|s| s.value[0])
        .sum()
}

/// [`run_agent`] round after round, each round writing under its own
/// directory in `output_dir`, until the profiles hold at least `min_samples`
/// samples or `deadline` has passed since the first round began; returns
/// the profiles of every round. `args` carry the agent's `--duration`, the
/// length of one round.
#[track_caller]
pub fn run_agent_for_samples(
    args: &[&str],
    output_dir: &Path,
    min_samples: i64,
    deadline: Duration,
) -> Vec<Profile> {
    let began = Instant::now();
    let mut profiles = Vec::new();
    for round in 0.. {
        profiles.extend(run_agent(args, &output_dir.join(format!("round-{round}"))));
        let so_far = sample_count(&profiles);
        eprintln!(
            "round {round}: {so_far} samples after {:?}",
            began.elapsed()
        );
        if so_far >= min_samples || began.elapsed() >= deadline {
            break;
        }
    }
    profiles
}

/// One sample flattened: its count, labels and frames (leaf first) as
/// `(mapping file name, function name or "")`.
pub struct FlatSample {
    pub count: i64,
    /// The sample's CPU time: its count times the profile's period.
    pub cpu_ns: i64,
    pub labels: BTreeMap<String, String>,
    pub frames: Vec<(String, String)>,
}

pub fn flatten(profiles: &[Profile]) -> Vec<FlatSample> {
    let mut flat = Vec::new();
    for profile in profiles {
        assert_eq!(profile.string(profile.sample_types()[0].r#type), "samples");
        assert_eq!(profile.string(profile.sample_types()[1].r#type), "cpu");
        assert_eq!(
            profile.string(profile.sample_types()[1].unit),
            "nanoseconds"
        );
        for sample in profile.samples() {
            let labels = sample
                .label
                .iter()
                .map(|l| {
                    (
                        profile.string(l.key).to_owned(),
                        profile.string(l.str).to_owned(),
                    )
                })
                .collect();
            let frames = sample
                .location_id
                .iter()
                .map(|&id| {
                    let location = profile.location(id).expect("location exists");
                    let mapping = profile
                        .mapping(location.mapping_id)
                        .map(|m| profile.string(m.filename).to_owned())
                        .unwrap_or_default();
                    let function = location
                        .line
                        .first()
                        .and_then(|line| profile.function(line.function_id))
                        .map(|f| profile.string(f.name).to_owned())
                        .unwrap_or_default();
                    (mapping, function)
                })
                .collect();
            flat.push(FlatSample {
                count: sample.value[0],
                cpu_ns: sample.value[1],
                labels,
                frames,
            });
        }
    }
    flat
}

pub fn inclusive_count(samples: &[FlatSample], function: &str) -> i64 {
    samples
        .iter()
        .filter(|s| s.frames.iter().any(|(_, f)| f == function))
        .map(|s| s.count)
        .sum()
}

pub fn canonical(path: &Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| PathBuf::from(path))
        .display()
        .to_string()
}
