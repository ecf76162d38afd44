//! Python frames of a containerized program: the program of
//! `privileged_python.rs`, run by Debian's CPython inside a pod created
//! through CRI on a real containerd (its own mount and PID namespaces, the
//! interpreter at paths only the container sees), found by the real agent in
//! Kubernetes mode through its opt-in annotation, must be profiled the same
//! way.
//!
//! Needs what `cri_e2e.rs` needs; in CI a missing prerequisite fails.

#[path = "cri_harness/node.rs"]
#[allow(dead_code)]
mod node;
#[path = "privileged_harness/python_program.rs"]
mod python_program;

use std::path::Path;
use std::process::Command;

use kiln_pprof::DecodeLimits;
use node::{Containerd, connect, create_pod_running, remove_pod};
use python_program::{MAIN, MODULE, samples_of};

const NAMESPACE: &str = "kiln-python";
const PYTHON: &str = "/usr/bin/python3.11";

/// Copies Debian's CPython 3.11 into the image: the interpreter, its shared
/// libraries, the part of the standard library it needs to start, and the
/// program.
fn add_python(rootfs: &Path) {
    let copy = |from: &Path| {
        let to = rootfs.join(from.strip_prefix("/").expect("absolute"));
        std::fs::create_dir_all(to.parent().expect("parent")).expect("dirs");
        std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    };
    copy(Path::new(PYTHON));
    let ldd = Command::new("ldd").arg(PYTHON).output().expect("ldd runs");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = line
            .split("=>")
            .last()
            .unwrap_or("")
            .trim()
            .split(' ')
            .next()
            .unwrap_or("");
        if path.starts_with('/') {
            copy(Path::new(path));
        }
    }
    let stdlib = Path::new("/usr/lib/python3.11");
    for entry in std::fs::read_dir(stdlib).expect("stdlib") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "py") {
            copy(&path);
        }
    }
    for package in ["encodings", "collections", "importlib"] {
        let status = Command::new("cp")
            .arg("-r")
            .arg(stdlib.join(package))
            .arg(rootfs.join("usr/lib/python3.11"))
            .status()
            .expect("cp runs");
        assert!(status.success());
    }
    std::fs::create_dir_all(rootfs.join("usr/lib/python3.11/lib-dynload")).expect("lib-dynload");
    std::fs::create_dir_all(rootfs.join("app")).expect("app dir");
    std::fs::write(rootfs.join("app/kiln_work.py"), MODULE).expect("module");
    std::fs::write(rootfs.join("app/main.py"), MAIN).expect("main");
}

#[test]
fn a_python_program_in_a_pod_is_profiled_with_its_python_frames() {
    if !node::prerequisites() {
        return;
    }
    if !Path::new(PYTHON).is_file() {
        assert!(!node::in_ci(), "{PYTHON} is needed in CI");
        eprintln!("skipping: {PYTHON} is not installed");
        return;
    }
    let work = tempfile::tempdir().expect("temp dir");
    let archive = node::build_image_with(&work.path().join("image"), add_python);
    let containerd = Containerd::start(&work.path().join("containerd"));
    containerd.import(&archive);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut client = rt.block_on(connect(&containerd.socket));
    let dir = containerd.dir.clone();
    let command: Vec<String> = [PYTHON, "-S", "/app/main.py", "/app"]
        .map(str::to_owned)
        .to_vec();
    let pod = rt.block_on(create_pod_running(
        &mut client,
        &dir,
        NAMESPACE,
        "python",
        &command,
        &[("profiles.kiln.dev/enabled", "true")],
    ));

    let out = work.path().join("profiles");
    let agent = Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
        .arg("--cri-socket")
        .arg(&containerd.socket)
        .args([
            "--node-name",
            "python-node",
            "--frequency",
            "99",
            "--drain-interval",
            "4s",
        ])
        .args([
            "--resync-interval",
            "1s",
            "--duration",
            "14s",
            "--metrics-addr",
            "off",
        ])
        .arg("--targets-file")
        .arg(work.path().join("no-targets.json"))
        .arg("--output-dir")
        .arg(&out)
        .output()
        .expect("agent runs");
    rt.block_on(remove_pod(&mut client, &pod));
    let stderr = String::from_utf8_lossy(&agent.stderr);
    assert!(agent.status.success(), "agent failed: {stderr}");

    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(&out).expect("profiles written") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "gz") {
            let bytes = std::fs::read(&path).expect("readable");
            profiles
                .push(kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("valid pprof"));
        }
    }
    assert!(
        !profiles.is_empty(),
        "no profile of the pod; agent log:\n{stderr}"
    );
    let samples = samples_of(&profiles);
    let version = "Python 3.11 in a pod";
    python_program::assert_python_frames(version, &samples);
}
