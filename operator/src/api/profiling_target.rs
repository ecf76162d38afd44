//! `ProfilingTarget`: which pods of a namespace a store's agents profile, and how.
// Each `printcolumn(...)` repeats keys like `type_`, which clippy mistakes for duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::profile_store::DNS_SUBDOMAIN_PATTERN;

/// An RFC 1123 label: the shape of container names.
pub const CONTAINER_NAME_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// Longest value of a `labels` entry.
pub const MAX_LABEL_VALUE_LENGTH: usize = 256;
/// Longest name of a `labels` entry (the CEL rule on `labels` repeats it).
pub const MAX_LABEL_NAME_LENGTH: usize = 63;

/// Selects pods in this target's namespace for profiling by a `ProfileStore`'s agents.
///
/// The operator aggregates every target that points at a store into the targets file mounted into
/// that store's agents; edits reach running agents without a restart.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kiln.dev",
    version = "v1alpha1",
    kind = "ProfilingTarget",
    namespaced,
    doc = "Selects pods of its namespace for profiling by a ProfileStore's agents.",
    status = "ProfilingTargetStatus",
    shortname = "ptarget",
    category = "kiln",
    derive = "PartialEq",
    printcolumn(name = "Store", type_ = "string", json_path = ".spec.storeRef.name"),
    printcolumn(name = "Hz", type_ = "integer", json_path = ".spec.samplingHz"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(name = "Suspended", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProfilingTargetSpec {
    /// The store whose agents profile the selected pods.
    pub store_ref: StoreRef,
    /// Pods of this target's namespace to select; all pods when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Also require the pod annotation `profiles.kiln.dev/enabled: "true"`.
    #[serde(default = "default_true")]
    pub require_annotation: bool,
    /// Container names to profile; every container when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(pattern(CONTAINER_NAME_PATTERN), length(max = 63))
    )]
    pub containers: Vec<String>,
    /// Sampling frequency in Hz. Pods may override it with `profiles.kiln.dev/sampling-hz`.
    #[serde(default = "default_sampling_hz")]
    #[schemars(range(min = 1, max = 1000))]
    pub sampling_hz: u32,
    /// Labels added to every profile of the selected containers.
    ///
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    /// Names must match `[a-zA-Z_][a-zA-Z0-9_]*` and may not be one the agent sets itself
    /// (`node`, `namespace`, `pod`, `pod_uid`, `container`, `container_id`, `comm`, `pid`,
    /// `service_name`); the operator reports violations in the `Reconciled` condition. That is
    /// not a CEL rule because map keys have no maxLength, so a pattern over them breaks the CEL
    /// cost budget. Names are at most 63 and values at most 256 characters, so one target adds
    /// at most about 10 KiB to the agents' shared targets file.
    // A structural schema cannot bound map keys, hence the CEL rule; `size` costs the same for
    // any string, so it fits the budget where a pattern does not.
    #[schemars(extend(
        "maxProperties" = 32,
        "additionalProperties" = {"type": "string", "maxLength": MAX_LABEL_VALUE_LENGTH}
    ))]
    #[x_kube(validation = Rule::new("self.all(name, size(name) <= 63)").message("label names are at most 63 characters").reason(Reason::FieldValueInvalid))]
    pub labels: BTreeMap<String, String>,
    /// Scrape the selected pods' pprof endpoints (Go's `net/http/pprof`): heap, allocations,
    /// goroutines, mutex and block profiles, labelled as their CPU profiles are. Each node's
    /// agent scrapes only the pods on its node, over the pod IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pprof: Option<PprofScrapeSpec>,
    /// Stop profiling these pods without deleting the target.
    #[serde(default)]
    pub suspend: bool,
}

/// Which pprof endpoints of a pod to scrape, and how often.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.timeoutSeconds <= self.intervalSeconds").message("pprof.timeoutSeconds must be at most pprof.intervalSeconds").reason(Reason::FieldValueInvalid))]
pub struct PprofScrapeSpec {
    /// The pod port serving pprof: a number (1 to 65535), or the name of a container port
    /// (`ports[].name`, e.g. `http-debug`), resolved on each pod as a Service's `targetPort`
    /// is. A pod that declares no port of that name is not scraped; its node's agent counts
    /// `kiln_agent_scrape_errors_total{reason="port_name"}`.
    #[schemars(schema_with = "pprof_port_schema")]
    pub port: IntOrString,
    /// The path the profiles are served under.
    #[serde(default = "default_pprof_path")]
    #[schemars(pattern(PPROF_PATH_PATTERN), length(max = 256))]
    pub path_prefix: String,
    /// Which profiles: `heap` and `goroutine` are stored as they are (in use now);
    /// `allocs`, `mutex` and `block` count since the process started and are stored as the
    /// difference between two scrapes, so a range query means "in this range". Default: all five.
    #[serde(default = "default_pprof_profiles")]
    #[schemars(length(min = 1, max = 5))]
    pub profiles: Vec<PprofProfileName>,
    /// Seconds between two scrapes of one pod.
    #[serde(default = "default_pprof_interval")]
    #[schemars(range(min = 5, max = 3600))]
    pub interval_seconds: u32,
    /// Seconds one scrape may take (at most `intervalSeconds`).
    #[serde(default = "default_pprof_timeout")]
    #[schemars(range(min = 1, max = 60))]
    pub timeout_seconds: u32,
}

/// A profile served by `net/http/pprof`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PprofProfileName {
    /// In-use heap.
    Heap,
    /// Allocations.
    Allocs,
    /// Goroutines.
    Goroutine,
    /// Mutex contention.
    Mutex,
    /// Blocking on synchronization.
    Block,
}

/// A port name as Kubernetes takes one (`IANA_SVC_NAME`): lowercase letters, digits and single
/// `-` between them, with at least one letter (so `"6060"` is no name); at most 15 characters,
/// which `maxLength` says. The same rule as [`kiln_targets::is_port_name`], which a test keeps
/// equal.
pub const PORT_NAME_PATTERN: &str = r"^([a-z0-9]+-)*[a-z0-9]*[a-z][a-z0-9]*(-[a-z0-9]+)*$";

/// `port`: an integer or a string (`x-kubernetes-int-or-string`, no `type`), with the number's
/// range and the name's shape. Each value validation applies to its own JSON type only, as
/// `pattern` does on the quantities of `resources`.
fn pprof_port_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "minimum": 1,
        "maximum": 65535,
        "maxLength": kiln_targets::port::MAX_PORT_NAME_LENGTH,
        "pattern": PORT_NAME_PATTERN,
    })
}

/// An absolute path of plain characters, no `..`.
const PPROF_PATH_PATTERN: &str = r"^/([A-Za-z0-9_~-]+(\.[A-Za-z0-9_~-]+)*/?)*$";

fn default_pprof_path() -> String {
    "/debug/pprof".to_owned()
}
fn default_pprof_profiles() -> Vec<PprofProfileName> {
    vec![
        PprofProfileName::Heap,
        PprofProfileName::Allocs,
        PprofProfileName::Goroutine,
        PprofProfileName::Mutex,
        PprofProfileName::Block,
    ]
}
fn default_pprof_interval() -> u32 {
    15
}
fn default_pprof_timeout() -> u32 {
    10
}

/// Reference to a `ProfileStore`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoreRef {
    /// Name of the store.
    #[schemars(pattern(DNS_SUBDOMAIN_PATTERN), length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of the store; this target's namespace when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DNS_SUBDOMAIN_PATTERN), length(max = 63))]
    pub namespace: Option<String>,
}

/// Observed state of a `ProfilingTarget`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfilingTargetStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (published to the store's agents) and `Reconciled`.
    #[serde(default)]
    #[schemars(schema_with = "super::condition::conditions_schema")]
    pub conditions: Vec<Condition>,
}

impl ProfilingTarget {
    /// Namespace of the referenced store: `storeRef.namespace`, else the target's own.
    pub fn store_namespace(&self) -> Option<&str> {
        self.spec
            .store_ref
            .namespace
            .as_deref()
            .or(self.metadata.namespace.as_deref())
    }
}

fn default_true() -> bool {
    true
}
fn default_sampling_hz() -> u32 {
    19
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CRD's pattern (with its 15-character bound) admits exactly the names the agent
    /// resolves.
    #[test]
    fn the_port_name_pattern_is_the_agents_rule() {
        let pattern = regex::Regex::new(PORT_NAME_PATTERN).expect("valid pattern");
        let admitted = |name: &str| {
            pattern.is_match(name) && name.len() <= kiln_targets::port::MAX_PORT_NAME_LENGTH
        };
        for name in [
            "pprof",
            "http-debug",
            "a",
            "80-x",
            "x-80",
            "a1-b2-c3",
            "abcdefghijklmno",
            "abcdefghijklmnop",
            "",
            "6060",
            "60-60",
            "Pprof",
            "http_debug",
            "-pprof",
            "pprof-",
            "http--debug",
            "pprof ",
        ] {
            assert_eq!(admitted(name), kiln_targets::is_port_name(name), "{name:?}");
        }
    }
}
