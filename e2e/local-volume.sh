#!/usr/bin/env bash
# Prints a local PersistentVolume for one claim, as a cluster admin without a dynamic
# provisioner would create it: the directory DIR on node NODE, reserved for the claim
# NAMESPACE/CLAIM (claimRef), so no other claim can take it. No StorageClass: it binds to a
# claim that names none, as the ProfileStore's does by default. Unlike a hostPath volume, a
# local volume gets the pod's fsGroup, so the store (uid 65532) can write to it. DIR must exist
# on the node. Kept (Retain) when the claim goes, so deleting it stays the admin's decision.
#
#   e2e/local-volume.sh NAMESPACE CLAIM NODE DIR [SIZE] | kubectl apply -f -
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: local-volume.sh NAMESPACE CLAIM NODE DIR [SIZE]" >&2; exit 2; }
namespace="$1" claim="$2" node="$3" dir="$4" size="${5:-10Gi}"
cat <<YAML
apiVersion: v1
kind: PersistentVolume
metadata:
  name: $namespace-$claim
  labels:
    app.kubernetes.io/part-of: kiln
spec:
  capacity:
    storage: $size
  accessModes: ["ReadWriteOnce"]
  persistentVolumeReclaimPolicy: Retain
  volumeMode: Filesystem
  claimRef:
    namespace: $namespace
    name: $claim
  local:
    path: $dir
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - key: kubernetes.io/hostname
              operator: In
              values: ["$node"]
YAML
