#!/usr/bin/env bash
# Reruns the headline table of docs/benchmarks.md (`./kiln-dev bench`) and
# prints it again with this run's figures: the same rows and columns, read
# from the page, with the Kiln and peer cells, the machine, the date and
# commit, and the raw output as the log replaced. Each row group runs the
# benchmark command its log names, once; a group that cannot run here
# prints "not run: <why>" in its rows. No figure is ever copied from the page.
#
# Usage: store/bench/headline.sh [--quick] [--list] [GROUP...]
#   GROUP    the part of a row's name before the dot (store, http, agent, ...);
#            default: every group
#   --quick  shorter measuring windows (agent scripts 20 s, HTTP 5 s, fuzzing
#            60 s per target, 5 churn rounds) and no group that takes over
#            about 15 minutes (store-2000, budget, e2e): figures not
#            comparable with the logs'
#   --list   the groups and the command behind each
# Each group builds what it runs (release builds; fuzz: the AFL++ build in
# store/fuzz/run.sh's target directory), so a first run takes longer.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo" || exit 1
page=docs/benchmarks.md
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/kiln-target}"
tools_dir="${KILN_TOOLS_DIR:-/var/tmp/kiln-tools}"

groups_all=(store store-2000 budget rules replicas symbols http hops cores grpc memory-limit hostile outage fuzz
  agent off-cpu unwinding runtimes python peer binaries reach k8s-agent otel pprof ui e2e)
declare -A command_of=(
  [store]="KILN_BENCH_PODS=500 cargo bench -p kiln-storage --no-default-features --bench workload"
  [store-2000]="KILN_BENCH_PODS=2000 cargo bench -p kiln-storage --no-default-features --bench workload"
  [budget]="KILN_BENCH_MEMORY_BUDGET=536870912 KILN_BENCH_PODS=500, then 2000: the store command"
  [rules]="cargo run --release -p kiln-engine --example recording_cost"
  [replicas]="KILN_BENCH_REPLICAS='1 2 3' cargo bench -p kiln-store --bench replicas"
  [symbols]="cargo bench -p kiln-store --bench symbols"
  [http]="KILN_BENCH_PROTOCOL=ingest KILN_BENCH_WRITERS=w KILN_BENCH_CLIENT_PROCESSES=1 KILN_BENCH_SECONDS=10 cargo bench -p kiln-store --bench write_load, w = 1 2 4 8"
  [hops]="store/bench/hops.sh WRITE_LOAD_BIN new=RELEASE_KILN_STORE (root, perf)"
  [cores]="store/bench/cores.sh WRITE_LOAD_BIN new=RELEASE_KILN_STORE (16 cores or more)"
  [grpc]="KILN_BENCH_WRITERS=32 KILN_BENCH_SAMPLES=200, then 50: cargo bench -p kiln-store --bench write_load"
  [memory-limit]="cargo test -p kiln-store --test memory_limit -- --nocapture (root)"
  [hostile]="cargo test -p kiln-store --test hostile_requests -- --nocapture (root)"
  [outage]="cargo test -p kiln-store --test moto_outage -- --nocapture (root, moto_server)"
  [fuzz]="store/fuzz/run.sh 600 (cargo-afl)"
  [agent]="agent/bench/overhead.sh 60 19 99 (root)"
  [off-cpu]="agent/bench/off_cpu.sh 60 1000 100000 (root)"
  [unwinding]="agent/bench/unwinding.sh 30 19 99 (root, perf, profile-bee)"
  [python]="agent/bench/python_processes.sh 20 60 19; agent/bench/python_peer_otel.sh 20 60 19 (root, go)"
  [binaries]="agent/bench/many_binaries.sh 200 60 19 (root)"
  [runtimes]="CI=true cargo test -p kiln-agent --test privileged -- --nocapture --test-threads 1 java_frames:: node_frames:: ruby_frames:: python_forky:: (root, the Debian roots ./kiln-dev test unpacks)"
  [reach]="CI=true cargo test -p kiln-agent --test privileged -- --nocapture --test-threads 1 python_frames:: unwinding:: (root)"
  [otel]="agent/bench/peer_otel_symbols.sh (root, go: the OTel eBPF profiler into a kiln-store)"
  [peer]="agent/bench/peer_otel.sh steady rust go (root, go: Kiln's agent and the OTel eBPF profiler side by side)"
  [pprof]="agent/bench/pprof_hour.sh 3600 (go: a scrape-only agent and two Go programs)"
  [k8s-agent]="KILN_BENCH_ROUNDS=12 cargo test -p kiln-agent --test privileged -- --ignored --nocapture fifty_pods_churn (root, containerd)"
  [ui]="cargo build -p kiln-store; cargo test -p kiln-ui --test browser -- --nocapture (chromium)"
  [e2e]="./kiln-dev e2e"
)

quick=false
selected=()
for arg in "$@"; do
  case "$arg" in
    --quick) quick=true ;;
    --list)
      for g in "${groups_all[@]}"; do printf '%-13s %s\n' "$g" "${command_of[$g]}"; done
      exit 0 ;;
    -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "unknown option $arg (try --list)" >&2; exit 2 ;;
    *)
      [ -n "${command_of[$arg]:-}" ] || { echo "unknown group $arg (try --list)" >&2; exit 2; }
      selected+=("$arg") ;;
  esac
done
[ "${#selected[@]}" -gt 0 ] || selected=("${groups_all[@]}")

out="$(mktemp -d -t kiln-bench.XXXXXX)"
declare -A not_run=()
is_root() { [ "$(id -u)" = 0 ]; }
fixtures() { [ -d "$repo/../shared/testdata/profiles" ]; }
# Runs a command, appending its output to the group's log; false if it failed.
logged() { local log="$1"; shift; echo "\$ $*" >>"$log"; "$@" >>"$log" 2>&1; }
secs() { if $quick; then echo "$2"; else echo "$1"; fi; }

run_workload() { # log [ENV=V ...]
  local log="$1"; shift
  fixtures || { echo "../shared/testdata/profiles is absent (the workload's fixtures)"; return; }
  logged "$log" env "$@" cargo bench -p kiln-storage --no-default-features --bench workload \
    || { echo "the workload bench failed (see $log)"; return; }
  grep -q '^SKIP' "$log" && echo "the workload bench skipped: $(grep -m1 '^SKIP' "$log")"
}
run_store() { run_workload "$out/store.txt" KILN_BENCH_PODS=500; }
run_store-2000() {
  $quick && { echo "--quick leaves it out (12 to 50 min of 2 vCPUs in the logs)"; return; }
  run_workload "$out/store-2000.txt" KILN_BENCH_PODS=2000
}
run_budget() {
  $quick && { echo "--quick leaves it out (two workload runs, one of 2,000 pods)"; return; }
  local why
  why="$(run_workload "$out/budget-500.txt" KILN_BENCH_PODS=500 KILN_BENCH_MEMORY_BUDGET=536870912)"
  [ -z "$why" ] || { echo "$why"; return; }
  run_workload "$out/budget-2000.txt" KILN_BENCH_PODS=2000 KILN_BENCH_MEMORY_BUDGET=536870912
}
run_rules() {
  logged "$out/rules.txt" cargo run --release -q -p kiln-engine --example recording_cost \
    || echo "the recording_cost example failed (see $out/rules.txt)"
}
run_replicas() {
  logged "$out/replicas.txt" env KILN_BENCH_SECONDS="$(secs 10 5)" cargo bench -p kiln-store --bench replicas \
    || echo "the replicas bench failed (see $out/replicas.txt)"
}
run_symbols() {
  logged "$out/symbols.txt" env KILN_BENCH_QUERIES="$(secs 20 5)" cargo bench -p kiln-store --bench symbols \
    || echo "the symbols bench failed (see $out/symbols.txt)"
}
run_http() {
  local w
  for w in 1 2 4 8; do
    logged "$out/http-$w.txt" env KILN_BENCH_PROTOCOL=ingest KILN_BENCH_WRITERS="$w" \
      KILN_BENCH_CLIENT_PROCESSES=1 KILN_BENCH_SECONDS="$(secs 10 5)" \
      cargo bench -p kiln-store --bench write_load || { echo "write_load failed (see $out/http-$w.txt)"; return; }
  done
}
run_cores() {
  [ "$(nproc)" -ge 16 ] || { echo "needs 16 cores or more, this machine has $(nproc)"; return; }
  local log="$out/cores.txt" load_bin
  logged "$log" cargo build --release --locked -p kiln-store || { echo "release kiln-store build failed"; return; }
  load_bin="$(cargo bench -p kiln-store --bench write_load --no-run 2>&1 | sed -n 's/.*Executable.*(\(.*\)).*/\1/p' | tail -1)"
  [ -x "$load_bin" ] || { echo "no write_load binary"; return; }
  logged "$log" env KILN_CORES_WRITERS="8 16 32" KILN_CORES_DIAG= KILN_CORES_SECONDS="$(secs 6 4)" \
    store/bench/cores.sh "$load_bin" "new=$CARGO_TARGET_DIR/release/kiln-store" || echo "cores.sh failed"
}
run_hops() {
  is_root || { echo "needs root (perf stat and sched_switch)"; return; }
  command -v perf >/dev/null 2>&1 || { echo "no perf (Debian's linux-perf)"; return; }
  local log="$out/hops.txt" load_bin
  logged "$log" cargo build --release --locked -p kiln-store || { echo "release kiln-store build failed"; return; }
  load_bin="$(cargo bench -p kiln-store --bench write_load --no-run 2>&1 | sed -n 's/.*Executable.*(\(.*\)).*/\1/p' | tail -1)"
  [ -x "$load_bin" ] || { echo "no write_load binary"; return; }
  logged "$log" env KILN_HOPS_ROUNDS="$(secs 3 1)" KILN_HOPS_SECONDS=10 KILN_HOPS_LOADS="ingest:8 write_raw:32" \
    store/bench/hops.sh "$load_bin" "new=$CARGO_TARGET_DIR/release/kiln-store" || echo "hops.sh failed (see $log)"
}
run_grpc() {
  local n
  for n in 200 50; do
    logged "$out/grpc-$n.txt" env KILN_BENCH_WRITERS=32 KILN_BENCH_SAMPLES="$n" \
      KILN_BENCH_SECONDS="$(secs 10 5)" cargo bench -p kiln-store --bench write_load \
      || { echo "write_load failed (see $out/grpc-$n.txt)"; return; }
  done
}
run_store_test() { # group test
  is_root || { echo "needs root (a memory cgroup)"; return; }
  logged "$out/$1.txt" cargo test -p kiln-store --test "$2" -- --nocapture || echo "the test failed (see $out/$1.txt)"
}
run_memory-limit() { run_store_test memory-limit memory_limit; }
run_hostile() { run_store_test hostile hostile_requests; }
run_outage() {
  [ -x "$tools_dir/venv/bin/moto_server" ] || command -v moto_server >/dev/null 2>&1 \
    || { echo "no moto_server ($tools_dir/venv; ./kiln-dev test installs it)"; return; }
  PATH="$tools_dir/venv/bin:$PATH" run_store_test outage moto_outage
}
run_fuzz() {
  PATH="$tools_dir/cargo-afl/bin:$PATH" command -v cargo-afl >/dev/null 2>&1 \
    || { echo "no cargo-afl ($tools_dir/cargo-afl; ./kiln-dev test installs it)"; return; }
  PATH="$tools_dir/cargo-afl/bin:$PATH" logged "$out/fuzz.txt" store/fuzz/run.sh "$(secs 600 60)" \
    || grep -q 'crashes' "$out/fuzz.txt" || echo "store/fuzz/run.sh failed (see $out/fuzz.txt)"
}
run_agent_script() { # group script args...
  is_root || { echo "needs root (eBPF)"; return; }
  local group="$1"; shift
  logged "$out/$group.txt" "$@" || echo "$1 failed (see $out/$group.txt)"
}
run_agent() { run_agent_script agent agent/bench/overhead.sh "$(secs 60 20)" 19 99; }
run_off-cpu() { run_agent_script off-cpu agent/bench/off_cpu.sh "$(secs 60 20)" 1000 100000; }
run_otel() { run_agent_script otel env SECONDS_BUSY="$(secs 40 20)" agent/bench/peer_otel_symbols.sh; }
run_unwinding() {
  command -v perf >/dev/null 2>&1 || { echo "no perf (Debian's linux-perf)"; return; }
  PROFILE_BEE="${PROFILE_BEE:-$tools_dir/profile-bee/bin/probee}" \
    run_agent_script unwinding agent/bench/unwinding.sh "$(secs 30 20)" 19 99
}
run_python() {
  local why
  why="$(run_agent_script python agent/bench/python_processes.sh 20 "$(secs 60 20)" 19)"
  [ -z "$why" ] || { echo "$why"; return; }
  # The peer's own failure leaves Kiln's figure standing; its cell says so.
  logged "$out/python-peer.txt" agent/bench/python_peer_otel.sh 20 "$(secs 60 20)" 19 || true
}
run_peer() {
  if $quick; then
    run_agent_script peer env SECONDS_STEADY=20 CHURN_SECONDS=20 agent/bench/peer_otel.sh steady
  else
    run_agent_script peer agent/bench/peer_otel.sh steady rust go
  fi
}
run_pprof() {
  command -v go >/dev/null 2>&1 || { echo "no go (the two Go programs are built here)"; return; }
  logged "$out/pprof.txt" agent/bench/pprof_hour.sh "$(secs 3600 60)" \
    || echo "agent/bench/pprof_hour.sh failed (see $out/pprof.txt)"
}
run_binaries() { run_agent_script binaries agent/bench/many_binaries.sh 200 "$(secs 60 20)" 19; }
run_reach() {
  is_root || { echo "needs root (eBPF)"; return; }
  logged "$out/reach.txt" env CI=true cargo test -p kiln-agent --test privileged \
    -- --nocapture --test-threads 1 python_frames:: unwinding:: || echo "the tests failed (see $out/reach.txt)"
}
run_runtimes() {
  is_root || { echo "needs root (eBPF)"; return; }
  logged "$out/runtimes.txt" env CI=true cargo test -p kiln-agent --test privileged \
    -- --nocapture --test-threads 1 java_frames:: node_frames:: ruby_frames:: python_forky:: \
    || echo "the tests failed (see $out/runtimes.txt)"
}
run_k8s-agent() {
  is_root || { echo "needs root (containerd)"; return; }
  logged "$out/k8s-agent.txt" cargo build -p kiln-store || { echo "kiln-store build failed"; return; }
  logged "$out/k8s-agent.txt" env KILN_BENCH_ROUNDS="$(secs 12 5)" cargo test -p kiln-agent --test privileged \
    -- --ignored --nocapture fifty_pods_churn || { echo "the test failed (see $out/k8s-agent.txt)"; return; }
  grep -q 'SKIPPED: CRI' "$out/k8s-agent.txt" && grep -m1 'SKIPPED: CRI' "$out/k8s-agent.txt"
}
run_ui() {
  logged "$out/ui.txt" cargo build -p kiln-store || { echo "kiln-store build failed"; return; }
  logged "$out/ui.txt" cargo test -p kiln-ui --test browser -- --nocapture || { echo "the browser test failed (see $out/ui.txt)"; return; }
  grep -q 'measured:' "$out/ui.txt" || echo "the browser test measured nothing (no Chromium?)"
}
run_e2e() {
  $quick && { echo "--quick leaves it out (images, a cluster and checks 1-9: over 10 min)"; return; }
  is_root || { echo "needs root (a Kubernetes node)"; return; }
  logged "$out/e2e.txt" ./kiln-dev e2e || echo "./kiln-dev e2e failed (see $out/e2e.txt)"
}

for g in "${selected[@]}"; do
  echo "== bench $g: ${command_of[$g]} (raw output in $out)" >&2
  started=$SECONDS
  why="$("run_$g")"
  [ -z "$why" ] || not_run[$g]="$why"
  echo "   $((SECONDS - started)) s${why:+, not run: $why}" >&2
done

# --- reading the figures out of the raw outputs ---
S() { awk -v n="$2" '$1 == "SUMMARY" && $2 == n { $1 = ""; $2 = ""; sub(/^ +/, ""); print }' "$1" 2>/dev/null; }
field() { grep -o "$2=[^ ,;%]*" <<<"$1" | head -1 | cut -d= -f2; } # "a=1 b=2" b -> 2
merge() { field "$(S "$1" "merge_$2_ms_cpu")" "$3"; } # file 7d_all_pods cold
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", b / a }'; }
at_end() { sed -n 's/^peak RSS (VmHWM) at end: \([0-9]*\) MiB/\1/p' "$1" | tail -1; }
http_point() { # file -> "accepted/s per-cpu"
  awk '/^accepted=/ { for (i = 1; i <= NF; i++) if ($i ~ /^profiles\/s=/) { split($i, a, "="); r = a[2] } }
       /^server cpu=/ { split($NF, b, "="); c = b[2] } END { print r, c }' "$1"
}
agent_line() { # the "... agent_cpu=X%core ... rss=YMiB peak_rss=ZMiB" line -> "X %; Y / Z MiB"
  sed -n 's/.*cpu=\([0-9.]*\)%core.* rss=\([0-9.]*\)MiB peak_rss=\([0-9.]*\)MiB.*/\1 %; \2 \/ \3 MiB/p' "$1" | tail -1
}
unwind_row() { # hz profiler -> "xz / py %; cpu %; peak MiB[; note]"
  awk -v hz="$1" -v p="$2" '$1 == hz && $2 == p {
    note = ""; for (i = 9; i <= NF; i++) note = note " " $i
    printf "%s / %s; %s %%; %s MiB%s\n", $3, $5, $7, $8, (note ? ";" note : "") }' "$out/unwinding.txt"
}

peer_reach() { # agent -> reach per runtime, in the row's order
  awk -v a="$1" '$1 == "reach" { rt = $2; for (i = 3; i <= NF; i++) if ($i == a) { v = $(i + 1); sub(/%$/, "", v); r[rt] = v } }
    END { if ("java17" in r) printf "%s / %s; %s / %s; %s; %s / %s; %s %%\n", r["java17"], r["java25-forky"], r["node20"], r["node24-forky"],
            r["ruby3.1"], r["python3.11"], r["python3.13-forky"], r["go-stripped"] }' "$out/peer.txt"
}
peer_cpu() { # agent -> "steady / Rust build / Go build" CPU and peak RSS, first round of each
  awk -v a="$1" '$0 ~ ": " a " cpu=" { k = ($1 == "steady") ? "steady" : $2; if (k in c) next
      for (i = 1; i <= NF; i++) { if ($i ~ /^cpu=/) { v = $i; sub(/^cpu=/, "", v); sub(/%core$/, "", v); c[k] = v }
                                  if ($i ~ /^peak_rss=/) { v = $i; sub(/^peak_rss=/, "", v); sub(/MiB$/, "", v); p[k] = v } } }
    END { if ("steady" in c) printf "%s %%, %s MiB / %s %%, %s MiB / %s %%, %s MiB\n", c["steady"], p["steady"], c["rust"], p["rust"], c["go"], p["go"] }' \
    "$out/peer.txt"
}

cell() { # row -> this run's Kiln figure
  local f="$out/store.txt" a b
  case "$1" in
    store.ingest) echo "$(S "$f" ingest_profiles_per_cpu_s) / $(S "$f" ingest_full_cadence_profiles_per_cpu_s)" ;;
    store.stages) sed -n 's/^decode + ingest + encode per profile: \([0-9]*\) profiles\/s/\1/p' "$f" ;;
    store.bytes) S "$f" bytes_per_value ;;
    store.rss) echo "$(S "$f" peak_rss_ingest_mib) / $(S "$f" peak_rss_compaction_mib) MiB" ;;
    store.warm) echo "$(merge "$f" 1h_one_pod warm) / $(merge "$f" 7d_one_pod warm)" ;;
    store.all-pods) echo "$(merge "$f" 7d_all_pods cold) / $(merge "$f" 7d_all_pods warm)" ;;
    store.cold)
      echo "$(merge "$f" 1h_one_pod cold) / $(merge "$f" 24h_one_pod cold) / $(merge "$f" 7d_one_pod cold);" \
        "$(merge "$f" 1h_all_pods cold) / $(merge "$f" 24h_all_pods cold) / $(merge "$f" 7d_all_pods cold)" ;;
    store-2000.*) f="$out/store-2000.txt" ;;&
    store-2000.ingest) echo "$(S "$f" ingest_profiles_per_cpu_s) / $(S "$f" ingest_full_cadence_profiles_per_cpu_s); $(S "$f" bytes_per_value)" ;;
    store-2000.rss)
      a="$(S "$out/store.txt" peak_rss_compaction_mib)"; b="$(S "$f" peak_rss_compaction_mib)"
      echo "$(S "$f" peak_rss_ingest_mib) / $b MiB${a:+ (compaction $(ratio "$a" "$b") the 500-pod peak)}" ;;
    store-2000.warm) echo "$(merge "$f" 1h_one_pod warm) / $(merge "$f" 7d_one_pod warm); $(merge "$f" 7d_all_pods warm)" ;;
    budget.rss)
      a="$(at_end "$out/budget-500.txt")"; b="$(at_end "$out/budget-2000.txt")"
      echo "$a / $b MiB ($(ratio "$a" "$b"); ingest phase alone" \
        "$(ratio "$(S "$out/budget-500.txt" peak_rss_ingest_mib)" "$(S "$out/budget-2000.txt" peak_rss_ingest_mib)"))" ;;
    rules.cost)
      awk '/ rules: / { n = $1; us[n] = $3 } /^checks/ { base = $NF == "us/profile" ? $(NF - 1) : base }
           /bytes\/point/ { bpp = $(NF - 1) }
           END { if (1 in us) printf "%s / %s / %s us per profile (checks %s); %s B per point\n", us[1], us[8], us[64], base, bpp }' "$out/rules.txt" ;;
    symbols.query)
      sed -n 's/^pods=.* upload_s=\([0-9.]*\) cold_s=\([0-9.]*\) warm_ms=\([0-9.]*\) named_ms=\([0-9.]*\) warm_over_named=\([-+0-9.]*%\) unsymbolized_ms=\([0-9.]*\).*/\2 s \/ \3 ms against \4 ms named (\5); unnamed \6 ms; upload \1 s/p' \
        "$out/symbols.txt" ;;
    replicas.queries)
      awk '/^replicas=/ { split($1, r, "="); for (i = 1; i <= NF; i++) { if ($i == "all") a[r[2]] = $(i + 2); if ($i == "one") o[r[2]] = $(i + 2) } }
           END { gsub(/p50=/, "", a[1]); gsub(/p50=/, "", a[2]); gsub(/p50=/, "", a[3]); gsub(/p50=/, "", o[1]); gsub(/p50=/, "", o[2]); gsub(/p50=/, "", o[3])
                 if (1 in a) printf "%s / %s / %s; %s / %s / %s\n", o[1], o[2], o[3], a[1], a[2], a[3] }' "$out/replicas.txt" ;;
    replicas.ingest)
      awk '/^replicas=/ { split($1, r, "="); for (i = 1; i <= NF; i++) if ($i ~ /^profiles\/s=/) { split($i, p, "="); v[r[2]] = p[2] } }
           END { if (1 in v) printf "%s / %s / %s\n", v[1], v[2], v[3] }' "$out/replicas.txt" ;;
    http.clients)
      local w rates=() cpus=()
      for w in 1 2 4 8; do read -r a b <<<"$(http_point "$out/http-$w.txt")"; rates+=("$a"); cpus+=("$b"); done
      echo "${rates[0]} / ${rates[1]} / ${rates[2]} / ${rates[3]} (${cpus[0]} / ${cpus[1]} / ${cpus[2]} / ${cpus[3]})" ;;
    hops.ingest)
      awk '$1 == "new" && $3 ~ /^clients=/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
             p = $2; n[p]++; r[p] += v["uploads/s"]; c[p] += v["cpu_s_per_1000"]; w[p] += v["switches_per_1000"] }
           END { if (n["ingest"] && n["write_raw"])
                   printf "%.0f, %.3f, %.0f / %.0f, %.3f, %.0f (means of %d runs)\n", r["ingest"] / n["ingest"], c["ingest"] / n["ingest"],
                     w["ingest"] / n["ingest"], r["write_raw"] / n["write_raw"], c["write_raw"] / n["write_raw"], w["write_raw"] / n["write_raw"], n["ingest"] }' \
        "$out/hops.txt" ;;
    cores.clients)
      awk '$1 == "new" && $2 ~ /^w=/ { w = substr($2, 3) }
           /\| protocol=/ { for (i = 1; i <= NF; i++) if ($i ~ /^seconds=/) { split($i, a, "="); s[w] = a[2] } }
           /\| accepted=/ { for (i = 1; i <= NF; i++) if ($i ~ /^profiles\/s=/) { split($i, a, "="); r[w] = a[2] } }
           /\| server cpu=/ { for (i = 1; i <= NF; i++) if ($i ~ /^cpu=/) { split($i, a, "="); c[w] = a[2] + 0 } }
           END { n = split("8 16 32", ws, " "); for (i = 1; i <= n; i++)
                   printf "%s%s (%.2f)", (i > 1 ? " / " : ""), r[ws[i]], s[ws[i]] ? c[ws[i]] / s[ws[i]] : 0; print "" }' "$out/cores.txt" ;;
    grpc.writeraw)
      local sep=""
      for a in 200 50; do
        b="$(grep -m1 '^accepted=' "$out/grpc-$a.txt")"
        printf '%s%s, %s ms' "$sep" "$(field "$b" 'profiles/s')" "$(field "$b" p99 | sed 's/ms$//')"
        sep=" / "
      done; echo ;;
    memory-limit.vmhwm)
      sed -n 's/.*peak RSS (VmHWM) \([0-9]*\) MiB with a [0-9]* MiB budget and limit; OOM kills \([0-9]*\).*/\1 MiB, \2/p' "$out/memory-limit.txt" | tail -1 ;;
    hostile.vmhwm)
      grep -o 'VmHWM [0-9]* MiB' "$out/hostile.txt" | awk '{ v = $2 + 0; if (!n++ || v < lo) lo = v; if (v > hi) hi = v }
        END { if (n) printf "%d-%d MiB over %d steps", lo, hi, n }'
      grep -q 'test result: ok' "$out/hostile.txt" && echo ", 0 OOM kills (test passed)" || echo ", test failed" ;;
    outage.acked)
      b="$(grep -m1 '^outage:' "$out/outage.txt")"
      if grep -q 'test result: ok' "$out/outage.txt"; then printf 'all (test passed)'; else printf 'test failed'; fi
      sed -n 's/.*drained \([^ ]*\) after the bucket returned; VmHWM [0-9]* MiB during the outage, \([0-9]*\) MiB at the end.*/, \1, \2 MiB/p' <<<"$b" ;;
    fuzz.parsers)
      awk '/ execs in / { c += $(NF - 2) + 0; h += $NF + 0; r = $7; gsub(/[(\/s),]/, "", r); r += 0
                          if (!n++ || r < lo) lo = r; if (r > hi) hi = r }
           END { if (n) printf "%d / %d; %d-%d (%d targets)\n", c, h, lo, hi, n }' "$out/fuzz.txt" ;;
    agent.overhead)
      awk '$1 == 19 || $1 == 99 { c[$1] = $2; r[$1] = $3; p[$1] = $4 }
           END { if (19 in c) printf "%s / %s %%; %s / %s, %s / %s MiB\n", c[19], c[99], r[19], p[19], r[99], p[99] }' "$out/agent.txt" ;;
    off-cpu.cost)
      awk '$3 == "on" { c[$1] = $4; r[$1] = $5; s[$1] = $6 }
           END { if (1000 in c) printf "%s %% / %s %%; %s / %s MiB (%s / %s switches/s)\n", c[1000], c[100000], r[1000], r[100000], s[1000], s[100000] }' \
        "$out/off-cpu.txt" ;;
    otel.symbols)
      sed -n 's/^before the upload: [0-9]* of \([0-9]*\) xz samples name lzma_code (\([0-9.]*\) %).*/\2 \1/p; s/^after the upload: *[0-9]* of [0-9]* xz samples name lzma_code (\([0-9.]*\) %).*/\1/p' \
        "$out/otel.txt" | paste -sd ' ' | awk 'NF == 3 { printf "%s %% -> %s %% of %s samples\n", $1, $3, $2 }' ;;
    peer.reach) peer_reach kiln ;;
    peer.cpu) peer_cpu kiln ;;
    pprof.hour)
      awk '/ deltas over .* stored .* under main.allocateKnown, ratio / {
             for (i = 1; i <= NF; i++) { if ($i == "allocated") a = $(i + 1); if ($i == "stored") s = $(i + 1); if ($i == "ratio") r = $(i + 1) }
             n = $2; sub(/:$/, "", $1); line[$1] = sprintf("%s of %s bytes (%s) over %s deltas", s, a, r, n) }
           END { if ("exact" in line) printf "exact: %s; sampled: %s\n", line["exact"], line["sampled"] }' "$out/pprof.txt" ;;
    e2e.offcpu) sed -n 's/^ *kiln_e2e_sleeper: \([0-9]*\) ms off-CPU in \([0-9]*\) ms (\([0-9]*\) %).*/\1 ms of \2 (\3 %)/p' "$out/e2e.txt" | tail -1 ;;
    e2e.pprof)
      { sed -n 's/^ *alloc_space, \([0-9]*\) deltas .*: \([0-9]*\) bytes allocated by main.allocateKnown .*, \([0-9]*\) stored under it (ratio \([0-9.]*\)).*/\3 of \2 bytes (\4) over \1 deltas/p' "$out/e2e.txt"
        sed -n 's/^ *goroutines stored\/counted by the program, per scrape: //p' "$out/e2e.txt" |
          awk '{ ok = 0; for (i = 1; i <= NF; i++) { split($i, g, "/"); if (g[1] == g[2]) ok++ } printf "%d of %d profiles with every goroutine\n", ok, NF }'
      } | tail -2 | paste -sd ';' | sed 's/;/; /' ;;
    unwinding.19hz) unwind_row 19 kiln-eh ;;
    unwinding.99hz) unwind_row 99 kiln-eh ;;
    python.cpu) agent_line "$out/python.txt" ;;
    binaries.rss) agent_line "$out/binaries.txt" ;;
    runtimes.reach)
      { sed -n 's/^\(.*\), no flags, .*: [0-9]* samples; [0-9.]* % name [^,]*, \([0-9.]*\) % name it called by.*/\1 \2 %/p' "$out/runtimes.txt"
        sed -n 's/^\([^:]*\): [0-9]* samples; [0-9.]* % name kilnHotJs, \([0-9.]*\) % name kilnHotJs and its caller.*/\1 \2 %/p' "$out/runtimes.txt"
        sed -n 's/^\(Ruby [^:]*\): [0-9]* samples; .* under kiln_rb_caller \([0-9.]*\) %.*/\1 \2 %/p' "$out/runtimes.txt"
        sed -n 's/^\(.*\): [0-9]* samples, \([0-9.]*\) % hot under its caller, .*/\1 \2 %/p' "$out/runtimes.txt"
      } | paste -sd ';' | sed 's/;/; /g' ;;
    reach.runtimes)
      { sed -n 's/^\(.*\): [0-9]* samples, [0-9.]* % hot under its caller, \([0-9.]*\) % hot<middle<outer with file.*/\1 \2 %/p' "$out/reach.txt"
        sed -n 's/^\(java\|node\): \([0-9]*\) of \([0-9]*\) samples name.*/\1 \2 \3/p' "$out/reach.txt" \
          | awk '{ printf "%s %.1f %%\n", $1, $3 ? 100 * $2 / $3 : 0 }'; } | paste -sd ';' | sed 's/;/; /g' ;;
    k8s-agent.churn)
      sed -n 's/^end: rss \([0-9]*\) KiB (start \([0-9]*\), peak [0-9]*); agent CPU .* = \([0-9.]*\) % of one core/\1 \2 \3/p' \
        "$out/k8s-agent.txt" | awk '{ printf "%.1f MiB (start %.1f); %s %%\n", $1 / 1024, $2 / 1024, $3 }' ;;
    ui.flamegraph)
      grep -m1 -o 'measured: {.*}' "$out/ui.txt" | sed 's/^measured: //' | python3 -c '
import json, sys
m = json.load(sys.stdin)
print("{:,} nodes: {} / {} / {} ms".format(m["nodes"], m["layoutMs"], m["drawFullMs"], m["drawZoomedMs"]))' 2>/dev/null ;;
    e2e.checks) sed -n 's/.*PASS: checks 1-[0-9]* passed in \([0-9]*\) s.*/\1 s/p' "$out/e2e.txt" | tail -1 ;;
  esac
}
peers() { # row -> the peers measured in this run, if the row has any
  case "$1" in
    unwinding.19hz | unwinding.99hz)
      local hz="${1#unwinding.}" p b
      hz="${hz%hz}"; p="$(unwind_row "$hz" perf)"; b="$(unwind_row "$hz" bee)"
      echo "perf: ${p:-not run}; profile-bee: ${b:-not run (no probee)}" ;;
    peer.reach) echo "OTel eBPF profiler: $(peer_reach otel-ebpf-profiler)" ;;
    peer.cpu) echo "OTel eBPF profiler: $(peer_cpu otel-ebpf-profiler)" ;;
    python.cpu)
      local l
      l="$(grep -m1 '^peer=otel' "$out/python-peer.txt" 2>/dev/null)"
      if [ -n "$l" ]; then
        echo "OTel eBPF profiler ${l#peer=otel-ebpf-profiler@}" | sed -n 's/^\(OTel eBPF profiler [^ ]*\) .* cpu=\([0-9.]*\)%core.* rss=\([0-9.]*\)MiB peak_rss=\([0-9.]*\)MiB.*/\1 (whole host): \2 %; \3 \/ \4 MiB/p'
      else
        echo "OTel eBPF profiler: not run ($(tail -1 "$out/python-peer.txt" 2>/dev/null || echo 'no output'))"
      fi ;;
    *) echo "—" ;;
  esac
}

machine="$(nproc)-vCPU $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
commit="\`$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\`"
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit + uncommitted changes"
today="$(date -u +%F)"

echo
awk '/<!-- headline:start -->/ { on = 1; next } /<!-- headline:end -->/ { on = 0 } on' "$page" | head -2
awk '/<!-- headline:start -->/ { on = 1; next } /<!-- headline:end -->/ { on = 0 } on' "$page" | tail -n +3 |
  while IFS='|' read -r _ row figure _ floor _; do
    row="$(sed 's/^ *`//; s/` *$//' <<<"$row")"
    group="${row%%.*}"
    printf '%s\n' "${selected[@]}" | grep -qx -- "$group" || continue
    log="\`$out/$group*.txt\`"
    if [ -n "${not_run[$group]:-}" ]; then
      kiln="not run: ${not_run[$group]}"
      log="—"
    else
      kiln="$(cell "$row" | tr '\n' ' ' | sed 's/ *$//')"
      grep -q '[0-9]' <<<"$kiln" || kiln="no figure found in the output (see the log)"
    fi
    printf '| `%s` |%s| %s |%s| %s | %s | %s, %s | %s |\n' "$row" "$figure" "$kiln" "$floor" \
      "$(if [ -n "${not_run[$group]:-}" ]; then echo —; else peers "$row"; fi)" "$machine" "$today" "$commit" "$log"
  done
echo
echo "raw outputs: $out"
