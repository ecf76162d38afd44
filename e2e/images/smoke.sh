#!/usr/bin/env bash
# Run the built images for real on containerd: load them with load.sh, start the store image
# (host network, a fresh data directory) and ask its /healthz, and run the operator's and the
# agent's --help. Needs root, containerd, ctr, runc and curl.
#
# Usage:
#   e2e/images/smoke.sh [IMAGES_DIR]     (default $CARGO_TARGET_DIR/images)
# With CONTAINERD_ADDRESS set, that containerd is used; otherwise a throwaway containerd is
# started on its own root, state and socket and removed afterwards. Containers, snapshots,
# mounts and temporary directories it creates are removed on exit, pass or fail.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
images_dir="${1:-${CARGO_TARGET_DIR:-$here/../../target}/images}"
die() { printf 'smoke: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (containerd)"
for tool in containerd ctr runc curl python3; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
for component in operator store agent; do
  [ -f "$images_dir/kiln-$component.tar" ] || die "$images_dir/kiln-$component.tar is missing (./kiln-dev images)"
done

work="$(mktemp -d /var/tmp/kiln-smoke.XXXXXX)"
containerd_pid=""
containers=()
cleanup() {
  local id
  set +e  # best effort: undo everything even where one step fails
  for id in "${containers[@]}"; do
    ctr_ns task kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    for _ in $(seq 50); do
      ctr_ns task ls -q 2>/dev/null | grep -qxF "$id" || break
      ctr_ns task rm -f "$id" >/dev/null 2>&1 || sleep 0.1
    done
    ctr_ns container rm "$id" >/dev/null 2>&1 || true
  done
  if [ -n "$containerd_pid" ]; then
    kill "$containerd_pid" 2>/dev/null || true
    wait "$containerd_pid" 2>/dev/null || true
    # Snapshot mounts of a killed containerd stay behind; remove them before the directories.
    grep -F " $work/" /proc/self/mounts | awk '{ print $2 }' | sort -r | while read -r mount; do
      umount -l "$mount" 2>/dev/null || true
    done
  fi
  rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${CONTAINERD_ADDRESS:-}" ]; then
  address="$CONTAINERD_ADDRESS"
else
  address="$work/containerd.sock"
  cat >"$work/config.toml" <<EOF
version = 2
root = "$work/root"
state = "$work/state"
[grpc]
  address = "$address"
[ttrpc]
  address = "$address.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
EOF
  containerd --config "$work/config.toml" >"$work/containerd.log" 2>&1 &
  containerd_pid=$!
  for _ in $(seq 100); do [ -S "$address" ] && break; sleep 0.1; done
  [ -S "$address" ] || die "containerd did not start: $(tail -5 "$work/containerd.log")"
fi
ctr_ns() { ctr --address "$address" --namespace k8s.io "$@"; }

names="$(CONTAINERD_ADDRESS="$address" "$here/load.sh" "$images_dir"/kiln-{operator,store,agent}.tar)"
name_of() { grep -E "/kiln-$1:" <<<"$names"; }
echo "loaded: $(tr '\n' ' ' <<<"$names")"

# The operator and the agent start, find their libraries and answer --help.
for component in operator agent; do
  id="kiln-smoke-$component-$$"
  containers+=("$id")
  output="$(ctr_ns run --rm "$(name_of "$component")" "$id" "/usr/local/bin/kiln-$component" --help)" \
    || die "kiln-$component --help failed in its image: $output"
  grep -q '^Usage: kiln-' <<<"$output" || die "kiln-$component --help printed no usage: $output"
  echo "ok: kiln-$component --help runs in its image"
done

# The store serves /healthz from its image as 65532, on a data directory it owns.
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
install -d -o 65532 -g 65532 "$work/data"
id="kiln-smoke-store-$$"
containers+=("$id")
ctr_ns run -d --net-host --env "KILN_LISTEN=127.0.0.1:$port" \
  --mount "type=bind,src=$work/data,dst=/var/lib/kiln,options=rbind:rw" \
  "$(name_of store)" "$id" >/dev/null
healthy=""
for _ in $(seq 300); do
  if curl -fsS "http://127.0.0.1:$port/healthz" >"$work/healthz" 2>/dev/null; then healthy=1; break; fi
  if ! ctr_ns task ls | grep -E "^$id " | grep -q RUNNING; then
    die "the store container stopped: $(ctr_ns task ls | grep -E "^$id " || true)"
  fi
  sleep 0.2
done
[ -n "$healthy" ] || die "the store did not answer /healthz on 127.0.0.1:$port"
owner="$(stat -c %u:%g "$work/data")"
[ -n "$(ls -A "$work/data")" ] || die "the store wrote nothing into its data directory"
user="$(ctr_ns task ps "$id" | awk 'NR == 2 { print $1 }' | xargs -r -I{} stat -c %u /proc/{})"
[ "$user" = 65532 ] || die "the store runs as uid '$user', not 65532"
echo "ok: kiln-store answers /healthz ($(head -c 80 "$work/healthz")) as uid 65532, data dir $owner"
