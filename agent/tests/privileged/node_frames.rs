//! Privileged integration test of JavaScript frames: the real agent samples
//! Node as shipped (`node app.js`, no `--perf-basic-prof`), on the real
//! kernel, and the pprof must name the hot function and its caller, with
//! their script, from V8's own postmortem metadata.
//!
//! In CI (`CI=true`) a missing `node` fails the test; elsewhere the test
//! says it skipped.

use std::path::Path;
use std::process::{Command, Stdio};

use kiln_pprof::Profile;
use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kiln_testkit::process::KillOnDrop;

use crate::SERIAL;
use crate::agent_run::{
    FlatSample, SAMPLING_DEADLINE, flatten, privileged_prerequisites, run_agent_for_samples,
};

/// The samples the shares are judged on.
const MIN_SAMPLES: i64 = 300;

/// A hot function called by a named caller, forever.
const SCRIPT: &str = "\
function kilnHotJs(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 31 + i) % 1000003;
  }
  return x;
}

function kilnCallerJs() {
  let sum = 0;
  for (let round = 0; round < 20; round++) {
    sum += kilnHotJs(2000000);
  }
  return sum;
}

let sink = 0;
while (true) {
  sink += kilnCallerJs();
}
";

/// Share of samples (by count) for which `keep` holds.
fn share(samples: &[FlatSample], keep: impl Fn(&FlatSample) -> bool) -> f64 {
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let kept: i64 = samples.iter().filter(|s| keep(s)).map(|s| s.count).sum();
    kept as f64 / total.max(1) as f64
}

fn names(sample: &FlatSample, function: &str) -> bool {
    sample.frames.iter().any(|(_, f)| f == function)
}

/// The file and line the profiles give `function`.
fn file_and_line(profiles: &[Profile], function: &str) -> Option<(String, i64)> {
    for profile in profiles {
        for sample in profile.samples() {
            for &id in &sample.location_id {
                let Some(location) = profile.location(id) else {
                    continue;
                };
                for line in &location.line {
                    let Some(f) = profile.function(line.function_id) else {
                        continue;
                    };
                    if profile.string(f.name) == function {
                        return Some((profile.string(f.filename).to_owned(), line.line));
                    }
                }
            }
        }
    }
    None
}

/// Samples `node` running [`SCRIPT`] and returns the profiles.
fn profile_node(node: &str, dir: &Path) -> Vec<Profile> {
    let script = dir.join("app.js");
    std::fs::write(&script, SCRIPT).expect("write script");
    let child = KillOnDrop(
        Command::new(node)
            .current_dir(dir)
            .arg(&script)
            .stdout(Stdio::null())
            .spawn()
            .expect("node starts"),
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = child.0.id().to_string();
    let args = [
        "--pid",
        pid.as_str(),
        "--frequency",
        "99",
        "--drain-interval",
        "5s",
        "--duration",
        "10s",
    ];
    run_agent_for_samples(&args, &dir.join("profiles"), MIN_SAMPLES, SAMPLING_DEADLINE)
}

#[test]
fn node_without_flags_names_javascript_functions_and_their_callers() {
    if !privileged_prerequisites() {
        return;
    }
    let version = Command::new("node").arg("--version").output();
    let Ok(version) = version.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()) else {
        assert!(!in_ci(), "node is needed in CI (./kiln-dev installs it)");
        visible_skip("node is not installed (./kiln-dev installs it)");
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let profiles = profile_node("node", dir.path());
    let samples = flatten(&profiles);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let hot = share(&samples, |s| names(s, "kilnHotJs"));
    let both = share(&samples, |s| {
        names(s, "kilnHotJs") && names(s, "kilnCallerJs")
    });
    let hot_at = file_and_line(&profiles, "kilnHotJs");
    let caller_at = file_and_line(&profiles, "kilnCallerJs");
    eprintln!(
        "node {version}, no flags: {total} samples; {:.1} % name kilnHotJs, {:.1} % name \
         kilnHotJs and its caller kilnCallerJs; kilnHotJs at {hot_at:?}, kilnCallerJs at \
         {caller_at:?}",
        hot * 100.0,
        both * 100.0
    );
    if both < 0.95 {
        let mut others: Vec<&FlatSample> = samples
            .iter()
            .filter(|s| !(names(s, "kilnHotJs") && names(s, "kilnCallerJs")))
            .collect();
        others.sort_by_key(|s| -s.count);
        for sample in others.iter().take(8) {
            eprintln!("  not naming both ({}): {:?}", sample.count, sample.frames);
        }
    }
    assert!(total >= MIN_SAMPLES, "too few samples ({total}) to judge");
    let script = dir.path().join("app.js").display().to_string();
    assert!(
        hot_at.as_ref().is_some_and(|(file, _)| *file == script),
        "kilnHotJs is named with its script {script}: {hot_at:?}"
    );
    assert!(
        both >= 0.95,
        "only {:.1} % of samples name kilnHotJs and its caller (want 95 %)",
        both * 100.0
    );
}
