# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Check 9: deleting the ProfileStore completes (finalizers included) and the garbage collector
# removes everything the operator made for it. The data claim stays, as every StatefulSet's
# does: it is not owned by the store, and deleting data is the user's call.

# leftovers: the objects still labelled as this store's, one "kind/name" per line.
leftovers() {
  {
    kubectl -n "$system_ns" get statefulsets,daemonsets,services,configmaps,serviceaccounts,secrets,networkpolicies,pods \
      -l "kiln.dev/store=$store_name" -o name
    kubectl -n "$system_ns" get configmaps,secrets -o name \
      | grep -E "^(configmap|secret)/$store_name-(config|targets|tokens)$" || true
    kubectl get clusterrolebindings -l "kiln.dev/store=$store_name,kiln.dev/store-namespace=$system_ns" -o name
  } 2>/dev/null | sort -u
}

target_reports_store_missing() {
  [ "$(kubectl -n "$workload_ns" get profilingtarget hot-loops \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}')" = StoreNotFound ]
}

nothing_left() {
  [ -z "$(leftovers)" ]
}

check_deletion() {
  log "check 9: deleting the ProfileStore leaves nothing it owned behind"
  stop_forward
  note "finalizers before the delete: $(kubectl -n "$system_ns" get profilestore "$store_name" -o jsonpath='{.metadata.finalizers}')"
  note "owned before the delete: $(leftovers | tr '\n' ' ')"
  local began=$SECONDS
  kubectl -n "$system_ns" delete profilestore "$store_name" --wait=true --timeout=120s >/dev/null \
    || fail "the ProfileStore was not deleted within 2 minutes (finalizers: $(kubectl -n "$system_ns" get profilestore "$store_name" -o jsonpath='{.metadata.finalizers}' 2>&1))"
  note "ProfileStore gone after $((SECONDS - began)) s"
  retry 180 3 nothing_left || fail "left behind after the store was deleted: $(leftovers | tr '\n' ' ')"
  note "every owned object is gone after $((SECONDS - began)) s"
  local claim
  claim="$(kubectl -n "$system_ns" get pvc "data-$store_name-0" -o json 2>/dev/null || true)"
  if [ -n "$claim" ]; then
    jq -e '(.metadata.ownerReferences // []) | all(.kind != "ProfileStore")' <<<"$claim" >/dev/null \
      || fail "the data claim is owned by the store, yet was not deleted"
    note "the data claim data-$store_name-0 stays, as documented (the suite deletes it)"
  fi
  retry 60 2 target_reports_store_missing \
    || fail "ProfilingTarget hot-loops still says: $(condition profilingtarget/hot-loops "$workload_ns" Ready)"
  note "ProfilingTarget after its store went: $(condition profilingtarget/hot-loops "$workload_ns" Ready)"
  check_operator_was_never_forbidden
}

# The operator runs with exactly config/'s RBAC: a missing permission shows up as a 403 in its log.
check_operator_was_never_forbidden() {
  local forbidden
  # 403 as a number of its own: a log line's timestamp (21:01:51.264403Z) holds it as digits.
  forbidden="$(kubectl -n "$system_ns" logs deploy/kiln-operator 2>&1 \
    | grep -iE 'forbidden|(^|[^0-9.])403([^0-9]|$)' | head -5 || true)"
  [ -z "$forbidden" ] || fail "the operator was refused by the API server: $forbidden"
  note "the operator's log has no 403 (RBAC from config/ covers everything it did)"
}
