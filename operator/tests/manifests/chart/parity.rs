//! Pure comparison of what the Helm chart renders with what `config/default` applies. Helm's
//! own labels are set aside (only when they hold Helm's values), every intended difference is
//! checked to be exactly as documented in docs/helm.md, and anything else is reported by the
//! JSON path where the two disagree.

use std::collections::BTreeMap;

use serde_json::Value;

/// What one side of an intended difference must hold.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    Absent,
    Present,
    /// Equal to this JSON text.
    Equals(&'static str),
}

/// One difference between the chart and `config/default` that docs/helm.md explains.
#[derive(Debug)]
pub struct Intended {
    /// The object, as [`object_key`] names it.
    pub object: &'static str,
    /// A JSON pointer into the object; empty for the object itself.
    pub pointer: &'static str,
    pub in_config: Expect,
    pub in_chart: Expect,
    pub why: &'static str,
}

/// Every intended difference with the chart's default values. Keep docs/helm.md in step.
pub const INTENDED_DIFFERENCES: [Intended; 2] = [
    Intended {
        object: "Namespace/kiln-system",
        pointer: "",
        in_config: Expect::Present,
        in_chart: Expect::Absent,
        why: "Helm installs into a release namespace that exists or that --create-namespace \
              creates; a chart must not own it. Label it for privileged pods yourself \
              (NOTES.txt and docs/helm.md say how).",
    },
    Intended {
        object: "Deployment/kiln-system/kiln-operator",
        pointer: "/spec/template/spec/containers/0/imagePullPolicy",
        in_config: Expect::Absent,
        in_chart: Expect::Equals("\"IfNotPresent\""),
        why: "the chart exposes operator.image.pullPolicy; config/default leaves the field to \
              the API server, which gives IfNotPresent to an image with a tag other than \
              latest, so the pods are the same.",
    },
];

/// The labels Helm's conventions put on templated objects, with what they must hold.
fn helm_labels(chart_label: &str) -> [(&'static str, String); 2] {
    [
        ("helm.sh/chart", chart_label.to_owned()),
        ("app.kubernetes.io/managed-by", "Helm".to_owned()),
    ]
}

/// `Kind/namespace/name`, or `Kind/name` for cluster-scoped objects.
pub fn object_key(object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap_or("?");
    let name = object["metadata"]["name"].as_str().unwrap_or("?");
    match object["metadata"]["namespace"].as_str() {
        Some(namespace) => format!("{kind}/{namespace}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// YAML printers disagree on `64` and `64.0`; compare numbers by value.
pub fn integral_floats_as_integers(value: &mut Value) {
    match value {
        Value::Number(number) => {
            if let Some(float) = number.as_f64()
                && float.fract() == 0.0
                && float.abs() < 9.0e15
            {
                *value = Value::from(float as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_floats_as_integers),
        Value::Object(map) => map.values_mut().for_each(integral_floats_as_integers),
        _ => {}
    }
}

/// Removes Helm's labels from a chart object (its own and its pod template's), reporting any
/// that hold something other than Helm's values.
pub fn strip_helm_labels(object: &mut Value, chart_label: &str, problems: &mut Vec<String>) {
    let key = object_key(object);
    for pointer in ["/metadata/labels", "/spec/template/metadata/labels"] {
        let Some(labels) = object.pointer_mut(pointer).and_then(Value::as_object_mut) else {
            continue;
        };
        for (label, expected) in helm_labels(chart_label) {
            match labels.remove(label) {
                Some(Value::String(value)) if value == expected => {}
                Some(other) => problems.push(format!(
                    "{key}{pointer}: label {label} is {other}, Helm's convention is {expected:?}"
                )),
                None => {}
            }
        }
        if labels.is_empty() {
            remove_pointer(object, pointer);
        }
    }
}

/// Every difference between two objects, one line per JSON path.
pub fn differences(config: &Value, chart: &Value) -> Vec<String> {
    let mut found = Vec::new();
    diff_at("", config, chart, &mut found);
    found
}

fn diff_at(path: &str, config: &Value, chart: &Value, found: &mut Vec<String>) {
    match (config, chart) {
        (Value::Object(ours), Value::Object(theirs)) => {
            let mut keys: Vec<&String> = ours.keys().chain(theirs.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let inner = format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"));
                match (ours.get(key), theirs.get(key)) {
                    (Some(a), Some(b)) => diff_at(&inner, a, b, found),
                    (Some(a), None) => found.push(format!("{inner}: only config has {a}")),
                    (None, Some(b)) => found.push(format!("{inner}: only the chart has {b}")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(ours), Value::Array(theirs)) if ours.len() == theirs.len() => {
            for (index, (a, b)) in ours.iter().zip(theirs).enumerate() {
                diff_at(&format!("{path}/{index}"), a, b, found);
            }
        }
        (a, b) if a == b => {}
        (a, b) => found.push(format!("{path}: config has {a}, the chart has {b}")),
    }
}

fn remove_pointer(object: &mut Value, pointer: &str) -> Option<Value> {
    let (parent, last) = pointer.rsplit_once('/')?;
    let last = last.replace("~1", "/").replace("~0", "~");
    object.pointer_mut(parent)?.as_object_mut()?.remove(&last)
}

fn meets(value: Option<&Value>, expect: Expect) -> bool {
    match expect {
        Expect::Absent => value.is_none(),
        Expect::Present => value.is_some(),
        Expect::Equals(json) => {
            let wanted: Value = serde_json::from_str(json).unwrap_or(Value::Null);
            value == Some(&wanted)
        }
    }
}

/// Compares the chart's objects with config's: `[]` when they match but for Helm's labels and
/// `intended`, each of which must be found exactly as described (a stale entry is reported).
pub fn compare(
    config: &[Value],
    chart: &[Value],
    chart_label: &str,
    intended: &[Intended],
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut by_key = |objects: &[Value], strip: bool| {
        let mut map = BTreeMap::new();
        for object in objects {
            let mut object = object.clone();
            integral_floats_as_integers(&mut object);
            if strip {
                strip_helm_labels(&mut object, chart_label, &mut problems);
            }
            if let Some(previous) = map.insert(object_key(&object), object) {
                problems.push(format!("{} appears twice", object_key(&previous)));
            }
        }
        map
    };
    let mut config = by_key(config, false);
    let mut chart = by_key(chart, true);
    for entry in intended {
        let (ours, theirs) = if entry.pointer.is_empty() {
            (config.get(entry.object), chart.get(entry.object))
        } else {
            (
                config
                    .get(entry.object)
                    .and_then(|o| o.pointer(entry.pointer)),
                chart
                    .get(entry.object)
                    .and_then(|o| o.pointer(entry.pointer)),
            )
        };
        if !meets(ours, entry.in_config) || !meets(theirs, entry.in_chart) {
            problems.push(format!(
                "intended difference {}{} is no longer as documented (config {:?}: {ours:?}; \
                 chart {:?}: {theirs:?}; documented as: {}); update it and docs/helm.md",
                entry.object, entry.pointer, entry.in_config, entry.in_chart, entry.why
            ));
            continue;
        }
        if entry.pointer.is_empty() {
            config.remove(entry.object);
            chart.remove(entry.object);
        } else {
            for side in [&mut config, &mut chart] {
                if let Some(object) = side.get_mut(entry.object) {
                    remove_pointer(object, entry.pointer);
                }
            }
        }
    }
    for (key, ours) in &config {
        match chart.get(key) {
            None => problems.push(format!("{key}: config/default has it, the chart does not")),
            Some(theirs) => problems.extend(
                differences(ours, theirs)
                    .into_iter()
                    .map(|line| format!("{key}{line}")),
            ),
        }
    }
    for key in chart.keys().filter(|key| !config.contains_key(*key)) {
        problems.push(format!("{key}: the chart has it, config/default does not"));
    }
    problems
}
