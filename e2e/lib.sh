# shellcheck shell=bash
# shellcheck disable=SC2034,SC2154 # a sourced file: it uses and sets variables shared with e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Shared helpers of the end-to-end suite (sourced by e2e/run.sh and e2e/checks/*.sh).
# Everything the checks share lives in these variables:
#   repo, e2e_dir, work_dir      the checkout, e2e/, and this run's scratch directory
#   system_ns, store_name        where the ProfileStore lives (kiln-system/kiln, as config/ says)
#   replicas_store               check 8d's ProfileStore of three replicas, beside it
#   workload_ns                  the workloads' and the ProfilingTarget's namespace
#   kiln_cli                     the `kiln` binary that queries the store
#   store_url                    http://127.0.0.1:<port> of the current port-forward
#   forward_url                  the same of the port-forward open_forward opened last

log() { printf '\n== %s\n' "$*"; }
note() { printf '   %s\n' "$*"; }

# Prints what the cluster looks like, then stops the suite with $*.
fail() {
  printf '\nFAIL: %s\n' "$*" >&2
  diagnose >&2 || true
  exit 1
}

diagnose() {
  printf '\n-- diagnostics --\n'
  # A Pending pod is most often a tainted node (disk or memory pressure).
  kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}: taints={.spec.taints} conditions={range .status.conditions[?(@.status=="True")]}{.type} {end}{"\n"}{end}' 2>&1 || true
  df -h / /var/lib 2>&1 || true
  kubectl -n "$system_ns" logs deploy/kiln-operator --tail=80 2>&1 || true
  kubectl get profilestores,profilingtargets -A -o wide 2>&1 || true
  kubectl -n "$system_ns" get statefulsets,daemonsets,services,configmaps,pvc,pods -o wide 2>&1 || true
  kubectl -n "$workload_ns" get deployments,pods -o wide 2>&1 || true
  kubectl get pv 2>&1 || true
  local ns
  for ns in "$system_ns" "$workload_ns"; do
    kubectl -n "$ns" get events --sort-by=.lastTimestamp 2>&1 | tail -25 || true
  done
  local pod
  # The suite's store, and check 8d's replicated one when it runs.
  for pod in $(kubectl -n "$system_ns" get pods -l "app.kubernetes.io/instance in ($store_name,$replicas_store)" \
      -o name 2>/dev/null); do
    kubectl -n "$system_ns" describe "$pod" 2>&1 | tail -40 || true
    kubectl -n "$system_ns" logs "$pod" --tail=40 --all-containers 2>&1 || true
    kubectl -n "$system_ns" logs "$pod" --tail=20 --all-containers --previous 2>/dev/null || true
  done
}

# Loud skip: without a cluster the suite proves nothing, so CI must fail rather than pass.
skip_or_fail() {
  printf '\n%s\n' '************************************************************'
  printf 'SKIP: %s\n' "$*"
  printf '%s\n' 'No end-to-end check ran: nothing about Kubernetes was tested.'
  printf '%s\n\n' '************************************************************'
  if [ -n "${CI:-}" ]; then
    echo "CI is set: a suite that cannot run fails" >&2
    exit 1
  fi
  exit 0
}

# retry SECONDS INTERVAL COMMAND...: runs COMMAND until it succeeds or SECONDS pass.
retry() {
  local deadline=$((SECONDS + $1)) interval="$2"
  shift 2
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep "$interval"
  done
}

# The store's pod is replaced by rollouts and by check 5; a port-forward dies with its pod, so
# each check that needs the store calls this after the store changed.
store_url=""
forward_store() {
  stop_forward
  kubectl -n "$system_ns" rollout status "statefulset/$store_name" --timeout=180s >/dev/null \
    || fail "the store StatefulSet did not roll out"
  kubectl -n "$system_ns" wait --for=condition=Ready "pod/$store_name-0" --timeout=180s >/dev/null \
    || fail "store pod $store_name-0 is not Ready"
  open_forward "$system_ns" "svc/$store_name" "$store_port"
  store_url="$forward_url"
  export KILN_STORE="$store_url"
  retry 60 1 curl -fsS -o /dev/null "$store_url/readyz" \
    || fail "the store's /readyz did not answer 200 through the port-forward"
  note "port-forward to svc/$store_name: $store_url"
}

# open_forward NAMESPACE TARGET PORT: starts `kubectl port-forward TARGET` to PORT (a Service
# or one pod), beside any already open, and sets forward_url and forward_pid to its
# http://127.0.0.1:<port> and process; stop_forward ends them all.
forward_pids=()
forward_url=""
forward_pid=""
open_forward() {
  local output
  output="$(mktemp "$work_dir/port-forward.XXXXXX")"
  # Port 0: kubectl picks a free local port and prints it.
  kubectl -n "$1" port-forward "$2" ":$3" >"$output" 2>&1 &
  forward_pid=$!
  forward_pids+=("$forward_pid")
  local port=""
  for _ in $(seq 1 100); do
    port="$(sed -n 's/^Forwarding from 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$output" | head -1)"
    [ -n "$port" ] && break
    kill -0 "$forward_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$output" >&2; fail "kubectl port-forward $2 did not start"; }
  forward_url="http://127.0.0.1:$port"
}

# close_forward PID: ends one port-forward of open_forward.
close_forward() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

stop_forward() {
  local pid
  for pid in "${forward_pids[@]}"; do
    close_forward "$pid"
  done
  forward_pids=()
}

# The agent's two profile types; a bare `process_cpu` matches both, which the store refuses.
cpu_type=process_cpu:cpu
samples_type=process_cpu:samples

# cpu_total MATCHERS FROM [TO]: nanoseconds of CPU the store holds for {MATCHERS} in the range.
cpu_total() {
  "$kiln_cli" query --format json --from "$2" --to "${3:-now}" "$cpu_type$1" | jq -r '.total'
}

# samples MATCHERS FROM [TO]: how many samples the store holds for {MATCHERS} in the range.
samples() {
  "$kiln_cli" query --format json --from "$2" --to "${3:-now}" "$samples_type$1" | jq -r '.total'
}

# folded MATCHERS FROM: the selection's CPU stacks as folded lines.
folded() {
  "$kiln_cli" query --format folded --from "$2" "$cpu_type$1"
}

# pods_with_profiles FROM: the pod label values of the workload namespace's profiles since FROM.
pods_with_profiles() {
  "$kiln_cli" labels pod --from "$1" --query "{namespace=\"$workload_ns\"}"
}

# has_profile POD FROM: whether the store holds CPU for POD since FROM. Polled, so the store's
# "no profile type matches" before the first profile arrives is not printed.
has_profile() {
  local total
  total="$(cpu_total "{namespace=\"$workload_ns\",pod=\"$1\"}" "$2" 2>/dev/null)" || return 1
  [ "${total:-0}" -gt 0 ]
}

# pod_of WORKLOAD: the name of the running pod of deployment WORKLOAD.
pod_of() {
  kubectl -n "$workload_ns" get pods -l "kiln-e2e/workload=$1" \
    --field-selector=status.phase=Running -o jsonpath='{.items[0].metadata.name}'
}

# condition KIND/NAME NAMESPACE TYPE: "status reason message" of one status condition.
condition() {
  kubectl -n "$2" get "$1" -o jsonpath="{.status.conditions[?(@.type==\"$3\")].status} {.status.conditions[?(@.type==\"$3\")].reason}: {.status.conditions[?(@.type==\"$3\")].message}"
}

# A store patch as a user would type it.
patch_store() {
  kubectl -n "$system_ns" patch profilestore "$store_name" --type=merge -p "$1" >/dev/null
}

# When each agent window has been drained and shipped: the agent's --drain-interval.
agent_window_seconds=10
