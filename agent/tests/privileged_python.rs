//! Privileged integration tests of Python frames: the real agent samples a
//! CPython program (`kiln_py_outer` -> `kiln_py_middle` -> `kiln_py_hot`, in
//! a module file) under every CPython on the machine, on the real kernel,
//! and the pprof must name the Python functions with their file and line,
//! in place among the interpreter's native frames.
//!
//! The interpreters: Debian's `python3` (3.11), bullseye's 3.9 that
//! `./kiln-dev test` unpacks from Debian's archive (see
//! `tests/python/interpreters.rs`), and Debian's `libpython3.11.so` embedded
//! in a program of another name (as uWSGI embeds it). In CI (`CI=true`) a
//! missing one fails the test; elsewhere the test says which it skipped.

#[path = "privileged_harness/agent_run.rs"]
mod agent_run;
#[path = "python/interpreters.rs"]
mod interpreters;
#[path = "privileged_harness/python_program.rs"]
mod python_program;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use agent_run::{KillOnDrop, SERIAL, in_ci, privileged_prerequisites, run_agent, visible_skip};
use python_program::{MAIN, MODULE, Sample, samples_of};

/// The interpreters to test: Debian's and bullseye's 3.9.
fn interpreters() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for required in interpreters::required_interpreters() {
        if required.is_file() {
            found.push(required);
        } else {
            assert!(
                !in_ci(),
                "{} is needed in CI (./kiln-dev test unpacks it)",
                required.display()
            );
            visible_skip(&format!(
                "skipping {}: not installed (./kiln-dev test unpacks it)",
                required.display()
            ));
        }
    }
    found
}

/// A program that embeds Debian's `libpython3.11.so` and runs its `main`:
/// the process maps the library, and its executable's name says nothing.
fn build_embedded(dir: &Path) -> Option<PathBuf> {
    let header = Path::new("/usr/include/python3.11/Python.h");
    let library = Path::new("/usr/lib/x86_64-linux-gnu/libpython3.11.so");
    if !header.is_file() || !library.exists() {
        assert!(
            !in_ci(),
            "libpython3.11-dev is needed in CI (./kiln-dev installs python3-dev)"
        );
        visible_skip("skipping the embedded interpreter: libpython3.11-dev is not installed");
        return None;
    }
    let source = dir.join("kiln_embed.c");
    std::fs::write(
        &source,
        "#include <Python.h>\nint main(int argc, char **argv) { return Py_BytesMain(argc, argv); }\n",
    )
    .expect("write source");
    let program = dir.join("kiln_embed");
    let status = Command::new("gcc")
        .arg("-I/usr/include/python3.11")
        .arg("-o")
        .arg(&program)
        .arg(&source)
        .arg("-lpython3.11")
        .status()
        .expect("gcc runs");
    assert!(status.success(), "the embedding program builds");
    Some(program)
}

fn profile_python(python: &Path, dir: &Path) -> (String, Vec<Sample>) {
    let version = Command::new(python)
        .arg("--version")
        .output()
        .map(|o| {
            let version = String::from_utf8_lossy(&o.stdout).trim().to_owned();
            format!("{version} ({})", python.display())
        })
        .unwrap_or_default();
    let module_dir = dir.join("app");
    std::fs::create_dir_all(&module_dir).expect("module dir");
    std::fs::write(module_dir.join("kiln_work.py"), MODULE).expect("write module");
    let main = dir.join("main.py");
    std::fs::write(&main, MAIN).expect("write main");
    let child = KillOnDrop(
        Command::new(python)
            .arg(&main)
            .arg(&module_dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("python starts"),
    );
    // Let the interpreter start and import the module.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = child.0.id().to_string();
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
    let profiles = run_agent(&args, &dir.join("profiles"));
    (version, samples_of(&profiles))
}

#[test]
fn python_functions_are_named_with_file_and_line_under_every_cpython() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let embed_dir = tempfile::tempdir().expect("temp dir");
    let mut pythons = interpreters();
    pythons.extend(build_embedded(embed_dir.path()));
    for python in pythons {
        let dir = tempfile::tempdir().expect("temp dir");
        let (version, samples) = profile_python(&python, dir.path());
        python_program::assert_python_frames(&version, &samples);
    }
}
