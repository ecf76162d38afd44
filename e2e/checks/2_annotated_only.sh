# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Check 2: only the annotated pod is profiled; its profile carries the pod's identity and the
# workload's hot function.

check_annotated_only() {
  log "check 2: only the annotated pod's profile reaches the store"
  forward_store
  annotated_pod="$(pod_of annotated)"
  plain_pod="$(pod_of plain)"
  if [ -z "$annotated_pod" ] || [ -z "$plain_pod" ]; then fail "the workload pods are not running"; fi
  local node began=$SECONDS since
  node="$(kubectl -n "$workload_ns" get pod "$annotated_pod" -o jsonpath='{.spec.nodeName}')"
  since="$(date -d '-10 min' +%s)"
  retry 240 5 has_profile "$annotated_pod" "$since" \
    || fail "no profile of $annotated_pod reached the store within 4 minutes"
  note "first profile of $annotated_pod after $((SECONDS - began)) s"

  local series matchers="{namespace=\"$workload_ns\",pod=\"$annotated_pod\"}"
  series="$("$kiln_cli" series --json --from "$since" "$cpu_type$matchers")"
  note "series: $(jq -c . <<<"$series")"
  jq -e --arg ns "$workload_ns" --arg pod "$annotated_pod" --arg node "$node" \
    'length >= 1 and all(.[]; .namespace == $ns and .pod == $pod and .container == "burner"
                          and .node == $node and .suite == "e2e")' <<<"$series" >/dev/null \
    || fail "the profile of $annotated_pod is not labelled namespace=$workload_ns pod=$annotated_pod container=burner node=$node suite=e2e"

  local stacks total
  stacks="$(folded "$matchers" "$since")"
  total="$(cpu_total "$matchers" "$since")"
  grep -q 'kiln_e2e_hot_loop' <<<"$stacks" \
    || fail "kiln_e2e_hot_loop is on none of $annotated_pod's stacks: $(head -5 <<<"$stacks")"
  local hot
  # %.0f: awk prints a large sum as 2.2e+09, which shell arithmetic refuses.
  hot="$(awk '/kiln_e2e_hot_loop/ { sum += $NF } END { printf "%.0f\n", sum }' <<<"$stacks")"
  note "$annotated_pod: $(samples "$matchers" "$since") samples, $((hot * 100 / total))% of them in kiln_e2e_hot_loop"
  note "hottest stack: $(awk '{ print $NF " " $0 }' <<<"$stacks" | sort -n -r | head -1 | cut -d' ' -f2- | cut -c1-200)"

  # One more agent window, so the plain pod had every chance to show up.
  sleep $((agent_window_seconds * 2))
  local pods
  pods="$(pods_with_profiles "$since")"
  note "pods with profiles in $workload_ns: $(tr '\n' ' ' <<<"$pods")"
  if grep -qxF "$plain_pod" <<<"$pods"; then
    fail "the plain pod $plain_pod was profiled without the annotation"
  fi
}

# Check 8b (run after check 8, once the annotated pod has run for minutes): the workload's
# second thread sleeps in kiln_e2e_sleeper all its life, so the store's off-CPU profile of
# the pod (spec.agent.offCpu in config/samples) names it with the wall time of the range.
# Agent windows are 10 s apart, so a 60 s range holds six of them whatever its phase; each
# holds the sleeps that ended in it.
check_off_cpu() {
  log "check 8b: the annotated pod's sleeping thread shows under off_cpu with the time it slept"
  forward_store
  local pod matchers t0 t1 stacks slept span_ns
  pod="$(pod_of annotated)"
  [ -n "$pod" ] || fail "the annotated workload pod is not running"
  matchers="{namespace=\"$workload_ns\",pod=\"$pod\"}"
  t1=$(( $(date +%s) - 2 * agent_window_seconds ))
  t0=$(( t1 - 60 ))
  stacks="$("$kiln_cli" query --format folded --from "$t0" --to "$t1" "off_cpu:off_cpu$matchers")" \
    || fail "no off_cpu profile of $pod between $t0 and $t1"
  grep -q 'kiln_e2e_sleeper' <<<"$stacks" \
    || fail "kiln_e2e_sleeper is on none of $pod's off-CPU stacks: $(head -5 <<<"$stacks")"
  slept="$(awk '/kiln_e2e_sleeper/ { sum += $NF } END { printf "%.0f\n", sum }' <<<"$stacks")"
  span_ns=$(( (t1 - t0) * 1000000000 ))
  note "kiln_e2e_sleeper: $((slept / 1000000)) ms off-CPU in $((span_ns / 1000000)) ms ($((slept * 100 / span_ns)) %)"
  note "its stack: $(grep 'kiln_e2e_sleeper' <<<"$stacks" | sort -t' ' -k2 -n -r | head -1 | cut -c1-200)"
  if (( slept * 100 < span_ns * 85 || slept * 100 > span_ns * 115 )); then
    fail "kiln_e2e_sleeper slept $slept ns by the off-CPU profile, not the range's $span_ns ns (within 15 %)"
  fi
}
