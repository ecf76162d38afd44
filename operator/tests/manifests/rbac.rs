//! RBAC: the operator's role covers every call it makes, grants no wildcard
//! and no cluster-wide write on core or apps resources, and the chart's
//! rules are config/'s.

use super::*;

/// Every (apiGroup, resource, verb) the operator's code uses.
const REQUIRED_PERMISSIONS: [(&str, &str, &str); 32] = [
    ("kiln.dev", "profilestores", "get"),
    ("kiln.dev", "profilestores", "list"),
    ("kiln.dev", "profilestores", "watch"),
    ("kiln.dev", "profilestores", "patch"),
    ("kiln.dev", "profilestores/status", "patch"),
    ("kiln.dev", "profilestores/finalizers", "update"),
    ("kiln.dev", "profilingtargets", "list"),
    ("kiln.dev", "profilingtargets", "watch"),
    ("kiln.dev", "profilingtargets/status", "patch"),
    ("apps", "statefulsets", "get"),
    ("apps", "statefulsets", "watch"),
    ("apps", "statefulsets", "patch"),
    ("apps", "statefulsets", "delete"),
    ("apps", "daemonsets", "patch"),
    ("apps", "daemonsets", "delete"),
    ("apps", "daemonsets", "watch"),
    ("", "services", "patch"),
    ("", "configmaps", "patch"),
    ("", "configmaps", "delete"),
    ("", "serviceaccounts", "patch"),
    ("", "persistentvolumeclaims", "list"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "persistentvolumeclaims", "patch"),
    ("", "secrets", "get"),
    ("", "secrets", "create"),
    ("networking.k8s.io", "networkpolicies", "get"),
    ("networking.k8s.io", "networkpolicies", "patch"),
    ("networking.k8s.io", "networkpolicies", "delete"),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "delete"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
];

fn grants(role: &Value, group: &str, resource: &str, verb: &str) -> bool {
    role["rules"].as_array().into_iter().flatten().any(|rule| {
        let has = |field: &str, wanted: &str| {
            rule[field]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v == wanted || v == "*")
        };
        has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
    })
}

#[test]
fn operator_role_covers_every_call_and_grants_no_wildcards() {
    let role =
        &kustomize::load_documents(&repo_root().join("config/rbac/role.yaml")).expect("role")[0];
    let store_role = &kustomize::load_documents(&repo_root().join("config/rbac/store_role.yaml"))
        .expect("store role")[0];
    assert_eq!(store_role["kind"], "Role", "store writes are namespaced");
    for (group, resource, verb) in REQUIRED_PERMISSIONS {
        assert!(
            grants(role, group, resource, verb) || grants(store_role, group, resource, verb),
            "missing {verb} on {group}/{resource}"
        );
    }
    assert!(
        !role.to_string().contains("\"*\""),
        "wildcards in the operator role"
    );
    // Secrets only where stores live, and only to create each store's tokens once.
    for verb in [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ] {
        assert!(
            !grants(role, "", "secrets", verb),
            "the ClusterRole may {verb} secrets"
        );
        assert_eq!(
            grants(store_role, "", "secrets", verb),
            verb == "get" || verb == "create",
            "the store Role and {verb} on secrets"
        );
    }
    // Agents need no API access, so the operator neither creates bindings nor may bind roles.
    for verb in ["create", "patch", "update", "bind", "escalate"] {
        for resource in [
            "clusterrolebindings",
            "clusterroles",
            "rolebindings",
            "roles",
        ] {
            assert!(
                !grants(role, "rbac.authorization.k8s.io", resource, verb),
                "the operator may {verb} {resource}"
            );
        }
    }
}

/// Every rule of every RBAC object in `config/` and the chart's template, as
/// (kind, rule) pairs.
fn rbac_rules() -> Vec<(String, String, Value)> {
    let mut rules = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("config/rbac"))
        .expect("config/rbac")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for path in files {
        for object in kustomize::load_documents(&path).expect("YAML") {
            let kind = object["kind"].as_str().unwrap_or("").to_owned();
            for rule in object["rules"].as_array().into_iter().flatten() {
                rules.push((path.display().to_string(), kind.clone(), rule.clone()));
            }
        }
    }
    // The chart template: split into documents and drop template lines, which never
    // hold rules.
    let chart = std::fs::read_to_string(repo_root().join("charts/kiln/templates/rbac.yaml"))
        .expect("chart rbac template");
    for document in chart.split("\n---\n") {
        let plain: String = document
            .lines()
            .filter(|l| !l.contains("{{"))
            .collect::<Vec<_>>()
            .join("\n");
        let Ok(object) = serde_yaml::from_str::<Value>(&plain) else {
            continue;
        };
        let kind = object["kind"].as_str().unwrap_or("").to_owned();
        for rule in object["rules"].as_array().into_iter().flatten() {
            rules.push(("chart".to_owned(), kind.clone(), rule.clone()));
        }
    }
    rules
}

#[test]
fn no_cluster_wide_write_on_core_or_apps_resources() {
    let rules = rbac_rules();
    assert!(rules.len() > 10, "rules were read: {}", rules.len());
    let writes = [
        "create",
        "patch",
        "update",
        "delete",
        "deletecollection",
        "*",
    ];
    for (file, kind, rule) in &rules {
        if kind != "ClusterRole" {
            continue;
        }
        let groups = rule["apiGroups"].to_string();
        let core_or_apps = groups.contains("\"\"") || groups.contains("\"apps\"");
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            !core_or_apps || !verbs.iter().any(|v| writes.contains(v)),
            "{file}: a ClusterRole writes core/apps resources: {rule}"
        );
    }
    assert!(
        rules.iter().any(|(_, kind, _)| kind == "Role"),
        "writes come from namespaced Roles"
    );
}

#[test]
fn chart_rbac_matches_config_rbac() {
    let chart_rbac = std::fs::read_to_string(repo_root().join("charts/kiln/templates/rbac.yaml"))
        .expect("chart rbac template");
    let config_role =
        std::fs::read_to_string(repo_root().join("config/rbac/role.yaml")).expect("role");
    let rules = config_role
        .split_once("rules:\n")
        .expect("role has rules")
        .1;
    assert!(
        chart_rbac.contains(rules),
        "charts/kiln/templates/rbac.yaml must repeat config/rbac/role.yaml's rules verbatim"
    );
    let store_role =
        std::fs::read_to_string(repo_root().join("config/rbac/store_role.yaml")).expect("role");
    let store_rules = store_role
        .split_once("rules:\n")
        .expect("store role has rules")
        .1;
    assert!(
        chart_rbac.contains(store_rules),
        "charts/kiln/templates/rbac.yaml must repeat config/rbac/store_role.yaml's rules verbatim"
    );
}
