//! Which store runs the agents. One agent per node ships to one store: when several stores
//! enable agents, the oldest one that is not being deleted owns them, and the others report it.

use kube::Resource;

use crate::api::ProfileStore;
use crate::resources::StoreNames;

/// The store whose agents run, as `namespace/name`: among stores with agents enabled that are not
/// being deleted, the oldest (then by namespace and name), so the choice is stable.
pub fn agent_owner(stores: &[ProfileStore]) -> Option<String> {
    stores
        .iter()
        .filter(|store| store.spec.agent.enabled && store.meta().deletion_timestamp.is_none())
        .map(|store| {
            let created = store
                .meta()
                .creation_timestamp
                .as_ref()
                .map(|time| time.0.as_second())
                .unwrap_or(i64::MAX);
            let namespace = store.meta().namespace.clone().unwrap_or_default();
            let name = store.meta().name.clone().unwrap_or_default();
            (created, namespace, name)
        })
        .min()
        .map(|(_, namespace, name)| format!("{namespace}/{name}"))
}

/// The other store, as `namespace/name`, whose agents run instead of this store's; `None` when
/// this store runs its own or has agents disabled.
pub fn agents_owned_elsewhere(
    store: &ProfileStore,
    names: &StoreNames,
    stores: &[ProfileStore],
) -> Option<String> {
    if !store.spec.agent.enabled {
        return None;
    }
    agent_owner(stores).filter(|owner| *owner != format!("{}/{}", names.namespace, names.store))
}

/// True when the store's status says another store's agents cover the nodes.
pub fn reports_agents_elsewhere(store: &ProfileStore) -> bool {
    store
        .status
        .as_ref()
        .map(|status| status.conditions.iter())
        .into_iter()
        .flatten()
        .any(|condition| condition.reason == super::store::AGENTS_OWNED_ELSEWHERE)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::status::fixtures::profile_store;

    fn store(name: &str, created: &str, spec: Value) -> ProfileStore {
        profile_store(
            name,
            json!({"creationTimestamp": created}),
            spec,
            Value::Null,
        )
    }

    #[test]
    fn the_oldest_enabled_store_not_being_deleted_owns_the_agents() {
        let a = store("a", "2026-03-01T00:00:00Z", json!({}));
        let mut b = store("b", "2026-02-01T00:00:00Z", json!({}));
        let disabled = store(
            "c",
            "2026-01-01T00:00:00Z",
            json!({"agent": {"enabled": false}}),
        );
        let stores = vec![a.clone(), b.clone(), disabled];
        assert_eq!(agent_owner(&stores).as_deref(), Some("kiln/b"));
        b.metadata.deletion_timestamp = a.metadata.creation_timestamp.clone();
        assert_eq!(agent_owner(&[a, b]).as_deref(), Some("kiln/a"));
        assert_eq!(agent_owner(&[]), None);
    }

    #[test]
    fn equal_ages_are_ordered_by_namespace_then_name() {
        let same = "2026-03-01T00:00:00Z";
        let stores = vec![store("z", same, json!({})), store("m", same, json!({}))];
        assert_eq!(agent_owner(&stores).as_deref(), Some("kiln/m"));
    }

    #[test]
    fn only_a_store_with_agents_that_is_not_the_owner_defers() {
        let older = store("older", "2026-01-01T00:00:00Z", json!({}));
        let newer = store("newer", "2026-02-01T00:00:00Z", json!({}));
        let without = store(
            "without",
            "2026-03-01T00:00:00Z",
            json!({"agent": {"enabled": false}}),
        );
        let stores = vec![older.clone(), newer.clone(), without.clone()];
        let names = |s: &ProfileStore| StoreNames::of(s).expect("names");
        assert_eq!(
            agents_owned_elsewhere(&newer, &names(&newer), &stores).as_deref(),
            Some("kiln/older")
        );
        assert_eq!(
            agents_owned_elsewhere(&older, &names(&older), &stores),
            None
        );
        assert_eq!(
            agents_owned_elsewhere(&without, &names(&without), &stores),
            None
        );
    }

    #[test]
    fn a_store_reports_agents_elsewhere_by_its_condition_reason() {
        let mut deferring = store("b", "2026-02-01T00:00:00Z", json!({}));
        assert!(!reports_agents_elsewhere(&deferring));
        deferring.status = Some(
            serde_json::from_value(json!({"conditions": [{
                "type": "AgentsReady", "status": "False", "reason": "AgentsOwnedByOtherStore",
                "message": "", "lastTransitionTime": "2026-02-01T00:00:00Z"
            }]}))
            .expect("a valid status"),
        );
        assert!(reports_agents_elsewhere(&deferring));
    }
}
