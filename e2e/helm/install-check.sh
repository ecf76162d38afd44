#!/usr/bin/env bash
# `helm install` of charts/kiln into the cluster in KUBECONFIG, in a namespace of its own:
# the operator's pod becomes Ready, and the ProfileStore the chart creates (ephemeral storage,
# so no volume is needed) gets its StatefulSet, Services, agent DaemonSet and Ready pods from
# the operator running with the chart's RBAC. Then `helm uninstall` and the namespace's
# deletion leave no Kiln object behind (CRDs this run installed are deleted too, since Helm
# never deletes CRDs).
#
# The operator's names are cluster-wide (docs/helm.md), so the check refuses to run beside
# another Kiln install (config/default or a release). The images must be on the nodes already
# (`./kiln-dev images`). Environment:
#   KILN_OPERATOR_IMAGE, KILN_STORE_IMAGE, KILN_AGENT_IMAGE   images (default: the chart's)
#   KILN_HELM_PULL_POLICY   the operator's imagePullPolicy (default IfNotPresent)
#   KILN_HELM_NAMESPACE     the release namespace (default kiln-helm-check)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
namespace="${KILN_HELM_NAMESPACE:-kiln-helm-check}"
release=kiln
store=kiln-helm
operator_image="${KILN_OPERATOR_IMAGE:-ghcr.io/kiln-dev/kiln-operator:0.1.0}"
store_image="${KILN_STORE_IMAGE:-ghcr.io/kiln-dev/kiln-store:0.1.0}"
agent_image="${KILN_AGENT_IMAGE:-ghcr.io/kiln-dev/kiln-agent:0.1.0}"
crds=(profilestores.kiln.dev profilingtargets.kiln.dev)

log() { printf '\n== %s\n' "$*"; }
fail() {
  printf '\nFAIL: %s\n' "$*" >&2
  kubectl -n "$namespace" get all,profilestores -o wide >&2 || true
  kubectl -n "$namespace" get events --sort-by=.lastTimestamp 2>&1 | tail -20 >&2 || true
  kubectl -n "$namespace" logs deploy/kiln-operator --tail=40 >&2 || true
  exit 1
}

helm="$("$repo/e2e/cluster/helm/build.sh")"
kubectl version --request-timeout=5s >/dev/null \
  || fail "no cluster reachable (KUBECONFIG=${KUBECONFIG:-~/.kube/config})"
if kubectl get clusterrole kiln-operator >/dev/null 2>&1; then
  fail "ClusterRole kiln-operator exists: Kiln is installed already, and a second operator would fight it"
fi
created_crds=()
for crd in "${crds[@]}"; do
  kubectl get crd "$crd" >/dev/null 2>&1 || created_crds+=("$crd")
done

cleanup() {
  log "helm uninstall, namespace and CRDs this run created"
  # The store first, while the operator can still run its finalizer.
  kubectl -n "$namespace" delete profilestore "$store" --ignore-not-found --timeout=120s || true
  "$helm" uninstall "$release" --namespace "$namespace" --wait --timeout 120s || true
  kubectl delete namespace "$namespace" --ignore-not-found --timeout=180s || true
  if [ "${#created_crds[@]}" -gt 0 ]; then
    kubectl delete crd "${created_crds[@]}" --ignore-not-found --timeout=60s || true
  fi
}
trap cleanup EXIT

log "helm install $release into $namespace"
kubectl create namespace "$namespace"
kubectl label namespace "$namespace" pod-security.kubernetes.io/enforce=privileged \
  pod-security.kubernetes.io/warn=privileged
"$helm" install "$release" "$repo/charts/kiln" --namespace "$namespace" --wait --timeout 180s \
  --set "operator.image.repository=${operator_image%:*}" \
  --set "operator.image.tag=${operator_image##*:}" \
  --set "operator.image.pullPolicy=${KILN_HELM_PULL_POLICY:-IfNotPresent}" \
  --set "images.store=$store_image" --set "images.agent=$agent_image" \
  --set profileStore.create=true --set "profileStore.name=$store" \
  --set profileStore.spec.storage.ephemeral=true \
  || fail "helm install did not finish"

kubectl -n "$namespace" wait --for=condition=Ready pod -l app.kubernetes.io/name=kiln-operator \
  --timeout=120s || fail "the operator's pod is not Ready"
echo "operator pod Ready"
kubectl -n "$namespace" wait --for=condition=Available "profilestore/$store" --timeout=240s \
  || fail "the operator did not make ProfileStore $store Available with the chart's RBAC"
kubectl -n "$namespace" wait --for=condition=AgentsReady "profilestore/$store" --timeout=240s \
  || fail "the operator did not make the agents of $store Ready with the chart's RBAC"
kubectl -n "$namespace" get "profilestore/$store" -o wide
kubectl -n "$namespace" get statefulsets,daemonsets,services,configmaps,pods -o wide
"$helm" status "$release" --namespace "$namespace" | sed -n '1,6p'

trap - EXIT
cleanup
leftover="$(kubectl get clusterrole,clusterrolebinding kiln-operator --ignore-not-found -o name)"
[ -z "$leftover" ] || fail "helm uninstall left $leftover"
if kubectl get namespace "$namespace" >/dev/null 2>&1; then
  fail "namespace $namespace is still there"
fi
echo "PASS: helm install, a Ready operator and store, helm uninstall"
