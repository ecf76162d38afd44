//! Arbitrary input never panics the request parsers: it parses or it gets
//! an error (with a message).

use kiln_store::ingest::pyroscope::app_name::parse_app_name;
use kiln_store::ingest::pyroscope::{IngestBody, build_upload, parse_ingest_params};
use kiln_store::query::selector::parse_selector;
use kiln_store::wire::time::parse_time_ms;
use proptest::prelude::*;

const NOW: i64 = 1_795_310_560_000;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn selector_parser_never_panics(text in ".{0,80}") {
        if let Err(err) = parse_selector(&text) {
            prop_assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn selector_like_text_never_panics(
        text in r#"[a-z_:]{0,20}\{?([a-z._]{0,6}(=|!=|=~|!~)?("[^"]{0,6}"?|'x'|`y`)?,? ?){0,4}\}?.{0,3}"#
    ) {
        if let Ok(parsed) = parse_selector(&text) {
            let _ = parsed.resolve(&[]);
        }
    }

    #[test]
    fn time_parser_never_panics(text in ".{0,40}") {
        let _ = parse_time_ms(&text, NOW);
    }

    #[test]
    fn time_like_text_never_panics(
        text in r"(now)?[-+]?[0-9]{0,25}(\.[0-9]{0,5})?(ms|s|m|h|d|w|y|q)?|[0-9]{4}-[0-9]{2}-[0-9]{2}([Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{0,9})?(Z|[+-][0-9]{2}:[0-9]{2})?)?|[0-9]{2}:[0-9]{2}_[0-9]{8}"
    ) {
        let _ = parse_time_ms(&text, NOW);
    }

    #[test]
    fn app_name_parser_never_panics(text in r".{0,20}(\{.{0,40}\}?)?.{0,4}") {
        let _ = parse_app_name(&text);
    }

    #[test]
    fn ingest_query_and_folded_body_never_panic(
        query in r"name=[a-z.{}=,%0-9]{0,30}(&from=[a-z0-9-]{0,12})?(&format=[a-z]{0,8})?(&sampleRate=[0-9]{0,12})?",
        body in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        if let Ok(params) = parse_ingest_params(&query, None, NOW) {
            let _ = build_upload(
                &params,
                IngestBody::Raw(body),
                &kiln_pprof::DecodeLimits::default(),
                &mut |_| Ok(()),
            );
        }
    }
}
