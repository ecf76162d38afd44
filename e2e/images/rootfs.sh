#!/usr/bin/env bash
# Fill a root filesystem directory for a distroless-style image: programs with exactly the
# shared libraries they load, the base files a glibc program expects, nothing else.
#
# Usage:
#   e2e/images/rootfs.sh ROOTFS [SOURCE=/PATH/IN/IMAGE ...]
#
# For each SOURCE=/PATH pair the program SOURCE is copied to ROOTFS/PATH (mode 0755), with
# every library `ldd SOURCE` lists and the ELF loader, each copied (symlinks resolved) to the
# path ldd names (e.g. /lib/x86_64-linux-gnu/libc.so.6, /lib64/ld-linux-x86-64.so.2); a
# static program brings no libraries. Always written:
#   /etc/passwd, /etc/group   root (0), nobody (65534), nonroot (65532), home /home/nonroot
#   /etc/nsswitch.conf        hosts from files, then DNS
#   /etc/ssl/certs/ca-certificates.crt   this machine's CA bundle (Debian: ca-certificates)
#   /tmp (1777), /home/nonroot (0700; give it to 65532 with oci-image.py --owner)
# ROOTFS is created if missing; files already in it are kept (add data directories etc.
# before or after). Owners are not set here: oci-image.py assigns them in the layer.
set -euo pipefail

die() { printf 'rootfs.sh: %s\n' "$*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: rootfs.sh ROOTFS [SOURCE=/PATH/IN/IMAGE ...]"
rootfs="$1"; shift
ca_bundle="${KILN_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

mkdir -p "$rootfs"
install -d -m 0755 "$rootfs/etc" "$rootfs/etc/ssl" "$rootfs/etc/ssl/certs" "$rootfs/home"
install -d -m 1777 "$rootfs/tmp"
install -d -m 0700 "$rootfs/home/nonroot"

printf '%s\n' \
  'root:x:0:0:root:/root:/sbin/nologin' \
  'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
  'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' > "$rootfs/etc/passwd"
printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' > "$rootfs/etc/group"
printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' > "$rootfs/etc/nsswitch.conf"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/nsswitch.conf"

[ -f "$ca_bundle" ] || die "no CA bundle at $ca_bundle (install ca-certificates or set KILN_CA_BUNDLE)"
install -m 0644 "$ca_bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"

# Paths of the libraries and loader one program needs, as ldd prints them.
needed_libraries() {
  local program="$1" output
  # ldd exits 1 on a static program ("not a dynamic executable"): no libraries then.
  if ! output="$(LC_ALL=C ldd "$program" 2>&1)"; then
    case "$output" in
      *"not a dynamic executable"*|*"statically linked"*) return 0 ;;
      *) die "ldd $program failed: $output" ;;
    esac
  fi
  case "$output" in *"statically linked"*) return 0 ;; esac
  if grep -q 'not found' <<<"$output"; then
    die "ldd $program: missing libraries: $(grep 'not found' <<<"$output" | tr -s ' \t' ' ')"
  fi
  # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and "/lib64/ld-linux-x86-64.so.2 (0x...)";
  # linux-vdso has no file.
  awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$output"
}

for pair in "$@"; do
  source_path="${pair%%=*}"
  image_path="${pair#*=}"
  if [ "$source_path" = "$pair" ] || [ "${image_path#/}" = "$image_path" ]; then
    die "$pair: expected SOURCE=/PATH/IN/IMAGE"
  fi
  [ -f "$source_path" ] || die "$source_path: no such file"
  install -D -m 0755 "$source_path" "$rootfs$image_path"
  libraries="$(needed_libraries "$source_path")"
  for library in $libraries; do
    install -D -m 0755 "$(readlink -f "$library")" "$rootfs$library"
  done
done
