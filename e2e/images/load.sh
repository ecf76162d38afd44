#!/usr/bin/env bash
# Import OCI image archives into containerd's k8s.io namespace, the one the kubelet's CRI
# uses, under the full names the archives carry (io.containerd.image.name), and unpack them
# for the snapshotter, so pods with imagePullPolicy IfNotPresent or Never start without a pull.
#
# Usage:
#   e2e/images/load.sh ARCHIVE...
# Environment:
#   CONTAINERD_ADDRESS     containerd's socket (default /run/containerd/containerd.sock)
#   CONTAINERD_NAMESPACE   namespace (default k8s.io)
#   CONTAINERD_SNAPSHOTTER snapshotter to unpack for (default: containerd's default, overlayfs)
# Prints each imported name; fails if an archive names no image or containerd does not list
# an image after the import.
set -euo pipefail

die() { printf 'load.sh: %s\n' "$*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: load.sh ARCHIVE..."
address="${CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}"
namespace="${CONTAINERD_NAMESPACE:-k8s.io}"
[ -S "$address" ] || die "no containerd socket at $address (set CONTAINERD_ADDRESS)"

ctr_cmd=(ctr --address "$address" --namespace "$namespace")
import_flags=()
[ -n "${CONTAINERD_SNAPSHOTTER:-}" ] && import_flags+=(--snapshotter "$CONTAINERD_SNAPSHOTTER")

# The names an archive's index.json declares (python3 reads the tar without unpacking it).
archive_names() {
  python3 - "$1" <<'PY'
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as archive:
    member = archive.extractfile("index.json")
    if member is None:
        sys.exit(f"{sys.argv[1]}: no index.json (not an OCI archive)")
    index = json.load(member)
for manifest in index.get("manifests", []):
    name = manifest.get("annotations", {}).get("io.containerd.image.name")
    if name:
        print(name)
PY
}

for archive in "$@"; do
  [ -f "$archive" ] || die "$archive: no such file"
  names="$(archive_names "$archive")" || die "$archive: cannot read its index.json"
  [ -n "$names" ] || die "$archive: its index names no image (io.containerd.image.name)"
  "${ctr_cmd[@]}" images import "${import_flags[@]}" "$archive" >/dev/null \
    || die "ctr images import $archive failed"
  for name in $names; do
    "${ctr_cmd[@]}" images list --quiet "name==$name" | grep -qxF "$name" \
      || die "$name: not listed in namespace $namespace after importing $archive"
    printf '%s\n' "$name"
  done
done
