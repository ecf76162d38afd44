//! Pyroscope's `name` parameter: `app.name.suffix{key=value,other=v}`.
//!
//! Keys may contain dots (`otel.scope.name`) and values may contain `/`, `:`
//! and `=` (`com.grafana.pyroscope/nodejs`); only `,` and `}` end a value.
//! The last dotted part of the app name may name the profile kind
//! (`.cpu`, `.alloc_space`, ...), as older clients send it.

use super::IngestError;

/// A parsed `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppName {
    /// The application (service) name without a recognized kind suffix.
    pub app: String,
    /// The kind suffix, when the name ended with a known one.
    pub kind: Option<LegacyKind>,
    /// The labels in braces, in the order given.
    pub labels: Vec<(String, String)>,
}

/// What an app-name suffix says the profile measures, and how Grafana
/// Pyroscope names and types such profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegacyKind {
    /// `.cpu` or `.itimer`: on-CPU samples.
    Cpu,
    /// `.wall`: wall-clock samples.
    Wall,
    /// `.alloc_objects`.
    AllocObjects,
    /// `.alloc_space`.
    AllocSpace,
    /// `.inuse_objects`.
    InuseObjects,
    /// `.inuse_space`.
    InuseSpace,
    /// `.mutex_count`.
    MutexCount,
    /// `.mutex_duration`.
    MutexDuration,
    /// `.block_count` or `.lock_count`.
    BlockCount,
    /// `.block_duration` or `.lock_duration`.
    BlockDuration,
    /// `.goroutines`.
    Goroutines,
    /// `.exceptions`.
    Exceptions,
}

impl LegacyKind {
    fn from_suffix(suffix: &str) -> Option<Self> {
        Some(match suffix {
            "cpu" | "itimer" => Self::Cpu,
            "wall" => Self::Wall,
            "alloc_objects" => Self::AllocObjects,
            "alloc_space" => Self::AllocSpace,
            "inuse_objects" => Self::InuseObjects,
            "inuse_space" => Self::InuseSpace,
            "mutex_count" => Self::MutexCount,
            "mutex_duration" => Self::MutexDuration,
            "block_count" | "lock_count" => Self::BlockCount,
            "block_duration" | "lock_duration" => Self::BlockDuration,
            "goroutines" => Self::Goroutines,
            "exceptions" => Self::Exceptions,
            _ => return None,
        })
    }

    /// The profile name (`__name__`) Grafana Pyroscope files this kind under.
    pub fn profile_name(self) -> &'static str {
        match self {
            Self::Cpu => "process_cpu",
            Self::Wall => "wall",
            Self::AllocObjects | Self::AllocSpace | Self::InuseObjects | Self::InuseSpace => {
                "memory"
            }
            Self::MutexCount | Self::MutexDuration => "mutex",
            Self::BlockCount | Self::BlockDuration => "block",
            Self::Goroutines => "goroutines",
            Self::Exceptions => "exceptions",
        }
    }

    /// Sample type and unit for text (folded) uploads of this kind.
    pub fn sample_type(self) -> (&'static str, &'static str) {
        match self {
            Self::Cpu => ("cpu", "nanoseconds"),
            Self::Wall => ("wall", "nanoseconds"),
            Self::AllocObjects => ("alloc_objects", "count"),
            Self::AllocSpace => ("alloc_space", "bytes"),
            Self::InuseObjects => ("inuse_objects", "count"),
            Self::InuseSpace => ("inuse_space", "bytes"),
            Self::MutexCount | Self::BlockCount => ("contentions", "count"),
            Self::MutexDuration | Self::BlockDuration => ("delay", "nanoseconds"),
            Self::Goroutines => ("goroutine", "count"),
            Self::Exceptions => ("exceptions", "count"),
        }
    }

    /// Period type and unit for text uploads of this kind.
    pub fn period_type(self) -> (&'static str, &'static str) {
        match self {
            Self::Cpu => ("cpu", "nanoseconds"),
            Self::Wall => ("wall", "nanoseconds"),
            Self::AllocObjects | Self::AllocSpace | Self::InuseObjects | Self::InuseSpace => {
                ("space", "bytes")
            }
            Self::MutexCount | Self::MutexDuration | Self::BlockCount | Self::BlockDuration => {
                ("contentions", "count")
            }
            Self::Goroutines => ("goroutine", "count"),
            Self::Exceptions => ("exceptions", "count"),
        }
    }

    /// True when counts are samples taken at `sampleRate` Hz, so each is
    /// worth `1e9 / sampleRate` nanoseconds.
    pub fn is_sampled_time(self) -> bool {
        matches!(self, Self::Cpu | Self::Wall)
    }
}

/// Longest `name` accepted, in bytes.
const MAX_NAME_BYTES: usize = 16 << 10;

/// Parses Pyroscope's `name` parameter.
pub fn parse_app_name(text: &str) -> Result<AppName, IngestError> {
    let bad = |message: String| IngestError::BadName { message };
    if text.len() > MAX_NAME_BYTES {
        return Err(bad(format!(
            "name is {} bytes, over the limit of {MAX_NAME_BYTES}",
            text.len()
        )));
    }
    let (app_part, label_part) = match text.find('{') {
        Some(open) => {
            let rest = &text[open + 1..];
            let Some(inner) = rest.strip_suffix('}') else {
                return Err(bad(format!(
                    "labels in {text:?} must end with `}}` and nothing may follow it"
                )));
            };
            (&text[..open], Some(inner))
        }
        None => (text, None),
    };
    let app_full = app_part.trim();
    if app_full.is_empty() {
        return Err(bad("the application name before `{` is empty".to_owned()));
    }
    if let Some(c) = app_full
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | ':')))
    {
        return Err(bad(format!(
            "application name {app_full:?} contains {c:?}; use letters, digits, `_`, `-`, `.`"
        )));
    }
    let (app, kind) = match app_full.rsplit_once('.') {
        Some((head, suffix)) if !head.is_empty() => match LegacyKind::from_suffix(suffix) {
            Some(kind) => (head.to_owned(), Some(kind)),
            None => (app_full.to_owned(), None),
        },
        _ => (app_full.to_owned(), None),
    };
    let mut labels: Vec<(String, String)> = Vec::new();
    for pair in label_part
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(bad(format!("label {pair:?} has no `=`")));
        };
        let key = key.trim();
        if key.starts_with("__") && key.ends_with("__") && key != "__session_id__" {
            return Err(bad(format!("label name {key:?} is reserved")));
        }
        if !is_label_name(key) {
            return Err(bad(format!(
                "label name {key:?} must start with a letter or `_` and contain only letters, digits, `_` and `.`"
            )));
        }
        if value.contains('{') || value.contains('}') {
            return Err(bad(format!("label value {value:?} contains a brace")));
        }
        if labels.iter().any(|(k, _)| k == key) {
            return Err(bad(format!("label {key:?} appears twice")));
        }
        labels.push((key.to_owned(), value.trim().to_owned()));
    }
    Ok(AppName { app, kind, labels })
}

/// `[A-Za-z_][A-Za-z0-9_.]*`: Prometheus label names plus dots, which
/// OpenTelemetry-style Pyroscope labels use.
pub fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_client_name_with_dotted_keys_and_slashes_parses() {
        let name = parse_app_name(
            "fixture.node.app{otel.scope.name=com.grafana.pyroscope/nodejs,otel.scope.version=0.6.4,region=local,env=test}",
        )
        .unwrap();
        assert_eq!(name.app, "fixture.node.app");
        assert_eq!(name.kind, None);
        assert_eq!(
            name.labels[0],
            (
                "otel.scope.name".to_owned(),
                "com.grafana.pyroscope/nodejs".to_owned()
            )
        );
        assert_eq!(name.labels.len(), 4);
    }

    #[test]
    fn kind_suffix_is_split_off() {
        let name = parse_app_name("fixture.rust.app.cpu{endpoint=/a,env=test}").unwrap();
        assert_eq!(name.app, "fixture.rust.app");
        assert_eq!(name.kind, Some(LegacyKind::Cpu));
        assert_eq!(name.kind.map(LegacyKind::profile_name), Some("process_cpu"));
        let name = parse_app_name("svc.alloc_space{}").unwrap();
        assert_eq!(name.kind, Some(LegacyKind::AllocSpace));
        assert!(name.labels.is_empty());
        let name = parse_app_name("cpu").unwrap();
        assert_eq!((name.app.as_str(), name.kind), ("cpu", None));
    }

    #[test]
    fn malformed_names_say_what_is_wrong() {
        let cases = [
            ("app{a=b", "must end with `}`"),
            ("{a=b}", "is empty"),
            ("app{a}", "has no `=`"),
            ("app{1a=b}", "must start with a letter"),
            ("app{a=b,a=c}", "appears twice"),
            ("app{__name__=x}", "is reserved"),
            ("my app", "contains ' '"),
            ("app{a=b}x", "nothing may follow"),
        ];
        for (text, expected) in cases {
            let err = parse_app_name(text).unwrap_err();
            assert!(err.to_string().contains(expected), "{text}: {err}");
        }
    }
}
