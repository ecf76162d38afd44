//! Privileged integration tests of `.eh_frame` unwinding: the real agent
//! binary samples real programs built without frame pointers (Debian's `xz`
//! and `python3`, a Rust release build) on the real kernel, and nearly every
//! sample must reach the program's outer function. JIT code named through a
//! perf map (Node `--perf-basic-prof`) is walked by frame pointer.
//!
//! They need root. In CI (`CI=true`) a missing prerequisite fails the test;
//! elsewhere it prints why it is skipped.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kiln_testkit::process::KillOnDrop;

use crate::SERIAL;
use crate::agent_run::{
    FlatSample, SAMPLING_DEADLINE, flatten, privileged_prerequisites, run_agent_for_samples,
};

/// A program the test needs; fails in CI when missing, skips visibly elsewhere.
#[track_caller]
fn require_program(path: &str, why: &str) -> bool {
    let found = Command::new(path)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        assert!(!in_ci(), "{path} is needed in CI ({why})");
        visible_skip(&format!("{path} is not installed ({why})"));
    }
    found
}

/// The samples each test judges its shares on.
const MIN_SAMPLES: i64 = 200;

/// Samples the process in rounds of `seconds` at 99 Hz with the default
/// unwinder, until there are [`MIN_SAMPLES`] (more rounds when a busy machine
/// gives the process less CPU), and returns its flattened samples, checking
/// their `language` label.
fn profile_pid(pid: u32, seconds: u32, dir: &Path, language: &str) -> Vec<FlatSample> {
    let pid = pid.to_string();
    let duration = format!("{seconds}s");
    let args = [
        "--pid",
        pid.as_str(),
        "--frequency",
        "99",
        "--drain-interval",
        "5s",
        "--duration",
        duration.as_str(),
    ];
    let profiles = run_agent_for_samples(
        &args,
        &dir.join(format!("profiles-{pid}")),
        MIN_SAMPLES,
        SAMPLING_DEADLINE,
    );
    let samples = flatten(&profiles);
    assert!(
        samples.iter().all(|s| s.labels.get("pid") == Some(&pid)),
        "only the target process is sampled"
    );
    assert!(
        samples
            .iter()
            .all(|s| s.labels.get("language").map(String::as_str) == Some(language)),
        "every sample is labelled language={language}"
    );
    samples
}

/// Share of samples whose stack names one of `callers`, and the median depth.
fn reach(samples: &[FlatSample], callers: &[&str]) -> (f64, usize) {
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let reached: i64 = samples
        .iter()
        .filter(|s| {
            s.frames
                .iter()
                .any(|(_, function)| callers.iter().any(|c| function == c))
        })
        .map(|s| s.count)
        .sum();
    let mut depths: Vec<usize> = samples
        .iter()
        .flat_map(|s| std::iter::repeat_n(s.frames.len(), s.count as usize))
        .collect();
    depths.sort_unstable();
    let median = depths.get(depths.len() / 2).copied().unwrap_or(0);
    (reached as f64 / total.max(1) as f64, median)
}

#[track_caller]
fn assert_reach(samples: &[FlatSample], callers: &[&str], floor: f64, what: &str) {
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let (share, median_depth) = reach(samples, callers);
    eprintln!(
        "{what}: {total} samples, {:.1} % reach {callers:?}, median depth {median_depth}",
        share * 100.0
    );
    assert!(
        total >= MIN_SAMPLES,
        "{what}: too few samples ({total}) to judge"
    );
    if share < floor {
        let mut shallow: Vec<&FlatSample> = samples
            .iter()
            .filter(|s| !s.frames.iter().any(|(_, f)| callers.contains(&f.as_str())))
            .collect();
        shallow.sort_by_key(|s| -s.count);
        for sample in shallow.iter().take(5) {
            eprintln!("  not reaching ({}): {:?}", sample.count, sample.frames);
        }
    }
    assert!(
        share >= floor,
        "{what}: only {:.1} % of samples reach {callers:?} (want {:.0} %)",
        share * 100.0,
        floor * 100.0
    );
}

/// Text that compresses like real data: words from a small vocabulary in a
/// pseudo-random order.
fn write_compressible_file(path: &Path, bytes: usize) {
    const WORDS: [&str; 16] = [
        "kiln", "profile", "stack", "frame", "unwind", "sample", "kernel", "store", "agent",
        "pprof", "flame", "graph", "cpu", "node", "pod", "label",
    ];
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).expect("create input"));
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut written = 0;
    while written < bytes {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let word = WORDS[(state % 16) as usize];
        let number = state >> 40;
        let line = format!("{word} {number} ");
        file.write_all(line.as_bytes()).expect("write input");
        written += line.len();
    }
    file.flush().expect("flush input");
}

/// Debian's xz has no frame pointers; with them only, 0 % of samples reach
/// `lzma_code` (../shared/research/unwinding.md).
#[test]
fn debian_xz_samples_reach_lzma_code() {
    if !privileged_prerequisites() || !require_program("/usr/bin/xz", "Debian's xz-utils") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("input.txt");
    write_compressible_file(&input, 96 << 20);
    let xz = KillOnDrop(
        Command::new("/usr/bin/xz")
            .args(["-6", "-T1", "-c"])
            .arg(&input)
            .stdout(Stdio::null())
            .spawn()
            .expect("xz starts"),
    );
    let samples = profile_pid(xz.0.id(), 10, dir.path(), "native");
    assert_reach(&samples, &["lzma_code"], 0.95, "xz -6");
}

/// Debian's CPython is built without frame pointers (-O3); its interpreter
/// loop must unwind down to the embedding entry points.
#[test]
fn debian_python3_samples_reach_py_runmain() {
    if !privileged_prerequisites() || !require_program("/usr/bin/python3", "Debian's python3") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("busy.py");
    std::fs::write(
        &script,
        "def kiln_py_hot(n):\n    total = 0\n    for i in range(n):\n        total += i * i % 7\n    return total\n\
         \ndef kiln_py_outer():\n    while True:\n        kiln_py_hot(100000)\n\nkiln_py_outer()\n",
    )
    .expect("write script");
    let python = KillOnDrop(
        Command::new("/usr/bin/python3")
            .arg(&script)
            .stdout(Stdio::null())
            .spawn()
            .expect("python3 starts"),
    );
    // Let the interpreter finish starting up.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let samples = profile_pid(python.0.id(), 10, dir.path(), "python");
    assert_reach(
        &samples,
        &["Py_RunMain", "Py_BytesMain", "pymain_run_python"],
        0.95,
        "python3 busy loop",
    );
}

/// A Rust release build (no frame pointers: rustc's default on x86-64 Linux)
/// with its hot loop three calls deep, deleted from disk while it runs.
#[test]
fn rust_release_build_samples_reach_the_outermost_of_three_calls() {
    if !privileged_prerequisites() {
        return;
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    if !require_program(&rustc, "the Rust compiler builds the workload") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/three_deep.rs");
    let binary = dir.path().join("three_deep");
    let status = Command::new(&rustc)
        .args(["-C", "opt-level=3", "-C", "force-frame-pointers=no", "-o"])
        .arg(&binary)
        .arg(&source)
        .status()
        .expect("rustc runs");
    assert!(status.success(), "rustc failed on {}", source.display());
    let workload = KillOnDrop(
        Command::new(&binary)
            .stdout(Stdio::null())
            .spawn()
            .expect("workload starts"),
    );
    // A binary deleted after start (an upgrade in place) is still read,
    // through /proc/PID/map_files.
    std::thread::sleep(std::time::Duration::from_millis(200));
    std::fs::remove_file(&binary).expect("delete the running binary");
    let samples = profile_pid(workload.0.id(), 10, dir.path(), "native");
    assert_reach(
        &samples,
        &["kiln_rs_outer"],
        0.95,
        "Rust release, three deep",
    );
}

/// A Go program as most images ship it, `-ldflags='-s -w'`: no `.symtab`,
/// no `.debug_frame`, only Go's own `.gopclntab`. Its hot function is a
/// frameless leaf, so a frame-pointer walk skips its caller.
const STRIPPED_GO_PROGRAM: &str = r#"package main

import "os"

//go:noinline
func kilnGoHot(seed uint64) uint64 {
	x := seed
	for i := 0; i < 2000000; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

//go:noinline
func kilnGoCaller(seed uint64) uint64 {
	return kilnGoHot(seed) ^ seed
}

func main() {
	var sink uint64
	for {
		sink = kilnGoCaller(sink)
		if sink == 42 {
			os.Exit(1)
		}
	}
}
"#;

/// A stripped Go binary is named from its `.gopclntab`, and its frameless
/// leaf's caller is found through Go's stack-pointer table.
#[test]
fn stripped_go_samples_name_a_frameless_leaf_under_its_caller() {
    if !privileged_prerequisites() {
        return;
    }
    if !require_program("go", "Go builds the workload") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let source = dir.path().join("main.go");
    std::fs::write(&source, STRIPPED_GO_PROGRAM).expect("source");
    let binary = dir.path().join("kiln-go-stripped");
    let output = Command::new("go")
        .args(["build", "-ldflags=-s -w", "-o"])
        .arg(&binary)
        .arg(&source)
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "")
        .env("GO111MODULE", "off")
        .output()
        .expect("go runs");
    assert!(
        output.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let elf = std::fs::read(&binary).expect("built");
    let elf = object::File::parse(elf.as_slice()).expect("an ELF file");
    use object::{Object, ObjectSection};
    for stripped in [".symtab", ".debug_frame", ".eh_frame"] {
        assert!(
            elf.section_by_name(stripped).is_none(),
            "the binary has no {stripped}"
        );
    }
    assert!(
        elf.section_by_name(".gopclntab")
            .is_some_and(|s| s.size() > 0)
    );
    let workload = KillOnDrop(
        Command::new(&binary)
            .stdout(Stdio::null())
            .spawn()
            .expect("workload starts"),
    );
    let samples = profile_pid(workload.0.id(), 10, dir.path(), "native");
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let under_caller: i64 = samples
        .iter()
        .filter(|s| {
            let hot = s.frames.iter().position(|(_, f)| f == "main.kilnGoHot");
            let caller = s.frames.iter().position(|(_, f)| f == "main.kilnGoCaller");
            matches!((hot, caller), (Some(hot), Some(caller)) if hot < caller)
        })
        .map(|s| s.count)
        .sum();
    assert_reach(&samples, &["main.kilnGoCaller"], 0.95, "stripped Go");
    assert!(
        under_caller as f64 >= 0.95 * total as f64,
        "stripped Go: {under_caller} of {total} samples have main.kilnGoHot under main.kilnGoCaller"
    );
}

/// Node keeps frame pointers in JIT code and names it in a perf map; those
/// frames have no unwind info, so the walk falls back to frame pointers.
#[test]
fn node_perf_map_frames_keep_their_javascript_names() {
    if !privileged_prerequisites() || !require_program("node", "Node.js (./kiln-dev installs it)") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("busy.js");
    std::fs::write(
        &script,
        "function kilnHotJs(n) { let x = 0; for (let i = 0; i < n; i++) { x = (x * 31 + i) % 1000003; } return x; }\n\
         let sink = 0;\nwhile (true) { sink += kilnHotJs(5000000); }\n",
    )
    .expect("write script");
    let node = KillOnDrop(
        Command::new("node")
            // Node writes its V8 log next to where it runs.
            .current_dir(dir.path())
            .arg("--perf-basic-prof")
            .arg(&script)
            .stdout(Stdio::null())
            .spawn()
            .expect("node starts"),
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let samples = profile_pid(node.0.id(), 10, dir.path(), "node");
    let _perf_map = RemoveFile(format!("/tmp/perf-{}.map", node.0.id()));
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let named: i64 = samples
        .iter()
        .filter(|s| s.frames.iter().any(|(_, f)| f.contains("kilnHotJs")))
        .map(|s| s.count)
        .sum();
    eprintln!("node: {named} of {total} samples name kilnHotJs");
    assert!(total >= MIN_SAMPLES, "too few samples ({total})");
    assert!(
        named as f64 >= 0.8 * total as f64,
        "only {named} of {total} samples name the JS function"
    );
}

/// HotSpot names its JIT code in a perf map on `jcmd PID Compiler.perfmap`
/// (JDK 17+); with `-XX:+PreserveFramePointer` compiled Java frames are
/// walked by frame pointer and named from that map.
#[test]
fn java_frames_are_named_from_the_hotspot_perf_map() {
    if !privileged_prerequisites()
        || !require_program("javac", "Debian's OpenJDK (./kiln-dev installs it)")
        || !require_program("jcmd", "Debian's OpenJDK (./kiln-dev installs it)")
    {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("KilnHot.java"),
        "public class KilnHot {\n\
         static long kilnHotJava(long n) { long x = 0; for (long i = 0; i < n; i++) { x = (x * 31 + i) % 1000003; } return x; }\n\
         public static void main(String[] args) { long sink = 0; while (true) { sink += kilnHotJava(50_000_000L); if (sink == 42) System.out.println(sink); } }\n\
         }\n",
    )
    .expect("write source");
    let status = Command::new("javac")
        .arg(dir.path().join("KilnHot.java"))
        .status()
        .expect("javac runs");
    assert!(status.success(), "javac failed");
    let java = KillOnDrop(
        Command::new("java")
            .current_dir(dir.path())
            .args(["-XX:+PreserveFramePointer", "-cp"])
            .arg(dir.path())
            .arg("KilnHot")
            .stdout(Stdio::null())
            .spawn()
            .expect("java starts"),
    );
    let pid = java.0.id();
    let _perf_map = RemoveFile(format!("/tmp/perf-{pid}.map"));
    // Let the JIT compile the hot method, then have HotSpot write its map.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let jcmd = Command::new("jcmd")
        .arg(pid.to_string())
        .arg("Compiler.perfmap")
        .output()
        .expect("jcmd runs");
    assert!(jcmd.status.success(), "jcmd failed: {jcmd:?}");
    let samples = profile_pid(pid, 10, dir.path(), "java");
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let named: i64 = samples
        .iter()
        .filter(|s| {
            s.frames
                .iter()
                .any(|(_, f)| f.contains("KilnHot.kilnHotJava"))
        })
        .map(|s| s.count)
        .sum();
    eprintln!("java: {named} of {total} samples name KilnHot.kilnHotJava");
    assert!(total >= MIN_SAMPLES, "too few samples ({total})");
    assert!(
        named as f64 >= 0.8 * total as f64,
        "only {named} of {total} samples name the Java method"
    );
}

/// Removes a file when dropped (perf maps Node and HotSpot leave in /tmp).
struct RemoveFile(String);

impl Drop for RemoveFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
