#!/usr/bin/env bash
# End-to-end test of Kiln on a real Kubernetes cluster (kind, k3d, or any cluster in KUBECONFIG):
#   1. installs the CRDs and the operator (config/default);
#   2. creates a ProfileStore and a ProfilingTarget, and runs an annotated CPU-burning workload;
#   3. waits for the Available / Ready conditions;
#   4. port-forwards to the store and finds the workload's profile by its pod label (the agents
#      ship with the operator's generated write token), and checks a write without it gets 401.
# Without a reachable cluster it prints SKIP and exits 0.
#
# Images must be pullable by the cluster (or loaded into it, e.g. `kind load docker-image`):
#   KILN_OPERATOR_IMAGE (default ghcr.io/kiln-dev/kiln-operator:0.1.0)
#   KILN_STORE_IMAGE    (default ghcr.io/kiln-dev/kiln-store:0.1.0)
#   KILN_AGENT_IMAGE    (default ghcr.io/kiln-dev/kiln-agent:0.1.0)
#   KILN_E2E_WORKLOAD_IMAGE (default docker.io/library/busybox:1.36)
# KILN_E2E_KEEP=1 leaves everything installed for inspection.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
operator_image="${KILN_OPERATOR_IMAGE:-ghcr.io/kiln-dev/kiln-operator:0.1.0}"
store_image="${KILN_STORE_IMAGE:-ghcr.io/kiln-dev/kiln-store:0.1.0}"
agent_image="${KILN_AGENT_IMAGE:-ghcr.io/kiln-dev/kiln-agent:0.1.0}"
workload_image="${KILN_E2E_WORKLOAD_IMAGE:-docker.io/library/busybox:1.36}"
ns=kiln-e2e
local_port="${KILN_E2E_PORT:-17470}"

log() { printf '\n== %s\n' "$*"; }
fail() { printf '\nFAIL: %s\n' "$*" >&2; exit 1; }

if ! command -v kubectl >/dev/null 2>&1; then
  echo "SKIP: kubectl is not installed, so no cluster can be reached"
  exit 0
fi
if ! kubectl version --request-timeout=5s >/dev/null 2>&1; then
  echo "SKIP: no Kubernetes cluster reachable (KUBECONFIG=${KUBECONFIG:-~/.kube/config}); start kind or k3d and retry"
  exit 0
fi

port_forward_pid=""
cleanup() {
  [ -n "$port_forward_pid" ] && kill "$port_forward_pid" 2>/dev/null || true
  if [ "${KILN_E2E_KEEP:-0}" != 1 ]; then
    log "cleaning up"
    kubectl delete namespace "$ns" --wait=true --timeout=120s >/dev/null 2>&1 || true
    kubectl delete -k "$repo/config/default" --wait=false >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

diagnose() {
  kubectl -n kiln-system logs deploy/kiln-operator --tail=50 || true
  kubectl -n "$ns" get profilestores,profilingtargets,statefulsets,daemonsets,pods -o wide || true
  kubectl -n "$ns" get events --sort-by=.lastTimestamp | tail -20 || true
}

log "installing CRDs and the operator"
kubectl apply --server-side -k "$repo/config/default"
kubectl -n kiln-system set image deployment/kiln-operator "kiln-operator=$operator_image"
kubectl wait --for=condition=Established --timeout=60s \
  crd/profilestores.kiln.dev crd/profilingtargets.kiln.dev
kubectl -n kiln-system rollout status deployment/kiln-operator --timeout=180s || { diagnose; fail "operator did not start"; }

log "creating the store, a target and an annotated workload in $ns"
kubectl apply --server-side -f - <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: $ns
  labels:
    pod-security.kubernetes.io/enforce: privileged
YAML
# The operator writes store children only where it is granted a Role.
kubectl -n "$ns" apply --server-side -f "$repo/config/rbac/store_role.yaml" \
  -f "$repo/config/rbac/store_role_binding.yaml"
kubectl apply --server-side -f - <<YAML
apiVersion: kiln.dev/v1alpha1
kind: ProfileStore
metadata:
  name: e2e
  namespace: $ns
spec:
  image: $store_image
  retention:
    duration: 1d
  storage:
    ephemeral: true
  agent:
    image: $agent_image
---
apiVersion: kiln.dev/v1alpha1
kind: ProfilingTarget
metadata:
  name: burner
  namespace: $ns
spec:
  storeRef:
    name: e2e
  selector:
    matchLabels:
      app: burner
  requireAnnotation: true
  samplingHz: 99
  labels:
    suite: e2e
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: burner
  namespace: $ns
spec:
  replicas: 1
  selector:
    matchLabels:
      app: burner
  template:
    metadata:
      labels:
        app: burner
      annotations:
        profiles.kiln.dev/enabled: "true"
    spec:
      containers:
        - name: burner
          image: $workload_image
          command: ["sh", "-c", "while :; do :; done"]
          resources:
            limits:
              cpu: 200m
YAML

log "waiting for conditions"
kubectl -n "$ns" wait --for=condition=Ready profilingtarget/burner --timeout=120s || { diagnose; fail "target not Ready"; }
kubectl -n "$ns" wait --for=condition=Available profilestore/e2e --timeout=300s || { diagnose; fail "store not Available"; }
kubectl -n "$ns" wait --for=condition=AgentsReady profilestore/e2e --timeout=300s || { diagnose; fail "agents not ready"; }
kubectl -n "$ns" rollout status deployment/burner --timeout=180s || { diagnose; fail "workload did not start"; }
pod="$(kubectl -n "$ns" get pods -l app=burner -o jsonpath='{.items[0].metadata.name}')"
kubectl -n "$ns" get profilestore e2e

log "port-forwarding to the store and looking for pod $pod"
kubectl -n "$ns" port-forward svc/e2e "$local_port:7470" >/dev/null 2>&1 &
port_forward_pid=$!
base="http://127.0.0.1:$local_port/api/v1"
query="%7Bnamespace%3D%22$ns%22%7D"
found=""
for _ in $(seq 1 60); do
  if values="$(curl -fsS "$base/labels/pod/values?query=$query&from=now-15m" 2>/dev/null)" \
     && printf '%s' "$values" | grep -q "\"$pod\""; then
    found=yes
    break
  fi
  sleep 5
done
[ -n "$found" ] || { diagnose; fail "no profile of pod $pod reached the store within 5 minutes"; }
echo "profiles of $pod are in the store:"
curl -fsS "$base/series?query=%7Bnamespace%3D%22$ns%22%2Cpod%3D%22$pod%22%7D&from=now-15m"
echo
# The agents got there with the generated write token; without it the store refuses writes.
kubectl -n "$ns" get secret e2e-tokens -o jsonpath='{.data.write-token}' | grep -q . \
  || { diagnose; fail "the operator created no write token in secret e2e-tokens"; }
unauthenticated="$(curl -sS -o /dev/null -w '%{http_code}' -X POST --data-binary 'main;work 1' \
  "http://127.0.0.1:$local_port/ingest?name=e2e.cpu&format=folded" || true)"
[ "$unauthenticated" = "401" ] \
  || { diagnose; fail "a write without the token got HTTP $unauthenticated, not 401"; }
echo "PASS: the workload's profile was found, and writes without the token are refused"
