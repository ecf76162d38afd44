//! Privileged integration tests: the real agent binary samples real
//! workloads on the real kernel and writes pprof files that are checked.
//!
//! They need root (BPF and perf events). In CI (`CI=true`) a missing
//! prerequisite fails the test; elsewhere it prints why it is skipped.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kiln_testkit::process::KillOnDrop;

use crate::SERIAL;
use crate::agent_run::{
    FlatSample, build_workload, canonical, flatten, inclusive_count, privileged_prerequisites,
    run_agent, run_agent_for_samples, spawn,
};
use kiln_pprof::DecodeLimits;

/// The issue-4 acceptance test: two hot functions in a 3:1 CPU ratio are
/// named in the profile with the ratio within ±5 %, and nothing from another
/// busy process (a decoy running the same code) leaks in.
#[test]
fn pid_mode_names_both_hot_functions_in_their_cpu_ratio_and_nothing_else() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let target_exe = dir.path().join("hot_ratio");
    let decoy_exe = dir.path().join("decoy_ratio");
    build_workload("hot_ratio.c", &target_exe);
    build_workload("hot_ratio.c", &decoy_exe);
    let target = spawn(&target_exe, &[]);
    // The decoy is niced so it takes little CPU from the target.
    let _decoy = KillOnDrop(
        Command::new("nice")
            .args(["-n", "19"])
            .arg(&decoy_exe)
            .stdout(Stdio::null())
            .spawn()
            .expect("decoy starts"),
    );
    let pid = target.0.id().to_string();

    // ±5 % on a 3:1 ratio needs about 20 000 samples (ebpf-notes.md): the
    // ratio's relative error is then about 1.5 %. Other load on the machine
    // slows the target down, so sample in 30 s rounds until there are enough
    // (an idle core gives them in one), within ten rounds' time.
    let args = [
        "--pid",
        &pid,
        "--frequency",
        "999",
        "--drain-interval",
        "10s",
        "--duration",
        "30s",
    ];
    let deadline = Duration::from_secs(300);
    let profiles = run_agent_for_samples(&args, &dir.path().join("profiles"), 20_000, deadline);
    let samples = flatten(&profiles);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    let three = inclusive_count(&samples, "hot_three_parts");
    let one = inclusive_count(&samples, "hot_one_part");
    eprintln!("samples: total {total}, hot_three_parts {three}, hot_one_part {one}");
    assert!(
        total >= 20_000,
        "too few samples ({total}) to check a ratio within {deadline:?}"
    );
    assert!(one > 0, "hot_one_part never sampled");
    let ratio = three as f64 / one as f64;
    assert!(
        (2.85..=3.15).contains(&ratio),
        "hot_three_parts:hot_one_part = {ratio:.3}, want 3 ± 5 %"
    );
    let named = three + one;
    assert!(
        named as f64 >= 0.95 * total as f64,
        "only {named} of {total} samples are in the hot functions"
    );

    let target_path = canonical(&target_exe);
    let decoy_path = canonical(&decoy_exe);
    let mut files = HashSet::new();
    for sample in &samples {
        assert_eq!(
            sample.labels.get("pid"),
            Some(&pid),
            "sample of another process"
        );
        assert_eq!(
            sample.labels.get("comm").map(String::as_str),
            Some("hot_ratio")
        );
        assert!(sample.labels.contains_key("node"));
        for (file, _) in &sample.frames {
            assert_ne!(
                file, &decoy_path,
                "a decoy frame leaked into the target's profile"
            );
            files.insert(file.clone());
        }
    }
    assert!(
        files.contains(&target_path),
        "no frame maps to {target_path}: {files:?}"
    );

    // Mappings carry the build id of the executable.
    let readelf = Command::new("readelf").arg("-n").arg(&target_exe).output();
    if let Ok(readelf) = readelf {
        let notes = String::from_utf8_lossy(&readelf.stdout);
        if let Some(build_id) = notes
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))
        {
            let has_build_id = profiles.iter().any(|p| {
                p.mappings()
                    .iter()
                    .any(|m| p.string(m.build_id) == build_id.trim())
            });
            assert!(has_build_id, "no mapping carries build id {build_id}");
        }
    }
    // The period is the CPU time per sample at 999 Hz.
    assert_eq!(profiles[0].period(), 1_000_000_000 / 999);
}

/// Kernel frames are named from kallsyms, under the user function that
/// made the syscall.
#[test]
fn kernel_frames_of_a_syscall_heavy_process_are_symbolized() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = dir.path().join("syscall_loop");
    build_workload("syscall_loop.c", &exe);
    let workload = spawn(&exe, &[]);
    let pid = workload.0.id().to_string();
    let out = dir.path().join("profiles");
    let profiles = run_agent(
        &[
            "--pid",
            &pid,
            "--frequency",
            "499",
            "--drain-interval",
            "5s",
            "--duration",
            "8s",
        ],
        &out,
    );
    let samples = flatten(&profiles);
    let with_kernel: Vec<&FlatSample> = samples
        .iter()
        .filter(|s| {
            s.frames
                .iter()
                .any(|(m, f)| m == "[kernel.kallsyms]" && !f.is_empty())
        })
        .collect();
    assert!(!with_kernel.is_empty(), "no symbolized kernel frame");
    let syscall_path = with_kernel.iter().any(|s| {
        let kernel_entry = s.frames.iter().any(|(m, f)| {
            m == "[kernel.kallsyms]" && (f.contains("syscall") || f.contains("sys_getppid"))
        });
        let user_caller = s.frames.iter().any(|(_, f)| f == "syscall_heavy_loop");
        kernel_entry && user_caller
    });
    assert!(
        syscall_path,
        "no stack with a kernel syscall frame under syscall_heavy_loop"
    );
}

/// cgroup targeting: only the process moved into the target cgroup is
/// sampled, though an identical process runs outside it.
#[test]
fn cgroup_mode_samples_only_processes_in_the_target_cgroup() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Hybrid hosts (like CI) mount cgroup2 at /sys/fs/cgroup/unified.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let Some(root) = kiln_cri::cgroup::cgroup2_mount(&mountinfo) else {
        if in_ci() {
            panic!("no cgroup2 mount on this host");
        }
        visible_skip("no cgroup2 mount");
        return;
    };
    let cgroup = root.join(format!("kiln-agent-test-{}", std::process::id()));
    if let Err(error) = std::fs::create_dir(&cgroup) {
        if in_ci() {
            panic!("cannot create cgroup {}: {error}", cgroup.display());
        }
        eprintln!(
            "skipping: cannot create cgroup {}: {error}",
            cgroup.display()
        );
        return;
    }
    // Declared before the workloads, so it drops after they are killed.
    let _remove_cgroup = RemoveCgroup(cgroup.clone());
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = dir.path().join("hot_ratio");
    build_workload("hot_ratio.c", &exe);
    let inside = spawn(&exe, &[]);
    let outside = spawn(&exe, &[]);
    std::fs::write(cgroup.join("cgroup.procs"), inside.0.id().to_string())
        .expect("move into cgroup");
    let out = dir.path().join("profiles");
    let profiles = run_agent(
        &[
            "--cgroup",
            cgroup.to_str().expect("utf-8 path"),
            "--frequency",
            "199",
            "--drain-interval",
            "3s",
            "--duration",
            "6s",
        ],
        &out,
    );
    let samples = flatten(&profiles);
    let inside_pid = inside.0.id().to_string();
    let outside_pid = outside.0.id().to_string();
    assert!(
        samples
            .iter()
            .any(|s| s.labels.get("pid") == Some(&inside_pid))
    );
    assert!(
        samples
            .iter()
            .all(|s| s.labels.get("pid") != Some(&outside_pid)),
        "a process outside the cgroup was sampled"
    );
}

/// Removes a test cgroup (which must be empty by then).
struct RemoveCgroup(PathBuf);

impl Drop for RemoveCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// GETs `/metrics` from the agent, `None` while it is not serving yet.
fn fetch_metrics(address: std::net::SocketAddr) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect_timeout(&address, std::time::Duration::from_secs(2)).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.starts_with("HTTP/1.1 200").then(|| {
        response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
    })?
}

fn metric_value(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Short-lived processes: one that runs and exits between two drains is
/// still symbolized, because the kernel announces its first sample and the
/// agent reads `/proc/PID/maps` while it lives. Meanwhile `/metrics` reports
/// samples, BPF run time and RSS.
#[test]
fn a_process_that_exits_before_the_drain_is_still_symbolized_and_metrics_are_served() {
    if !privileged_prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = dir.path().join("short_lived");
    build_workload("hot_ratio.c", &exe);
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|probe| probe.local_addr())
        .expect("free port");
    let out = dir.path().join("profiles");
    let mut agent = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
            .args(["--all", "--frequency", "199", "--drain-interval", "10m"])
            .arg("--metrics-addr")
            .arg(address.to_string())
            .arg("--output-dir")
            .arg(&out)
            .stderr(Stdio::null())
            .spawn()
            .expect("agent starts"),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while fetch_metrics(address).is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "/metrics never came up"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    // 10 rounds of 30 + 10 ms of CPU, then exit; the drain comes later.
    let short = Command::new(&exe)
        .args(["30", "10", "10"])
        .spawn()
        .expect("short-lived process starts");
    let short_pid = short.id().to_string();
    let status = short
        .wait_with_output()
        .expect("short-lived process runs")
        .status;
    assert!(status.success());

    // Kernel counters reach /metrics every couple of seconds.
    let names = [
        "kiln_agent_samples_total",
        "kiln_agent_bpf_runs_total",
        "kiln_agent_bpf_run_time_ns_total",
        "kiln_agent_resident_memory_bytes",
    ];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let body = loop {
        let body = fetch_metrics(address).expect("/metrics answers");
        let all_positive = names
            .iter()
            .all(|name| metric_value(&body, name).is_some_and(|v| v > 0.0));
        if all_positive {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "metrics stayed at zero: {body}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(body.contains("kiln_agent_dropped_total"), "{body}");

    // SAFETY: kill sends a signal to our own child; no memory is involved.
    let signalled = unsafe { libc::kill(agent.0.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(signalled, 0);
    let exit = agent.0.wait().expect("agent exits");
    assert!(exit.success(), "agent exited with {exit}");

    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(&out).expect("profiles written") {
        let bytes = std::fs::read(entry.expect("dir entry").path()).expect("readable");
        profiles.push(kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("valid pprof"));
    }
    let samples = flatten(&profiles);
    let short_samples: Vec<&FlatSample> = samples
        .iter()
        .filter(|s| s.labels.get("pid") == Some(&short_pid))
        .collect();
    assert!(
        !short_samples.is_empty(),
        "the short-lived process was not sampled"
    );
    assert!(
        short_samples
            .iter()
            .any(|s| s.frames.iter().any(|(_, f)| f == "hot_three_parts")),
        "the exited process's frames were not symbolized"
    );
    assert!(
        short_samples
            .iter()
            .all(|s| s.labels.get("comm").map(String::as_str) == Some("short_lived"))
    );
}
