use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kiln_targets::TargetsFile;
use serde_json::{Value, json};

use super::*;
use crate::resources::targets::RejectedTarget;
use crate::status::fixtures::profile_store;

fn store(spec: Value) -> ProfileStore {
    profile_store("main", json!({"generation": 3}), spec, Value::Null)
}

fn names(store: &ProfileStore) -> StoreNames {
    StoreNames::of(store).expect("names")
}

fn no_targets() -> Aggregation {
    Aggregation {
        file: TargetsFile::new([]),
        rejected: Vec::new(),
    }
}

fn replicas(ready: i32) -> Option<StatefulSetStatus> {
    Some(StatefulSetStatus {
        replicas: 2,
        ready_replicas: Some(ready),
        ..StatefulSetStatus::default()
    })
}

fn agents(ready: i32, desired: i32) -> Option<DaemonSetStatus> {
    Some(DaemonSetStatus {
        number_ready: ready,
        desired_number_scheduled: desired,
        ..DaemonSetStatus::default()
    })
}

/// The one desired condition of `type_`.
fn find(conditions: &[DesiredCondition], type_: &str) -> DesiredCondition {
    let found: Vec<_> = conditions.iter().filter(|c| c.type_ == type_).collect();
    assert_eq!(found.len(), 1, "{type_} in {conditions:?}");
    found[0].clone()
}

fn time(seconds: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(seconds).expect("a valid time"))
}

#[test]
fn counts_come_from_the_children_and_default_to_zero() {
    let store = store(json!({"servicePort": 7000}));
    let observed = Observed {
        replicas: replicas(1),
        agents: agents(3, 4),
        ..Observed::default()
    };
    let status = observed_status(&store, &names(&store), &observed, &no_targets());
    assert_eq!(
        (status.replicas, status.ready_replicas),
        (2, 1),
        "{status:?}"
    );
    assert_eq!((status.agents_ready, status.agents_desired), (3, 4));
    assert_eq!(status.observed_generation, Some(3));
    assert_eq!(status.endpoint.as_deref(), Some("main.kiln.svc:7000"));
    let empty = observed_status(&store, &names(&store), &Observed::default(), &no_targets());
    assert_eq!(
        (
            empty.replicas,
            empty.ready_replicas,
            empty.agents_ready,
            empty.matched_targets
        ),
        (0, 0, 0, 0)
    );
}

#[test]
fn kept_counts_move_only_the_generation() {
    let mut store = store(json!({}));
    store.status = Some(ProfileStoreStatus {
        observed_generation: Some(1),
        ready_replicas: 2,
        ..ProfileStoreStatus::default()
    });
    let kept = keep_counts(&store);
    assert_eq!(
        (kept.observed_generation, kept.ready_replicas),
        (Some(3), 2)
    );
}

#[test]
fn a_failure_sets_only_reconciled() {
    let failure = Failure {
        reason: "ApiError",
        message: "apply StatefulSet failed: 500".to_owned(),
    };
    let conditions = desired_conditions(
        &store(json!({})),
        &Observed::default(),
        &no_targets(),
        Some(&failure),
    );
    assert_eq!(
        conditions,
        vec![DesiredCondition::fails(
            RECONCILED,
            "ApiError",
            "apply StatefulSet failed: 500"
        )]
    );
}

#[test]
fn available_needs_one_ready_replica() {
    let store = store(json!({"replicas": 2}));
    let observed = |ready| Observed {
        replicas: replicas(ready),
        ..Observed::default()
    };
    let up = find(
        &desired_conditions(&store, &observed(1), &no_targets(), None),
        AVAILABLE,
    );
    assert_eq!((up.status, up.reason), (true, "ReplicasReady"));
    assert_eq!(up.message, "1 of 2 replicas ready");
    let down = find(
        &desired_conditions(&store, &observed(0), &no_targets(), None),
        AVAILABLE,
    );
    assert_eq!((down.status, down.reason), (false, "NoReplicasReady"));
    let unread = desired_conditions(&store, &Observed::default(), &no_targets(), None);
    assert!(!find(&unread, AVAILABLE).status);
}

#[test]
fn agents_ready_says_why_not_in_order_of_precedence() {
    let refused = |refusal| Observed {
        agent_refusal: Some(refusal),
        // Outranked by the refusal.
        agents_owned_by: Some("kiln/other".to_owned()),
        ..Observed::default()
    };
    let with_agents = |ready, desired| Observed {
        agents: agents(ready, desired),
        ..Observed::default()
    };
    // (spec, what the reconcile saw, AgentsReady's status, reason, part of its message)
    let cases = [
        (
            json!({"agent": {"enabled": false}}),
            refused(AgentRefusal::Image("evil:1".to_owned())),
            true,
            "AgentsDisabled",
            "spec.agent.enabled is false",
        ),
        (
            json!({}),
            refused(AgentRefusal::Image("evil:1".to_owned())),
            false,
            AGENT_IMAGE_NOT_ALLOWED,
            "\"evil:1\"",
        ),
        (
            json!({}),
            refused(AgentRefusal::Toleration(String::new())),
            false,
            AGENT_TOLERATION_NOT_ALLOWED,
            "every taint",
        ),
        (
            json!({}),
            refused(AgentRefusal::Toleration("gpu".to_owned())),
            false,
            AGENT_TOLERATION_NOT_ALLOWED,
            "taint key \"gpu\"",
        ),
        (
            json!({}),
            Observed {
                agents_owned_by: Some("kiln/other".to_owned()),
                ..with_agents(5, 5)
            },
            false,
            AGENTS_OWNED_ELSEWHERE,
            "ProfileStore kiln/other",
        ),
        (
            json!({}),
            with_agents(5, 5),
            true,
            "AllAgentsReady",
            "5 agents ready",
        ),
        (
            json!({}),
            with_agents(4, 5),
            false,
            "AgentsNotReady",
            "4 of 5 agents ready",
        ),
        // A DaemonSet that wants no pod (no node matches) has no ready agents to report.
        (
            json!({}),
            with_agents(0, 0),
            false,
            "AgentsNotReady",
            "0 of 0 agents ready",
        ),
        (
            json!({}),
            Observed::default(),
            false,
            "AgentsNotReady",
            "agent DaemonSet has no status yet",
        ),
    ];
    for (spec, observed, status, reason, message) in cases {
        let condition = find(
            &desired_conditions(&store(spec), &observed, &no_targets(), None),
            AGENTS_READY,
        );
        assert_eq!(
            (condition.status, condition.reason),
            (status, reason),
            "{observed:?}"
        );
        assert!(condition.message.contains(message), "{}", condition.message);
    }
}

#[test]
fn reconciled_reports_what_was_left_out() {
    let store = store(json!({}));
    let reconciled_for = |observed: Observed, aggregation: &Aggregation| {
        find(
            &desired_conditions(&store, &observed, aggregation, None),
            RECONCILED,
        )
    };
    let clean = reconciled_for(Observed::default(), &no_targets());
    assert_eq!((clean.status, clean.reason), (true, "Applied"));

    let rejected = Aggregation {
        file: TargetsFile::new([]),
        rejected: vec![RejectedTarget {
            source: "shop/bad".to_owned(),
            problem: "no selector".to_owned(),
        }],
    };
    let with_rejected = reconciled_for(Observed::default(), &rejected);
    assert_eq!(with_rejected.reason, "AppliedWithRejectedTargets");
    assert!(
        with_rejected.message.ends_with("shop/bad"),
        "{}",
        with_rejected.message
    );

    let pods = BTreeMap::from([("busy".to_owned(), 7), ("quiet".to_owned(), 1)]);
    let left_out = reconciled_for(
        Observed {
            pods_left_out: pods.clone(),
            ..Observed::default()
        },
        &rejected,
    );
    assert_eq!(
        (left_out.status, left_out.reason),
        (true, ANNOTATED_PODS_LEFT_OUT)
    );
    assert!(left_out.message.contains(": 8 ("), "{}", left_out.message);
    assert!(
        left_out.message.ends_with("busy 7, quiet 1"),
        "{}",
        left_out.message
    );

    let capped = reconciled_for(
        Observed {
            targets_left_out: (2, 1),
            pods_left_out: pods,
            ..Observed::default()
        },
        &no_targets(),
    );
    assert_eq!((capped.status, capped.reason), (true, TARGETS_FILE_CAPPED));
    assert!(
        capped
            .message
            .contains("capped at 900 KiB: 2 annotated pods and 1 ProfilingTargets"),
        "{}",
        capped.message
    );
    assert!(
        capped.message.contains("; besides, annotated pods"),
        "{}",
        capped.message
    );

    let failed = reconciled_for(
        Observed {
            targets_left_out: (2, 1),
            targets_failure: Some(Failure {
                reason: "TargetsNotApplied",
                message: "the agents' targets file was not applied: 422".to_owned(),
            }),
            ..Observed::default()
        },
        &no_targets(),
    );
    assert_eq!((failed.status, failed.reason), (false, "TargetsNotApplied"));
}

#[test]
fn the_pods_left_out_note_names_the_five_busiest_namespaces() {
    let left_out: BTreeMap<String, usize> = (1..=7).map(|n| (format!("ns{n}"), n)).collect();
    let note = pods_left_out_note(&left_out).expect("pods were left out");
    assert!(
        note.ends_with(": ns7 7, ns6 6, ns5 5, ns4 4, ns3 3, 2 more namespaces"),
        "{note}"
    );
    assert!(note.contains(": 28 ("), "{note}");
    assert_eq!(pods_left_out_note(&BTreeMap::new()), None);
    assert_eq!(
        pods_left_out_note(&BTreeMap::from([("a".to_owned(), 0)])),
        None
    );
}

#[test]
fn a_paused_store_only_says_so() {
    let conditions = paused_conditions();
    assert_eq!(find(&conditions, RECONCILED).reason, "Paused");
    assert_eq!(conditions.len(), 1);
}

#[test]
fn agent_refusals_check_the_image_before_the_tolerations() {
    let strict = BuildDefaults {
        allowed_agent_tolerations: vec!["gpu".to_owned()],
        ..BuildDefaults::default()
    };
    let refusal = |spec: Value, defaults: &BuildDefaults| AgentRefusal::of(&store(spec), defaults);
    assert_eq!(refusal(json!({}), &strict), None);
    let own_image = json!({"agent": {"image": strict.agent_image}});
    assert_eq!(refusal(own_image, &strict), None);
    let both = json!({"agent": {
        "image": "registry.invalid/evil:1",
        "tolerations": [{"operator": "Exists"}],
    }});
    assert_eq!(
        refusal(both.clone(), &strict),
        Some(AgentRefusal::Image("registry.invalid/evil:1".to_owned()))
    );
    let every_taint = json!({"agent": {"tolerations": [{"operator": "Exists"}]}});
    assert_eq!(
        refusal(every_taint.clone(), &strict),
        Some(AgentRefusal::Toleration(String::new()))
    );
    let other_taint = json!({"agent": {"tolerations": [
        {"key": "gpu", "operator": "Exists"},
        {"key": "dedicated", "operator": "Exists"},
    ]}});
    assert_eq!(
        refusal(other_taint, &strict),
        Some(AgentRefusal::Toleration("dedicated".to_owned()))
    );
    let gpu = json!({"agent": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}});
    assert_eq!(refusal(gpu, &strict), None);
    // The default allow-list (`*`) takes every toleration.
    assert_eq!(refusal(every_taint, &BuildDefaults::default()), None);
    let mut disabled = both;
    disabled["agent"]["enabled"] = json!(false);
    assert_eq!(refusal(disabled, &strict), None);
}

#[test]
fn an_unchanged_world_writes_no_status() {
    let store = store(json!({}));
    let observed = Observed {
        replicas: replicas(2),
        agents: agents(1, 1),
        ..Observed::default()
    };
    let counts = || observed_status(&store, &names(&store), &observed, &no_targets());
    let desired = desired_conditions(&store, &observed, &no_targets(), None);
    let first = next_status(
        &ProfileStoreStatus::default(),
        counts(),
        &desired,
        Some(3),
        &time(100),
    )
    .expect("a new status is written");
    assert_eq!(first.conditions.len(), 4);
    assert_eq!(
        next_status(&first, counts(), &desired, Some(3), &time(200)),
        None
    );
}

#[test]
fn a_flip_moves_its_transition_time_and_uncomputed_conditions_stay() {
    let store = store(json!({}));
    let observed = Observed {
        replicas: replicas(2),
        agents: agents(1, 1),
        ..Observed::default()
    };
    let desired = desired_conditions(&store, &observed, &no_targets(), None);
    let counts = observed_status(&store, &names(&store), &observed, &no_targets());
    let first = next_status(
        &ProfileStoreStatus::default(),
        counts.clone(),
        &desired,
        Some(3),
        &time(100),
    )
    .expect("written");
    let paused = next_status(
        &first,
        keep_counts(&store),
        &paused_conditions(),
        Some(3),
        &time(200),
    )
    .expect("written");
    let by_type = |status: &ProfileStoreStatus, type_: &str| -> Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .cloned()
            .expect("present")
    };
    assert_eq!(by_type(&paused, RECONCILED).reason, "Paused");
    assert_eq!(by_type(&paused, RECONCILED).last_transition_time, time(200));
    // Not computed while paused: kept as they were, transition times included.
    assert_eq!(by_type(&paused, AVAILABLE), by_type(&first, AVAILABLE));
    assert_eq!(
        by_type(&paused, AGENTS_READY),
        by_type(&first, AGENTS_READY)
    );
}
