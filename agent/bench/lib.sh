# Shared by the agent benchmark scripts (sourced, not run).

# Starts COUNT niced CPython processes under PYTHON, each running its own
# module in WORK/appN with outer_N -> middle_N -> hot_N; appends their pids
# to the caller's `pids` array.
start_python_workload() {
  local count="$1" python="$2" work="$3" i
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
}

# Sum of run_time_ns over the BPF programs process PID holds
# (needs kernel.bpf_stats_enabled=1).
bpf_run_time_ns() {
  local sum=0 v fd
  for fd in /proc/"$1"/fdinfo/*; do
    v="$(awk '$1 == "run_time_ns:" { print $2 }' "$fd" 2>/dev/null || true)"
    [ -n "$v" ] && sum=$((sum + v))
  done
  echo "$sum"
}

# Measures process PID over SECONDS: sets cpu_pct (process + BPF, % of one
# core), process_pct, bpf_pct, rss_mib and peak_rss_mib.
measure_cpu_and_memory() {
  local pid="$1" seconds="$2" ticks t0 t1 b0 b1
  ticks="$(getconf CLK_TCK)"
  t0="$(awk '{ print $14 + $15 }' "/proc/$pid/stat")"
  b0="$(bpf_run_time_ns "$pid")"
  sleep "$seconds"
  t1="$(awk '{ print $14 + $15 }' "/proc/$pid/stat")"
  b1="$(bpf_run_time_ns "$pid")"
  process_pct="$(awk -v d="$((t1 - t0))" -v tk="$ticks" -v s="$seconds" 'BEGIN { printf "%.2f", 100 * d / tk / s }')"
  bpf_pct="$(awk -v b="$((b1 - b0))" -v s="$seconds" 'BEGIN { printf "%.3f", 100 * b / 1e9 / s }')"
  cpu_pct="$(awk -v p="$process_pct" -v b="$bpf_pct" 'BEGIN { printf "%.2f", p + b }')"
  rss_mib="$(awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$pid/status")"
  peak_rss_mib="$(awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$pid/status")"
}
