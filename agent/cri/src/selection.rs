//! Which containers of an inventory are profiled, at what rate and with which
//! labels. Pure logic over `kiln-targets`' decision rules.

use std::collections::{BTreeMap, HashMap};

use kiln_contract::labels as label;
use kiln_targets::{Decision, PodView, PprofPort, RESERVED_LABELS, TargetsFile};

use crate::inventory::PodInventory;

/// A container to profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectedContainer {
    /// The runtime's container id.
    pub container_id: String,
    /// The cgroup v2 id the BPF allow-list is keyed by.
    pub cgroup_id: u64,
    /// Sampling frequency asked for by an annotation or target; `None` is the agent's default.
    pub sampling_hz: Option<u32>,
    /// Labels of every profile of this container: `node`, `namespace`, `pod`,
    /// `pod_uid`, `container`, `container_id`, targets' extra labels,
    /// `service_name` and allow-listed pod labels. The agent adds `comm` and `pid`.
    pub labels: BTreeMap<String, String>,
    /// The pod's sandbox id (its network, hence its IP, is the sandbox's).
    pub sandbox_id: String,
    /// The pod's pprof endpoint to scrape, when its target asks for one.
    pub pprof_scrape: Option<kiln_targets::PprofScrape>,
    /// The named ports of the pod (name, number) a `pprofScrape` port name
    /// resolves against: this container's first, in pod spec order, then
    /// its other running containers' by container name (they share one
    /// network). Empty unless `pprof_scrape` names its port.
    pub pod_ports: Vec<(String, u16)>,
}

/// Decides about every container of `inventory` with `targets`.
///
/// `cgroup_ids` holds the resolved cgroup id of each container; a selected
/// container without one is skipped (it cannot be targeted in the kernel).
/// `copied_pod_labels` lists pod label keys copied onto profiles under the
/// same name (reserved names are never overwritten).
pub fn select_containers(
    inventory: &PodInventory,
    targets: &TargetsFile,
    node: &str,
    copied_pod_labels: &[String],
    cgroup_ids: &HashMap<String, u64>,
) -> Vec<SelectedContainer> {
    let mut selected = Vec::new();
    for pod in inventory.pods.values() {
        for container in &pod.containers {
            let decision = targets.decide(&PodView {
                namespace: &pod.namespace,
                labels: &pod.labels,
                annotations: &pod.annotations,
                container: &container.name,
            });
            let Decision::Profile(plan) = decision else {
                continue;
            };
            let Some(&cgroup_id) = cgroup_ids.get(&container.id) else {
                continue;
            };
            let mut labels = BTreeMap::new();
            for key in copied_pod_labels {
                if RESERVED_LABELS.contains(&key.as_str()) {
                    continue;
                }
                if let Some(value) = pod.labels.get(key) {
                    labels.insert(key.clone(), value.clone());
                }
            }
            // Targets' labels win over copied pod labels; ours win over both.
            labels.extend(plan.labels);
            for (key, value) in [
                (label::NODE, node),
                (label::NAMESPACE, pod.namespace.as_str()),
                (label::POD, pod.name.as_str()),
                (label::POD_UID, pod.uid.as_str()),
                (label::CONTAINER, container.name.as_str()),
                (label::CONTAINER_ID, container.id.as_str()),
            ] {
                labels.insert(key.to_owned(), value.to_owned());
            }
            let pod_ports = match &plan.pprof_scrape {
                Some(scrape) if matches!(scrape.port, PprofPort::Name(_)) => {
                    let others = pod.containers.iter().filter(|c| c.id != container.id);
                    std::iter::once(container)
                        .chain(others)
                        .flat_map(|c| c.ports.iter().cloned())
                        .collect()
                }
                _ => Vec::new(),
            };
            selected.push(SelectedContainer {
                container_id: container.id.clone(),
                cgroup_id,
                sampling_hz: plan.sampling_hz,
                labels,
                sandbox_id: pod.sandbox_id.clone(),
                pprof_scrape: plan.pprof_scrape,
                pod_ports,
            });
        }
    }
    selected
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{ContainerDetails, ContainerInfo, PodInfo};
    use kiln_targets::{ANNOTATION_ENABLED, ANNOTATION_SAMPLING_HZ, ANNOTATION_SERVICE_NAME};

    fn pod(id: &str, name: &str, annotations: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            sandbox_id: id.to_owned(),
            namespace: "shop".to_owned(),
            name: name.to_owned(),
            uid: format!("uid-{name}"),
            labels: BTreeMap::from([
                ("app".to_owned(), name.to_owned()),
                ("team".to_owned(), "payments".to_owned()),
                ("node".to_owned(), "spoofed".to_owned()),
            ]),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            containers: vec![ContainerInfo {
                id: format!("c-{name}"),
                name: "server".to_owned(),
                details: ContainerDetails::default(),
                ports: Vec::new(),
            }],
        }
    }

    fn inventory(pods: Vec<PodInfo>) -> PodInventory {
        PodInventory {
            pods: pods
                .into_iter()
                .map(|p| (p.sandbox_id.clone(), p))
                .collect(),
        }
    }

    fn ids(pairs: &[(&str, u64)]) -> HashMap<String, u64> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn only_the_annotated_pod_is_selected_and_labelled() {
        let inv = inventory(vec![
            pod(
                "s1",
                "checkout",
                &[
                    (ANNOTATION_ENABLED, "true"),
                    (ANNOTATION_SAMPLING_HZ, "49"),
                    (ANNOTATION_SERVICE_NAME, "checkout-svc"),
                ],
            ),
            pod("s2", "cart", &[]),
        ]);
        let selected = select_containers(
            &inv,
            &TargetsFile::new([]),
            "node-a",
            &["team".to_owned(), "node".to_owned()],
            &ids(&[("c-checkout", 11), ("c-cart", 12)]),
        );
        assert_eq!(selected.len(), 1);
        let only = &selected[0];
        assert_eq!((only.cgroup_id, only.sampling_hz), (11, Some(49)));
        let expected: BTreeMap<String, String> = [
            ("node", "node-a"),
            ("namespace", "shop"),
            ("pod", "checkout"),
            ("pod_uid", "uid-checkout"),
            ("container", "server"),
            ("container_id", "c-checkout"),
            ("service_name", "checkout-svc"),
            ("team", "payments"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(only.labels, expected);
    }

    #[test]
    fn a_uid_selector_in_the_targets_file_selects_one_unannotated_pod() {
        let file = TargetsFile::parse(
            br#"{"version":1,"targets":[{"source":"shop/late","namespace":"shop",
                "selector":{"matchLabels":{"io.kubernetes.pod.uid":"uid-cart"}},
                "requireAnnotation":false,"samplingHz":19,"labels":{}}]}"#,
        )
        .expect("valid targets file");
        let mut cart = pod("s2", "cart", &[]);
        cart.labels.insert(
            kiln_targets::CRI_POD_UID_LABEL.to_owned(),
            "uid-cart".to_owned(),
        );
        let mut other = pod("s3", "other", &[]);
        other.labels.insert(
            kiln_targets::CRI_POD_UID_LABEL.to_owned(),
            "uid-other".to_owned(),
        );
        let selected = select_containers(
            &inventory(vec![cart, other]),
            &file,
            "n",
            &[],
            &ids(&[("c-cart", 1), ("c-other", 2)]),
        );
        let chosen: Vec<_> = selected.iter().map(|s| s.container_id.as_str()).collect();
        assert_eq!(chosen, vec!["c-cart"]);
    }

    /// A port name resolves against the pod's ports, the selected container's own first: a
    /// sidecar declaring the same name does not win over it.
    #[test]
    fn a_named_pprof_port_carries_the_pods_ports_own_container_first() {
        let file = TargetsFile::parse(
            br#"{"version":1,"targets":[{"source":"shop/go","namespace":"shop",
                "selector":{"matchLabels":{"app":"go"}},"requireAnnotation":false,
                "samplingHz":19,"labels":{},"containers":["server"],
                "pprofScrape":{"port":"pprof","pathPrefix":"/debug/pprof",
                "profiles":["heap"],"intervalSeconds":15,"timeoutSeconds":5}}]}"#,
        )
        .expect("valid targets file");
        let mut go = pod("s1", "go", &[]);
        go.containers = vec![
            ContainerInfo {
                id: "c-envoy".to_owned(),
                name: "envoy".to_owned(),
                details: ContainerDetails::default(),
                ports: vec![("pprof".to_owned(), 15000), ("admin".to_owned(), 9901)],
            },
            ContainerInfo {
                id: "c-server".to_owned(),
                name: "server".to_owned(),
                details: ContainerDetails::default(),
                ports: vec![("http".to_owned(), 8080), ("pprof".to_owned(), 6060)],
            },
        ];
        let selected = select_containers(
            &inventory(vec![go]),
            &file,
            "n",
            &[],
            &ids(&[("c-envoy", 1), ("c-server", 2)]),
        );
        assert_eq!(selected.len(), 1, "only the server container");
        let ports: Vec<(&str, u16)> = selected[0]
            .pod_ports
            .iter()
            .map(|(name, number)| (name.as_str(), *number))
            .collect();
        assert_eq!(
            ports,
            [
                ("http", 8080),
                ("pprof", 6060),
                ("pprof", 15000),
                ("admin", 9901)
            ]
        );
        let scrape = selected[0].pprof_scrape.as_ref().expect("scraped");
        assert_eq!(scrape.port.resolve(ports), Some(6060));
    }

    #[test]
    fn selected_containers_without_a_cgroup_are_left_out() {
        let inv = inventory(vec![pod("s1", "a", &[(ANNOTATION_ENABLED, "true")])]);
        let selected = select_containers(&inv, &TargetsFile::new([]), "n", &[], &HashMap::new());
        assert!(selected.is_empty());
    }
}
