//! One function per fuzz target, each feeding arbitrary bytes to a parser
//! that reads what a client or the disk hands the store. A target returns
//! normally on every input: parsed, or refused with an error that says why.
//! A panic, an abort or running out of the fuzzer's memory limit is a bug.
//!
//! [`seeds`] builds a small valid corpus for each target at run time from
//! the project's own encoders, so nothing is copied from elsewhere.

use kiln_engine::model::{Label, LabelSet};
use kiln_pprof::{DecodeLimits, FunctionSpec, MappingSpec, ProfileBuilder};
use kiln_storage::wal::record::{WalRecord, decode_payload, encode_frame, parse_segment};
use kiln_store::config::Limits;
use kiln_store::ingest::otlp::{OtlpLimits, decode_export};
use kiln_store::ingest::pyroscope::{
    IngestBody, MultipartParts, build_upload, parse_ingest_params,
};
use prost::Message;

pub mod debuginfo;
pub mod otlp_revisions;
pub mod querier;
pub mod trees;

/// The fuzz targets, by the name `--target` takes.
pub const TARGETS: [&str; 14] = [
    "pprof",
    "folded",
    "multipart",
    "push_json",
    "otlp",
    "wal_record",
    "block",
    "connect",
    "select_series",
    "otlp_revisions",
    "query_trees",
    "recorded",
    "debuginfo",
    "symbol_cache",
];

/// Fixed "now" for the `/ingest` parameters and stored profiles, so runs
/// are reproducible.
pub(crate) const NOW_MS: i64 = 1_795_310_560_000;

/// Runs `target` on `data`; `false` when the target is unknown.
pub fn run(target: &str, data: &[u8]) -> bool {
    match target {
        "pprof" => pprof(data),
        "folded" => folded(data),
        "multipart" => multipart(data),
        "push_json" => push_json(data),
        "otlp" => otlp(data),
        "wal_record" => wal_record(data),
        "block" => block(data),
        "connect" => querier::connect(data),
        "select_series" => querier::select_series(data),
        "otlp_revisions" => otlp_revisions::otlp_revisions(data),
        "query_trees" => trees::query_trees(data),
        "recorded" => recorded(data),
        "debuginfo" => debuginfo::debuginfo(data),
        "symbol_cache" => debuginfo::symbol_cache(data),
        _ => return false,
    }
    true
}

/// pprof, gzipped or not, as every ingest path decodes it: through prost
/// and straight from the wire, which must agree (the same profile, or
/// errors with the same reason).
pub fn pprof(data: &[u8]) {
    let limits = DecodeLimits::default();
    match (
        kiln_pprof::decode(data, &limits),
        kiln_pprof::decode_flat(data, &limits),
    ) {
        (Ok(message), Ok(flat)) => assert!(flat.to_message() == message.into_raw()),
        (Err(a), Err(b)) => {
            assert!(!a.to_string().is_empty());
            assert_eq!(a.reason(), b.reason(), "{a} / {b}");
        }
        (a, b) => panic!(
            "the decoders disagree: prost {:?}, flat {:?}",
            a.err(),
            b.err()
        ),
    }
}

/// Folded text through `/ingest?format=folded`.
pub fn folded(data: &[u8]) {
    ingest(
        "name=fuzz.cpu&format=folded",
        IngestBody::Raw(data.to_vec()),
    );
}

/// A multipart upload's fields (`profile`, `prev_profile`,
/// `sample_type_config`), split from the input at the first two `\0\0`.
pub fn multipart(data: &[u8]) {
    let mut fields = data.splitn(3, |&b| b == 0);
    let profile = fields.next().unwrap_or_default().to_vec();
    let prev_profile = fields.next().map(<[u8]>::to_vec);
    let sample_type_config = fields.next().map(<[u8]>::to_vec);
    ingest(
        "name=fuzz&format=pprof",
        IngestBody::Multipart(MultipartParts {
            profile,
            prev_profile,
            sample_type_config,
        }),
    );
}

fn ingest(query: &str, body: IngestBody) {
    let Ok(params) = parse_ingest_params(query, None, NOW_MS) else {
        panic!("the fixed query {query} parses");
    };
    if let Err(error) = build_upload(&params, body, &DecodeLimits::default(), &mut |_| Ok(())) {
        assert!(!error.to_string().is_empty());
    }
}

/// `push.v1.PushRequest` in JSON (Connect with `application/json`).
pub fn push_json(data: &[u8]) {
    if let Err(error) =
        kiln_store::ingest::push_json::push_request_from_json(data, &Limits::default())
    {
        assert!(!error.to_string().is_empty());
    }
}

/// An OTLP profiles export, in whichever layout revision it decodes as.
pub fn otlp(data: &[u8]) {
    if let Err(error) = decode_export(data, &OtlpLimits::default()) {
        assert!(!error.to_string().is_empty());
    }
}

/// A WAL record's payload, and the same bytes as a whole segment.
pub fn wal_record(data: &[u8]) {
    let _ = decode_payload(data);
    let _ = parse_segment(data);
}

/// A block file as the bucket returns it.
pub fn block(data: &[u8]) {
    if let Err(error) = kiln_engine::Block::decode(data) {
        assert!(!error.to_string().is_empty());
    }
}

/// A recorded-series file as the bucket returns it: refused, or read into
/// points that write back to a file reading the same.
pub fn recorded(data: &[u8]) {
    use kiln_engine::recording::RecordedPoints;
    match RecordedPoints::decode(data) {
        Ok((points, replaces)) => {
            let again = RecordedPoints::decode(&points.encode(&replaces));
            assert!(again.is_ok_and(|(p, r)| p == points && r == replaces));
        }
        Err(error) => assert!(!error.to_string().is_empty()),
    }
}

/// A recorded-series file as a merge writes it: two series, three points,
/// one replaced file.
fn recorded_bytes() -> Vec<u8> {
    let mut points = kiln_engine::recording::RecordedPoints::new();
    for (pod, time_ms, value) in [
        ("a", NOW_MS, 5),
        ("a", NOW_MS + 10_000, 7),
        ("b", NOW_MS, 1),
    ] {
        let labels = LabelSet::new(vec![
            Label::new("__name__", "kiln_cpu"),
            Label::new("pod", pod),
        ]);
        points.add(&labels, time_ms, value);
    }
    points.encode(&["f_01JFUZZSEEDBLOCK000000000_0_10000.krec".to_owned()])
}

/// A small CPU profile, with `stacks` distinct stacks.
fn cpu_profile(stacks: usize) -> kiln_pprof::proto::Profile {
    let mut builder = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    builder.period("cpu", "nanoseconds", 10_000_000);
    builder.time(NOW_MS * 1_000_000, 10_000_000_000);
    let mapping = builder.mapping(&MappingSpec {
        memory_start: 0x400000,
        memory_limit: 0x800000,
        filename: "/usr/bin/app".into(),
        build_id: "abc123".into(),
        has_functions: true,
        ..MappingSpec::default()
    });
    for stack in 0..stacks {
        let frames: Vec<u64> = (0..3 + stack % 4)
            .map(|depth| {
                let function = builder.function(&FunctionSpec {
                    name: format!("fn_{stack}_{depth}"),
                    system_name: String::new(),
                    filename: "app.go".into(),
                    start_line: depth as i64,
                });
                builder.location(mapping, 0x400000 + depth as u64 * 16, &[(function, 1)])
            })
            .collect();
        builder.sample(&frames, &[1 + stack as i64, 10_000_000], &[]);
    }
    builder.finish()
}

/// Valid inputs for `target`, to start the fuzzer from.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    let profile = cpu_profile(4);
    let pprof = profile.encode_to_vec();
    match target {
        "pprof" => vec![pprof.clone(), kiln_pprof::encode_gzip(&profile)],
        "folded" => vec![b"main;work;hot 10\nmain;idle 3\n".to_vec()],
        "multipart" => {
            let mut with_prev = pprof.clone();
            with_prev.push(0);
            with_prev.extend_from_slice(&cpu_profile(2).encode_to_vec());
            with_prev.push(0);
            with_prev.extend_from_slice(br#"{"cpu":{"units":"nanoseconds","cumulative":true}}"#);
            vec![pprof, with_prev]
        }
        "push_json" => {
            let raw = base64(&pprof);
            vec![
                format!(
                    r#"{{"series":[{{"labels":[{{"name":"__name__","value":"process_cpu"}},{{"name":"service_name","value":"fuzz"}}],"samples":[{{"rawProfile":"{raw}","ID":"1"}}]}}]}}"#
                )
                .into_bytes(),
            ]
        }
        "otlp" => vec![
            include_bytes!("../../tests/fixtures/otlp/v1_7.bin").to_vec(),
            include_bytes!("../../tests/fixtures/otlp/v1_9.bin").to_vec(),
            include_bytes!("../../tests/fixtures/otlp/v1_10.bin").to_vec(),
        ],
        "wal_record" => {
            let record = WalRecord {
                labels: LabelSet::new(vec![
                    Label::new("__name__", "process_cpu"),
                    Label::new("service_name", "fuzz"),
                ]),
                time_ms: NOW_MS,
                duration_nanos: 10_000_000_000,
                pprof,
                idempotency_key: None,
            };
            let frame = encode_frame(&record);
            let mut segment = kiln_storage::wal::record::SEGMENT_MAGIC.to_vec();
            segment.extend_from_slice(&frame);
            let payload = frame[kiln_storage::wal::record::FRAME_HEADER_BYTES..].to_vec();
            vec![payload, segment]
        }
        "block" => vec![block_bytes(&pprof)],
        "connect" => querier::connect_seeds(),
        "select_series" => querier::select_series_seeds(),
        "otlp_revisions" => otlp_revisions::seeds(),
        "query_trees" => trees::seeds(&pprof),
        "recorded" => vec![recorded_bytes()],
        "debuginfo" => vec![debuginfo::elf_seed()],
        "symbol_cache" => vec![debuginfo::symbol_cache_seed()],
        _ => Vec::new(),
    }
}

/// One block holding `pprof`, encoded as a flush writes it.
fn block_bytes(pprof: &[u8]) -> Vec<u8> {
    let Ok(profile) = kiln_pprof::decode(pprof, &DecodeLimits::default()) else {
        return Vec::new();
    };
    let mut head = kiln_engine::Head::new();
    let labels = LabelSet::new(vec![
        Label::new("__name__", "process_cpu"),
        Label::new("service_name", "fuzz"),
    ]);
    let limits = kiln_engine::IngestLimits::default();
    if head
        .ingest(&profile, &labels, NOW_MS, 10_000_000_000, &limits)
        .is_err()
    {
        return Vec::new();
    }
    kiln_engine::encode_block(&head, "01JFUZZSEEDBLOCK000000000", "fuzz")
        .map(|(_, data)| data)
        .unwrap_or_default()
}

/// Standard base64 with padding, for the JSON seed.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_has_seeds_that_it_accepts_and_mutations_that_it_survives() {
        for target in TARGETS {
            let seeds = seeds(target);
            assert!(!seeds.is_empty(), "{target} has seeds");
            for seed in &seeds {
                assert!(!seed.is_empty(), "{target}: an empty seed");
                assert!(run(target, seed));
                // Truncations and bit flips of a valid input: the cheapest
                // fuzzing, so a plain `cargo test` exercises every target.
                for cut in (0..seed.len()).step_by(seed.len().div_ceil(64).max(1)) {
                    run(target, &seed[..cut]);
                    let mut flipped = seed.clone();
                    flipped[cut] ^= 0x5a;
                    run(target, &flipped);
                }
            }
        }
        assert!(!run("nope", b""));
    }

    #[test]
    fn seeds_are_valid_inputs_not_just_bytes() {
        let pprof = &seeds("pprof")[0];
        assert!(kiln_pprof::decode(pprof, &DecodeLimits::default()).is_ok());
        assert!(
            kiln_store::ingest::push_json::push_request_from_json(
                &seeds("push_json")[0],
                &Limits::default()
            )
            .is_ok()
        );
        for body in seeds("otlp") {
            assert!(decode_export(&body, &OtlpLimits::default()).is_ok());
        }
        assert!(decode_payload(&seeds("wal_record")[0]).is_ok());
        assert!(kiln_engine::Block::decode(&seeds("block")[0]).is_ok());
        assert!(kiln_engine::recording::RecordedPoints::decode(&seeds("recorded")[0]).is_ok());
        assert!(kiln_debuginfo::cache_file::decode(&seeds("symbol_cache")[0], 1 << 20).is_ok());
    }

    /// The ELF seed is read whole and names its function and the call
    /// inlined into it, so the fuzzer starts from lookups that succeed.
    #[test]
    fn the_elf_seed_names_its_function_and_its_inlined_call() {
        let seed = &seeds("debuginfo")[0];
        let file = kiln_debuginfo::DebugFile::parse(seed, Default::default()).unwrap();
        assert_eq!(
            file.build_id().map(|id| id.as_str().len()),
            Some(40),
            "a 20-byte build id"
        );
        assert!(file.has_dwarf());
        let names = |offset| -> Vec<String> {
            file.frames(offset, 0)
                .into_iter()
                .map(|f| f.function)
                .collect()
        };
        assert_eq!(names(debuginfo::TEXT_OFFSET), ["fuzz_hot"]);
        assert_eq!(
            names(debuginfo::TEXT_OFFSET + 0x14),
            ["fuzz_inlined", "fuzz_hot"]
        );
    }
}
