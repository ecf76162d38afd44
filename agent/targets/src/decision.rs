//! Deciding whether one container of one pod is profiled, at what rate and with which labels.
//!
//! Rules, in order:
//! 1. `profiles.kiln.dev/enabled: "false"` opts the pod out, whatever the targets say.
//! 2. A target matches when the namespace is its own, its selector matches the pod labels, the
//!    container is listed (or the list is empty), and, if it requires the annotation, the pod
//!    carries `profiles.kiln.dev/enabled: "true"`.
//! 3. A pod with `enabled: "true"` is profiled even when no target matches (annotation-only
//!    opt-in), at the agent's default rate.
//! 0. Annotations relayed by the operator (targets with `podAnnotations` whose namespace and
//!    selector match the pod) apply first and win over the sandbox's own annotations: they are
//!    the API server's current values for pods annotated after they started. Relay entries are
//!    not matching targets themselves.
//! 4. The rate is the annotation `profiles.kiln.dev/sampling-hz` when valid, else the highest rate
//!    among matching targets. Extra labels merge in target order; the first target setting a key wins.

use std::collections::BTreeMap;

use crate::file::{Target, TargetsFile};
use crate::selector::LabelSource;
use crate::{
    ANNOTATION_ENABLED, ANNOTATION_SAMPLING_HZ, ANNOTATION_SERVICE_NAME, MAX_SAMPLING_HZ,
    MIN_SAMPLING_HZ,
};

/// What the agent knows about a container from CRI: the pod sandbox's namespace, labels and
/// annotations (kubelet copies the pod's onto the sandbox) and the container name.
#[derive(Clone, Copy)]
pub struct PodView<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod's labels.
    pub labels: &'a dyn LabelSource,
    /// The pod's annotations.
    pub annotations: &'a dyn LabelSource,
    /// The container's name within the pod.
    pub container: &'a str,
}

impl std::fmt::Debug for PodView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodView")
            .field("namespace", &self.namespace)
            .field("container", &self.container)
            .finish_non_exhaustive()
    }
}

/// The outcome for one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Profile this container.
    Profile(ProfilingPlan),
    /// Leave this container alone.
    Skip(SkipReason),
}

/// How to profile a selected container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfilingPlan {
    /// Sampling frequency; `None` means the agent's own default (annotation-only opt-in).
    pub sampling_hz: Option<u32>,
    /// Extra labels for every profile of this container (targets' labels, `service_name`).
    pub labels: BTreeMap<String, String>,
    /// Sources (`namespace/name`) of the targets that matched, sorted; empty for annotation-only.
    pub matched_targets: Vec<String>,
    /// Annotations that were present but unusable, so the agent can log them once.
    pub ignored_annotations: Vec<IgnoredAnnotation>,
    /// The pprof endpoints to scrape on this pod, if a matching target asks.
    pub pprof_scrape: Option<crate::PprofScrape>,
}

/// An annotation whose value could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredAnnotation {
    /// The annotation key.
    pub key: &'static str,
    /// The value found.
    pub value: String,
    /// Why it was ignored.
    pub problem: &'static str,
}

/// Why a container is not profiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The pod carries `profiles.kiln.dev/enabled: "false"`.
    OptedOut,
    /// No target selects the container and the pod has not opted in.
    NotSelected,
}

impl TargetsFile {
    /// Decides about one container; see the module documentation for the rules.
    pub fn decide(&self, pod: &PodView<'_>) -> Decision {
        let relayed = RelayedAnnotations {
            relayed: self
                .targets
                .iter()
                .filter(|target| {
                    !target.pod_annotations.is_empty()
                        && target.namespace == pod.namespace
                        && target.selector.matches(pod.labels)
                })
                .collect(),
            sandbox: pod.annotations,
        };
        let pod = &PodView {
            annotations: &relayed,
            ..*pod
        };
        let mut ignored = Vec::new();
        let enabled = match pod.annotations.label(ANNOTATION_ENABLED) {
            None => None,
            Some(value) => match value.trim().to_ascii_lowercase().as_str() {
                "true" => Some(true),
                "false" => Some(false),
                _ => {
                    ignored.push(IgnoredAnnotation {
                        key: ANNOTATION_ENABLED,
                        value: value.to_owned(),
                        problem: "expected \"true\" or \"false\"",
                    });
                    None
                }
            },
        };
        if enabled == Some(false) {
            return Decision::Skip(SkipReason::OptedOut);
        }
        let annotated = enabled == Some(true);
        let matched: Vec<&Target> = self
            .targets
            .iter()
            .filter(|target| {
                target.pod_annotations.is_empty() && target_matches(target, pod, annotated)
            })
            .collect();
        if matched.is_empty() && !annotated {
            return Decision::Skip(SkipReason::NotSelected);
        }

        let annotation_hz = pod
            .annotations
            .label(ANNOTATION_SAMPLING_HZ)
            .and_then(|value| match value.trim().parse::<u32>() {
                Ok(hz) if (MIN_SAMPLING_HZ..=MAX_SAMPLING_HZ).contains(&hz) => Some(hz),
                _ => {
                    ignored.push(IgnoredAnnotation {
                        key: ANNOTATION_SAMPLING_HZ,
                        value: value.to_owned(),
                        problem: "expected a whole number of Hz between 1 and 1000",
                    });
                    None
                }
            });
        let sampling_hz =
            annotation_hz.or_else(|| matched.iter().map(|target| target.sampling_hz).max());

        let mut labels = BTreeMap::new();
        for target in &matched {
            for (key, value) in &target.labels {
                labels.entry(key.clone()).or_insert_with(|| value.clone());
            }
        }
        if let Some(service) = pod.annotations.label(ANNOTATION_SERVICE_NAME) {
            let service = service.trim();
            if service.is_empty() {
                ignored.push(IgnoredAnnotation {
                    key: ANNOTATION_SERVICE_NAME,
                    value: service.to_owned(),
                    problem: "expected a non-empty service name",
                });
            } else {
                labels.insert(
                    kiln_contract::labels::SERVICE_NAME.to_owned(),
                    service.to_owned(),
                );
            }
        }
        let mut matched_targets: Vec<String> =
            matched.iter().map(|target| target.source.clone()).collect();
        matched_targets.sort();
        // Of several targets asking to scrape one pod, the first by source
        // decides, so the answer does not depend on the file's order.
        let pprof_scrape = matched
            .iter()
            .filter(|target| target.pprof_scrape.is_some())
            .min_by(|a, b| a.source.cmp(&b.source))
            .and_then(|target| target.pprof_scrape.clone());
        Decision::Profile(ProfilingPlan {
            sampling_hz,
            labels,
            matched_targets,
            ignored_annotations: ignored,
            pprof_scrape,
        })
    }
}

/// The sandbox's annotations overlaid with those relayed for this pod; the first relay entry
/// (in file order) setting a key wins.
struct RelayedAnnotations<'a> {
    relayed: Vec<&'a Target>,
    sandbox: &'a dyn LabelSource,
}

impl LabelSource for RelayedAnnotations<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        self.relayed
            .iter()
            .find_map(|target| target.pod_annotations.get(key).map(String::as_str))
            .or_else(|| self.sandbox.label(key))
    }
}

fn target_matches(target: &Target, pod: &PodView<'_>, annotated: bool) -> bool {
    target.namespace == pod.namespace
        && (annotated || !target.require_annotation)
        && (target.containers.is_empty() || target.containers.iter().any(|c| c == pod.container))
        && target.selector.matches(pod.labels)
}

#[cfg(test)]
mod tests;
