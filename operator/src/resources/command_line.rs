//! Command lines (and environments) rendered from the binaries' own settings types
//! (`kiln_store_settings::StoreSettings`, `kiln_agent_settings::AgentSettings`):
//! the operator fills in typed settings and this module turns them into the
//! flags the same clap definitions parse, so a renamed or removed flag fails
//! here or in the operator's tests, never in a pod.
//!
//! The settings serialize to a tree whose leaf names are the clap argument
//! ids (clap derive names an argument after its field). Each argument of the
//! binary's clap command then takes its value from the leaf of the same name;
//! values equal to the flag's declared default are left out, so a newer
//! binary's defaults hold. A set value with no flag (the store's token
//! lists, which must never reach a command line, where every user of the
//! node reads them in `/proc/*/cmdline`) is an error.

use std::collections::BTreeMap;

use clap::CommandFactory;
use serde::Serialize;
use serde_json::Value;

use super::BuildError;

/// The flags that give `settings` to `binary`, in the order its clap
/// command declares them, each as `--name=value` (or `--name` for a switch).
pub fn render<S: Serialize + CommandFactory>(
    binary: &'static str,
    settings: &S,
) -> Result<Vec<String>, BuildError> {
    let mut args = Vec::new();
    for value in set_values(binary, settings)? {
        let long = value
            .arg
            .get_long()
            .ok_or_else(|| value.problem("has no long flag"))?;
        if !value.arg.get_action().takes_values() {
            args.push(format!("--{long}"));
            continue;
        }
        match value.arg.get_value_delimiter() {
            Some(delimiter) => args.push(format!("--{long}={}", value.joined(delimiter)?)),
            None => args.extend(value.texts.iter().map(|text| format!("--{long}={text}"))),
        }
    }
    Ok(args)
}

/// The environment variables that give `settings` to `binary`, by the
/// `env` names its clap command declares; a switch is `true`.
pub fn render_env<S: Serialize + CommandFactory>(
    binary: &'static str,
    settings: &S,
) -> Result<BTreeMap<String, String>, BuildError> {
    let mut variables = BTreeMap::new();
    for value in set_values(binary, settings)? {
        let name = value
            .arg
            .get_env()
            .map(|name| name.to_string_lossy().into_owned())
            .ok_or_else(|| value.problem("has no environment variable"))?;
        let text = if !value.arg.get_action().takes_values() {
            "true".to_owned()
        } else if let Some(delimiter) = value.arg.get_value_delimiter() {
            value.joined(delimiter)?
        } else if let [one] = value.texts.as_slice() {
            one.clone()
        } else {
            return Err(value.problem("has several values and no delimiter"));
        };
        variables.insert(name, text);
    }
    Ok(variables)
}

/// One argument of a binary's clap command with the value the settings
/// give it: a switch only when on, a value only when it differs from the
/// argument's declared default.
struct SetValue {
    binary: &'static str,
    arg: clap::Arg,
    texts: Vec<String>,
}

impl SetValue {
    fn problem(&self, problem: &str) -> BuildError {
        BuildError::CommandLine {
            binary: self.binary,
            setting: self.arg.get_id().to_string(),
            problem: problem.to_owned(),
        }
    }

    /// The texts as one value split by `delimiter`, refusing a text that
    /// contains it (it would come back as two values).
    fn joined(&self, delimiter: char) -> Result<String, BuildError> {
        if self.texts.iter().any(|text| text.contains(delimiter)) {
            return Err(self.problem(&format!("has a value containing {delimiter:?}")));
        }
        Ok(self.texts.join(&delimiter.to_string()))
    }
}

/// The arguments `settings` sets, in declaration order. A set value with
/// no argument of its name is an error.
fn set_values<S: Serialize + CommandFactory>(
    binary: &'static str,
    settings: &S,
) -> Result<Vec<SetValue>, BuildError> {
    let problem = |setting: &str, problem: String| BuildError::CommandLine {
        binary,
        setting: setting.to_owned(),
        problem,
    };
    let tree = serde_json::to_value(settings)
        .map_err(|error| problem("*", format!("cannot be serialized: {error}")))?;
    let mut leaves = BTreeMap::new();
    collect_leaves(tree, &mut leaves)
        .map_err(|setting| problem(&setting, "is named in two sections".to_owned()))?;
    let mut set = Vec::new();
    for arg in S::command().get_arguments() {
        let id = arg.get_id().as_str();
        let Some(value) = leaves.remove(id) else {
            continue;
        };
        let texts = value_texts(value)
            .ok_or_else(|| problem(id, "is not text, a number, a boolean or a list".to_owned()))?;
        if texts.is_empty() {
            continue;
        }
        if !arg.get_action().takes_values() {
            match texts.as_slice() {
                [on] if on == "true" => {}
                [off] if off == "false" => continue,
                _ => return Err(problem(id, "is a switch but not a boolean".to_owned())),
            }
        } else {
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|value| value.to_string_lossy().into_owned())
                .collect();
            if texts == defaults {
                continue;
            }
        }
        set.push(SetValue {
            binary,
            arg: arg.clone(),
            texts,
        });
    }
    if let Some((setting, _)) = leaves
        .iter()
        .find(|(_, value)| value_texts((*value).clone()).is_none_or(|texts| !texts.is_empty()))
    {
        return Err(problem(setting, "is set but is no flag".to_owned()));
    }
    Ok(set)
}

/// Every non-object value of `tree` by its key; sections (objects) are
/// walked into. Errs with the key when two sections use the same one.
fn collect_leaves(tree: Value, leaves: &mut BTreeMap<String, Value>) -> Result<(), String> {
    let Value::Object(fields) = tree else {
        return Ok(());
    };
    for (key, value) in fields {
        if value.is_object() {
            collect_leaves(value, leaves)?;
        } else if leaves.insert(key.clone(), value).is_some() {
            return Err(key);
        }
    }
    Ok(())
}

/// A value as the texts of its flag: none for null, one for a scalar, one
/// per item for a list; `None` for anything else.
fn value_texts(value: Value) -> Option<Vec<String>> {
    let scalar = |value: Value| match value {
        Value::String(text) => Some(text),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    };
    match value {
        Value::Null => Some(Vec::new()),
        Value::Array(items) => items.into_iter().map(scalar).collect(),
        other => scalar(other).map(|text| vec![text]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_agent_settings::AgentSettings;
    use kiln_store_settings::StoreSettings;
    use std::path::PathBuf;

    #[test]
    fn set_values_become_flags_and_defaults_stay_out() {
        let mut settings = StoreSettings::default();
        settings.storage.retention = Some("7d".to_owned());
        settings.bucket.kind = Some("s3".to_owned());
        settings.bucket.allow_http = Some(true);
        settings.auth.write_tokens_file = Some(PathBuf::from("/run/w"));
        assert_eq!(
            render("kiln-store", &settings).unwrap(),
            [
                "--retention=7d",
                "--object-store=s3",
                "--bucket-allow-http=true",
                "--write-tokens-file=/run/w"
            ]
        );
        let agent = AgentSettings {
            all: true,
            pod_labels: vec!["app".to_owned(), "team".to_owned()],
            drain_interval: std::time::Duration::from_millis(1500),
            frequency: 19,
            ..AgentSettings::default()
        };
        assert_eq!(
            render("kiln-agent", &agent).unwrap(),
            ["--all", "--pod-labels=app,team", "--drain-interval=1500ms"]
        );
    }

    #[test]
    fn tokens_and_values_that_would_split_are_refused() {
        let mut settings = StoreSettings::default();
        settings.auth.write_tokens = Some(vec!["secret".to_owned()]);
        let err = render("kiln-store", &settings).unwrap_err();
        assert!(err.to_string().contains("write_tokens"), "{err}");
        let agent = AgentSettings {
            pod_labels: vec!["a,b".to_owned()],
            ..AgentSettings::default()
        };
        let err = render("kiln-agent", &agent).unwrap_err();
        assert!(err.to_string().contains("pod_labels"), "{err}");
    }

    #[test]
    fn environments_use_the_declared_variable_names() {
        let mut settings = StoreSettings::default();
        settings.bucket.name = Some("profiles".to_owned());
        settings.bucket.allow_http = Some(true);
        assert_eq!(
            render_env("kiln-store", &settings).unwrap(),
            BTreeMap::from([
                ("KILN_BUCKET".to_owned(), "profiles".to_owned()),
                ("KILN_BUCKET_ALLOW_HTTP".to_owned(), "true".to_owned()),
            ])
        );
        let agent = AgentSettings {
            kubernetes: true,
            pod_labels: vec!["app".to_owned(), "team".to_owned()],
            ..AgentSettings::default()
        };
        assert_eq!(
            render_env("kiln-agent", &agent).unwrap(),
            BTreeMap::from([
                ("KILN_KUBERNETES".to_owned(), "true".to_owned()),
                ("KILN_POD_LABELS".to_owned(), "app,team".to_owned()),
            ])
        );
    }
}
