#!/usr/bin/env bash
# On the GPU machine, in one call: online block-FP8 quantization (issue 4) -- the kernel ==
# CPU and loader tests (fp8_quant_gpu_test, label gpu), PyTorch parity (fp8_torch_parity.py
# + fp8_quant_bench --compare) and the throughput table (fp8_quant_bench); logs under $OUT.
#
# Here:    WC_CARRY_DIR=$PWD/.device-carry-fp8 WC_CARRY_TARGETS="fp8_quant_gpu_test fp8_quant_bench" \
#            tests/gpu/prepare-carry.sh build-fp8
# Device:  run(carry=[".device-carry-fp8"], command="bash tests/gpu/run-fp8-on-device.sh")
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=${WC_CARRY_DIR:-$root/.device-carry-fp8}
OUT=${OUT:-/tmp/wc-fp8-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$carry/lib
fail=0
failed=()
section() { printf '\n===== %s =====\n' "$*"; }
step() {
  local name=$1 t=$2
  shift 2
  local s0=$SECONDS
  timeout "$t" "$@"
  local rc=$?
  echo "[$name: exit $rc, $((SECONDS - s0)) s]" >&2
  if [[ $rc != 0 ]]; then fail=1; failed+=("$name"); fi
  return $rc
}
exec > >(tee "$OUT/fp8.log") 2>&1
section machine
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
if ldd "$carry/bin/fp8_quant_gpu_test" | grep -q 'not found' ||
   ! "$carry/bin/fp8_quant_gpu_test" --gtest_list_tests >/dev/null 2>&1; then
  echo "using the carried C++ runtime (lib-fallback)"
  export LD_LIBRARY_PATH=$carry/lib:$carry/lib-fallback
fi

section "fp8_quant_gpu_test (label gpu): kernel == CPU bit for bit (3 variants); exhaustive proofs (hw cvt over 2^32 floats, fast element path over 2^32 (amax, x) pairs); loader cuda-vmm path"
step fp8_quant_gpu_test 300 "$carry/bin/fp8_quant_gpu_test" \
  --gtest_output="xml:$OUT/fp8_quant_gpu_test.xml"

section "PyTorch parity: torch (clamp to +-448, to(float8_e4m3fn)) vs our kernel and CPU"
pdir=$(mktemp -d /tmp/wc-fp8-parity.XXXXXX)
if step torch_reference 300 env PYTHONUNBUFFERED=1 python3 "$root/tests/gpu/fp8_torch_parity.py" "$pdir"; then
  step torch_parity 300 "$carry/bin/fp8_quant_bench" --compare="$pdir" | tee "$OUT/fp8_torch_parity.md"
fi

section "fp8_quant_bench: kernel throughput"
step fp8_quant_bench 300 "$carry/bin/fp8_quant_bench" --iters=20 | tee "$OUT/fp8_quant_bench.md"

section "result: $([[ $fail == 0 ]] && echo PASS || echo "FAIL (${failed[*]})")"
exit $fail
