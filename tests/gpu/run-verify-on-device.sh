#!/usr/bin/env bash
# One device call after a loader change: the GPU load path against the host path
# (gpu_load_test: O_DIRECT on and off, tensor-parallel pieces), the whole stack
# (stack_gpu_test) and the loader's online-fp8 path (fp8_quant_gpu_test). Logs under $OUT.
#   WC_CARRY_DIR=$PWD/.device-carry-verify \
#   WC_CARRY_TARGETS="gpu_load_test stack_gpu_test wc_gpu_client weightcached weightcachectl fp8_quant_gpu_test" \
#     tests/gpu/prepare-carry.sh BUILD_DIR
#   run(carry=[".device-carry-verify"], command="bash tests/gpu/run-verify-on-device.sh")
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=${WC_CARRY_DIR:-$root/.device-carry-verify}
OUT=${OUT:-/tmp/wc-verify-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$carry/lib
export WEIGHTCACHED=$carry/bin/weightcached WC_GPU_CLIENT=$carry/bin/wc_gpu_client
if ! "$carry/bin/gpu_load_test" --gtest_list_tests >/dev/null 2>&1; then
  export LD_LIBRARY_PATH=$carry/lib:$carry/lib-fallback
fi
failed=()
for t in gpu_load_test stack_gpu_test fp8_quant_gpu_test; do
  printf '\n===== %s =====\n' "$t"
  timeout 240 "$carry/bin/$t" --gtest_output="xml:$OUT/$t.xml" 2>&1 | tee "$OUT/$t.log" \
    | grep -vE '^\[ RUN|^I [0-9]' | tail -25
  [[ ${PIPESTATUS[0]} == 0 ]] || failed+=("$t")
done
printf '\n===== result: %s =====\n' "$([[ ${#failed[@]} == 0 ]] && echo PASS || echo "FAIL (${failed[*]})")"
