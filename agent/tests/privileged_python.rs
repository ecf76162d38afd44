//! Privileged integration tests of Python frames: the real agent samples a
//! CPython program (`kiln_py_outer` -> `kiln_py_middle` -> `kiln_py_hot`, in
//! a module file) under every CPython on the machine, on the real kernel,
//! and the pprof must name the Python functions with their file and line,
//! in place among the interpreter's native frames.
//!
//! The interpreters: Debian's `python3` (3.11) and the CPython that
//! `./kiln-dev test` builds from source under `$KILN_TOOLS_DIR/cpython`
//! (3.13). In CI (`CI=true`) a missing one fails the test; elsewhere the
//! test says which it skipped.

#[path = "privileged_harness/agent_run.rs"]
mod agent_run;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use agent_run::{KillOnDrop, SERIAL, in_ci, privileged_prerequisites, run_agent, visible_skip};
use kiln_pprof::Profile;

const MODULE: &str = "\
def kiln_py_hot(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def kiln_py_middle():
    return kiln_py_hot(20000) + kiln_py_hot(30000)


def kiln_py_outer():
    while True:
        kiln_py_middle()
";

const MAIN: &str = "\
import sys
sys.path.insert(0, sys.argv[1])
import kiln_work
kiln_work.kiln_py_outer()
";

/// One frame of a sample: (mapping file, function, function file, line).
#[derive(Debug, Clone)]
struct Frame {
    mapping: String,
    function: String,
    file: String,
    line: i64,
}

struct Sample {
    count: i64,
    language: String,
    frames: Vec<Frame>,
}

fn samples_of(profiles: &[Profile]) -> Vec<Sample> {
    let mut out = Vec::new();
    for profile in profiles {
        for sample in profile.samples() {
            let language = sample
                .label
                .iter()
                .find(|l| profile.string(l.key) == "language")
                .map(|l| profile.string(l.str).to_owned())
                .unwrap_or_default();
            let frames = sample
                .location_id
                .iter()
                .map(|&id| {
                    let location = profile.location(id).expect("location exists");
                    let mapping = profile
                        .mapping(location.mapping_id)
                        .map(|m| profile.string(m.filename).to_owned())
                        .unwrap_or_default();
                    let line = location.line.first();
                    let function = line.and_then(|l| profile.function(l.function_id));
                    Frame {
                        mapping,
                        function: function
                            .map(|f| profile.string(f.name).to_owned())
                            .unwrap_or_default(),
                        file: function
                            .map(|f| profile.string(f.filename).to_owned())
                            .unwrap_or_default(),
                        line: line.map_or(0, |l| l.line),
                    }
                })
                .collect();
            out.push(Sample {
                count: sample.value[0],
                language,
                frames,
            });
        }
    }
    out
}

/// The interpreters to test: Debian's, and the one kiln-dev builds.
fn interpreters() -> Vec<PathBuf> {
    let tools = std::env::var_os("KILN_TOOLS_DIR").unwrap_or_else(|| "/var/tmp/kiln-tools".into());
    let candidates = [
        PathBuf::from("/usr/bin/python3"),
        Path::new(&tools).join("cpython/3.13.15/bin/python3.13"),
    ];
    let mut found = Vec::new();
    for path in candidates {
        if path.is_file() {
            found.push(path);
        } else {
            assert!(
                !in_ci(),
                "{} is needed in CI (./kiln-dev test builds it)",
                path.display()
            );
            visible_skip(&format!(
                "skipping {}: not installed (./kiln-dev test builds it)",
                path.display()
            ));
        }
    }
    found
}

fn profile_python(python: &Path, dir: &Path) -> (String, Vec<Sample>) {
    let version = Command::new(python)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
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

/// Index of the first frame named `function` whose file is the module.
fn position(frames: &[Frame], function: &str) -> Option<usize> {
    frames
        .iter()
        .position(|f| f.function == function && f.file.ends_with("/app/kiln_work.py"))
}

#[test]
fn python_functions_are_named_with_file_and_line_under_every_cpython() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for python in interpreters() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (version, samples) = profile_python(&python, dir.path());
        let total: i64 = samples.iter().map(|s| s.count).sum();
        assert!(total >= 300, "{version}: too few samples ({total})");
        assert!(
            samples.iter().all(|s| s.language == "python"),
            "{version}: language=python"
        );

        let mut nested = 0;
        let mut native_below = 0;
        let mut native_above = 0;
        let mut lines_in_hot = std::collections::BTreeSet::new();
        for sample in &samples {
            let (Some(hot), Some(middle), Some(outer)) = (
                position(&sample.frames, "kiln_py_hot"),
                position(&sample.frames, "kiln_py_middle"),
                position(&sample.frames, "kiln_py_outer"),
            ) else {
                continue;
            };
            if !(hot < middle && middle < outer) {
                continue;
            }
            nested += sample.count;
            lines_in_hot.insert(sample.frames[hot].line);
            let rootward = &sample.frames[outer + 1..];
            if rootward
                .iter()
                .any(|f| f.function == "_PyEval_EvalFrameDefault")
                && rootward
                    .iter()
                    .any(|f| ["Py_RunMain", "Py_BytesMain", "main"].contains(&f.function.as_str()))
            {
                native_below += sample.count;
            }
            if sample.frames[..hot].iter().any(|f| !f.mapping.is_empty()) {
                native_above += sample.count;
            }
        }
        let share = nested as f64 / total as f64;
        eprintln!(
            "{version}: {total} samples, {:.1} % hot<middle<outer with file, {:.1} % with the \
             eval loop and Py_RunMain below, {native_above} with native frames above, lines {lines_in_hot:?}",
            share * 100.0,
            native_below as f64 / total as f64 * 100.0
        );
        if share < 0.9 {
            for sample in samples.iter().take(5) {
                let names: Vec<String> = sample
                    .frames
                    .iter()
                    .map(|f| format!("{}@{}:{}", f.function, f.file, f.line))
                    .collect();
                eprintln!("  ({}) {names:?}", sample.count);
            }
        }
        assert!(
            share >= 0.9,
            "{version}: only {:.1} % of samples nest the three functions",
            share * 100.0
        );
        assert!(
            native_below as f64 >= 0.9 * total as f64,
            "{version}: the native frames below the Python ones are missing"
        );
        assert!(
            native_above > 0,
            "{version}: no sample has native frames above the Python ones"
        );
        // The hot loop's body is lines 3-4 of the module; its frames point there.
        assert!(
            lines_in_hot.iter().any(|l| (2..=5).contains(l)),
            "{version}: kiln_py_hot's lines {lines_in_hot:?} are not in its body"
        );
    }
}
