//! The targets file: its serde shape, deterministic serialization, parsing and validation.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::TargetsError;
use crate::scrape::PprofScrape;
use crate::selector::LabelSelector;
use crate::{
    ANNOTATION_PREFIX, FORMAT_VERSION, MAX_FILE_BYTES, MAX_SAMPLING_HZ, MIN_SAMPLING_HZ,
    RESERVED_LABELS,
};

/// The whole file: a format version and the targets, sorted by `(namespace, source)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TargetsFile {
    /// Format version; see [`FORMAT_VERSION`].
    pub version: u32,
    /// The targets. Order carries no meaning; [`TargetsFile::new`] sorts them.
    #[serde(default)]
    pub targets: Vec<Target>,
}

/// One `ProfilingTarget`, flattened to what an agent needs to decide about a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Target {
    /// Where the target came from, `namespace/name` of the `ProfilingTarget`; unique in a file.
    pub source: String,
    /// Only pods in this namespace are selected.
    pub namespace: String,
    /// Which pods of the namespace are selected; empty selects all.
    #[serde(default)]
    pub selector: LabelSelector,
    /// When true, a selected pod must also carry `profiles.kiln.dev/enabled: "true"`.
    pub require_annotation: bool,
    /// Container names to profile; empty means every container of a selected pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<String>,
    /// Sampling frequency in Hz for the selected containers.
    pub sampling_hz: u32,
    /// Labels added to every profile of the selected containers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `profiles.kiln.dev/*` annotations the operator read from the API server for the selected
    /// pods, applied as if they were on the pod sandbox (they win over the sandbox's own). A pod
    /// annotated after it started has them only in the API server: CRI sandbox configs are
    /// immutable. A target carrying them is a relay entry: it only supplies annotations and never
    /// counts as a matching target itself (its `samplingHz`, `containers`, `labels` and
    /// `requireAnnotation` are ignored).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
    /// pprof endpoints to scrape on the selected pods, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pprof_scrape: Option<PprofScrape>,
}

impl TargetsFile {
    /// Builds a file in canonical form: targets sorted, containers and selector values sorted and
    /// deduplicated. Equal inputs in any order give byte-identical [`TargetsFile::to_json`] output.
    pub fn new(targets: impl IntoIterator<Item = Target>) -> Self {
        let mut targets: Vec<Target> = targets
            .into_iter()
            .map(|mut target| {
                target.containers.sort();
                target.containers.dedup();
                target.selector.normalize();
                if let Some(scrape) = &mut target.pprof_scrape {
                    scrape.normalize();
                }
                target
            })
            .collect();
        targets.sort_by(|a, b| {
            (a.namespace.as_str(), a.source.as_str())
                .cmp(&(b.namespace.as_str(), b.source.as_str()))
        });
        Self {
            version: FORMAT_VERSION,
            targets,
        }
    }

    /// Parses and validates a file as read from the mounted ConfigMap.
    pub fn parse(bytes: &[u8]) -> Result<Self, TargetsError> {
        if bytes.len() > MAX_FILE_BYTES {
            return Err(TargetsError::TooLarge {
                size: bytes.len(),
                limit: MAX_FILE_BYTES,
            });
        }
        // Read the version first so a newer format is reported as such, not as an unknown field.
        #[derive(Deserialize)]
        struct VersionOnly {
            version: u32,
        }
        let syntax = |source: serde_json::Error| TargetsError::Syntax {
            line: source.line(),
            column: source.column(),
            source,
        };
        let VersionOnly { version } = serde_json::from_slice(bytes).map_err(syntax)?;
        if version != FORMAT_VERSION {
            return Err(TargetsError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let file: Self = serde_json::from_slice(bytes).map_err(syntax)?;
        file.validate()?;
        Ok(Self::new(file.targets))
    }

    /// Checks every target: namespaces, rates, labels, selectors, and unique sources.
    pub fn validate(&self) -> Result<(), TargetsError> {
        if self.version != FORMAT_VERSION {
            return Err(TargetsError::UnsupportedVersion {
                found: self.version,
                supported: FORMAT_VERSION,
            });
        }
        let mut sources = BTreeSet::new();
        for target in &self.targets {
            target.validate()?;
            if !sources.insert(target.source.as_str()) {
                return Err(TargetsError::DuplicateSource {
                    source_name: target.source.clone(),
                });
            }
        }
        Ok(())
    }

    /// Serializes in canonical form: pretty JSON, sorted, with a trailing newline.
    pub fn to_json(&self) -> Result<String, TargetsError> {
        let canonical = Self::new(self.targets.clone());
        let mut text = serde_json::to_string_pretty(&canonical)
            .map_err(|source| TargetsError::Serialize { source })?;
        text.push('\n');
        Ok(text)
    }
}

impl Target {
    fn validate(&self) -> Result<(), TargetsError> {
        let invalid = |field: &str, problem: String| TargetsError::InvalidField {
            source_name: self.source.clone(),
            field: field.to_owned(),
            problem,
        };
        if self.source.is_empty() {
            return Err(invalid("source", "must not be empty".to_owned()));
        }
        if !is_dns_label(&self.namespace) {
            return Err(invalid(
                "namespace",
                format!("{:?} is not a Kubernetes namespace name", self.namespace),
            ));
        }
        if !(MIN_SAMPLING_HZ..=MAX_SAMPLING_HZ).contains(&self.sampling_hz) {
            return Err(invalid(
                "samplingHz",
                format!(
                    "{} is outside {MIN_SAMPLING_HZ}..={MAX_SAMPLING_HZ}",
                    self.sampling_hz
                ),
            ));
        }
        if let Some(container) = self.containers.iter().find(|c| !is_dns_label(c)) {
            return Err(invalid(
                "containers",
                format!("{container:?} is not a container name"),
            ));
        }
        for name in self.labels.keys() {
            if !is_profile_label_name(name) {
                return Err(invalid(
                    "labels",
                    format!("{name:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)"),
                ));
            }
            if RESERVED_LABELS.contains(&name.as_str()) {
                return Err(invalid(
                    "labels",
                    format!("{name:?} is set by the agent and cannot be overridden"),
                ));
            }
        }
        if let Some((field, problem)) = self.selector.problems() {
            return Err(invalid(&field, problem));
        }
        if let Some((field, problem)) = self.pprof_scrape.as_ref().and_then(PprofScrape::problems) {
            return Err(invalid(field, problem));
        }
        if let Some(key) = self
            .pod_annotations
            .keys()
            .find(|key| !key.starts_with(ANNOTATION_PREFIX))
        {
            return Err(invalid(
                "podAnnotations",
                format!("{key:?} is not a {ANNOTATION_PREFIX}* annotation"),
            ));
        }
        Ok(())
    }
}

/// RFC 1123 label: what namespaces and container names must be.
pub(crate) fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Profile label names follow the Prometheus rule, so they work in every query syntax.
pub(crate) fn is_profile_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::{SelectorOperator, SelectorRequirement};

    pub(crate) fn target(source: &str, namespace: &str) -> Target {
        Target {
            source: source.to_owned(),
            namespace: namespace.to_owned(),
            selector: LabelSelector::default(),
            require_annotation: true,
            containers: Vec::new(),
            sampling_hz: 19,
            labels: BTreeMap::new(),
            pod_annotations: BTreeMap::new(),
            pprof_scrape: None,
        }
    }

    #[test]
    fn serialization_is_independent_of_input_order() {
        let mut a = target("shop/a", "shop");
        a.containers = vec!["web".into(), "app".into(), "web".into()];
        a.selector.match_expressions = vec![SelectorRequirement {
            key: "env".into(),
            operator: SelectorOperator::In,
            values: vec!["prod".into(), "dev".into()],
        }];
        let b = target("default/b", "default");
        let c = target("shop/c", "shop");
        let one = TargetsFile::new([a.clone(), b.clone(), c.clone()]);
        let two = TargetsFile::new([c, a, b]);
        assert_eq!(one.to_json().unwrap(), two.to_json().unwrap());
        assert_eq!(one.targets[0].source, "default/b");
        assert_eq!(one.targets[1].containers, vec!["app", "web"]);
        assert!(one.to_json().unwrap().ends_with("}\n"));
    }

    #[test]
    fn written_file_parses_back_to_the_same_value() {
        let mut a = target("shop/a", "shop");
        a.labels.insert("team".into(), "payments".into());
        a.selector
            .match_labels
            .insert("app".into(), "checkout".into());
        let file = TargetsFile::new([a]);
        let parsed = TargetsFile::parse(file.to_json().unwrap().as_bytes()).unwrap();
        assert_eq!(parsed, file);
    }

    #[test]
    fn documented_example_parses() {
        let text = r#"{"version":1,"targets":[{"source":"shop/checkout","namespace":"shop",
            "selector":{"matchLabels":{"app":"checkout"}},"requireAnnotation":false,
            "containers":["server"],"samplingHz":49,"labels":{"team":"payments"}}]}"#;
        let file = TargetsFile::parse(text.as_bytes()).unwrap();
        assert_eq!(file.targets[0].sampling_hz, 49);
        assert!(!file.targets[0].require_annotation);
    }

    #[test]
    fn empty_file_without_targets_is_valid() {
        let file = TargetsFile::parse(br#"{"version":1}"#).unwrap();
        assert!(file.targets.is_empty());
    }

    #[test]
    fn newer_version_is_reported_as_unsupported_even_with_new_fields() {
        let err = TargetsFile::parse(br#"{"version":2,"somethingNew":true}"#).unwrap_err();
        assert_eq!(err.reason(), "unsupported_version");
        assert!(err.to_string().contains("version 2"), "{err}");
    }

    #[test]
    fn garbage_is_a_syntax_error_with_position() {
        let err = TargetsFile::parse(b"{\n  \"version\": 1,\n  oops").unwrap_err();
        match err {
            TargetsError::Syntax { line, .. } => assert_eq!(line, 3),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(TargetsFile::parse(b"").unwrap_err().reason(), "syntax");
        assert_eq!(
            TargetsFile::parse(&[0xff, 0xfe, 0x00])
                .unwrap_err()
                .reason(),
            "syntax"
        );
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = TargetsFile::parse(
            br#"{"version":1,"targets":[{"source":"a/b","namespace":"a",
            "requireAnnotation":true,"samplingHz":19,"typo":1}]}"#,
        )
        .unwrap_err();
        assert_eq!(err.reason(), "syntax");
        assert!(format!("{:?}", err).contains("typo"));
    }

    #[test]
    fn oversized_input_is_rejected_before_parsing() {
        let big = vec![b' '; MAX_FILE_BYTES + 1];
        assert_eq!(TargetsFile::parse(&big).unwrap_err().reason(), "too_large");
    }

    #[test]
    fn out_of_range_sampling_rate_names_the_field() {
        for hz in [0, MAX_SAMPLING_HZ + 1] {
            let mut t = target("a/b", "a");
            t.sampling_hz = hz;
            let err = TargetsFile::new([t]).validate().unwrap_err();
            assert!(err.to_string().contains("samplingHz"), "{err}");
        }
    }

    #[test]
    fn bad_namespace_container_and_labels_are_rejected() {
        let mut t = target("a/b", "Not_A_Namespace");
        assert!(TargetsFile::new([t.clone()]).validate().is_err());
        t.namespace = "a".into();
        t.containers = vec!["UPPER".into()];
        assert!(TargetsFile::new([t.clone()]).validate().is_err());
        t.containers.clear();
        t.labels.insert("1bad".into(), "x".into());
        assert!(TargetsFile::new([t.clone()]).validate().is_err());
        t.labels.clear();
        t.labels.insert("pod".into(), "spoofed".into());
        let err = TargetsFile::new([t]).validate().unwrap_err();
        assert!(err.to_string().contains("set by the agent"), "{err}");
    }

    #[test]
    fn relay_entries_round_trip_and_accept_only_kiln_annotations() {
        let mut relay = target("shop/pods/cart", "shop");
        relay
            .selector
            .match_labels
            .insert("io.kubernetes.pod.uid".into(), "uid-1".into());
        relay
            .pod_annotations
            .insert(crate::ANNOTATION_ENABLED.into(), "true".into());
        let file = TargetsFile::new([relay.clone()]);
        let json = file.to_json().unwrap();
        assert!(json.contains("\"podAnnotations\""), "{json}");
        assert_eq!(TargetsFile::parse(json.as_bytes()).unwrap(), file);
        assert!(
            !TargetsFile::new([target("a/b", "a")])
                .to_json()
                .unwrap()
                .contains("podAnnotations"),
            "files without relays keep their old bytes"
        );
        relay
            .pod_annotations
            .insert("example.com/other".into(), "x".into());
        let err = TargetsFile::new([relay]).validate().unwrap_err();
        assert!(err.to_string().contains("podAnnotations"), "{err}");
    }

    #[test]
    fn pprof_scrapes_round_trip_in_canonical_order_and_are_validated() {
        use crate::scrape::{PprofProfile, PprofScrape};
        let mut scraped = target("shop/go", "shop");
        scraped.pprof_scrape = Some(PprofScrape {
            port: crate::PprofPort::Number(6060),
            path_prefix: "/debug/pprof".to_owned(),
            profiles: vec![
                PprofProfile::Goroutine,
                PprofProfile::Heap,
                PprofProfile::Heap,
            ],
            interval_seconds: 15,
            timeout_seconds: 10,
        });
        let json = TargetsFile::new([scraped]).to_json().unwrap();
        assert!(json.contains("\"pprofScrape\""), "{json}");
        let parsed = TargetsFile::parse(json.as_bytes()).unwrap();
        let profiles = &parsed.targets[0].pprof_scrape.as_ref().unwrap().profiles;
        assert_eq!(profiles, &[PprofProfile::Heap, PprofProfile::Goroutine]);
        let bad = json.replace("\"port\": 6060", "\"port\": 0");
        let err = TargetsFile::parse(bad.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("pprofScrape.port"), "{err}");
        let named = TargetsFile::parse(
            json.replace("\"port\": 6060", "\"port\": \"http-debug\"")
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(
            named.targets[0].pprof_scrape.as_ref().unwrap().port,
            crate::PprofPort::Name("http-debug".to_owned())
        );
        let bad_name = json.replace("\"port\": 6060", "\"port\": \"HTTP_DEBUG\"");
        let err = TargetsFile::parse(bad_name.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("pprofScrape.port"), "{err}");
        let unknown = json.replace("\"heap\"", "\"threadcreate\"");
        assert!(TargetsFile::parse(unknown.as_bytes()).is_err());
    }

    #[test]
    fn duplicate_sources_are_rejected() {
        let err = TargetsFile::new([target("a/b", "a"), target("a/b", "a")])
            .validate()
            .unwrap_err();
        assert_eq!(err.reason(), "duplicate_source");
    }

    #[test]
    fn invalid_selector_in_file_is_rejected() {
        let text =
            br#"{"version":1,"targets":[{"source":"a/b","namespace":"a","requireAnnotation":true,
            "samplingHz":19,"selector":{"matchExpressions":[{"key":"env","operator":"In"}]}}]}"#;
        let err = TargetsFile::parse(text).unwrap_err();
        assert!(
            err.to_string().contains("matchExpressions[0].values"),
            "{err}"
        );
        let bad_operator =
            br#"{"version":1,"targets":[{"source":"a/b","namespace":"a","requireAnnotation":true,
            "samplingHz":19,"selector":{"matchExpressions":[{"key":"env","operator":"Like"}]}}]}"#;
        assert_eq!(
            TargetsFile::parse(bad_operator).unwrap_err().reason(),
            "syntax"
        );
    }
}
