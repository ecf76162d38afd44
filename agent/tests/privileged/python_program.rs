//! The Python program the Python-frame tests profile, and what its profile
//! must show (shared by `python_frames.rs` and `cri_python.rs`).

use kiln_pprof::Profile;

pub const MODULE: &str = "\
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

pub const MAIN: &str = "\
import sys
sys.path.insert(0, sys.argv[1])
import kiln_work
kiln_work.kiln_py_outer()
";

/// The samples [`assert_python_frames`] needs to judge shares: the tests
/// sample until they have this many (see `agent_run::SAMPLING_DEADLINE`).
pub const MIN_SAMPLES: i64 = 300;

/// One frame of a sample: (mapping file, function, function file, line).
#[derive(Debug, Clone)]
pub struct Frame {
    pub mapping: String,
    pub function: String,
    pub file: String,
    pub line: i64,
}

pub struct Sample {
    pub count: i64,
    pub language: String,
    pub frames: Vec<Frame>,
}

pub fn samples_of(profiles: &[Profile]) -> Vec<Sample> {
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

/// Index of the first frame named `function` whose file is the module.
fn position(frames: &[Frame], function: &str) -> Option<usize> {
    frames
        .iter()
        .position(|f| f.function == function && f.file.ends_with("/app/kiln_work.py"))
}

/// Asserts that at least 95 % of the samples name the hot function
/// `kiln_py_hot` under its caller `kiln_py_middle` (issue 48's bar), and at
/// least 90 % nest both under `kiln_py_outer` (with the module's file name),
/// with the eval loop and the interpreter's entry points below them, native
/// frames above them in some samples, and lines inside `kiln_py_hot`.
#[track_caller]
pub fn assert_python_frames(version: &str, samples: &[Sample]) {
    let total: i64 = samples.iter().map(|s| s.count).sum();
    assert!(total >= MIN_SAMPLES, "{version}: too few samples ({total})");
    assert!(
        samples.iter().all(|s| s.language == "python"),
        "{version}: language=python"
    );

    let mut nested = 0;
    let mut hot_under_caller = 0;
    let mut native_below = 0;
    let mut native_above = 0;
    let mut lines_in_hot = std::collections::BTreeSet::new();
    for sample in samples {
        if let (Some(hot), Some(middle)) = (
            position(&sample.frames, "kiln_py_hot"),
            position(&sample.frames, "kiln_py_middle"),
        ) && hot < middle
        {
            hot_under_caller += sample.count;
        }
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
        // Where the loop runs in a cold part that no symbol names (Debian
        // forky's stripped 3.13+), its named caller stands for it.
        if rootward
            .iter()
            .any(|f| ["_PyEval_EvalFrameDefault", "PyEval_EvalCode"].contains(&f.function.as_str()))
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
    let named = hot_under_caller as f64 / total as f64;
    eprintln!(
        "{version}: {total} samples, {:.1} % hot under its caller, {:.1} % hot<middle<outer \
         with file, {:.1} % with the eval loop and Py_RunMain below, {native_above} with native \
         frames above, lines {lines_in_hot:?}",
        named * 100.0,
        share * 100.0,
        native_below as f64 / total as f64 * 100.0
    );
    // The largest samples that miss, for whoever reads a failure (or runs
    // with --nocapture).
    let mut misses: Vec<&Sample> = samples
        .iter()
        .filter(|s| position(&s.frames, "kiln_py_hot").is_none())
        .collect();
    misses.sort_by_key(|s| -s.count);
    for sample in misses.iter().take(3) {
        let names: Vec<String> = sample
            .frames
            .iter()
            .map(|f| format!("{}@{}:{}", f.function, f.file, f.line))
            .collect();
        eprintln!("  missing ({}): {names:?}", sample.count);
    }
    assert!(
        named >= 0.95,
        "{version}: only {:.1} % of samples name the hot function under its caller",
        named * 100.0
    );
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
