//! Malformed, truncated, oversized and hostile pprof inputs are refused with a
//! clear error and never panic.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::io::Write;

use kiln_pprof::{DecodeLimits, LabelValue, PprofError, ProfileBuilder, decode, encode_gzip};
use proptest::prelude::*;
use prost::Message;
use sample_profiles::valid_profile;

mod sample_profiles;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn builder_output_decodes_and_keeps_its_contents() {
    let bytes = encode_gzip(&valid_profile());
    let profile = decode(&bytes, &DecodeLimits::default()).unwrap();
    assert_eq!(profile.samples().len(), 2);
    assert_eq!(profile.string(profile.sample_types()[1].r#type), "cpu");
    let total: i64 = profile.samples().iter().map(|s| s.value[1]).sum();
    assert_eq!(total, 40_000_000);
    let work_loc = profile
        .location(profile.samples()[0].location_id[0])
        .unwrap();
    let names: Vec<&str> = work_loc
        .line
        .iter()
        .map(|l| profile.string(profile.function(l.function_id).unwrap().name))
        .collect();
    assert_eq!(names, ["inlined", "work"]);
    assert_eq!(
        profile.string(profile.mapping(work_loc.mapping_id).unwrap().build_id),
        "abc123"
    );
}

#[test]
fn builder_merges_samples_with_the_same_stack_and_labels() {
    let mut builder = ProfileBuilder::new(&[("samples", "count")]);
    let f = builder.function(&kiln_pprof::FunctionSpec {
        name: "f".into(),
        ..Default::default()
    });
    let loc = builder.location(0, 0, &[(f, 1)]);
    builder.sample(&[loc], &[2], &[]);
    builder.sample(&[loc], &[5], &[]);
    builder.sample(&[loc], &[1], &[("k", LabelValue::Str("v".into()))]);
    let profile = builder.finish();
    assert_eq!(profile.sample.len(), 2);
    assert_eq!(profile.sample[0].value, [7]);
}

#[test]
fn plain_protobuf_is_accepted_as_well_as_gzip() {
    let plain = valid_profile().encode_to_vec();
    assert_eq!(
        decode(&plain, &DecodeLimits::default())
            .unwrap()
            .samples()
            .len(),
        2
    );
}

#[test]
fn gzip_bomb_is_refused_before_it_is_inflated() {
    // 256 MiB of zeros compresses to about 256 KiB.
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..256 {
        encoder.write_all(&chunk).unwrap();
    }
    let bomb = encoder.finish().unwrap();
    let error = decode(&bomb, &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(error, PprofError::DecompressedTooLarge { .. }),
        "{error}"
    );
}

#[test]
fn oversized_input_is_refused() {
    let limits = DecodeLimits {
        max_input_bytes: 100,
        ..DecodeLimits::default()
    };
    let error = decode(&[0u8; 101], &limits).unwrap_err();
    assert!(
        matches!(
            error,
            PprofError::InputTooLarge {
                size: 101,
                limit: 100
            }
        ),
        "{error}"
    );
}

#[test]
fn truncated_gzip_is_a_gzip_error() {
    let bytes = encode_gzip(&valid_profile());
    let error = decode(&bytes[..bytes.len() / 2], &DecodeLimits::default()).unwrap_err();
    assert!(matches!(error, PprofError::Gzip { .. }), "{error}");
}

#[test]
fn truncated_protobuf_is_a_protobuf_error() {
    let plain = valid_profile().encode_to_vec();
    let error = decode(&plain[..plain.len() - 3], &DecodeLimits::default()).unwrap_err();
    assert!(matches!(error, PprofError::Protobuf { .. }), "{error}");
}

#[test]
fn string_index_out_of_range_names_the_field() {
    let mut profile = valid_profile();
    profile.function[0].name = 9_999;
    let error = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(
            error,
            PprofError::StringIndexOutOfRange {
                field: "function.name",
                index: 9_999,
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("function.name refers to string 9999")
    );
}

#[test]
fn negative_string_index_is_refused() {
    let mut profile = valid_profile();
    profile.sample[0].label[0].key = -1;
    let error = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(
            error,
            PprofError::StringIndexOutOfRange {
                field: "label.key",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn first_string_must_be_empty() {
    let mut profile = valid_profile();
    profile.string_table[0] = b"x".to_vec();
    let error = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert!(matches!(error, PprofError::FirstStringNotEmpty), "{error}");
}

#[test]
fn unknown_location_and_function_references_are_refused() {
    let mut profile = valid_profile();
    profile.sample[1].location_id.push(77);
    let error = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(
            error,
            PprofError::UnknownLocation {
                sample_index: 1,
                location_id: 77
            }
        ),
        "{error}"
    );

    let mut profile = valid_profile();
    profile.location[0].line[0].function_id = 42;
    let error = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(
            error,
            PprofError::UnknownFunction {
                function_id: 42,
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn duplicate_and_zero_ids_are_refused() {
    let mut profile = valid_profile();
    profile.function[1].id = profile.function[0].id;
    let error = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(
            error,
            PprofError::DuplicateId {
                table: "function",
                ..
            }
        ),
        "{error}"
    );

    let mut profile = valid_profile();
    profile.location[1].id = 0;
    let error = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(error, PprofError::ZeroId { table: "location" }),
        "{error}"
    );
}

#[test]
fn sparse_ids_resolve() {
    let mut profile = valid_profile();
    // Renumber locations 1, 2 as 100, 200 and follow the references.
    for location in &mut profile.location {
        location.id *= 100;
    }
    for sample in &mut profile.sample {
        for id in &mut sample.location_id {
            *id *= 100;
        }
    }
    let decoded = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap();
    assert!(decoded.location(200).is_some());
    assert!(decoded.location(2).is_none());
}

#[test]
fn dangling_mapping_reads_as_no_mapping() {
    let mut profile = valid_profile();
    profile.location[0].mapping_id = 55;
    let decoded = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap();
    assert!(decoded.mapping(55).is_none());
}

#[test]
fn value_count_mismatch_is_refused() {
    let mut profile = valid_profile();
    profile.sample[0].value.pop();
    let error = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(
            error,
            PprofError::ValueCountMismatch {
                sample_index: 0,
                values: 1,
                sample_types: 2
            }
        ),
        "{error}"
    );
}

#[test]
fn absurd_counts_are_refused_before_decoding() {
    // Four million empty samples: 8 MB on the wire, hundreds of MB once decoded.
    let mut plain = valid_profile().encode_to_vec();
    for _ in 0..3_000_000 {
        plain.extend_from_slice(&[0x12, 0x00]);
    }
    let limits = DecodeLimits {
        max_samples: 1_000_000,
        ..DecodeLimits::default()
    };
    let error = decode(&gzip(&plain), &limits).unwrap_err();
    assert!(
        matches!(
            error,
            PprofError::LimitExceeded {
                what: "samples",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn deep_stacks_and_long_strings_hit_their_limits() {
    let mut profile = valid_profile();
    let loc = profile.sample[0].location_id[0];
    profile.sample[0].location_id = vec![loc; 5_000];
    let error = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(
            error,
            PprofError::LimitExceeded {
                what: "frames in one stack",
                ..
            }
        ),
        "{error}"
    );

    let mut profile = valid_profile();
    profile.string_table.push(vec![b'a'; 100_000]);
    let error = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert!(
        matches!(
            error,
            PprofError::LimitExceeded {
                what: "bytes in one string",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn no_sample_types_is_refused() {
    let mut profile = valid_profile();
    profile.sample_type.clear();
    for sample in &mut profile.sample {
        sample.value.clear();
    }
    let error = decode(&profile.encode_to_vec(), &DecodeLimits::default()).unwrap_err();
    assert!(matches!(error, PprofError::NoSampleTypes), "{error}");
}

#[test]
fn invalid_utf8_is_replaced_not_refused() {
    let mut profile = valid_profile();
    profile.string_table.push(vec![0xff, 0xfe, b'x']);
    profile.string_table.push("ünïcode ✓".into());
    let bytes = profile.encode_to_vec();
    let decoded = decode(&bytes, &DecodeLimits::default()).unwrap();
    let strings = decoded.strings();
    assert_eq!(strings[strings.len() - 2], "\u{fffd}\u{fffd}x");
    assert_eq!(strings[strings.len() - 1], "ünïcode ✓");
    // The store's decoder, straight from the wire, agrees.
    let flat = kiln_pprof::decode_flat(&bytes, &DecodeLimits::default()).unwrap();
    let last = flat.string_count() as i64 - 1;
    assert_eq!(flat.string(last - 1), "\u{fffd}\u{fffd}x");
    assert_eq!(flat.string(last), "ünïcode ✓");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// Arbitrary bytes never panic the decoder, gzipped or not.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2_048), gzipped in any::<bool>()) {
        let input = if gzipped { gzip(&bytes) } else { bytes };
        let _ = decode(&input, &DecodeLimits::default());
    }

    /// Corrupting any byte of a valid profile either still decodes or errors; never panics.
    #[test]
    fn mutated_valid_profiles_never_panic(position in any::<prop::sample::Index>(), value in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let mut plain = valid_profile().encode_to_vec();
        let at = position.index(plain.len());
        plain[at] = value;
        let keep = cut.index(plain.len() + 1);
        let _ = decode(&plain[..keep.max(at)], &DecodeLimits::default());
        let _ = decode(&plain, &DecodeLimits::default());
    }

    /// Whatever the builder writes, the decoder accepts, with the same totals.
    #[test]
    fn builder_and_decoder_round_trip(stacks in proptest::collection::vec((proptest::collection::vec(0u8..20, 1..30), 1i64..1_000), 1..50)) {
        let mut builder = ProfileBuilder::new(&[("samples", "count")]);
        let mut expected = 0;
        for (frames, value) in &stacks {
            let ids: Vec<u64> = frames.iter().map(|f| {
                let function = builder.function(&kiln_pprof::FunctionSpec { name: format!("f{f}"), ..Default::default() });
                builder.location(0, 0, &[(function, 1)])
            }).collect();
            builder.sample(&ids, &[*value], &[]);
            expected += value;
        }
        let decoded = decode(&encode_gzip(&builder.finish()), &DecodeLimits::default()).unwrap();
        let total: i64 = decoded.samples().iter().map(|s| s.value[0]).sum();
        prop_assert_eq!(total, expected);
    }
}

/// One location holding `lines` inlined lines of one function, and one
/// sample that repeats it `repeats` times: small on the wire, `lines *
/// repeats` frames once unwound.
fn inlined_tower(lines: usize, repeats: usize) -> Vec<u8> {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    let f = builder.function(&kiln_pprof::FunctionSpec {
        name: "f".into(),
        ..Default::default()
    });
    let location = builder.location(0, 0x10, &vec![(f, 1); lines]);
    builder.sample(&vec![location; repeats], &[1], &[]);
    builder.finish().encode_to_vec()
}

/// Each of the stack's 4096 locations and each location's 4096 lines is
/// within the depth limit, but together they unwind into 16.7 million
/// frames; both decoders refuse the stack by its unwound depth, and a stack
/// of exactly the limit still passes.
#[test]
fn a_stack_deeper_than_the_limit_once_inlined_lines_unwind_is_refused() {
    let limits = DecodeLimits::default();
    let depth = limits.max_stack_depth;
    let tower = inlined_tower(depth, depth);
    println!("the unwinding tower is {} bytes", tower.len());
    for (decoder, result) in [
        ("prost", decode(&tower, &limits).map(drop)),
        ("flat", kiln_pprof::decode_flat(&tower, &limits).map(drop)),
    ] {
        let err = result.expect_err(decoder);
        assert!(
            matches!(
                err,
                PprofError::LimitExceeded {
                    what: "frames in one stack with inlined lines unwound",
                    count: 16_777_216,
                    limit: 4096,
                }
            ),
            "{decoder}: {err}"
        );
    }
    // 64 locations of 64 lines: exactly the limit, accepted by both.
    let at_limit = inlined_tower(64, 64);
    decode(&at_limit, &limits).expect("at the limit");
    kiln_pprof::decode_flat(&at_limit, &limits).expect("at the limit");
    let over = inlined_tower(64, 65);
    assert!(decode(&over, &limits).is_err());
    assert!(kiln_pprof::decode_flat(&over, &limits).is_err());
}
