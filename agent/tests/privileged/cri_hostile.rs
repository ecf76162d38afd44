//! The machinery of the hostile-pod tests: an image holding the hostile
//! workloads, opted-in pods running them on a real containerd, the real
//! agent in Kubernetes (CRI) mode with its `/metrics`, and its profiles read
//! back window by window. Uses the test crate's `node` and `agent_run`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kiln_cri::CriClient;
use kiln_cri::inventory::ContainerDetails;
use kiln_cri::runtime::v1::{ContainerFilter, ContainerStatusRequest, ListContainersRequest};
use kiln_pprof::DecodeLimits;

use crate::agent_run::{FlatSample, flatten};
use crate::cri_node::{Containerd, Pod, connect, create_pod_running, remove_pod};

pub const NAMESPACE: &str = "kiln-hostile";

/// How often the agent drains in these tests.
pub const DRAIN_INTERVAL: Duration = Duration::from_secs(3);

/// Compiles a test workload statically (the image has no libc), with
/// frame pointers.
pub fn compile_static(source: &str, output: &Path, extra: &[&str]) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(source);
    let status = Command::new("gcc")
        .args(["-static", "-fno-omit-frame-pointer"])
        .args(extra)
        .arg("-o")
        .arg(output)
        .arg(&source)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed on {}", source.display());
}

/// The image: busybox, `/control` (the well-behaved spinner), `/jit`,
/// `/fork_storm`, `/many_mappings`, and `/huge_base`, the program the ELF
/// scenario inflates (built differently from `/control`, so its build id,
/// the symbol cache's key, differs).
fn build_hostile_image(work: &Path) -> PathBuf {
    crate::cri_node::build_image_with(work, |rootfs| {
        std::fs::create_dir_all(rootfs.join("tmp")).expect("rootfs /tmp");
        compile_static("control_spin.c", &rootfs.join("control"), &["-O2"]);
        compile_static("jit_spin.c", &rootfs.join("jit"), &["-O1"]);
        compile_static("fork_storm.c", &rootfs.join("fork_storm"), &["-O1"]);
        compile_static("many_mappings.c", &rootfs.join("many_mappings"), &["-O1"]);
        compile_static("control_spin.c", &rootfs.join("huge_base"), &["-O1"]);
    })
}

/// A containerd with the hostile image, and the pods started on it
/// (removed on drop, before containerd is).
pub struct PodNode {
    pods: Vec<Pod>,
    client: CriClient,
    rt: tokio::runtime::Runtime,
    pub containerd: Containerd,
    pub work: tempfile::TempDir,
}

impl PodNode {
    /// A node with the hostile image.
    pub fn start() -> PodNode {
        PodNode::start_with_image(build_hostile_image)
    }

    /// A node with the image `build` makes in the directory it is given
    /// (returning the image archive).
    pub fn start_with_image(build: impl FnOnce(&Path) -> PathBuf) -> PodNode {
        let work = tempfile::tempdir().expect("temp dir");
        let archive = build(&work.path().join("image"));
        let containerd = Containerd::start(&work.path().join("containerd"));
        containerd.import(&archive);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let client = rt.block_on(connect(&containerd.socket));
        PodNode {
            pods: Vec::new(),
            client,
            rt,
            containerd,
            work,
        }
    }

    /// Starts an opted-in pod running `command` and returns the host PID
    /// of its container's first process (PID 1 in the pod).
    pub fn run(&mut self, name: &str, command: &[&str]) -> u32 {
        let command: Vec<String> = command.iter().map(|s| (*s).to_owned()).collect();
        let dir = self.containerd.dir.clone();
        let client = &mut self.client;
        let (pod, pid) = self.rt.block_on(async {
            let pod = create_pod_running(
                client,
                &dir,
                NAMESPACE,
                name,
                &command,
                &[("profiles.kiln.dev/enabled", "true")],
            )
            .await;
            let pid = container_pid(client, &pod).await;
            (pod, pid)
        });
        self.pods.push(pod);
        pid
    }
}

impl Drop for PodNode {
    fn drop(&mut self) {
        let client = &mut self.client;
        let pods = std::mem::take(&mut self.pods);
        self.rt.block_on(async {
            for pod in &pods {
                remove_pod(client, pod).await;
            }
        });
    }
}

/// The host PID of the pod's container, from the verbose status.
async fn container_pid(client: &mut CriClient, pod: &Pod) -> u32 {
    let containers = client
        .runtime()
        .list_containers(ListContainersRequest {
            filter: Some(ContainerFilter {
                pod_sandbox_id: pod.sandbox_id.clone(),
                ..ContainerFilter::default()
            }),
        })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    let id = containers.first().expect("the pod's container").id.clone();
    let status = client
        .runtime()
        .container_status(ContainerStatusRequest {
            container_id: id,
            verbose: true,
        })
        .await
        .expect("ContainerStatus")
        .into_inner();
    ContainerDetails::from_status_info(&status.info)
        .pid
        .expect("the runtime reports the container's PID")
}

/// The CPU time `pid` has used so far, user and system (0 once it is gone).
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which may hold spaces and ends at
    // the last ')': utime and stime, fields 14 and 15, are the 12th and 13th.
    let ticks: u64 = stat.rsplit_once(')').map_or(0, |(_, rest)| {
        rest.split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|field| field.parse::<u64>().ok())
            .sum()
    });
    // SAFETY: sysconf has no preconditions.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    Duration::from_nanos(ticks * (1_000_000_000 / per_second))
}

/// `wanted` samples, or fewer when the process got too little CPU for them:
/// a quarter of what `cpu` of CPU time gives at the agent's 99 Hz. On an
/// idle machine the pods get the CPU for `wanted`; on a busy one they get
/// less, and fewer samples prove the same, that the agent profiles them.
pub fn floor(wanted: i64, cpu: Duration) -> i64 {
    let possible = cpu.as_secs_f64() * 99.0;
    wanted.min((possible / 4.0) as i64).max(1)
}

/// The CPU time processes use from the moment it starts.
pub struct CpuMeter(Vec<(u32, Duration)>);

impl CpuMeter {
    pub fn start(pids: &[u32]) -> CpuMeter {
        CpuMeter(pids.iter().map(|&pid| (pid, cpu_time(pid))).collect())
    }

    /// The CPU time `pid`, one of the meter's, has used since the start.
    pub fn used(&self, pid: u32) -> Duration {
        let before = self
            .0
            .iter()
            .find(|(p, _)| *p == pid)
            .map_or(Duration::ZERO, |(_, before)| *before);
        cpu_time(pid).saturating_sub(before)
    }
}

/// Waits up to `limit` for `path` to exist.
#[track_caller]
pub fn wait_for(path: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The real agent in Kubernetes mode against the node's containerd.
pub struct AgentRun {
    child: Option<Child>,
    pub metrics: SocketAddr,
    pub out: PathBuf,
    log: PathBuf,
}

/// The targets file the agent reads, in the node's work directory: absent
/// (no `ProfilingTarget`) unless a test writes it.
pub const TARGETS_FILE: &str = "targets.json";

/// Starts the agent for `duration`, draining every [`DRAIN_INTERVAL`],
/// with `/metrics` on a free loopback port and `extra` flags (99 Hz unless
/// they give a `--frequency`).
pub fn start_agent(node: &PodNode, duration: Duration, extra: &[&str]) -> AgentRun {
    let metrics = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let out = node.work.path().join("profiles");
    let log = node.work.path().join("agent.log");
    let child = Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
        .arg("--cri-socket")
        .arg(&node.containerd.socket)
        .args(["--node-name", "hostile-node"])
        .args(if extra.contains(&"--frequency") {
            &[][..]
        } else {
            &["--frequency", "99"][..]
        })
        .arg("--drain-interval")
        .arg(format!("{}s", DRAIN_INTERVAL.as_secs()))
        .arg("--duration")
        .arg(format!("{}s", duration.as_secs()))
        .args(["--resync-interval", "1s", "--metrics-addr"])
        .arg(metrics.to_string())
        .arg("--targets-file")
        .arg(node.work.path().join(TARGETS_FILE))
        .arg("--output-dir")
        .arg(&out)
        .args(extra)
        .env("KILN_LOG", "kiln_agent=info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("agent log"))
        .spawn()
        .expect("agent starts");
    AgentRun {
        child: Some(child),
        metrics,
        out,
        log,
    }
}

/// What a finished agent left.
pub struct Finished {
    /// Exited successfully within the limit.
    pub ok: bool,
    pub peak_rss_kib: i64,
    pub elapsed: Duration,
    pub log: String,
    /// Windows in time order.
    pub windows: Vec<Window>,
}

/// The profiles of one drain window.
pub struct Window {
    pub start_ns: i64,
    pub duration_ns: i64,
    pub samples: Vec<FlatSample>,
}

impl AgentRun {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// A GET of the agent's metrics endpoint: (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        use std::io::{Read as _, Write as _};
        let Ok(mut stream) = TcpStream::connect(self.metrics) else {
            return (0, String::new());
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        // One write: the agent's server reads the request with one read.
        let request = format!("GET {path} HTTP/1.1\r\nConnection: close\r\n\r\n");
        let _ = stream.write_all(request.as_bytes());
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    /// Waits for the agent to exit (killing it after `limit`) and reads
    /// back its log and profiles.
    pub fn finish(mut self, limit: Duration) -> Finished {
        let mut child = self.child.take().expect("running");
        let (ok, peak_rss_kib, elapsed) = wait_with_rusage(&mut child, limit);
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut windows: Vec<Window> = Vec::new();
        for entry in std::fs::read_dir(&self.out).into_iter().flatten() {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "gz") {
                continue;
            }
            let bytes = std::fs::read(&path).expect("readable");
            let profile = kiln_pprof::decode(&bytes, &DecodeLimits::default())
                .unwrap_or_else(|e| panic!("{} is not a valid pprof: {e}", path.display()));
            let samples = flatten(std::slice::from_ref(&profile));
            match windows
                .iter_mut()
                .find(|w| w.start_ns == profile.time_nanos())
            {
                Some(window) => window.samples.extend(samples),
                None => windows.push(Window {
                    start_ns: profile.time_nanos(),
                    duration_ns: profile.duration_nanos(),
                    samples,
                }),
            }
        }
        windows.sort_by_key(|w| w.start_ns);
        Finished {
            ok,
            peak_rss_kib,
            elapsed,
            log,
            windows,
        }
    }
}

impl Drop for AgentRun {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The value of an unlabelled metric, or of a labelled series given whole
/// (`kiln_agent_dropped_total{reason="..."}`); 0 when absent.
pub fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .find_map(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

impl Finished {
    pub fn samples(&self) -> impl Iterator<Item = &FlatSample> {
        self.windows.iter().flat_map(|w| &w.samples)
    }

    /// Samples of the process with host PID `pid`.
    pub fn of_pid(&self, pid: u32) -> i64 {
        count_pid(self.samples(), pid)
    }

    /// Samples with `function` on their stack.
    pub fn named(&self, function: &str) -> i64 {
        self.samples()
            .filter(|s| s.frames.iter().any(|(_, f)| f == function))
            .map(|s| s.count)
            .sum()
    }

    /// The last window that covers a whole drain interval (the one drained
    /// at shutdown may be a moment long), checked to be at the end of the
    /// run, not an earlier one left as the last because later drains
    /// stopped.
    #[track_caller]
    pub fn last_full_window(&self) -> &Window {
        let half = i64::try_from(DRAIN_INTERVAL.as_nanos() / 2).expect("small");
        let end = |w: &Window| w.start_ns + w.duration_ns;
        let last_end = self.windows.iter().map(end).max().expect("windows");
        let window = self
            .windows
            .iter()
            .rev()
            .find(|w| w.duration_ns >= half)
            .expect("a full window");
        assert!(
            end(window) >= last_end - 2 * half,
            "the last full window ends {} ms before the run",
            (last_end - end(window)) / 1_000_000
        );
        window
    }

    /// The part of `cpu`, used over the whole run, that falls in the last
    /// full window, taking the pace as even.
    pub fn in_last_full_window(&self, cpu: Duration) -> Duration {
        let first = self.windows.iter().map(|w| w.start_ns).min().unwrap_or(0);
        let last_end = self
            .windows
            .iter()
            .map(|w| w.start_ns + w.duration_ns)
            .max()
            .unwrap_or(0);
        let span = (last_end - first).max(1) as f64;
        cpu.mul_f64((self.last_full_window().duration_ns as f64 / span).min(1.0))
    }

    /// Samples of `pid` per window, for the report.
    pub fn per_window(&self, pid: u32) -> Vec<i64> {
        self.windows
            .iter()
            .map(|w| count_pid(w.samples.iter(), pid))
            .collect()
    }
}

pub fn count_pid<'a>(samples: impl Iterator<Item = &'a FlatSample>, pid: u32) -> i64 {
    let pid = pid.to_string();
    samples
        .filter(|s| s.labels.get("pid") == Some(&pid))
        .map(|s| s.count)
        .sum()
}

/// Waits for `child` with `wait4`, so its own peak RSS comes back; kills it
/// after `limit`. Returns (exited successfully, peak RSS KiB, elapsed).
pub fn wait_with_rusage(child: &mut Child, limit: Duration) -> (bool, i64, Duration) {
    let start = Instant::now();
    let pid = i32::try_from(child.id()).expect("pid");
    loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value to overwrite.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 on our own child with valid out-pointers.
        let waited = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if waited == pid {
            let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
            return (ok, usage.ru_maxrss, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return (false, 0, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How long a slow agent may lag behind the windows due before the check
/// calls it stalled. A loaded CI machine symbolizing 60,000 mappings can
/// finish a window seconds late; a stalled agent never catches up.
const DRAIN_GRACE: Duration = Duration::from_secs(30);

/// Checks, while the agent runs, that it is alive and still draining:
/// `/healthz` answers 200 and every window due since `started` (but the
/// one in progress) is drained, within [`DRAIN_GRACE`] of the check.
/// Returns the `/metrics` text.
#[track_caller]
pub fn assert_draining(agent: &AgentRun, started: Instant) -> String {
    let (status, body) = agent.get("/healthz");
    assert_eq!(status, 200, "the agent's liveness: {body}");
    let due = started.elapsed().as_secs() / DRAIN_INTERVAL.as_secs();
    let checked = Instant::now();
    loop {
        let (status, metrics) = agent.get("/metrics");
        assert_eq!(
            status,
            200,
            "the agent's /metrics, {:?} into the check for {due} due windows",
            checked.elapsed()
        );
        assert_eq!(metric(&metrics, "kiln_agent_collector_stalled"), 0);
        let windows = metric(&metrics, "kiln_agent_windows_total");
        if windows + 1 >= due {
            if checked.elapsed() > Duration::from_secs(1) {
                eprintln!("the agent caught up {:?} late", checked.elapsed());
            }
            return metrics;
        }
        assert!(
            checked.elapsed() < DRAIN_GRACE,
            "{windows} windows drained, {due} due, and no catching up in {DRAIN_GRACE:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The path of the perf map the agent looks for: `/tmp/perf-<PID>.map`
/// in the process's own root, under the PID the process knows itself by.
pub fn perf_map_path(host_pid: u32) -> PathBuf {
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).expect("status");
    let ns_pid = status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .and_then(|pids| pids.split_whitespace().last())
        .expect("NSpid");
    PathBuf::from(format!("/proc/{host_pid}/root/tmp/perf-{ns_pid}.map"))
}
