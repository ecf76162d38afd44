//! The multipart form of `/ingest` (Go and Node SDKs): a `profile`, an
//! optional `prev_profile` for cumulative sample types (the server stores
//! `profile - prev_profile`), and an optional `sample_type_config` JSON that
//! says which sample types to keep, how to name them and which are cumulative.

use std::collections::HashMap;

use kiln_pprof::{DecodeLimits, Profile, proto};
use prost::Message;

use super::{IngestError, MultipartParts, Reserve};

/// One entry of `sample_type_config`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
struct SampleTypeConfig {
    /// Shown name; when set it replaces the sample type name.
    #[serde(rename = "display-name", default)]
    display_name: Option<String>,
    /// Whether values grow over the process lifetime.
    #[serde(default)]
    cumulative: bool,
    /// Units and aggregation are accepted and ignored: pprof carries units.
    #[serde(default)]
    #[allow(dead_code)]
    units: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    aggregation: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    sampled: Option<bool>,
}

/// Decodes the parts and applies `prev_profile` and `sample_type_config`.
/// Returns the validated result and its encoding for the store. Each part
/// is decoded once: an edit works on the decoded profile's own message.
pub fn merge_parts(
    parts: MultipartParts,
    limits: &DecodeLimits,
    reserve: Reserve<'_>,
) -> Result<(Profile, Vec<u8>), IngestError> {
    if parts.profile.is_empty() {
        return Err(IngestError::BadMultipart {
            message: "the `profile` field is missing or empty".to_owned(),
        });
    }
    let profile = kiln_pprof::decode_reserving(&parts.profile, limits, &mut *reserve)
        .map_err(|source| IngestError::Memory { source })?
        .map_err(|source| IngestError::BadPprof {
            part: "profile",
            source,
        })?;
    let config: Option<HashMap<String, SampleTypeConfig>> = parts
        .sample_type_config
        .as_deref()
        .filter(|c| !c.iter().all(u8::is_ascii_whitespace))
        .map(|c| {
            serde_json::from_slice(c).map_err(|e| IngestError::BadSampleTypeConfig {
                message: e.to_string(),
            })
        })
        .transpose()?;
    let prev = parts
        .prev_profile
        .as_deref()
        .filter(|p| !p.is_empty())
        .map(|p| {
            kiln_pprof::decode_reserving(p, limits, &mut *reserve)
                .map_err(|source| IngestError::Memory { source })?
                .map_err(|source| IngestError::BadPprof {
                    part: "prev_profile",
                    source,
                })
        })
        .transpose()?;
    if config.is_none() && prev.is_none() {
        return Ok((profile, parts.profile));
    }
    let type_names: Vec<String> = profile
        .sample_types()
        .iter()
        .map(|t| profile.string(t.r#type).to_owned())
        .collect();
    let cumulative: Vec<bool> = type_names
        .iter()
        .map(|name| match &config {
            Some(config) => config.get(name).is_some_and(|c| c.cumulative),
            // Without a config, Go's conventions: allocations and contention
            // counters grow, in-use and CPU values do not.
            None => name.starts_with("alloc_") || name == "contentions" || name == "delay",
        })
        .collect();
    let growth = prev
        .as_ref()
        .map(|prev| growth_since_previous(&profile, prev, &cumulative))
        .unwrap_or_default();
    drop(prev);
    let mut raw = profile.into_raw();
    for (index, values) in growth {
        if let Some(sample) = raw.sample.get_mut(index) {
            sample.value = values;
        }
    }
    if let Some(config) = &config {
        keep_configured_types(&type_names, config, &mut raw)?;
    }
    let encoded = raw.encode_to_vec();
    reserve(encoded.len()).map_err(|source| IngestError::Memory { source })?;
    let (merged, _) =
        kiln_pprof::validate_message(raw, limits).map_err(|source| IngestError::BadPprof {
            part: "profile",
            source,
        })?;
    Ok((merged, encoded))
}

/// Content identities shared by the current and the previous profile:
/// equal content gets an equal small id, whatever the table ids.
///
/// NB: sample keys used to hold every frame's function name bytes, so 10
/// samples of 4096 frames with 64 KiB names came to 2.7 GB from a 20 KB
/// upload. Now each location and label is interned once per
/// table (borrowing the profiles' strings), and a sample key is one `u32`
/// per frame and label.
#[derive(Default)]
struct Identities<'p> {
    locations: HashMap<LocationContent<'p>, u32>,
    labels: HashMap<(&'p str, &'p str, i64), u32>,
}

/// A location by content: its address and its (function name, line) lines.
type LocationContent<'p> = (u64, Vec<(&'p str, i64)>);

/// Separates frames from labels in a sample key; never an interned id.
const KEY_SEPARATOR: u32 = u32::MAX;

impl<'p> Identities<'p> {
    /// The identity of every location of `profile`, by pprof location id.
    fn locations_of(&mut self, profile: &'p Profile) -> HashMap<u64, u32> {
        let mut by_id = HashMap::with_capacity(profile.locations().len());
        for location in profile.locations() {
            let lines: Vec<(&'p str, i64)> = location
                .line
                .iter()
                .map(|line| {
                    let name = profile
                        .function(line.function_id)
                        .map_or("", |f| profile.string(f.name));
                    (name, line.line)
                })
                .collect();
            let next = u32::try_from(self.locations.len()).unwrap_or(KEY_SEPARATOR - 1);
            let id = *self
                .locations
                .entry((location.address, lines))
                .or_insert(next);
            by_id.insert(location.id, id);
        }
        by_id
    }

    /// A sample's identity independent of table ids: its frames and labels.
    fn sample_key(
        &mut self,
        profile: &'p Profile,
        locations: &HashMap<u64, u32>,
        sample: &proto::Sample,
    ) -> Vec<u32> {
        let mut key: Vec<u32> =
            Vec::with_capacity(sample.location_id.len() + 1 + sample.label.len());
        // Validation guarantees every location id resolves.
        key.extend(
            sample
                .location_id
                .iter()
                .map(|id| locations.get(id).copied().unwrap_or(KEY_SEPARATOR - 1)),
        );
        key.push(KEY_SEPARATOR);
        let label_start = key.len();
        for label in &sample.label {
            let next = u32::try_from(self.labels.len()).unwrap_or(KEY_SEPARATOR - 1);
            let content = (
                profile.string(label.key),
                profile.string(label.str),
                label.num,
            );
            key.push(*self.labels.entry(content).or_insert(next));
        }
        key[label_start..].sort_unstable();
        key
    }
}

/// The values of every sample of `profile` that `prev` also holds, with
/// its cumulative ones replaced by their growth since `prev` (never
/// negative), by sample index.
fn growth_since_previous(
    profile: &Profile,
    prev: &Profile,
    cumulative: &[bool],
) -> Vec<(usize, Vec<i64>)> {
    let prev_types: Vec<&str> = prev
        .sample_types()
        .iter()
        .map(|t| prev.string(t.r#type))
        .collect();
    // Column of each current sample type in the previous profile.
    let columns: Vec<Option<usize>> = profile
        .sample_types()
        .iter()
        .map(|t| {
            let name = profile.string(t.r#type);
            prev_types.iter().position(|p| *p == name)
        })
        .collect();
    let mut identities = Identities::default();
    let prev_locations = identities.locations_of(prev);
    let current_locations = identities.locations_of(profile);
    let mut previous: HashMap<Vec<u32>, Vec<i64>> = HashMap::new();
    for sample in prev.samples() {
        let entry = previous
            .entry(identities.sample_key(prev, &prev_locations, sample))
            .or_insert_with(|| vec![0; prev_types.len()]);
        for (total, value) in entry.iter_mut().zip(&sample.value) {
            *total = total.saturating_add(*value);
        }
    }
    let mut growth = Vec::new();
    for (index, sample) in profile.samples().iter().enumerate() {
        let key = identities.sample_key(profile, &current_locations, sample);
        let Some(before) = previous.get(&key) else {
            continue;
        };
        let mut values = sample.value.clone();
        for (type_index, value) in values.iter_mut().enumerate() {
            if let (Some(true), Some(Some(column))) =
                (cumulative.get(type_index), columns.get(type_index))
            {
                *value = value.saturating_sub(before[*column]).max(0);
            }
        }
        growth.push((index, values));
    }
    growth
}

/// Drops sample types the config does not list and applies display names.
fn keep_configured_types(
    type_names: &[String],
    config: &HashMap<String, SampleTypeConfig>,
    raw: &mut proto::Profile,
) -> Result<(), IngestError> {
    let keep: Vec<usize> = type_names
        .iter()
        .enumerate()
        .filter(|(_, name)| config.contains_key(*name))
        .map(|(index, _)| index)
        .collect();
    if keep.is_empty() {
        return Err(IngestError::BadSampleTypeConfig {
            message: format!(
                "it names none of the profile's sample types ({})",
                type_names.join(", ")
            ),
        });
    }
    for (index, name) in type_names.iter().enumerate() {
        let display = config.get(name).and_then(|c| c.display_name.clone());
        if let Some(display) = display.filter(|d| !d.is_empty()) {
            let string_index = raw.string_table.len() as i64;
            raw.string_table.push(display.into_bytes());
            raw.sample_type[index].r#type = string_index;
        }
    }
    if keep.len() < type_names.len() {
        raw.sample_type = keep.iter().map(|&i| raw.sample_type[i]).collect();
        for sample in &mut raw.sample {
            sample.value = keep
                .iter()
                .map(|&i| sample.value.get(i).copied().unwrap_or(0))
                .collect();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_pprof::{FunctionSpec, ProfileBuilder, encode_gzip};

    fn heap(alloc: i64, inuse: i64) -> Vec<u8> {
        let mut builder =
            ProfileBuilder::new(&[("alloc_space", "bytes"), ("inuse_space", "bytes")]);
        let f = builder.function(&FunctionSpec {
            name: "grow".into(),
            ..Default::default()
        });
        let loc = builder.location(0, 0x10, &[(f, 3)]);
        builder.sample(&[loc], &[alloc, inuse], &[]);
        encode_gzip(&builder.finish())
    }

    fn values(profile: &Profile) -> Vec<i64> {
        profile.samples()[0].value.clone()
    }

    #[test]
    fn cumulative_types_become_growth_since_prev_profile() {
        let parts = MultipartParts {
            profile: heap(1000, 300),
            prev_profile: Some(heap(600, 200)),
            sample_type_config: None,
        };
        let (profile, encoded) =
            merge_parts(parts, &DecodeLimits::default(), &mut |_| Ok(())).unwrap();
        assert_eq!(values(&profile), [400, 300]);
        let again = kiln_pprof::decode(&encoded, &DecodeLimits::default()).unwrap();
        assert_eq!(values(&again), [400, 300]);
    }

    /// A key blowup: 4096 frames of one function with a 60 KB name,
    /// ten samples apart only by a numeric label. Keys holding name bytes
    /// came to 245 MB per sample; interned keys are 4 bytes per frame.
    fn deep_heap(alloc: i64) -> Vec<u8> {
        let mut builder =
            ProfileBuilder::new(&[("alloc_space", "bytes"), ("inuse_space", "bytes")]);
        let f = builder.function(&FunctionSpec {
            name: "n".repeat(60_000),
            ..Default::default()
        });
        let loc = builder.location(0, 0x10, &[(f, 3)]);
        let stack = vec![loc; 4096];
        for num in 0..10 {
            builder.sample(
                &stack,
                &[alloc + num, 1],
                &[(
                    "num",
                    kiln_pprof::LabelValue::Num {
                        value: num,
                        unit: String::new(),
                    },
                )],
            );
        }
        encode_gzip(&builder.finish())
    }

    #[test]
    fn prev_profile_keys_hold_interned_ids_not_frame_names() {
        let (current, prev) = (deep_heap(1000), deep_heap(600));
        let limits = DecodeLimits::default();
        let profile = kiln_pprof::decode(&current, &limits).unwrap();
        let mut identities = Identities::default();
        let locations = identities.locations_of(&profile);
        let key = identities.sample_key(&profile, &locations, &profile.samples()[0]);
        assert_eq!(key.len(), 4096 + 1 + 1);
        assert_eq!(identities.locations.len(), 1);

        let parts = MultipartParts {
            profile: current,
            prev_profile: Some(prev),
            sample_type_config: None,
        };
        let (merged, _) = merge_parts(parts, &limits, &mut |_| Ok(())).unwrap();
        let growth: Vec<i64> = merged.samples().iter().map(|s| s.value[0]).collect();
        assert_eq!(growth, vec![400; 10]);
    }

    #[test]
    fn sample_type_config_filters_and_renames() {
        let parts = MultipartParts {
            profile: heap(1000, 300),
            prev_profile: Some(heap(600, 200)),
            sample_type_config: Some(
                br#"{"inuse_space":{"units":"bytes","display-name":"live_bytes","cumulative":false}}"#
                    .to_vec(),
            ),
        };
        let (profile, _) = merge_parts(parts, &DecodeLimits::default(), &mut |_| Ok(())).unwrap();
        assert_eq!(values(&profile), [300]);
        assert_eq!(
            profile.string(profile.sample_types()[0].r#type),
            "live_bytes"
        );
    }

    #[test]
    fn broken_parts_are_refused_by_name() {
        let err = merge_parts(
            MultipartParts::default(),
            &DecodeLimits::default(),
            &mut |_| Ok(()),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("`profile` field is missing"),
            "{err}"
        );
        let parts = MultipartParts {
            profile: heap(1, 1),
            prev_profile: Some(b"junk".to_vec()),
            sample_type_config: None,
        };
        let err = merge_parts(parts, &DecodeLimits::default(), &mut |_| Ok(())).unwrap_err();
        assert!(err.to_string().starts_with("prev_profile is not"), "{err}");
        let parts = MultipartParts {
            profile: heap(1, 1),
            prev_profile: None,
            sample_type_config: Some(b"{not json".to_vec()),
        };
        let err = merge_parts(parts, &DecodeLimits::default(), &mut |_| Ok(())).unwrap_err();
        assert_eq!(err.reason(), "bad_sample_type_config");
        let parts = MultipartParts {
            profile: heap(1, 1),
            prev_profile: None,
            sample_type_config: Some(br#"{"cpu":{}}"#.to_vec()),
        };
        let err = merge_parts(parts, &DecodeLimits::default(), &mut |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("names none"), "{err}");
    }
}
