//! `--image-pull-policy`: the store and agent containers carry the policy the
//! operator was started with, and Kubernetes' default when none was given.

use kiln_operator::resources::{BuildDefaults, ImagePullPolicy, StoreNames, agent, store};

use super::profile_store;

fn pull_policies(defaults: &BuildDefaults) -> (Option<String>, Option<String>) {
    let object = profile_store(serde_json::json!({}));
    let names = StoreNames::of(&object).expect("store has metadata");
    let config = store::config_map(&object, &names).expect("builds");
    let set = store::stateful_set(&object, &names, &config, defaults).expect("builds");
    let store_container = set
        .spec
        .template
        .spec
        .map(|mut pod| pod.containers.remove(0))
        .expect("store container");
    let daemon_set = agent::daemon_set(&object, &names, defaults).expect("builds");
    let agent_container = daemon_set
        .spec
        .template
        .spec
        .map(|mut pod| pod.containers.remove(0))
        .expect("agent container");
    (
        store_container.image_pull_policy,
        agent_container.image_pull_policy,
    )
}

#[test]
fn containers_take_the_operators_pull_policy() {
    assert_eq!(pull_policies(&BuildDefaults::default()), (None, None));
    let never = BuildDefaults {
        image_pull_policy: Some(ImagePullPolicy::Never),
        ..BuildDefaults::default()
    };
    let expected = Some("Never".to_owned());
    assert_eq!(pull_policies(&never), (expected.clone(), expected));
}
