# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Check 3: annotating a running pod profiles it without a restart; removing the annotation
# stops it. The runtime never sees annotations added later, so this goes through the
# operator's relay entries in the targets ConfigMap, which the kubelet remounts in the agents
# when the operator marks their pods with the file's revision.

# quiet_since POD: whether the store got no CPU of POD in the last two agent windows and a bit.
quiet_lately() {
  local total
  total="$(cpu_total "{namespace=\"$workload_ns\",pod=\"$1\"}" \
    "$(( $(date +%s) - 2 * agent_window_seconds - 5 ))")" || return 1
  [ "${total:-1}" -eq 0 ]
}

check_live_annotation() {
  log "check 3: annotating $plain_pod live profiles it, removing the annotation stops it"
  local restarts_before annotated_at began latency
  restarts_before="$(kubectl -n "$workload_ns" get pod "$plain_pod" -o jsonpath='{.status.containerStatuses[0].restartCount}')"
  annotated_at="$(date +%s)"
  began=$SECONDS
  kubectl -n "$workload_ns" annotate pod "$plain_pod" profiles.kiln.dev/enabled=true >/dev/null
  retry 240 2 has_profile "$plain_pod" "$annotated_at" \
    || fail "no profile of $plain_pod within 4 minutes of annotating it"
  latency=$((SECONDS - began))
  note "profile of $plain_pod appeared $latency s after the annotation ($((latency * 10 / agent_window_seconds / 10)).$((latency * 10 / agent_window_seconds % 10)) agent windows of $agent_window_seconds s)"
  if [ "$latency" -gt $((2 * agent_window_seconds)) ]; then
    note "NOTE: slower than two agent windows: the kubelet did not remount the agents' targets ConfigMap on the revision mark"
  fi
  [ "$(kubectl -n "$workload_ns" get pod "$plain_pod" -o jsonpath='{.status.containerStatuses[0].restartCount}')" = "$restarts_before" ] \
    || fail "$plain_pod restarted: the annotation must take effect live"
  kubectl -n "$system_ns" get configmap "$store_name-targets" -o json \
    | jq -e --arg pod "$plain_pod" '.data | tostring | contains($pod)' >/dev/null \
    && note "the targets ConfigMap relays $plain_pod"

  local removed_at stopped
  removed_at="$(date +%s)"
  began=$SECONDS
  kubectl -n "$workload_ns" annotate pod "$plain_pod" profiles.kiln.dev/enabled- >/dev/null
  retry 240 5 quiet_lately "$plain_pod" \
    || fail "$plain_pod is still profiled 4 minutes after its annotation was removed"
  stopped="$(date +%s)"
  note "profiling of $plain_pod stopped within $((SECONDS - began)) s of removing the annotation (no CPU in the last $((2 * agent_window_seconds + 5)) s)"
  sleep $((agent_window_seconds * 2))
  local after
  after="$(cpu_total "{namespace=\"$workload_ns\",pod=\"$plain_pod\"}" "$stopped")"
  [ "$after" -eq 0 ] || fail "$plain_pod was profiled again after it stopped ($(samples "{namespace=\"$workload_ns\",pod=\"$plain_pod\"}" "$stopped") samples)"
  note "no samples of $plain_pod in the $(( $(date +%s) - stopped )) s since (removed at $removed_at)"
}
