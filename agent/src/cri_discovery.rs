//! CRI discovery: the pods of this node, found through the container
//! runtime's CRI socket (`kiln-cri`, never the API server) and selected by
//! the operator's targets file (`kiln-targets`), as a [`TargetSource`].
//!
//! An async task ([`run_discovery`]) keeps a connection to the runtime socket
//! (reconnecting with backoff when the runtime restarts), takes a snapshot of
//! pods and containers on every container event, or every resync interval
//! where the runtime has no event stream (containerd 1.6), re-reads the
//! targets file when its bytes change, and publishes the resulting cgroup
//! [`TargetSet`]. The collector thread polls [`KubernetesTargets`] like any
//! other source and applies only the difference to the BPF allow-list, so a
//! pod that goes is dropped from the kernel maps at the next poll.
//!
//! Selected pods whose target asks for `pprofScrape` are published as
//! scrape endpoints too ([`KubernetesTargets::scrape_endpoints`]), over the
//! pod IP the runtime reports for the sandbox (`PodSandboxStatus`), asked
//! once per pod.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_cri::cgroup::CgroupResolver;
use kiln_cri::inventory::ContainerDetails;
use kiln_cri::{CriClient, CriError, PodInventory, RuntimeSnapshot, select_containers};
use kiln_targets::TargetsFile;
use tokio::sync::watch;

use crate::scrape::ScrapeEndpoint;
use crate::scrape::pods::pod_endpoints;
use crate::ship::Backoff;
use crate::target_set::{TargetEntry, TargetSet, TargetSource, TargetSourceError};

/// Events arriving within this time of each other lead to one snapshot.
const EVENT_COALESCING: Duration = Duration::from_millis(100);

/// How discovery runs.
#[derive(Debug, Clone)]
pub struct KubernetesConfig {
    /// The CRI runtime socket.
    pub socket: PathBuf,
    /// Value of the `node` label.
    pub node: String,
    /// The operator's targets file; without it, only annotated pods are profiled.
    pub targets_file: Option<PathBuf>,
    /// Pod label keys copied onto profiles.
    pub copied_pod_labels: Vec<String>,
    /// Snapshot interval when no event arrives (and the targets file re-read interval).
    pub resync_interval: Duration,
}

/// The latest target set and scrape endpoints published by discovery;
/// cheap to clone.
#[derive(Debug, Clone)]
pub struct KubernetesTargets {
    latest: Arc<Mutex<TargetSet>>,
    scrapes: Arc<watch::Sender<Vec<ScrapeEndpoint>>>,
}

impl Default for KubernetesTargets {
    fn default() -> Self {
        KubernetesTargets {
            latest: Arc::new(Mutex::new(TargetSet::Cgroups(Default::default()))),
            scrapes: Arc::new(watch::channel(Vec::new()).0),
        }
    }
}

impl KubernetesTargets {
    /// The pods' pprof endpoints as discovery publishes them.
    pub fn scrape_endpoints(&self) -> watch::Receiver<Vec<ScrapeEndpoint>> {
        self.scrapes.subscribe()
    }

    fn publish(&self, targets: TargetSet) {
        // A poisoned lock only means a panic elsewhere; the value is still a whole set.
        let mut slot = self
            .latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = targets;
    }
}

impl TargetSource for KubernetesTargets {
    fn current_targets(&mut self) -> Result<TargetSet, TargetSourceError> {
        let slot = self
            .latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(slot.clone())
    }
}

/// The agent's target source: fixed from the command line, or Kubernetes discovery.
#[derive(Debug)]
pub enum AgentTargets {
    /// `--pid`, `--all`, `--cgroup`, `--cgroup-id`.
    Static(crate::cli_targets::StaticTargets),
    /// `--kubernetes` / `--cri-socket`.
    Kubernetes(KubernetesTargets),
}

impl TargetSource for AgentTargets {
    fn current_targets(&mut self) -> Result<TargetSet, TargetSourceError> {
        match self {
            AgentTargets::Static(source) => source.current_targets(),
            AgentTargets::Kubernetes(source) => source.current_targets(),
        }
    }
}

/// The discovery state between snapshots.
#[derive(Debug)]
pub struct Discovery {
    config: KubernetesConfig,
    resolver: CgroupResolver,
    targets_file: TargetsFile,
    targets_bytes: Option<Vec<u8>>,
    details: HashMap<String, ContainerDetails>,
    cgroup_ids: HashMap<String, u64>,
    inventory: PodInventory,
    /// Pod IPs by sandbox id, of pods with an endpoint to scrape.
    pod_ips: HashMap<String, IpAddr>,
    published: KubernetesTargets,
}

impl Discovery {
    /// Discovery publishing into `published`, resolving cgroups with `resolver`.
    pub fn new(
        config: KubernetesConfig,
        resolver: CgroupResolver,
        published: KubernetesTargets,
    ) -> Discovery {
        Discovery {
            config,
            resolver,
            targets_file: TargetsFile::new([]),
            targets_bytes: None,
            details: HashMap::new(),
            cgroup_ids: HashMap::new(),
            inventory: PodInventory::default(),
            pod_ips: HashMap::new(),
            published,
        }
    }

    /// Re-reads the targets file; returns whether the targets changed. A file
    /// that cannot be read or parsed leaves the previous targets in force.
    pub fn reload_targets_file(&mut self) -> bool {
        let Some(path) = &self.config.targets_file else {
            return false;
        };
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) => {
                if self.targets_bytes.is_some() {
                    tracing::warn!(path = %path.display(), %error, "cannot read the targets file; keeping the previous targets");
                    self.targets_bytes = None;
                }
                return false;
            }
        };
        if self.targets_bytes.as_ref() == Some(&bytes) {
            return false;
        }
        let parsed = TargetsFile::parse(&bytes);
        self.targets_bytes = Some(bytes);
        match parsed {
            Ok(file) => {
                let changed = file != self.targets_file;
                tracing::info!(path = %path.display(), targets = file.targets.len(), "loaded the targets file");
                self.targets_file = file;
                changed
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), reason = error.reason(), %error, "invalid targets file; keeping the previous targets");
                false
            }
        }
    }

    /// Takes in a runtime snapshot: resolves the cgroups of new containers,
    /// decides which containers are profiled and publishes the target set.
    pub fn apply(&mut self, snapshot: RuntimeSnapshot) {
        self.details = snapshot.details.clone();
        let inventory = PodInventory::from_snapshot(&snapshot);
        let diff = inventory.diff(&self.inventory);
        for id in &diff.removed {
            self.cgroup_ids.remove(id);
        }
        for pod in inventory.pods.values() {
            for container in &pod.containers {
                if self.cgroup_ids.contains_key(&container.id) {
                    continue;
                }
                match self.resolver.resolve(&container.id, &container.details) {
                    Ok(id) => {
                        self.cgroup_ids.insert(container.id.clone(), id);
                    }
                    Err(error) => {
                        tracing::debug!(%error, "container cgroup not resolved yet");
                    }
                }
            }
        }
        if !diff.is_empty() {
            tracing::info!(
                pods = inventory.pods.len(),
                added = diff.added.len(),
                removed = diff.removed.len(),
                "containers changed"
            );
        }
        self.pod_ips
            .retain(|sandbox, _| inventory.pods.contains_key(sandbox));
        self.inventory = inventory;
        self.publish();
    }

    /// Sandboxes of pods to scrape whose IP is not known yet.
    pub fn sandboxes_without_ip(&self) -> Vec<String> {
        let (_, missing) = pod_endpoints(&self.selected(), &self.pod_ips);
        missing.into_iter().collect()
    }

    /// Records the IP the runtime reported for `sandbox`.
    pub fn set_pod_ip(&mut self, sandbox: String, ip: IpAddr) {
        self.pod_ips.insert(sandbox, ip);
    }

    fn selected(&self) -> Vec<kiln_cri::SelectedContainer> {
        select_containers(
            &self.inventory,
            &self.targets_file,
            &self.config.node,
            &self.config.copied_pod_labels,
            &self.cgroup_ids,
        )
    }

    /// Recomputes the target set and scrape endpoints from the current
    /// inventory and targets.
    pub fn publish(&self) {
        let selected = self.selected();
        let (endpoints, _) = pod_endpoints(&selected, &self.pod_ips);
        self.published.scrapes.send_if_modified(|current| {
            let changed = *current != endpoints;
            if changed {
                // Said once per change here; the scraper counts a
                // `port_name` error on each interval after.
                for endpoint in &endpoints {
                    if let Some(name) = &endpoint.missing_port {
                        tracing::warn!(
                            endpoint = %endpoint.id,
                            pod = endpoint.labels.get(kiln_contract::labels::POD).map_or("", String::as_str),
                            port = %name,
                            "no container of the pod declares this pprof port name; the pod is not scraped"
                        );
                    }
                }
                *current = endpoints;
            }
            changed
        });
        let cgroups = selected
            .into_iter()
            .map(|container| {
                let entry = TargetEntry {
                    labels: container.labels,
                    sampling_hz: container.sampling_hz,
                };
                (container.cgroup_id, entry)
            })
            .collect();
        self.published.publish(TargetSet::Cgroups(cgroups));
    }

    /// Verbose details already known, so a snapshot asks only about new containers.
    pub fn known_details(&self) -> &HashMap<String, ContainerDetails> {
        &self.details
    }
}

/// Runs discovery until `shutdown` turns true: connects to the runtime
/// (retrying with backoff), then snapshots on events and on every resync tick.
pub async fn run_discovery(
    config: KubernetesConfig,
    published: KubernetesTargets,
    mut shutdown: watch::Receiver<bool>,
) {
    let socket = config.socket.clone();
    let mut discovery = Discovery::new(config, CgroupResolver::for_host(), published);
    discovery.reload_targets_file();
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(10));
    let mut failures: u64 = 0;
    while !*shutdown.borrow() {
        match CriClient::connect(&socket).await {
            Ok(client) => {
                if failures > 0 {
                    tracing::info!(socket = %socket.display(), failures, "reconnected to the container runtime");
                }
                failures = 0;
                backoff.reset();
                if let Err(error) = session(client, &mut discovery, &mut shutdown).await {
                    tracing::warn!(reason = error.reason(), %error, "lost the container runtime; keeping the current targets");
                }
            }
            Err(error) => {
                if failures == 0 {
                    tracing::warn!(reason = error.reason(), %error, "container runtime unreachable; retrying");
                }
                failures += 1;
            }
        }
        let jitter = f64::from(u32::try_from(failures % 7).unwrap_or(0)) / 7.0;
        tokio::select! {
            () = tokio::time::sleep(backoff.next_delay(jitter)) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// One connection's life: returns on a CRI error or on shutdown.
async fn session(
    mut client: CriClient,
    discovery: &mut Discovery,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), CriError> {
    match client.version().await {
        Ok(version) => tracing::info!(
            runtime = %version.runtime_name,
            version = %version.runtime_version,
            api = %version.runtime_api_version,
            "connected to the container runtime"
        ),
        Err(error) => return Err(error),
    }
    let mut events = match client.container_events().await {
        Ok(stream) => Some(stream),
        Err(error) if error.is_unimplemented() => {
            tracing::info!(
                interval = ?discovery.config.resync_interval,
                "the runtime has no container events; resyncing periodically"
            );
            None
        }
        Err(error) => {
            tracing::warn!(%error, "cannot follow container events; resyncing periodically");
            None
        }
    };
    let mut tick = tokio::time::interval(discovery.config.resync_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let targets_changed = discovery.reload_targets_file();
        let snapshot = client.snapshot(discovery.known_details()).await?;
        discovery.apply(snapshot);
        let sandboxes = discovery.sandboxes_without_ip();
        if !sandboxes.is_empty() {
            for sandbox in sandboxes {
                if let Some(ip) = pod_ip(&mut client, &sandbox).await {
                    discovery.set_pod_ip(sandbox, ip);
                }
            }
            discovery.publish();
        }
        if targets_changed {
            tracing::info!("targets file changed; target set recomputed");
        }
        tokio::select! {
            _ = tick.tick() => {}
            event = next_event(&mut events) => {
                if event.is_none() {
                    // The stream ended or failed: the next snapshot tells whether the runtime is gone.
                    events = None;
                } else {
                    // A pod start is a burst of events (sandbox, containers): one snapshot for all.
                    while let Ok(more) = tokio::time::timeout(EVENT_COALESCING, next_event(&mut events)).await {
                        if more.is_none() {
                            events = None;
                            break;
                        }
                    }
                }
            }
            _ = shutdown.changed() => return Ok(()),
        }
    }
}

/// The pod IP of `sandbox` (its primary one), `None` when the runtime has
/// none (host network pods report the node's) or the call fails; asked
/// again at the next snapshot.
async fn pod_ip(client: &mut CriClient, sandbox: &str) -> Option<IpAddr> {
    let request = kiln_cri::runtime::v1::PodSandboxStatusRequest {
        pod_sandbox_id: sandbox.to_owned(),
        verbose: false,
    };
    match client.runtime().pod_sandbox_status(request).await {
        Ok(response) => {
            let ip = response.into_inner().status?.network?.ip;
            ip.parse().ok()
        }
        Err(status) => {
            tracing::debug!(sandbox, %status, "no pod IP yet");
            None
        }
    }
}

/// The next container event, `None` when the stream ended; pending forever without a stream.
async fn next_event(
    events: &mut Option<tonic::Streaming<kiln_cri::runtime::v1::ContainerEventResponse>>,
) -> Option<()> {
    match events {
        Some(stream) => match stream.message().await {
            Ok(Some(_)) => Some(()),
            Ok(None) | Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_cri::runtime::v1::{
        Container, ContainerMetadata, ContainerState, PodSandbox, PodSandboxMetadata,
        PodSandboxState,
    };

    fn snapshot(cgroup_dir: &std::path::Path, pods: &[(&str, bool)]) -> RuntimeSnapshot {
        let mut snapshot = RuntimeSnapshot::default();
        for (name, annotated) in pods {
            std::fs::create_dir_all(cgroup_dir.join(name)).expect("mkdir");
            let mut annotations = HashMap::new();
            if *annotated {
                annotations.insert(
                    kiln_targets::ANNOTATION_ENABLED.to_owned(),
                    "true".to_owned(),
                );
            }
            snapshot.sandboxes.push(PodSandbox {
                id: format!("s-{name}"),
                metadata: Some(PodSandboxMetadata {
                    name: (*name).to_owned(),
                    uid: format!("uid-{name}"),
                    namespace: "shop".to_owned(),
                    attempt: 0,
                }),
                state: PodSandboxState::SandboxReady as i32,
                labels: HashMap::from([("app".to_owned(), (*name).to_owned())]),
                annotations,
                ..PodSandbox::default()
            });
            snapshot.containers.push(Container {
                id: format!("c-{name}"),
                pod_sandbox_id: format!("s-{name}"),
                metadata: Some(ContainerMetadata {
                    name: "main".to_owned(),
                    attempt: 0,
                }),
                state: ContainerState::ContainerRunning as i32,
                ..Container::default()
            });
            snapshot.details.insert(
                format!("c-{name}"),
                ContainerDetails {
                    pid: None,
                    cgroups_path: Some(format!("/{name}")),
                },
            );
        }
        snapshot
    }

    fn selected_pods(targets: &mut KubernetesTargets) -> Vec<String> {
        let TargetSet::Cgroups(cgroups) = targets.current_targets().expect("always a set") else {
            panic!("Kubernetes discovery publishes cgroup targets");
        };
        let mut pods: Vec<String> = cgroups
            .values()
            .map(|entry| entry.labels["pod"].clone())
            .collect();
        pods.sort();
        pods
    }

    fn discovery(
        dir: &std::path::Path,
        targets_file: Option<PathBuf>,
    ) -> (Discovery, KubernetesTargets) {
        let published = KubernetesTargets::default();
        let config = KubernetesConfig {
            socket: dir.join("none.sock"),
            node: "node-a".to_owned(),
            targets_file,
            copied_pod_labels: vec!["app".to_owned()],
            resync_interval: Duration::from_secs(1),
        };
        let resolver = CgroupResolver::new(dir.join("cgroup"), dir.join("proc"));
        (
            Discovery::new(config, resolver, published.clone()),
            published,
        )
    }

    #[test]
    fn annotated_pods_are_published_and_gone_pods_are_dropped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cgroups = dir.path().join("cgroup");
        let (mut discovery, mut published) = discovery(dir.path(), None);
        discovery.apply(snapshot(
            &cgroups,
            &[("a", true), ("b", false), ("c", true)],
        ));
        assert_eq!(selected_pods(&mut published), vec!["a", "c"]);
        discovery.apply(snapshot(&cgroups, &[("c", true)]));
        assert_eq!(selected_pods(&mut published), vec!["c"]);
    }

    #[test]
    fn pods_whose_target_asks_for_pprof_are_published_as_endpoints_once_their_ip_is_known() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cgroups = dir.path().join("cgroup");
        let file = dir.path().join("targets.json");
        std::fs::write(
            &file,
            r#"{"version":1,"targets":[{"source":"shop/b","namespace":"shop",
            "selector":{"matchLabels":{"app":"b"}},"requireAnnotation":false,"samplingHz":19,"labels":{},
            "pprofScrape":{"port":6060,"pathPrefix":"/debug/pprof","profiles":["heap","goroutine"],
            "intervalSeconds":15,"timeoutSeconds":5}}]}"#,
        )
        .expect("write");
        let (mut discovery, published) = discovery(dir.path(), Some(file));
        assert!(discovery.reload_targets_file());
        let endpoints = published.scrape_endpoints();
        discovery.apply(snapshot(&cgroups, &[("a", true), ("b", false)]));
        assert!(endpoints.borrow().is_empty(), "no IP yet");
        assert_eq!(discovery.sandboxes_without_ip(), ["s-b"]);
        discovery.set_pod_ip("s-b".to_owned(), "10.0.0.7".parse().expect("ip"));
        discovery.publish();
        {
            let endpoints = endpoints.borrow();
            assert_eq!(endpoints.len(), 1);
            assert_eq!(endpoints[0].labels["pod"], "b");
            assert_eq!(endpoints[0].labels["namespace"], "shop");
            assert_eq!(endpoints[0].labels["node"], "node-a");
            assert_eq!(
                endpoints[0].urls[0].1,
                "http://10.0.0.7:6060/debug/pprof/heap"
            );
        }
        // The pod goes: its endpoint and IP go with it.
        discovery.apply(snapshot(&cgroups, &[("a", true)]));
        assert!(endpoints.borrow().is_empty());
        assert!(discovery.pod_ips.is_empty());
    }

    #[test]
    fn targets_file_changes_apply_without_restart_and_bad_files_keep_the_old_targets() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cgroups = dir.path().join("cgroup");
        let file = dir.path().join("targets.json");
        let (mut discovery, mut published) = discovery(dir.path(), Some(file.clone()));
        let pods = [("a", false), ("b", false)];

        assert!(
            !discovery.reload_targets_file(),
            "a missing file changes nothing"
        );
        discovery.apply(snapshot(&cgroups, &pods));
        assert!(selected_pods(&mut published).is_empty());

        let select_b = r#"{"version":1,"targets":[{"source":"shop/b","namespace":"shop",
            "selector":{"matchLabels":{"app":"b"}},"requireAnnotation":false,"samplingHz":19,"labels":{}}]}"#;
        std::fs::write(&file, select_b).expect("write");
        assert!(discovery.reload_targets_file());
        discovery.publish();
        assert_eq!(selected_pods(&mut published), vec!["b"]);
        assert!(
            !discovery.reload_targets_file(),
            "unchanged bytes are not reparsed"
        );

        std::fs::write(&file, "{ not json").expect("write");
        assert!(!discovery.reload_targets_file());
        discovery.publish();
        assert_eq!(
            selected_pods(&mut published),
            vec!["b"],
            "a bad file keeps the old targets"
        );

        std::fs::write(&file, select_b.replace("\"b\"}", "\"a\"}")).expect("write");
        assert!(discovery.reload_targets_file());
        discovery.apply(snapshot(&cgroups, &pods));
        assert_eq!(selected_pods(&mut published), vec!["a"]);
    }
}
