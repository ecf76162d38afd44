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
//! (`python_program.rs`). A 3.14 whose table is forged is refused, counted,
//! and keeps its native frames. In CI (`CI=true`) a missing interpreter
//! fails the test; elsewhere the test says which it skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kiln_testkit::process::KillOnDrop;

use crate::SERIAL;
use crate::agent_run::{
    SAMPLING_DEADLINE, metric_value, privileged_prerequisites, run_agent_for_samples,
    run_agent_scraped,
};
use crate::interpreters::{FORKY_MINORS, forky_root};
use crate::python_program::{MAIN, MIN_SAMPLES, MODULE, Sample, samples_of};

/// Where the program is bind-mounted in the root (`./kiln-dev` makes it).
const WORK: &str = "/work";

/// `args` run chrooted in `root`, in a mount namespace of their own with
/// `dir` bind-mounted at [`WORK`]. unshare and chroot exec what follows, so
/// the child is the program itself; the bind mount stays in its namespace.
fn in_root(root: &Path, dir: &Path, args: &[&str]) -> Command {
    std::fs::create_dir_all(root.join(WORK.trim_start_matches('/'))).expect("mount point");
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
}

/// Writes the program into `dir`.
fn write_program(dir: &Path) {
    let module_dir = dir.join("app");
    std::fs::create_dir_all(&module_dir).expect("module dir");
    std::fs::write(module_dir.join("kiln_work.py"), MODULE).expect("write module");
    std::fs::write(dir.join("main.py"), MAIN).expect("write main");
}

/// Runs the program under forky's `python3.minor` in `root` ([`in_root`])
/// and samples it.
fn profile_in_root(root: &Path, minor: u8, dir: &Path) -> (String, Vec<Sample>) {
    let python = format!("/usr/bin/python3.{minor}");
    write_program(dir);
    let version = in_root(root, dir, &[python.as_str(), "--version"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let version = format!("{version} (forky's {python}, chrooted)");
    let main = format!("{WORK}/main.py");
    let app = format!("{WORK}/app");
    let child = KillOnDrop(
        in_root(root, dir, &[python.as_str(), main.as_str(), app.as_str()])
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

/// Forky's `python3.minor` beneath `root`, or `None` (with a visible
/// skip, or a failure in CI) when it is not unpacked.
fn forky_python(root: &Path, minor: u8) -> Option<PathBuf> {
    let python = root.join(format!("usr/bin/python3.{minor}"));
    if root.join(".complete").is_file() && python.is_file() {
        return Some(python);
    }
    assert!(
        !in_ci(),
        "{} is needed in CI (./kiln-dev test unpacks it)",
        python.display()
    );
    visible_skip(&format!(
        "CPython 3.{minor}: {} is not unpacked (./kiln-dev test unpacks it)",
        python.display()
    ));
    None
}

#[test]
fn python_functions_are_named_under_forkys_cpython_3_13_and_later() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let root = forky_root();
    for minor in FORKY_MINORS {
        if forky_python(&root, minor).is_none() {
            continue;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let (version, samples) = profile_in_root(&root, minor, dir.path());
        crate::python_program::assert_python_frames(&version, &samples);
    }
}

/// Where `_PyRuntime` starts in a CPython file: the cookie followed by a
/// 3.x `PY_VERSION_HEX` (the cookie's text also appears elsewhere).
fn table_in_file(bytes: &[u8]) -> Option<usize> {
    bytes.windows(16).position(|w| {
        let version = u64::from_le_bytes(w[8..16].try_into().unwrap_or_default());
        &w[..8] == b"xdebugpy" && version >> 24 == 3
    })
}

#[test]
fn a_forged_debug_offsets_table_is_refused_and_counted_and_native_frames_stay() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let root = forky_root();
    let Some(python) = forky_python(&root, 14) else {
        return;
    };
    // Forky's 3.14 with its table's thread_id offset (word 27 of the 3.14
    // layout) pointing far outside the thread state: the program runs as
    // before, and the agent must not use the table.
    let dir = tempfile::tempdir().expect("temp dir");
    write_program(dir.path());
    let mut bytes = std::fs::read(&python).expect("read the interpreter");
    let table = table_in_file(&bytes).expect("the table is in the file");
    bytes[table + 27 * 8..table + 28 * 8].copy_from_slice(&0x7fff_fff8u64.to_le_bytes());
    let forged = dir.path().join("python3.14");
    std::fs::write(&forged, &bytes).expect("write the forged interpreter");
    std::fs::set_permissions(&forged, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("executable");
    let program = format!("{WORK}/python3.14");
    let main = format!("{WORK}/main.py");
    let app = format!("{WORK}/app");
    let child = KillOnDrop(
        in_root(
            &root,
            dir.path(),
            &[program.as_str(), main.as_str(), app.as_str()],
        )
        .stdout(Stdio::null())
        .spawn()
        .expect("the forged interpreter starts"),
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let run = run_agent_scraped(
        child.0.id(),
        &dir.path().join("profiles"),
        "kiln_agent_python_processes_total{result=\"bad_debug_offsets\"}",
    );
    let refused = metric_value(
        &run.metrics,
        "kiln_agent_python_processes_total",
        "result=\"bad_debug_offsets\"",
    );
    let python_lines: Vec<&str> = run
        .metrics
        .lines()
        .filter(|l| l.contains("python"))
        .collect();
    assert!(
        refused >= 1.0,
        "the forged table is refused; metrics: {python_lines:?}"
    );
    let profiles = run.profiles;
    let samples = samples_of(&profiles);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let interpreter: i64 = samples
        .iter()
        .filter(|s| s.frames.iter().any(|f| f.function == "PyEval_EvalCode"))
        .map(|s| s.count)
        .sum();
    let python_frames = samples
        .iter()
        .flat_map(|s| &s.frames)
        .filter(|f| f.file.ends_with(".py"))
        .count();
    eprintln!(
        "forged 3.14: {total} samples, {interpreter} through PyEval_EvalCode, \
         {python_frames} Python frames, bad_debug_offsets counted {refused}"
    );
    assert!(total > 0, "the forged interpreter is still sampled");
    assert!(
        interpreter as f64 >= 0.9 * total as f64,
        "native frames stay: {interpreter} of {total} samples"
    );
    assert_eq!(python_frames, 0, "no Python frames from a refused table");
}
