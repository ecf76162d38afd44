//! The NetworkPolicy that keeps other pods away from a store exists exactly while
//! `spec.networkPolicy.enabled`.

use kiln_operator::controller::store;
use serde_json::json;

use super::{STORE_PATH, current_store, setup, store_json};

const POLICY_PATH: &str = "/apis/networking.k8s.io/v1/namespaces/kiln/networkpolicies/main";

#[tokio::test]
async fn network_policy_follows_the_spec() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert!(fake.get(POLICY_PATH).is_none(), "off by default");

    let mut edited = fake.get(STORE_PATH).unwrap();
    edited["spec"]["networkPolicy"] = json!({"enabled": true});
    fake.put(STORE_PATH, edited.clone());
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let policy = fake.get(POLICY_PATH).expect("policy applied");
    assert_eq!(policy["metadata"]["ownerReferences"][0]["uid"], "uid-main");
    assert_eq!(
        policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
        "agent"
    );

    edited["spec"]["networkPolicy"] = json!({"enabled": false});
    fake.put(STORE_PATH, edited);
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert!(fake.get(POLICY_PATH).is_none(), "deleted when disabled");
}
