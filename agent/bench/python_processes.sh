#!/usr/bin/env bash
# Agent cost with Python frames (docs/benchmarks.md, row python.cpu):
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
# shellcheck source=agent/bench/lib.sh
. "$here/lib.sh"
count="${1:-20}"
seconds="${2:-60}"
hz="${3:-19}"
python="${4:-/usr/bin/python3}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/kiln-target}"
use_release_agent
start_scratch
sysctl -q kernel.bpf_stats_enabled=1

start_python_workload "$count" "$python" "$work"
sleep 2
pid_args=()
for p in "${pids[@]}"; do pid_args+=(--pid "$p"); done

port=17998
"$agent" "${pid_args[@]}" --frequency "$hz" --drain-interval 10s --output-dir "$work/out" \
  --metrics-addr "127.0.0.1:$port" 2>"$work/agent.log" &
apid=$!
sleep 5
measure_cpu_and_memory "$apid" "$seconds"
curl -s "http://127.0.0.1:$port/metrics" >"$work/metrics"
kill -TERM "$apid"; wait "$apid" || true
echo "python_processes=$count hz=$hz agent_cpu=${cpu_pct}%core (process ${process_pct}% + bpf ${bpf_pct}%) rss=${rss_mib}MiB peak_rss=${peak_rss_mib}MiB"
"$python" --version
grep -E '^kiln_agent_(python|samples_total|unwind_total)' "$work/metrics" || true
