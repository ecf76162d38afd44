//! The agent side: ServiceAccount and the DaemonSet of eBPF agents.
//!
//! Why the DaemonSet needs what it asks for:
//! - `hostPID`: the agent maps sampled PIDs to containers through the host's `/proc`.
//! - `/sys/fs/cgroup`: cgroup ids of containers feed the BPF allow-list.
//! - the CRI socket: pod labels and annotations without API-server access.
//! - the store's write token (only that key of `<store>-tokens`), unless the store
//!   accepts unauthenticated writes.
//!
//! Nothing else: the agent pins no BPF maps (no `/sys/fs/bpf`), uses no
//! tracefs or debugfs (no `/sys/kernel/debug`), reads no kernel modules (no
//! `/lib/modules`, which nodes without loadable modules lack, and a missing
//! `Directory` hostPath keeps the pod from starting), and never calls the API
//! server, so no ServiceAccount token is mounted. Its `/metrics` port also
//! serves `/healthz`, which fails when the collector thread stops making
//! progress; the liveness probe restarts such an agent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, HTTPGetAction, HostPathVolumeSource, ObjectFieldSelector, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext,
    ServiceAccount, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kiln_agent_settings::AgentSettings;

use super::{
    BuildDefaults, BuildError, StoreNames, command_line, common_labels, owned_meta,
    selector_labels, stamp_applied_hash, tokens,
};
use crate::api::{ProfileStore, SecurityMode};

/// Where the targets ConfigMap is mounted (a directory, so kubelet can update it in place).
pub const TARGETS_DIR: &str = "/etc/kiln/targets";

/// Capabilities of the `capabilities` security mode (the least-privilege eBPF profiler set).
/// Not SYS_RESOURCE: from kernel 5.11 BPF memory is charged to the cgroup rather than
/// RLIMIT_MEMLOCK, so the agent needs no raised limit there, and a runtime that does not hold
/// SYS_RESOURCE itself (as on the e2e suite's node) refuses to start any container asking for
/// it. Older kernels need the privileged mode (the agent's preflight says so).
pub const AGENT_CAPABILITIES: [&str; 5] = [
    "BPF",
    "PERFMON",
    "SYS_PTRACE",
    "CHECKPOINT_RESTORE",
    "DAC_READ_SEARCH",
];

/// Host paths the agent mounts: (volume name, host path, mount path, read-only, hostPath type).
const HOST_MOUNTS: [(&str, &str, &str, bool, &str); 1] = [(
    "cgroup",
    "/sys/fs/cgroup",
    "/sys/fs/cgroup",
    true,
    "Directory",
)];

/// The agent's `/metrics` and `/healthz` port.
pub const AGENT_METRICS_PORT: i32 = 7471;

/// The agents' ServiceAccount, owned by the store.
pub fn service_account(
    store: &ProfileStore,
    names: &StoreNames,
) -> Result<ServiceAccount, BuildError> {
    let account = ServiceAccount {
        metadata: owned_meta(store, names, &names.agent, "agent"),
        ..ServiceAccount::default()
    };
    stamp_applied_hash(account, "ServiceAccount")
}

/// The settings of `kiln-agent` on every node, in the agent's own settings
/// type: Kubernetes discovery through the spec's CRI socket, the targets
/// file, shipping to the store's Service and `/metrics` on the pod's port.
/// The node name comes from the `NODE_NAME` variable (the downward API),
/// which Kubernetes expands in `$(NODE_NAME)`.
pub fn agent_settings(store: &ProfileStore, names: &StoreNames) -> AgentSettings {
    AgentSettings {
        cri_socket: Some(PathBuf::from(&store.spec.agent.container_runtime_socket)),
        node_name: Some("$(NODE_NAME)".to_owned()),
        store: Some(format!(
            "http://{}",
            names.endpoint(store.spec.service_port)
        )),
        store_replicas: super::store::replica_endpoints(store)
            .into_iter()
            .map(|(_, url)| url)
            .collect(),
        targets_file: Some(Path::new(TARGETS_DIR).join(kiln_targets::CONFIGMAP_KEY)),
        metrics_addr: format!("0.0.0.0:{AGENT_METRICS_PORT}"),
        off_cpu: store.spec.agent.off_cpu,
        ..AgentSettings::default()
    }
}

/// Command-line flags of `kiln-agent`, rendered from [`agent_settings`].
pub fn agent_args(store: &ProfileStore, names: &StoreNames) -> Result<Vec<String>, BuildError> {
    command_line::render("kiln-agent", &agent_settings(store, names))
}

/// The security context of the agent container in each mode.
pub fn agent_security_context(mode: SecurityMode) -> SecurityContext {
    let common = SecurityContext {
        run_as_user: Some(0),
        run_as_non_root: Some(false),
        read_only_root_filesystem: Some(true),
        ..SecurityContext::default()
    };
    match mode {
        SecurityMode::Privileged => SecurityContext {
            privileged: Some(true),
            allow_privilege_escalation: Some(true),
            ..common
        },
        SecurityMode::Capabilities => SecurityContext {
            privileged: Some(false),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                add: Some(AGENT_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect()),
                drop: Some(vec!["ALL".to_owned()]),
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..common
        },
    }
}

/// The agent DaemonSet.
pub fn daemon_set(
    store: &ProfileStore,
    names: &StoreNames,
    defaults: &BuildDefaults,
) -> Result<DaemonSet, BuildError> {
    let agent = &store.spec.agent;
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    for (name, host_path, mount_path, read_only, type_) in HOST_MOUNTS {
        volumes.push(host_path_volume(name, host_path, type_));
        mounts.push(mount(name, mount_path, read_only));
    }
    let socket = agent.container_runtime_socket.clone();
    volumes.push(host_path_volume("cri-socket", &socket, "Socket"));
    // Connecting to a socket works through a read-only mount; nothing else is written there.
    mounts.push(mount("cri-socket", &socket, true));
    volumes.push(Volume {
        name: "targets".to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: names.targets.clone(),
            optional: Some(true),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    });
    mounts.push(mount("targets", TARGETS_DIR, true));
    volumes.push(Volume {
        name: "tmp".to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    });
    mounts.push(mount("tmp", "/tmp", false));
    let mut env = vec![EnvVar {
        name: "NODE_NAME".to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "spec.nodeName".to_owned(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }];
    if let Some((volume, token_mount, token_env)) = tokens::agent_token(store, names) {
        volumes.push(volume);
        mounts.push(token_mount);
        env.push(token_env);
    }

    let container = Container {
        name: "kiln-agent".to_owned(),
        image: Some(
            agent
                .image
                .clone()
                .unwrap_or_else(|| defaults.agent_image.clone()),
        ),
        image_pull_policy: defaults.image_pull_policy(),
        args: Some(agent_args(store, names)?),
        env: Some(env),
        resources: Some(
            agent
                .resources
                .clone()
                .unwrap_or_else(default_agent_resources),
        ),
        security_context: Some(agent_security_context(agent.security_mode)),
        volume_mounts: Some(mounts),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".to_owned()),
            container_port: AGENT_METRICS_PORT,
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                // The agent serves the store's health path on its metrics port.
                path: Some(kiln_contract::endpoints::HEALTHZ_PATH.to_owned()),
                port: IntOrString::String("metrics".to_owned()),
                ..HTTPGetAction::default()
            }),
            initial_delay_seconds: Some(30),
            period_seconds: Some(30),
            failure_threshold: Some(3),
            ..Probe::default()
        }),
        ..Container::default()
    };
    let pod_spec = PodSpec {
        host_pid: Some(true),
        service_account_name: Some(names.agent.clone()),
        automount_service_account_token: Some(false),
        containers: vec![container],
        tolerations: Some(
            agent
                .tolerations
                .clone()
                .unwrap_or_else(|| defaults.default_agent_tolerations()),
        ),
        node_selector: Some(agent.node_selector.clone().unwrap_or_else(linux_nodes)),
        priority_class_name: agent.priority_class_name.clone(),
        termination_grace_period_seconds: Some(30),
        security_context: Some(PodSecurityContext::default()),
        volumes: Some(volumes),
        ..PodSpec::default()
    };
    let set = DaemonSet {
        metadata: owned_meta(store, names, &names.agent, "agent"),
        spec: DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(selector_labels(names, "agent")),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(common_labels(names, "agent")),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec),
            },
            ..DaemonSetSpec::default()
        },
        ..DaemonSet::default()
    };
    stamp_applied_hash(set, "DaemonSet")
}

fn host_path_volume(name: &str, path: &str, type_: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        host_path: Some(HostPathVolumeSource {
            path: path.to_owned(),
            type_: Some(type_.to_owned()),
        }),
        ..Volume::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    }
}

/// One `operator: Exists` toleration: every node, tainted or not, is profiled.
pub fn tolerate_everything() -> Vec<Toleration> {
    vec![Toleration {
        operator: Some("Exists".to_owned()),
        ..Toleration::default()
    }]
}

fn linux_nodes() -> BTreeMap<String, String> {
    BTreeMap::from([("kubernetes.io/os".to_owned(), "linux".to_owned())])
}

/// Requests 100m CPU / 256Mi, limit 1Gi memory (symbol tables of large binaries need headroom).
pub fn default_agent_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity("100m".to_owned())),
            ("memory".to_owned(), Quantity("256Mi".to_owned())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity("1Gi".to_owned()),
        )])),
        ..ResourceRequirements::default()
    }
}
