#!/usr/bin/env bash
# Allocation deltas over an hour (issue 52, docs/benchmarks.md row pprof.hour): two copies
# of the e2e Go workload (e2e/workload/pprof_known.go; "exact" with MemProfileRate = 1, as
# in the e2e suite, "sampled" with Go's default 512 KiB), scraped every 15 s by a
# scrape-only kiln-agent (no privileges) into a local kiln-store. The programs print their
# own allocation counter at every request they serve; after SECONDS, the alloc_space deltas
# stored under main.allocateKnown between the agent's first /allocs scrape and the first
# one SECONDS later are held against the counter (check 8c's bounds: the delta between
# scrapes s_i and s_i+1 is stored at s_i's time).
#
# Usage: agent/bench/pprof_hour.sh [SECONDS]   (default 3600)
#   env: KILN_STORE, KILN_AGENT, KILN_CLI (debug builds made here when unset)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
seconds="${1:-3600}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/kiln-target}"
if [ -z "${KILN_STORE:-}" ] || [ -z "${KILN_AGENT:-}" ] || [ -z "${KILN_CLI:-}" ]; then
  cargo build -q -p kiln-store -p kiln-agent -p kiln-cli --manifest-path "$repo/Cargo.toml"
fi
store_bin="${KILN_STORE:-$CARGO_TARGET_DIR/debug/kiln-store}"
agent_bin="${KILN_AGENT:-$CARGO_TARGET_DIR/debug/kiln-agent}"
kiln="${KILN_CLI:-$CARGO_TARGET_DIR/debug/kiln}"

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

declare -A port
for prog in exact sampled; do
  port[$prog]="$(free_port)"
  mkdir -p "$work/$prog"
  sed "s/Addr: \":6060\"/Addr: \"127.0.0.1:${port[$prog]}\"/" "$repo/e2e/workload/pprof_known.go" >"$work/$prog/main.go"
  if [ "$prog" = sampled ]; then
    sed -i 's/^\(\s*\)runtime.MemProfileRate = 1$/\1\/\/ Go'"'"'s default sampling rate/' "$work/$prog/main.go"
    ! grep -qE '^\s+runtime.MemProfileRate = 1$' "$work/$prog/main.go"
  fi
  (cd "$work/$prog" && go mod init "kilnhour/$prog" >/dev/null 2>&1 && go build -o prog .)
done
store_port="$(free_port)"
store="http://127.0.0.1:$store_port"
"$store_bin" --listen "127.0.0.1:$store_port" --data-dir "$work/data" >"$work/store.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "$store/readyz" >/dev/null && break; sleep 0.2; done
curl -sf "$store/readyz" >/dev/null || { tail -20 "$work/store.log"; exit 1; }
for prog in exact sampled; do
  "$work/$prog/prog" >"$work/$prog.log" 2>&1 &
  pids+=($!)
done
sleep 1
"$agent_bin" --scrape "http://127.0.0.1:${port[exact]}/debug/pprof,http://127.0.0.1:${port[sampled]}/debug/pprof" \
  --scrape-interval 15s --store "$store" --metrics-addr off >"$work/agent.log" 2>&1 &
pids+=($!)
sleep "$((seconds + 30))"

for prog in exact sampled; do
  scrapes="$(sed -n 's/^scrape profile=allocs unix_ms=\([0-9]*\) allocated=\([0-9]*\).*/\1 \2/p' "$work/$prog.log")"
  read -r first first_alloc < <(head -1 <<<"$scrapes")
  sel="$(awk -v until=$((first + seconds * 1000)) '{ print } $1 >= until { exit }' <<<"$scrapes")"
  read -r last last_alloc < <(tail -1 <<<"$sel")
  last_start="$(tail -2 <<<"$sel" | head -1 | cut -d' ' -f1)"
  stored="$("$kiln" query --store "$store" --format folded --from $((first / 1000)) --to $((last_start / 1000 + 2)) \
    "memory:alloc_space:bytes:space:bytes:delta{service_name=\"127.0.0.1:${port[$prog]}\"}" |
    awk '{ c = $NF; s = substr($0, 1, length($0) - length(c) - 1); n = split(s, f, ";")
           for (i = 1; i <= n; i++) if (f[i] == "main.allocateKnown") { t += c; break } } END { printf "%.0f\n", t }')"
  expected=$((last_alloc - first_alloc))
  echo "$prog: $(($(wc -l <<<"$sel") - 1)) deltas over $(((last - first) / 1000)) s: allocated $expected bytes," \
    "stored $stored under main.allocateKnown, ratio $(awk -v s="$stored" -v e="$expected" 'BEGIN { printf "%.4f", s / e }')"
done
