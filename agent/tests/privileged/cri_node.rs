//! A real containerd for tests: started on its own root, state and socket,
//! with a locally built image imported, and pods created through CRI as
//! kubelet would. Everything is undone on drop. See
//! `../shared/research/cri-e2e.md` for why the config looks like this.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kiln_cri::CriClient;
use kiln_cri::runtime::v1::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ImageSpec, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata, RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest,
    StopPodSandboxRequest,
};
use kiln_testkit::prerequisites::{in_ci, visible_skip};

/// The image both the sandboxes (as pause) and the workloads run.
pub const IMAGE: &str = "docker.io/kiln/cri-e2e:1";

/// Whether root, containerd, ctr, runc, gcc with a static libc and BTF are here;
/// panics in CI when not, prints a skip otherwise.
#[track_caller]
pub fn prerequisites() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let runs = |program: &str, arg: &str| {
        Command::new(program)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let problem = if !root {
        Some("must run as root (containerd, BPF)".to_owned())
    } else if !Path::new("/sys/kernel/btf/vmlinux").is_file() {
        Some("the kernel exposes no BTF".to_owned())
    } else if !Path::new("/bin/busybox").is_file() {
        Some("/bin/busybox is missing (./kiln-dev installs busybox-static)".to_owned())
    } else {
        [
            ("containerd", "--version"),
            ("ctr", "--version"),
            ("runc", "--version"),
            ("gcc", "--version"),
            ("unshare", "--version"),
        ]
        .into_iter()
        .find(|(program, arg)| !runs(program, arg))
        .map(|(missing, _)| {
            format!(
                "{missing} is not installed (./kiln-dev installs containerd, runc, build-essential)"
            )
        })
    };
    match problem {
        None => true,
        Some(problem) if in_ci() => panic!("CRI end-to-end test cannot run in CI: {problem}"),
        Some(problem) => {
            visible_skip(&format!("CRI end-to-end test: {problem}"));
            false
        }
    }
}

#[track_caller]
fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn sha256(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path));
    out.split_whitespace()
        .next()
        .expect("sha256sum prints a digest")
        .to_owned()
}

/// Writes `bytes` as a blob of the OCI layout under `dir`; returns (digest, size).
fn add_blob(dir: &Path, file: &Path) -> (String, u64) {
    let digest = sha256(file);
    let size = std::fs::metadata(file).expect("blob").len();
    std::fs::copy(file, dir.join("blobs/sha256").join(&digest)).expect("copy blob");
    (format!("sha256:{digest}"), size)
}

/// Builds an OCI image archive holding busybox and the workload (statically
/// linked, with frame pointers) and returns its path.
pub fn build_image(work: &Path) -> PathBuf {
    build_image_with(work, |_| {})
}

/// [`build_image`], with whatever `extra` puts in the root file system.
pub fn build_image_with(work: &Path, extra: impl FnOnce(&Path)) -> PathBuf {
    let rootfs = work.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).expect("rootfs");
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("busybox-static");
    std::os::unix::fs::symlink("busybox", rootfs.join("bin/sh")).expect("sh link");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/cri_burn.c");
    run(Command::new("gcc")
        .args([
            "-static",
            "-O1",
            "-fno-omit-frame-pointer",
            "-mno-omit-leaf-frame-pointer",
            "-fno-inline",
            "-o",
        ])
        .arg(rootfs.join("workload"))
        .arg(&source));
    extra(&rootfs);

    let layout = work.join("oci");
    std::fs::create_dir_all(layout.join("blobs/sha256")).expect("layout");
    let layer_tar = work.join("layer.tar");
    run(Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-cf"])
        .arg(&layer_tar)
        .arg("-C")
        .arg(&rootfs)
        .arg("."));
    let diff_id = format!("sha256:{}", sha256(&layer_tar));
    run(Command::new("gzip").args(["-n", "-k"]).arg(&layer_tar));
    let (layer_digest, layer_size) = add_blob(&layout, &work.join("layer.tar.gz"));

    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{"Entrypoint":["/workload","pause"]}},"rootfs":{{"type":"layers","diff_ids":["{diff_id}"]}}}}"#
    );
    let config_file = work.join("config.json");
    std::fs::write(&config_file, config).expect("config");
    let (config_digest, config_size) = add_blob(&layout, &config_file);
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_digest}","size":{config_size}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{layer_digest}","size":{layer_size}}}]}}"#
    );
    let manifest_file = work.join("manifest.json");
    std::fs::write(&manifest_file, manifest).expect("manifest");
    let (manifest_digest, manifest_size) = add_blob(&layout, &manifest_file);
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .expect("oci-layout");
    std::fs::write(
        layout.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{manifest_digest}","size":{manifest_size},"annotations":{{"org.opencontainers.image.ref.name":"{IMAGE}"}}}}]}}"#
        ),
    )
    .expect("index.json");
    let archive = work.join("image.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&layout)
        .arg("."));
    archive
}

/// A containerd process on its own directories; killed, its shims ended and
/// its mounts detached on drop.
pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    child: Option<Child>,
}

impl Containerd {
    /// Writes the config under `dir` and starts containerd; waits for its socket.
    pub fn start(dir: &Path) -> Containerd {
        std::fs::create_dir_all(dir.join("cni")).expect("dirs");
        let socket = dir.join("containerd.sock");
        let config = format!(
            r#"version = 2
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{root}/containerd.sock"
[ttrpc]
  address = "{root}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{root}/cni"
    conf_dir = "{root}/cni"
"#,
            root = dir.display()
        );
        std::fs::write(dir.join("config.toml"), config).expect("config");
        let mut node = Containerd {
            dir: dir.to_owned(),
            socket,
            child: None,
        };
        node.restart();
        node
    }

    /// Starts containerd (again) with the same config.
    pub fn restart(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("containerd.log"))
            .expect("log file");
        let child = Command::new("containerd")
            .arg("--config")
            .arg(self.dir.join("config.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("containerd starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.socket.exists() {
            assert!(
                Instant::now() < deadline,
                "containerd did not create its socket; see {}",
                self.dir.join("containerd.log").display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills containerd (its shims and containers keep running) and removes its socket.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Imports an image archive into the `k8s.io` namespace.
    pub fn import(&self, archive: &Path) {
        run(Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive));
    }

    /// Ends the shims this containerd started (found by our socket in their command line).
    fn end_shims(&self) {
        let needle = self.socket.display().to_string();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let text = String::from_utf8_lossy(&cmdline);
            if text.contains("containerd-shim") && text.contains(&needle) {
                // SAFETY: kill only sends a signal to the shim process we started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }

    /// Detaches every mount under our directory, deepest first.
    fn unmount_all(&self) {
        let prefix = self.dir.display().to_string();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<String> = mountinfo
            .lines()
            .filter_map(|line| line.split_whitespace().nth(4).map(str::to_owned))
            .filter(|point| point.starts_with(&prefix))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for point in points {
            let Ok(c_point) = std::ffi::CString::new(point) else {
                continue;
            };
            // SAFETY: c_point is a valid NUL-terminated path; MNT_DETACH cannot harm other mounts.
            unsafe { libc::umount2(c_point.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.kill();
        self.end_shims();
        self.unmount_all();
    }
}

/// A pod created through CRI; stopped and removed by [`Pods::remove_all`].
#[derive(Debug, Clone)]
pub struct Pod {
    pub sandbox_id: String,
}

/// The sandbox config kubelet would send for a host-network pod.
pub fn sandbox_config(
    dir: &Path,
    namespace: &str,
    name: &str,
    uid: &str,
    annotations: &[(&str, &str)],
) -> PodSandboxConfig {
    let labels = HashMap::from([
        (
            "io.kubernetes.pod.namespace".to_owned(),
            namespace.to_owned(),
        ),
        ("io.kubernetes.pod.name".to_owned(), name.to_owned()),
        ("io.kubernetes.pod.uid".to_owned(), uid.to_owned()),
        ("app".to_owned(), name.to_owned()),
    ]);
    let mut all_annotations =
        HashMap::from([("kubernetes.io/config.source".to_owned(), "api".to_owned())]);
    all_annotations.extend(
        annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.to_owned(),
            uid: uid.to_owned(),
            namespace: namespace.to_owned(),
            attempt: 0,
        }),
        // Host network: no hostname (runc refuses one without a UTS namespace).
        hostname: String::new(),
        log_directory: dir.join("logs").join(uid).display().to_string(),
        labels,
        annotations: all_annotations,
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: String::new(),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    pid: NamespaceMode::Container as i32,
                    ipc: NamespaceMode::Pod as i32,
                }),
            }),
        }),
    }
}

/// Creates a pod with one container `main` running the workload with `mode`.
pub async fn create_pod(
    client: &mut CriClient,
    dir: &Path,
    namespace: &str,
    name: &str,
    mode: &str,
    annotations: &[(&str, &str)],
) -> Pod {
    let command = ["/workload".to_owned(), mode.to_owned()];
    create_pod_running(client, dir, namespace, name, &command, annotations).await
}

/// Creates a pod with one container `main` running `command` (program, then
/// arguments) from the image.
pub async fn create_pod_running(
    client: &mut CriClient,
    dir: &Path,
    namespace: &str,
    name: &str,
    command: &[String],
    annotations: &[(&str, &str)],
) -> Pod {
    let uid = format!("uid-{namespace}-{name}");
    let config = sandbox_config(dir, namespace, name, &uid, annotations);
    let sandbox_id = client
        .runtime()
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}"))
        .into_inner()
        .pod_sandbox_id;
    let container_labels = HashMap::from([
        (
            "io.kubernetes.pod.namespace".to_owned(),
            namespace.to_owned(),
        ),
        ("io.kubernetes.pod.name".to_owned(), name.to_owned()),
        ("io.kubernetes.pod.uid".to_owned(), uid.clone()),
        ("io.kubernetes.container.name".to_owned(), "main".to_owned()),
    ]);
    let container_id = client
        .runtime()
        .create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: "main".to_owned(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: IMAGE.to_owned(),
                }),
                command: command.iter().take(1).cloned().collect(),
                args: command.iter().skip(1).cloned().collect(),
                labels: container_labels,
                log_path: "main/0.log".to_owned(),
                ..ContainerConfig::default()
            }),
            sandbox_config: Some(config),
        })
        .await
        .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}"))
        .into_inner()
        .container_id;
    client
        .runtime()
        .start_container(StartContainerRequest { container_id })
        .await
        .unwrap_or_else(|e| panic!("StartContainer {name}: {e}"));
    Pod { sandbox_id }
}

/// Stops and removes a pod (and its containers).
pub async fn remove_pod(client: &mut CriClient, pod: &Pod) {
    let _ = client
        .runtime()
        .stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.sandbox_id.clone(),
        })
        .await;
    let _ = client
        .runtime()
        .remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod.sandbox_id.clone(),
        })
        .await;
}

/// Connects to the runtime, retrying while it starts: until the socket
/// accepts and the CRI plugin answers (right after a restart it refuses
/// every call with "server is not initialized yet").
pub async fn connect(socket: &Path) -> CriClient {
    use kiln_cri::runtime::v1::ListPodSandboxRequest;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let error = match CriClient::connect(socket).await {
            Ok(mut client) => match client
                .runtime()
                .list_pod_sandbox(ListPodSandboxRequest { filter: None })
                .await
            {
                Ok(_) => return client,
                Err(status) => status.to_string(),
            },
            Err(error) => error.to_string(),
        };
        assert!(
            Instant::now() < deadline,
            "containerd's CRI did not become ready: {error}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Running containers the runtime reports.
pub async fn running_containers(client: &mut CriClient) -> usize {
    use kiln_cri::runtime::v1::{ContainerState, ListContainersRequest};
    client
        .runtime()
        .list_containers(ListContainersRequest { filter: None })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers
        .iter()
        .filter(|c| c.state == ContainerState::ContainerRunning as i32)
        .count()
}
