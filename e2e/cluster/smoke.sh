#!/usr/bin/env bash
# Checks that the cluster `cluster.sh up` started does what a cluster must,
# through the same paths a user takes (cluster.sh smoke runs it):
#   a pod gets an address from the CNI; a Service routes to it from another
#   pod; that pod resolves the Service's name through CoreDNS; kubectl
#   port-forward, logs and exec reach it (apiserver -> kubelet -> containerd);
#   a service-account token authenticates from inside a pod; a pod writes to
#   a local PersistentVolume.
# Works in its own namespace, removed at the end. Prints each check and
# "N passed, N failed"; exits non-zero if any failed.
set -euo pipefail

# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=lib/images.sh
source "$cluster_dir/lib/build.sh"
# shellcheck source=lib/images.sh
source "$cluster_dir/lib/images.sh"

ns=kiln-cluster-smoke
passed=0
failed=0
port_forward_pid=""

check() {
  local what="$1"
  shift
  if "$@"; then
    printf 'ok: %s\n' "$what"
    passed=$((passed + 1))
  else
    printf 'FAILED: %s\n' "$what"
    failed=$((failed + 1))
  fi
}

# eventually COMMAND...: COMMAND succeeds within 15 s. A new Service's rules
# and DNS record follow its endpoints by a moment (kube-proxy's and
# CoreDNS's watches), so a first try right after the pod turns Ready may
# be refused.
eventually() {
  local deadline=$((SECONDS + 15))
  until "$@" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || { "$@"; return; }
    sleep 1
  done
}

cleanup() {
  [ -n "$port_forward_pid" ] && kill "$port_forward_pid" 2>/dev/null
  rm -f "${port_forward_log:-}"
  kubectl_admin delete namespace "$ns" --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl_admin delete persistentvolume "$ns" --wait=true --timeout=30s >/dev/null 2>&1 || true
  rm -rf --one-file-system "${volumes_dir:?}/$ns"
}
trap cleanup EXIT

running_pid kube-apiserver >/dev/null || die "the cluster is not up (cluster.sh up)"
[ -x "$probe_bin/probe" ] || die "no probe in $probe_bin (cluster.sh up builds it)"
toolbox_image="$(toolbox_image_name)"
kubectl_admin delete namespace "$ns" --wait=true --timeout=60s >/dev/null 2>&1 || true
kubectl_admin create namespace "$ns" >/dev/null
kubectl_admin -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: web
    image: $toolbox_image
    imagePullPolicy: Never
    command: [/bin/probe, serve, ":8080", hello]
    ports: [{containerPort: 8080}]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata:
  name: client
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: client
    image: $toolbox_image
    imagePullPolicy: Never
    command: [/bin/busybox, sleep, "3600"]
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
EOF
kubectl_admin -n "$ns" wait --for=condition=Ready pod/web pod/client --timeout=120s >/dev/null

web_ip="$(kubectl_admin -n "$ns" get pod web -o jsonpath='{.status.podIP}')"
in_pod_range() { [[ "$web_ip" == "${node_pod_subnet%.*}".* ]]; }
check "pod web has an address from the bridge CNI ($web_ip)" in_pod_range

client_exec() { kubectl_admin -n "$ns" exec client -- "$@"; }
fetch_by_name() {
  client_exec /bin/probe get "http://web.$ns.svc.$cluster_domain/" | grep -q "hello from web"
}
check "pod client reaches the Service by its full DNS name (CoreDNS, kube-proxy)" eventually fetch_by_name
short_name() {
  [ "$(client_exec /bin/probe resolve web)" = "$(kubectl_admin -n "$ns" get svc web -o jsonpath='{.spec.clusterIP}')" ]
}
check "the short name web resolves to the Service's cluster IP (the pod's search path)" eventually short_name
exec_works() { [ "$(kubectl_admin -n "$ns" exec web -- /bin/busybox hostname)" = web ]; }
check "kubectl exec runs in the pod" exec_works
logs_work() {
  local output
  output="$(kubectl_admin -n "$ns" logs web 2>&1)"
  grep -q "serving on :8080" <<<"$output" || { printf 'kubectl logs web: %s\n' "$output" >&2; return 1; }
}
check "kubectl logs shows the pod's output" eventually logs_work

# A local port kubectl picks (and prints), so no other user's port collides.
port_forward_log="$(mktemp)"
kubectl_admin -n "$ns" port-forward pod/web :8080 >"$port_forward_log" 2>&1 &
port_forward_pid=$!
forwarded() {
  local local_port
  local_port="$(sed -n 's/^Forwarding from 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$port_forward_log")"
  [ -n "$local_port" ] && curl -sf --max-time 3 "http://127.0.0.1:$local_port/" | grep -q "hello from web"
}
port_forward_works() {
  local tries=0
  until forwarded; do
    tries=$((tries + 1))
    [ "$tries" -lt 20 ] || { cat "$port_forward_log"; return 1; }
    sleep 0.5
  done
}
check "kubectl port-forward reaches the pod" port_forward_works

# The probe posts a SelfSubjectReview to https://kubernetes.default.svc with
# the pod's token and CA: the answer names the pod's service account.
token_works() { [ "$(client_exec /bin/probe whoami)" = "system:serviceaccount:$ns:default" ]; }
check "a pod's service-account token authenticates to the apiserver through its Service" token_works

# A local PersistentVolume as `cluster.sh pv` makes it: a claim binds to it
# and a non-root pod writes what then lies in the host directory.
"$cluster_dir/cluster.sh" pv "$ns" 16Mi --owner 65532:65532 >/dev/null
kubectl_admin -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  volumeName: $ns
  resources: {requests: {storage: 16Mi}}
---
apiVersion: v1
kind: Pod
metadata:
  name: writer
spec:
  restartPolicy: Never
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: writer
    image: $toolbox_image
    imagePullPolicy: Never
    command: [/bin/busybox, sh, -c, "echo written-by-\$HOSTNAME > /data/check"]
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
EOF
volume_written() {
  kubectl_admin -n "$ns" wait --for=jsonpath='{.status.phase}'=Succeeded pod/writer --timeout=60s >/dev/null &&
    [ "$(cat "$volumes_dir/$ns/check")" = written-by-writer ]
}
check "a pod writes to a local PersistentVolume (cluster.sh pv) as a non-root user" volume_written

printf '%s passed, %s failed\n' "$passed" "$failed"
[ "$failed" = 0 ]
