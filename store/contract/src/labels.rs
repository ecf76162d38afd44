//! The names of the series labels the agent puts on the profiles it ships.
//! The store reads some of them (`namespace` scopes the per-namespace series
//! limit, `service_name` is Pyroscope's application name) and users query
//! and group by all of them, so each is spelled once, here. The labels that
//! stay on each sample (`pid`, `tid`, `comm`) are in
//! [`crate::sample_labels`].

/// The store's label for a profile's name (`process_cpu`, `memory`): every
/// series has one, and selectors' profile types start with it.
pub const PROFILE_NAME: &str = "__name__";

/// The node (host name) the agent runs on.
pub const NODE: &str = "node";
/// The pod's Kubernetes namespace; the store's tenant for its per-namespace
/// series limit.
pub const NAMESPACE: &str = "namespace";
/// The pod's name.
pub const POD: &str = "pod";
/// The pod's UID.
pub const POD_UID: &str = "pod_uid";
/// The container's name within its pod.
pub const CONTAINER: &str = "container";
/// The container runtime's id of the container.
pub const CONTAINER_ID: &str = "container_id";
/// The application a profile belongs to, as Pyroscope names it; the store
/// fills it for clients that send an application name in another form.
pub const SERVICE_NAME: &str = "service_name";
/// The runtime the process runs on (`native`, `python`, `java`, `node`).
pub const LANGUAGE: &str = "language";

/// Every series label the agent sets besides [`PROFILE_NAME`], for checks
/// that must cover them all.
pub const ALL: [&str; 8] = [
    NODE,
    NAMESPACE,
    POD,
    POD_UID,
    CONTAINER,
    CONTAINER_ID,
    SERVICE_NAME,
    LANGUAGE,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name is a valid Prometheus-style label name, as the store
    /// requires, and no two are the same.
    #[test]
    fn names_are_distinct_valid_label_names() {
        for name in ALL {
            let mut chars = name.chars();
            let first_ok = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
            assert!(
                first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{name:?}"
            );
            assert!(
                !name.starts_with("__"),
                "{name:?} is reserved for the store"
            );
        }
        assert!(!ALL.contains(&PROFILE_NAME));
        for per_sample in crate::sample_labels::PER_SAMPLE_LABELS {
            assert!(!ALL.contains(&per_sample), "{per_sample} is a sample label");
        }
        let mut sorted = ALL.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ALL.len());
    }
}
