#!/usr/bin/env bash
# Tests of the image tooling that need no release build (run by ./kiln-dev test):
#   - oci-image.py writes byte-identical archives for the same input and time, and different
#     ones for another time;
#   - it refuses bad input with a message, writing nothing;
#   - build.sh's layout matches the Containerfiles (check-containerfiles.py passes), with
#     busybox standing in for the three release binaries, and the check fails once a
#     Containerfile says otherwise (USER, ENV, a COPY destination's owner).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
busybox=/bin/busybox
[ -x "$busybox" ] || { echo "selftest: $busybox is missing (./kiln-dev installs busybox-static)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { printf 'selftest FAILED: %s\n' "$*" >&2; exit 1; }
pass() { printf 'ok: %s\n' "$*"; }

"$here/rootfs.sh" "$work/rootfs" "$busybox=/bin/busybox"
for dep in /etc/passwd /etc/group /etc/ssl/certs/ca-certificates.crt /bin/busybox; do
  [ -f "$work/rootfs$dep" ] || fail "rootfs.sh wrote no $dep"
done
grep -qx 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' "$work/rootfs/etc/passwd" \
  || fail "no nonroot user in /etc/passwd"
# A dynamic program brings its libraries and loader.
"$here/rootfs.sh" "$work/dynamic" "/usr/bin/env=/usr/bin/env"
[ -f "$work/dynamic/lib64/ld-linux-x86-64.so.2" ] && [ -f "$work/dynamic/lib/x86_64-linux-gnu/libc.so.6" ] \
  || [ "$(uname -m)" != x86_64 ] || fail "rootfs.sh copied no loader or libc for /usr/bin/env"

build_busybox() {
  SOURCE_DATE_EPOCH="$1" "$here/oci-image.py" --name docker.io/kiln/selftest:1 \
    --rootfs "$work/rootfs" --output "$2" --entrypoint '["/bin/busybox"]' \
    --user 65532:65532 --owner /home/nonroot=65532:65532 >/dev/null
}
build_busybox 1700000000 "$work/a.tar"
build_busybox 1700000000 "$work/b.tar"
build_busybox 1700000001 "$work/c.tar"
cmp -s "$work/a.tar" "$work/b.tar" || fail "two builds of the same input differ"
! cmp -s "$work/a.tar" "$work/c.tar" || fail "builds at different times are identical"
pass "oci-image.py is reproducible"

mkfifo "$work/rootfs/fifo"
if "$here/oci-image.py" --name docker.io/kiln/selftest:1 --rootfs "$work/rootfs" \
    --output "$work/fifo.tar" 2>"$work/err"; then
  fail "a FIFO in the rootfs was accepted"
fi
grep -q 'not a regular file, directory or symlink' "$work/err" || fail "unclear error: $(cat "$work/err")"
[ ! -e "$work/fifo.tar" ] || fail "a refused build left an archive"
rm "$work/rootfs/fifo"
for bad in "--owner home=1:1" "--entrypoint /bin/sh" "--env NOVALUE" "--name no-tag" \
    "--compress-level 0"; do
  read -r flag value <<<"$bad"
  args=(--name docker.io/kiln/selftest:1 --rootfs "$work/rootfs" --output "$work/bad.tar")
  [ "$flag" = --name ] && args=(--rootfs "$work/rootfs" --output "$work/bad.tar")
  if "$here/oci-image.py" "${args[@]}" "$flag" "$value" 2>"$work/err"; then
    fail "oci-image.py accepted $bad"
  fi
  grep -q "^oci-image: $flag" "$work/err" || fail "$bad: unclear error: $(cat "$work/err")"
done
pass "oci-image.py refuses bad input"

# build.sh with busybox as each release binary: the layout must match the Containerfiles.
mkdir -p "$work/target/release"
for component in operator store agent; do
  install -m 0755 "$busybox" "$work/target/release/kiln-$component"
done
CARGO_TARGET_DIR="$work/target" "$here/build.sh" --skip-build --out "$work/images" >/dev/null
"$here/check-containerfiles.py" "$work/images" "$repo" >/dev/null || fail "check-containerfiles.py failed"
pass "build.sh's images match the Containerfiles"

# Each edit of a Containerfile must make the check fail.
mutate() {
  local component="$1" expression="$2" copy="$work/mutated"
  rm -rf "$copy"
  for c in operator store agent; do mkdir -p "$copy/$c"; cp "$repo/$c/Containerfile" "$copy/$c/"; done
  sed -i "$expression" "$copy/$component/Containerfile"
  cmp -s "$repo/$component/Containerfile" "$copy/$component/Containerfile" \
    && fail "mutation $expression changed nothing in $component/Containerfile"
  if "$here/check-containerfiles.py" "$work/images" "$copy" 2>/dev/null; then
    fail "check-containerfiles.py passed with $component/Containerfile edited by $expression"
  fi
}
mutate store 's/^USER 65532:65532/USER 1000:1000/'
mutate store 's|KILN_DATA_DIR=/var/lib/kiln|KILN_DATA_DIR=/data|'
mutate store 's|--chown=65532:65532 /out/data|/out/data|'
mutate operator 's/^EXPOSE 8080/EXPOSE 9090/'
mutate agent 's/^USER 0:0/USER 65532:65532/'
mutate agent 's|^ENTRYPOINT .*|ENTRYPOINT ["/kiln-agent"]|'
pass "check-containerfiles.py fails on a differing Containerfile"
