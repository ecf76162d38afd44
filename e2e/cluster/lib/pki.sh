# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/cluster/cluster.sh and smoke.sh, which source it with the other lib/ files
# The cluster's certificates and kubeconfigs, made locally with openssl
# (sourced by cluster.sh after common.sh).
# shellcheck shell=bash

# Two CAs: one for the cluster (apiserver, kubelet, clients) and one that
# only etcd trusts, so no cluster client certificate can talk to etcd.
# Keys are ECDSA P-256. Leaf certificates last a year and are made again on
# an up that finds one expiring within a day or the node's name or address
# changed; the CAs and the service-account key are kept.

make_key() {
  [ -f "$1" ] || (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1")
}

make_ca() {
  local name="$1" common_name="$2"
  make_key "$pki_dir/$name.key"
  [ -f "$pki_dir/$name.crt" ] && return
  openssl req -x509 -new -key "$pki_dir/$name.key" -subj "/CN=$common_name" -days 3650 \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,digitalSignature,keyCertSign,cRLSign" \
    -out "$pki_dir/$name.crt" 2>/dev/null
}

# make_cert NAME CA SUBJECT USAGES [SANS]: NAME.key/NAME.crt signed by CA,
# USAGES being extendedKeyUsage values (serverAuth, clientAuth).
make_cert() {
  local name="$1" ca="$2" subject="$3" usages="$4" sans="${5:-}" extensions
  make_key "$pki_dir/$name.key"
  extensions="$(mktemp)"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    echo "extendedKeyUsage=$usages"
    [ -n "$sans" ] && echo "subjectAltName=$sans"
  } >"$extensions"
  openssl req -new -key "$pki_dir/$name.key" -subj "$subject" 2>/dev/null |
    openssl x509 -req -CA "$pki_dir/$ca.crt" -CAkey "$pki_dir/$ca.key" \
      -set_serial "0x$(openssl rand -hex 16)" -days 365 -extfile "$extensions" \
      -out "$pki_dir/$name.crt" 2>/dev/null
  rm -f "$extensions"
  changed_files+=("$pki_dir/$name.crt" "$pki_dir/$name.key")
}

leaf_certificates=(etcd-server apiserver-etcd-client apiserver apiserver-kubelet-client admin
  controller-manager scheduler kube-proxy kubelet-client kubelet-server)

make_pki() {
  local ip="$1" inputs leaf fresh=1
  mkdir -p "$pki_dir"
  chmod 700 "$pki_dir"
  make_ca ca kiln-cluster-ca
  make_ca etcd-ca kiln-cluster-etcd-ca
  # The service-account token signing key pair.
  make_key "$pki_dir/sa.key"
  [ -f "$pki_dir/sa.pub" ] || openssl pkey -in "$pki_dir/sa.key" -pubout -out "$pki_dir/sa.pub"

  inputs="node=$node_name ip=$ip service_ip=$apiserver_service_ip"
  [ "$(cat "$pki_dir/leaf-inputs" 2>/dev/null)" = "$inputs" ] || fresh=0
  for leaf in "${leaf_certificates[@]}"; do
    [ -f "$pki_dir/$leaf.crt" ] && openssl x509 -in "$pki_dir/$leaf.crt" -noout -checkend 86400 >/dev/null ||
      fresh=0
  done
  [ "$fresh" = 1 ] && return
  log "making the cluster's certificates in $pki_dir"
  make_cert etcd-server etcd-ca "/CN=kiln-cluster-etcd" serverAuth,clientAuth \
    "DNS:localhost,IP:127.0.0.1"
  make_cert apiserver-etcd-client etcd-ca "/CN=kube-apiserver-etcd-client" clientAuth
  make_cert apiserver ca "/CN=kube-apiserver" serverAuth \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$cluster_domain,DNS:localhost,DNS:$node_name,IP:$apiserver_service_ip,IP:127.0.0.1,IP:$ip"
  # The apiserver's identity towards kubelets (logs, exec, port-forward):
  # bound to the system:kubelet-api-admin role after the apiserver starts.
  make_cert apiserver-kubelet-client ca "/CN=kube-apiserver-kubelet-client" clientAuth
  make_cert admin ca "/O=system:masters/CN=kiln-cluster-admin" clientAuth
  make_cert controller-manager ca "/CN=system:kube-controller-manager" clientAuth
  make_cert scheduler ca "/CN=system:kube-scheduler" clientAuth
  make_cert kube-proxy ca "/CN=system:kube-proxy" clientAuth
  make_cert kubelet-client ca "/O=system:nodes/CN=system:node:$node_name" clientAuth
  make_cert kubelet-server ca "/CN=$node_name" serverAuth "DNS:$node_name,IP:$ip,IP:127.0.0.1"
  printf '%s\n' "$inputs" >"$pki_dir/leaf-inputs"
}

# write_kubeconfig FILE CERT_NAME: a kubeconfig for the apiserver on
# loopback, authenticating with pki/CERT_NAME.crt, everything embedded.
write_kubeconfig() {
  local file="$1" cert="$2"
  update_file "$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kiln-cluster
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: $(base64 -w0 "$pki_dir/ca.crt")
users:
- name: $cert
  user:
    client-certificate-data: $(base64 -w0 "$pki_dir/$cert.crt")
    client-key-data: $(base64 -w0 "$pki_dir/$cert.key")
contexts:
- name: kiln-cluster
  context:
    cluster: kiln-cluster
    user: $cert
current-context: kiln-cluster
EOF
}

write_kubeconfigs() {
  write_kubeconfig "$admin_kubeconfig" admin
  write_kubeconfig "$conf_dir/controller-manager.kubeconfig" controller-manager
  write_kubeconfig "$conf_dir/scheduler.kubeconfig" scheduler
  write_kubeconfig "$conf_dir/kube-proxy.kubeconfig" kube-proxy
  write_kubeconfig "$conf_dir/kubelet.kubeconfig" kubelet-client
}
