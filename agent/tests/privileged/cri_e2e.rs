//! End to end on a real containerd (Debian's, started by the test on its own
//! socket): pods created through CRI as kubelet would, the real `kiln-agent`
//! in Kubernetes mode, a real `kiln-store`, and queries by pod labels.
//!
//! Needs root, containerd, runc, gcc with a static libc and kernel BTF. In CI
//! (`CI=true`) a missing prerequisite fails; elsewhere the tests print a skip.
//! The 50-pod churn measurement is `#[ignore]`d (it is a benchmark, see
//! docs/benchmarks.md, row `k8s-agent.churn`):
//! `cargo test -p kiln-agent --test privileged cri_e2e:: -- --ignored --nocapture`.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kiln_agent::cri_discovery::{KubernetesConfig, KubernetesTargets, run_discovery};
use kiln_agent::target_set::{TargetSet, TargetSource as _};
use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kiln_testkit::process::KillOnDrop;

use crate::SERIAL;
use crate::cri_node::{self, Containerd, connect, create_pod, remove_pod};

const NAMESPACE: &str = "kiln-e2e";

/// `kiln-store` next to this test's binary; `cargo test --workspace` builds it.
fn store_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let candidate = exe.parent()?.parent()?.join("kiln-store");
    if candidate.is_file() {
        return Some(candidate);
    }
    let problem = format!(
        "{} is missing: run `cargo build -p kiln-store` first",
        candidate.display()
    );
    assert!(!in_ci(), "{problem}");
    visible_skip(&format!("CRI end-to-end test: {problem}"));
    None
}

fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("local addr")
}

/// A GET against the store; returns (status, body).
fn http_get(addr: SocketAddr, path_and_query: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("store reachable");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "GET {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
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

fn encode(query: &str) -> String {
    query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn start_store(data_dir: &Path, binary: &Path) -> (KillOnDrop, SocketAddr) {
    let addr = free_port();
    let child = Command::new(binary)
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--data-dir")
        .arg(data_dir)
        .env("KILN_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("kiln-store starts");
    let guard = KillOnDrop(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if TcpStream::connect(addr).is_ok() && http_get(addr, "/readyz").0 == 200 {
            return (guard, addr);
        }
        assert!(Instant::now() < deadline, "kiln-store did not become ready");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The agent process, in a cgroup of its own that is removed after it exits.
struct Agent {
    child: KillOnDrop,
    cgroup: PathBuf,
}

impl Agent {
    fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// Starts the agent as it runs in a pod: in a cgroup below the test's and in
/// its own cgroup namespace rooted there, so `/proc/<pid>/cgroup` of the
/// containers reads `0::/../k8s.io/<id>` to it and it must find them through
/// their runtime `cgroupsPath` instead. `sh` moves itself into the cgroup and
/// execs `unshare`, which execs the agent, so the child's PID is the agent's.
fn start_agent(socket: &Path, store: SocketAddr, log: &Path, targets_file: &Path) -> Agent {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let mount = kiln_cri::cgroup::cgroup2_mount(&mountinfo).expect("a cgroup2 mount");
    let cgroup = mount.join(format!(
        "kiln-e2e-agent-{}-{}",
        std::process::id(),
        log.display().to_string().len()
    ));
    std::fs::create_dir_all(&cgroup).expect("agent cgroup");
    let log = std::fs::File::create(log).expect("agent log");
    let child = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec unshare --cgroup "$@""#)
        .arg(&cgroup)
        .arg(env!("CARGO_BIN_EXE_kiln-agent"))
        .arg("--cri-socket")
        .arg(socket)
        .args([
            "--node-name",
            "e2e-node",
            "--frequency",
            "99",
            "--drain-interval",
            "2s",
            "--resync-interval",
            "1s",
            "--metrics-addr",
            "off",
        ])
        .arg("--store")
        .arg(format!("http://{store}"))
        .arg("--targets-file")
        .arg(targets_file)
        .env("KILN_LOG", "kiln_agent=info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("kiln-agent starts");
    Agent {
        child: KillOnDrop(child),
        cgroup,
    }
}

/// Function names in the store's top table for a selector.
fn top_functions(store: SocketAddr, selector: &str) -> Option<String> {
    let path = format!(
        "/api/v1/top?query={}&from=now-15m&to=now&limit=1000",
        encode(&format!("process_cpu:cpu:nanoseconds{selector}"))
    );
    let (status, body) = http_get(store, &path);
    (status == 200).then_some(body)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn annotated_pod_is_profiled_through_cri_and_the_other_only_once_a_reloaded_targets_file_names_it()
{
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !cri_node::prerequisites() {
        return;
    }
    let Some(store_bin) = store_binary() else {
        return;
    };
    let work = tempfile::tempdir().expect("temp dir");
    let archive = cri_node::build_image(&work.path().join("image"));
    let containerd = Containerd::start(&work.path().join("containerd"));
    containerd.import(&archive);
    let (_store, store_addr) = start_store(&work.path().join("store"), &store_bin);
    let agent_log = work.path().join("agent.log");
    // The operator's targets file does not exist yet: annotations alone select.
    let targets_file = work.path().join("targets.json");
    let _agent = start_agent(&containerd.socket, store_addr, &agent_log, &targets_file);

    let rt = runtime();
    let mut client = rt.block_on(connect(&containerd.socket));
    let dir = containerd.dir.clone();
    let pods = rt.block_on(async {
        vec![
            create_pod(
                &mut client,
                &dir,
                NAMESPACE,
                "annotated",
                "annotated",
                &[
                    ("profiles.kiln.dev/enabled", "true"),
                    ("profiles.kiln.dev/service-name", "e2e-service"),
                ],
            )
            .await,
            create_pod(&mut client, &dir, NAMESPACE, "plain", "plain", &[]).await,
        ]
    });

    let annotated = format!(r#"{{namespace="{NAMESPACE}",pod="annotated",container="main"}}"#);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut found = None;
    while Instant::now() < deadline {
        if let Some(body) = top_functions(store_addr, &annotated)
            && body.contains("kiln_e2e_hot_annotated")
        {
            found = Some(body);
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    // Let a few more windows arrive, so the absence below is meaningful.
    std::thread::sleep(Duration::from_secs(6));
    let namespace_top =
        top_functions(store_addr, &format!(r#"{{namespace="{NAMESPACE}"}}"#)).unwrap_or_default();
    let (_, series) = http_get(
        store_addr,
        &format!(
            "/api/v1/series?query={}&from=now-15m&to=now",
            encode(&format!(r#"{{namespace="{NAMESPACE}"}}"#))
        ),
    );
    let running = rt.block_on(cri_node::running_containers(&mut client));

    // A late opt-in as the operator relays it: a target naming the running,
    // unannotated pod by kubelet's sandbox label. The agent picks the file up
    // without a restart.
    let relay = format!(
        r#"{{"version":1,"targets":[{{"source":"{NAMESPACE}/late","namespace":"{NAMESPACE}","selector":{{"matchLabels":{{"io.kubernetes.pod.name":"plain"}}}},"requireAnnotation":false,"samplingHz":99,"labels":{{"relayed":"yes"}}}}]}}"#
    );
    let staging = work.path().join("targets.json.new");
    std::fs::write(&staging, relay).expect("write targets");
    std::fs::rename(&staging, &targets_file).expect("replace targets atomically");
    let plain =
        format!(r#"{{namespace="{NAMESPACE}",pod="plain",container="main",relayed="yes"}}"#);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut relayed = false;
    while Instant::now() < deadline && !relayed {
        relayed = top_functions(store_addr, &plain)
            .is_some_and(|body| body.contains("kiln_e2e_hot_plain"));
        if !relayed {
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    rt.block_on(async {
        for pod in &pods {
            remove_pod(&mut client, pod).await;
        }
    });
    assert_eq!(
        running, 2,
        "both workloads must still run for the absence check to mean anything"
    );
    let log = std::fs::read_to_string(&agent_log).unwrap_or_default();
    assert!(
        found.is_some(),
        "the annotated pod's hot function never reached the store; agent log:\n{log}"
    );
    assert!(
        !namespace_top.contains("kiln_e2e_hot_plain"),
        "the unannotated pod was profiled: {namespace_top}"
    );
    assert!(
        !series.contains(r#""pod":"plain""#),
        "a series of the unannotated pod exists: {series}"
    );
    assert!(
        relayed,
        "the pod named in the reloaded targets file was not profiled; agent log:\n{log}"
    );
    for label in [
        r#""pod":"annotated""#,
        r#""container":"main""#,
        r#""node":"e2e-node""#,
        r#""pod_uid":"uid-kiln-e2e-annotated""#,
        r#""service_name":"e2e-service""#,
        r#""container_id":""#,
    ] {
        assert!(series.contains(label), "series lack {label}: {series}");
    }
}

/// Polls the published targets until `pods` (by `pod` label) are exactly selected.
fn wait_for_pods(targets: &mut KubernetesTargets, pods: &[&str], within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let TargetSet::Cgroups(cgroups) = targets.current_targets().expect("always a set") else {
            panic!("Kubernetes discovery publishes cgroup targets");
        };
        let mut names: Vec<String> = cgroups
            .values()
            .filter_map(|e| e.labels.get("pod").cloned())
            .collect();
        names.sort();
        if names == pods || Instant::now() > deadline {
            return names;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn discovery_survives_a_runtime_socket_that_disappears_and_comes_back() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !cri_node::prerequisites() {
        return;
    }
    let work = tempfile::tempdir().expect("temp dir");
    let archive = cri_node::build_image(&work.path().join("image"));
    let containerd_dir = work.path().join("containerd");
    let socket = containerd_dir.join("containerd.sock");

    // Discovery starts before the runtime exists, as on a node where the agent wins the race.
    let targets = KubernetesTargets::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let config = KubernetesConfig {
        socket: socket.clone(),
        node: "n".to_owned(),
        targets_file: None,
        copied_pod_labels: Vec::new(),
        resync_interval: Duration::from_millis(500),
    };
    let discovery_targets = targets.clone();
    let discovery = std::thread::spawn(move || {
        runtime().block_on(run_discovery(config, discovery_targets, stop_rx))
    });

    let mut containerd = Containerd::start(&containerd_dir);
    containerd.import(&archive);
    let rt = runtime();
    let mut client = rt.block_on(connect(&socket));
    let dir = containerd.dir.clone();
    let first = rt.block_on(create_pod(
        &mut client,
        &dir,
        NAMESPACE,
        "first",
        "annotated",
        &[("profiles.kiln.dev/enabled", "true")],
    ));
    let mut reader = targets.clone();
    assert_eq!(
        wait_for_pods(&mut reader, &["first"], Duration::from_secs(60)),
        vec!["first"]
    );

    containerd.kill();
    drop(client);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        wait_for_pods(&mut reader, &["first"], Duration::ZERO),
        vec!["first"],
        "targets are kept while the runtime is away"
    );

    containerd.restart();
    let mut client = rt.block_on(connect(&socket));
    let second = rt.block_on(create_pod(
        &mut client,
        &dir,
        NAMESPACE,
        "second",
        "annotated",
        &[("profiles.kiln.dev/enabled", "true")],
    ));
    let seen = wait_for_pods(&mut reader, &["first", "second"], Duration::from_secs(60));
    rt.block_on(remove_pod(&mut client, &second));
    let after_removal = wait_for_pods(&mut reader, &["first"], Duration::from_secs(60));
    rt.block_on(remove_pod(&mut client, &first));
    let _ = stop_tx.send(true);
    let _ = discovery.join();
    assert_eq!(
        seen,
        vec!["first", "second"],
        "a pod created after the runtime came back was not discovered"
    );
    assert_eq!(
        after_removal,
        vec!["first"],
        "a removed pod stayed in the targets"
    );
}

/// Resident set size (KiB) and user+system CPU time (clock ticks) of a process.
fn rss_and_cpu(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 of proc(5) (utime, stime); the first field after the comm is field 3.
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let cpu = field(14) + field(15);
    (rss, cpu)
}

/// Benchmark (docs/benchmarks/log/2026-11-22-agent-kubernetes.md): agent RSS and CPU
/// while 50 annotated pods are created and deleted in 5 rounds of 10
/// (`KILN_BENCH_ROUNDS` changes the number of rounds).
#[test]
#[ignore = "benchmark: prints measurements, run with --ignored --nocapture"]
fn fifty_pods_churn_agent_memory_and_cpu() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !cri_node::prerequisites() {
        return;
    }
    let Some(store_bin) = store_binary() else {
        return;
    };
    let work = tempfile::tempdir().expect("temp dir");
    let archive = cri_node::build_image(&work.path().join("image"));
    let containerd = Containerd::start(&work.path().join("containerd"));
    containerd.import(&archive);
    let (_store, store_addr) = start_store(&work.path().join("store"), &store_bin);
    let agent_log = work.path().join("agent.log");
    let agent = start_agent(
        &containerd.socket,
        store_addr,
        &agent_log,
        &work.path().join("targets.json"),
    );
    let pid = agent.pid();
    // SAFETY: sysconf has no preconditions.
    let ticks = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    let rt = runtime();
    let mut client = rt.block_on(connect(&containerd.socket));
    let dir = containerd.dir.clone();
    std::thread::sleep(Duration::from_secs(10));
    let (rss0, cpu0) = rss_and_cpu(pid);
    let started = Instant::now();
    println!("round  pods_created  agent_rss_kib  agent_cpu_s_total");
    println!("start  0             {rss0}          0.00");
    let mut peak = rss0;
    let rounds: usize = std::env::var("KILN_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    for round in 1..=rounds {
        let pods = rt.block_on(async {
            let mut pods = Vec::new();
            for i in 0..10 {
                let name = format!("churn-{round}-{i}");
                pods.push(
                    create_pod(
                        &mut client,
                        &dir,
                        NAMESPACE,
                        &name,
                        "pause",
                        &[("profiles.kiln.dev/enabled", "true")],
                    )
                    .await,
                );
            }
            pods
        });
        std::thread::sleep(Duration::from_secs(5));
        peak = peak.max(rss_and_cpu(pid).0);
        rt.block_on(async {
            for pod in &pods {
                remove_pod(&mut client, pod).await;
            }
        });
        std::thread::sleep(Duration::from_secs(5));
        let (rss, cpu) = rss_and_cpu(pid);
        peak = peak.max(rss);
        println!(
            "{round}      {}            {rss}          {:.2}",
            round * 10,
            (cpu - cpu0) as f64 / ticks as f64
        );
    }
    std::thread::sleep(Duration::from_secs(10));
    let (rss_end, cpu_end) = rss_and_cpu(pid);
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = (cpu_end - cpu0) as f64 / ticks as f64;
    println!(
        "end: rss {rss_end} KiB (start {rss0}, peak {peak}); agent CPU {cpu_seconds:.2} s over {seconds:.0} s = {:.2} % of one core",
        100.0 * cpu_seconds / seconds
    );
    let log = std::fs::read_to_string(&agent_log).unwrap_or_default();
    println!(
        "agent log: {} discovery changes, last: {:?}",
        log.matches("containers changed").count(),
        log.lines().rev().find(|l| l.contains("containers changed"))
    );
}
