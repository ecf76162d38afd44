# shellcheck shell=bash
# shellcheck disable=SC2034,SC2154 # a sourced file: it uses and sets variables shared with e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Setup: the `kiln` CLI, the workload images, and the install exactly as the README's
# Kubernetes quickstart does it.

# The `kiln` CLI: KILN_CLI, else on PATH, else built from store/cli.
find_kiln_cli() {
  if [ -n "${KILN_CLI:-}" ]; then
    kiln_cli="$KILN_CLI"
  elif command -v kiln >/dev/null 2>&1; then
    kiln_cli="$(command -v kiln)"
  else
    note "building the kiln CLI (cargo build -p kiln-cli)"
    (cd "$repo" && cargo build --quiet -p kiln-cli --bin kiln) || fail "cannot build the kiln CLI"
    kiln_cli="${CARGO_TARGET_DIR:-$repo/target}/debug/kiln"
  fi
  [ -x "$kiln_cli" ] || fail "no kiln CLI at $kiln_cli"
  note "kiln CLI: $kiln_cli ($("$kiln_cli" --version))"
}

# The CPU burner, static, in an image of its own, loaded into the nodes' runtime.
build_workload_image() {
  local rootfs="$work_dir/workload-rootfs" archive="$work_dir/hot-loop.tar"
  gcc -O2 -static -pthread -fno-omit-frame-pointer -Wall -Wextra -Werror \
    -o "$work_dir/kiln-e2e-hot-loop" "$e2e_dir/workload/hot_loop.c" || fail "cannot build the workload"
  "$e2e_dir/images/rootfs.sh" "$rootfs" "$work_dir/kiln-e2e-hot-loop=/usr/local/bin/kiln-e2e-hot-loop" \
    || fail "cannot assemble the workload's root filesystem"
  SOURCE_DATE_EPOCH="$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)" \
    "$e2e_dir/images/oci-image.py" --name "$workload_image" --rootfs "$rootfs" --output "$archive" \
    --entrypoint '["/usr/local/bin/kiln-e2e-hot-loop"]' --user 65532:65532 >/dev/null \
    || fail "cannot write the workload image"
  # shellcheck disable=SC2086 # KILN_E2E_LOAD_IMAGE is a command line
  ${KILN_E2E_LOAD_IMAGE:-$e2e_dir/images/load.sh} "$archive" >/dev/null \
    || fail "cannot load $archive into the nodes (set KILN_E2E_LOAD_IMAGE)"
  note "workload image $workload_image ($(du -k "$archive" | cut -f1) KiB) loaded"
}

# The suite installs config/default and removes it at the end; an install by another tool
# (a Helm release) is someone else's, so the suite stops before touching anything.
refuse_foreign_install() {
  local managers
  managers="$(kubectl get crd profilestores.kiln.dev -o json 2>/dev/null \
    | jq -r '[.metadata.managedFields[]?.manager] | unique | join(",")')" || true
  case ",$managers," in
    *,helm,*)
      config_installed=no
      fail "the kiln.dev CRDs are installed by Helm (managers: $managers): uninstall that release first, the suite installs config/default itself" ;;
  esac
}

# Anything a killed earlier run left would make this run's checks lie.
remove_leftovers() {
  local store
  for store in "$replicas_store" "$store_name"; do
    if kubectl get crd profilestores.kiln.dev >/dev/null 2>&1 \
       && kubectl -n "$system_ns" get profilestore "$store" >/dev/null 2>&1; then
      note "deleting ProfileStore $system_ns/$store left by an earlier run"
      kubectl -n "$system_ns" delete profilestore "$store" --timeout=120s >/dev/null
    fi
  done
  kubectl -n "$system_ns" delete secret "$replicas_store-s3" --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete namespace "$workload_ns" --ignore-not-found --timeout=120s >/dev/null
  kubectl -n "$system_ns" delete pvc "data-$store_name-0" --ignore-not-found --timeout=60s >/dev/null 2>&1 || true
  kubectl delete pv "$system_ns-data-$store_name-0" --ignore-not-found --timeout=60s >/dev/null
}

# The operator's images when they differ from config/'s, the way a user overrides them.
override_images() {
  if [ "$operator_image" != "$default_operator_image" ]; then
    kubectl -n "$system_ns" set image deployment/kiln-operator "kiln-operator=$operator_image"
  fi
  if [ "$store_image" != "$default_store_image" ] || [ "$agent_image" != "$default_agent_image" ]; then
    local args
    args="$(kubectl -n "$system_ns" get deployment kiln-operator -o json | jq -c \
      --arg store "--store-image=$store_image" --arg agent "--agent-image=$agent_image" \
      '.spec.template.spec.containers[0].args
       | map(if startswith("--store-image=") then $store
             elif startswith("--agent-image=") then $agent else . end)')"
    kubectl -n "$system_ns" patch deployment kiln-operator --type=json \
      -p "[{\"op\":\"replace\",\"path\":\"/spec/template/spec/containers/0/args\",\"value\":$args}]"
  fi
}

# The store's claim needs a volume: a cluster with a default StorageClass provisions one; on
# a bare cluster the suite, as cluster admin, makes a local PersistentVolume for it.
provide_store_volume() {
  local default_class
  default_class="$(kubectl get storageclass -o json | jq -r '.items[]
    | select(.metadata.annotations["storageclass.kubernetes.io/is-default-class"] == "true")
    | .metadata.name' | head -1)"
  if [ -n "$default_class" ]; then
    note "the default StorageClass $default_class provisions the store's claim"
    return
  fi
  local node
  node="$(kubectl get nodes -o jsonpath='{.items[0].metadata.labels.kubernetes\.io/hostname}')"
  mkdir -p "$volume_dir" || fail "cannot create $volume_dir for the store's PersistentVolume"
  created_volume="$system_ns-data-$store_name-0"
  "$e2e_dir/local-volume.sh" "$system_ns" "data-$store_name-0" "$node" "$volume_dir" \
    | kubectl apply -f - >/dev/null
  note "local PersistentVolume $created_volume: $volume_dir on node $node"
}

setup() {
  log "setup"
  refuse_foreign_install
  find_kiln_cli
  build_workload_image
  build_runtime_images
  build_pprof_image
  build_seaweedfs_image
  remove_leftovers

  # The README's quickstart, in its order.
  kubectl apply --server-side -k "$repo/config/default"
  override_images
  # Images built here and loaded into the nodes: never pull (the store's and agents' too).
  kubectl -n "$system_ns" patch deployment kiln-operator -p "{\"spec\":{\"template\":{\"spec\":{\"containers\":[{\"name\":\"kiln-operator\",\"imagePullPolicy\":\"$pull_policy\",\"env\":[{\"name\":\"KILN_IMAGE_PULL_POLICY\",\"value\":\"$pull_policy\"}]}]}}}}"
  kubectl wait --for=condition=Established --timeout=60s \
    crd/profilestores.kiln.dev crd/profilingtargets.kiln.dev >/dev/null
  kubectl -n "$system_ns" rollout status deploy/kiln-operator --timeout=180s \
    || fail "the operator did not start"
  provide_store_volume
}
