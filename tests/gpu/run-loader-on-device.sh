#!/usr/bin/env bash
# On the GPU machine, in one call: the loader's GPU checks and issue 4's measurements --
# gpu_load_test (staging ring == host path, pooled buffers reused), fp8_quant_bench (kernel
# throughput, f16 and bf16), then the cold-load benchmark (run-load-bench-on-device.sh:
# raw reads, our load, safetensors.torch.load_file, cold and hot, 8 and 32 GiB).
#
# Here:    WC_CARRY_DIR=$PWD/.device-carry-loader \
#            WC_CARRY_TARGETS="gpu_load_test fp8_quant_bench load_bench" \
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

section "gpu_load_test: staging ring == host path; pooled buffers reused"
LD_LIBRARY_PATH=$libs timeout 120 "$carry/bin/gpu_load_test" 2>&1 | tee "$OUT/gpu_load_test.log"
[[ ${PIPESTATUS[0]} == 0 ]] || fail+=(gpu_load_test)

section "fp8_quant_bench: kernel throughput"
LD_LIBRARY_PATH=$libs timeout 120 "$carry/bin/fp8_quant_bench" --iters=20 2>&1 |
  tee "$OUT/fp8_quant_bench.md"
[[ ${PIPESTATUS[0]} == 0 ]] || fail+=(fp8_quant_bench)

bash "$root/tests/gpu/run-load-bench-on-device.sh" || fail+=(load_bench)
section "loader checks: $([[ ${#fail[@]} == 0 ]] && echo PASS || echo "FAIL (${fail[*]})")"
[[ ${#fail[@]} == 0 ]]
