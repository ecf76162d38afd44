#!/usr/bin/env bash
# Issue 13's scale benchmark in one command: the end-to-end store workload
# (store/storage/benches/workload.rs) at 500 and at 2,000 pods, then
# kiln-store loaded over HTTP /ingest from 1, 2, 4 and 8 client processes
# (store/benches/write_load.rs); prints one table of the figures the issue
# asks for. Release builds (cargo's bench profile).
#
# Usage: store/bench/scale.sh
# Knobs (environment):
#   KILN_SCALE_PODS      pod counts to run the workload at (default "500 2000")
#   KILN_SCALE_WRITERS   HTTP client counts (default "1 2 4 8")
#   KILN_SCALE_SECONDS   seconds of HTTP load per client count (default 10)
#   KILN_BENCH_WORKLOADS workloads the HTTP load's pods belong to (default 10)
#   KILN_SCALE_SKIP_HTTP set to skip the HTTP part
#   KILN_BENCH_*         passed to the workload (its time axis: see workload.rs)
# Raw outputs are kept in the directory printed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=$(mktemp -d -t kiln-scale.XXXXXX)
pods_list=${KILN_SCALE_PODS:-500 2000}
writers_list=${KILN_SCALE_WRITERS:-1 2 4 8}

for pods in $pods_list; do
  echo "== workload at $pods pods" >&2
  # The local bucket is all the workload uses; no cloud backends to build.
  KILN_BENCH_PODS=$pods cargo bench -p kiln-storage --no-default-features --bench workload \
    | tee "$out/workload-$pods.txt" >&2
done
if [ -z "${KILN_SCALE_SKIP_HTTP:-}" ]; then
  for writers in $writers_list; do
    echo "== HTTP /ingest from $writers clients" >&2
    KILN_BENCH_PROTOCOL=ingest KILN_BENCH_WRITERS=$writers KILN_BENCH_CLIENT_PROCESSES=1 \
      KILN_BENCH_SECONDS=${KILN_SCALE_SECONDS:-10} \
      cargo bench -p kiln-store --bench write_load | tee "$out/http-$writers.txt" >&2
  done
fi

summary() { # file name -> the values after "SUMMARY name"
  awk -v name="$2" '$1 == "SUMMARY" && $2 == name { $1 = ""; $2 = ""; sub(/^ +/, ""); print }' "$1"
}

echo
echo "| figure | $(for p in $pods_list; do printf '%s pods | ' "$p"; done)"
echo "|---|$(for _ in $pods_list; do printf -- '---|'; done)"
for figure in profiles peak_rss_ingest_mib peak_rss_compaction_mib bytes_per_value \
  ingest_profiles_per_cpu_s ingest_values_per_cpu_s ingest_full_cadence_profiles_per_cpu_s \
  ingest_cpu_s_by_phase \
  merge_1h_one_pod_ms_cpu merge_24h_one_pod_ms_cpu merge_7d_one_pod_ms_cpu \
  merge_1h_all_pods_ms_cpu merge_24h_all_pods_ms_cpu merge_7d_all_pods_ms_cpu; do
  row="| $figure |"
  for pods in $pods_list; do
    row="$row $(summary "$out/workload-$pods.txt" "$figure") |"
  done
  echo "$row"
done

if [ -z "${KILN_SCALE_SKIP_HTTP:-}" ]; then
  echo
  echo "| HTTP clients | accepted profiles/s | p99 | store CPU busy (cores) | profiles per store CPU-second | client CPU (cores) |"
  echo "|---|---|---|---|---|---|"
  for writers in $writers_list; do
    awk -v writers="$writers" '
      /^protocol=/ { for (i = 1; i <= NF; i++) if ($i ~ /^seconds=/) { split($i, a, "="); secs = a[2] } }
      /^accepted=/ { for (i = 1; i <= NF; i++) { split($i, a, "="); v[a[1]] = a[2] } }
      /^server cpu=/ { split($2, a, "="); cpu = a[2] + 0; split($NF, b, "="); per = b[2] }
      /^client cpu=/ { split($2, a, "="); client = a[2] + 0 }
      END { printf "| %s | %s | %s | %.2f | %s | %.2f |\n", writers, v["profiles/s"], v["p99"], cpu / secs, per, client / secs }
    ' "$out/http-$writers.txt"
  done
fi
echo
echo "raw outputs: $out"
