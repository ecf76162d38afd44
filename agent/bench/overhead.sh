#!/usr/bin/env bash
# Agent overhead benchmark (docs/benchmarks.md, row agent.overhead).
#
# Keeps every core busy with a frame-pointer workload, runs the release agent
# in --all mode (every process on the host is sampled and symbolized) at each
# given frequency, and reports the agent's CPU as % of one core, its peak
# RSS, and the BPF program's run time per sample from the kernel's stats.
#
# Usage (root): agent/bench/overhead.sh [SECONDS] [HZ...]   default: 60 19 99
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
seconds="${1:-60}"
shift || true
if [ "$#" -gt 0 ]; then frequencies=("$@"); else frequencies=(19 99); fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/kiln-target}"

# shellcheck source=agent/bench/lib.sh
. "$here/lib.sh"
use_release_agent
start_scratch

gcc -O1 -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -fno-optimize-sibling-calls \
  -o "$work/busy" "$repo/agent/tests/workloads/hot_ratio.c"
for _ in $(seq "$(nproc)"); do "$work/busy" & pids+=($!); done

ticks="$(getconf CLK_TCK)"
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
metric() { awk -v m="$1" '$1 == m { print $2 }' "$2"; }

printf '%-6s %-10s %-9s %-14s %-14s %-10s %s\n' Hz "cpu_%core" rss_MiB peak_rss_MiB bpf_ns/sample samples profiles
for hz in "${frequencies[@]}"; do
  port=$((17000 + hz))
  "$agent" --all --frequency "$hz" --drain-interval 10s --output-dir "$work/out-$hz" \
    --metrics-addr "127.0.0.1:$port" 2>"$work/agent-$hz.log" &
  apid=$!
  sleep 5 # warm-up: BPF load, kallsyms, first symbolization
  start_ticks="$(cpu_ticks "$apid")"
  start_ns="$(date +%s%N)"
  sleep "$seconds"
  end_ticks="$(cpu_ticks "$apid")"
  end_ns="$(date +%s%N)"
  curl -s "http://127.0.0.1:$port/metrics" >"$work/metrics-$hz" || true
  peak_kib="$(awk '/^VmHWM:/ { print $2 }' "/proc/$apid/status")"
  rss_kib="$(awk '/^VmRSS:/ { print $2 }' "/proc/$apid/status")"
  kill -TERM "$apid"
  wait "$apid" || true
  run_ns="$(metric kiln_agent_bpf_run_time_ns_total "$work/metrics-$hz")"
  runs="$(metric kiln_agent_bpf_runs_total "$work/metrics-$hz")"
  samples="$(metric kiln_agent_samples_total "$work/metrics-$hz")"
  profiles="$(ls "$work/out-$hz" | wc -l)"
  awk -v hz="$hz" -v dt="$((end_ticks - start_ticks))" -v tk="$ticks" -v ns="$((end_ns - start_ns))" \
      -v peak="$peak_kib" -v rss="$rss_kib" -v rn="${run_ns:-0}" -v r="${runs:-0}" -v s="${samples:-0}" -v p="$profiles" 'BEGIN {
    cpu = 100 * (dt / tk) / (ns / 1e9)
    per = (r > 0) ? rn / r : 0
    printf "%-6d %-10.2f %-9.1f %-14.1f %-14.0f %-10d %d\n", hz, cpu, rss / 1024, peak / 1024, per, s, p
  }'
done
