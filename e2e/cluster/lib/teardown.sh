# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/cluster/cluster.sh and smoke.sh, which source it with the other lib/ files
# Stopping the cluster and removing what it left on the machine (sourced by
# cluster.sh after common.sh and processes.sh).
# shellcheck shell=bash

# Mount points under the cluster's directories, deepest first.
cluster_mounts() {
  awk -v a="$state_dir/" -v b="$run_dir/" \
    'index($5 "/", a) == 1 || index($5 "/", b) == 1 { print $5 }' /proc/self/mountinfo | sort -r
}

# Pids of shims serving our containerd's socket (a test's containerd on
# another socket keeps its own).
cluster_shims() {
  local cmdline_file pid
  for cmdline_file in /proc/[0-9]*/cmdline; do
    pid="${cmdline_file#/proc/}"
    pid="${pid%/cmdline}"
    tr '\0' ' ' 2>/dev/null <"$cmdline_file" | grep -q "^[^ ]*containerd-shim[^ ]* .*-address $cri_socket " &&
      printf '%s\n' "$pid"
  done
  return 0
}

# iptables chains of the cluster: kube-proxy's KUBE-* and the CNI
# plugins' CNI-*, in the filter and nat tables.
cluster_chains() {
  local table
  for table in filter nat mangle; do
    iptables -w -t "$table" -S 2>/dev/null | awk -v t="$table" '$1 == "-N" && ($2 ~ /^KUBE-/ || $2 ~ /^CNI-/) { print t, $2 }'
  done
}

remove_pods() {
  running_pid containerd >/dev/null || return 0
  # Through CRI, so each sandbox's network is torn down by the CNI plugins.
  # shellcheck disable=SC2046 # one argument per pod id (ids have no spaces)
  crictl_cmd stopp $(crictl_cmd pods -q 2>/dev/null) >/dev/null 2>&1 || true
  crictl_cmd rmp -fa >/dev/null 2>&1 || log "crictl rmp -fa failed; removing what is left with ctr"
  crictl_cmd rm -fa >/dev/null 2>&1 || true
  local id
  for id in $(ctr --address "$cri_socket" -n k8s.io containers list -q 2>/dev/null); do
    ctr --address "$cri_socket" -n k8s.io tasks kill -s KILL "$id" >/dev/null 2>&1 || true
    sleep 0.2
    ctr --address "$cri_socket" -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true
    ctr --address "$cri_socket" -n k8s.io containers delete "$id" >/dev/null 2>&1 || true
  done
}

remove_iptables_chains() {
  local table chain rule
  # Jumps into the chains from the built-in ones first, then the chains.
  for table in filter nat mangle; do
    { iptables -w -t "$table" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j (KUBE|CNI)-' || true; } |
      while read -r rule; do
        # The rule as iptables printed it, quoted comments included.
        eval "iptables -w -t $table ${rule/-A/-D}" 2>/dev/null || true
      done
  done
  cluster_chains | while read -r table chain; do iptables -w -t "$table" -F "$chain" 2>/dev/null || true; done
  cluster_chains | while read -r table chain; do iptables -w -t "$table" -X "$chain" 2>/dev/null || true; done
}

remove_links() {
  local link
  for link in $(ip -o link show master "$bridge_name" 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
    ip link delete "$link" 2>/dev/null || true
  done
  ip link show "$bridge_name" >/dev/null 2>&1 && ip link delete "$bridge_name"
  return 0
}

# The kubelet's pod cgroups (cgroupfs driver): removed leaves first; only
# empty ones can go, so a process still in one stays visible.
remove_pod_cgroups() {
  local hierarchy
  for hierarchy in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [ -d "$hierarchy" ] || continue
    find "$hierarchy" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

restore_sysctls() {
  local line
  [ -f "$run_dir/sysctls.saved" ] || return 0
  while IFS= read -r line; do
    sysctl -qw "$line" || log "could not restore $line"
  done <"$run_dir/sysctls.saved"
  rm -f "$run_dir/sysctls.saved"
}

# Kubelet's symlinks in /var/log/containers into our pod log directory.
remove_log_links() {
  local link
  for link in /var/log/containers/*.log; do
    [ -L "$link" ] && case "$(readlink "$link")" in "$state_dir"/*) rm -f "$link" ;; esac
  done
  return 0
}

# Pids of the cluster's daemons: its etcd and Kubernetes components (not
# kubectl, which anyone may be running) and containerd on its config.
cluster_processes() {
  local exe_link pid exe
  for exe_link in /proc/[0-9]*/exe; do
    pid="${exe_link#/proc/}"
    pid="${pid%/exe}"
    exe="$(readlink "$exe_link" 2>/dev/null)" || continue
    case "$exe" in
      "$kubernetes_bin"/kubectl) ;;
      "$kubernetes_bin"/* | "$etcd_bin"/*) printf '%s %s\n' "$pid" "$exe" ;;
      */containerd)
        tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "--config $conf_dir/containerd.toml" &&
          printf '%s %s\n' "$pid" "$exe" ;;
    esac
  done
  return 0
}

# What down must leave behind: nothing. Prints each leftover; fails if any.
check_clean() {
  local leftovers=0 name pid
  while read -r name; do [ -n "$name" ] && { echo "leftover process: $name"; leftovers=1; }; done < <(cluster_processes)
  for pid in $(cluster_shims); do echo "leftover shim: pid $pid"; leftovers=1; done
  while read -r name; do [ -n "$name" ] && { echo "leftover mount: $name"; leftovers=1; }; done < <(cluster_mounts)
  if ip link show "$bridge_name" >/dev/null 2>&1; then echo "leftover link: $bridge_name"; leftovers=1; fi
  while read -r name; do [ -n "$name" ] && { echo "leftover iptables chain: $name"; leftovers=1; }; done < <(cluster_chains)
  if [ -S "$cri_socket" ] && ctr --address "$cri_socket" -n k8s.io containers list -q 2>/dev/null | grep -q .; then
    echo "leftover containers in k8s.io"; leftovers=1
  fi
  return "$leftovers"
}

cmd_down() {
  local purge=0 mount_point pid
  [ "${1:-}" = --purge ] && purge=1
  [ "$(id -u)" = 0 ] || die "down needs root"
  # The kubelet first, so nothing restarts the pods removed next.
  stop_daemon kubelet
  remove_pods
  stop_daemon kube-proxy
  # kube-proxy's own cleanup of its rules, then whatever chains remain.
  [ -x "$kubernetes_bin/kube-proxy" ] &&
    "$kubernetes_bin/kube-proxy" --cleanup >>"$logs_dir/kube-proxy.log" 2>&1 || true
  remove_iptables_chains
  stop_daemon kube-scheduler
  stop_daemon kube-controller-manager
  stop_daemon kube-apiserver
  stop_daemon etcd
  stop_daemon containerd
  for pid in $(cluster_shims); do
    log "shim pid $pid outlived containerd: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  done
  for mount_point in $(cluster_mounts); do
    umount "$mount_point" 2>/dev/null || umount -l "$mount_point" || log "could not unmount $mount_point"
  done
  remove_links
  remove_pod_cgroups
  remove_log_links
  restore_sysctls
  # containerd leaves its socket files; ours is stopped, so one that still
  # answers belongs to someone else and stays.
  foreign_containerd || rm -f "$cri_socket" "$cri_socket.ttrpc"
  if ! check_clean; then
    die "down left the above behind"
  fi
  # Directories containerd and libcni make outside ours, if left empty.
  rmdir /var/lib/cni/results /var/lib/cni /run/containerd/s /run/containerd/fifo /run/containerd 2>/dev/null || true
  # Never deleting across a mount point (a pod's host bind mount, say).
  rm -rf --one-file-system "$run_dir"
  if [ "$purge" = 1 ]; then
    log "deleting the cluster's state in $state_dir"
    rm -rf --one-file-system "$state_dir"
  fi
  log "cluster down: no processes, mounts, links, iptables chains or containers left"
}
