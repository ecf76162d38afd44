use super::*;

const TTL: Duration = Duration::from_secs(30);

fn record(holder: &str, expires_at_ms: i64) -> LeaseRecord {
    LeaseRecord {
        holder: holder.into(),
        replica: "r".into(),
        expires_at_ms,
        ttl_ms: 30_000,
    }
}

fn local_bucket(dir: &std::path::Path) -> Arc<dyn ObjectStore> {
    Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir).expect("local"))
}

#[test]
fn a_free_lease_starts_at_generation_zero() {
    assert_eq!(
        decide(None, "me", Duration::ZERO, TTL),
        LeaseDecision::Write { generation: 0 }
    );
}

#[test]
fn the_holder_renews_even_after_its_lease_lapsed_if_nobody_took_it() {
    let mine = record("me", 1_000);
    for seen_for in [Duration::ZERO, Duration::from_secs(3600)] {
        assert_eq!(
            decide(Some((7, &mine)), "me", seen_for, TTL),
            LeaseDecision::Write { generation: 8 }
        );
    }
}

#[test]
fn another_holder_is_waited_for_by_how_long_its_generation_was_seen() {
    let theirs = record("them", 1_000);
    let wait = takeover_after(TTL);
    assert_eq!(wait, Duration::from_secs(40));
    assert_eq!(
        decide(Some((3, &theirs)), "me", wait, TTL),
        LeaseDecision::HeldByOther {
            generation: 3,
            record: theirs.clone()
        }
    );
    assert_eq!(
        decide(
            Some((3, &theirs)),
            "me",
            wait + Duration::from_millis(1),
            TTL
        ),
        LeaseDecision::Write { generation: 4 }
    );
    // Released: taken at once.
    assert_eq!(
        decide(Some((3, &record("them", 0))), "me", Duration::ZERO, TTL),
        LeaseDecision::Write { generation: 4 }
    );
}

#[test]
fn the_holders_wall_clock_expiry_is_never_compared() {
    // A holder whose clock runs far behind (or a reader's clock far
    // ahead) writes an expiry that looks long past: the lease is
    // still live until it goes unrenewed for its whole time-to-live.
    let behind = record("them", 1);
    assert!(matches!(
        decide(Some((3, &behind)), "me", Duration::from_secs(1), TTL),
        LeaseDecision::HeldByOther { .. }
    ));
    // A generation of an earlier release names no time-to-live: the
    // reader's own stands in.
    let old = LeaseRecord {
        ttl_ms: 0,
        ..record("them", 1)
    };
    let short = Duration::from_secs(3);
    assert!(matches!(
        decide(Some((3, &old)), "me", Duration::from_secs(4), short),
        LeaseDecision::HeldByOther { .. }
    ));
    assert_eq!(
        decide(Some((3, &old)), "me", Duration::from_millis(4_001), short),
        LeaseDecision::Write { generation: 4 }
    );
}

#[test]
fn generation_names_sort_and_parse_back() {
    assert_eq!(parse_generation(&generation_name(42)), Some(42));
    assert!(generation_name(9) < generation_name(10));
    assert_eq!(parse_generation("12.json.tmp"), None);
    assert_eq!(parse_generation(".json"), None);
    assert_eq!(parse_generation("-1.json"), None);
}

#[tokio::test]
async fn two_processes_racing_for_a_lease_get_one_holder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = local_bucket(dir.path());
    let a = Lease::new(Arc::clone(&store), "replica/r", "a", "r", TTL);
    let b = Lease::new(Arc::clone(&store), "replica/r", "b", "r", TTL);
    let (ra, rb) = tokio::join!(a.acquire(), b.acquire());
    let (ra, rb) = (ra.expect("a"), rb.expect("b"));
    let held = [&ra, &rb]
        .iter()
        .filter(|s| matches!(s, LeaseState::Held { .. }))
        .count();
    assert_eq!(held, 1, "{ra:?} {rb:?}");
    let (winner, loser) = if a.is_held(Duration::ZERO) {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert!(!loser.is_held(Duration::ZERO));
    assert!(winner.is_held(Duration::from_secs(29)));
    // Renewal by the winner; the loser still sees it held.
    assert_eq!(
        winner.acquire().await.expect("renew"),
        LeaseState::Held { generation: 1 }
    );
    assert!(winner.confirm().await.expect("confirm"));
    assert!(matches!(
        loser.acquire().await.expect("retry"),
        LeaseState::HeldByOther { generation: 1, .. }
    ));
    // Released: the other takes it at once.
    winner.release().await.expect("release");
    assert!(!winner.is_held(Duration::ZERO));
    assert!(matches!(
        loser.acquire().await.expect("take"),
        LeaseState::Held { generation: 3 }
    ));
    // Old generations are cleaned up.
    let left = loser.generations().await.expect("list");
    assert_eq!(left.len(), 1, "{left:?}");
}

#[tokio::test]
async fn a_paused_holder_is_fenced_before_another_takes_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = local_bucket(dir.path());
    let ttl = Duration::from_millis(300);
    let stale = Lease::new(Arc::clone(&store), "retention", "stale", "a", ttl);
    let next = Lease::new(Arc::clone(&store), "retention", "next", "b", ttl);
    assert_eq!(
        stale.acquire().await.expect("take"),
        LeaseState::Held { generation: 0 }
    );
    assert!(matches!(
        next.acquire().await.expect("see"),
        LeaseState::HeldByOther { .. }
    ));
    // A step that outlives the lease is stopped when its trust ends,
    // not when the other process takes over (later).
    let started = Instant::now();
    let paused = stale
        .fenced("delete sources", async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, StorageError>(())
        })
        .await;
    assert!(
        matches!(paused, Err(StorageError::LeaseLost { .. })),
        "{paused:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    // The other process has not yet waited long enough.
    assert!(matches!(
        next.acquire().await.expect("wait"),
        LeaseState::HeldByOther { .. }
    ));
    tokio::time::sleep(takeover_after(ttl)).await;
    assert_eq!(
        next.acquire().await.expect("take over"),
        LeaseState::Held { generation: 1 }
    );
    // The paused holder, resumed, can do nothing more.
    assert!(!stale.confirm().await.expect("confirm"));
    let after = stale
        .fenced("delete sources", async { Ok::<_, StorageError>(()) })
        .await;
    assert!(
        matches!(after, Err(StorageError::LeaseLost { .. })),
        "{after:?}"
    );
    assert!(next.confirm().await.expect("confirm"));
}

#[tokio::test]
async fn confirm_sees_a_newer_generation_in_the_bucket() {
    // A holder whose monotonic clock did not advance (a suspended VM)
    // still trusts its generation; the bucket says otherwise.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = local_bucket(dir.path());
    let ours = Lease::new(Arc::clone(&store), "retention", "ours", "a", TTL);
    assert!(matches!(
        ours.acquire().await.expect("take"),
        LeaseState::Held { .. }
    ));
    let theirs = Lease::new(Arc::clone(&store), "retention", "theirs", "b", TTL);
    theirs.write(1, 1, 30_000).await.expect("write over");
    assert!(ours.is_held(Duration::ZERO));
    assert!(!ours.confirm().await.expect("confirm"));
    assert!(!ours.is_held(Duration::ZERO));
}
