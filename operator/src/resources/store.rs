//! The store side: config ConfigMap, headless and client Services, StatefulSet.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapEnvSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvFromSource, EnvVar, EnvVarSource, HTTPGetAction, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, Service, ServicePort,
    ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kiln_store_settings::{BucketOptions, StoreSettings};

use super::{
    BuildDefaults, BuildError, CONFIG_HASH_ANNOTATION, StoreNames, command_line, common_labels,
    owned_meta, recording, selector_labels, stable_hash, stamp_applied_hash, tokens,
};
use crate::api::ProfileStore;
use kiln_contract::endpoints::{HEALTHZ_PATH, READYZ_PATH};

use crate::api::profile_store::DEFAULT_STORE_PORT;

/// Where the store keeps its data inside the container.
pub const DATA_DIR: &str = "/var/lib/kiln";
/// Name of the data volume (and of the claim template, so claims are `data-<store>-<i>`).
pub const DATA_VOLUME: &str = "data";
/// Name of the store's listener port.
pub const PORT_NAME: &str = "api";
/// The store's port inside its pod, as a `u16` for its listen address.
const STORE_CONTAINER_PORT: u16 = {
    assert!(DEFAULT_STORE_PORT > 0 && DEFAULT_STORE_PORT <= u16::MAX as i32);
    DEFAULT_STORE_PORT as u16
};
/// Non-root user of the distroless store image.
const STORE_UID: i64 = 65532;

/// The store's object storage settings from the spec (none: the store's
/// local default), in the store's own settings type.
pub fn bucket_options(store: &ProfileStore) -> BucketOptions {
    let Some(bucket) = &store.spec.object_storage else {
        return BucketOptions::default();
    };
    // Unset: the store's own prefix, so two stores given one bucket never
    // mix; set to "/" (or empty): the bucket's root, as earlier releases used.
    let prefix = match bucket.prefix.as_deref() {
        Some(prefix) => prefix.trim_matches('/').to_owned(),
        None => store_name(store),
    };
    BucketOptions {
        kind: Some("s3".to_owned()),
        name: Some(bucket.bucket.clone()),
        endpoint: bucket.endpoint.clone(),
        region: bucket.region.clone(),
        prefix: (!prefix.is_empty()).then_some(prefix),
        allow_http: bucket
            .endpoint
            .as_deref()
            .is_some_and(|endpoint| endpoint.starts_with("http://"))
            .then_some(true),
        azure_account: None,
    }
}

/// Store config as environment variables (`envFrom`): the object storage
/// settings of [`bucket_options`] and the valid recording rules of
/// [`recording::recording_options`], by the variable names the store reads.
/// The pod template carries this map's hash, so a rule change rolls the
/// store.
pub fn config_map(store: &ProfileStore, names: &StoreNames) -> Result<ConfigMap, BuildError> {
    let settings = StoreSettings {
        bucket: bucket_options(store),
        recording: recording::recording_options(store),
        ..StoreSettings::default()
    };
    let config = ConfigMap {
        metadata: owned_meta(store, names, &names.config, "store"),
        data: Some(command_line::render_env("kiln-store", &settings)?),
        ..ConfigMap::default()
    };
    stamp_applied_hash(config, "ConfigMap")
}

/// The governing headless Service: stable per-replica DNS names for the StatefulSet.
pub fn headless_service(store: &ProfileStore, names: &StoreNames) -> Result<Service, BuildError> {
    let service = Service {
        metadata: owned_meta(store, names, &names.headless_service, "store"),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(names, "store")),
            ports: Some(vec![service_port(DEFAULT_STORE_PORT)]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    stamp_applied_hash(service, "Service")
}

/// The client Service that agents ship to and users port-forward to.
pub fn client_service(store: &ProfileStore, names: &StoreNames) -> Result<Service, BuildError> {
    let service = Service {
        metadata: owned_meta(store, names, &names.store, "store"),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(selector_labels(names, "store")),
            ports: Some(vec![service_port(store.spec.service_port)]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    stamp_applied_hash(service, "Service")
}

fn service_port(port: i32) -> ServicePort {
    ServicePort {
        name: Some(PORT_NAME.to_owned()),
        port,
        target_port: Some(IntOrString::String(PORT_NAME.to_owned())),
        protocol: Some("TCP".to_owned()),
        app_protocol: Some("kubernetes.io/h2c".to_owned()),
        ..ServicePort::default()
    }
}

/// The name a store's replicas claim their bucket prefix with, and its
/// default prefix: `<namespace>/<name>`, unique in the cluster.
pub fn store_name(store: &ProfileStore) -> String {
    format!(
        "{}/{}",
        store.metadata.namespace.as_deref().unwrap_or("default"),
        store.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The settings of `kiln-store` the spec asks for, in the store's own
/// settings type; everything else keeps the store's defaults. Bucket
/// settings go through the config ConfigMap's environment instead.
pub fn store_settings(store: &ProfileStore) -> StoreSettings {
    let mut settings = StoreSettings::default();
    settings.storage.store_name = Some(store_name(store));
    settings.server.listen = Some(SocketAddr::from(([0, 0, 0, 0], STORE_CONTAINER_PORT)));
    settings.storage.data_dir = Some(PathBuf::from(DATA_DIR));
    settings.storage.retention = Some(store.spec.retention.duration.clone());
    settings.storage.retention_bytes = store
        .spec
        .retention
        .size
        .as_deref()
        .and_then(quantity_to_bytes);
    settings.storage.memory_budget = store_memory_budget(store).map(|bytes| bytes.to_string());
    settings.storage.peers = store_peers(store);
    let symbolization = &store.spec.symbolization;
    settings.symbolization.debuginfod_urls = (!symbolization.debuginfod_urls.is_empty())
        .then(|| symbolization.debuginfod_urls.join(","));
    // Only a refusal is rendered: the store takes uploads by default.
    settings.symbolization.debuginfo_uploads = (!symbolization.accept_uploads).then_some(false);
    settings.symbolization.debuginfo_max_bytes = symbolization
        .max_debug_file_size
        .as_deref()
        .and_then(quantity_to_bytes)
        .map(|bytes| bytes.to_string());
    settings.symbolization.symbol_cache_bytes = symbolization
        .cache_size
        .as_deref()
        .and_then(quantity_to_bytes)
        .map(|bytes| bytes.to_string());
    settings
}

/// `--peers` for a store of several replicas: every replica by its pod
/// name (the store's default replica name is its host name) and its
/// stable name under the headless Service. Each replica skips itself, so
/// all get the same list. `None` for one replica.
pub fn store_peers(store: &ProfileStore) -> Option<String> {
    let peers: Vec<String> = replica_endpoints(store)
        .into_iter()
        .map(|(name, url)| format!("{name}={url}"))
        .collect();
    (!peers.is_empty()).then(|| peers.join(","))
}

/// Each replica of a store of several, by pod name, and its stable address
/// under the headless Service: what replicas ask each other at, and what
/// agents ship to (each node to one). Empty for one replica.
pub fn replica_endpoints(store: &ProfileStore) -> Vec<(String, String)> {
    if store.spec.replicas <= 1 {
        return Vec::new();
    }
    let name = store.metadata.name.as_deref().unwrap_or_default();
    let namespace = store.metadata.namespace.as_deref().unwrap_or("default");
    (0..store.spec.replicas)
        .map(|i| {
            let pod = format!("{name}-{i}");
            let url =
                format!("http://{pod}.{name}-headless.{namespace}.svc:{STORE_CONTAINER_PORT}");
            (pod, url)
        })
        .collect()
}

/// Command-line flags of `kiln-store`, rendered from [`store_settings`].
pub fn store_args(store: &ProfileStore) -> Result<Vec<String>, BuildError> {
    command_line::render("kiln-store", &store_settings(store))
}

/// The smallest budget `kiln-store` accepts.
const MIN_STORE_MEMORY_BUDGET: u64 = 64 << 20;

/// `--memory-budget` for the store: three quarters of its container's memory
/// limit (the default resources' when the spec sets none). The store sizes
/// its head, block cache and compactions from it; the last quarter is
/// headroom for requests being decoded, the runtime and allocator slack, so
/// the store stays inside the limit instead of being OOM-killed. `None`
/// when the container has no memory limit (the store's own default holds).
pub fn store_memory_budget(store: &ProfileStore) -> Option<u64> {
    let resources = store
        .spec
        .resources
        .clone()
        .unwrap_or_else(default_store_resources);
    let limit = resources.limits?.get("memory").map(|q| q.0.clone())?;
    let bytes = quantity_to_bytes(&limit)?;
    Some((bytes / 4 * 3).max(MIN_STORE_MEMORY_BUDGET))
}

/// Bytes in a Kubernetes quantity of the shape the CRD allows (`50Gi`, `1.5T`, `500000`);
/// `None` for anything else or an overflow. Fractions of a byte round down.
pub fn quantity_to_bytes(quantity: &str) -> Option<u64> {
    let split = quantity
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    let multiplier: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u128 = whole.parse().ok()?;
    let scale = 10u128.pow(u32::try_from(fraction.len()).ok()?);
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().ok()?
    };
    let bytes = whole.checked_mul(multiplier)? + fraction.checked_mul(multiplier)? / scale;
    u64::try_from(bytes).ok()
}

/// The store StatefulSet; `config` is the built config ConfigMap, hashed into the pod template.
pub fn stateful_set(
    store: &ProfileStore,
    names: &StoreNames,
    config: &ConfigMap,
    defaults: &BuildDefaults,
) -> Result<StatefulSet, BuildError> {
    let spec = &store.spec;
    let config_json = serde_json::to_vec(&config.data).map_err(|source| BuildError::Hash {
        kind: "ConfigMap",
        source,
    })?;
    let mut env = Vec::new();
    if let Some(credentials) = spec
        .object_storage
        .as_ref()
        .and_then(|bucket| bucket.credentials_secret_ref.as_ref())
    {
        for (variable, key) in [
            ("AWS_ACCESS_KEY_ID", &credentials.access_key_id_key),
            ("AWS_SECRET_ACCESS_KEY", &credentials.secret_access_key_key),
        ] {
            env.push(EnvVar {
                name: variable.to_owned(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: credentials.name.clone(),
                        key: key.clone(),
                        optional: Some(false),
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            });
        }
    }
    env.extend(tokens::store_env(store, names));
    let probe = |path: &str, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String(PORT_NAME.to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(6),
        ..Probe::default()
    };
    let container = Container {
        name: "kiln-store".to_owned(),
        image: Some(
            spec.image
                .clone()
                .unwrap_or_else(|| defaults.store_image.clone()),
        ),
        image_pull_policy: defaults.image_pull_policy(),
        args: Some(store_args(store)?),
        env: (!env.is_empty()).then_some(env),
        env_from: Some(vec![EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource {
                name: names.config.clone(),
                optional: Some(false),
            }),
            ..EnvFromSource::default()
        }]),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.to_owned()),
            container_port: DEFAULT_STORE_PORT,
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(probe(READYZ_PATH, 5)),
        liveness_probe: Some(probe(HEALTHZ_PATH, 10)),
        resources: Some(
            spec.resources
                .clone()
                .unwrap_or_else(default_store_resources),
        ),
        volume_mounts: Some(vec![
            VolumeMount {
                name: DATA_VOLUME.to_owned(),
                mount_path: DATA_DIR.to_owned(),
                ..VolumeMount::default()
            },
            // The root filesystem is read-only; scratch files go to an emptyDir.
            VolumeMount {
                name: "tmp".to_owned(),
                mount_path: "/tmp".to_owned(),
                ..VolumeMount::default()
            },
        ]),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    let tmp_volume = Volume {
        name: "tmp".to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    };
    let (volumes, claim_templates) = if spec.storage.ephemeral {
        let volume = Volume {
            name: DATA_VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        };
        (vec![volume, tmp_volume], None)
    } else {
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(DATA_VOLUME.to_owned()),
                labels: Some(common_labels(names, "store")),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
                storage_class_name: spec.storage.storage_class_name.clone(),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_owned(),
                        Quantity(spec.storage.size.clone()),
                    )])),
                    ..VolumeResourceRequirements::default()
                }),
                ..PersistentVolumeClaimSpec::default()
            }),
            ..PersistentVolumeClaim::default()
        };
        (vec![tmp_volume], Some(vec![claim]))
    };
    let pod_meta = ObjectMeta {
        labels: Some(common_labels(names, "store")),
        annotations: Some(BTreeMap::from([(
            CONFIG_HASH_ANNOTATION.to_owned(),
            format!("{:016x}", stable_hash(&config_json)),
        )])),
        ..ObjectMeta::default()
    };
    let set = StatefulSet {
        metadata: owned_meta(store, names, &names.store, "store"),
        spec: StatefulSetSpec {
            replicas: Some(spec.replicas),
            service_name: Some(names.headless_service.clone()),
            pod_management_policy: Some("Parallel".to_owned()),
            selector: LabelSelector {
                match_labels: Some(selector_labels(names, "store")),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(pod_meta),
                spec: Some(PodSpec {
                    containers: vec![container],
                    automount_service_account_token: Some(false),
                    termination_grace_period_seconds: Some(60),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(STORE_UID),
                        run_as_group: Some(STORE_UID),
                        fs_group: Some(STORE_UID),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".to_owned(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    volumes: Some(volumes),
                    ..PodSpec::default()
                }),
            },
            volume_claim_templates: claim_templates,
            ..StatefulSetSpec::default()
        },
        ..StatefulSet::default()
    };
    stamp_applied_hash(set, "StatefulSet")
}

/// Requests 250m CPU / 512Mi, limit 2Gi memory: never empty, so the store is not the first OOM victim.
pub fn default_store_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity("250m".to_owned())),
            ("memory".to_owned(), Quantity("512Mi".to_owned())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity("2Gi".to_owned()),
        )])),
        ..ResourceRequirements::default()
    }
}
