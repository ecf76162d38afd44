//! Privileged integration test of Java frames in a JVM started without
//! flags: the real agent samples `java -cp . KilnMain` (no
//! `-XX:+PreserveFramePointer`, no perf map, no agent in the JVM) under
//! this machine's OpenJDK 17 (Debian bookworm's) and Debian forky's
//! OpenJDK 25 (JDK 23 changed code blobs' layout), and the pprof must name
//! the hot method and its caller from HotSpot's own metadata. Forky's JVM
//! runs as in a container: chrooted into the root filesystem that
//! `./kiln-dev test` unpacks, in its own mount namespace, with the classes
//! (compiled here by javac 17 for release 17) bind-mounted in, so the agent
//! reaches `libjvm.so` only through `/proc/PID/root`.
//!
//! In CI (`CI=true`) a missing JVM fails the test; elsewhere the test says
//! which it skipped.
//!
//! The hot method runs a long loop per call, so the JIT compiles it (on
//! stack replacement) while its caller stays interpreted: the walk crosses
//! a compiled frame (left by its frame size) and interpreted ones (by the
//! frame pointer).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kiln_testkit::process::KillOnDrop;

use crate::SERIAL;
use crate::agent_run::{
    FlatSample, SAMPLING_DEADLINE, flatten, privileged_prerequisites, run_agent_for_samples,
};

const JAVAC: &str = "/usr/bin/javac";
/// This machine's JVM (Debian bookworm's OpenJDK 17).
const HOST_JAVA: &str = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java";
/// Forky's root filesystem under `$KILN_TOOLS_DIR`, and its JVM there.
const FORKY_ROOT: &str = "debian-forky-java";
const FORKY_JAVA: &str = "/usr/lib/jvm/java-25-openjdk-amd64/bin/java";
/// Where the classes are bind-mounted in forky's root (`./kiln-dev` makes it).
const WORK: &str = "/work";
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

/// A hot method small enough for C2 to inline into its caller, which is
/// called often enough to be compiled (and inlined into `main`'s loop).
/// Its loop counts with a `long`, so C2 keeps a safepoint in it: debug
/// information (a PcDesc) in the inlined method's own scope.
const INLINED_SOURCE: &str = "public class KilnInline {\n\
    static long kilnInlinedHot(long x) {\n\
        long y = x;\n\
        for (long i = 0; i < 1000; i++) { y = (y * 31 + i) % 1000003; }\n\
        return y;\n\
    }\n\
    static long kilnInlinedCaller(long n) { return kilnInlinedHot(n) + 1; }\n\
    public static void main(String[] args) {\n\
        long sink = 0;\n\
        while (true) { sink += kilnInlinedCaller(sink); if (sink == 42) System.out.println(sink); }\n\
    }\n\
}\n";
const INLINED_HOT: &str = "KilnInline.kilnInlinedHot(J)J";
const INLINED_CALLER: &str = "KilnInline.kilnInlinedCaller(J)J";

/// A JVM: the command that runs a class of the test program under it.
type JavaCommand = Box<dyn Fn(&str) -> Command>;

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
    if !Path::new(JAVAC).is_file() {
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
    std::fs::write(dir.path().join("KilnInline.java"), INLINED_SOURCE).expect("write source");
    // Release 17's class files, so that both JVMs load them.
    let status = Command::new(JAVAC)
        .args(["--release", "17"])
        .arg(dir.path().join("KilnMain.java"))
        .arg(dir.path().join("KilnInline.java"))
        .status()
        .expect("javac runs");
    assert!(status.success(), "javac failed");
    let mut jvms: Vec<(&str, JavaCommand)> = Vec::new();
    if Path::new(HOST_JAVA).is_file() {
        let classes = dir.path().to_owned();
        jvms.push((
            "OpenJDK 17 (Debian bookworm)",
            Box::new(move |class| {
                let mut command = Command::new(HOST_JAVA);
                command.current_dir(&classes).args(["-cp", ".", class]);
                command
            }),
        ));
    } else {
        assert!(
            !in_ci(),
            "{HOST_JAVA} is needed in CI (Debian's openjdk-17-jdk)"
        );
        visible_skip(&format!(
            "{HOST_JAVA} is not installed (Debian's openjdk-17-jdk)"
        ));
    }
    let root = tools_root(FORKY_ROOT);
    if root.join(".complete").is_file() {
        let classes = dir.path().to_owned();
        jvms.push((
            "OpenJDK 25 (Debian forky, chrooted)",
            Box::new(move |class| in_forky_root(&root, &classes, class)),
        ));
    } else {
        assert!(
            !in_ci(),
            "{} is needed in CI (./kiln-dev test unpacks it)",
            root.display()
        );
        visible_skip(&format!(
            "{}: not unpacked (./kiln-dev test unpacks it)",
            root.display()
        ));
    }
    let mut failures = Vec::new();
    for (name, java) in &jvms {
        let share = profile_java(name, java("KilnMain"), dir.path(), "KilnMain", HOT, CALLER);
        if share < 95.0 {
            failures.push(format!("{name}, KilnMain: {share:.1} %"));
        }
        // Inlined methods are read from the compiled method's scopes; a
        // sampled pc is named by the next recorded pc's scope, so an
        // inlined method without a call or safepoint of its own would show
        // as its caller.
        let share = profile_java(
            name,
            java("KilnInline"),
            dir.path(),
            "KilnInline",
            INLINED_HOT,
            INLINED_CALLER,
        );
        if share < 95.0 {
            failures.push(format!("{name}, KilnInline: {share:.1} %"));
        }
    }
    assert!(
        failures.is_empty(),
        "samples naming the hot method called by its caller under 95 %: {failures:?}"
    );
}

/// A root filesystem that `./kiln-dev test` unpacks under `$KILN_TOOLS_DIR`.
fn tools_root(name: &str) -> PathBuf {
    let tools = std::env::var_os("KILN_TOOLS_DIR").unwrap_or_else(|| "/var/tmp/kiln-tools".into());
    Path::new(&tools).join(name)
}

/// Forky's java running `class`, chrooted into `root` in a mount namespace
/// of its own with `classes` bind-mounted at [`WORK`]. The JVM needs /proc
/// there: the loader finds `libjli.so` by java's `$ORIGIN`, read from
/// `/proc/self/exe`. The shell and chroot exec, so the child's pid is the
/// JVM's.
fn in_forky_root(root: &Path, classes: &Path, class: &str) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(
            r#"mount --bind "$1" "$2$3" && mount -t proc proc "$2/proc" && shift 3 && exec chroot "$@""#,
        )
        .arg("sh")
        .arg(classes)
        .arg(root)
        .arg(WORK)
        .arg(root)
        .args([FORKY_JAVA, "-cp", WORK, class]);
    command
}

/// Runs `java` (started in `dir` or with `dir` as its class path), samples
/// it, prints what its samples name, and returns the % naming `hot` called
/// by `caller`.
fn profile_java(
    name: &str,
    mut java: Command,
    dir: &Path,
    class: &str,
    hot: &str,
    caller: &str,
) -> f64 {
    let child = KillOnDrop(java.stdout(Stdio::null()).spawn().expect("java starts"));
    // Let the JVM start and the JIT compile the hot loop.
    std::thread::sleep(std::time::Duration::from_secs(3));
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
        &dir.join(format!("profiles-{pid}")),
        MIN_SAMPLES,
        SAMPLING_DEADLINE,
    );
    let samples = flatten(&profiles);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    assert!(total >= MIN_SAMPLES, "{name}: too few samples ({total})");
    let count = |keep: &dyn Fn(&FlatSample) -> bool| -> i64 {
        samples.iter().filter(|s| keep(s)).map(|s| s.count).sum()
    };
    let named_hot = count(&|s| s.frames.iter().any(|(_, f)| f == hot));
    let named_caller = count(&|s| s.frames.iter().any(|(_, f)| f == caller));
    let with_caller = count(&|s| names_with_caller(s, hot, caller));
    let main_prefix = format!("{class}.main(");
    let main = count(&|s| s.frames.iter().any(|(_, f)| f.starts_with(&main_prefix)));
    let percent = |n: i64| 100.0 * n as f64 / total as f64;
    eprintln!(
        "{name}, no flags, {class}: {total} samples; {:.1} % name {hot}, {:.1} % name it \
         called by {caller}, {:.1} % name {caller}, {:.1} % reach {class}.main",
        percent(named_hot),
        percent(with_caller),
        percent(named_caller),
        percent(main)
    );
    let mut stacks: Vec<&FlatSample> = samples.iter().collect();
    stacks.sort_by_key(|s| -s.count);
    for sample in stacks.iter().take(3) {
        let frames: Vec<&str> = sample.frames.iter().map(|(_, f)| f.as_str()).collect();
        eprintln!("  {} x {}", sample.count, frames.join(" <- "));
    }
    percent(with_caller)
}
