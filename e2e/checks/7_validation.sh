# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Check 7: the API server itself refuses bad CRs (OpenAPI enums, ranges and patterns and the
# CRD's CEL rules, transition rules included) with the messages the README lists. Server-side
# dry runs: the API server validates fully and stores nothing.

# refused WHAT EXPECTED COMMAND...: COMMAND must fail with EXPECTED in its error.
refused() {
  local what="$1" expected="$2" output
  shift 2
  if output="$("$@" 2>&1)"; then
    fail "the API server accepted $what"
  fi
  grep -qF -- "$expected" <<<"$output" \
    || fail "refusing $what, the API server said: $output (expected: $expected)"
  note "refused $what: $(grep -F -- "$expected" <<<"$output" | head -1 | cut -c1-220)"
}

# new_store SPEC_JSON: a server-side dry-run create of a ProfileStore with SPEC_JSON.
new_store() {
  kubectl apply --dry-run=server -f - <<YAML
apiVersion: kiln.dev/v1alpha1
kind: ProfileStore
metadata:
  name: e2e-invalid
  namespace: $system_ns
spec: $1
YAML
}

new_target() {
  kubectl apply --dry-run=server -f - <<YAML
apiVersion: kiln.dev/v1alpha1
kind: ProfilingTarget
metadata:
  name: e2e-invalid
  namespace: $workload_ns
spec: $1
YAML
}

edit_store() {
  kubectl -n "$system_ns" patch profilestore "$store_name" --dry-run=server --type=merge -p "$1"
}

check_validation() {
  log "check 7: the API server refuses bad CRs with the documented messages"
  new_store '{}' >/dev/null || fail "the API server refused a valid ProfileStore"
  refused "two replicas without objectStorage" \
    'replicas above 1 need objectStorage: replicas share data only through the bucket' \
    new_store '{"replicas": 2}'
  refused "replicas: 100" 'should be less than or equal to 64' new_store '{"replicas": 100}'
  refused "securityMode: root" 'Unsupported value: "root"' \
    new_store '{"agent": {"securityMode": "root"}}'
  refused "retention 0s" 'spec.retention.duration in body should match' \
    new_store '{"retention": {"duration": "0s"}}'
  refused "a CRI socket outside the known list" 'spec.agent.containerRuntimeSocket in body should match' \
    new_store '{"agent": {"containerRuntimeSocket": "/etc/shadow"}}'
  refused "an allowFrom entry without selectors" \
    'an allowFrom entry needs namespaceSelector or podSelector' \
    new_store '{"networkPolicy": {"enabled": true, "allowFrom": [{}]}}'
  refused "shrinking storage.size" 'storage.size can only grow' \
    edit_store '{"spec": {"storage": {"size": "5Gi"}}}'
  refused "switching storage.ephemeral" 'storage.ephemeral cannot change after creation' \
    edit_store '{"spec": {"storage": {"ephemeral": true}}}'
  refused "changing storage.storageClassName" 'storage.storageClassName is immutable' \
    edit_store '{"spec": {"storage": {"storageClassName": "other"}}}'
  refused "samplingHz: 5000" 'should be less than or equal to 1000' \
    new_target '{"storeRef": {"name": "kiln", "namespace": "kiln-system"}, "samplingHz": 5000}'
  refused "a 64-character label name" 'label names are at most 63 characters' \
    new_target "{\"storeRef\": {\"name\": \"kiln\"}, \"labels\": {\"$(printf 'n%.0s' $(seq 1 64))\": \"v\"}}"
  # Issue 51's spec.symbolization and issue 52's pprof.port (a number or a port name).
  refused "a debuginfod URL that is not http(s)" 'debuginfodUrls[0] in body should match' \
    new_store '{"symbolization": {"debuginfodUrls": ["ftp://debuginfod.example"]}}'
  refused "a 1Ki debug file cap" 'symbolization.maxDebugFileSize must be at least 64Ki' \
    new_store '{"symbolization": {"maxDebugFileSize": "1Ki"}}'
  new_store '{"symbolization": {"debuginfodUrls": ["https://debuginfod.debian.net"], "acceptUploads": false, "maxDebugFileSize": "1Gi", "cacheSize": "256Mi"}}' >/dev/null \
    || fail "the API server refused a valid spec.symbolization"
  refused "pprof.port: 0" 'should be greater than or equal to 1' \
    new_target '{"storeRef": {"name": "kiln"}, "pprof": {"port": 0}}'
  refused "pprof.port: Debug_Port" 'spec.pprof.port in body should match' \
    new_target '{"storeRef": {"name": "kiln"}, "pprof": {"port": "Debug_Port"}}'
  refused "pprof.port: a 16-character name" 'Too long' \
    new_target '{"storeRef": {"name": "kiln"}, "pprof": {"port": "abcdefghijklmnop"}}'
  new_target '{"storeRef": {"name": "kiln"}, "pprof": {"port": "http-debug"}}' >/dev/null \
    || fail "the API server refused pprof.port: http-debug"
  note "a valid spec.symbolization and pprof.port by name are accepted"
  edit_store '{"spec": {"storage": {"size": "20Gi"}}}' >/dev/null \
    || fail "the API server refused growing storage.size"
  note "growing storage.size is accepted"
}
