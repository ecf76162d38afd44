#!/usr/bin/env bash
# The OpenTelemetry eBPF profiler into Kiln (issue 51, docs/benchmarks.md row
# otel.symbols): the peer profiles the whole host at 19 Hz and sends OTLP to a
# throw-away kiln-store, while Debian's xz compresses 64 MiB of random bytes.
# The peer names no native frame: it sends each as build id and address, and
# Debian's liblzma is stripped to its dynamic symbols. The script reads the
# share of xz's samples naming lzma_code from the store's folded answer
# before and after `kiln debuginfo upload` of the host's liblzma (the same
# query of the same, earlier data), and prints both.
#
# Usage (root): agent/bench/peer_otel_symbols.sh
#   env: KILN_STORE, KILN_CLI (debug builds made here when unset),
#        SECONDS_BUSY (40), OTEL_PROFILER_VERSION (see lib.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=agent/bench/lib.sh
. "$here/lib.sh"
busy="${SECONDS_BUSY:-40}"
peer="$(build_otel_peer)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/kiln-target}"
if [ -z "${KILN_STORE:-}" ] || [ -z "${KILN_CLI:-}" ]; then
  cargo build -q -p kiln-store -p kiln-cli --manifest-path "$repo/Cargo.toml"
  KILN_STORE="${KILN_STORE:-$CARGO_TARGET_DIR/debug/kiln-store}"
  KILN_CLI="${KILN_CLI:-$CARGO_TARGET_DIR/debug/kiln}"
fi
liblzma="$(readlink -f /usr/lib/x86_64-linux-gnu/liblzma.so.5)"

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  pkill -x xz 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
head -c 64M /dev/urandom >"$work/input"

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
store="http://127.0.0.1:$port"
"$KILN_STORE" --listen "127.0.0.1:$port" --data-dir "$work/data" >"$work/store.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "$store/readyz" >/dev/null && break; sleep 0.2; done
curl -sf "$store/readyz" >/dev/null || { tail -20 "$work/store.log"; exit 1; }
"$peer" -samples-per-second 19 -collection-agent "127.0.0.1:$port" -disable-tls \
  >"$work/peer.log" 2>&1 &
peer_pid=$!
pids+=("$peer_pid")
sleep 15 # the peer loads its programs and reads the host's processes
from="$(date +%s)"
(while :; do xz -9 -T1 -c <"$work/input" >/dev/null; done) &
pids+=($!)
sleep "$busy"
kill "${pids[-1]}"
pkill -x xz || true
to="$(date +%s)"
sleep 15 # the peer's last report reaches the store
kill -TERM "$peer_pid"
wait "$peer_pid" 2>/dev/null || true

folded() {
  curl -sfG "$store/api/v1/folded" -D "$work/$1.headers" \
    --data-urlencode 'query=process_cpu:samples:count:cpu:nanoseconds:delta{}' \
    --data-urlencode "from=$from" --data-urlencode "to=$to" >"$work/$1.folded"
}
# xz's samples: stacks with a frame of xz or liblzma (named or as
# module+offset); of those, the ones naming lzma_code.
share() {
  awk '{
    count = $NF; stack = substr($0, 1, length($0) - length(count) - 1)
    n = split(stack, frames, ";"); xz = 0; named = 0
    for (i = 1; i <= n; i++) {
      if (frames[i] ~ /^xz\+0x/ || frames[i] ~ /^liblzma/ || frames[i] ~ /^lzma_/) xz = 1
      if (frames[i] == "lzma_code") named = 1
    }
    if (xz) { total += count; hits += named * count }
  } END { printf "%d of %d xz samples name lzma_code (%.1f %%)", hits, total, total ? 100 * hits / total : 0 }' \
    "$work/$1.folded"
}
partial() { grep -i '^kiln-partial' "$work/$1.headers" | tr -d '\r' || echo "complete"; }
folded before
"$KILN_CLI" debuginfo upload --store "$store" "$liblzma"
folded after
echo "before the upload: $(share before); $(partial before)"
echo "after the upload:  $(share after); $(partial after)"
