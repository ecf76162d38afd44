//! `ProfileStore`: one Kiln store (a StatefulSet) plus the agent DaemonSet that ships to it.
// Each `printcolumn(...)` repeats keys like `type_`, which clippy mistakes for duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::recording_rule::RecordingRuleSpec;
use super::symbolization::SymbolizationSpec;

/// A duration as the store's `--retention` flag takes it: `30d`, `168h`, `2w`.
pub const DURATION_PATTERN: &str = r"^[0-9]+(ms|s|m|h|d|w)$";
/// A Kubernetes quantity as written by users: `10Gi`, `500M`, `1T`.
pub const QUANTITY_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$";
/// An RFC 1123 DNS subdomain, the shape of most object names.
pub const DNS_SUBDOMAIN_PATTERN: &str = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$";
/// An S3-compatible bucket name.
pub const BUCKET_PATTERN: &str = r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$";
/// A retention: a positive duration (`0s` would delete everything).
pub const RETENTION_PATTERN: &str = r"^[1-9][0-9]*(ms|s|m|h|d|w)$";
/// The CRI sockets of the container runtimes Kiln supports
/// ([`kiln_targets::KNOWN_CRI_SOCKETS`], a test keeps the two equal): the agent
/// mounts the one a store names, so it cannot be pointed at any other host path.
pub const CRI_SOCKET_PATTERN: &str = r"^(/run/containerd/containerd\.sock|/var/run/containerd/containerd\.sock|/run/k3s/containerd/containerd\.sock|/var/run/crio/crio\.sock|/run/crio/crio\.sock|/run/cri-dockerd\.sock|/var/run/cri-dockerd\.sock)$";

/// Default port of the store's combined gRPC + HTTP listener.
pub const DEFAULT_STORE_PORT: i32 = 7470;

/// A Kiln profile store and its node agents.
///
/// The operator runs the store as a StatefulSet with headless and client Services and, unless
/// `agent.enabled` is false, a DaemonSet of eBPF agents that profile the pods selected by the
/// `ProfilingTarget`s pointing at this store (or annotated `profiles.kiln.dev/enabled: "true"`).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kiln.dev",
    version = "v1alpha1",
    kind = "ProfileStore",
    namespaced,
    doc = "A Kiln profile store (StatefulSet) and the eBPF agents (DaemonSet) that ship to it.",
    status = "ProfileStoreStatus",
    shortname = "pstore",
    category = "kiln",
    derive = "PartialEq",
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Agents", type_ = "integer", json_path = ".status.agentsReady"),
    printcolumn(
        name = "Retention",
        type_ = "string",
        json_path = ".spec.retention.duration"
    ),
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Available')].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Paused",
        type_ = "boolean",
        json_path = ".spec.paused",
        priority = "1"
    )
)]
#[x_kube(validation = Rule::new("self.replicas <= 1 || has(self.objectStorage)").message("replicas above 1 need objectStorage: replicas share data only through the bucket").reason(Reason::FieldValueForbidden))]
#[serde(rename_all = "camelCase")]
pub struct ProfileStoreSpec {
    /// Store image; defaults to the operator's `--store-image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Store replicas. More than one requires `objectStorage`.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 64))]
    pub replicas: i32,
    /// How long profiles are kept.
    #[serde(default)]
    pub retention: RetentionSpec,
    /// Local volume of each replica (write-ahead log, head, block cache).
    #[serde(default)]
    pub storage: StorageSpec,
    /// Optional S3-compatible bucket that holds the blocks; required for more than one replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_storage: Option<ObjectStorageSpec>,
    /// Store container resources; defaults to requests 250m/512Mi and a 2Gi memory limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resources_schema")]
    pub resources: Option<ResourceRequirements>,
    /// Port of the client Service (gRPC ingest, HTTP query and UI).
    #[serde(default = "default_service_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub service_port: i32,
    /// The node agents that profile selected pods and ship to this store.
    #[serde(default)]
    pub agent: AgentSpec,
    /// Bearer tokens the store requires. The operator generates them once into the Secret
    /// `<store>-tokens` (keys `write-token` and `read-token`) and never rewrites it.
    #[serde(default)]
    pub auth: AuthSpec,
    /// A NetworkPolicy in front of the store; off unless enabled.
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,
    /// Stop reconciling: children are left as they are until this is false again.
    #[serde(default)]
    pub paused: bool,
    /// Recording rules: counters the store computes from incoming profiles, served at its
    /// `/metrics/recorded` and through its Prometheus-compatible query API. At most 64, metric
    /// names unique. A rule the operator finds invalid is left out of the store's config and
    /// named in the `RecordingRulesValid` condition; the others still apply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["metricName".to_owned()]))]
    pub recording_rules: Vec<RecordingRuleSpec>,
    /// Naming frames that arrive as a build id and an address only (stripped binaries, the
    /// OpenTelemetry eBPF profiler, Parca Agent) at query time: debuginfod servers, uploads
    /// of debug info, and the cache of resolved addresses.
    #[serde(default)]
    pub symbolization: SymbolizationSpec,
}

/// Retention of profiles in the store.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetentionSpec {
    /// Delete profiles older than this (`72h`, `30d`, `2w`).
    #[serde(default = "default_retention")]
    #[schemars(pattern(RETENTION_PATTERN))]
    pub duration: String,
    /// Optionally also delete the oldest blocks once storage exceeds this size (`50Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(QUANTITY_PATTERN))]
    pub size: Option<String>,
    /// How long the series of `recordingRules` are kept (`90d`, `52w`), independently of the
    /// profiles; the store's default (`90d`) when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(RETENTION_PATTERN), length(max = 32))]
    pub recorded: Option<String>,
}

/// Local storage of each store replica.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("self.ephemeral == oldSelf.ephemeral").message("storage.ephemeral cannot change after creation").reason(Reason::FieldValueForbidden))]
// On the struct, not the field: a rule on an optional field runs only when the old and new
// objects both set it, so setting or removing a class would pass, and the StatefulSet's
// claim templates, which cannot change, would then refuse every apply.
#[x_kube(validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)").message("storage.storageClassName is immutable").reason(Reason::FieldValueForbidden))]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// PersistentVolumeClaim size per replica. It can only grow; the operator expands the claims.
    #[serde(default = "default_storage_size")]
    #[schemars(pattern(QUANTITY_PATTERN), length(max = 32))]
    #[x_kube(validation = Rule::new("quantity(self).compareTo(quantity(oldSelf)) >= 0").message("storage.size can only grow").reason(Reason::FieldValueForbidden))]
    pub size: String,
    /// StorageClass of the claims; the cluster default when unset. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub storage_class_name: Option<String>,
    /// Use an emptyDir instead of claims: data is lost with the pod. For trying Kiln out.
    #[serde(default)]
    pub ephemeral: bool,
}

/// An S3-compatible bucket for blocks.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStorageSpec {
    /// Bucket name.
    #[schemars(pattern(BUCKET_PATTERN))]
    pub bucket: String,
    /// Endpoint URL for non-AWS services (MinIO, Ceph, R2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^https?://.+$"))]
    pub endpoint: Option<String>,
    /// Bucket region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Key prefix inside the bucket. Default: `<namespace>/<name>`, so stores sharing a bucket never mix; `/` for the bucket's root (where stores before v0.2 wrote). The store claims its prefix, and a store of another name refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Credentials from a Secret in the store's namespace; otherwise the pod's ambient identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretKeysRef>,
}

/// Keys of a Secret holding S3 credentials.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeysRef {
    /// Secret name, in the store's namespace.
    #[schemars(pattern(DNS_SUBDOMAIN_PATTERN), length(max = 253))]
    pub name: String,
    /// Key holding the access key id.
    #[serde(default = "default_access_key_id_key")]
    pub access_key_id_key: String,
    /// Key holding the secret access key.
    #[serde(default = "default_secret_access_key_key")]
    pub secret_access_key_key: String,
}

/// The node agent DaemonSet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// Run agents for this store. At most one store per cluster should enable them.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Agent image; defaults to the operator's `--agent-image`. Any other image must be in the
    /// operator's `--allowed-agent-images`, or agents are not started (`AgentImageNotAllowed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Agent container resources; defaults to requests 100m/256Mi and a 1Gi memory limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resources_schema")]
    pub resources: Option<ResourceRequirements>,
    /// Tolerations; by default every taint the operator's `--allowed-agent-tolerations` allows
    /// (every taint unless the operator narrows it). A key outside that list is refused and
    /// agents are not started (`AgentTolerationNotAllowed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Node selector; defaults to `kubernetes.io/os: linux`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Priority class of agent pods; none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Host path of the container runtime's CRI socket: containerd's, k3s's, CRI-O's or
    /// cri-dockerd's well-known path. Mounted read-only.
    #[serde(default = "default_cri_socket")]
    #[schemars(pattern(CRI_SOCKET_PATTERN))]
    pub container_runtime_socket: String,
    /// `privileged` works everywhere; `capabilities` grants only BPF, PERFMON, SYS_PTRACE,
    /// CHECKPOINT_RESTORE and DAC_READ_SEARCH and needs kernel 5.11+ and a recent runtime.
    #[serde(default)]
    pub security_mode: SecurityMode,
    /// Also record off-CPU time (`off_cpu` profiles: where the profiled pods' threads blocked,
    /// and for how long). Off by default: the agents then hook every context switch and wakeup
    /// on the node, a few tens of nanoseconds each, for every process.
    #[serde(default)]
    pub off_cpu: bool,
}

/// Which of the store's APIs need a bearer token from the `<store>-tokens` Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthSpec {
    /// Writes (gRPC WriteRaw and Push, `/ingest`) need the `write-token`; the operator mounts it
    /// into the agents. On by default: without it any pod in the cluster can write profiles
    /// with spoofed namespace and pod labels. Set false only when clients that cannot send a
    /// token, such as in-cluster Pyroscope SDKs, push to this store.
    #[serde(default = "default_true")]
    pub require_write_token: bool,
    /// Queries need the `read-token`. Off by default because the store's web UI cannot send a
    /// token yet, so turning this on breaks the UI; API clients send `authorization: Bearer`.
    #[serde(default)]
    pub require_read_token: bool,
}

/// The store's NetworkPolicy: only this store's agents and the listed clients may connect to
/// its port. `kubectl port-forward` and kubelet probes still reach it (they do not pass
/// through pod networking on common CNIs), so the UI keeps working.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Create the policy. Off by default because it cuts off every in-cluster client not in
    /// `allowFrom` (Grafana, Pyroscope SDKs), and only takes effect where the CNI enforces
    /// NetworkPolicies.
    #[serde(default)]
    pub enabled: bool,
    /// Other clients admitted besides the agents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub allow_from: Vec<AllowedPeer>,
}

/// Pods admitted to the store, as a NetworkPolicy peer with label-equality selectors.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.namespaceSelector) || has(self.podSelector)").message("an allowFrom entry needs namespaceSelector or podSelector").reason(Reason::FieldValueRequired))]
#[serde(rename_all = "camelCase")]
pub struct AllowedPeer {
    /// Labels of the namespaces whose pods may connect (`{}`: every namespace); without it,
    /// the store's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<BTreeMap<String, String>>,
    /// Labels of the pods that may connect; without it, every pod of the selected namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<BTreeMap<String, String>>,
}

/// How much privilege agent pods get.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SecurityMode {
    /// `privileged: true`.
    #[default]
    Privileged,
    /// Unprivileged with the minimal capability set for eBPF profiling.
    Capabilities,
}

/// Observed state of a `ProfileStore`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfileStoreStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Store replicas the StatefulSet runs.
    #[serde(default)]
    pub replicas: i32,
    /// Store replicas that are ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Agent pods the DaemonSet wants.
    #[serde(default)]
    pub agents_desired: i32,
    /// Agent pods that are ready.
    #[serde(default)]
    pub agents_ready: i32,
    /// ProfilingTargets published to this store's agents.
    #[serde(default)]
    pub matched_targets: i32,
    /// In-cluster address of the store, `<service>.<namespace>.svc:<port>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `Available`, `AgentsReady`, `Reconciled` and `RecordingRulesValid`.
    #[serde(default)]
    #[schemars(schema_with = "super::condition::conditions_schema")]
    pub conditions: Vec<Condition>,
}

impl Default for RetentionSpec {
    fn default() -> Self {
        Self {
            duration: default_retention(),
            size: None,
            recorded: None,
        }
    }
}

impl Default for StorageSpec {
    fn default() -> Self {
        Self {
            size: default_storage_size(),
            storage_class_name: None,
            ephemeral: false,
        }
    }
}

impl Default for AuthSpec {
    fn default() -> Self {
        Self {
            require_write_token: true,
            require_read_token: false,
        }
    }
}

impl AuthSpec {
    /// Whether the store needs the tokens Secret at all.
    pub fn needs_tokens(&self) -> bool {
        self.require_write_token || self.require_read_token
    }
}

impl Default for AgentSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            image: None,
            resources: None,
            tolerations: None,
            node_selector: None,
            priority_class_name: None,
            container_runtime_socket: default_cri_socket(),
            security_mode: SecurityMode::Privileged,
            off_cpu: false,
        }
    }
}

fn default_replicas() -> i32 {
    1
}
fn default_retention() -> String {
    "168h".to_owned()
}
fn default_storage_size() -> String {
    "10Gi".to_owned()
}
fn default_service_port() -> i32 {
    DEFAULT_STORE_PORT
}
fn default_true() -> bool {
    true
}
fn default_cri_socket() -> String {
    // containerd's; CRI-O users set `/var/run/crio/crio.sock`.
    kiln_targets::DEFAULT_CRI_SOCKET.to_owned()
}
fn default_access_key_id_key() -> String {
    "AWS_ACCESS_KEY_ID".to_owned()
}
fn default_secret_access_key_key() -> String {
    "AWS_SECRET_ACCESS_KEY".to_owned()
}

/// A lean schema for container resources: the full upstream one repeats the long Quantity
/// description for every map and would bloat the CRD toward client-side apply's size limit.
fn resources_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let quantities = schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "x-kubernetes-int-or-string": true,
            "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
        }
    });
    schemars::json_schema!({
        "description": "Compute resources, as in a container's `resources` (requests and limits).",
        "type": "object",
        "nullable": true,
        "properties": {
            "limits": quantities.clone(),
            "requests": quantities,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CRD admits exactly the sockets the agent side knows.
    #[test]
    fn the_cri_socket_pattern_lists_the_known_sockets() {
        let alternatives = CRI_SOCKET_PATTERN
            .strip_prefix("^(")
            .and_then(|rest| rest.strip_suffix(")$"))
            .expect("an anchored list of alternatives");
        let listed: Vec<String> = alternatives
            .split('|')
            .map(|path| path.replace(r"\.", "."))
            .collect();
        assert_eq!(listed, kiln_targets::KNOWN_CRI_SOCKETS);
        let pattern = regex::Regex::new(CRI_SOCKET_PATTERN).expect("valid pattern");
        assert!(pattern.is_match(kiln_targets::DEFAULT_CRI_SOCKET));
        assert!(!pattern.is_match("/etc/shadow"));
    }

    /// Every duration the CRD admits is one the store parses, with the length
    /// the unit says.
    #[test]
    fn crd_durations_are_store_durations() {
        let duration = regex::Regex::new(DURATION_PATTERN).expect("valid pattern");
        let retention = regex::Regex::new(RETENTION_PATTERN).expect("valid pattern");
        for (unit, seconds) in [
            ("s", 1),
            ("m", 60),
            ("h", 3_600),
            ("d", 86_400),
            ("w", 604_800),
        ] {
            for amount in [1u64, 30, 168] {
                let text = format!("{amount}{unit}");
                assert!(
                    duration.is_match(&text) && retention.is_match(&text),
                    "{text}"
                );
                assert_eq!(
                    kiln_contract::duration::parse_duration(&text),
                    Ok(std::time::Duration::from_secs(amount * seconds)),
                    "{text}"
                );
            }
        }
        assert_eq!(
            kiln_contract::duration::parse_duration("500ms"),
            Ok(std::time::Duration::from_millis(500))
        );
        assert!(duration.is_match("500ms") && duration.is_match("0s"));
        assert!(!retention.is_match("0s"));
        assert!(kiln_contract::duration::parse_duration(&default_retention()).is_ok());
    }
}
