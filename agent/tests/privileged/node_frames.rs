//! Privileged integration tests of JavaScript frames: the real agent samples
//! Node as shipped (`node app.js`, no `--perf-basic-prof`), on the real
//! kernel, and the pprof must name the hot function and its caller, with
//! their script and line, from V8's own postmortem metadata. The Nodes:
//! this machine's 20 (one static `node`), and Debian's own 18 (bookworm)
//! and 24 (forky), each a `node` with a shared `libnode.so`, in root
//! filesystems of their own that `./kiln-dev test` unpacks.
//!
//! In CI (`CI=true`) a missing Node fails the test; elsewhere the test
//! says which it skipped.

use std::path::{Path, PathBuf};
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

/// Samples the process `command` starts (node running `app.js` in `dir`)
/// and returns the profiles.
fn profile_node(mut command: Command, dir: &Path) -> Vec<Profile> {
    std::fs::write(dir.join("app.js"), SCRIPT).expect("write script");
    let child = KillOnDrop(command.stdout(Stdio::null()).spawn().expect("node starts"));
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

/// Shares of samples naming the hot function, it and its caller, and the
/// caller.
struct Shares {
    hot: f64,
    both: f64,
    caller: f64,
}

/// Prints the shares of `profiles` and returns them, once it has checked
/// that they hold enough samples and name the hot function with its script
/// `script` (the path node was given).
fn judge(version: &str, profiles: &[Profile], script: &str) -> Shares {
    let samples = flatten(profiles);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let shares = Shares {
        hot: share(&samples, |s| names(s, "kilnHotJs")),
        both: share(&samples, |s| {
            names(s, "kilnHotJs") && names(s, "kilnCallerJs")
        }),
        caller: share(&samples, |s| names(s, "kilnCallerJs")),
    };
    let hot_at = file_and_line(profiles, "kilnHotJs");
    let caller_at = file_and_line(profiles, "kilnCallerJs");
    eprintln!(
        "{version}: {total} samples; {:.1} % name kilnHotJs, {:.1} % name kilnHotJs and its \
         caller kilnCallerJs, {:.1} % name kilnCallerJs; kilnHotJs at {hot_at:?}, \
         kilnCallerJs at {caller_at:?}",
        shares.hot * 100.0,
        shares.both * 100.0,
        shares.caller * 100.0,
    );
    if shares.both < 0.95 {
        let mut others: Vec<&FlatSample> = samples
            .iter()
            .filter(|s| !(names(s, "kilnHotJs") && names(s, "kilnCallerJs")))
            .collect();
        others.sort_by_key(|s| -s.count);
        for sample in others.iter().take(3) {
            eprintln!("  not naming both ({}): {:?}", sample.count, sample.frames);
        }
    }
    assert!(total >= MIN_SAMPLES, "too few samples ({total}) to judge");
    assert!(
        hot_at.as_ref().is_some_and(|(file, _)| file == script),
        "kilnHotJs is named with its script {script}: {hot_at:?}"
    );
    shares
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
    let script = dir.path().join("app.js");
    let mut command = Command::new("node");
    command.current_dir(dir.path()).arg(&script);
    let profiles = profile_node(command, dir.path());
    let shares = judge(
        &format!("node {version}, no flags"),
        &profiles,
        &script.display().to_string(),
    );
    assert!(
        shares.both >= 0.95,
        "only {:.1} % of samples name kilnHotJs and its caller (want 95 %)",
        shares.both * 100.0
    );
}

/// Where the program is bind-mounted in forky's root (`./kiln-dev` makes it).
const WORK: &str = "/work";

/// A Debian root filesystem with its Node (`./kiln-dev test` unpacks it):
/// `debian-forky-node`, `debian-bookworm-node`.
fn tools_root(name: &str) -> PathBuf {
    let tools = std::env::var_os("KILN_TOOLS_DIR").unwrap_or_else(|| "/var/tmp/kiln-tools".into());
    Path::new(&tools).join(name)
}

/// Samples the Node of the root filesystem `name` running the program,
/// chrooted in its own mount namespace with the program bind-mounted in
/// (so the agent reaches `libnode.so` only through `/proc/PID/root`), and
/// returns its shares; `None` (skipped visibly, or failing in CI) when the
/// root is not unpacked.
fn profile_in_root(name: &str) -> Option<Shares> {
    let root = tools_root(name);
    if !root.join(".complete").is_file() {
        assert!(
            !in_ci(),
            "{} is needed in CI (./kiln-dev test unpacks it)",
            root.display()
        );
        visible_skip(&format!(
            "{}: not unpacked (./kiln-dev test unpacks it)",
            root.display()
        ));
        return None;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let in_root = |args: &[&str]| {
        let mut command = Command::new("unshare");
        command
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind "$1" "$2$3" && shift 3 && exec chroot "$@""#)
            .arg("sh")
            .arg(dir.path())
            .arg(&root)
            .arg(WORK)
            .arg(&root)
            .args(args);
        command
    };
    let version = in_root(&["/usr/bin/node", "--version"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let script = format!("{WORK}/app.js");
    let profiles = profile_node(in_root(&["/usr/bin/node", script.as_str()]), dir.path());
    Some(judge(
        &format!("{name}'s node {version}, chrooted, no flags"),
        &profiles,
        &script,
    ))
}

/// Debian bookworm's own Node 18 (a shared `libnode.so`, V8 10.2).
#[test]
fn bookworm_node_18_in_its_own_root_names_javascript_functions_and_their_callers() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(shares) = profile_in_root("debian-bookworm-node") else {
        return;
    };
    assert!(
        shares.both >= 0.95,
        "only {:.1} % of samples name kilnHotJs and its caller (want 95 %)",
        shares.both * 100.0
    );
}

#[test]
fn forky_node_24_in_its_own_root_names_inlined_functions_and_their_callers() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(shares) = profile_in_root("debian-forky-node") else {
        return;
    };
    // V8 13's Maglev and TurboFan inline kilnHotJs into kilnCallerJs, and
    // both into the script's top-level function, for most of the run: the
    // inlined frames come from the optimized code's own tables.
    assert!(
        shares.both >= 0.95,
        "only {:.1} % of samples name kilnHotJs and its caller (want 95 %)",
        shares.both * 100.0
    );
}
