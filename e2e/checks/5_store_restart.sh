# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Check 5: profiles the store acknowledged before its pod is deleted are there when the
# StatefulSet has brought it back on the same PersistentVolume.

check_store_restart() {
  log "check 5: deleting the store pod loses no acknowledged profile"
  local matchers="{namespace=\"$workload_ns\",pod=\"$annotated_pod\"}"
  local from to before after old_uid
  from="$(date -d '-30 min' +%s)"
  # Up to a window ago, so no profile of this range is still on its way.
  to=$(( $(date +%s) - agent_window_seconds ))
  before="$(samples "$matchers" "$from" "$to")"
  [ "$before" -gt 0 ] || fail "nothing of $annotated_pod stored before the restart"
  note "before: $before samples of $annotated_pod up to $(date -d "@$to" -u +%T)"
  note "claim: $(kubectl -n "$system_ns" get pvc "data-$store_name-0" -o jsonpath='{.spec.volumeName} {.status.phase}')"

  old_uid="$(kubectl -n "$system_ns" get pod "$store_name-0" -o jsonpath='{.metadata.uid}')"
  stop_forward
  kubectl -n "$system_ns" delete pod "$store_name-0" --wait=true --timeout=120s >/dev/null
  retry 180 2 store_pod_replaced "$old_uid" || fail "the store pod did not come back"
  forward_store
  after="$(samples "$matchers" "$from" "$to")"
  note "after: $after samples of $annotated_pod in the same range"
  [ "$after" -ge "$before" ] \
    || fail "the store lost profiles across the restart: $before samples before, $after after"
  folded "$matchers" "$from" | grep -q kiln_e2e_hot_loop \
    || fail "the hot function is gone from the stored stacks after the restart"
}
