#!/usr/bin/env bash
# Build Kiln's three images as OCI archives from this checkout's binaries (release by default), with the
# layout the Containerfiles declare (store/, agent/, operator/Containerfile;
# e2e/images/check-containerfiles.py compares the two routes).
#
# Usage:
#   e2e/images/build.sh [--out DIR] [--profile release|dev] [--skip-build]
#     --out DIR       where the archives go (default $CARGO_TARGET_DIR/images)
#     --profile NAME  the cargo profile of the binaries (default release). `./kiln-dev test`
#                     passes dev: its tests have built those already, where a cold release
#                     build of the three compiles every dependency a second time
#     --skip-build    use the binaries already in $CARGO_TARGET_DIR/<profile's directory>
# Writes DIR/kiln-{operator,store,agent}.tar, images ghcr.io/kiln-dev/kiln-*:<workspace
# version> (KILN_IMAGE_REPOSITORY replaces the ghcr.io/kiln-dev prefix), and DIR/sizes.tsv.
# The creation time is the HEAD commit's (or $SOURCE_DATE_EPOCH), so a rebuild of the same
# commit with the same toolchain gives the same archives.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"

die() { printf 'images: %s\n' "$*" >&2; exit 1; }

target_dir="${CARGO_TARGET_DIR:-$repo/target}"
out_dir=""
build=1
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out_dir="$2"; shift 2 ;;
    --out=*) out_dir="${1#--out=}"; shift ;;
    --profile) [ $# -ge 2 ] || die "--profile needs release or dev"; profile="$2"; shift 2 ;;
    --profile=*) profile="${1#--profile=}"; shift ;;
    --skip-build) build=0; shift ;;
    *) die "unknown argument $1 (usage: build.sh [--out DIR] [--profile release|dev] [--skip-build])" ;;
  esac
done
case "$profile" in
  release) profile_dir=release ;;
  dev) profile_dir=debug ;;
  *) die "--profile $profile: release or dev" ;;
esac
out_dir="${out_dir:-$target_dir/images}"
prefix="${KILN_IMAGE_REPOSITORY:-ghcr.io/kiln-dev}"

# Version, license and source from the workspace's [workspace.package].
read -r version license source_url < <(python3 -c '
import sys, tomllib
with open(sys.argv[1], "rb") as manifest:
    package = tomllib.load(manifest)["workspace"]["package"]
print(package["version"], package.get("license", ""), package.get("repository", ""))
' "$repo/Cargo.toml")
[ -n "$version" ] || die "no [workspace.package] version in Cargo.toml"

if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  revision="$(git -C "$repo" rev-parse HEAD)"
  # Uncommitted changes would make the revision a lie; say so in it.
  [ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ] || revision="$revision-dirty"
  # Not exported: cc-built dependencies rerun their build scripts (and everything above them
  # recompiles) when SOURCE_DATE_EPOCH changes; the time reaches oci-image.py as --created.
  epoch="${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct)}"
else
  revision="${KILN_REVISION:-unknown}"
  epoch="${SOURCE_DATE_EPOCH:-}"
  [ -n "$epoch" ] || die "not a git checkout: set SOURCE_DATE_EPOCH"
fi
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"

if [ "$build" = 1 ]; then
  # The agent's build.rs compiles bpf/*.bpf.c with clang (agent/Containerfile uses clang-16).
  export KILN_CLANG="${KILN_CLANG:-clang-16}"
  cargo build --profile "$profile" --locked \
    -p kiln-operator --bin kiln-operator -p kiln-store --bin kiln-store -p kiln-agent --bin kiln-agent
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out_dir"

# Base environment of gcr.io/distroless/cc-debian12, which the Containerfiles start from.
base_env=(
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
)

# image COMPONENT [oci-image.py options...]: one image with /usr/local/bin/kiln-COMPONENT.
image() {
  local component="$1"; shift
  local binary="$target_dir/$profile_dir/kiln-$component" rootfs="$work/$component"
  [ -x "$binary" ] || die "$binary is missing (run without --skip-build)"
  "$here/rootfs.sh" "$rootfs" "$binary=/usr/local/bin/kiln-$component"
  # Both profiles keep line tables (debug = "line-tables-only"), five sixths of the
  # binary. The image drops them and keeps the symbol table, so backtraces and Kiln's own
  # profiles still name functions; the target directory keeps the full binary. The Containerfiles
  # do the same.
  objcopy --strip-debug "$rootfs/usr/local/bin/kiln-$component"
  if [ "$component" = store ]; then install -d -m 0755 "$rootfs/var/lib/kiln"; fi
  "$here/oci-image.py" \
    --name "$prefix/kiln-$component:$version" \
    --rootfs "$rootfs" --output "$out_dir/kiln-$component.tar" --created "$created" \
    --entrypoint "[\"/usr/local/bin/kiln-$component\"]" \
    "${base_env[@]}" "$@" \
    --label "org.opencontainers.image.title=kiln-$component" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$revision" \
    --label "org.opencontainers.image.created=$created" \
    --label "org.opencontainers.image.source=$source_url" \
    --label "org.opencontainers.image.licenses=$license" \
    --annotation "org.opencontainers.image.title=kiln-$component" \
    --annotation "org.opencontainers.image.version=$version" \
    --annotation "org.opencontainers.image.revision=$revision" \
    --annotation "org.opencontainers.image.created=$created" \
    --annotation "org.opencontainers.image.source=$source_url" \
    --annotation "org.opencontainers.image.licenses=$license" \
    >/dev/null
  printf '%s\t%s\t%s\t%s\n' "$prefix/kiln-$component:$version" "$out_dir/kiln-$component.tar" \
    "$(stat -c %s "$out_dir/kiln-$component.tar")" \
    "$(find "$rootfs" -type f -printf '%s\n' | awk '{ total += $1 } END { print total }')" \
    >>"$work/sizes.tsv"
}

printf 'image\tarchive\tarchive_bytes\tunpacked_bytes\n' >"$work/sizes.tsv"
image operator --user 65532:65532 --workdir /home/nonroot --expose 8080 \
  --owner /home/nonroot=65532:65532
image store --user 65532:65532 --workdir /home/nonroot --expose 7470 \
  --env KILN_LISTEN=0.0.0.0:7470 --env KILN_DATA_DIR=/var/lib/kiln \
  --owner /home/nonroot=65532:65532 --owner /var/lib/kiln=65532:65532
# The agent runs as root: the pod's securityContext grants its kernel access.
image agent --user 0:0 --workdir / --owner /home/nonroot=65532:65532
cp "$work/sizes.tsv" "$out_dir/sizes.tsv"
column -t -s $'\t' "$out_dir/sizes.tsv"
# Both routes must give the same layout: fail here rather than publish a differing image.
"$here/check-containerfiles.py" "$out_dir" "$repo"
