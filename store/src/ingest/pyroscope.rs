//! Pyroscope's legacy `POST /ingest`: query parameters and body formats,
//! turned into [`ProfileUpload`]s. Pure: the HTTP layer hands in the query
//! string, headers it cares about and the body bytes.

pub mod app_name;
pub mod multipart;

use kiln_engine::model::{Label, LabelSet, NAME_LABEL};
use kiln_pprof::folded::{FoldedError, FoldedFormat, FoldedSpec, folded_to_profile};
use kiln_pprof::{DecodeLimits, PprofError};
use prost::Message;

use crate::ingest::upload::{ProfileUpload, SERVICE_NAME_LABEL};
use crate::wire::body::InflateError;
use crate::wire::time::{TimeError, parse_time_ms};
use app_name::{AppName, LegacyKind, parse_app_name};

/// The label Grafana Pyroscope stores `spyName` under.
pub const SPY_LABEL: &str = "pyroscope_spy";

/// Asks the store's ingest memory budget for bytes before a decode step
/// allocates them, so many bodies decoding at once cannot add up to more
/// memory than the pod has; see `kiln_pprof::decode_reserving`.
pub type Reserve<'a> = &'a mut dyn FnMut(usize) -> Result<(), kiln_storage::StorageError>;

/// Why a legacy ingest request was refused.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// Decoding the upload needs memory the ingest budget cannot give.
    #[error("{source}")]
    Memory {
        /// The budget's refusal (busy now, or larger than the budget).
        #[source]
        source: kiln_storage::StorageError,
    },
    /// A required query parameter is missing.
    #[error("query parameter `{name}` is required")]
    MissingParameter {
        /// The parameter.
        name: &'static str,
    },
    /// The `name` parameter is malformed.
    #[error("invalid `name`: {message}")]
    BadName {
        /// What is wrong.
        message: String,
    },
    /// `from` or `until` cannot be read.
    #[error("invalid `{parameter}`: {source}")]
    BadTime {
        /// `from` or `until`.
        parameter: &'static str,
        /// Why.
        #[source]
        source: TimeError,
    },
    /// `until` is before `from`.
    #[error("`until` ({until_ms} ms) is before `from` ({from_ms} ms)")]
    TimeOrder {
        /// Parsed `from`.
        from_ms: i64,
        /// Parsed `until`.
        until_ms: i64,
    },
    /// A parameter has a value outside its allowed set.
    #[error("invalid `{parameter}` {value:?}: {allowed}")]
    BadParameter {
        /// The parameter.
        parameter: &'static str,
        /// The value given (truncated).
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// The body format is one Kiln does not read.
    #[error(
        "format {format:?} is not supported; send pprof (format=pprof or multipart), folded or lines"
    )]
    UnsupportedFormat {
        /// The format named.
        format: String,
    },
    /// The body (or a multipart field) is not a usable pprof profile.
    #[error("{part} is not a valid pprof profile: {source}")]
    BadPprof {
        /// Which part: `body`, `profile` or `prev_profile`.
        part: &'static str,
        /// Why.
        #[source]
        source: PprofError,
    },
    /// The profile converted from a text body breaks a pprof limit.
    #[error("the profile converted from the {format} body is refused: {source}")]
    BadConversion {
        /// The body's format.
        format: &'static str,
        /// The limit it breaks.
        #[source]
        source: PprofError,
    },
    /// The folded text cannot be read.
    #[error("folded body: {source}")]
    BadFolded {
        /// Why.
        #[source]
        source: FoldedError,
    },
    /// The multipart body is malformed or lacks the `profile` field.
    #[error("multipart body: {message}")]
    BadMultipart {
        /// What is wrong.
        message: String,
    },
    /// `sample_type_config` is not the JSON Pyroscope defines.
    #[error("`sample_type_config` is not valid: {message}")]
    BadSampleTypeConfig {
        /// What is wrong.
        message: String,
    },
}

impl IngestError {
    /// A short, fixed name for metrics and logs, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingParameter { .. } => "missing_parameter",
            Self::BadName { .. } => "bad_name",
            Self::BadTime { .. } => "bad_time",
            Self::TimeOrder { .. } => "time_order",
            Self::BadParameter { .. } => "bad_parameter",
            Self::UnsupportedFormat { .. } => "unsupported_format",
            Self::BadPprof { source, .. } | Self::BadConversion { source, .. } => source.reason(),
            Self::BadFolded { source } => source.reason(),
            Self::BadMultipart { .. } => "bad_multipart",
            Self::Memory { source } => source.reason(),
            Self::BadSampleTypeConfig { .. } => "bad_sample_type_config",
        }
    }
}

/// How the body is encoded, from `format` and `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// A pprof profile, gzipped or not.
    Pprof,
    /// `multipart/form-data` with `profile` (+ `prev_profile`, `sample_type_config`).
    Multipart,
    /// `frame;frame COUNT` lines (Pyroscope's default "groups" parser).
    Folded,
    /// One stack per line.
    Lines,
}

/// The parsed query parameters of one `/ingest` call.
#[derive(Debug, Clone)]
pub struct IngestParams {
    /// `name`.
    pub name: AppName,
    /// `from`, unix ms.
    pub from_ms: Option<i64>,
    /// `until`, unix ms.
    pub until_ms: Option<i64>,
    /// The body format.
    pub format: BodyFormat,
    /// `sampleRate` in Hz (100 when absent or unreadable, as Pyroscope does).
    pub sample_rate: u32,
    /// `spyName`.
    pub spy_name: Option<String>,
    /// `units` (only used for folded uploads without a kind suffix).
    pub units: String,
}

/// Parses the query string of `/ingest`. `content_type` picks multipart when
/// `format` is absent; `now_ms` anchors relative times.
pub fn parse_ingest_params(
    query: &str,
    content_type: Option<&str>,
    now_ms: i64,
) -> Result<IngestParams, IngestError> {
    let mut name = None;
    let mut from = None;
    let mut until = None;
    let mut format = None;
    let mut sample_rate = None;
    let mut spy_name = None;
    let mut units = None;
    let mut aggregation = None;
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let slot = match key.as_ref() {
            "name" => &mut name,
            "from" => &mut from,
            "until" => &mut until,
            "format" => &mut format,
            "sampleRate" => &mut sample_rate,
            "spyName" => &mut spy_name,
            "units" => &mut units,
            "aggregationType" => &mut aggregation,
            _ => continue,
        };
        *slot = Some(value.into_owned());
    }
    let name = parse_app_name(&name.ok_or(IngestError::MissingParameter { name: "name" })?)?;
    let parse_time = |parameter: &'static str, value: Option<String>| {
        value
            .filter(|v| !v.is_empty())
            .map(|v| parse_time_ms(&v, now_ms))
            .transpose()
            .map_err(|source| IngestError::BadTime { parameter, source })
    };
    let from_ms = parse_time("from", from)?;
    let mut until_ms = parse_time("until", until)?;
    if let (Some(from_ms), Some(until)) = (from_ms, until_ms)
        && until < from_ms
    {
        // pyroscope-go's last upload, at shutdown, sends `from` to the
        // nanosecond and `until` rounded down to its second: a window that
        // ends less than a second before it starts is that rounding, and is
        // read as empty at `from`. Anything further back is a client error.
        if from_ms - until >= 1000 {
            return Err(IngestError::TimeOrder {
                from_ms,
                until_ms: until,
            });
        }
        until_ms = Some(from_ms);
    }
    let is_multipart = content_type.is_some_and(|t| {
        t.trim_start()
            .to_ascii_lowercase()
            .starts_with("multipart/form-data")
    });
    let format = match format.as_deref() {
        Some("pprof") if is_multipart => BodyFormat::Multipart,
        Some("pprof") => BodyFormat::Pprof,
        Some("lines") => BodyFormat::Lines,
        Some("folded" | "collapsed" | "groups" | "") => BodyFormat::Folded,
        None if is_multipart => BodyFormat::Multipart,
        None => BodyFormat::Folded,
        Some(other) => {
            return Err(IngestError::UnsupportedFormat {
                format: other.chars().take(40).collect(),
            });
        }
    };
    // Pyroscope falls back to 100 Hz on an unreadable rate; so do we, and
    // on 0 too: clients send `sampleRate=0` with profiles that are not
    // sampled in time (pyroscope-go's goroutine and heap uploads), where
    // the rate is never used, and as a divisor it would mean nothing.
    let sample_rate = sample_rate
        .and_then(|r| r.trim().parse::<u32>().ok())
        .filter(|&r| r > 0)
        .unwrap_or(100);
    if let Some(aggregation) = aggregation.as_deref()
        && !matches!(aggregation, "sum" | "average" | "avg" | "")
    {
        return Err(IngestError::BadParameter {
            parameter: "aggregationType",
            value: aggregation.chars().take(40).collect(),
            allowed: "sum or average",
        });
    }
    Ok(IngestParams {
        name,
        from_ms,
        until_ms,
        format,
        sample_rate,
        spy_name: spy_name.filter(|s| !s.is_empty() && s != "unknown"),
        units: units
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "samples".to_owned()),
    })
}

/// The parts of a multipart upload, already split by the HTTP layer.
#[derive(Debug, Clone, Default)]
pub struct MultipartParts {
    /// The `profile` field.
    pub profile: Vec<u8>,
    /// The optional `prev_profile` field (cumulative profiles).
    pub prev_profile: Option<Vec<u8>>,
    /// The optional `sample_type_config` field (JSON).
    pub sample_type_config: Option<Vec<u8>>,
}

/// The body of an `/ingest` call, after content-encoding was undone.
#[derive(Debug, Clone)]
pub enum IngestBody {
    /// Raw bytes: pprof or text, as `params.format` says.
    Raw(Vec<u8>),
    /// A multipart form.
    Multipart(MultipartParts),
}

/// Turns one `/ingest` call into one upload for the store.
pub fn build_upload(
    params: &IngestParams,
    body: IngestBody,
    limits: &DecodeLimits,
    reserve: Reserve<'_>,
) -> Result<ProfileUpload, IngestError> {
    // Each body is decoded (or built) once, here; the store takes the
    // profile along with the bytes it logs.
    let (profile_name, pprof, profile) = match (params.format, body) {
        (BodyFormat::Folded | BodyFormat::Lines, IngestBody::Raw(text)) => {
            folded_upload(params, &text, limits, reserve)?
        }
        (BodyFormat::Pprof, IngestBody::Raw(bytes)) => {
            // Nothing edits it: read straight from the wire, no prost tree.
            let profile = kiln_pprof::decode_flat_reserving(&bytes, limits, &mut *reserve)
                .map_err(|source| IngestError::Memory { source })?
                .map_err(|source| IngestError::BadPprof {
                    part: "body",
                    source,
                })?;
            (pprof_profile_name(params, &profile), bytes, profile.into())
        }
        (_, IngestBody::Multipart(parts)) => {
            let (profile, encoded) = multipart::merge_parts(parts, limits, reserve)?;
            (
                pprof_profile_name(params, &profile),
                encoded,
                profile.into(),
            )
        }
        (BodyFormat::Multipart, IngestBody::Raw(_)) => {
            return Err(IngestError::BadMultipart {
                message: "the body is not multipart/form-data".to_owned(),
            });
        }
    };
    let mut labels = vec![
        Label::new(NAME_LABEL, profile_name),
        Label::new(SERVICE_NAME_LABEL, params.name.app.clone()),
    ];
    if let Some(spy) = &params.spy_name {
        labels.push(Label::new(SPY_LABEL, spy.clone()));
    }
    for (key, value) in &params.name.labels {
        labels.push(Label::new(key.clone(), value.clone()));
    }
    // Text uploads only know their window from `from`/`until`; pprof carries
    // its own duration (0 for heap snapshots, which are not deltas).
    let duration_nanos = match (params.format, params.from_ms, params.until_ms) {
        (BodyFormat::Folded | BodyFormat::Lines, Some(from), Some(until)) if until > from => {
            Some((until - from).saturating_mul(1_000_000))
        }
        _ => None,
    };
    Ok(ProfileUpload {
        labels: std::sync::Arc::new(LabelSet::new(labels)),
        time_ms: params.from_ms,
        duration_nanos,
        pprof: pprof.into(),
        decoded: Some(profile),
    })
}

/// Converts folded or lines text into a checked profile, its name and its
/// encoding (what the store logs, so replay needs no text conversion).
fn folded_upload(
    params: &IngestParams,
    text: &[u8],
    limits: &DecodeLimits,
    reserve: Reserve<'_>,
) -> Result<(String, Vec<u8>, kiln_pprof::DecodedProfile), IngestError> {
    // Inflated step by step against the budget, not all at once.
    let inflated;
    let text = if kiln_pprof::is_gzip(text) {
        inflated = crate::wire::body::inflate_reserving(
            text,
            limits.max_decompressed_bytes,
            &mut *reserve,
        )
        .map_err(|error| match error {
            InflateError::Reserve(source) => IngestError::Memory { source },
            InflateError::TooLarge { limit } => IngestError::BadPprof {
                part: "body",
                source: PprofError::DecompressedTooLarge { limit },
            },
            InflateError::Corrupt(source) => IngestError::BadPprof {
                part: "body",
                source: PprofError::Gzip { source },
            },
        })?;
        inflated.as_slice()
    } else {
        text
    };
    // No suffix: Pyroscope treats the upload as CPU samples unless `units`
    // says it counts something else.
    let kind = params.name.kind.or(match params.units.as_str() {
        "samples" | "" => Some(LegacyKind::Cpu),
        "objects" => Some(LegacyKind::AllocObjects),
        "bytes" => Some(LegacyKind::AllocSpace),
        "goroutines" => Some(LegacyKind::Goroutines),
        _ => None,
    });
    let (profile_name, spec) = match kind {
        Some(kind) => {
            let (sample_type, sample_unit) = kind.sample_type();
            let (period_type, period_unit) = kind.period_type();
            let period = if kind.is_sampled_time() {
                1_000_000_000 / i64::from(params.sample_rate)
            } else {
                1
            };
            let scale = if kind.is_sampled_time() { period } else { 1 };
            (
                kind.profile_name().to_owned(),
                FoldedSpec {
                    sample_type: (sample_type.to_owned(), sample_unit.to_owned()),
                    period: Some((period_type.to_owned(), period_unit.to_owned(), period)),
                    value_scale: scale,
                    ..FoldedSpec::default()
                },
            )
        }
        None => (
            params.units.clone(),
            FoldedSpec {
                sample_type: (params.units.clone(), "count".to_owned()),
                ..FoldedSpec::default()
            },
        ),
    };
    let spec = FoldedSpec {
        format: if params.format == BodyFormat::Lines {
            FoldedFormat::Lines
        } else {
            FoldedFormat::Folded
        },
        time_nanos: params.from_ms.unwrap_or(0).saturating_mul(1_000_000),
        max_stacks: limits.max_samples,
        max_depth: limits.max_stack_depth,
        ..spec
    };
    let (profile, _stats) =
        folded_to_profile(text, &spec).map_err(|source| IngestError::BadFolded { source })?;
    let encoded = profile.encode_to_vec();
    let (profile, decoded_bytes) =
        kiln_pprof::validate_message(profile, limits).map_err(|source| {
            IngestError::BadConversion {
                format: if params.format == BodyFormat::Lines {
                    "lines"
                } else {
                    "folded"
                },
                source,
            }
        })?;
    reserve(decoded_bytes.saturating_add(encoded.len()))
        .map_err(|source| IngestError::Memory { source })?;
    Ok((profile_name, encoded, profile.into()))
}

/// `__name__` for a pprof upload: the kind suffix if the name had one, else
/// guessed from the sample types the way Grafana Pyroscope files them.
fn pprof_profile_name(params: &IngestParams, profile: &impl kiln_pprof::ProfileView) -> String {
    if let Some(kind) = params.name.kind {
        return kind.profile_name().to_owned();
    }
    let types: Vec<&str> = profile
        .sample_types()
        .iter()
        .map(|t| profile.string(t.r#type))
        .collect();
    profile_name_for_sample_types(&types).to_owned()
}

/// `__name__` guessed from sample type names the way Grafana Pyroscope files
/// them (`wall`, `memory` for `alloc_*`/`inuse_*`, `mutex`, `goroutines`,
/// else `process_cpu`); shared with OTLP ingest.
pub(crate) fn profile_name_for_sample_types(types: &[&str]) -> &'static str {
    let has = |name: &str| types.contains(&name);
    if has("wall") {
        "wall"
    } else if types
        .iter()
        .any(|t| t.starts_with("alloc_") || t.starts_with("inuse_"))
    {
        "memory"
    } else if has("contentions") || has("delay") {
        "mutex"
    } else if has("goroutine") || has("goroutines") {
        "goroutines"
    } else {
        "process_cpu"
    }
}

#[cfg(test)]
mod tests;
