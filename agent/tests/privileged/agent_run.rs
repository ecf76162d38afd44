//! Helpers of the privileged agent tests: prerequisites (root, BTF, gcc),
//! workloads, running the real agent binary, and flattening the pprof it
//! writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kiln_pprof::{DecodeLimits, Profile};
use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kiln_testkit::process::KillOnDrop;

/// Whether the privileged prerequisites hold; panics in CI when not.
#[track_caller]
pub fn privileged_prerequisites() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let btf = Path::new("/sys/kernel/btf/vmlinux").is_file();
    let gcc = Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let problem = if !root {
        Some("must run as root (BPF programs and perf events)")
    } else if !btf {
        Some("the kernel exposes no BTF at /sys/kernel/btf/vmlinux")
    } else if !gcc {
        Some("gcc is not installed (./kiln-dev installs build-essential)")
    } else {
        None
    };
    match problem {
        None => true,
        Some(problem) if in_ci() => panic!("privileged agent test cannot run in CI: {problem}"),
        Some(problem) => {
            visible_skip(&format!("privileged agent test: {problem}"));
            false
        }
    }
}

/// Compiles a workload with frame pointers everywhere (see
/// ../shared/research/ebpf-notes.md on leaf functions and tail calls).
#[track_caller]
pub fn build_workload(source: &str, output: &Path) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(source);
    let status = Command::new("gcc")
        .args([
            "-O1",
            "-fno-omit-frame-pointer",
            "-mno-omit-leaf-frame-pointer",
            "-fno-optimize-sibling-calls",
            "-fno-ipa-icf",
            "-o",
        ])
        .arg(output)
        .arg(&source)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed on {}", source.display());
}

pub fn spawn(program: &Path, args: &[&str]) -> KillOnDrop {
    KillOnDrop(
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("workload starts"),
    )
}

/// Runs the agent to completion with `args` plus an output directory, and
/// returns the decoded profiles it wrote.
#[track_caller]
pub fn run_agent(args: &[&str], output_dir: &Path) -> Vec<Profile> {
    let output = Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
        .args(args)
        .arg("--output-dir")
        .arg(output_dir)
        .args(["--metrics-addr", "off"])
        .output()
        .expect("agent runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "agent failed: {stderr}");
    let profiles = read_profiles(output_dir);
    assert!(
        !profiles.is_empty(),
        "agent wrote no profiles; stderr: {stderr}"
    );
    profiles
}

/// The decoded profiles the agent wrote into `output_dir`.
#[track_caller]
pub fn read_profiles(output_dir: &Path) -> Vec<Profile> {
    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(output_dir).expect("output dir") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "gz") {
            let bytes = std::fs::read(&path).expect("profile readable");
            let profile = kiln_pprof::decode(&bytes, &DecodeLimits::default())
                .unwrap_or_else(|e| panic!("{} is not a valid pprof: {e}", path.display()));
            profiles.push(profile);
        }
    }
    profiles
}

/// What one agent run against one process counted and wrote.
pub struct ScrapedRun {
    /// Its `/metrics`, scraped while it ran.
    pub metrics: String,
    /// The profiles it wrote.
    pub profiles: Vec<Profile>,
}

/// Runs the agent against `pid` at 99 Hz for 10 s (3 s windows) with its
/// metrics endpoint on, and scrapes the endpoint while it runs, until the
/// text holds `wanted` or the agent ends. Polled rather than read at a set
/// time: on a busy machine the agent starts, and reads the process, late.
#[track_caller]
pub fn run_agent_scraped(pid: u32, output_dir: &Path, wanted: &str) -> ScrapedRun {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let pid = pid.to_string();
    let mut agent = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
            .args(["--pid", pid.as_str(), "--frequency", "99"])
            .args(["--drain-interval", "3s", "--duration", "10s"])
            .arg("--output-dir")
            .arg(output_dir)
            .args(["--metrics-addr", metrics_addr.as_str()])
            .stderr(Stdio::null())
            .spawn()
            .expect("agent starts"),
    );
    let mut metrics = String::new();
    let status = loop {
        if let Some(status) = agent.0.try_wait().expect("agent status") {
            break status;
        }
        let text = scrape(&metrics_addr);
        if !text.is_empty() {
            metrics = text;
        }
        if metrics.contains(wanted) {
            break agent.0.wait().expect("agent exits");
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(status.success(), "agent failed: {status}");
    ScrapedRun {
        metrics,
        profiles: read_profiles(output_dir),
    }
}

/// The agent's `/metrics` text at `addr`; empty when it does not answer.
pub fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

/// The value of the first series of `metrics` named `name` whose labels
/// hold `label` (such as `result="unsupported_version"`); 0 when none.
pub fn metric_value(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// How long a test may keep sampling to collect the samples it needs: many
/// times each test's nominal window. The agent samples on-CPU stacks, so a
/// workload that gets less CPU on a busy machine yields fewer samples per
/// second; the test then takes longer, but judges as many samples as on an
/// idle machine, and fails only if they do not come at all.
pub const SAMPLING_DEADLINE: Duration = Duration::from_secs(120);

/// The samples in `profiles` (the sum of the first value, the sample count).
pub fn sample_count(profiles: &[Profile]) -> i64 {
    profiles
        .iter()
        .flat_map(|p| p.samples())
        .map(|s| s.value[0])
        .sum()
}

/// [`run_agent`] round after round, each round writing under its own
/// directory in `output_dir`, until the profiles hold at least `min_samples`
/// samples or `deadline` has passed since the first round began; returns
/// the profiles of every round. `args` carry the agent's `--duration`, the
/// length of one round.
#[track_caller]
pub fn run_agent_for_samples(
    args: &[&str],
    output_dir: &Path,
    min_samples: i64,
    deadline: Duration,
) -> Vec<Profile> {
    let began = Instant::now();
    let mut profiles = Vec::new();
    for round in 0.. {
        profiles.extend(run_agent(args, &output_dir.join(format!("round-{round}"))));
        let so_far = sample_count(&profiles);
        eprintln!(
            "round {round}: {so_far} samples after {:?}",
            began.elapsed()
        );
        if so_far >= min_samples || began.elapsed() >= deadline {
            break;
        }
    }
    profiles
}

/// One sample flattened: its count, labels and frames (leaf first) as
/// `(mapping file name, function name or "")`.
pub struct FlatSample {
    pub count: i64,
    /// The sample's CPU time: its count times the profile's period.
    pub cpu_ns: i64,
    pub labels: BTreeMap<String, String>,
    pub frames: Vec<(String, String)>,
}

pub fn flatten(profiles: &[Profile]) -> Vec<FlatSample> {
    let mut flat = Vec::new();
    for profile in profiles {
        assert_eq!(profile.string(profile.sample_types()[0].r#type), "samples");
        assert_eq!(profile.string(profile.sample_types()[1].r#type), "cpu");
        assert_eq!(
            profile.string(profile.sample_types()[1].unit),
            "nanoseconds"
        );
        for sample in profile.samples() {
            let labels = sample
                .label
                .iter()
                .map(|l| {
                    (
                        profile.string(l.key).to_owned(),
                        profile.string(l.str).to_owned(),
                    )
                })
                .collect();
            let frames = sample
                .location_id
                .iter()
                .map(|&id| {
                    let location = profile.location(id).expect("location exists");
                    let mapping = profile
                        .mapping(location.mapping_id)
                        .map(|m| profile.string(m.filename).to_owned())
                        .unwrap_or_default();
                    let function = location
                        .line
                        .first()
                        .and_then(|line| profile.function(line.function_id))
                        .map(|f| profile.string(f.name).to_owned())
                        .unwrap_or_default();
                    (mapping, function)
                })
                .collect();
            flat.push(FlatSample {
                count: sample.value[0],
                cpu_ns: sample.value[1],
                labels,
                frames,
            });
        }
    }
    flat
}

pub fn inclusive_count(samples: &[FlatSample], function: &str) -> i64 {
    samples
        .iter()
        .filter(|s| s.frames.iter().any(|(_, f)| f == function))
        .map(|s| s.count)
        .sum()
}

pub fn canonical(path: &Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| PathBuf::from(path))
        .display()
        .to_string()
}
