//! Aggregating every `ProfilingTarget` that points at a store into the agents' targets file.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kiln_targets::{
    LabelSelector as TargetSelector, PprofPort, PprofProfile, PprofScrape, SelectorOperator,
    SelectorRequirement, Target, TargetsFile,
};

use super::{BuildError, StoreNames, owned_meta, stamp_applied_hash};
use crate::api::profiling_target::{
    MAX_LABEL_NAME_LENGTH, MAX_LABEL_VALUE_LENGTH, PprofProfileName, PprofScrapeSpec,
};
use crate::api::{ProfileStore, ProfilingTarget};

/// A target that points at the store but cannot be published, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedTarget {
    /// `namespace/name` of the target.
    pub source: String,
    /// What is wrong with it.
    pub problem: String,
}

/// The aggregation result: the file (sorted, deterministic) and the targets left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregation {
    /// What the agents read.
    pub file: TargetsFile,
    /// Targets pointing at the store that failed validation.
    pub rejected: Vec<RejectedTarget>,
}

/// True when the target names this store and is neither suspended nor being deleted.
pub fn points_at(target: &ProfilingTarget, names: &StoreNames) -> bool {
    target.spec.store_ref.name == names.store
        && target.store_namespace() == Some(names.namespace.as_str())
}

/// Converts one target into its targets-file form, validated.
pub fn to_file_target(target: &ProfilingTarget) -> Result<Target, String> {
    let namespace = target
        .metadata
        .namespace
        .clone()
        .ok_or_else(|| "target has no namespace".to_owned())?;
    let name = target
        .metadata
        .name
        .clone()
        .ok_or_else(|| "target has no name".to_owned())?;
    // The CRD bounds these too, but targets stored before it did are only checked here.
    for (label, value) in &target.spec.labels {
        if label.chars().count() > MAX_LABEL_NAME_LENGTH {
            return Err(format!(
                "label name {label:?} is longer than {MAX_LABEL_NAME_LENGTH} characters"
            ));
        }
        if value.chars().count() > MAX_LABEL_VALUE_LENGTH {
            return Err(format!(
                "label {label:?} has a value longer than {MAX_LABEL_VALUE_LENGTH} characters"
            ));
        }
    }
    let selector = match &target.spec.selector {
        None => TargetSelector::default(),
        Some(selector) => {
            let mut expressions = Vec::new();
            for expression in selector.match_expressions.iter().flatten() {
                let operator = match expression.operator.as_str() {
                    "In" => SelectorOperator::In,
                    "NotIn" => SelectorOperator::NotIn,
                    "Exists" => SelectorOperator::Exists,
                    "DoesNotExist" => SelectorOperator::DoesNotExist,
                    other => {
                        return Err(format!(
                            "selector operator {other:?} is not one of In, NotIn, Exists, DoesNotExist"
                        ));
                    }
                };
                expressions.push(SelectorRequirement {
                    key: expression.key.clone(),
                    operator,
                    values: expression.values.clone().unwrap_or_default(),
                });
            }
            TargetSelector {
                match_labels: selector.match_labels.clone().unwrap_or_default(),
                match_expressions: expressions,
            }
        }
    };
    let file_target = Target {
        source: format!("{namespace}/{name}"),
        namespace,
        selector,
        require_annotation: target.spec.require_annotation,
        containers: target.spec.containers.clone(),
        sampling_hz: target.spec.sampling_hz,
        labels: target.spec.labels.clone(),
        pod_annotations: BTreeMap::new(),
        pprof_scrape: target.spec.pprof.as_ref().map(pprof_scrape).transpose()?,
    };
    let check = TargetsFile::new([file_target.clone()]);
    check.validate().map_err(|error| error.to_string())?;
    Ok(file_target)
}

/// A target's pprof scraping, in the targets file's terms; a number outside a port's range is
/// refused here (a name is checked with the rest of the file).
fn pprof_scrape(spec: &PprofScrapeSpec) -> Result<PprofScrape, String> {
    let port = match &spec.port {
        IntOrString::Int(number) => u16::try_from(*number)
            .map(PprofPort::Number)
            .map_err(|_| format!("pprof.port {number} is not 1 to 65535"))?,
        IntOrString::String(name) => PprofPort::Name(name.clone()),
    };
    Ok(PprofScrape {
        port,
        path_prefix: spec.path_prefix.clone(),
        profiles: spec
            .profiles
            .iter()
            .map(|name| match name {
                PprofProfileName::Heap => PprofProfile::Heap,
                PprofProfileName::Allocs => PprofProfile::Allocs,
                PprofProfileName::Goroutine => PprofProfile::Goroutine,
                PprofProfileName::Mutex => PprofProfile::Mutex,
                PprofProfileName::Block => PprofProfile::Block,
            })
            .collect(),
        interval_seconds: spec.interval_seconds,
        timeout_seconds: spec.timeout_seconds,
    })
}

/// Builds the file from every target in the cluster: only those pointing at this store, not
/// suspended and not being deleted; invalid ones are reported instead of published.
pub fn aggregate(names: &StoreNames, targets: &[ProfilingTarget]) -> Aggregation {
    let mut published = Vec::new();
    let mut rejected = Vec::new();
    for target in targets {
        if !points_at(target, names)
            || target.spec.suspend
            || target.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        match to_file_target(target) {
            Ok(file_target) => published.push(file_target),
            Err(problem) => rejected.push(RejectedTarget {
                source: format!(
                    "{}/{}",
                    target.metadata.namespace.as_deref().unwrap_or(""),
                    target.metadata.name.as_deref().unwrap_or("")
                ),
                problem,
            }),
        }
    }
    rejected.sort_by(|a, b| a.source.cmp(&b.source));
    Aggregation {
        file: TargetsFile::new(published),
        rejected,
    }
}

/// Most pods relayed into one targets file. Each entry takes about 400 bytes, so this keeps the
/// file far below the 1 MiB ConfigMap limit even with many `ProfilingTarget`s.
pub const MAX_RELAYED_PODS: usize = 2000;

/// Most pods relayed from one namespace, so one tenant's 3,000 annotated pods cannot take every
/// slot from another's ten.
pub const MAX_RELAYED_PODS_PER_NAMESPACE: usize = 500;

/// Most bytes of `profiles.kiln.dev/` annotation keys and values relayed for one pod; a pod with
/// more is left out rather than growing everyone's targets file past the 1 MiB ConfigMap limit,
/// which would freeze every store's targets.
pub const MAX_RELAYED_ANNOTATION_BYTES: usize = 1024;

/// Relay entries go in this rate; agents ignore it (see `kiln_targets::Target::pod_annotations`).
const RELAY_SAMPLING_HZ: u32 = 19;

/// True when the pod opts in through the API server (`profiles.kiln.dev/enabled: "true"`, read
/// the way the agent reads it) and is not being deleted.
pub fn wants_relay(pod: &ObjectMeta) -> bool {
    pod.deletion_timestamp.is_none()
        && pod
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(kiln_targets::ANNOTATION_ENABLED))
            .is_some_and(|value| value.trim().eq_ignore_ascii_case("true"))
}

/// One relay entry per opted-in pod (the caller lists running pods only): it selects exactly that
/// pod by the UID label kubelet puts on its sandbox and carries the pod's current Kiln
/// annotations, because CRI keeps the annotations the pod had when it started. Entries are
/// sorted by namespace and pod name and capped at [`MAX_RELAYED_PODS`], shared fairly between
/// namespaces (each gets at most [`MAX_RELAYED_PODS_PER_NAMESPACE`], and slots are dealt out one
/// namespace at a time); pods whose annotations would make an invalid entry, or take more than
/// [`MAX_RELAYED_ANNOTATION_BYTES`], are left out (the agent would reject the whole file, or it
/// would outgrow its ConfigMap).
pub fn relay_targets(pods: &[ObjectMeta]) -> Vec<Target> {
    let mut relays: Vec<Target> = pods
        .iter()
        .filter(|pod| wants_relay(pod))
        .filter_map(|pod| {
            let namespace = pod.namespace.clone()?;
            let name = pod.name.as_deref()?;
            let uid = pod.uid.clone().filter(|uid| !uid.is_empty())?;
            let pod_annotations: BTreeMap<String, String> = pod
                .annotations
                .iter()
                .flatten()
                .filter(|(key, _)| key.starts_with(kiln_targets::ANNOTATION_PREFIX))
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect();
            let annotation_bytes: usize =
                pod_annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
            if annotation_bytes > MAX_RELAYED_ANNOTATION_BYTES {
                return None;
            }
            let relay = Target {
                source: format!("{namespace}/pods/{name}"),
                namespace,
                selector: TargetSelector {
                    match_labels: BTreeMap::from([(
                        kiln_targets::CRI_POD_UID_LABEL.to_owned(),
                        uid,
                    )]),
                    match_expressions: Vec::new(),
                },
                require_annotation: false,
                containers: Vec::new(),
                sampling_hz: RELAY_SAMPLING_HZ,
                labels: BTreeMap::new(),
                pod_annotations,
                pprof_scrape: None,
            };
            TargetsFile::new([relay.clone()])
                .validate()
                .is_ok()
                .then_some(relay)
        })
        .collect();
    relays.sort_by(|a, b| {
        (a.namespace.as_str(), a.source.as_str()).cmp(&(b.namespace.as_str(), b.source.as_str()))
    });
    relays.dedup_by(|a, b| a.source == b.source);
    fair_share(relays)
}

/// Relay entries, and the opted-in pods that did not get one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Relays {
    /// What [`relay_targets`] returns.
    pub targets: Vec<Target>,
    /// Opted-in pods without an entry, per namespace (only namespaces with some): over their
    /// namespace's or the file's budget, with Kiln annotations over
    /// [`MAX_RELAYED_ANNOTATION_BYTES`], or with annotations the agent would reject.
    pub left_out: BTreeMap<String, usize>,
}

/// [`relay_targets`], plus how many opted-in pods each namespace lost to the budgets, so the
/// store's status can say whose pods are not profiled instead of dropping them silently.
pub fn relays(pods: &[ObjectMeta]) -> Relays {
    let targets = relay_targets(pods);
    let mut left_out: BTreeMap<String, usize> = BTreeMap::new();
    for pod in pods.iter().filter(|pod| wants_relay(pod)) {
        *left_out
            .entry(pod.namespace.clone().unwrap_or_default())
            .or_default() += 1;
    }
    for relay in &targets {
        if let Some(count) = left_out.get_mut(&relay.namespace) {
            *count = count.saturating_sub(1);
        }
    }
    left_out.retain(|_, count| *count > 0);
    Relays { targets, left_out }
}

/// At most [`MAX_RELAYED_PODS_PER_NAMESPACE`] per namespace and [`MAX_RELAYED_PODS`] in all,
/// dealt one per namespace per round, so small namespaces are served first; sorted again after.
fn fair_share(relays: Vec<Target>) -> Vec<Target> {
    let mut by_namespace: BTreeMap<String, std::vec::IntoIter<Target>> = BTreeMap::new();
    let mut grouped: BTreeMap<String, Vec<Target>> = BTreeMap::new();
    for relay in relays {
        let group = grouped.entry(relay.namespace.clone()).or_default();
        if group.len() < MAX_RELAYED_PODS_PER_NAMESPACE {
            group.push(relay);
        }
    }
    for (namespace, group) in grouped {
        by_namespace.insert(namespace, group.into_iter());
    }
    let mut chosen = Vec::new();
    while chosen.len() < MAX_RELAYED_PODS && !by_namespace.is_empty() {
        by_namespace.retain(|_, entries| match entries.next() {
            Some(entry) if chosen.len() < MAX_RELAYED_PODS => {
                chosen.push(entry);
                true
            }
            _ => false,
        });
    }
    chosen.sort_by(|a, b| {
        (a.namespace.as_str(), a.source.as_str()).cmp(&(b.namespace.as_str(), b.source.as_str()))
    });
    chosen
}

/// The published targets plus the relay entries, in canonical order.
pub fn with_relays(file: &TargetsFile, relays: &[Target]) -> TargetsFile {
    TargetsFile::new(file.targets.iter().chain(relays).cloned())
}

/// Most bytes of the targets file the operator writes (900 KiB): below the 1 MiB a ConfigMap
/// (and the agent's reader, [`kiln_targets::MAX_FILE_BYTES`]) allows, with room for the
/// ConfigMap's own metadata.
pub const MAX_TARGETS_FILE_BYTES: usize = kiln_targets::MAX_FILE_BYTES - CONFIGMAP_METADATA_ROOM;

/// Bytes of a targets ConfigMap left to its name, labels and annotations.
const CONFIGMAP_METADATA_ROOM: usize = 124 * 1024;

/// The targets file as written, and what had to be left out of it.
#[derive(Debug, Clone, PartialEq)]
pub struct FittedTargets {
    /// The file, at most [`MAX_TARGETS_FILE_BYTES`] long.
    pub file: TargetsFile,
    /// Relayed pods left out.
    pub relays_left_out: usize,
    /// `ProfilingTarget`s left out.
    pub targets_left_out: usize,
}

/// [`with_relays`], cut to [`MAX_TARGETS_FILE_BYTES`]: relay entries go first, then targets,
/// each time from the namespace with the most entries, so one tenant's volume cannot push
/// the others out or make the whole file unwritable.
pub fn fit_targets(file: &TargetsFile, relays: &[Target]) -> FittedTargets {
    let mut targets = file.targets.clone();
    let mut relays = relays.to_vec();
    let (mut relays_left_out, mut targets_left_out) = (0, 0);
    loop {
        let candidate = with_relays(&TargetsFile::new(targets.iter().cloned()), &relays);
        let size = candidate.to_json().map_or(usize::MAX, |json| json.len());
        if size <= MAX_TARGETS_FILE_BYTES || (targets.is_empty() && relays.is_empty()) {
            return FittedTargets {
                file: candidate,
                relays_left_out,
                targets_left_out,
            };
        }
        let excess = size.saturating_sub(MAX_TARGETS_FILE_BYTES);
        if relays.is_empty() {
            targets_left_out += drop_from_busiest_namespace(&mut targets, excess);
        } else {
            relays_left_out += drop_from_busiest_namespace(&mut relays, excess);
        }
    }
}

/// Removes entries, the last of the namespace with the most entries each time, until about
/// `excess` bytes are freed (at least one entry); returns how many went.
fn drop_from_busiest_namespace(entries: &mut Vec<Target>, excess: usize) -> usize {
    let mut freed = 0;
    let mut dropped = 0;
    while (freed < excess || dropped == 0) && !entries.is_empty() {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for entry in entries.iter() {
            *counts.entry(entry.namespace.as_str()).or_default() += 1;
        }
        let busiest = counts
            .iter()
            .max_by_key(|(namespace, count)| (**count, std::cmp::Reverse(**namespace)))
            .map(|(namespace, _)| (*namespace).to_owned())
            .unwrap_or_default();
        let Some(index) = entries.iter().rposition(|e| e.namespace == busiest) else {
            break;
        };
        let entry = entries.remove(index);
        freed += serde_json::to_vec(&entry).map_or(0, |bytes| bytes.len() + 1);
        dropped += 1;
    }
    dropped
}

/// The targets ConfigMap mounted into every agent.
pub fn config_map(
    store: &ProfileStore,
    names: &StoreNames,
    file: &TargetsFile,
) -> Result<ConfigMap, BuildError> {
    let json = file
        .to_json()
        .map_err(|source| BuildError::Targets { source })?;
    let config = ConfigMap {
        metadata: owned_meta(store, names, &names.targets, "agent"),
        data: Some(BTreeMap::from([(
            kiln_targets::CONFIGMAP_KEY.to_owned(),
            json,
        )])),
        ..ConfigMap::default()
    };
    stamp_applied_hash(config, "ConfigMap")
}

#[cfg(test)]
mod tests;
