#!/usr/bin/env bash
# test_vm_fabric — the fabric tier on a CPU-less NUMA node and on a devdax
# device, with the kernel's own drivers, in a qemu VM (scripts/vm-fabric;
# 20-60 s under -accel tcg on 2 shared cores). Skipped (77) where qemu, a
# kernel image or busybox is missing (scripts/bootstrap installs them), or
# with KVT_VM_FABRIC=0.
set -u
KVT=${1:?usage: test_vm_fabric.sh path/to/kvtier}
build=$(cd "$(dirname "$KVT")" && pwd)
src=${KVT_SOURCE_DIR:-$(dirname "$0")/..}
[ "${KVT_VM_FABRIC:-1}" = 0 ] && { echo "skip: KVT_VM_FABRIC=0"; exit 77; }
tmp=${KVT_TEST_TMP:-/tmp}/test-scratch
mkdir -p "$tmp"
TMPDIR=$tmp exec "$src/scripts/vm-fabric" --build "$build" --timeout "${KVT_VM_FABRIC_TIMEOUT:-540}"
