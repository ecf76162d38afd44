#!/usr/bin/env bash
# Off-CPU overhead benchmark (docs/benchmarks.md, row off-cpu.cost).
#
# Runs a workload of two threads handing a byte through pipes at a set
# rate of voluntary context switches (agent/tests/workloads/switch_rate.c),
# and the release agent against it (--pid, 19 Hz), with off-CPU off and on
# at each rate. Reports the agent's CPU as % of one core and its peak RSS,
# the switch rate the workload reached (voluntary and involuntary), the BPF programs' run time as % of
# one core (run in the workload's context, not the agent's) and per run,
# and what became of the blocks (seen, captured, shorter than 1 ms).
#
# Usage (root): agent/bench/off_cpu.sh [SECONDS] [RATE...]   default: 60 1000 100000
# Environment: AGENT=PATH runs that agent binary instead of building one;
# PAIRS=N sets the workload's thread pairs (default 1).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
seconds="${1:-60}"
shift || true
if [ "$#" -gt 0 ]; then rates=("$@"); else rates=(1000 100000); fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/kiln-target}"

# shellcheck source=agent/bench/lib.sh
. "$here/lib.sh"
use_release_agent
start_scratch

gcc -O1 -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -fno-optimize-sibling-calls \
  -o "$work/switch_rate" "$repo/agent/tests/workloads/switch_rate.c"

ticks="$(getconf CLK_TCK)"
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# Voluntary and involuntary both: a hand-off whose woken thread preempts the
# waker counts as involuntary for the waker, and sched_switch fires for each.
switches() { cat /proc/"$1"/task/*/status | awk '/_ctxt_switches:/ { s += $2 } END { print s }'; }
metric() { awk -v m="$1" '$1 == m { print $2 }' "$2"; }
blocks() { awk -v r="result=\"$1\"" 'index($0, "kiln_agent_off_cpu_blocks_total{" r "}") == 1 { print $2 }' "$2"; }

printf '%-8s %-6s %-8s %-10s %-13s %-10s %-12s %-12s %-10s %-10s %-8s %s\n' \
  rate pairs off_cpu "cpu_%core" peak_rss_MiB "switch/s" "bpf_%core" bpf_ns/run seen captured short keep_1_in
for rate in "${rates[@]}"; do
  pairs="${PAIRS:-1}"
  for mode in off on; do
    "$work/switch_rate" "$rate" "$pairs" &
    wpid=$!
    pids+=("$wpid")
    flags=()
    if [ "$mode" = on ]; then flags=(--off-cpu); fi
    port=$((17100 + ${#pids[@]}))
    "$agent" --pid "$wpid" "${flags[@]}" --drain-interval 10s --output-dir "$work/out-$rate-$mode" \
      --metrics-addr "127.0.0.1:$port" 2>"$work/agent-$rate-$mode.log" &
    apid=$!
    sleep 5 # warm-up: BPF load, kallsyms, the first rate look
    curl -s "http://127.0.0.1:$port/metrics" >"$work/metrics-start" || true
    start_ticks="$(cpu_ticks "$apid")"
    start_switches="$(switches "$wpid")"
    start_ns="$(date +%s%N)"
    sleep "$seconds"
    end_ticks="$(cpu_ticks "$apid")"
    end_switches="$(switches "$wpid")"
    end_ns="$(date +%s%N)"
    curl -s "http://127.0.0.1:$port/metrics" >"$work/metrics-end" || true
    peak_kib="$(awk '/^VmHWM:/ { print $2 }' "/proc/$apid/status")"
    kill -TERM "$apid"
    wait "$apid" || true
    kill "$wpid"
    wait "$wpid" 2>/dev/null || true
    run_ns=$(($(metric kiln_agent_bpf_run_time_ns_total "$work/metrics-end") - $(metric kiln_agent_bpf_run_time_ns_total "$work/metrics-start")))
    runs=$(($(metric kiln_agent_bpf_runs_total "$work/metrics-end") - $(metric kiln_agent_bpf_runs_total "$work/metrics-start")))
    seen="$(blocks seen "$work/metrics-end")"
    captured="$(blocks captured "$work/metrics-end")"
    short="$(blocks short "$work/metrics-end")"
    keep="$(metric kiln_agent_off_cpu_keep_one_in "$work/metrics-end")"
    awk -v rate="$rate" -v pairs="$pairs" -v mode="$mode" -v dt="$((end_ticks - start_ticks))" -v tk="$ticks" \
        -v ns="$((end_ns - start_ns))" -v sw="$((end_switches - start_switches))" -v peak="$peak_kib" \
        -v rn="$run_ns" -v r="$runs" -v seen="${seen:-0}" -v cap="${captured:-0}" -v short="${short:-0}" \
        -v keep="${keep:-0}" 'BEGIN {
      secs = ns / 1e9
      printf "%-8d %-6d %-8s %-10.2f %-13.1f %-10.0f %-12.2f %-12.0f %-10d %-10d %-8d %d\n", rate, pairs,
        mode, 100 * (dt / tk) / secs, peak / 1024, sw / secs, 100 * rn / ns, (r > 0) ? rn / r : 0,
        seen, cap, short, keep
    }'
  done
done
