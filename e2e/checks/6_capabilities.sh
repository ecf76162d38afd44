# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Check 6: spec.agent.securityMode: capabilities runs the agents unprivileged with exactly the
# capabilities the operator renders, and they still profile.

# The capability numbers of linux/capability.h for the names the operator renders.
capability_bit() {
  case "$1" in
    DAC_READ_SEARCH) echo 2 ;;
    SYS_PTRACE) echo 19 ;;
    SYS_RESOURCE) echo 24 ;;
    PERFMON) echo 38 ;;
    BPF) echo 39 ;;
    CHECKPOINT_RESTORE) echo 40 ;;
    *) return 1 ;;
  esac
}

agents_in_capabilities_mode() {
  kubectl -n "$system_ns" get daemonset "$store_name-agent" -o json \
    | jq -e '.spec.template.spec.containers[0].securityContext.privileged == false' >/dev/null
}

# The agent's effective capabilities as the kernel sees them, read from the host's /proc
# (agents run in the host PID namespace) when the node is this machine.
check_runtime_capabilities() {
  local agent_pod="$1" expected_mask="$2" container_id pid status
  container_id="$(kubectl -n "$system_ns" get pod "$agent_pod" -o jsonpath='{.status.containerStatuses[0].containerID}')"
  container_id="${container_id#containerd://}"
  if ! command -v ctr >/dev/null 2>&1 || [ ! -S /run/containerd/containerd.sock ]; then
    note "no local containerd: the kernel's view of the agent's capabilities is not checked"
    return
  fi
  pid="$(ctr --address /run/containerd/containerd.sock -n k8s.io tasks list 2>/dev/null \
    | awk -v id="$container_id" '$1 == id { print $2 }')"
  if [ -z "$pid" ]; then
    note "the agent's container is not on this machine's containerd: runtime capabilities not checked"
    return
  fi
  status="/proc/$pid/status"
  local effective bounding no_new_privs seccomp
  effective="$(awk '/^CapEff:/ { print $2 }' "$status")"
  bounding="$(awk '/^CapBnd:/ { print $2 }' "$status")"
  no_new_privs="$(awk '/^NoNewPrivs:/ { print $2 }' "$status")"
  seccomp="$(awk '/^Seccomp:/ { print $2 }' "$status")"
  note "agent pid $pid: CapEff=$effective CapBnd=$bounding NoNewPrivs=$no_new_privs Seccomp=$seccomp"
  [ $((16#$effective)) -eq "$expected_mask" ] \
    || fail "the agent's effective capabilities are $effective, not the rendered set ($(printf '%016x' "$expected_mask"))"
  [ $((16#$bounding)) -eq "$expected_mask" ] \
    || fail "the agent's bounding set is $bounding, not the rendered set ($(printf '%016x' "$expected_mask"))"
  [ "$no_new_privs" = 1 ] || fail "allowPrivilegeEscalation: false did not set no_new_privs"
  [ "$seccomp" = 2 ] || fail "the agent runs without the RuntimeDefault seccomp filter (Seccomp: $seccomp)"
}

check_capabilities() {
  log "check 6: agents in capabilities mode run unprivileged and still profile"
  patch_store '{"spec":{"agent":{"securityMode":"capabilities"}}}'
  retry 120 2 agents_in_capabilities_mode || fail "the operator did not render the capabilities mode"
  kubectl -n "$system_ns" rollout status "daemonset/$store_name-agent" --timeout=180s >/dev/null \
    || fail "the agents did not roll out in capabilities mode"
  local rolled_at agent_pod context
  rolled_at="$(date +%s)"
  agent_pod="$(kubectl -n "$system_ns" get pods -l "app.kubernetes.io/instance=$store_name,app.kubernetes.io/component=agent" -o json \
    | jq -r '[.items[] | select(.metadata.deletionTimestamp == null)][0].metadata.name')"
  context="$(kubectl -n "$system_ns" get pod "$agent_pod" -o json | jq -c '.spec.containers[0].securityContext')"
  note "$agent_pod securityContext: $context"
  jq -e '.privileged == false and .allowPrivilegeEscalation == false
         and .capabilities.drop == ["ALL"]
         and (.capabilities.add | sort) == (["BPF","CHECKPOINT_RESTORE","DAC_READ_SEARCH","PERFMON","SYS_PTRACE"])' \
    <<<"$context" >/dev/null || fail "the agent pod's security context is not the capabilities mode's"

  local mask=0 capability bit
  for capability in $(jq -r '.capabilities.add[]' <<<"$context"); do
    bit="$(capability_bit "$capability")" || fail "unknown capability $capability"
    mask=$((mask | (1 << bit)))
  done
  check_runtime_capabilities "$agent_pod" "$mask"

  local began=$SECONDS
  retry 180 5 has_profile "$annotated_pod" "$rolled_at" \
    || fail "no profile of $annotated_pod from the capabilities-mode agents within 3 minutes"
  local matchers="{namespace=\"$workload_ns\",pod=\"$annotated_pod\"}"
  note "capabilities-mode agents profiled $annotated_pod: $(samples "$matchers" "$rolled_at") samples, first after $((SECONDS - began)) s"
  folded "$matchers" "$rolled_at" | grep -q kiln_e2e_hot_loop \
    || fail "the capabilities-mode agents' stacks miss kiln_e2e_hot_loop"
  # Long enough for the agents' liveness probe (30 s delay, every 30 s) to have run twice.
  local probed_by=$((rolled_at + 65))
  [ "$(date +%s)" -ge "$probed_by" ] || sleep $((probed_by - $(date +%s)))
  pods_started_as_rendered
}
