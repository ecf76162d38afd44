//! The flat decoder (`decode_flat`, straight from the wire, no prost tree)
//! gives what the prost decoder (`decode`) gives: the same profile for real
//! profiles a live Go program writes at test time (and the `../shared`
//! fixtures where present), and the same verdict for malformed, truncated,
//! mutated and hostile inputs: the same error, or for broken framing an
//! error with the same reason (`not_protobuf`).

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_pprof::{
    DecodeLimits, LabelValue, PprofError, ProfileBuilder, ProfileView, decode, decode_flat,
    encode_gzip,
};
use kiln_testkit::fixtures::shared_testdata;
use kiln_testkit::go_programs;
use kiln_testkit::prerequisites::visible_skip;
use proptest::prelude::*;
use prost::Message;
use sample_profiles::valid_profile;

mod sample_profiles;

/// Asserts both decoders agree on `input` under `limits`; returns whether
/// it decoded.
fn assert_same_verdict(name: &str, input: &[u8], limits: &DecodeLimits) -> bool {
    match (decode(input, limits), decode_flat(input, limits)) {
        (Ok(message), Ok(flat)) => {
            assert_eq!(
                ProfileView::string_count(&message),
                flat.string_count(),
                "{name}"
            );
            for p in 0..message.locations().len() {
                let (a, b) = (
                    ProfileView::location_at(&message, p).unwrap(),
                    flat.location_at(p).unwrap(),
                );
                assert_eq!(
                    (a.id, a.address, a.lines),
                    (b.id, b.address, b.lines),
                    "{name}"
                );
            }
            for i in 0..message.samples().len() {
                let (a, b) = (ProfileView::sample(&message, i), flat.sample(i));
                assert_eq!(
                    (a.location_ids, a.values, a.labels),
                    (b.location_ids, b.values, b.labels),
                    "{name}"
                );
            }
            assert_eq!(flat.to_message(), message.into_raw(), "{name}");
            true
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.reason(), b.reason(), "{name}: {a} / {b}");
            if !matches!(a, PprofError::Protobuf { .. }) {
                assert_eq!(a.to_string(), b.to_string(), "{name}");
            }
            false
        }
        (a, b) => panic!(
            "{name}: decode gave {:?}, decode_flat {:?}",
            a.map(|_| "a profile"),
            b.map(|_| "a profile")
        ),
    }
}

fn go_profiles(tmp: &Path) -> Option<Vec<(String, Vec<u8>)>> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/profiled/main.go");
    let binary = go_programs::build(&source, tmp, "profiled")?;
    let run = Command::new(&binary).arg(tmp).output().unwrap();
    assert!(
        run.status.success(),
        "the profiled program failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    Some(
        ["cpu.pprof", "heap.pprof", "goroutine.pprof"]
            .iter()
            .map(|name| (name.to_string(), std::fs::read(tmp.join(name)).unwrap()))
            .collect(),
    )
}

/// Real Go profiles, gzipped as written and inflated, under the default
/// limits and under limits each of them just exceeds.
#[test]
fn real_go_profiles_decode_to_the_same_profile_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(profiles) = go_profiles(tmp.path()) else {
        return;
    };
    let defaults = DecodeLimits::default();
    for (name, gzipped) in &profiles {
        assert!(assert_same_verdict(name, gzipped, &defaults), "{name}");
        let plain = kiln_pprof::maybe_gunzip(gzipped, usize::MAX).unwrap();
        assert!(assert_same_verdict(name, &plain, &defaults), "{name}");
        let profile = decode(gzipped, &defaults).unwrap();
        let tight = [
            DecodeLimits {
                max_samples: profile.samples().len().saturating_sub(1),
                ..defaults.clone()
            },
            DecodeLimits {
                max_string_bytes: 8,
                ..defaults.clone()
            },
            DecodeLimits {
                max_stack_depth: 3,
                ..defaults.clone()
            },
        ];
        for limits in &tight {
            assert_same_verdict(name, gzipped, limits);
        }
        // Every truncation of the protobuf gets the same verdict.
        for keep in (0..plain.len()).step_by(97) {
            assert_same_verdict(name, &plain[..keep], &defaults);
        }
    }
}

/// The `../shared` fixtures, where checked out: valid ones, legacy formats
/// and invalid UTF-8 alike.
#[test]
fn shared_fixtures_get_the_same_verdict_both_ways() {
    let Some(dir) = shared_testdata("profiles") else {
        visible_skip("the decoders were compared on live Go profiles only");
        return;
    };
    let mut compared = 0;
    for entry in walk(&dir) {
        let bytes = std::fs::read(&entry).unwrap();
        assert_same_verdict(
            &entry.display().to_string(),
            &bytes,
            &DecodeLimits::default(),
        );
        compared += 1;
    }
    assert!(compared > 0, "no fixture in {}", dir.display());
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else if path.extension().is_some_and(|e| e != "md") {
            files.push(path);
        }
    }
    files
}

/// Hand-written wire cases: unknown fields of every wire type (groups
/// included), unpacked repeated scalars, a `period_type` sent twice (merged
/// field by field), wrong wire types, bad varints and keys, and each
/// validation error.
#[test]
fn hand_written_wire_cases_get_the_same_verdict() {
    let limits = DecodeLimits::default();
    let base = valid_profile().encode_to_vec();
    let with = |extra: &[u8]| [base.as_slice(), extra].concat();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unknown varint", with(&[0xa0, 0x01, 0x05])),
        (
            "unknown fixed64",
            with(&[0xa1, 0x01, 1, 2, 3, 4, 5, 6, 7, 8]),
        ),
        ("unknown fixed32", with(&[0xa5, 0x01, 1, 2, 3, 4])),
        ("unknown bytes", with(&[0xa2, 0x01, 0x02, 0xff, 0xff])),
        ("unknown group", with(&[0xa3, 0x01, 0x08, 0x01, 0xa4, 0x01])),
        ("unclosed group", with(&[0xa3, 0x01, 0x08, 0x01])),
        ("mismatched end group", with(&[0xa3, 0x01, 0xac, 0x01])),
        ("stray end group", with(&[0xa4, 0x01])),
        (
            "deep groups",
            with(&[[0xa3u8, 0x01].repeat(120), [0xa4, 0x01].repeat(120)].concat()),
        ),
        ("period_type twice", with(&[0x5a, 0x02, 0x08, 0x01])),
        ("comment unpacked", with(&[0x68, 0x01])),
        ("comment packed", with(&[0x6a, 0x02, 0x01, 0x02])),
        ("comment out of range", with(&[0x68, 0x7f])),
        ("time as bytes", with(&[0x4a, 0x00])),
        ("sample as varint", with(&[0x10, 0x01])),
        ("tag zero", with(&[0x00, 0x01])),
        ("wire type 6", with(&[0x0e])),
        (
            "eleven-byte varint",
            with(&[
                0x48, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ]),
        ),
        (
            "tenth byte overflows",
            with(&[
                0x48, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
            ]),
        ),
        (
            "tenth byte carries bit 63",
            with(&[
                0x48, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ]),
        ),
        ("key over 32 bits", with(&[0x80, 0x80, 0x80, 0x80, 0x10])),
        ("length past the end", with(&[0x32, 0x05, 0x61])),
        (
            "sample with unknown field and unpacked ids",
            with(&[0x12, 0x08, 0x08, 0x01, 0x10, 0x01, 0x10, 0x02, 0x28, 0x07]),
        ),
        (
            "sample with a bad location",
            with(&[0x12, 0x06, 0x0a, 0x01, 0x09, 0x12, 0x01, 0x01]),
        ),
        (
            "location with an unknown function",
            with(&[0x22, 0x06, 0x08, 0x09, 0x22, 0x02, 0x08, 0x09]),
        ),
        ("duplicate function id", with(&[0x2a, 0x02, 0x08, 0x01])),
        (
            "zero mapping id among others",
            with(&[0x1a, 0x02, 0x08, 0x00]),
        ),
        ("empty", Vec::new()),
        ("only a string table", vec![0x32, 0x00]),
        ("first string not empty", vec![0x32, 0x01, 0x61]),
    ];
    for (name, input) in &cases {
        assert_same_verdict(name, input, &limits);
        assert_same_verdict(name, &encode_gzip_bytes(input), &limits);
    }
}

fn encode_gzip_bytes(plain: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(plain).unwrap();
    encoder.finish().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, ..ProptestConfig::default() })]

    /// Arbitrary bytes get the same verdict.
    #[test]
    fn arbitrary_bytes_get_the_same_verdict(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        assert_same_verdict("arbitrary", &bytes, &DecodeLimits::default());
    }

    /// Any byte of a valid profile changed, and the result cut anywhere,
    /// gets the same verdict.
    #[test]
    fn mutated_profiles_get_the_same_verdict(
        position in any::<prop::sample::Index>(),
        value in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut plain = valid_profile().encode_to_vec();
        let at = position.index(plain.len());
        plain[at] = value;
        let keep = cut.index(plain.len() + 1);
        assert_same_verdict("mutated and cut", &plain[..keep.max(at)], &DecodeLimits::default());
        assert_same_verdict("mutated", &plain, &DecodeLimits::default());
    }

    /// Whatever the builder writes decodes to the same profile both ways.
    #[test]
    fn built_profiles_decode_the_same(stacks in proptest::collection::vec((proptest::collection::vec(0u8..20, 1..30), 1i64..1_000), 1..40)) {
        let mut builder = ProfileBuilder::new(&[("samples", "count")]);
        for (frames, value) in &stacks {
            let ids: Vec<u64> = frames.iter().map(|f| {
                let function = builder.function(&kiln_pprof::FunctionSpec { name: format!("f{f}"), ..Default::default() });
                builder.location(0, u64::from(*f), &[(function, 1)])
            }).collect();
            builder.sample(&ids, &[*value], &[("k", LabelValue::Str(format!("v{}", value % 3)))]);
        }
        prop_assert!(assert_same_verdict("built", &encode_gzip(&builder.finish()), &DecodeLimits::default()));
    }
}

/// Twin of `shared_fixtures_get_the_same_verdict_both_ways` that needs no
/// `../shared`: every kind of real input made now, valid and not. Go's
/// CPU (with a label that is not UTF-8), heap, block, mutex and goroutine
/// profiles, gzipped and not; its legacy text profiles; a Java Flight
/// Recorder file, plain and gzipped; and a `perf.data` recording.
#[test]
fn real_inputs_made_now_get_the_same_verdict_both_ways() {
    use kiln_testkit::real_inputs::{go_profiles, jfr_recordings, perf_recordings};
    let tmp = tempfile::tempdir().unwrap();
    let limits = DecodeLimits::default();
    let (mut valid, mut refused) = (0, 0);
    let mut compare = |name: &str, bytes: &[u8]| {
        if assert_same_verdict(name, bytes, &limits) {
            valid += 1;
        } else {
            refused += 1;
        }
    };
    let mut expected = (0, 0);
    if let Some(go) = go_profiles::write_go_profiles(tmp.path()) {
        for (name, path) in go.pprof_files() {
            let gzipped = std::fs::read(path).unwrap();
            compare(name, &gzipped);
            compare(
                name,
                &kiln_pprof::maybe_gunzip(&gzipped, usize::MAX).unwrap(),
            );
        }
        for path in &go.legacy_text {
            compare(&path.display().to_string(), &std::fs::read(path).unwrap());
        }
        expected.0 += 10;
        expected.1 += 2;
    }
    if let Some(jfr) = jfr_recordings::record_jfr(tmp.path()) {
        let bytes = std::fs::read(&jfr).unwrap();
        compare("jfr", &bytes);
        compare("jfr, gzipped", &encode_gzip_bytes(&bytes));
        expected.1 += 2;
    }
    if let Some(perf) = perf_recordings::record_busy_c_program(tmp.path(), false, 0.2) {
        compare("perf.data", &std::fs::read(&perf.data).unwrap());
        expected.1 += 1;
    }
    assert_eq!((valid, refused), expected, "(decoded, refused)");
}
