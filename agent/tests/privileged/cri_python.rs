//! Python frames of a containerized program: the program of
//! `python_frames.rs`, run by Debian's CPython inside a pod created
//! through CRI on a real containerd (its own mount and PID namespaces, the
//! interpreter at paths only the container sees), found by the real agent in
//! Kubernetes mode through its opt-in annotation, must be profiled the same
//! way.
//!
//! Needs what `cri_e2e.rs` needs; in CI a missing prerequisite fails.

use std::path::Path;
use std::process::Command;

use kiln_testkit::prerequisites::{in_ci, visible_skip};

use crate::SERIAL;
use crate::agent_run::{SAMPLING_DEADLINE, run_agent_for_samples};
use crate::cri_node::{self, Containerd, connect, create_pod_running, remove_pod};
use crate::python_program::{MAIN, MIN_SAMPLES, MODULE, samples_of};

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
    if !cri_node::prerequisites() {
        return;
    }
    if !Path::new(PYTHON).is_file() {
        assert!(!in_ci(), "{PYTHON} is needed in CI");
        visible_skip(&format!("{PYTHON} is not installed"));
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let work = tempfile::tempdir().expect("temp dir");
    let archive = cri_node::build_image_with(&work.path().join("image"), add_python);
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

    let socket = containerd.socket.to_str().expect("a UTF-8 socket path");
    let targets_file = work.path().join("no-targets.json");
    let args = [
        "--cri-socket",
        socket,
        "--node-name",
        "python-node",
        "--frequency",
        "99",
        "--drain-interval",
        "4s",
        "--resync-interval",
        "1s",
        "--duration",
        "14s",
        "--targets-file",
        targets_file.to_str().expect("a UTF-8 temp path"),
    ];
    // Rounds of 14 s until there are enough samples: a busy machine gives
    // the pod's interpreter less CPU, and so fewer samples per round.
    let profiles = run_agent_for_samples(
        &args,
        &work.path().join("profiles"),
        MIN_SAMPLES,
        SAMPLING_DEADLINE,
    );
    rt.block_on(remove_pod(&mut client, &pod));
    let samples = samples_of(&profiles);
    let version = "Python 3.11 in a pod";
    crate::python_program::assert_python_frames(version, &samples);
}
