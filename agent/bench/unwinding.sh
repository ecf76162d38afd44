#!/usr/bin/env bash
# Unwinding benchmark (docs/benchmarks.md, rows
# unwinding.19hz and unwinding.99hz): one run, side by side, on the same workloads.
#
# Keeps both cores busy with programs built without frame pointers: Debian's
# `xz -6` (in a loop) and Debian's `python3` running a busy loop. Then, for
# each frequency, profiles the whole host with each profiler in turn:
#   kiln-eh   kiln-agent --all (default .eh_frame unwinder)
#   kiln-fp   kiln-agent --all --unwinder frame-pointer
#   perf      perf record -a --call-graph dwarf,16384 (the ground truth)
#   bee       profile-bee --dwarf (eBPF peer; its `probee` binary from
#             $PROFILE_BEE, PATH or /var/tmp/kiln-tools/profile-bee/bin)
# and reports, per profiler: the share of xz samples that reach lzma_code and
# of python3 samples that reach Py_RunMain/Py_BytesMain/pymain_run_python, the
# median stack depth of those samples, the profiler's CPU (utime + stime of
# its process) plus the run time of its BPF programs (kernel bpf_stats, read
# from the program fds' fdinfo), as % of one core, and its peak RSS (VmHWM).
# perf's offline unwinding (`perf script --no-inline`: inline expansion through
# addr2line takes minutes) is reported separately.
#
# Usage (root): agent/bench/unwinding.sh [SECONDS] [HZ...]   default: 30 19 99
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
seconds="${1:-30}"
shift || true
if [ "$#" -gt 0 ]; then frequencies=("$@"); else frequencies=(19 99); fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/kiln-target}"
bee="${PROFILE_BEE:-$(command -v probee || echo /var/tmp/kiln-tools/profile-bee/bin/probee)}"

# shellcheck source=agent/bench/lib.sh
. "$here/lib.sh"
use_release_agent
start_scratch
sysctl -q kernel.bpf_stats_enabled=1
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing

# Workloads: xz on compressible text, and a CPython busy loop.
python3 - "$work/input.txt" <<'EOF'
import random, sys
words = "kiln profile stack frame unwind sample kernel store agent pprof flame graph cpu node pod label".split()
rng = random.Random(7)
with open(sys.argv[1], "w") as f:
    for _ in range(2_000_000):
        f.write(" ".join(rng.choice(words) + str(rng.randrange(1 << 20)) for _ in range(4)) + "\n")
EOF
bash -c "while :; do /usr/bin/xz -6 -T1 -c '$work/input.txt' >/dev/null; done" & pids+=($!)
printf 'def kiln_py_hot(n):\n    t = 0\n    for i in range(n):\n        t += i * i %% 7\n    return t\nwhile True:\n    kiln_py_hot(100000)\n' >"$work/busy.py"
/usr/bin/python3 "$work/busy.py" & pids+=($!)
sleep 2

ticks="$(getconf CLK_TCK)"
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
# Sum of run_time_ns over the BPF programs a process holds open.
bpf_ns() {
  local sum=0 fd v
  for fd in /proc/"$1"/fdinfo/*; do
    v="$(awk '$1 == "run_time_ns:" { print $2 }' "$fd" 2>/dev/null || true)"
    [ -n "$v" ] && sum=$((sum + v))
  done
  echo "$sum"
}
hwm_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

# Watches process $1 for $seconds: prints "cpu_ticks bpf_ns peak_kib".
measure() {
  local pid="$1" t0 t1 b
  sleep 3 # start-up (BPF load, symbol tables) is not the steady cost
  t0="$(cpu_ticks "$pid")"
  sleep "$seconds"
  t1="$(cpu_ticks "$pid")"
  b="$(bpf_ns "$pid")"
  echo "$((t1 - t0)) $b $(hwm_kib "$pid")"
}

# Reads "comm<TAB>count<TAB>frame;frame;..." lines (leaf first) on stdin and
# prints "xz_reach xz_depth py_reach py_depth".
score() {
  awk -F'\t' '
    function median(a, n,   i, j, t) {
      for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
      return n ? a[int((n + 1) / 2)] : 0
    }
    {
      comm = $1; count = $2; depth = split($3, f, ";")
      if (comm ~ /^xz/) { kind = "xz"; pat = "^lzma_code$" }
      else if (comm ~ /^python3/) { kind = "py"; pat = "^(Py_RunMain|Py_BytesMain|pymain_run_python)$" }
      else next
      hit = 0
      for (i = 1; i <= depth; i++) if (f[i] ~ pat) hit = 1
      total[kind] += count; reached[kind] += hit * count
      for (i = 0; i < count && n[kind] < 20000; i++) { n[kind]++; if (kind == "xz") dx[n[kind]] = depth; else dp[n[kind]] = depth }
    }
    END {
      printf "%.1f %d %.1f %d\n", total["xz"] ? 100 * reached["xz"] / total["xz"] : 0, median(dx, n["xz"]),
        total["py"] ? 100 * reached["py"] / total["py"] : 0, median(dp, n["py"])
    }'
}

# pprof files from kiln-agent -> score() lines, through go tool pprof -traces.
kiln_lines() {
  local f
  for f in "$1"/*.pb.gz; do
    go tool pprof -traces -sample_index=samples "$f" 2>/dev/null
  done | awk '
    /^-+\+-+$/ { flush(); next }
    /^ +comm: / { comm = $2; next }
    /^ +[a-z_]+: / { next }
    /^ +[0-9]+ +/ { flush(); count = $1; sub(/^ +[0-9]+ +/, ""); frames = $0; next }
    /^ +[^ ]/ { sub(/^ +/, ""); frames = frames ";" $0 }
    function flush() { if (count) printf "%s\t%d\t%s\n", comm, count, frames; count = 0; frames = "" }
    END { flush() }'
}

# perf script output -> score() lines.
perf_lines() {
  awk '
    /^[^ \t]/ { flush(); comm = $1; next }
    /^[ \t]+[0-9a-f]+ / { sym = $2; sub(/\+0x[0-9a-f]+$/, "", sym); frames = frames (frames == "" ? "" : ";") sym; n++; next }
    /^$/ { flush() }
    function flush() { if (n) printf "%s\t1\t%s\n", comm, frames; n = 0; frames = "" }
    END { flush() }'
}

# profile-bee folded stacks ("comm (pid);root;...;leaf count") -> score() lines.
bee_lines() {
  awk '{
    count = $NF; sub(/ [0-9]+$/, ""); n = split($0, f, ";")
    frames = ""; for (i = n; i >= 2; i--) frames = frames (frames == "" ? "" : ";") f[i]
    printf "%s\t%d\t%s\n", f[1], count, frames
  }' "$1"
}

printf '%-4s %-9s %-8s %-9s %-8s %-9s %-11s %-9s %s\n' Hz profiler xz_reach xz_depth py_reach py_depth "cpu_%core" peak_MiB note
report() { # hz name "cpu_ticks bpf_ns peak_kib" "scores" note
  read -r dt bns peak <<<"$3"
  read -r xr xd pr pd <<<"$4"
  awk -v hz="$1" -v n="$2" -v dt="$dt" -v tk="$ticks" -v s="$seconds" -v b="$bns" -v p="$peak" \
      -v xr="$xr" -v xd="$xd" -v pr="$pr" -v pd="$pd" -v note="$5" 'BEGIN {
    # Process CPU over the measured window; BPF run time accumulates from
    # the program load, 3 s before the window.
    cpu = 100 * (dt / tk / s + b / 1e9 / (s + 3))
    printf "%-4d %-9s %-8s %-9d %-8s %-9d %-11.2f %-9.1f %s\n", hz, n, xr "%", xd, pr "%", pd, cpu, p / 1024, note
  }'
}

for hz in "${frequencies[@]}"; do
  for mode in eh-frame frame-pointer; do
    out="$work/kiln-$mode-$hz"
    "$agent" --all --unwinder "$mode" --frequency "$hz" --drain-interval 10s --output-dir "$out" \
      --metrics-addr off 2>"$work/agent.log" &
    apid=$!
    stats="$(measure "$apid")"
    kill -TERM "$apid"; wait "$apid" || true
    name=kiln-eh; [ "$mode" = frame-pointer ] && name=kiln-fp
    report "$hz" "$name" "$stats" "$(kiln_lines "$out" | score)" ""
  done

  perf record -q -a -F "$hz" --call-graph dwarf,16384 -o "$work/perf-$hz.data" -- sleep $((seconds + 3)) 2>/dev/null &
  ppid=$!
  stats="$(measure "$ppid")"
  wait "$ppid" || true
  start_ns="$(date +%s%N)"
  perf script --no-inline -F comm,ip,sym -i "$work/perf-$hz.data" 2>/dev/null >"$work/perf-$hz.txt"
  script_s="$(awk -v a="$start_ns" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')"
  report "$hz" perf "$stats" "$(perf_lines <"$work/perf-$hz.txt" | score)" "perf script: ${script_s}s"

  if [ -x "$bee" ]; then
    "$bee" --dwarf --skip-idle --group-by-process --frequency "$hz" --time $(((seconds + 3) * 1000)) \
      -o "$work/bee-$hz.folded" >"$work/bee.log" 2>&1 &
    bpid=$!
    stats="$(measure "$bpid")"
    wait "$bpid" || true
    report "$hz" bee "$stats" "$(bee_lines "$work/bee-$hz.folded" | score)" ""
  else
    echo "profile-bee not found (set PROFILE_BEE): skipped"
  fi
done
