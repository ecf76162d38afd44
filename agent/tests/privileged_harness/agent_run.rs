//! Helpers shared by the privileged agent tests: prerequisites (root, BTF,
//! gcc), workloads, running the real agent binary, and flattening the pprof
//! it writes. Each test crate uses a subset, hence the dead-code allowance.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use kiln_pprof::{DecodeLimits, Profile};

/// The sampling tests compete for two cores; run them one at a time so each
/// gets its share of samples.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// Says that a test is skipped where a person running `cargo test` sees
/// it: libtest captures `eprintln!` of passing tests, not direct writes.
pub fn visible_skip(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{message}");
}

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

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
            visible_skip(&format!("skipping privileged agent test: {problem}"));
            false
        }
    }
}

/// A child process killed when the guard drops.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
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

/// One sample flattened: its count, labels and frames (leaf first) as
/// `(mapping file name, function name or "")`.
pub struct FlatSample {
    pub count: i64,
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
