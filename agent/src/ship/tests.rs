use super::*;

#[test]
fn full_queue_drops_the_oldest_and_counts_it() {
    let mut queue = BoundedQueue::new(2);
    assert_eq!(queue.push(1), 0);
    assert_eq!(queue.push(2), 0);
    assert_eq!(queue.push(3), 1);
    assert_eq!(queue.pop(), Some(2));
    assert!(queue.push_front_if_room(2));
    assert_eq!(queue.push(4), 1);
    assert!(
        !queue.push_front_if_room(9),
        "no room: the retried item is oldest"
    );
    assert_eq!(queue.dropped(), 3);
    assert_eq!(
        (queue.pop(), queue.pop(), queue.pop()),
        (Some(3), Some(4), None)
    );
}

#[test]
fn backoff_doubles_up_to_the_cap_and_resets() {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
    let delays: Vec<_> = (0..6)
        .map(|_| backoff.next_delay(0.0).as_millis())
        .collect();
    assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000]);
    assert_eq!(backoff.next_delay(0.999).as_millis(), 1499);
    backoff.reset();
    assert_eq!(backoff.next_delay(0.0).as_millis(), 100);
}

/// A store replica looks a key it does not know up at its peers only
/// for a resend: a first send must not be marked, every resend must.
#[test]
fn only_resends_are_marked_with_their_attempt_number() {
    let batch = [ShipItem {
        labels: vec![("__name__".into(), "process_cpu".into())],
        pprof_gzip: vec![1],
        file_stem: "w1".into(),
    }];
    let first = write_raw_call(&batch, None, 0);
    assert!(first.metadata().get(RETRY_ATTEMPT_METADATA).is_none());
    assert_eq!(first.metadata().get(SERIES_STATUS_METADATA).unwrap(), "1");
    for attempt in [1u32, 2, 40] {
        let resent = write_raw_call(&batch, None, attempt);
        assert_eq!(
            resent.metadata().get(RETRY_ATTEMPT_METADATA).unwrap(),
            attempt.to_string().as_str()
        );
        assert_eq!(
            resent.get_ref().kiln_idempotency_keys,
            first.get_ref().kiln_idempotency_keys,
            "the same keys on every attempt"
        );
    }
}

#[test]
fn write_raw_request_carries_one_series_per_profile_with_labels_and_bytes() {
    let item = |pid: &str| ShipItem {
        labels: vec![
            ("__name__".into(), "process_cpu".into()),
            ("pid".into(), pid.into()),
        ],
        pprof_gzip: vec![0x1f, 0x8b],
        file_stem: pid.into(),
    };
    let request = write_raw_request(&[item("1"), item("2")]);
    assert_eq!(request.series.len(), 2);
    let series = &request.series[1];
    let labels = &series.labels.as_ref().expect("labels set").labels;
    assert_eq!(labels[0].name, "__name__");
    assert_eq!(labels[1].value, "2");
    assert_eq!(series.samples[0].raw_profile, vec![0x1f, 0x8b]);
    assert!(!request.normalized);
    // One key per series, the same each time the profile is sent.
    assert_eq!(request.kiln_idempotency_keys.len(), 2);
    assert!(request.kiln_idempotency_keys[1].ends_with("/2"));
    assert!(request.kiln_idempotency_keys[1].len() <= 128);
    assert_eq!(
        write_raw_request(&[item("2")]).kiln_idempotency_keys,
        vec![request.kiln_idempotency_keys[1].clone()]
    );
}

#[test]
fn a_store_token_goes_in_the_authorization_header_and_never_in_logs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("write-token");
    std::fs::write(&path, "s3cret-Token_1\n").expect("write token");
    let token = StoreToken::from_file(&path).expect("a valid token");
    assert_eq!(format!("{token:?}"), "StoreToken(..)");
    let request = authorized((), Some(&token));
    assert_eq!(
        request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().ok()),
        Some(Some("Bearer s3cret-Token_1"))
    );
    assert!(
        authorized((), None)
            .metadata()
            .get("authorization")
            .is_none()
    );
    for bad in ["", "  \n", "two words", "caf\u{e9}"] {
        std::fs::write(&path, bad).expect("write token");
        assert!(
            matches!(
                StoreToken::from_file(&path),
                Err(StoreTokenError::Invalid { .. })
            ),
            "{bad:?} is refused"
        );
    }
    assert!(matches!(
        StoreToken::from_file(&dir.path().join("missing")),
        Err(StoreTokenError::Unreadable { .. })
    ));
}

#[test]
fn client_errors_are_not_retried_but_outages_are() {
    let rpc = |code| ShipError::Rpc {
        code,
        message: String::new(),
    };
    assert!(!rpc(tonic::Code::InvalidArgument).is_retryable());
    assert!(rpc(tonic::Code::Unavailable).is_retryable());
    assert_eq!(rpc(tonic::Code::Unavailable).reason(), "rpc");
}
