//! Hostile runtimes in pods on a real containerd, against the real agent in
//! Kubernetes (CRI) mode. The agent reads runtimes' own structures from
//! their processes' memory, without flags: a process can forge those
//! structures, or unload the code the agent is reading. Each scenario runs
//! its hostile processes in opted-in pods next to a well-behaved spinner,
//! `kiln_hostile_control`:
//! - forged HotSpot: a `libjvm.so` exporting HotSpot's debugger tables
//!   with no terminator, an unterminated name, huge strides, or valid
//!   tables over a code cache whose segment map walks 60,000 steps, whose
//!   blob and methods point at each other and at unreadable pages, or whose
//!   offsets wrap around 2^64 (`forged_libjvm.c`);
//! - forged CPython 3.13, Ruby 3.1 and V8: a `_Py_DebugOffsets` table that
//!   passes every check over cyclic thread and frame lists and strings that
//!   run off their page; a Ruby VM stack of control frames to its end whose
//!   iseqs change on every pass and claim the largest tables accepted;
//!   `v8dbg_` constants of garbage (`forged_python.c`, `forged_ruby.c`,
//!   `forged_v8.c`);
//! - code unloaded under the agent: JIT-like code mapped, run and unmapped
//!   over and over, and a library loaded, run and unloaded over and over
//!   (`jit_churn.c`, `forged_main.c churn`).
//!
//! Each scenario ends with the agent alive and draining on time, the
//! well-behaved pod in every full window (from the first or second on),
//! the hostile processes profiled (their native hot function named, no
//! name read from forged memory), and the agent's CPU time, memory reads
//! and peak RSS printed and bounded.
//!
//! Needs what `cri_e2e.rs` needs; in CI a missing prerequisite fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::SERIAL;
use crate::cri_hostile::{
    self, CpuMeter, Finished, PodNode, assert_draining, compile_static, cpu_time, floor, metric,
    start_agent,
};
use crate::cri_node;

/// How long the agent runs in each scenario.
const RUN: Duration = Duration::from_secs(15);

/// Text the forgeries put only where the agent must not read a name from.
const FORGED_MARKER: &str = "KILN_FORGED";

fn workload(source: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(source)
}

fn gcc(args: &[&str], source: &str, output: &Path) {
    let status = Command::new("gcc")
        .args(["-O1", "-fno-omit-frame-pointer"])
        .args(args)
        .arg("-o")
        .arg(output)
        .arg(workload(source))
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed on {source}");
}

/// Copies `binary`'s shared libraries (libc and the loader) into `rootfs`.
fn copy_libraries(binary: &Path, rootfs: &Path) {
    let ldd = Command::new("ldd").arg(binary).output().expect("ldd runs");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let path = line
            .split("=>")
            .last()
            .unwrap_or("")
            .split_whitespace()
            .next()
            .unwrap_or("");
        if !path.starts_with('/') {
            continue;
        }
        let to = rootfs.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().expect("parent")).expect("dirs");
        std::fs::copy(path, &to).unwrap_or_else(|e| panic!("copy {path}: {e}"));
    }
}

/// The image: busybox, `/control`, `/jit_churn`, `/forged/run` (dynamic,
/// with this machine's libc) and the forged runtimes' libraries under the
/// names the agent looks for, and `/churn/{a,b}.so`.
fn build_runtimes_image(work: &Path) -> PathBuf {
    cri_node::build_image_with(work, |rootfs| {
        std::fs::create_dir_all(rootfs.join("tmp")).expect("rootfs /tmp");
        std::fs::create_dir_all(rootfs.join("forged")).expect("rootfs /forged");
        std::fs::create_dir_all(rootfs.join("churn")).expect("rootfs /churn");
        compile_static("control_spin.c", &rootfs.join("control"), &["-O2"]);
        compile_static("jit_churn.c", &rootfs.join("jit_churn"), &["-O1"]);
        let run = rootfs.join("forged/run");
        gcc(&[], "forged_main.c", &run);
        copy_libraries(&run, rootfs);
        for (source, name) in [
            ("forged_libjvm.c", "forged/libjvm.so"),
            ("forged_python.c", "forged/libpython3.13.so"),
            ("forged_ruby.c", "forged/libruby.so.3.1"),
            ("forged_v8.c", "forged/libnode.so.115"),
            ("churn_lib.c", "churn/a.so"),
        ] {
            gcc(&["-shared", "-fPIC"], source, &rootfs.join(name));
        }
        std::fs::copy(rootfs.join("churn/a.so"), rootfs.join("churn/b.so")).expect("b.so");
    })
}

/// What the agent cost over a scenario.
struct Cost {
    cpu: Duration,
    reads_ok: u64,
    reads_rejected: u64,
    read_bytes: u64,
}

/// Runs the agent over the node's pods for [`RUN`], checks it drains on
/// time, and returns its profiles, last metrics and cost.
fn run_agent(node: &PodNode, pids: &[u32]) -> (Finished, String, Cost, CpuMeter) {
    let started = Instant::now();
    let meter = CpuMeter::start(pids);
    let agent = start_agent(node, RUN, &[]);
    let agent_pid = agent.pid();
    std::thread::sleep(RUN - Duration::from_secs(3));
    let metrics = assert_draining(&agent, started);
    let cost = Cost {
        cpu: cpu_time(agent_pid),
        reads_ok: metric(
            &metrics,
            r#"kiln_agent_runtime_memory_reads_total{result="ok"}"#,
        ),
        reads_rejected: metric(
            &metrics,
            r#"kiln_agent_runtime_memory_reads_total{result="rejected"}"#,
        ),
        read_bytes: metric(&metrics, "kiln_agent_runtime_memory_read_bytes_total"),
    };
    let run = agent.finish(Duration::from_secs(90));
    eprintln!(
        "agent finished={} in {:?}, peak RSS {} MiB, CPU {:?} over {:?}; runtime memory reads \
         {} ok, {} rejected, {} KiB copied",
        run.ok,
        run.elapsed,
        run.peak_rss_kib / 1024,
        cost.cpu,
        started.elapsed(),
        cost.reads_ok,
        cost.reads_rejected,
        cost.read_bytes / 1024,
    );
    (run, metrics, cost, meter)
}

/// What every scenario must show: the agent finished, the well-behaved pod
/// is in every full window from the first or second on, nothing was named from forged memory, and the
/// agent's cost stayed bounded.
#[track_caller]
fn assert_unharmed(run: &Finished, cost: &Cost, control: u32, meter: &CpuMeter) {
    assert!(run.ok, "the agent hung or failed: {}", run.log);
    let control_cpu = meter.used(control);
    let half = i64::try_from(cri_hostile::DRAIN_INTERVAL.as_nanos() / 2).expect("small");
    let full: Vec<i64> = run
        .windows
        .iter()
        .filter(|w| w.duration_ns >= half)
        .map(|w| cri_hostile::count_pid(w.samples.iter(), control))
        .collect();
    eprintln!(
        "control: {} samples, {} in kiln_hostile_control, per full window {full:?}",
        run.of_pid(control),
        run.named("kiln_hostile_control")
    );
    assert!(
        run.named("kiln_hostile_control") >= floor(100, control_cpu),
        "the well-behaved pod was profiled and symbolized"
    );
    // The first full window may miss the pod: on a loaded machine the
    // agent's first look at the node's pods can take longer than half a
    // window (a CI run under load 19 found [0, 21, 33, 47, 38]). From the
    // window that first profiles it, every full window must, or hostile
    // processes stalled the agent.
    let first = full.iter().position(|&n| n > 0).unwrap_or(full.len());
    assert!(
        first <= 1,
        "the well-behaved pod is profiled from the first or second full window on: {full:?}"
    );
    let judged = &full[first..];
    let per_window = floor(10, run.in_last_full_window(control_cpu));
    assert!(
        judged.len() >= 3 && judged.iter().all(|&n| n >= per_window),
        "every full window from its first profiles the well-behaved pod (at least {per_window}): \
         {full:?}"
    );
    run.last_full_window();
    let forged: Vec<&String> = run
        .samples()
        .flat_map(|s| s.frames.iter().map(|(_, f)| f))
        .filter(|f| f.contains(FORGED_MARKER))
        .collect();
    assert!(
        forged.is_empty(),
        "names read from forged memory: {:?}",
        &forged[..forged.len().min(5)]
    );
    // Bounds far above what the scenarios cost here (printed above), far
    // below what a reader that follows forged sizes or cycles would cost.
    assert!(
        cost.read_bytes < 1 << 30,
        "{} MiB read from processes' memory",
        cost.read_bytes >> 20
    );
    assert!(
        cost.reads_ok + cost.reads_rejected < 20_000_000,
        "{} reads of processes' memory",
        cost.reads_ok + cost.reads_rejected
    );
    assert!(
        cost.cpu < RUN.mul_f64(0.6),
        "the agent used {:?} of CPU in {RUN:?}",
        cost.cpu
    );
    assert!(
        run.peak_rss_kib < 256 * 1024,
        "peak RSS {} MiB",
        run.peak_rss_kib / 1024
    );
}

/// The most frequent innermost frames of `pid`'s samples (mapping,
/// function), for the report.
fn top_leaves(run: &Finished, pid: u32) -> Vec<(i64, String)> {
    let pid = pid.to_string();
    let mut leaves: std::collections::BTreeMap<String, i64> = Default::default();
    for sample in run.samples().filter(|s| s.labels.get("pid") == Some(&pid)) {
        let leaf = sample
            .frames
            .first()
            .map_or_else(String::new, |(m, f)| format!("{f} ({m})"));
        *leaves.entry(leaf).or_default() += sample.count;
    }
    let mut top: Vec<(i64, String)> = leaves.into_iter().map(|(f, n)| (n, f)).collect();
    top.sort_by(|a, b| b.cmp(a));
    top.truncate(5);
    top
}

/// Samples of `pid` whose stack holds `function`.
fn named_in(run: &Finished, pid: u32, function: &str) -> i64 {
    let pid = pid.to_string();
    run.samples()
        .filter(|s| s.labels.get("pid") == Some(&pid))
        .filter(|s| s.frames.iter().any(|(_, f)| f == function))
        .map(|s| s.count)
        .sum()
}

#[test]
fn forged_hotspot_tables_and_code_caches_cost_bounded_work_and_stop_no_other_pod() {
    if !cri_node::prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut node = PodNode::start_with_image(build_runtimes_image);
    let control = node.run("control", &["/control"]);
    let modes = [
        "endless",
        "unterminated",
        "stride",
        "segmap",
        "blob",
        "overflow",
    ];
    let jvms: Vec<(&str, u32)> = modes
        .iter()
        .map(|mode| {
            let pid = node.run(
                &format!("jvm-{mode}"),
                &["/forged/run", "/forged/libjvm.so", mode],
            );
            (*mode, pid)
        })
        .collect();
    let mut pids = vec![control];
    pids.extend(jvms.iter().map(|(_, pid)| *pid));
    let (run, metrics, cost, meter) = run_agent(&node, &pids);
    let result = |r: &str| {
        metric(
            &metrics,
            &format!(r#"kiln_agent_hotspot_processes_total{{result="{r}"}}"#),
        )
    };
    let frames = |r: &str| {
        metric(
            &metrics,
            &format!(r#"kiln_agent_hotspot_frames_total{{result="{r}"}}"#),
        )
    };
    eprintln!(
        "hotspot processes: supported {}, invalid {}, unreadable {}, missing {}; frames: \
         no_blob {}, method_unreadable {}, compiled {}, stub {}",
        result("supported"),
        result("vmstructs_invalid"),
        result("vmstructs_unreadable"),
        result("vmstructs_missing_entry"),
        frames("no_blob"),
        frames("method_unreadable"),
        frames("compiled"),
        frames("stub"),
    );
    for (mode, pid) in &jvms {
        eprintln!(
            "jvm {mode}: {} samples, {} in kiln_forged_hot; leaves {:?}",
            run.of_pid(*pid),
            named_in(&run, *pid, "kiln_forged_hot"),
            top_leaves(&run, *pid)
        );
    }
    assert_unharmed(&run, &cost, control, &meter);
    for (mode, pid) in &jvms {
        assert!(
            named_in(&run, *pid, "kiln_forged_hot") >= floor(20, meter.used(*pid)),
            "the forged JVM ({mode}) was profiled, its hot function named natively"
        );
    }
    // The three forged tables are refused when read, once each.
    assert!(
        result("vmstructs_invalid") >= 3,
        "forged tables refused: {metrics}"
    );
    // The other three pass and are read at every sample in their code cache.
    assert!(result("supported") >= 3, "forged code caches read");
    assert!(
        frames("no_blob") + frames("method_unreadable") > 0,
        "the forged code caches were looked up"
    );
}

#[test]
fn forged_python_ruby_and_v8_runtimes_cost_bounded_work_and_stop_no_other_pod() {
    if !cri_node::prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut node = PodNode::start_with_image(build_runtimes_image);
    let control = node.run("control", &["/control"]);
    let python = node.run(
        "python",
        &["/forged/run", "/forged/libpython3.13.so", "cycles"],
    );
    let ruby = node.run(
        "ruby",
        &["/forged/run", "/forged/libruby.so.3.1", "endless"],
    );
    let v8 = node.run("v8", &["/forged/run", "/forged/libnode.so.115", "garbage"]);
    let (run, metrics, cost, meter) = run_agent(&node, &[control, python, ruby, v8]);
    let series = |family: &str, r: &str| {
        metric(
            &metrics,
            &format!(r#"kiln_agent_{family}_total{{result="{r}"}}"#),
        )
    };
    eprintln!(
        "python: supported {}, stacks complete {} truncated {}, code reads ok {} unreadable {} \
         not_code {}",
        series("python_processes", "supported"),
        series("python_stacks", "complete"),
        series("python_stacks", "truncated"),
        series("python_code_reads", "ok"),
        series("python_code_reads", "unreadable"),
        series("python_code_reads", "not_code"),
    );
    eprintln!(
        "ruby: supported {}, stacks complete {} truncated {}, iseq reads ok {} unreadable {} \
         not_iseq {}",
        series("ruby_processes", "supported"),
        series("ruby_stacks", "complete"),
        series("ruby_stacks", "truncated"),
        series("ruby_iseq_reads", "ok"),
        series("ruby_iseq_reads", "unreadable"),
        series("ruby_iseq_reads", "not_iseq"),
    );
    eprintln!(
        "v8: out of range {}, missing {}, supported {}",
        series("v8_processes", "constant_out_of_range"),
        series("v8_processes", "missing_constant"),
        series("v8_processes", "supported"),
    );
    for (what, pid, hot) in [
        ("python", python, "_PyEval_EvalFrameDefault"),
        ("ruby", ruby, "rb_vm_exec"),
        ("v8", v8, "kiln_forged_hot"),
    ] {
        eprintln!(
            "{what}: {} samples, {} in {hot}; leaves {:?}",
            run.of_pid(pid),
            named_in(&run, pid, hot),
            top_leaves(&run, pid)
        );
    }
    assert_unharmed(&run, &cost, control, &meter);
    for (what, pid, hot) in [
        ("python", python, "_PyEval_EvalFrameDefault"),
        ("ruby", ruby, "rb_vm_exec"),
        ("v8", v8, "kiln_forged_hot"),
    ] {
        assert!(
            named_in(&run, pid, hot) >= floor(20, meter.used(pid)),
            "the forged {what} runtime was profiled, its hot function named natively"
        );
    }
    assert_eq!(
        series("v8_processes", "supported"),
        0,
        "garbage constants are refused"
    );
}

#[test]
fn code_unloaded_under_the_agent_costs_bounded_work_and_stops_no_other_pod() {
    if !cri_node::prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut node = PodNode::start_with_image(build_runtimes_image);
    let control = node.run("control", &["/control"]);
    let jit = node.run("jit-churn", &["/jit_churn"]);
    let dl = node.run(
        "dlopen-churn",
        &["/forged/run", "churn", "/churn/a.so", "/churn/b.so"],
    );
    let (run, _metrics, cost, meter) = run_agent(&node, &[control, jit, dl]);
    let jit_named =
        named_in(&run, jit, "kiln_jit_churn_a") + named_in(&run, jit, "kiln_jit_churn_b");
    let dl_named = named_in(&run, dl, "kiln_churn_hot");
    eprintln!(
        "jit churn: {} samples, {jit_named} named from its perf map; dlopen churn: {} samples, \
         {dl_named} in kiln_churn_hot",
        run.of_pid(jit),
        run.of_pid(dl),
    );
    eprintln!(
        "jit churn leaves {:?}\ndlopen churn leaves {:?}",
        top_leaves(&run, jit),
        top_leaves(&run, dl)
    );
    assert_unharmed(&run, &cost, control, &meter);
    assert!(
        run.of_pid(jit) >= floor(50, meter.used(jit)),
        "the JIT churner was profiled"
    );
    // Its code is in no mapping of the snapshot half the time (read while
    // the other place was mapped): named from the perf map all the same
    // (measured here: 98 %, 51 % when only mapped code was looked up).
    assert!(
        jit_named >= floor(20, meter.used(jit)) && jit_named * 4 >= run.of_pid(jit) * 3,
        "its code was named from its perf map: {jit_named} of {}",
        run.of_pid(jit)
    );
    assert!(
        run.of_pid(dl) >= floor(50, meter.used(dl)),
        "the dlopen churner was profiled"
    );
    assert!(
        dl_named >= floor(20, meter.used(dl)),
        "the unloaded library's function was named"
    );
}
