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
use crate::agent_run::{
    SAMPLING_DEADLINE, metric_value, privileged_prerequisites, run_agent_for_samples,
    run_agent_scraped,
};
use crate::python_program::{MIN_SAMPLES, Sample, samples_of};

/// Debian's Ruby, as shipped.
const RUBY: &str = "/usr/bin/ruby3.1";
/// Its library, whose `ruby_version` the refusal test changes.
const LIBRUBY: &str = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1";

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
";

/// How [`SCRIPT`] is run: on the main thread, or on a thread of its own
/// (whose `ruby_current_ec` is another thread-local slot) while the main
/// thread waits.
const DRIVERS: [(&str, &str); 2] = [
    ("main thread", "loop { kiln_rb_caller }\n"),
    (
        "a Ruby Thread",
        "Thread.new { loop { kiln_rb_caller } }.join\n",
    ),
];

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
    let ruby = Path::new(RUBY);
    if !ruby.is_file() {
        assert!(!in_ci(), "ruby3.1 is needed in CI (./kiln-dev installs it)");
        visible_skip("Ruby frames: /usr/bin/ruby3.1 is not installed");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for (driver, code) in DRIVERS {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_hot_method_named(ruby, dir.path(), driver, code);
    }
}

/// Profiles [`SCRIPT`] run by `code` and checks the shares.
fn assert_hot_method_named(ruby: &Path, dir: &Path, driver: &str, code: &str) {
    let script = dir.join("kiln_hot.rb");
    std::fs::write(&script, format!("{SCRIPT}\n{code}")).expect("write script");
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
    let profiles =
        run_agent_for_samples(&args, &dir.join("profiles"), MIN_SAMPLES, SAMPLING_DEADLINE);
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
    eprintln!(
        "Ruby 3.1 ({}, {driver}): {total} samples; kiln_rb_hot {:.1} %, with file and line {:.1} %, under kiln_rb_caller {:.1} %",
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
        eprintln!("  {} x {}", sample.count, names.join(" <- "));
    }
    assert!(total >= MIN_SAMPLES, "enough samples: {total}");
    assert!(
        share(hot_under_caller) >= 95.0,
        "{driver}: the hot method under its caller in at least 95 % of samples"
    );
    assert!(
        share(hot_with_place) >= 95.0,
        "{driver}: the hot method with its file and a line of its body in at least 95 % of samples"
    );
}

#[test]
fn a_ruby_of_a_version_without_offsets_keeps_its_native_frames_and_is_counted() {
    if !privileged_prerequisites() {
        return;
    }
    if !Path::new(RUBY).is_file() || !Path::new(LIBRUBY).is_file() {
        assert!(!in_ci(), "ruby3.1 is needed in CI (./kiln-dev installs it)");
        visible_skip("the unknown-Ruby test: ruby3.1 is not installed");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Debian's libruby with `ruby_version` saying 3.9.9: the path a Ruby
    // newer than the offsets table takes. Gems are off, as their paths
    // follow the version.
    let dir = tempfile::tempdir().expect("temp dir");
    let mut library = std::fs::read(LIBRUBY).expect("libruby readable");
    let mut patched = 0;
    for at in 0..library.len().saturating_sub(6) {
        if &library[at..at + 6] == b"3.1.2\0" {
            library[at..at + 6].copy_from_slice(b"3.9.9\0");
            patched += 1;
        }
    }
    assert!(patched >= 1, "ruby_version found in {LIBRUBY}");
    let name = Path::new(LIBRUBY).file_name().expect("a file name");
    std::fs::write(dir.path().join(name), &library).expect("write the library");
    let script = dir.path().join("kiln_hot.rb");
    std::fs::write(&script, format!("{SCRIPT}\n{}", DRIVERS[0].1)).expect("write script");
    let child = KillOnDrop(
        Command::new(RUBY)
            .arg("--disable-gems")
            .arg(&script)
            .env("LD_LIBRARY_PATH", dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("ruby starts"),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let run = run_agent_scraped(
        child.0.id(),
        &dir.path().join("profiles"),
        "kiln_agent_ruby_processes_total{result=\"unsupported_version\"}",
    );
    let counted = metric_value(
        &run.metrics,
        "kiln_agent_ruby_processes_total",
        "result=\"unsupported_version\"",
    );
    let (run_metrics, profiles) = (run.metrics, run.profiles);
    let samples = samples_of(&profiles);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let named = samples
        .iter()
        .filter(|s| position(s, "kiln_rb_hot").is_some())
        .count();
    eprintln!(
        "Ruby \"3.9.9\": unsupported_version counted {counted}, {total} samples, {named} naming kiln_rb_hot"
    );
    assert!(
        counted >= 1.0,
        "the unknown Ruby is counted; metrics: {}",
        run_metrics
            .lines()
            .filter(|l| l.contains("ruby"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(total > 0, "the process is still sampled");
    assert_eq!(named, 0, "no Ruby frame is guessed");
}
