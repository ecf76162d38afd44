//! Work that a small request makes the store do after its body is in:
//! regexes compiled from a selector, and gzip streams whose trailer says
//! nothing true about what they inflate to.

use kiln_testkit::clock::now_s;
use kiln_testkit::wire::gzip;

use super::{Attack, Expect, Hostile, last_hour_ms};

/// Regex matchers in one selector. Each compiles to a program of up to
/// 1 MiB and a lazy DFA of as much, however short its text.
const REGEX_MATCHERS: usize = 4_000;
/// Requests with that selector sent at once: fewer than the query
/// requests a store of this budget lets in at once (6), so that the good
/// client's queries still find a slot.
const PARALLEL_SELECTORS: usize = 4;
/// What the gzip bodies inflate to: under the 64 MiB inflate limit.
const INFLATED_BYTES: usize = 60 << 20;
/// Gzip uploads sent at once, each inflating to [`INFLATED_BYTES`].
const PARALLEL_UPLOADS: usize = 8;

#[test]
fn selector_of_4000_regex_matchers_4_at_once() {
    let Some(attack) = Attack::start("selector_of_4000_regex_matchers_x4") else {
        return;
    };
    let (start, end) = last_hour_ms();
    // A short pattern with a large compiled form: Unicode word classes
    // repeated.
    let matchers: Vec<String> = (0..REGEX_MATCHERS)
        .map(|i| format!(r#"l{i}=~`\\w{{1,10}}x{i}`"#))
        .collect();
    let body = format!(
        r#"{{"matchers":["{{{}}}"],"start":{start},"end":{end}}}"#,
        matchers.join(",")
    );
    eprintln!("LabelNames body: {} bytes of JSON", body.len());
    attack.run(|addr| {
        std::thread::scope(|scope| {
            let sent: Vec<_> = (0..PARALLEL_SELECTORS)
                .map(|i| {
                    let body = &body;
                    scope.spawn(move || {
                        Hostile::http(
                            format!(
                                "LabelNames, one selector of {REGEX_MATCHERS} regexes, copy {i}"
                            ),
                            Expect::Refused,
                            addr,
                            "POST",
                            "/querier.v1.QuerierService/LabelNames",
                            &[("Content-Type", "application/json")],
                            body.as_bytes(),
                        )
                    })
                })
                .collect();
            sent.into_iter()
                .map(|h| h.join().expect("sender thread"))
                .collect()
        })
    });
}

/// A gzip stream of 60 MiB of zeros (about 60 KB on the wire) whose
/// trailer says it inflates to nothing: a decoder that sizes its buffer
/// from the trailer and reserves only that inflates every copy in full
/// outside the budget.
#[test]
fn gzip_uploads_whose_trailer_says_zero_8_at_once() {
    let Some(attack) = Attack::start("gzip_uploads_trailer_zero_60mib_x8") else {
        return;
    };
    let mut body = gzip(&vec![0u8; INFLATED_BYTES]);
    let at = body.len() - 4;
    body[at..].copy_from_slice(&0u32.to_le_bytes());
    eprintln!("gzip body: {} bytes, trailer 0", body.len());
    let target = format!(
        "/ingest?name=lying.cpu&format=pprof&from={}&until={}",
        now_s() - 10,
        now_s()
    );
    attack.run(|addr| {
        std::thread::scope(|scope| {
            let sent: Vec<_> = (0..PARALLEL_UPLOADS)
                .map(|i| {
                    let (body, target) = (&body, &target);
                    scope.spawn(move || {
                        Hostile::http(
                            format!("gzip upload, trailer 0, 60 MiB inflated, copy {i}"),
                            Expect::Refused,
                            addr,
                            "POST",
                            target,
                            &[],
                            body,
                        )
                    })
                })
                .collect();
            sent.into_iter()
                .map(|h| h.join().expect("sender thread"))
                .collect()
        })
    });
}
