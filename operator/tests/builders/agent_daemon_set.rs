//! The agents' DaemonSet: security modes, host access, flags and tolerations.

use super::*;

#[test]
fn privileged_mode_runs_privileged_as_root() {
    let object = profile_store(serde_json::json!({}));
    let context = agent_container(&object).security_context.unwrap();
    assert_eq!(context.privileged, Some(true));
    assert_eq!(context.run_as_user, Some(0));
    assert!(context.capabilities.is_none());
}

#[test]
fn capabilities_mode_adds_only_the_ebpf_set_and_drops_the_rest() {
    let object = profile_store(serde_json::json!({"agent": {"securityMode": "capabilities"}}));
    let context = agent_container(&object).security_context.unwrap();
    assert_eq!(context.privileged, Some(false));
    assert_eq!(context.allow_privilege_escalation, Some(false));
    let capabilities = context.capabilities.unwrap();
    assert_eq!(
        capabilities.add.unwrap(),
        vec![
            "BPF",
            "PERFMON",
            "SYS_PTRACE",
            "CHECKPOINT_RESTORE",
            "DAC_READ_SEARCH"
        ]
    );
    assert_eq!(capabilities.drop.unwrap(), vec!["ALL"]);
    assert_eq!(context.seccomp_profile.unwrap().type_, "RuntimeDefault");
}

#[test]
fn agent_uses_host_pid_and_mounts_what_ebpf_needs() {
    let object = profile_store(serde_json::json!({}));
    let pod = pod_spec_of_daemon_set(&object);
    assert_eq!(pod.host_pid, Some(true));
    assert_eq!(pod.service_account_name.as_deref(), Some("main-agent"));
    let volumes: BTreeMap<String, String> = pod
        .volumes
        .unwrap()
        .into_iter()
        .filter_map(|v| Some((v.name, v.host_path?.path)))
        .collect();
    for (name, path) in [
        ("cgroup", "/sys/fs/cgroup"),
        ("cri-socket", "/run/containerd/containerd.sock"),
    ] {
        assert_eq!(volumes.get(name).map(String::as_str), Some(path), "{name}");
    }
    // Unused by the agent, so not granted: each needless mount brings capabilities mode closer
    // to root on the node. Not /lib/modules either: the agent
    // never reads it, and a `Directory` hostPath missing on the node (as on this machine's
    // kernel without modules) keeps every agent pod from starting.
    assert_eq!(volumes.len(), 2, "only these host paths: {volumes:?}");
    assert_eq!(pod.automount_service_account_token, Some(false));
    let container = pod.containers[0].clone();
    let mounts: BTreeMap<String, (String, Option<bool>)> = container
        .volume_mounts
        .unwrap()
        .into_iter()
        .map(|m| (m.name, (m.mount_path, m.read_only)))
        .collect();
    assert_eq!(mounts["cgroup"], ("/sys/fs/cgroup".to_owned(), Some(true)));
    assert_eq!(
        mounts["targets"],
        ("/etc/kiln/targets".to_owned(), Some(true))
    );
    assert!(
        mounts
            .values()
            .filter(|(path, _)| path.starts_with("/sys") || path.starts_with("/lib"))
            .all(|(_, ro)| *ro == Some(true))
    );
    let probe = container.liveness_probe.expect("a liveness probe");
    let get = probe.http_get.expect("over HTTP");
    assert_eq!(get.path.as_deref(), Some("/healthz"));
    let port = &container.ports.expect("ports")[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("metrics"), 7471)
    );
}

#[test]
fn agent_flags_point_at_the_store_socket_and_targets_file() {
    let object = profile_store(serde_json::json!({
        "servicePort": 9000,
        "agent": {"containerRuntimeSocket": "/var/run/crio/crio.sock"}
    }));
    let args = agent_container(&object).args.unwrap();
    assert_eq!(
        args,
        vec![
            "--cri-socket=/var/run/crio/crio.sock",
            "--targets-file=/etc/kiln/targets/targets.json",
            "--store=http://main.kiln.svc:9000",
            "--node-name=$(NODE_NAME)",
            "--metrics-addr=0.0.0.0:7471",
        ]
    );
    let volumes = pod_spec_of_daemon_set(&object).volumes.unwrap();
    let socket = volumes.iter().find(|v| v.name == "cri-socket").unwrap();
    let host_path = socket.host_path.as_ref().unwrap();
    assert_eq!(host_path.path, "/var/run/crio/crio.sock");
    assert_eq!(host_path.type_.as_deref(), Some("Socket"));
}

#[test]
fn agent_tolerates_everything_by_default_and_takes_overrides() {
    let object = profile_store(serde_json::json!({}));
    let pod = pod_spec_of_daemon_set(&object);
    assert_eq!(
        pod.tolerations.unwrap(),
        vec![Toleration {
            operator: Some("Exists".to_owned()),
            ..Toleration::default()
        }]
    );
    assert_eq!(
        pod.node_selector
            .unwrap()
            .get("kubernetes.io/os")
            .map(String::as_str),
        Some("linux")
    );
    assert_eq!(pod.priority_class_name, None);

    let custom = profile_store(serde_json::json!({"agent": {
        "tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "apps"},
        "priorityClassName": "system-node-critical"
    }}));
    let pod = pod_spec_of_daemon_set(&custom);
    let tolerations = pod.tolerations.unwrap();
    assert_eq!(tolerations.len(), 1);
    assert_eq!(tolerations[0].key.as_deref(), Some("gpu"));
    assert_eq!(
        pod.node_selector.unwrap(),
        BTreeMap::from([("pool".to_owned(), "apps".to_owned())])
    );
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
}

#[test]
fn off_cpu_is_an_agent_flag_only_when_the_store_asks() {
    let plain = profile_store(serde_json::json!({}));
    let names = StoreNames::of(&plain).unwrap();
    let args = kiln_operator::resources::agent::agent_args(&plain, &names).unwrap();
    assert!(!args.iter().any(|a| a.starts_with("--off-cpu")), "{args:?}");
    let asked = profile_store(serde_json::json!({"agent": {"offCpu": true}}));
    let args = kiln_operator::resources::agent::agent_args(&asked, &names).unwrap();
    assert!(args.contains(&"--off-cpu".to_owned()), "{args:?}");
}
