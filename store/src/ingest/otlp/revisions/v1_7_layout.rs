//! The 1.7 layout, the one most unlike the others: samples are slices of
//! `Profile.location_indices`, a profile may have several sample types and
//! attribute keys are strings.

use kiln_api::kiln::otlp::v1_7;

use super::super::model::{
    Batch, Dictionary, Function, Mapping, Profile, ResourceProfiles, Sample, ScopeProfiles,
    SpanLink, check_index, check_indices, mapping_build_id, sample_link, sample_values,
};
use super::super::{OtlpError, OtlpLimits};
use super::{
    attributes, check_sample_count, check_stack_depth, checked_function, checked_mapping, location,
};

/// 1.7: samples are slices of `Profile.location_indices`, several sample
/// types per profile, attribute keys are strings. A sample refers to its
/// slice, kept once in the dictionary's stack locations; slices overlap
/// freely, so copying one per sample let 200 samples of one 8-million
/// entry slice ask for gigabytes.
pub(super) fn from_v1_7(
    request: v1_7::ExportRequest,
    limits: &OtlpLimits,
) -> Result<Batch, OtlpError> {
    let d = request.dictionary.unwrap_or_default();
    let strings = d.string_table;
    let s = strings.len();
    let mut dictionary = Dictionary::default();
    for f in &d.function_table {
        let function = Function {
            name: f.name_strindex,
            system_name: f.system_name_strindex,
            filename: f.filename_strindex,
            start_line: f.start_line,
        };
        dictionary.functions.push(checked_function(function, s)?);
    }
    dictionary.attributes = attributes(&d.attribute_table, &strings)?;
    for m in &d.mapping_table {
        let mapping = Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename: m.filename_strindex,
            build_id: mapping_build_id(&m.attribute_indices, &dictionary.attributes),
        };
        dictionary.mappings.push(checked_mapping(mapping, s)?);
    }
    for l in &d.location_table {
        let lines = l.line.iter().map(|x| (x.function_index, x.line));
        dictionary.locations.push(location(
            l.mapping_index,
            l.address,
            lines,
            (dictionary.mappings.len(), dictionary.functions.len()),
            limits,
        )?);
    }
    for link in &d.link_table {
        dictionary
            .links
            .push(SpanLink::from_wire(&link.trace_id, &link.span_id)?);
    }
    dictionary.strings = strings;
    let mut resources = Vec::new();
    let mut profile_index = 0;
    for r in request.resource_profiles {
        let mut scopes = Vec::new();
        for scope in r.scope_profiles {
            let mut profiles = Vec::new();
            for p in scope.profiles {
                let mut sample_types = Vec::new();
                for vt in &p.sample_type {
                    check_index(
                        "profile.sample_type",
                        vt.type_strindex.into(),
                        "string_table",
                        s,
                    )?;
                    check_index(
                        "profile.sample_type",
                        vt.unit_strindex.into(),
                        "string_table",
                        s,
                    )?;
                    sample_types.push((vt.type_strindex, vt.unit_strindex));
                }
                let period_type = match &p.period_type {
                    Some(vt) => {
                        check_index(
                            "profile.period_type",
                            vt.type_strindex.into(),
                            "string_table",
                            s,
                        )?;
                        check_index(
                            "profile.period_type",
                            vt.unit_strindex.into(),
                            "string_table",
                            s,
                        )?;
                        Some((vt.type_strindex, vt.unit_strindex))
                    }
                    None => None,
                };
                check_indices(
                    "profile.location_indices",
                    &p.location_indices,
                    "location_table",
                    dictionary.locations.len(),
                )?;
                check_sample_count(profile_index, p.sample.len(), limits)?;
                let base = dictionary.stack_locations.len();
                dictionary
                    .stack_locations
                    .extend_from_slice(&p.location_indices);
                let mut samples = Vec::with_capacity(p.sample.len());
                for (sample_index, sample) in p.sample.iter().enumerate() {
                    let start = i64::from(sample.locations_start_index);
                    let end = start + i64::from(sample.locations_length);
                    if sample.locations_length < 0 {
                        return Err(OtlpError::BadSample {
                            profile: profile_index,
                            sample: sample_index,
                            message: "negative locations_length".to_owned(),
                        });
                    }
                    check_stack_depth(
                        "sample.locations_length",
                        sample.locations_length.unsigned_abs() as usize,
                        limits,
                    )?;
                    if end > 0 {
                        check_index(
                            "sample.locations_start_index + locations_length - 1",
                            end - 1,
                            "profile.location_indices",
                            p.location_indices.len(),
                        )?;
                    }
                    check_index(
                        "sample.locations_start_index",
                        start,
                        "profile.location_indices",
                        p.location_indices.len() + 1,
                    )?;
                    check_indices(
                        "sample.attribute_indices",
                        &sample.attribute_indices,
                        "attribute_table",
                        dictionary.attributes.len(),
                    )?;
                    samples.push(Sample {
                        stack: base + start as usize..base + end as usize,
                        values: sample_values(
                            &sample.value,
                            sample.timestamps_unix_nano.len(),
                            sample_types.len(),
                            (profile_index, sample_index),
                        )?,
                        attributes: sample.attribute_indices.clone(),
                        link: sample_link(sample.link_index, dictionary.links.len())?,
                    });
                }
                profiles.push(Profile {
                    sample_types,
                    period_type,
                    period: p.period,
                    time_nanos: p.time_nanos,
                    duration_nanos: p.duration_nanos,
                    samples,
                });
                profile_index += 1;
            }
            let scope_attributes = scope.scope.map(|s| s.attributes).unwrap_or_default();
            scopes.push(ScopeProfiles {
                attributes: attributes(&scope_attributes, &dictionary.strings)?,
                profiles,
            });
        }
        let resource_attributes = r.resource.map(|r| r.attributes).unwrap_or_default();
        resources.push(ResourceProfiles {
            attributes: attributes(&resource_attributes, &dictionary.strings)?,
            scopes,
        });
    }
    Ok(Batch {
        dictionary,
        resources,
    })
}
