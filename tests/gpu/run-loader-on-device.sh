#!/usr/bin/env bash
# On the GPU machine, in one call: the loader's GPU checks and issue 4's measurements --
# gpu_load_test (staging ring == host path, pooled buffers reused), fp8_quant_gpu_test
# (online fp8 through the ring == CPU), fp8_quant_bench (kernel throughput, f16 and bf16),
# each when carried, then the cold-load benchmark (run-load-bench-on-device.sh: raw reads,
# our load, safetensors.torch.load_file, cold and hot, 8 and 32 GiB).
#
# Here:    WC_CARRY_DIR=$PWD/.device-carry-loader \
#            WC_CARRY_TARGETS="gpu_load_test fp8_quant_gpu_test fp8_quant_bench load_bench" \
#            tests/gpu/prepare-carry.sh build-cuda
# Device:  run(kind="nvidia-h200", carry=[".device-carry-loader"],
#              command="bash tests/gpu/run-loader-on-device.sh")
# Environment: as run-load-bench-on-device.sh (SIZES, CONFIGS, DEADLINE, TIMEOUT).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
export WC_CARRY_DIR=${WC_CARRY_DIR:-$root/.device-carry-loader}
carry=$WC_CARRY_DIR
export OUT=${OUT:-/tmp/wc-loader-out}
mkdir -p "$OUT"
section() { printf '\n===== %s =====\n' "$*"; }
fail=()
libs=$carry/lib
if ldd "$carry/bin/gpu_load_test" | grep -q "not found"; then libs=$carry/lib:$carry/lib-fallback; fi

# Each step runs when its binary was carried.
step() {
  local name=$1 title=$2
  shift 2
  [[ -x $carry/bin/$name ]] || { echo "($name not carried: skipped)"; return 0; }
  section "$name: $title"
  LD_LIBRARY_PATH=$libs timeout 300 "$carry/bin/$name" "$@" 2>&1 | tee "$OUT/$name.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || fail+=("$name")
}
step gpu_load_test "staging ring == host path; pooled buffers reused"
step fp8_quant_gpu_test "online fp8 on the load path == CPU, bit for bit"
step fp8_quant_bench "kernel throughput" --iters=20

bash "$root/tests/gpu/run-load-bench-on-device.sh" || fail+=(load_bench)
section "loader checks: $([[ ${#fail[@]} == 0 ]] && echo PASS || echo "FAIL (${fail[*]})")"
[[ ${#fail[@]} == 0 ]]
