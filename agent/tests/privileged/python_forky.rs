//! CPython 3.13, 3.14 and 3.15, as Debian forky ships them, profiled by the
//! real agent: the versions it reads through CPython's own
//! `_Py_DebugOffsets` table (`kiln_agent::python::debug_offsets`), 3.14 and
//! 3.15 with their tagged code pointers.
//!
//! They need forky's newer libc, so `./kiln-dev test` unpacks them into a
//! root filesystem of their own (see `interpreters.rs`), and each runs there
//! as a container would: chrooted in its own mount namespace, the program
//! bind-mounted in, so the agent reaches the interpreter only through
//! `/proc/PID/root`. The program and the checks are `python_frames.rs`'s
//! (`python_program.rs`). In CI (`CI=true`) a missing interpreter fails the
//! test; elsewhere the test says which it skipped.

use std::path::Path;
use std::process::{Command, Stdio};

use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kiln_testkit::process::KillOnDrop;

use crate::SERIAL;
use crate::agent_run::{SAMPLING_DEADLINE, privileged_prerequisites, run_agent_for_samples};
use crate::interpreters::{FORKY_MINORS, forky_root};
use crate::python_program::{MAIN, MIN_SAMPLES, MODULE, Sample, samples_of};

/// Where the program is bind-mounted in the root (`./kiln-dev` makes it).
const WORK: &str = "/work";

/// Runs the program under forky's `python3.minor` in `root`, chrooted in a
/// mount namespace of its own with `dir` bind-mounted at [`WORK`], and
/// samples it.
fn profile_in_root(root: &Path, minor: u8, dir: &Path) -> (String, Vec<Sample>) {
    let python = format!("/usr/bin/python3.{minor}");
    let module_dir = dir.join("app");
    std::fs::create_dir_all(&module_dir).expect("module dir");
    std::fs::write(module_dir.join("kiln_work.py"), MODULE).expect("write module");
    std::fs::write(dir.join("main.py"), MAIN).expect("write main");
    std::fs::create_dir_all(root.join(WORK.trim_start_matches('/'))).expect("mount point");
    let in_root = |args: &[&str]| {
        // unshare and chroot exec what follows, so the child is the
        // interpreter itself; the bind mount stays in its namespace.
        let mut command = Command::new("unshare");
        command
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind "$1" "$2$3" && shift 3 && exec chroot "$@""#)
            .arg("sh")
            .arg(dir)
            .arg(root)
            .arg(WORK)
            .arg(root)
            .args(args);
        command
    };
    let version = in_root(&[python.as_str(), "--version"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let version = format!("{version} (forky's {python}, chrooted)");
    let main = format!("{WORK}/main.py");
    let app = format!("{WORK}/app");
    let child = KillOnDrop(
        in_root(&[python.as_str(), main.as_str(), app.as_str()])
            .stdout(Stdio::null())
            .spawn()
            .expect("the chrooted interpreter starts"),
    );
    // Let the interpreter start and import the module.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = child.0.id().to_string();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    assert!(
        maps.contains(&python),
        "{version}: pid {pid} is the interpreter itself"
    );
    let args = [
        "--pid",
        pid.as_str(),
        "--frequency",
        "99",
        "--drain-interval",
        "4s",
        "--duration",
        "8s",
    ];
    let profiles =
        run_agent_for_samples(&args, &dir.join("profiles"), MIN_SAMPLES, SAMPLING_DEADLINE);
    (version, samples_of(&profiles))
}

#[test]
fn python_functions_are_named_under_forkys_cpython_3_13_and_later() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let root = forky_root();
    for minor in FORKY_MINORS {
        let python = root.join(format!("usr/bin/python3.{minor}"));
        if !root.join(".complete").is_file() || !python.is_file() {
            assert!(
                !in_ci(),
                "{} is needed in CI (./kiln-dev test unpacks it)",
                python.display()
            );
            visible_skip(&format!(
                "CPython 3.{minor}: {} is not unpacked (./kiln-dev test unpacks it)",
                python.display()
            ));
            continue;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let (version, samples) = profile_in_root(&root, minor, dir.path());
        crate::python_program::assert_python_frames(&version, &samples);
    }
}
