# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/cluster/cluster.sh and smoke.sh, which source it with the other lib/ files
# Builds the cluster's binaries from upstream Go modules and its images, each
# cached outside the clone (sourced by cluster.sh after common.sh).
# shellcheck shell=bash

go_binary() {
  # The machine's Go (1.26 here); Debian's golang-go is too old for these modules.
  if [ -x /usr/local/go/bin/go ]; then
    printf '%s\n' /usr/local/go/bin/go
  elif command -v go >/dev/null; then
    command -v go
  else
    die "no Go toolchain: install Go 1.26 (/usr/local/go/bin/go)"
  fi
}

# The fingerprint of what a cached build was made from: the module's files,
# the Go release, whether cgo is on and the version stamps linked in
# ($version_ldflags). A cache whose fingerprint differs is rebuilt.
source_fingerprint() {
  local module_dir="$cluster_dir/$1"
  {
    "$(go_binary)" env GOVERSION CGO_ENABLED
    printf '%s\n' "${version_ldflags:-}"
    cd "$module_dir" &&
      find . -maxdepth 1 -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) -exec sha256sum {} + |
      LC_ALL=C sort -k2
  } | sha256sum | cut -d' ' -f1
}

# build_go_tool MODULE_DIR CACHE_DIR BINARY... -- PACKAGE...: builds the
# packages of the module of ours in e2e/cluster/MODULE_DIR into
# CACHE_DIR/bin unless the cache holds every BINARY from the same sources.
# Built into a sibling directory first and renamed, so an interrupted build
# never looks complete.
build_go_tool() {
  local module_dir="$1" cache="$2"
  shift 2
  local binaries=() packages=() fingerprint binary complete=1 started
  while [ "$1" != -- ]; do binaries+=("$1"); shift; done
  shift
  packages=("$@")
  fingerprint="$(source_fingerprint "$module_dir")"
  for binary in "${binaries[@]}"; do
    [ -x "$cache/bin/$binary" ] || complete=0
  done
  if [ "$complete" = 1 ] && [ "$(cat "$cache/.source-sha256" 2>/dev/null)" = "$fingerprint" ]; then
    return
  fi
  log "building ${binaries[*]} from e2e/cluster/$module_dir into $cache (log $logs_dir/build-$module_dir.log)"
  mkdir -p "$logs_dir" "$tools_dir/go"
  rm -rf "$cache.partial"
  mkdir -p "$cache.partial/bin"
  started=$SECONDS
  if ! (
    cd "$cluster_dir/$module_dir" &&
      GOMODCACHE="$tools_dir/go/mod" GOCACHE="$tools_dir/go/cache" GOTOOLCHAIN=local \
        GOFLAGS=-mod=mod \
        nice -n 5 "$(go_binary)" build -trimpath -ldflags="-s -w ${version_ldflags:-}" -o "$cache.partial/bin/" "${packages[@]}"
  ) >"$logs_dir/build-$module_dir.log" 2>&1; then
    tail -n 30 "$logs_dir/build-$module_dir.log" >&2
    die "building e2e/cluster/$module_dir failed; see $logs_dir/build-$module_dir.log"
  fi
  for binary in "${binaries[@]}"; do
    [ -x "$cache.partial/bin/$binary" ] || die "the build of e2e/cluster/$module_dir made no $binary"
  done
  printf '%s\n' "$fingerprint" >"$cache.partial/.source-sha256"
  rm -rf "$cache"
  mv "$cache.partial" "$cache"
  log "built ${binaries[*]} in $((SECONDS - started))s"
}

build_binaries() {
  local minor="${kubernetes_version#v1.}"
  minor="${minor%%.*}"
  # What upstream's release build stamps in (hack/lib/version.sh): without
  # it every component reports v0.0.0-master, and version checks (kubectl's
  # skew warning, charts' kubeVersion) go wrong.
  local stamp kubernetes_ldflags=""
  for stamp in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kubernetes_ldflags+=" -X $stamp.gitVersion=$kubernetes_version -X $stamp.gitMajor=1"
    kubernetes_ldflags+=" -X $stamp.gitMinor=$minor -X $stamp.gitTreeState=archive"
  done
  version_ldflags="$kubernetes_ldflags" build_go_tool kubernetes "$(dirname "$kubernetes_bin")" \
    kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl -- \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl
  build_go_tool etcd "$(dirname "$etcd_bin")" etcd -- .
  # CoreDNS goes into an image that holds nothing but its binary: static.
  CGO_ENABLED=0 build_go_tool coredns "$(dirname "$coredns_bin")" coredns -- .
  version_ldflags="-X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version" \
    build_go_tool crictl "$(dirname "$crictl_bin")" crictl -- sigs.k8s.io/cri-tools/cmd/crictl
}
