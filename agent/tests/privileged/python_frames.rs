//! Privileged integration tests of Python frames: the real agent samples a
//! CPython program (`kiln_py_outer` -> `kiln_py_middle` -> `kiln_py_hot`, in
//! a module file) under every CPython on the machine, on the real kernel,
//! and the pprof must name the Python functions with their file and line,
//! in place among the interpreter's native frames.
//!
//! The interpreters: Debian's `python3` (3.11), bullseye's 3.9 that
//! `./kiln-dev test` unpacks from Debian's archive (see
//! `interpreters.rs`), and Debian's `libpython3.11.so` embedded
//! in a program of another name (as uWSGI embeds it). In CI (`CI=true`) a
//! missing one fails the test; elsewhere the test says which it skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kiln_testkit::process::KillOnDrop;

use crate::SERIAL;
use crate::agent_run::{
    SAMPLING_DEADLINE, metric_value, privileged_prerequisites, run_agent_for_samples,
    run_agent_scraped, sample_count,
};
use crate::python_program::{MAIN, MIN_SAMPLES, MODULE, Sample, samples_of};

/// The interpreters to test: Debian's and bullseye's 3.9.
fn interpreters() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for required in crate::interpreters::required_interpreters() {
        if required.is_file() {
            found.push(required);
        } else {
            assert!(
                !in_ci(),
                "{} is needed in CI (./kiln-dev test unpacks it)",
                required.display()
            );
            visible_skip(&format!(
                "{}: not installed (./kiln-dev test unpacks it)",
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
        visible_skip("the embedded interpreter: libpython3.11-dev is not installed");
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
    // Each round is 8 s; a busy machine gives the interpreter less CPU, and
    // so fewer samples per round.
    let profiles =
        run_agent_for_samples(&args, &dir.join("profiles"), MIN_SAMPLES, SAMPLING_DEADLINE);
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
        crate::python_program::assert_python_frames(&version, &samples);
    }
}

#[test]
fn a_cpython_of_a_version_without_offsets_keeps_its_native_frames_and_is_counted() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Bullseye's 3.9 under the name `python3.8`: 3.9 has no `Py_Version`, so
    // the agent takes the version from the name, and it has no offsets for
    // 3.8. This is the path any CPython newer than the table takes.
    let debian = crate::interpreters::debian_root();
    let real = debian.join("usr/bin/python3.9");
    if !real.is_file() {
        assert!(!in_ci(), "{} is needed in CI", real.display());
        visible_skip("the unsupported-version test: bullseye's python3.9 is not unpacked");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let renamed = dir.path().join("python3.8");
    std::fs::copy(&real, &renamed).expect("copy the interpreter");
    let module_dir = dir.path().join("app");
    std::fs::create_dir_all(&module_dir).expect("module dir");
    std::fs::write(module_dir.join("kiln_work.py"), MODULE).expect("write module");
    let main = dir.path().join("main.py");
    std::fs::write(&main, MAIN).expect("write main");
    let child = KillOnDrop(
        Command::new(&renamed)
            .arg(&main)
            .arg(&module_dir)
            .env("PYTHONHOME", debian.join("usr"))
            .stdout(Stdio::null())
            .spawn()
            .expect("the renamed interpreter starts"),
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = child.0.id().to_string();
    let output_dir = dir.path().join("profiles");
    let run = run_agent_scraped(
        child.0.id(),
        &output_dir,
        "kiln_agent_python_processes_total{result=\"unsupported_version\"}",
    );
    let counted = metric_value(
        &run.metrics,
        "kiln_agent_python_processes_total",
        "result=\"unsupported_version\"",
    );
    assert!(
        counted >= 1.0,
        "the unsupported interpreter is counted; metrics: {}",
        run.metrics
            .lines()
            .filter(|l| l.contains("python"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let mut profiles = run.profiles;
    // The shares below are judged on at least this many samples. A busy
    // machine gives the interpreter less CPU, and so fewer samples in the
    // run above: more rounds of the same sampling make up the rest.
    const ENOUGH: i64 = 200;
    let missing = ENOUGH - sample_count(&profiles);
    if missing > 0 {
        let args = [
            "--pid",
            pid.as_str(),
            "--frequency",
            "99",
            "--drain-interval",
            "3s",
            "--duration",
            "7s",
        ];
        profiles.extend(run_agent_for_samples(
            &args,
            &dir.path().join("more-profiles"),
            missing,
            SAMPLING_DEADLINE,
        ));
    }
    let samples = samples_of(&profiles);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let eval_loop: i64 = samples
        .iter()
        .filter(|s| {
            s.frames
                .iter()
                .any(|f| f.function == "_PyEval_EvalFrameDefault")
        })
        .map(|s| s.count)
        .sum();
    let python_frames = samples
        .iter()
        .flat_map(|s| &s.frames)
        .filter(|f| f.file.ends_with(".py"))
        .count();
    eprintln!(
        "python3.8 (3.9 renamed): {total} samples, {eval_loop} through the eval loop, \
         {python_frames} Python frames, unsupported_version counted {counted}"
    );
    assert!(total >= ENOUGH, "too few samples ({total})");
    assert!(
        eval_loop as f64 >= 0.9 * total as f64,
        "native frames stay: {eval_loop} of {total} samples show the eval loop"
    );
    assert_eq!(python_frames, 0, "no Python frames without offsets");
    assert!(
        samples.iter().all(|s| s.language == "python"),
        "the process is still labelled python"
    );
}
