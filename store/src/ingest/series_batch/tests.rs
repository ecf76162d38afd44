use super::*;
use kiln_api::parca::profilestore::v1alpha1 as parca;

fn series(labels: &[(&str, &str)], profiles: &[&[u8]]) -> parca::RawProfileSeries {
    parca::RawProfileSeries {
        labels: Some(parca::LabelSet {
            labels: labels
                .iter()
                .map(|(n, v)| parca::Label {
                    name: (*n).into(),
                    value: (*v).into(),
                })
                .collect(),
        }),
        samples: profiles
            .iter()
            .map(|p| parca::RawSample {
                raw_profile: p.to_vec(),
                executable_info: Vec::new(),
            })
            .collect(),
    }
}

fn request(series: Vec<parca::RawProfileSeries>) -> WriteRawRequest {
    WriteRawRequest {
        series,
        ..WriteRawRequest::default()
    }
}

#[test]
fn a_series_with_bad_labels_is_refused_alone() {
    let limits = Limits::default();
    let long = "x".repeat(limits.max_label_bytes + 1);
    let split = series_from_write_raw(
        request(vec![
            series(&[("__name__", "cpu")], &[b"p1"]),
            series(&[("__name__", "cpu"), ("service_name", &long)], &[b"p2"]),
            series(&[("__name__", "cpu"), ("pod", "b")], &[b"p3", b""]),
            series(&[("__name__", "cpu"), ("pod", "c")], &[b"p4", b"p5"]),
        ]),
        &limits,
    )
    .expect("the request as a whole is fine");
    assert_eq!(split.len(), 4);
    assert_eq!(split[0].uploads.as_ref().map(Vec::len), Ok(1));
    assert!(matches!(
        split[1].uploads,
        Err(UploadError::LabelTooLong { series: 1, .. })
    ));
    assert!(matches!(
        split[2].uploads,
        Err(UploadError::EmptyProfile {
            series: 2,
            sample: 1
        })
    ));
    assert_eq!(split[3].uploads.as_ref().map(Vec::len), Ok(2));
}

#[test]
fn each_profile_gets_its_series_key() {
    let limits = Limits::default();
    let mut request = request(vec![
        series(&[("__name__", "cpu")], &[b"p1"]),
        series(&[("__name__", "cpu")], &[b"p2", b"p3"]),
        series(&[("__name__", "cpu")], &[b"p4"]),
    ]);
    request.kiln_idempotency_keys = vec!["k0".into(), "k1".into()];
    let split = series_from_write_raw(request, &limits).expect("fine");
    assert_eq!(split[0].keys, vec![Some("k0".to_string())]);
    assert_eq!(
        split[1].keys,
        vec![Some("k1/0".to_string()), Some("k1/1".to_string())]
    );
    assert_eq!(split[2].keys, vec![None], "no key sent for it");
}

#[test]
fn an_empty_or_oversized_request_is_refused_whole() {
    let limits = Limits {
        max_profiles_per_request: 2,
        ..Limits::default()
    };
    assert_eq!(
        series_from_write_raw(request(vec![]), &limits).err(),
        Some(UploadError::Empty)
    );
    assert_eq!(
        series_from_write_raw(
            request(vec![series(&[("__name__", "cpu")], &[b"a", b"b", b"c"])]),
            &limits
        )
        .err(),
        Some(UploadError::TooManyProfiles { limit: 2 })
    );
}

#[test]
fn empty_series_are_refused_alone_and_too_many_series_whole() {
    let limits = Limits {
        max_profiles_per_request: 3,
        ..Limits::default()
    };
    let split = series_from_write_raw(
        request(vec![
            series(&[("__name__", "cpu")], &[]),
            series(&[("__name__", "cpu")], &[b"p"]),
        ]),
        &limits,
    )
    .expect("one series holds a profile");
    assert_eq!(
        split[0].uploads.as_ref().err(),
        Some(&UploadError::EmptySeries { series: 0 })
    );
    assert_eq!(split[1].uploads.as_ref().map(Vec::len), Ok(1));
    let empties = request((0..4).map(|_| series(&[], &[])).collect());
    assert_eq!(
        series_from_write_raw(empties, &limits).err(),
        Some(UploadError::TooManySeries {
            what: "series",
            limit: 3
        })
    );
}

/// Issue 50: the blocking and the async store loops share this; a
/// client error stops its series, a retryable one the request.
#[test]
fn progress_stops_a_series_at_a_client_error_and_the_request_at_a_retryable_one() {
    let split = series_from_write_raw(
        request(vec![
            series(&[("__name__", "cpu")], &[b"p1", b"p2"]),
            series(&[("pod", "no name")], &[b"p3"]),
            series(&[("__name__", "cpu")], &[b"p4"]),
            series(&[("__name__", "cpu")], &[b"p5"]),
        ]),
        &Limits::default(),
    )
    .expect("the request as a whole is fine");
    let mut progress = BatchProgress::new(split.len());
    let mut to_store = Vec::new();
    for (n, series) in split.into_iter().enumerate() {
        let Some((index, uploads, keys)) = progress.series_to_store(series) else {
            continue;
        };
        assert_eq!(keys.len(), uploads.len());
        to_store.push(index);
        match n {
            0 => progress.profile_failed(
                index,
                1,
                StorageError::InvalidIdempotencyKey {
                    message: "bad".into(),
                },
            ),
            2 => progress.profile_failed(index, 0, StorageError::ShuttingDown),
            _ => {}
        }
    }
    assert_eq!(to_store, [0, 2], "series 1 is refused, series 3 stopped");
    let report = progress.finish();
    let failed: Vec<(usize, usize, &str)> = report
        .failures
        .iter()
        .map(|f| (f.series, f.stored_profiles, f.reason))
        .collect();
    assert_eq!(
        failed,
        [
            (0, 1, "invalid_idempotency_key"),
            (1, 0, "missing_name"),
            (2, 0, "shutting_down"),
            (3, 0, "shutting_down"),
        ]
    );
    assert_eq!(report.series, 4);
}

#[test]
fn the_single_status_prefers_a_retryable_failure_and_counts_the_rest() {
    let refused = ApiError::from(UploadError::MissingName { series: 0 });
    let down = ApiError::from(StorageError::ShuttingDown);
    let report = BatchReport {
        series: 5,
        failures: vec![
            SeriesFailure::new(0, 0, &refused),
            SeriesFailure::new(3, 0, &down),
            SeriesFailure::new(4, 0, &down),
        ],
    };
    let status = report.status().expect("a failure");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status
            .message()
            .starts_with("3 of 5 series not stored; series 3:"),
        "{}",
        status.message()
    );
    let only_refused = BatchReport {
        series: 2,
        failures: vec![SeriesFailure::new(0, 0, &refused)],
    };
    assert_eq!(
        only_refused.status().map(|s| s.code()),
        Some(tonic::Code::InvalidArgument)
    );
    assert!(only_refused.failures[0].is_client_error());
    assert_eq!(BatchReport::default().status().map(|s| s.code()), None);
}
