//! Pods and containers of a node, built from one CRI snapshot. Pure logic.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::runtime::v1::{Container, ContainerState, PodSandbox, PodSandboxState};
use kiln_targets::CRI_POD_UID_LABEL;

use crate::{LABEL_POD_NAME, LABEL_POD_NAMESPACE};

/// What the verbose container status says about a running container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerDetails {
    /// The container's init process (host PID namespace), when the runtime reports it.
    pub pid: Option<u32>,
    /// The OCI spec's `linux.cgroupsPath` (cgroupfs `/k8s.io/<id>` or systemd `slice:prefix:name`).
    pub cgroups_path: Option<String>,
}

impl ContainerDetails {
    /// Reads containerd's and CRI-O's verbose `info` map: a JSON document under
    /// `"info"` holding `pid` and `runtimeSpec.linux.cgroupsPath`. Anything
    /// missing or malformed leaves the field empty; it never fails.
    pub fn from_status_info(info: &HashMap<String, String>) -> ContainerDetails {
        let Some(document) = info
            .get("info")
            .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
        else {
            return ContainerDetails::default();
        };
        let pid = document
            .get("pid")
            .and_then(serde_json::Value::as_u64)
            .and_then(|pid| u32::try_from(pid).ok())
            .filter(|&pid| pid > 0);
        let cgroups_path = document
            .pointer("/runtimeSpec/linux/cgroupsPath")
            .and_then(serde_json::Value::as_str)
            .filter(|path| !path.is_empty())
            .map(str::to_owned);
        ContainerDetails { pid, cgroups_path }
    }
}

/// One CRI listing: sandboxes, containers and the details of running containers.
#[derive(Debug, Clone, Default)]
pub struct RuntimeSnapshot {
    /// Every pod sandbox the runtime knows.
    pub sandboxes: Vec<PodSandbox>,
    /// Every container the runtime knows.
    pub containers: Vec<Container>,
    /// Verbose status details by container id (running containers only).
    pub details: HashMap<String, ContainerDetails>,
}

/// One running container of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// The runtime's container id.
    pub id: String,
    /// The container's name in the pod spec.
    pub name: String,
    /// Details from the verbose status (pid, cgroups path).
    pub details: ContainerDetails,
    /// Its named TCP ports (name, number), in pod spec order
    /// ([`crate::ports::named_ports`]).
    pub ports: Vec<(String, u16)>,
}

/// A ready pod with its running containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// The sandbox id.
    pub sandbox_id: String,
    /// Namespace (sandbox metadata, else kubelet's label).
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// Pod labels (kubelet copies them onto the sandbox).
    pub labels: BTreeMap<String, String>,
    /// Pod annotations (kubelet copies them onto the sandbox, verbatim).
    pub annotations: BTreeMap<String, String>,
    /// Running containers, sorted by name.
    pub containers: Vec<ContainerInfo>,
}

/// The pods of a node, by sandbox id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInventory {
    /// Ready pods by sandbox id.
    pub pods: BTreeMap<String, PodInfo>,
}

/// Containers that appeared and disappeared between two inventories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InventoryDiff {
    /// Container ids that are new.
    pub added: Vec<String>,
    /// Container ids that are gone.
    pub removed: Vec<String>,
}

impl InventoryDiff {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

impl PodInventory {
    /// Builds the inventory: ready sandboxes, each with its running containers.
    /// A running container whose sandbox is not ready (or unknown) is left out.
    pub fn from_snapshot(snapshot: &RuntimeSnapshot) -> PodInventory {
        let mut pods: BTreeMap<String, PodInfo> = snapshot
            .sandboxes
            .iter()
            .filter(|sandbox| sandbox.state == PodSandboxState::SandboxReady as i32)
            .map(|sandbox| (sandbox.id.clone(), pod_from_sandbox(sandbox)))
            .collect();
        for container in &snapshot.containers {
            if container.state != ContainerState::ContainerRunning as i32 {
                continue;
            }
            let Some(pod) = pods.get_mut(&container.pod_sandbox_id) else {
                continue;
            };
            let name = container
                .metadata
                .as_ref()
                .map(|metadata| metadata.name.clone())
                .unwrap_or_default();
            pod.containers.push(ContainerInfo {
                id: container.id.clone(),
                name,
                details: snapshot
                    .details
                    .get(&container.id)
                    .cloned()
                    .unwrap_or_default(),
                ports: crate::ports::named_ports(&container.annotations),
            });
        }
        for pod in pods.values_mut() {
            pod.containers
                .sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        }
        PodInventory { pods }
    }

    /// Ids of every container in the inventory.
    pub fn container_ids(&self) -> BTreeSet<&str> {
        self.pods
            .values()
            .flat_map(|pod| pod.containers.iter().map(|c| c.id.as_str()))
            .collect()
    }

    /// Containers added and removed since `previous`.
    pub fn diff(&self, previous: &PodInventory) -> InventoryDiff {
        let now = self.container_ids();
        let before = previous.container_ids();
        InventoryDiff {
            added: now.difference(&before).map(|id| (*id).to_owned()).collect(),
            removed: before.difference(&now).map(|id| (*id).to_owned()).collect(),
        }
    }
}

fn pod_from_sandbox(sandbox: &PodSandbox) -> PodInfo {
    let labels: BTreeMap<String, String> = sandbox
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let from_label = |key: &str| labels.get(key).cloned().unwrap_or_default();
    let metadata = sandbox.metadata.as_ref();
    let pick = |value: Option<&String>, key: &str| match value {
        Some(value) if !value.is_empty() => value.clone(),
        _ => from_label(key),
    };
    PodInfo {
        sandbox_id: sandbox.id.clone(),
        namespace: pick(metadata.map(|m| &m.namespace), LABEL_POD_NAMESPACE),
        name: pick(metadata.map(|m| &m.name), LABEL_POD_NAME),
        uid: pick(metadata.map(|m| &m.uid), CRI_POD_UID_LABEL),
        annotations: sandbox
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        labels,
        containers: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::v1::{ContainerMetadata, PodSandboxMetadata};

    pub(crate) fn sandbox(id: &str, namespace: &str, name: &str, ready: bool) -> PodSandbox {
        PodSandbox {
            id: id.to_owned(),
            metadata: Some(PodSandboxMetadata {
                name: name.to_owned(),
                uid: format!("uid-{name}"),
                namespace: namespace.to_owned(),
                attempt: 0,
            }),
            state: if ready {
                PodSandboxState::SandboxReady as i32
            } else {
                PodSandboxState::SandboxNotready as i32
            },
            labels: HashMap::from([("app".to_owned(), name.to_owned())]),
            ..PodSandbox::default()
        }
    }

    pub(crate) fn container(id: &str, sandbox: &str, name: &str, running: bool) -> Container {
        Container {
            id: id.to_owned(),
            pod_sandbox_id: sandbox.to_owned(),
            metadata: Some(ContainerMetadata {
                name: name.to_owned(),
                attempt: 0,
            }),
            state: if running {
                ContainerState::ContainerRunning as i32
            } else {
                ContainerState::ContainerExited as i32
            },
            ..Container::default()
        }
    }

    #[test]
    fn verbose_info_yields_pid_and_cgroups_path() {
        let info = HashMap::from([(
            "info".to_owned(),
            r#"{"sandboxID":"s","pid":4242,"runtimeSpec":{"linux":{"cgroupsPath":"/k8s.io/abc"}}}"#
                .to_owned(),
        )]);
        let details = ContainerDetails::from_status_info(&info);
        assert_eq!(details.pid, Some(4242));
        assert_eq!(details.cgroups_path.as_deref(), Some("/k8s.io/abc"));
    }

    #[test]
    fn malformed_verbose_info_yields_nothing_and_does_not_fail() {
        for text in ["", "not json", r#"{"pid":-1}"#, r#"{"pid":0}"#, "[1,2]"] {
            let info = HashMap::from([("info".to_owned(), text.to_owned())]);
            assert_eq!(
                ContainerDetails::from_status_info(&info),
                ContainerDetails::default()
            );
        }
        assert_eq!(
            ContainerDetails::from_status_info(&HashMap::new()),
            ContainerDetails::default()
        );
    }

    #[test]
    fn only_running_containers_of_ready_sandboxes_are_pods() {
        let snapshot = RuntimeSnapshot {
            sandboxes: vec![
                sandbox("s1", "shop", "cart", true),
                sandbox("s2", "shop", "gone", false),
            ],
            containers: vec![
                Container {
                    annotations: HashMap::from([(
                        crate::ports::ANNOTATION_CONTAINER_PORTS.to_owned(),
                        r#"[{"name":"pprof","containerPort":6060,"protocol":"TCP"}]"#.to_owned(),
                    )]),
                    ..container("c1", "s1", "server", true)
                },
                container("c2", "s1", "init", false),
                container("c3", "s2", "server", true),
                container("c4", "unknown", "x", true),
            ],
            details: HashMap::new(),
        };
        let inventory = PodInventory::from_snapshot(&snapshot);
        assert_eq!(inventory.pods.len(), 1);
        let pod = &inventory.pods["s1"];
        assert_eq!(
            (pod.namespace.as_str(), pod.name.as_str(), pod.uid.as_str()),
            ("shop", "cart", "uid-cart")
        );
        let ids: Vec<_> = pod.containers.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, vec!["c1"]);
        assert_eq!(pod.containers[0].ports, [("pprof".to_owned(), 6060)]);
    }

    #[test]
    fn missing_sandbox_metadata_falls_back_to_kubelet_labels() {
        let mut s = sandbox("s1", "", "", true);
        s.metadata = None;
        s.labels = HashMap::from([
            (LABEL_POD_NAMESPACE.to_owned(), "ns".to_owned()),
            (LABEL_POD_NAME.to_owned(), "p".to_owned()),
            (CRI_POD_UID_LABEL.to_owned(), "u".to_owned()),
        ]);
        let pod = pod_from_sandbox(&s);
        assert_eq!(
            (pod.namespace, pod.name, pod.uid),
            ("ns".into(), "p".into(), "u".into())
        );
    }

    #[test]
    fn diff_reports_added_and_removed_containers() {
        let before = PodInventory::from_snapshot(&RuntimeSnapshot {
            sandboxes: vec![sandbox("s1", "a", "p", true)],
            containers: vec![
                container("c1", "s1", "x", true),
                container("c2", "s1", "y", true),
            ],
            details: HashMap::new(),
        });
        let after = PodInventory::from_snapshot(&RuntimeSnapshot {
            sandboxes: vec![sandbox("s1", "a", "p", true)],
            containers: vec![
                container("c2", "s1", "y", true),
                container("c3", "s1", "z", true),
            ],
            details: HashMap::new(),
        });
        let diff = after.diff(&before);
        assert_eq!(diff.added, vec!["c3"]);
        assert_eq!(diff.removed, vec!["c1"]);
        assert!(after.diff(&after).is_empty());
    }
}
