# shellcheck shell=bash
# shellcheck disable=SC2034 # a sourced file: it sets variables for e2e/cluster/cluster.sh and smoke.sh, which source it with the other lib/ files
# Shared settings and helpers of e2e/cluster/cluster.sh (sourced, not run).
# shellcheck shell=bash

cluster_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${KILN_TOOLS_DIR:-/var/tmp/kiln-tools}"

# Everything the cluster writes lives under these two directories, so down
# knows exactly what to clean and nothing else on the machine is touched.
# (Fixed paths: down deletes below them.)
state_dir=/var/lib/kiln-cluster
run_dir=/run/kiln-cluster
pki_dir="$state_dir/pki"
conf_dir="$state_dir/config"
logs_dir="$state_dir/logs"
volumes_dir="$state_dir/volumes"
kubelet_dir="$state_dir/kubelet"
pid_dir="$run_dir/pids"
admin_kubeconfig="$state_dir/admin.kubeconfig"

# The CRI socket is containerd's default path: the Kiln agent's CRD accepts
# only the runtimes' well-known sockets.
cri_socket=/run/containerd/containerd.sock

# Cluster addressing. The pod range is the cluster's, of which the one node
# hands out its subnet through the bridge CNI; the service range is the
# apiserver's, whose first address is the apiserver's, the tenth the DNS's.
pod_cidr=10.244.0.0/16
node_pod_subnet=10.244.0.0/24
service_cidr=10.96.0.0/16
apiserver_service_ip=10.96.0.1
dns_service_ip=10.96.0.10
cluster_domain=cluster.local
bridge_name=kiln0
cni_network_name=kiln-cluster

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'cluster: %s\n' "$*" >&2; exit 1; }

# The version a module of ours pins for an upstream module, read from its
# go.mod so the go.mod stays the one place a version is written.
module_version() {
  local module_dir="$1" module_path="$2" version
  version="$(awk -v m="$module_path" '($1 == m || ($1 == "require" && $2 == m)) {
      for (i = 1; i <= NF; i++) if ($i ~ /^v[0-9]/) { print $i; exit } }' \
    "$cluster_dir/$module_dir/go.mod")"
  [ -n "$version" ] || die "no version of $module_path in $cluster_dir/$module_dir/go.mod"
  printf '%s\n' "$version"
}

kubernetes_version="$(module_version kubernetes k8s.io/kubernetes)"
etcd_version="$(module_version etcd go.etcd.io/etcd/server/v3)"
coredns_version="$(module_version coredns github.com/coredns/coredns)"
crictl_version="$(module_version crictl sigs.k8s.io/cri-tools)"
kubernetes_bin="$tools_dir/kubernetes-$kubernetes_version/bin"
etcd_bin="$tools_dir/etcd-$etcd_version/bin"
coredns_bin="$tools_dir/coredns-$coredns_version/bin"
crictl_bin="$tools_dir/crictl-$crictl_version/bin"

# The node is this machine: its hostname (lower-cased, as the kubelet does)
# and the source address of its default route.
node_name="$(hostname | tr '[:upper:]' '[:lower:]')"
node_ip() {
  ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit }}'
}

kubectl_admin() { "$kubernetes_bin/kubectl" --kubeconfig "$admin_kubeconfig" "$@"; }
crictl_cmd() { "$crictl_bin/crictl" --runtime-endpoint "unix://$cri_socket" --timeout 30s "$@"; }

# wait_until SECONDS WHAT LOG COMMAND...: runs COMMAND every second until it
# succeeds; after SECONDS it fails naming WHAT and the log to read.
wait_until() {
  local seconds="$1" what="$2" log_file="$3"
  shift 3
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      printf 'cluster: %s did not happen within %ss; see %s\n' "$what" "$seconds" "$log_file" >&2
      [ -f "$log_file" ] && tail -n 20 "$log_file" >&2
      exit 1
    fi
    sleep 1
  done
}

# --- files whose change restarts the components that read them --------

# Paths written by this run with a content different from before. A
# component started with one of them among its arguments is restarted.
changed_files=()

# update_file PATH: standard input into PATH (mode 0600), if that changes PATH.
update_file() {
  local path="$1" staged
  staged="$(mktemp "$path.XXXXXX")"
  cat >"$staged"
  if cmp -s "$staged" "$path"; then
    rm -f "$staged"
  else
    mv "$staged" "$path"
    changed_files+=("$path")
  fi
}

# --- processes, tracked by pid file -------------------------------------

# The pid a component's pid file names, if that process still runs the
# component's binary (a pid reused by another program does not count).
running_pid() {
  local name="$1" pid exe
  [ -f "$pid_dir/$name.pid" ] || return 1
  pid="$(cat "$pid_dir/$name.pid")"
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null)" || return 1
  [ "$(basename "${exe% (deleted)}")" = "$(cat "$pid_dir/$name.exe" 2>/dev/null)" ] || return 1
  printf '%s\n' "$pid"
}

# start_daemon NAME BINARY ARGS...: starts BINARY in its own session with its
# output in logs/NAME.log, unless it runs already; restarts it when one of
# ARGS is a file this run changed.
start_daemon() {
  local name="$1" binary="$2" argument changed
  shift 2
  if running_pid "$name" >/dev/null; then
    for argument in "$@"; do
      for changed in "${changed_files[@]}"; do
        if [ "$argument" = "$changed" ]; then
          log "$name: $changed changed, restarting"
          stop_daemon "$name"
          break 2
        fi
      done
    done
  fi
  if running_pid "$name" >/dev/null; then
    log "$name runs already (pid $(running_pid "$name"))"
    return
  fi
  [ -x "$binary" ] || die "$binary is missing"
  mkdir -p "$pid_dir" "$logs_dir"
  printf '\n--- started %s: %s %s\n' "$(date -u +%FT%TZ)" "$binary" "$*" >>"$logs_dir/$name.log"
  setsid "$binary" "$@" </dev/null >>"$logs_dir/$name.log" 2>&1 &
  printf '%s\n' "$!" >"$pid_dir/$name.pid"
  basename "$binary" >"$pid_dir/$name.exe"
  log "$name started (pid $!, log $logs_dir/$name.log)"
}

# stop_daemon NAME: SIGTERM, then SIGKILL after 20 s, by the pid file only.
stop_daemon() {
  local name="$1" pid waited=0
  if pid="$(running_pid "$name")"; then
    kill -TERM "$pid" 2>/dev/null || true
    while [ -d "/proc/$pid" ] && [ "$waited" -lt 20 ]; do
      sleep 1
      waited=$((waited + 1))
    done
    if [ -d "/proc/$pid" ]; then
      log "$name (pid $pid) ignored SIGTERM for 20s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 1
    fi
    log "$name stopped (pid $pid)"
  fi
  rm -f "$pid_dir/$name.pid" "$pid_dir/$name.exe"
}
