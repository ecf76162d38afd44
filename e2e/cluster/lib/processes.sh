# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/cluster/cluster.sh and smoke.sh, which source it with the other lib/ files
# Starting the cluster's processes in order, each waited for (sourced by
# cluster.sh after common.sh, pki.sh and config.sh).
# shellcheck shell=bash

# Kernel settings the cluster changes: forwarding for pod traffic, and the
# ones the kubelet sets at start (it insists on its values unless it may
# only check them). Their values before the first up are saved and put
# back by down.
cluster_sysctls=(net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic
  kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

save_sysctls() {
  local key
  [ -f "$run_dir/sysctls.saved" ] && return
  for key in "${cluster_sysctls[@]}"; do
    printf '%s=%s\n' "$key" "$(sysctl -n "$key")"
  done >"$run_dir/sysctls.saved.partial"
  mv "$run_dir/sysctls.saved.partial" "$run_dir/sysctls.saved"
}

etcd_healthy() {
  curl -sf --max-time 3 --cacert "$pki_dir/etcd-ca.crt" --cert "$pki_dir/apiserver-etcd-client.crt" \
    --key "$pki_dir/apiserver-etcd-client.key" https://127.0.0.1:2379/health | grep -q '"health":"true"'
}

apiserver_ready() { [ "$(kubectl_admin get --raw /readyz --request-timeout=3s 2>/dev/null)" = ok ]; }

# Whether something other than our containerd answers on the CRI socket.
foreign_containerd() {
  [ -S "$cri_socket" ] && ! running_pid containerd >/dev/null &&
    ctr --address "$cri_socket" version >/dev/null 2>&1
}

start_containerd() {
  if foreign_containerd; then
    die "another containerd serves $cri_socket; stop it first (this cluster runs its own, config $conf_dir/containerd.toml)"
  fi
  start_daemon containerd "$(command -v containerd)" --config "$conf_dir/containerd.toml"
  wait_until 60 "containerd answering on $cri_socket" "$logs_dir/containerd.log" \
    ctr --address "$cri_socket" version
}

start_control_plane() {
  local ip="$1"
  start_daemon etcd "$etcd_bin/etcd" \
    --name kiln-cluster --data-dir "$state_dir/etcd" \
    --listen-client-urls https://127.0.0.1:2379 --advertise-client-urls https://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster kiln-cluster=http://127.0.0.1:2380 \
    --listen-metrics-urls http://127.0.0.1:2381 \
    --cert-file "$pki_dir/etcd-server.crt" --key-file "$pki_dir/etcd-server.key" \
    --client-cert-auth --trusted-ca-file "$pki_dir/etcd-ca.crt"
  wait_until 60 "etcd healthy" "$logs_dir/etcd.log" etcd_healthy

  start_daemon kube-apiserver "$kubernetes_bin/kube-apiserver" \
    --advertise-address "$ip" --secure-port 6443 \
    --etcd-servers https://127.0.0.1:2379 --etcd-cafile "$pki_dir/etcd-ca.crt" \
    --etcd-certfile "$pki_dir/apiserver-etcd-client.crt" --etcd-keyfile "$pki_dir/apiserver-etcd-client.key" \
    --client-ca-file "$pki_dir/ca.crt" \
    --tls-cert-file "$pki_dir/apiserver.crt" --tls-private-key-file "$pki_dir/apiserver.key" \
    --kubelet-client-certificate "$pki_dir/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki_dir/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$pki_dir/ca.crt" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=true \
    --service-cluster-ip-range "$service_cidr" \
    --service-account-issuer "https://kubernetes.default.svc.$cluster_domain" \
    --service-account-key-file "$pki_dir/sa.pub" \
    --service-account-signing-key-file "$pki_dir/sa.key"
  wait_until 120 "the apiserver ready" "$logs_dir/kube-apiserver.log" apiserver_ready
  render_manifest kubelet-api-access.yaml | kubectl_admin apply -f - >/dev/null

  start_daemon kube-controller-manager "$kubernetes_bin/kube-controller-manager" \
    --kubeconfig "$conf_dir/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$conf_dir/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$conf_dir/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials \
    --cluster-name kiln-cluster --service-cluster-ip-range "$service_cidr" \
    --root-ca-file "$pki_dir/ca.crt" \
    --service-account-private-key-file "$pki_dir/sa.key" \
    --cluster-signing-cert-file "$pki_dir/ca.crt" --cluster-signing-key-file "$pki_dir/ca.key"
  start_daemon kube-scheduler "$kubernetes_bin/kube-scheduler" \
    --kubeconfig "$conf_dir/scheduler.kubeconfig" \
    --authentication-kubeconfig "$conf_dir/scheduler.kubeconfig" \
    --authorization-kubeconfig "$conf_dir/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false
}

node_ready() {
  [ "$(kubectl_admin get node "$node_name" --request-timeout=3s \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

start_node() {
  local ip="$1"
  save_sysctls
  sysctl -qw net.ipv4.ip_forward=1
  start_daemon kubelet "$kubernetes_bin/kubelet" \
    --config "$conf_dir/kubelet.yaml" --kubeconfig "$conf_dir/kubelet.kubeconfig" \
    --root-dir "$kubelet_dir" --node-ip "$ip" --hostname-override "$node_name"
  wait_until 120 "node $node_name Ready" "$logs_dir/kubelet.log" node_ready
  start_daemon kube-proxy "$kubernetes_bin/kube-proxy" --config "$conf_dir/kube-proxy.yaml"
  wait_until 60 "kube-proxy healthy" "$logs_dir/kube-proxy.log" \
    curl -sf --max-time 3 http://127.0.0.1:10256/healthz
}

dns_answers() {
  busybox nslookup "kubernetes.default.svc.$cluster_domain" "$dns_service_ip" 2>/dev/null |
    grep -q "Address:.*$apiserver_service_ip"
}

wait_for_dns() {
  render_manifest coredns.yaml | kubectl_admin apply -f - >/dev/null
  wait_until 180 "CoreDNS ready" "$logs_dir/kubelet.log" \
    kubectl_admin -n kube-system rollout status deployment/coredns --timeout=5s
  wait_until 60 "CoreDNS answering at $dns_service_ip through the kube-dns Service" \
    "$logs_dir/kube-proxy.log" dns_answers
}
