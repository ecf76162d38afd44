//! Aggregating every `ProfilingTarget` that points at a store into the agents' targets file.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kiln_targets::{
    LabelSelector as TargetSelector, SelectorOperator, SelectorRequirement, Target, TargetsFile,
};

use super::{BuildError, StoreNames, owned_meta, stamp_applied_hash};
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
    };
    let check = TargetsFile::new([file_target.clone()]);
    check.validate().map_err(|error| error.to_string())?;
    Ok(file_target)
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
