# shellcheck shell=bash
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
