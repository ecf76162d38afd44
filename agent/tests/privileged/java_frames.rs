//! Privileged integration test of Java frames in a JVM started without
//! flags: the real agent samples Debian's OpenJDK 17 running `java -cp .
//! KilnMain` (no `-XX:+PreserveFramePointer`, no perf map, no agent in the
//! JVM), and the pprof must name the hot method and its caller from
//! HotSpot's own metadata.
//!
//! The hot method runs a long loop per call, so the JIT compiles it (on
//! stack replacement) while its caller stays interpreted: the walk crosses
//! a compiled frame (left by its frame size) and interpreted ones (by the
//! frame pointer).

use std::process::{Command, Stdio};

use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kiln_testkit::process::KillOnDrop;

use crate::SERIAL;
use crate::agent_run::{
    FlatSample, SAMPLING_DEADLINE, flatten, privileged_prerequisites, run_agent_for_samples,
};

const JAVA: &str = "/usr/bin/java";
const JAVAC: &str = "/usr/bin/javac";
const HOT: &str = "KilnMain.kilnHot(J)J";
const CALLER: &str = "KilnMain.kilnCaller(J)J";
const MIN_SAMPLES: i64 = 300;

const SOURCE: &str = "public class KilnMain {\n\
    static long kilnHot(long n) {\n\
        long x = 0;\n\
        for (long i = 0; i < n; i++) { x = (x * 31 + i) % 1000003; }\n\
        return x;\n\
    }\n\
    static long kilnCaller(long n) { return kilnHot(n) + 1; }\n\
    public static void main(String[] args) {\n\
        long sink = 0;\n\
        while (true) { sink += kilnCaller(50_000_000L); if (sink == 42) System.out.println(sink); }\n\
    }\n\
}\n";

/// Whether a sample's stack names `function` with `caller` as the next
/// Java frame towards the root.
fn names_with_caller(sample: &FlatSample, function: &str, caller: &str) -> bool {
    let frames: Vec<&str> = sample.frames.iter().map(|(_, f)| f.as_str()).collect();
    frames
        .iter()
        .position(|f| *f == function)
        .is_some_and(|at| frames[at + 1..].iter().find(|f| f.contains('(')) == Some(&caller))
}

#[test]
fn java_methods_are_named_in_a_jvm_started_without_flags() {
    if !privileged_prerequisites() {
        return;
    }
    if !std::path::Path::new(JAVAC).is_file() {
        assert!(
            !in_ci(),
            "{JAVAC} is needed in CI (Debian's openjdk-17-jdk)"
        );
        visible_skip(&format!(
            "{JAVAC} is not installed (Debian's openjdk-17-jdk)"
        ));
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("KilnMain.java"), SOURCE).expect("write source");
    let status = Command::new(JAVAC)
        .arg(dir.path().join("KilnMain.java"))
        .status()
        .expect("javac runs");
    assert!(status.success(), "javac failed");
    let java = KillOnDrop(
        Command::new(JAVA)
            .current_dir(dir.path())
            .args(["-cp", ".", "KilnMain"])
            .stdout(Stdio::null())
            .spawn()
            .expect("java starts"),
    );
    // Let the JVM start and the JIT compile the hot loop.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let pid = java.0.id().to_string();
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
    let samples = flatten(&profiles);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let count = |keep: &dyn Fn(&FlatSample) -> bool| -> i64 {
        samples.iter().filter(|s| keep(s)).map(|s| s.count).sum()
    };
    let hot = count(&|s| s.frames.iter().any(|(_, f)| f == HOT));
    let with_caller = count(&|s| names_with_caller(s, HOT, CALLER));
    let main = count(&|s| {
        s.frames
            .iter()
            .any(|(_, f)| f.starts_with("KilnMain.main("))
    });
    let percent = |n: i64| 100.0 * n as f64 / total.max(1) as f64;
    eprintln!(
        "OpenJDK 17, no flags: {total} samples; {:.1} % name {HOT}, {:.1} % name it called by \
         {CALLER}, {:.1} % reach KilnMain.main",
        percent(hot),
        percent(with_caller),
        percent(main)
    );
    let mut stacks: Vec<&FlatSample> = samples.iter().collect();
    stacks.sort_by_key(|s| -s.count);
    for sample in stacks.iter().take(5) {
        let frames: Vec<&str> = sample.frames.iter().map(|(_, f)| f.as_str()).collect();
        eprintln!("  {} × {}", sample.count, frames.join(" <- "));
    }
    assert!(total >= MIN_SAMPLES, "too few samples ({total})");
    assert!(
        percent(with_caller) >= 95.0,
        "only {with_caller} of {total} samples name {HOT} called by {CALLER}"
    );
}
