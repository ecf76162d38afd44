# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Check 4: a new spec.retention reaches the running store. The operator passes it as the
# store's --retention flag, so the StatefulSet rolls; the store reports the retention in
# effect on /metrics (kiln_retention_seconds).

retention_seconds() {
  curl -fsS "$store_url/metrics" | sed -n 's/^kiln_retention_seconds \([0-9]*\)$/\1/p'
}

# store_args_have TEXT: whether the StatefulSet's store container has an argument TEXT.
store_args_have() {
  kubectl -n "$system_ns" get statefulset "$store_name" -o json \
    | jq -e --arg arg "$1" '.spec.template.spec.containers[0].args | index($arg) != null' >/dev/null
}

check_retention() {
  log "check 4: changing spec.retention changes the store's retention"
  local before after old_pod_uid
  before="$(retention_seconds)"
  note "before: spec.retention.duration=$(kubectl -n "$system_ns" get profilestore "$store_name" -o jsonpath='{.spec.retention.duration}'), store kiln_retention_seconds=$before"
  [ "$before" = $((168 * 3600)) ] || fail "the store runs with retention ${before:-unknown} s, not the sample's 168h"
  old_pod_uid="$(kubectl -n "$system_ns" get pod "$store_name-0" -o jsonpath='{.metadata.uid}')"

  patch_store '{"spec":{"retention":{"duration":"72h"}}}'
  retry 120 2 store_args_have "--retention=72h" \
    || fail "the operator did not pass --retention=72h to the store"
  note "StatefulSet args: $(kubectl -n "$system_ns" get statefulset "$store_name" -o jsonpath='{.spec.template.spec.containers[0].args}')"
  retry 180 2 store_pod_replaced "$old_pod_uid" || fail "the store pod was not rolled"
  forward_store
  after="$(retention_seconds)"
  note "after: kiln_retention_seconds=$after"
  [ "$after" = $((72 * 3600)) ] || fail "the store reports retention ${after:-unknown} s after the change to 72h"
  kubectl -n "$system_ns" wait --for=condition=Available "profilestore/$store_name" --timeout=120s >/dev/null \
    || fail "the store is not Available after the retention change"
}

# store_pod_replaced UID: whether store pod 0 is a new pod (not UID) and Ready.
store_pod_replaced() {
  local uid ready
  uid="$(kubectl -n "$system_ns" get pod "$store_name-0" -o jsonpath='{.metadata.uid}' 2>/dev/null)" || return 1
  ready="$(kubectl -n "$system_ns" get pod "$store_name-0" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)"
  [ -n "$uid" ] && [ "$uid" != "$1" ] && [ "$ready" = True ]
}
