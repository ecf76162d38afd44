# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/cluster/cluster.sh and smoke.sh, which source it with the other lib/ files
# The cluster's configuration files: containerd, CNI, kubelet, kube-proxy
# (sourced by cluster.sh after common.sh). Written on every up; a component
# whose file changed is restarted by start_daemon.
# shellcheck shell=bash

write_containerd_config() {
  mkdir -p "$state_dir/containerd" "$run_dir/containerd" "$state_dir/cni/net.d"
  update_file "$conf_dir/containerd.toml" <<EOF
# containerd for the kiln cluster (e2e/cluster/cluster.sh), on its own
# directories. The socket is containerd's default path, where the kubelet
# and the Kiln agent look for the CRI.
version = 2
root = "$state_dir/containerd"
state = "$run_dir/containerd"

[grpc]
  address = "$cri_socket"
[ttrpc]
  address = "$cri_socket.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$state_dir/containerd-opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  # Network namespaces under the state directory, not /var/run/netns.
  netns_mounts_under_state_dir = true
  # Containers get no lower oom_score_adj than containerd's own: root here
  # may lack CAP_SYS_RESOURCE (this machine's does), and runc then fails
  # to start a pod sandbox asking for -998.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # cgroupfs, as the kubelet's cgroupDriver: no systemd here.
        SystemdCgroup = false
        # runc's state beside containerd's, not in /run/containerd/runc.
        Root = "$run_dir/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$state_dir/cni/net.d"
EOF
}

write_cni_config() {
  mkdir -p "$state_dir/cni/net.d" "$state_dir/cni/ipam"
  update_file "$state_dir/cni/net.d/10-kiln-cluster.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$cni_network_name",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge_name",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$state_dir/cni/ipam",
        "ranges": [[{ "subnet": "$node_pod_subnet" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
}

write_kubelet_config() {
  mkdir -p "$kubelet_dir" "$state_dir/pod-logs"
  update_file "$conf_dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$cri_socket
# This machine's cgroups are v1 (or hybrid) and it runs no systemd.
cgroupDriver: cgroupfs
failCgroupV1: false
# Swap may be on; pods get none of it.
failSwapOn: false
memorySwap:
  swapBehavior: NoSwap
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $pki_dir/ca.crt
authorization:
  mode: Webhook
tlsCertFile: $pki_dir/kubelet-server.crt
tlsPrivateKeyFile: $pki_dir/kubelet-server.key
clusterDNS: [$dns_service_ip]
clusterDomain: $cluster_domain
podLogsDir: $state_dir/pod-logs
healthzBindAddress: 127.0.0.1
# Keep the kubelet's own oom_score_adj (lowering it needs CAP_SYS_RESOURCE).
oomScoreAdj: 0
# Images are loaded into containerd, not pulled: garbage-collecting one
# would leave its pods unable to start, so image GC stays off, and eviction
# waits until the shared disk is nearly full.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Floors are absolute, not percentages: the kubelet counts the space left to
# non-root users, and a CI VM may reserve most of a large disk for root, so
# "2 % of 256 GiB" tainted the node with disk-pressure while 5 GiB was free.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 512Mi
  imagefs.available: 512Mi
  nodefs.inodesFree: 1%
EOF
}

write_kube_proxy_config() {
  update_file "$conf_dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: $conf_dir/kube-proxy.kubeconfig
hostnameOverride: $node_name
clusterCIDR: $pod_cidr
bindAddress: 127.0.0.1
oomScoreAdj: 0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
iptables:
  # No route_localnet sysctl: NodePorts are not served on 127.0.0.1.
  localhostNodePorts: false
conntrack:
  # Leave the machine's conntrack sysctls as they are.
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}

# render_manifest FILE: a manifest of e2e/cluster/manifests with the
# cluster's values filled in.
render_manifest() {
  sed -e "s|@COREDNS_IMAGE@|$coredns_image|g" \
    -e "s|@DNS_SERVICE_IP@|$dns_service_ip|g" \
    -e "s|@CLUSTER_DOMAIN@|$cluster_domain|g" \
    "$cluster_dir/manifests/$1"
}
