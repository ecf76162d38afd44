#!/usr/bin/env bash
# Builds helm from helm.sh/helm/v3 at the release go.mod pins, with this machine's Go and
# modules from the Go module proxy only, into $KILN_TOOLS_DIR/helm-<version>/bin/helm, and
# prints that path. A build already there is reused, so only the first run compiles.
set -euo pipefail

module_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tools_dir="${KILN_TOOLS_DIR:-/var/tmp/kiln-tools}"

required_version() {
  awk -v module="$1" '$1 == module { print $2 }' "$module_dir/go.mod"
}
version="$(required_version helm.sh/helm/v3)"
[ -n "$version" ] || { echo "helm.sh/helm/v3 is not required in $module_dir/go.mod" >&2; exit 1; }
prefix="$tools_dir/helm-$version"
if [ -x "$prefix/bin/helm" ]; then
  echo "$prefix/bin/helm"
  exit 0
fi

# helm's go.mod asks for Go 1.26; Debian's golang-go is older, so the machine's own Go comes
# first, and GOTOOLCHAIN=local keeps go from fetching another toolchain.
export PATH="/usr/local/go/bin:$PATH"
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly
export GOMODCACHE="${GOMODCACHE:-$tools_dir/go/mod}" GOCACHE="${GOCACHE:-$tools_dir/go/cache}"
command -v go >/dev/null || { echo "go is required to build helm (Go 1.26 or newer)" >&2; exit 1; }

# The same link-time values as helm's own Makefile for a tagged release: its version, and
# the Kubernetes version that `helm template` and `helm lint` assume without a cluster,
# taken from the client-go release helm is built with (v0.37.x -> 1.37).
client_go="$(required_version k8s.io/client-go)"
kube_minor="$(echo "$client_go" | cut -d. -f2)"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version
  -X helm.sh/helm/v3/internal/version.metadata=
  -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1
  -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$kube_minor
  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1
  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kube_minor"

echo "building helm $version with $(go version) into $prefix (first run only)" >&2
started=$SECONDS
mkdir -p "$prefix/bin"
# Built next to its final name and renamed, so an interrupted build leaves no helm behind.
# The partial name is this process's own: ./kiln-dev test may build helm in the background
# and in the foreground at once, and each rename then puts a whole binary in place.
partial="$prefix/bin/helm.partial.$$"
(cd "$module_dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
  -o "$partial" helm.sh/helm/v3/cmd/helm)
mv -f "$partial" "$prefix/bin/helm"
echo "built helm $version in $((SECONDS - started)) s" >&2
echo "$prefix/bin/helm"
