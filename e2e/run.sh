#!/usr/bin/env bash
# End-to-end test of Kiln on a real Kubernetes cluster (the one in KUBECONFIG; `./kiln-dev
# cluster up` starts one here). It follows the README's Kubernetes quickstart, command for
# command, then checks (issue 20, section 4):
#   1. ProfileStore + ProfilingTarget -> StatefulSet, DaemonSet, Services, ConfigMaps, pods
#      Ready, and status conditions that say so;
#   2. of two CPU burners (e2e/workload) only the annotated one is profiled, labelled with
#      namespace/pod/container/node, its hot function on the stacks (`kiln query` through
#      `kubectl port-forward`);
#   3. annotating the other pod live profiles it; removing the annotation stops it;
#   4. a new spec.retention reaches the store (its /metrics kiln_retention_seconds);
#   5. data acknowledged before the store pod is deleted is there after (the PersistentVolume);
#   6. spec.agent.securityMode: capabilities runs unprivileged agents that still profile;
#   7. the API server refuses bad CRs with the CRD's messages;
#   8. a JVM and a Node started without profiling flags (e2e/manifests/runtimes.yaml) have
#      their hot functions named under their callers in >= 95 % of their threads' samples;
#   8b. the annotated pod's sleeping thread shows under off_cpu with the wall time it slept;
#   8c. a Go program's net/http/pprof endpoints, scraped over the pod IP: its heap names its
#      allocation site, its goroutine counts and allocation deltas match its own counts;
#   8d. a ProfileStore of three replicas on SeaweedFS in the cluster: the annotated pod's
#      samples of a closed range are the same, complete, through a port-forward to each
#      replica's pod, and again after the pod of the replica that took them is deleted;
#   9. deleting the ProfileStore leaves nothing it owned behind.
# Without a reachable cluster it prints SKIP and exits 0, or fails when CI is set.
#
# The Kiln images must be on the nodes already (`./kiln-dev images` loads them into this
# machine's containerd); nothing is pulled. Environment:
#   KILN_OPERATOR_IMAGE, KILN_STORE_IMAGE, KILN_AGENT_IMAGE  images (default: config/'s names)
#   KILN_E2E_PULL_POLICY   imagePullPolicy of the Kiln pods (default Never)
#   KILN_CLI               the `kiln` binary (default: `kiln` on PATH, else built with cargo)
#   KILN_E2E_VOLUME_DIR    host directory of the store's local PersistentVolume when the
#                          cluster has no default StorageClass (created here, so the node must
#                          be this machine; default /var/lib/kiln-cluster/volumes/kiln-e2e-<run>)
#   KILN_E2E_LOAD_IMAGE    command that loads an OCI archive into the nodes (default
#                          e2e/images/load.sh, this machine's containerd)
#   KILN_E2E_JDK           the JDK whose jlink and javac make the JVM workload's image
#                          (default /usr/lib/jvm/java-17-openjdk-amd64); `node` on PATH
#                          goes into the Node workload's, and `go` on PATH builds the Go one
#   KILN_E2E_WEED          the SeaweedFS binary of check 8d's image (default
#                          $KILN_TOOLS_DIR/seaweedfs/bin/weed, which ./kiln-dev builds)
#   KILN_E2E_CHECKS        the checks to run, e.g. "8c" or "2,6" (default: all); setup and
#                          check 1, which install everything, always run. Checks 3, 5 and 6
#                          use the pods check 2 finds, so list 2 with them
#   KILN_E2E_KEEP=1        leave everything installed for inspection
set -euo pipefail

e2e_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$e2e_dir/.." && pwd)"
# shellcheck source=e2e/lib.sh
. "$e2e_dir/lib.sh"

default_operator_image=ghcr.io/kiln-dev/kiln-operator:0.1.0
default_store_image=ghcr.io/kiln-dev/kiln-store:0.1.0
default_agent_image=ghcr.io/kiln-dev/kiln-agent:0.1.0
operator_image="${KILN_OPERATOR_IMAGE:-$default_operator_image}"
store_image="${KILN_STORE_IMAGE:-$default_store_image}"
agent_image="${KILN_AGENT_IMAGE:-$default_agent_image}"
pull_policy="${KILN_E2E_PULL_POLICY:-Never}"
system_ns=kiln-system
store_name=kiln
# Check 8d's store of three replicas, beside `kiln`.
replicas_store=kiln-replicas
store_port=7470
workload_ns=kiln-e2e
workload_image=localhost/kiln-e2e/hot-loop:1
run_id="$(date +%Y%m%d%H%M%S)"

command -v kubectl >/dev/null 2>&1 || skip_or_fail "kubectl is not installed, so no cluster can be reached"
kubectl version --request-timeout=5s >/dev/null 2>&1 \
  || skip_or_fail "no Kubernetes cluster reachable (KUBECONFIG=${KUBECONFIG:-~/.kube/config}); start one with ./kiln-dev cluster up"
for tool in jq curl gcc; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool is needed by the suite"
done

work_dir="$(mktemp -d "${TMPDIR:-/tmp}/kiln-e2e.XXXXXX")"
volume_dir="${KILN_E2E_VOLUME_DIR:-/var/lib/kiln-cluster/volumes/kiln-e2e-$run_id}"
created_volume=""
# "no" when someone else's install is in the cluster: the cleanup leaves config/default alone.
config_installed=yes
started_at=$SECONDS
check_times=()

cleanup() {
  local status=$?
  stop_forward
  if [ "${KILN_E2E_KEEP:-0}" = 1 ]; then
    echo "KILN_E2E_KEEP=1: leaving everything installed (work dir $work_dir)"
    return
  fi
  if [ "$config_installed" = no ]; then
    rm -rf -- "$work_dir"
    return "$status"
  fi
  log "cleaning up"
  # Check 8d's store first, while the SeaweedFS it flushes to at exit still runs.
  kubectl -n "$system_ns" delete profilestore "$replicas_store" --ignore-not-found --timeout=120s >/dev/null 2>&1 || true
  kubectl -n "$system_ns" delete secret "$replicas_store-s3" --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete namespace "$workload_ns" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
  kubectl -n "$system_ns" delete profilestore "$store_name" --ignore-not-found --timeout=120s >/dev/null 2>&1 || true
  kubectl -n "$system_ns" delete pvc "data-$store_name-0" --ignore-not-found --timeout=60s >/dev/null 2>&1 || true
  if [ -n "$created_volume" ]; then
    kubectl delete pv "$created_volume" --ignore-not-found --timeout=60s >/dev/null 2>&1 || true
    case "$volume_dir" in
      /var/lib/kiln-cluster/volumes/kiln-e2e-*) rm -rf -- "$volume_dir" ;;
    esac
  fi
  kubectl delete -k "$repo/config/default" --ignore-not-found --wait=true --timeout=180s >/dev/null 2>&1 || true
  rm -rf -- "$work_dir"
  return "$status"
}
trap cleanup EXIT
# A command that fails outside a check's own test (a query through a port-forward that died,
# say) stops the suite through set -e; this says which one, where the log would otherwise go
# straight from the last note to the cleanup.
set -o errtrace
trap 'echo "FAIL: \`$BASH_COMMAND\` exited $? at ${BASH_SOURCE[0]}:$LINENO" >&2' ERR

# selected NAME: whether KILN_E2E_CHECKS (unset: all) lists the check NAME starts with.
selected() {
  local id="${1%% *}"
  case "$id" in setup|1) return 0 ;; esac
  [ -z "${KILN_E2E_CHECKS:-}" ] && return 0
  case " ${KILN_E2E_CHECKS//,/ } " in
    *" $id "*) return 0 ;;
  esac
  return 1
}

# timed NAME FUNCTION: runs one check, if selected, and records how long it took.
timed() {
  selected "$1" || return 0
  local begin=$SECONDS
  "$2"
  check_times+=("$1: $((SECONDS - begin)) s")
}

# shellcheck source=e2e/checks/0_setup.sh
. "$e2e_dir/checks/0_setup.sh"
# shellcheck source=e2e/checks/1_reconciled.sh
. "$e2e_dir/checks/1_reconciled.sh"
# shellcheck source=e2e/checks/2_annotated_only.sh
. "$e2e_dir/checks/2_annotated_only.sh"
# shellcheck source=e2e/checks/3_live_annotation.sh
. "$e2e_dir/checks/3_live_annotation.sh"
# shellcheck source=e2e/checks/4_retention.sh
. "$e2e_dir/checks/4_retention.sh"
# shellcheck source=e2e/checks/5_store_restart.sh
. "$e2e_dir/checks/5_store_restart.sh"
# shellcheck source=e2e/checks/6_capabilities.sh
. "$e2e_dir/checks/6_capabilities.sh"
# shellcheck source=e2e/checks/7_validation.sh
. "$e2e_dir/checks/7_validation.sh"
# shellcheck source=e2e/checks/8_runtimes.sh
. "$e2e_dir/checks/8_runtimes.sh"
# shellcheck source=e2e/checks/8c_pprof.sh
. "$e2e_dir/checks/8c_pprof.sh"
# shellcheck source=e2e/checks/8d_replicas.sh
. "$e2e_dir/checks/8d_replicas.sh"
# shellcheck source=e2e/checks/9_deletion.sh
. "$e2e_dir/checks/9_deletion.sh"

timed "setup" setup
timed "1 store and target reconciled" check_reconciled
timed "2 only the annotated pod is profiled" check_annotated_only
timed "3 live annotation" check_live_annotation
timed "4 retention" check_retention
timed "5 store pod deleted" check_store_restart
timed "6 capabilities mode" check_capabilities
timed "7 bad CRs refused" check_validation
timed "8 JVM and Node without flags" check_runtimes
timed "8b off-CPU time of a sleeping thread" check_off_cpu
timed "8c pprof endpoints of a Go program" check_pprof
timed "8d three replicas on SeaweedFS" check_replicas
timed "9 store deleted" check_deletion

log "PASS: ${KILN_E2E_CHECKS:+the selected }checks ${KILN_E2E_CHECKS:-1-9} passed in $((SECONDS - started_at)) s"
printf '   %s\n' "${check_times[@]}"
