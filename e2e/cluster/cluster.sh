#!/usr/bin/env bash
# A real single-node Kubernetes on this machine, built from upstream Go
# modules (docs/cluster.md):
#   cluster.sh up                   build what is missing, start everything, wait
#                                   until the node is Ready and CoreDNS answers,
#                                   print the admin kubeconfig's path
#   cluster.sh build                only build what is missing (the binaries and
#                                   images that up would build), start nothing
#   cluster.sh status               what runs
#   cluster.sh down [--purge]       stop everything up started, remove its pods,
#                                   mounts, links and iptables chains; --purge also
#                                   deletes the cluster's state (etcd, certificates,
#                                   volumes, images)
#   cluster.sh smoke                check pods, Services, DNS, port-forward, logs,
#                                   exec and tokens on the running cluster (smoke.sh)
#   cluster.sh pv NAME SIZE [--class CLASS] [--owner UID:GID]
#                                   a local PersistentVolume on
#                                   /var/lib/kiln-cluster/volumes/NAME
# Needs root. KILN_TOOLS_DIR (default /var/tmp/kiln-tools) caches the builds.
set -euo pipefail

# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=lib/build.sh
source "$cluster_dir/lib/build.sh"
# shellcheck source=lib/images.sh
source "$cluster_dir/lib/images.sh"
# shellcheck source=lib/pki.sh
source "$cluster_dir/lib/pki.sh"
# shellcheck source=lib/config.sh
source "$cluster_dir/lib/config.sh"
# shellcheck source=lib/processes.sh
source "$cluster_dir/lib/processes.sh"
# shellcheck source=lib/teardown.sh
source "$cluster_dir/lib/teardown.sh"

# Debian packages the node needs: iptables and conntrack for kube-proxy,
# the CNI plugins for pod networking, containerd and runc, openssl for the
# certificates, busybox for the DNS check and the test image, gcc for the
# pause program, python3 for the image writer. No socat: containerd 1.6
# forwards ports itself, dialing inside the pod's network namespace.
cluster_packages=(containerd runc iptables conntrack containernetworking-plugins
  openssl curl busybox-static gcc libc6-dev python3)

install_cluster_packages() {
  local missing=() package
  for package in "${cluster_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$package")
  done
  [ "${#missing[@]}" -eq 0 ] && return
  log "installing system packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

cmd_up() {
  local ip started=$SECONDS
  [ "$(id -u)" = 0 ] || die "up needs root (containerd, the kubelet, iptables)"
  install_cluster_packages
  ip="${KILN_CLUSTER_NODE_IP:-$(node_ip)}"
  [ -n "$ip" ] || die "cannot tell this machine's address (no default route); set KILN_CLUSTER_NODE_IP"
  mkdir -p "$state_dir" "$run_dir" "$conf_dir" "$logs_dir" "$volumes_dir" "$pid_dir"
  chmod 700 "$state_dir"

  build_binaries
  build_images
  make_pki "$ip"
  write_kubeconfigs
  write_containerd_config
  write_cni_config
  write_kubelet_config
  write_kube_proxy_config

  start_containerd
  load_images
  start_control_plane "$ip"
  start_node "$ip"
  wait_for_dns

  log "cluster up in $((SECONDS - started))s"
  printf 'export KUBECONFIG=%s\n' "$admin_kubeconfig"
}

# The builds alone: `./kiln-dev test` runs them in the background while the
# cargo steps leave a core idle, so up finds them cached.
cmd_build() {
  build_binaries
  build_images
}

cmd_status() {
  local name pid
  for name in containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    if pid="$(running_pid "$name")"; then
      printf '%-24s running (pid %s)\n' "$name" "$pid"
    else
      printf '%-24s stopped\n' "$name"
    fi
  done
  if running_pid kube-apiserver >/dev/null; then
    printf '\nkubeconfig: %s\n' "$admin_kubeconfig"
    kubectl_admin get nodes -o wide --request-timeout=5s || true
    kubectl_admin get pods -A -o wide --request-timeout=5s || true
  fi
}

cmd_pv() {
  local name="${1:-}" size="${2:-}" class="" owner=""
  if [ -z "$name" ] || [ -z "$size" ]; then
    die "usage: cluster.sh pv NAME SIZE [--class CLASS] [--owner UID:GID]"
  fi
  shift 2
  while [ $# -gt 0 ]; do
    case "$1" in
      --class) class="$2"; shift 2 ;;
      --owner) owner="$2"; shift 2 ;;
      *) die "pv: unknown option $1" ;;
    esac
  done
  [[ "$name" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "pv: $name is not a valid name"
  running_pid kube-apiserver >/dev/null || die "the cluster is not up"
  mkdir -p "$volumes_dir/$name"
  chmod 700 "$volumes_dir/$name"
  [ -z "$owner" ] || chown "$owner" "$volumes_dir/$name"
  kubectl_admin apply -f - <<EOF
apiVersion: v1
kind: PersistentVolume
metadata:
  name: $name
  labels:
    kiln-cluster/volume: $name
spec:
  capacity:
    storage: $size
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: "$class"
  volumeMode: Filesystem
  local:
    path: $volumes_dir/$name
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - key: kubernetes.io/hostname
          operator: In
          values: [$node_name]
EOF
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  build) shift; cmd_build "$@" ;;
  down) shift; cmd_down "$@" ;;
  status) shift; cmd_status "$@" ;;
  pv) shift; cmd_pv "$@" ;;
  smoke) shift; exec "$cluster_dir/smoke.sh" "$@" ;;
  *) echo "usage: cluster.sh up | build | down [--purge] | status | smoke | pv NAME SIZE [--class CLASS] [--owner UID:GID]" >&2; exit 2 ;;
esac
