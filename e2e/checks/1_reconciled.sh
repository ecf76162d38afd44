# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Check 1: a ProfileStore and a ProfilingTarget become a running store and agents, and their
# status conditions say so.

# exists KIND NAME: fails unless the store's namespace holds KIND/NAME.
expect_child() {
  kubectl -n "$system_ns" get "$1" "$2" >/dev/null 2>&1 || fail "the operator created no $1 $2"
  note "$1/$2 created"
}

check_reconciled() {
  log "check 1: the operator turns a ProfileStore and a ProfilingTarget into running pods"
  kubectl apply -f "$repo/config/samples/kiln_v1alpha1_profilestore.yaml"
  kubectl apply -f "$e2e_dir/manifests/workloads.yaml"

  kubectl -n "$system_ns" wait --for=condition=Available "profilestore/$store_name" --timeout=300s \
    || fail "ProfileStore $store_name is not Available"
  kubectl -n "$system_ns" wait --for=condition=AgentsReady "profilestore/$store_name" --timeout=300s \
    || fail "ProfileStore $store_name's agents are not ready"
  kubectl -n "$workload_ns" wait --for=condition=Ready profilingtarget/hot-loops --timeout=120s \
    || fail "ProfilingTarget hot-loops is not Ready"

  expect_child statefulset "$store_name"
  expect_child daemonset "$store_name-agent"
  expect_child service "$store_name"
  expect_child service "$store_name-headless"
  expect_child configmap "$store_name-config"
  expect_child configmap "$store_name-targets"
  kubectl -n "$system_ns" rollout status "statefulset/$store_name" --timeout=180s >/dev/null \
    || fail "the store StatefulSet did not roll out"
  kubectl -n "$system_ns" rollout status "daemonset/$store_name-agent" --timeout=180s >/dev/null \
    || fail "the agent DaemonSet did not roll out"
  kubectl -n "$system_ns" get pods -l "app.kubernetes.io/instance=$store_name" -o wide
  pods_started_as_rendered

  local type
  for type in Available AgentsReady Reconciled; do
    note "ProfileStore $type: $(condition "profilestore/$store_name" "$system_ns" "$type")"
  done
  note "ProfilingTarget Ready: $(condition profilingtarget/hot-loops "$workload_ns" Ready)"
  local status
  status="$(kubectl -n "$system_ns" get profilestore "$store_name" -o json)"
  jq -e '.status.readyReplicas == 1 and .status.agentsReady >= 1
         and .status.agentsReady == .status.agentsDesired and .status.matchedTargets >= 1
         and .status.observedGeneration == .metadata.generation' <<<"$status" >/dev/null \
    || fail "ProfileStore status does not add up: $(jq -c .status <<<"$status")"
  note "status: $(jq -c '.status | {replicas, readyReplicas, agentsDesired, agentsReady, matchedTargets, endpoint}' <<<"$status")"

  kubectl -n "$workload_ns" rollout status deployment/annotated --timeout=120s >/dev/null \
    || fail "the annotated workload did not start"
  kubectl -n "$workload_ns" rollout status deployment/plain --timeout=120s >/dev/null \
    || fail "the plain workload did not start"
}

# The store's and agents' pods run as rendered: every container ready and never restarted (so
# the probes pass, the mounts, security contexts and ports work on a real kubelet).
pods_started_as_rendered() {
  local pods
  pods="$(kubectl -n "$system_ns" get pods -l "app.kubernetes.io/instance=$store_name" -o json \
    | jq '[.items[] | select(.metadata.deletionTimestamp == null)]')"
  jq -r '.[] | "   \(.metadata.name): hostPID=\(.spec.hostPID // false) fsGroup=\(.spec.securityContext.fsGroup // "-")"
      + " volumes=\([.spec.volumes[].name] | join(","))"
      + " probes=\([.spec.containers[0] | (.readinessProbe, .livenessProbe) | select(.) | .httpGet.path] | join(","))"
      + " ready=\(.status.containerStatuses[0].ready) restarts=\(.status.containerStatuses[0].restartCount)"' <<<"$pods"
  jq -e 'length >= 2 and all(.[]; .status.containerStatuses | all(.ready and .restartCount == 0))' \
    <<<"$pods" >/dev/null || fail "a store or agent pod is not ready or restarted"
}
