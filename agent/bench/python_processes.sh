#!/usr/bin/env bash
# Agent cost with Python frames (docs/benchmarks.md, "Agent: Python frames"):
# runs N CPython processes (each a different module file with its own
# functions, three calls deep, niced so they share the two cores with
# everything else) under the interpreter given (Debian's python3 by
# default), profiles them by pid with the release agent at HZ, and reports
# the agent's CPU (process plus BPF run time) as % of one core, its RSS and
# peak RSS, and its Python metrics.
#
# Usage (root): agent/bench/python_processes.sh [N] [SECONDS] [HZ] [PYTHON]
#   default: 20 60 19 /usr/bin/python3
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
count="${1:-20}"
seconds="${2:-60}"
hz="${3:-19}"
python="${4:-/usr/bin/python3}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/kiln-target}"
cargo build --release -q -p kiln-agent --manifest-path "$repo/Cargo.toml"
agent="$CARGO_TARGET_DIR/release/kiln-agent"
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
sysctl -q kernel.bpf_stats_enabled=1

for i in $(seq "$count"); do
  mkdir -p "$work/app$i"
  cat >"$work/app$i/work$i.py" <<PY
def hot_$i(n):
    total = 0
    for k in range(n):
        total += k * k % 7
    return total

def middle_$i():
    return hot_$i(20000) + hot_$i(10000)

def outer_$i():
    while True:
        middle_$i()
PY
  nice -n 19 "$python" -c "import sys; sys.path.insert(0, '$work/app$i'); import work$i; work$i.outer_$i()" &
  pids+=($!)
done
sleep 2
pid_args=()
for p in "${pids[@]}"; do pid_args+=(--pid "$p"); done

port=17998
"$agent" "${pid_args[@]}" --frequency "$hz" --drain-interval 10s --output-dir "$work/out" \
  --metrics-addr "127.0.0.1:$port" 2>"$work/agent.log" &
apid=$!
sleep 5
ticks="$(getconf CLK_TCK)"
t0="$(awk '{ print $14 + $15 }' "/proc/$apid/stat")"
sleep "$seconds"
t1="$(awk '{ print $14 + $15 }' "/proc/$apid/stat")"
curl -s "http://127.0.0.1:$port/metrics" >"$work/metrics"
rss="$(awk '/^VmRSS:/ { print $2 }' "/proc/$apid/status")"
peak="$(awk '/^VmHWM:/ { print $2 }' "/proc/$apid/status")"
bpf=0
for fd in /proc/"$apid"/fdinfo/*; do
  v="$(awk '$1 == "run_time_ns:" { print $2 }' "$fd" 2>/dev/null || true)"
  [ -n "$v" ] && bpf=$((bpf + v))
done
kill -TERM "$apid"; wait "$apid" || true
awk -v dt="$((t1 - t0))" -v tk="$ticks" -v s="$seconds" -v b="$bpf" -v r="$rss" -v p="$peak" -v n="$count" -v hz="$hz" 'BEGIN {
  proc = 100 * dt / tk / s; bpf = 100 * b / 1e9 / (s + 5)
  printf "python_processes=%d hz=%d agent_cpu=%.2f%%core (process %.2f%% + bpf %.3f%%) rss=%.1fMiB peak_rss=%.1fMiB\n",
    n, hz, proc + bpf, proc, bpf, r / 1024, p / 1024
}'
"$python" --version
grep -E '^kiln_agent_(python|samples_total|unwind_total)' "$work/metrics" || true
