//! Pure builders: a `ProfileStore` (plus its targets) in, typed Kubernetes objects out. No IO.
//!
//! Every object carries the same label set, an owner reference to the store where Kubernetes
//! allows one, and a hash of its own content in [`APPLIED_HASH_ANNOTATION`], which the reconciler
//! compares with the live object to skip writes when nothing changed.

pub mod agent;
pub mod command_line;
pub mod network_policy;
pub mod recording;
pub mod store;
pub mod targets;
pub mod tokens;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use serde::Serialize;

use crate::api::ProfileStore;

/// Annotation holding the hash of the desired object the operator last applied.
pub const APPLIED_HASH_ANNOTATION: &str = "kiln.dev/applied-hash";
/// Pod-template annotation with the hash of the store config, so config edits roll the pods.
pub const CONFIG_HASH_ANNOTATION: &str = "kiln.dev/config-hash";
/// Label naming the store an object belongs to (also on cluster-scoped objects).
pub const STORE_LABEL: &str = "kiln.dev/store";
/// Label naming the store's namespace, for cluster-scoped objects.
pub const STORE_NAMESPACE_LABEL: &str = "kiln.dev/store-namespace";
/// The one field manager of every server-side apply the operator sends.
pub const FIELD_MANAGER: &str = "kiln-operator";

/// Operator-wide settings the builders need besides the CR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildDefaults {
    /// Store image when `spec.image` is unset.
    pub store_image: String,
    /// Agent image when `spec.agent.image` is unset.
    pub agent_image: String,
    /// Other agent images a ProfileStore may ask for: exact references, or
    /// prefixes ending in `*`. Agents run privileged on every node, so the
    /// cluster admin who installs the operator chooses them, not whoever
    /// may create a ProfileStore: an image of that user's choosing would get
    /// root on every node.
    pub allowed_agent_images: Vec<String>,
    /// Taint keys agents may tolerate, or `*` for any taint. For the same
    /// reason as the images: where a privileged agent runs (control-plane
    /// nodes, dedicated pools) is the installer's choice, not a store author's.
    pub allowed_agent_tolerations: Vec<String>,
    /// `imagePullPolicy` of the store and agent containers; `None` leaves
    /// Kubernetes' default (`IfNotPresent` for a tagged image). `Never` runs
    /// images loaded into the nodes' runtime without a registry.
    pub image_pull_policy: Option<ImagePullPolicy>,
}

/// A container's `imagePullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImagePullPolicy {
    /// Pull on every start.
    Always,
    /// Pull only when the node lacks the image.
    IfNotPresent,
    /// Never pull: the image must already be on the node.
    Never,
}

impl ImagePullPolicy {
    /// The value Kubernetes takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

impl BuildDefaults {
    /// Whether a store may run agents from `image`.
    pub fn agent_image_allowed(&self, image: &str) -> bool {
        image == self.agent_image
            || self
                .allowed_agent_images
                .iter()
                .any(|allowed| match allowed.strip_suffix('*') {
                    Some(prefix) => image.starts_with(prefix),
                    None => image == allowed,
                })
    }

    /// The first of a store's tolerations the operator does not allow, if any. An empty key
    /// (with `Exists`) tolerates every taint, so only `*` allows it.
    pub fn refused_toleration<'a>(&self, tolerations: &'a [Toleration]) -> Option<&'a Toleration> {
        tolerations.iter().find(|toleration| {
            let key = toleration.key.as_deref().unwrap_or("");
            !self
                .allowed_agent_tolerations
                .iter()
                .any(|allowed| allowed == "*" || (!key.is_empty() && allowed == key))
        })
    }

    /// The containers' `imagePullPolicy`, as Kubernetes spells it.
    pub fn image_pull_policy(&self) -> Option<String> {
        self.image_pull_policy
            .map(|policy| policy.as_str().to_owned())
    }

    /// Tolerations of agents whose store sets none: every allowed taint, so every node the
    /// operator allows is profiled.
    pub fn default_agent_tolerations(&self) -> Vec<Toleration> {
        if self.allowed_agent_tolerations.iter().any(|key| key == "*") {
            return agent::tolerate_everything();
        }
        self.allowed_agent_tolerations
            .iter()
            .map(|key| Toleration {
                key: Some(key.clone()),
                operator: Some("Exists".to_owned()),
                ..Toleration::default()
            })
            .collect()
    }
}

impl Default for BuildDefaults {
    fn default() -> Self {
        Self {
            store_image: "ghcr.io/kiln-dev/kiln-store:0.1.0".to_owned(),
            agent_image: "ghcr.io/kiln-dev/kiln-agent:0.1.0".to_owned(),
            allowed_agent_images: Vec::new(),
            // Every node, as before the allow-list existed; installers narrow it.
            allowed_agent_tolerations: vec!["*".to_owned()],
            image_pull_policy: None,
        }
    }
}

/// Why a store could not be turned into objects.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The store has no namespace or name (it was not read from the API server).
    #[error("ProfileStore has no {field}")]
    MissingMetadata {
        /// The missing metadata field.
        field: &'static str,
    },
    /// An object could not be serialized for hashing (cannot happen for k8s-openapi types).
    #[error("could not serialize {kind} for hashing")]
    Hash {
        /// Kind of the object.
        kind: &'static str,
        /// The serializer's description.
        #[source]
        source: serde_json::Error,
    },
    /// The settings of a binary cannot be rendered as its flags.
    #[error("cannot render {binary}'s setting `{setting}` as a flag: it {problem}")]
    CommandLine {
        /// The binary.
        binary: &'static str,
        /// The setting, as its field is named.
        setting: String,
        /// What is wrong.
        problem: String,
    },
    /// The targets file could not be written.
    #[error("could not write the targets file")]
    Targets {
        /// The targets crate's description.
        #[source]
        source: kiln_targets::TargetsError,
    },
}

impl BuildError {
    /// A fixed name of the error kind, for metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingMetadata { .. } => "missing_metadata",
            Self::Hash { .. } => "hash",
            Self::Targets { .. } => "targets",
            Self::CommandLine { .. } => "command_line",
        }
    }
}

/// Names of every child of one store, derived from the store's name and namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreNames {
    /// Namespace of the store and of every namespaced child.
    pub namespace: String,
    /// The store's name; also the StatefulSet's and the client Service's.
    pub store: String,
    /// Governing headless Service.
    pub headless_service: String,
    /// Store config ConfigMap.
    pub config: String,
    /// Agent DaemonSet and ServiceAccount.
    pub agent: String,
    /// Agents' targets ConfigMap.
    pub targets: String,
    /// The store's bearer tokens Secret, created once and then left to its users.
    pub tokens: String,
    /// The cluster-scoped agent binding earlier operators created (agents
    /// need no API access, so it is only ever deleted now).
    pub agent_binding: String,
}

impl StoreNames {
    /// Derives the names; fails when the store lacks metadata.
    pub fn of(store: &ProfileStore) -> Result<Self, BuildError> {
        let name = store
            .metadata
            .name
            .clone()
            .ok_or(BuildError::MissingMetadata { field: "name" })?;
        let namespace = store
            .metadata
            .namespace
            .clone()
            .ok_or(BuildError::MissingMetadata { field: "namespace" })?;
        Ok(Self {
            headless_service: format!("{name}-headless"),
            config: format!("{name}-config"),
            agent: format!("{name}-agent"),
            targets: format!("{name}-targets"),
            tokens: format!("{name}-tokens"),
            agent_binding: format!("kiln-agent-{namespace}-{name}"),
            namespace,
            store: name,
        })
    }

    /// In-cluster address of the client Service.
    pub fn endpoint(&self, port: i32) -> String {
        format!("{}.{}.svc:{port}", self.store, self.namespace)
    }
}

/// Labels on every child; `component` is `store` or `agent`.
pub fn common_labels(names: &StoreNames, component: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(names, component);
    labels.insert(
        "app.kubernetes.io/managed-by".to_owned(),
        FIELD_MANAGER.to_owned(),
    );
    labels.insert(STORE_LABEL.to_owned(), names.store.clone());
    labels.insert(STORE_NAMESPACE_LABEL.to_owned(), names.namespace.clone());
    labels
}

/// The immutable subset of labels used in workload selectors.
pub fn selector_labels(names: &StoreNames, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_owned(),
            format!("kiln-{component}"),
        ),
        ("app.kubernetes.io/instance".to_owned(), names.store.clone()),
        (
            "app.kubernetes.io/component".to_owned(),
            component.to_owned(),
        ),
    ])
}

/// Metadata of a namespaced child owned (and garbage-collected) with the store.
pub fn owned_meta(
    store: &ProfileStore,
    names: &StoreNames,
    name: &str,
    component: &str,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(names.namespace.clone()),
        labels: Some(common_labels(names, component)),
        owner_references: controller_owner(store).map(|owner| vec![owner]),
        ..ObjectMeta::default()
    }
}

fn controller_owner(store: &ProfileStore) -> Option<OwnerReference> {
    store.controller_owner_ref(&())
}

/// 64-bit FNV-1a: stable across Rust versions and platforms, unlike `DefaultHasher`.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Hashes an object's JSON form and records it in [`APPLIED_HASH_ANNOTATION`].
pub fn stamp_applied_hash<K: Resource + Serialize>(
    mut object: K,
    kind: &'static str,
) -> Result<K, BuildError> {
    let json = serde_json::to_vec(&object).map_err(|source| BuildError::Hash { kind, source })?;
    let hash = format!("{:016x}", stable_hash(&json));
    object
        .meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(APPLIED_HASH_ANNOTATION.to_owned(), hash);
    Ok(object)
}

/// The hash a live object was applied with, if any.
pub fn applied_hash<K: Resource>(object: &K) -> Option<&str> {
    object
        .meta()
        .annotations
        .as_ref()?
        .get(APPLIED_HASH_ANNOTATION)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_hash_matches_known_fnv1a_values() {
        assert_eq!(stable_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
