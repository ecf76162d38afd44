# shellcheck shell=bash
# shellcheck disable=SC2034,SC2154 # a sourced file: it shares variables (repo, work, pids, agent) with the agent/bench scripts that source it
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

# Builds the OpenTelemetry eBPF profiler (Go module
# go.opentelemetry.io/ebpf-profiler, OTEL_PROFILER_VERSION, default
# v0.0.202633) once into $KILN_TOOLS_DIR/otel-ebpf-profiler, outside the
# repository, gently (one Go thread, one package at a time); prints the
# binary's path. The module ships its eBPF object prebuilt
# (support/ebpf/tracer.ebpf.amd64), so no clang is needed.
build_otel_peer() {
  local version="${OTEL_PROFILER_VERSION:-v0.0.202633}"
  local tools="${KILN_TOOLS_DIR:-/var/tmp/kiln-tools}/otel-ebpf-profiler"
  local go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
  local bin="$tools/ebpf-profiler-$version-memlock-eperm" src
  if [ ! -x "$bin" ]; then
    mkdir -p "$tools"
    (
      export GOMAXPROCS=1 GOFLAGS=-mod=mod CGO_ENABLED=0
      "$go" mod download -json "go.opentelemetry.io/ebpf-profiler@$version" >"$tools/download-$version.json"
      src="$("$go" env GOMODCACHE)/go.opentelemetry.io/ebpf-profiler@$version"
      if [ ! -f "$src/support/ebpf/tracer.ebpf.amd64" ]; then
        echo "peer cannot run here: $src has no prebuilt support/ebpf/tracer.ebpf.amd64" >&2
        exit 2
      fi
      # One local change, for this sandbox only: root here lacks
      # CAP_SYS_RESOURCE (the memlock hard limit is 8 MiB), and the profiler
      # stops when it cannot raise RLIMIT_MEMLOCK to infinity ("failed to
      # set temporary rlimit: operation not permitted"). Kernels since 5.11
      # charge BPF memory to the memory cgroup, not to memlock, so on EPERM
      # the patched copy goes on with the limit as it is.
      rm -rf "$tools/src-$version"
      cp -r "$src" "$tools/src-$version"
      chmod -R u+w "$tools/src-$version"
      sed -i 's|^\t\treturn nil, fmt.Errorf("failed to set temporary rlimit: %w", err)|\t\tif err == unix.EPERM {\n\t\t\treturn func() {}, nil\n\t\t}\n&|' \
        "$tools/src-$version/rlimit/rlimit.go"
      grep -q 'err == unix.EPERM' "$tools/src-$version/rlimit/rlimit.go"
      # the module's root package is the profiler's main package
      cd "$tools/src-$version" && nice -n 10 "$go" build -p 1 -tags osusergo,netgo -o "$bin.tmp" .
    ) >&2
    mv "$bin.tmp" "$bin"
  fi
  echo "$bin"
}

# The release agent the script measures, in `agent`: AGENT=PATH when set (a
# build kept to compare commits side by side), else this checkout's, built here.
use_release_agent() {
  agent="${AGENT:-}"
  if [ -z "$agent" ]; then
    cargo build --release -q -p kiln-agent --manifest-path "$repo/Cargo.toml"
    agent="$CARGO_TARGET_DIR/release/kiln-agent"
  fi
}

# A scratch folder in `work`, and `pids` for what the script starts: on exit
# each of those processes and its children is killed and the folder removed.
start_scratch() {
  work="$(mktemp -d)"
  pids=()
  trap stop_scratch EXIT
}
stop_scratch() {
  local p
  for p in "${pids[@]}"; do
    pkill -P "$p" 2>/dev/null || true
    kill "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
