# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/cluster/cluster.sh and smoke.sh, which source it with the other lib/ files
# The cluster's own images: the pod sandbox (our pause), CoreDNS, and a
# toolbox for tests (Debian's static busybox and our probe); written with
# e2e/images and loaded into containerd's k8s.io namespace (sourced by
# cluster.sh after build.sh).
# shellcheck shell=bash

images_script_dir="$(cd "$cluster_dir/../images" && pwd)"
busybox_binary=/bin/busybox

short_hash() { sha256sum "$@" | sha256sum | cut -c1-12; }

pause_fingerprint="$(short_hash "$cluster_dir/pause/pause.c")"
pause_bin="$tools_dir/pause-$pause_fingerprint/bin"
# Each tag carries a fingerprint of what the image was made from, so an
# edited source gives a new name and the pods using it roll.
pause_image="kiln.local/cluster/pause:$pause_fingerprint"
coredns_image="kiln.local/cluster/coredns:$coredns_version-$(short_hash "$cluster_dir/coredns/main.go" "$cluster_dir/coredns/go.sum")"
probe_bin="$tools_dir/kiln-cluster-probe/bin"
# The toolbox's tag is known once the probe is built (toolbox_image_name).
toolbox_image=""
toolbox_image_name() {
  printf 'kiln.local/cluster/toolbox:%s\n' "$(short_hash "$busybox_binary" "$probe_bin/probe")"
}
images_cache="$tools_dir/kiln-cluster-images"

build_pause() {
  [ -x "$pause_bin/pause" ] && return
  log "compiling the pause program into $pause_bin"
  mkdir -p "$pause_bin.partial"
  gcc -static -Os -Wall -Wextra -Werror -o "$pause_bin.partial/pause" "$cluster_dir/pause/pause.c"
  strip "$pause_bin.partial/pause"
  rm -rf "$pause_bin"
  mv "$pause_bin.partial" "$pause_bin"
}

# image_archive NAME: where the archive of image NAME is cached.
image_archive() { printf '%s/%s.tar\n' "$images_cache" "$(printf '%s' "$1" | tr '/:' '__')"; }

# write_image NAME ROOTFS OCI-IMAGE-ARGS...: the archive of NAME from
# ROOTFS, unless cached. The rootfs directory is removed afterwards.
write_image() {
  local name="$1" rootfs="$2" archive
  shift 2
  archive="$(image_archive "$name")"
  if [ ! -f "$archive" ]; then
    mkdir -p "$images_cache"
    SOURCE_DATE_EPOCH=0 python3 "$images_script_dir/oci-image.py" --name "$name" --rootfs "$rootfs" \
      --output "$archive.partial" \
      --annotation "org.opencontainers.image.title=${name%:*}" \
      --annotation "org.opencontainers.image.description=kiln test cluster (e2e/cluster)" "$@" >/dev/null
    mv "$archive.partial" "$archive"
    log "wrote $name ($(du -h "$archive" | cut -f1)) to $archive"
  fi
  rm -rf "$rootfs"
}

build_images() {
  local rootfs
  build_pause
  rootfs="$(mktemp -d)"
  install -D -m 0755 "$pause_bin/pause" "$rootfs/pause"
  write_image "$pause_image" "$rootfs" --entrypoint '["/pause"]' --user 65535:65535

  rootfs="$(mktemp -d)"
  "$images_script_dir/rootfs.sh" "$rootfs" "$coredns_bin/coredns=/coredns"
  write_image "$coredns_image" "$rootfs" --entrypoint '["/coredns"]' --user 65532:65532 \
    --expose 53/udp --expose 53/tcp \
    --annotation "org.opencontainers.image.version=$coredns_version"

  # The probe resolves names with Go's resolver: busybox's static glibc
  # cannot (its NSS modules are not in the image), and its nslookup ignores
  # the search path.
  CGO_ENABLED=0 build_go_tool probe "$(dirname "$probe_bin")" probe -- .
  toolbox_image="$(toolbox_image_name)"
  rootfs="$(mktemp -d)"
  "$images_script_dir/rootfs.sh" "$rootfs" "$busybox_binary=/bin/busybox" "$probe_bin/probe=/bin/probe"
  write_image "$toolbox_image" "$rootfs" --entrypoint '["/bin/busybox"]' --cmd '["sh"]' \
    --user 65532:65532 --owner /home/nonroot=65532:65532
}

# The manifest digest an archive's index names, and the one containerd
# holds under the same name: equal means the image is loaded already.
archive_digest() {
  python3 -c 'import json, sys, tarfile
print(json.load(tarfile.open(sys.argv[1]).extractfile("index.json"))["manifests"][0]["digest"])' "$1"
}
loaded_digest() {
  ctr --address "$cri_socket" --namespace k8s.io images list "name==$1" 2>/dev/null |
    awk 'NR > 1 { print $3 }'
}

load_images() {
  local name archive
  for name in "$pause_image" "$coredns_image" "$toolbox_image"; do
    archive="$(image_archive "$name")"
    [ -f "$archive" ] || continue
    [ "$(loaded_digest "$name")" = "$(archive_digest "$archive")" ] && continue
    CONTAINERD_ADDRESS="$cri_socket" "$images_script_dir/load.sh" "$archive" >/dev/null
    log "loaded $name into containerd (k8s.io)"
  done
}
