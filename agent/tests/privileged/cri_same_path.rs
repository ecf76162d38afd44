//! One binary is never named as another. Four pods each run a different Go
//! program at the same path, `/manager`, as many operators' images do:
//! - `alpha` and `bravo` carry no GNU build id (Go before 1.26 wrote none),
//!   so only the file tells them apart;
//! - `cobra` and `delta` carry the same one: `delta` forged `cobra`'s, as a
//!   pod can forge libc's to rename other pods' frames.
//!
//! Each pod's hot function and caller must be named from its own binary,
//! and never from another's. The hot function is a frameless leaf, so its
//! caller is reached only through Go's zlib-compressed `.debug_frame`.
//!
//! Needs what `cri_e2e.rs` needs, and Go; in CI a missing prerequisite fails.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::SERIAL;
use crate::cri_hostile::{CpuMeter, PodNode, floor, start_agent};
use crate::cri_node;

/// Two programs alike in every way but their functions' names, which have
/// the same length: the hot function sits at the same file offset in both,
/// so a cache keyed by path would hand one program's names to the other.
const PROGRAM: &str = r#"package main

import "os"

// A frameless leaf: a frame-pointer walk skips its caller, so the
// caller is found only through the binary's .debug_frame, which Go's
// linker writes zlib-compressed.
//
//go:noinline
func NAMEHot(seed uint64) uint64 {
	x := seed
	for i := 0; i < 2000000; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

//go:noinline
func NAMECaller(seed uint64) uint64 {
	return NAMEHot(seed) ^ seed
}

func main() {
	var sink uint64
	for {
		sink = NAMECaller(sink)
		if sink == 42 {
			os.Exit(1)
		}
	}
}
"#;

/// The programs, each named for its functions; all the same length.
const NAMES: [&str; 4] = ["alpha", "bravo", "cobra", "delta"];

/// Builds each of [`NAMES`] into the image's root (static, as Go builds by
/// default): `alpha` and `bravo` with no GNU build id, `cobra` with one and
/// `delta` with `cobra`'s written over its own.
fn build_manager_image(work: &Path) -> std::path::PathBuf {
    cri_node::build_image_with(work, |rootfs| {
        let source_dir = work.join("go");
        for name in NAMES {
            let dir = source_dir.join(name);
            std::fs::create_dir_all(&dir).expect("source dir");
            let source = dir.join("main.go");
            std::fs::write(&source, PROGRAM.replace("NAME", name)).expect("source");
            let build_id = if matches!(name, "alpha" | "bravo") {
                "none"
            } else {
                "gobuildid"
            };
            let output = Command::new("go")
                .args(["build", &format!("-ldflags=-B={build_id}"), "-o"])
                .arg(rootfs.join(name))
                .arg(&source)
                .env("CGO_ENABLED", "0")
                .env("GOTOOLCHAIN", "local")
                .env("GOFLAGS", "")
                .output()
                .expect("go runs");
            assert!(
                output.status.success(),
                "go build {name}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let build_id = |name: &str| {
            kiln_agent::elf_symbols::build_id(
                &std::fs::File::open(rootfs.join(name)).expect("built"),
            )
        };
        assert_eq!(build_id("alpha"), None, "alpha has no GNU build id");
        assert_eq!(build_id("bravo"), None, "bravo has no GNU build id");
        let cobra = build_id("cobra").expect("cobra has a build id");
        let delta = build_id("delta").expect("delta has a build id");
        let mut bytes = std::fs::read(rootfs.join("delta")).expect("delta");
        let at = bytes
            .windows(delta.len())
            .position(|w| w == delta.as_slice())
            .expect("delta's build id in its note");
        bytes[at..at + cobra.len()].copy_from_slice(&cobra);
        std::fs::write(rootfs.join("delta"), bytes).expect("forge delta's build id");
        assert_eq!(
            build_id("delta"),
            Some(cobra),
            "delta claims cobra's build id"
        );
    })
}

/// Whether Go builds here; panics in CI when it does not.
fn go_present() -> bool {
    let runs = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !runs {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the same-path test cannot run in CI: go is not installed"
        );
        eprintln!("SKIPPED: the same-path test needs Go (go is not on the PATH)");
    }
    runs
}

#[test]
fn two_go_binaries_at_the_same_path_in_two_pods_are_each_named_from_their_own() {
    if !cri_node::prerequisites() || !go_present() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut node = PodNode::start_with_image(build_manager_image);
    let pids: Vec<u32> = NAMES
        .iter()
        .map(|name| {
            let script = format!("cp /{name} /manager && exec /manager");
            node.run(&format!("manager-{name}"), &["/bin/sh", "-c", &script])
        })
        .collect();
    // Wait until both run `/manager` (the copy is made in each pod's own
    // writable layer, so the two files differ and share the path).
    for &pid in &pids {
        let exe = Path::new("/proc").join(pid.to_string()).join("exe");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::fs::read_link(&exe).map_or(true, |p| p != Path::new("/manager")) {
            assert!(
                std::time::Instant::now() < deadline,
                "pod {pid} never ran /manager"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    let meter = CpuMeter::start(&pids);
    let agent = start_agent(&node, Duration::from_secs(9), &[]);
    let run = agent.finish(Duration::from_secs(60));
    assert!(run.ok, "the agent failed: {}", run.log);

    for (&pid, name) in pids.iter().zip(NAMES) {
        let own: Vec<_> = run
            .samples()
            .filter(|s| s.labels.get("pid") == Some(&pid.to_string()))
            .collect();
        let total: i64 = own.iter().map(|s| s.count).sum();
        let has = |s: &&crate::agent_run::FlatSample, function: &str| {
            s.frames.iter().any(|(_, f)| f == function)
        };
        let named: i64 = own
            .iter()
            .filter(|s| has(s, &format!("main.{name}Hot")) && has(s, &format!("main.{name}Caller")))
            .map(|s| s.count)
            .sum();
        let misnamed: i64 = own
            .iter()
            .filter(|s| {
                s.frames
                    .iter()
                    .any(|(_, f)| NAMES.iter().any(|n| *n != name && f.contains(n)))
            })
            .map(|s| s.count)
            .sum();
        eprintln!(
            "pod {name} (pid {pid}, /manager): {total} samples, {named} with main.{name}Hot \
             under main.{name}Caller, {misnamed} naming another's functions"
        );
        if let Some(top) = own.iter().max_by_key(|s| s.count) {
            eprintln!(
                "  its most frequent stack ({}): {:?}",
                top.count, top.frames
            );
        }
        assert_eq!(
            misnamed, 0,
            "pod {name}'s frames were named from another binary"
        );
        assert!(
            total >= floor(100, meter.used(pid)),
            "pod {name} was profiled"
        );
        assert!(
            named * 100 >= total * 95,
            "pod {name}'s hot function and caller are named in {named} of {total} samples"
        );
    }
}
