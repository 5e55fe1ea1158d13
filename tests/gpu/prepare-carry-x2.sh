#!/usr/bin/env bash
# Here (the build machine): the carry for tests/gpu/run-on-device-x2.sh — the 2-GPU test, its
# engine, the daemon, the CLI and the P2P benchmark with the shared libraries the GPU
# machine's image lacks, in .device-carry-x2/ (git-ignored). prepare-carry.sh does the work.
#
#   tests/gpu/prepare-carry-x2.sh [build-dir]     (default: build-mgpu)
# then, through the device tool (kind nvidia-h200-x2):
#   run  kind=nvidia-h200-x2  carry=[".device-carry-x2"]  command="bash tests/gpu/run-on-device-x2.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
WC_CARRY_DIR=$root/.device-carry-x2 \
WC_CARRY_TARGETS="multi_gpu_test wc_mgpu_engine weightcached weightcachectl gpu_p2p_bench memory_test" \
  exec bash "$root/tests/gpu/prepare-carry.sh" "${1:-$root/build-mgpu}"
