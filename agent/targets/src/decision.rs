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
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::file::Target;
    use crate::selector::LabelSelector;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn target(source: &str, namespace: &str, require_annotation: bool, hz: u32) -> Target {
        Target {
            source: source.to_owned(),
            namespace: namespace.to_owned(),
            selector: LabelSelector::default(),
            require_annotation,
            containers: Vec::new(),
            sampling_hz: hz,
            labels: BTreeMap::new(),
            pod_annotations: BTreeMap::new(),
            pprof_scrape: None,
        }
    }

    fn decide(
        file: &TargetsFile,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
        container: &str,
    ) -> Decision {
        file.decide(&PodView {
            namespace,
            labels,
            annotations,
            container,
        })
    }

    fn plan(decision: Decision) -> ProfilingPlan {
        match decision {
            Decision::Profile(plan) => plan,
            Decision::Skip(reason) => panic!("expected a plan, got skip {reason:?}"),
        }
    }

    #[test]
    fn a_pod_is_scraped_as_the_first_matching_target_by_source_asks() {
        use crate::scrape::{PprofProfile, PprofScrape};
        let scrape = |port| PprofScrape {
            port: crate::PprofPort::Number(port),
            path_prefix: "/debug/pprof".to_owned(),
            profiles: vec![PprofProfile::Heap],
            interval_seconds: 15,
            timeout_seconds: 5,
        };
        let mut b = target("shop/b", "shop", false, 19);
        b.pprof_scrape = Some(scrape(7000));
        let mut a = target("shop/a", "shop", false, 19);
        a.pprof_scrape = Some(scrape(6060));
        let plain = target("shop/0", "shop", false, 19);
        let none = map(&[]);
        for file in [
            TargetsFile::new([b.clone(), a.clone(), plain.clone()]),
            TargetsFile::new([plain.clone(), a.clone(), b.clone()]),
        ] {
            let chosen = plan(decide(&file, "shop", &none, &none, "app")).pprof_scrape;
            assert_eq!(chosen.map(|s| s.port), Some(crate::PprofPort::Number(6060)));
        }
        let unscraped = TargetsFile::new([plain]);
        assert_eq!(
            plan(decide(&unscraped, "shop", &none, &none, "app")).pprof_scrape,
            None
        );
    }

    #[test]
    fn unannotated_pod_without_targets_is_skipped() {
        let file = TargetsFile::new([]);
        let decision = decide(&file, "default", &map(&[]), &map(&[]), "app");
        assert_eq!(decision, Decision::Skip(SkipReason::NotSelected));
    }

    #[test]
    fn annotated_pod_without_targets_uses_agent_default_rate() {
        let file = TargetsFile::new([]);
        let annotations = map(&[(ANNOTATION_ENABLED, "true")]);
        let plan = plan(decide(&file, "default", &map(&[]), &annotations, "app"));
        assert_eq!(plan.sampling_hz, None);
        assert!(plan.matched_targets.is_empty());
    }

    #[test]
    fn target_requiring_annotation_ignores_unannotated_pods() {
        let file = TargetsFile::new([target("shop/t", "shop", true, 49)]);
        let decision = decide(&file, "shop", &map(&[]), &map(&[]), "app");
        assert_eq!(decision, Decision::Skip(SkipReason::NotSelected));
        let annotations = map(&[(ANNOTATION_ENABLED, "true")]);
        let plan = plan(decide(&file, "shop", &map(&[]), &annotations, "app"));
        assert_eq!(plan.sampling_hz, Some(49));
        assert_eq!(plan.matched_targets, vec!["shop/t"]);
    }

    #[test]
    fn target_without_annotation_requirement_selects_by_labels_only() {
        let mut t = target("shop/t", "shop", false, 19);
        t.selector.match_labels = map(&[("app", "checkout")]);
        t.labels = map(&[("team", "payments")]);
        let file = TargetsFile::new([t]);
        let plan = plan(decide(
            &file,
            "shop",
            &map(&[("app", "checkout")]),
            &map(&[]),
            "server",
        ));
        assert_eq!(plan.labels, map(&[("team", "payments")]));
        let other = decide(&file, "shop", &map(&[("app", "cart")]), &map(&[]), "server");
        assert_eq!(other, Decision::Skip(SkipReason::NotSelected));
    }

    #[test]
    fn target_only_selects_its_own_namespace() {
        let file = TargetsFile::new([target("shop/t", "shop", false, 19)]);
        let decision = decide(&file, "default", &map(&[]), &map(&[]), "app");
        assert_eq!(decision, Decision::Skip(SkipReason::NotSelected));
    }

    #[test]
    fn container_list_restricts_containers() {
        let mut t = target("shop/t", "shop", false, 19);
        t.containers = vec!["server".into()];
        let file = TargetsFile::new([t]);
        assert!(matches!(
            decide(&file, "shop", &map(&[]), &map(&[]), "server"),
            Decision::Profile(_)
        ));
        assert_eq!(
            decide(&file, "shop", &map(&[]), &map(&[]), "istio-proxy"),
            Decision::Skip(SkipReason::NotSelected)
        );
    }

    #[test]
    fn explicit_opt_out_beats_every_target() {
        let file = TargetsFile::new([target("shop/t", "shop", false, 19)]);
        let annotations = map(&[(ANNOTATION_ENABLED, "False")]);
        assert_eq!(
            decide(&file, "shop", &map(&[]), &annotations, "app"),
            Decision::Skip(SkipReason::OptedOut)
        );
    }

    #[test]
    fn highest_target_rate_wins_and_annotation_overrides_it() {
        let file = TargetsFile::new([
            target("shop/slow", "shop", false, 19),
            target("shop/fast", "shop", false, 99),
        ]);
        let plan_by_targets = plan(decide(&file, "shop", &map(&[]), &map(&[]), "app"));
        assert_eq!(plan_by_targets.sampling_hz, Some(99));
        assert_eq!(
            plan_by_targets.matched_targets,
            vec!["shop/fast", "shop/slow"]
        );
        let annotations = map(&[(ANNOTATION_SAMPLING_HZ, "7")]);
        let overridden = plan(decide(&file, "shop", &map(&[]), &annotations, "app"));
        assert_eq!(overridden.sampling_hz, Some(7));
    }

    #[test]
    fn first_target_in_order_wins_label_conflicts() {
        let mut a = target("shop/a", "shop", false, 19);
        a.labels = map(&[("team", "alpha")]);
        let mut b = target("shop/b", "shop", false, 19);
        b.labels = map(&[("team", "beta"), ("tier", "web")]);
        let plan = plan(decide(
            &TargetsFile::new([b, a]),
            "shop",
            &map(&[]),
            &map(&[]),
            "app",
        ));
        assert_eq!(plan.labels, map(&[("team", "alpha"), ("tier", "web")]));
    }

    #[test]
    fn bad_annotation_values_are_reported_not_fatal() {
        let file = TargetsFile::new([target("shop/t", "shop", false, 19)]);
        let annotations = map(&[
            (ANNOTATION_ENABLED, "yes please"),
            (ANNOTATION_SAMPLING_HZ, "100000"),
        ]);
        let plan = plan(decide(&file, "shop", &map(&[]), &annotations, "app"));
        assert_eq!(plan.sampling_hz, Some(19));
        let keys: Vec<_> = plan.ignored_annotations.iter().map(|i| i.key).collect();
        assert_eq!(keys, vec![ANNOTATION_ENABLED, ANNOTATION_SAMPLING_HZ]);
    }

    #[test]
    fn service_name_annotation_becomes_a_label() {
        let file = TargetsFile::new([]);
        let annotations = map(&[
            (ANNOTATION_ENABLED, "true"),
            (ANNOTATION_SERVICE_NAME, "checkout"),
        ]);
        let plan = plan(decide(&file, "shop", &map(&[]), &annotations, "app"));
        assert_eq!(plan.labels, map(&[("service_name", "checkout")]));
    }

    #[test]
    fn hash_maps_work_as_label_sources() {
        let labels: HashMap<String, String> =
            [("app".to_owned(), "x".to_owned())].into_iter().collect();
        let annotations: HashMap<String, String> = HashMap::new();
        let mut t = target("a/t", "a", false, 19);
        t.selector.match_labels = map(&[("app", "x")]);
        let decision = TargetsFile::new([t]).decide(&PodView {
            namespace: "a",
            labels: &labels,
            annotations: &annotations,
            container: "c",
        });
        assert!(matches!(decision, Decision::Profile(_)));
    }

    fn relay(uid: &str, annotations: &[(&str, &str)]) -> Target {
        let mut relay = target(&format!("shop/pods/{uid}"), "shop", false, 19);
        relay
            .selector
            .match_labels
            .insert("io.kubernetes.pod.uid".into(), uid.into());
        relay.pod_annotations = map(annotations);
        relay
    }

    #[test]
    fn relayed_annotations_opt_in_exactly_the_selected_pod_with_its_rate_and_service() {
        let file = TargetsFile::new([relay(
            "uid-1",
            &[
                (ANNOTATION_ENABLED, "true"),
                (ANNOTATION_SAMPLING_HZ, "97"),
                (ANNOTATION_SERVICE_NAME, "cart"),
            ],
        )]);
        let selected = map(&[("io.kubernetes.pod.uid", "uid-1")]);
        let p = plan(decide(&file, "shop", &selected, &map(&[]), "app"));
        assert_eq!(p.sampling_hz, Some(97));
        assert_eq!(
            p.labels.get("service_name").map(String::as_str),
            Some("cart")
        );
        assert!(p.matched_targets.is_empty(), "a relay is not a target");
        let other = map(&[("io.kubernetes.pod.uid", "uid-2")]);
        assert_eq!(
            decide(&file, "shop", &other, &map(&[]), "app"),
            Decision::Skip(SkipReason::NotSelected)
        );
        assert_eq!(
            decide(&file, "default", &selected, &map(&[]), "app"),
            Decision::Skip(SkipReason::NotSelected)
        );
    }

    #[test]
    fn relayed_annotations_win_over_stale_sandbox_annotations() {
        let file = TargetsFile::new([relay("uid-1", &[(ANNOTATION_ENABLED, "true")])]);
        let selected = map(&[("io.kubernetes.pod.uid", "uid-1")]);
        let stale = map(&[(ANNOTATION_ENABLED, "false")]);
        assert!(matches!(
            decide(&file, "shop", &selected, &stale, "app"),
            Decision::Profile(_)
        ));
    }

    #[test]
    fn relay_entry_rate_does_not_compete_with_real_targets() {
        let mut high = relay("uid-1", &[(ANNOTATION_ENABLED, "true")]);
        high.sampling_hz = 1000;
        let file = TargetsFile::new([high, target("shop/all", "shop", true, 49)]);
        let selected = map(&[("io.kubernetes.pod.uid", "uid-1")]);
        let p = plan(decide(&file, "shop", &selected, &map(&[]), "app"));
        assert_eq!(p.sampling_hz, Some(49));
        assert_eq!(p.matched_targets, vec!["shop/all".to_owned()]);
    }
}
