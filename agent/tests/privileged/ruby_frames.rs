//! Privileged integration test of Ruby frames: the real agent samples
//! Debian's `ruby` (3.1, no flags) running `kiln_rb_caller` ->
//! `Integer#times` (a C method) -> block -> `kiln_rb_hot`, on the real
//! kernel, and the pprof must name the hot method and its caller, with the
//! script's file and the hot method's lines, in at least 95 % of samples.
//! A missing `ruby` is a visible skip, and a failure in CI (`./kiln-dev
//! test` installs it).

use std::path::Path;
use std::process::{Command, Stdio};

use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kiln_testkit::process::KillOnDrop;

use crate::SERIAL;
use crate::agent_run::{SAMPLING_DEADLINE, privileged_prerequisites, run_agent_for_samples};
use crate::python_program::{MIN_SAMPLES, Sample, samples_of};

/// The hot method spends its time in the VM's own instructions (no
/// allocation, Fixnums only); its caller reaches it through a C method.
const SCRIPT: &str = "\
def kiln_rb_hot(n)
  x = 0
  i = 0
  while i < n
    x += i * i
    i += 1
  end
  x
end

def kiln_rb_caller
  10.times { kiln_rb_hot(20_000) }
end

loop { kiln_rb_caller }
";

/// Lines of `kiln_rb_hot`'s body in [`SCRIPT`].
const HOT_LINES: std::ops::RangeInclusive<i64> = 2..=8;

fn position(sample: &Sample, function: &str) -> Option<usize> {
    sample.frames.iter().position(|f| f.function == function)
}

#[test]
fn ruby_methods_are_named_with_file_and_line_under_debian_ruby() {
    if !privileged_prerequisites() {
        return;
    }
    let ruby = Path::new("/usr/bin/ruby3.1");
    if !ruby.is_file() {
        assert!(!in_ci(), "ruby3.1 is needed in CI (./kiln-dev installs it)");
        visible_skip("Ruby frames: /usr/bin/ruby3.1 is not installed");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("kiln_hot.rb");
    std::fs::write(&script, SCRIPT).expect("write script");
    let child = KillOnDrop(
        Command::new(ruby)
            .arg(&script)
            .stdout(Stdio::null())
            .spawn()
            .expect("ruby starts"),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
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
    let profiles = run_agent_for_samples(
        &args,
        &dir.path().join("profiles"),
        MIN_SAMPLES,
        SAMPLING_DEADLINE,
    );
    let samples = samples_of(&profiles);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let script_path = script.to_string_lossy().into_owned();
    let mut hot = 0;
    let mut hot_under_caller = 0;
    let mut hot_with_place = 0;
    for sample in &samples {
        let Some(at) = position(sample, "kiln_rb_hot") else {
            continue;
        };
        hot += sample.count;
        let frame = &sample.frames[at];
        if frame.file == script_path && HOT_LINES.contains(&frame.line) {
            hot_with_place += sample.count;
        }
        if position(sample, "kiln_rb_caller").is_some_and(|caller| caller > at) {
            hot_under_caller += sample.count;
        }
    }
    let share = |n: i64| 100.0 * n as f64 / total.max(1) as f64;
    println!(
        "Ruby 3.1 ({}): {total} samples; kiln_rb_hot {:.1} %, with file and line {:.1} %, under kiln_rb_caller {:.1} %",
        ruby.display(),
        share(hot),
        share(hot_with_place),
        share(hot_under_caller)
    );
    let mut heaviest: Vec<&Sample> = samples.iter().collect();
    heaviest.sort_by_key(|s| std::cmp::Reverse(s.count));
    for sample in heaviest.iter().take(3) {
        let names: Vec<String> = sample
            .frames
            .iter()
            .map(|f| match f.line {
                0 => f.function.clone(),
                line => format!("{}:{line}", f.function),
            })
            .collect();
        println!("  {} x {}", sample.count, names.join(" <- "));
    }
    assert!(total >= MIN_SAMPLES, "enough samples: {total}");
    assert!(
        share(hot_under_caller) >= 95.0,
        "the hot method under its caller in at least 95 % of samples"
    );
    assert!(
        share(hot_with_place) >= 95.0,
        "the hot method with its file and a line of its body in at least 95 % of samples"
    );
}
