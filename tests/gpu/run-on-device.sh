#!/usr/bin/env bash
# On the GPU machine, in one call: run the GPU tests and the GPU benchmark from the binaries
# that tests/gpu/prepare-carry.sh put in .device-carry/, logs under $OUT.
#
#   run(carry=[".device-carry"], command="bash tests/gpu/run-on-device.sh")
# Environment: OUT (log folder, default /tmp/wc-gpu-out); BENCH_ARGS (gpu_map_bench flags);
# SKIP_BENCH=1 to run the tests only.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=$root/.device-carry
OUT=${OUT:-/tmp/wc-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$carry/lib
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
fail=0

section() { printf '\n===== %s =====\n' "$*"; }
exec > >(tee "$OUT/gpu.log") 2>&1
section machine
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
uname -r; grep PRETTY_NAME /etc/os-release; ldd --version | head -1; nproc
echo "ulimit -n: $(ulimit -n)"
if ldd "$carry/bin/cuda_vmm_test" | grep -q 'not found' ||
   ! "$carry/bin/memory_test" --gtest_list_tests >/dev/null 2>&1; then
  echo "using the carried C++ runtime (lib-fallback)"
  export LD_LIBRARY_PATH=$carry/lib:$carry/lib-fallback
fi
ldd "$carry/bin/cuda_vmm_test" | grep -E 'not found|libcuda' || true

section "cuda_vmm_test (label gpu)"
timeout 300 "$carry/bin/cuda_vmm_test" --gtest_output="xml:$OUT/cuda_vmm_test.xml" || fail=1

section "memory_test (host backend and auto selection, which finds the GPU here)"
timeout 120 "$carry/bin/memory_test" || fail=1

if [[ ${SKIP_BENCH:-0} != 1 ]]; then
  section "gpu_map_bench ${BENCH_ARGS:-}"
  # shellcheck disable=SC2086
  timeout 300 "$carry/bin/gpu_map_bench" ${BENCH_ARGS:-} >"$OUT/gpu_map_bench.md" || fail=1
  cat "$OUT/gpu_map_bench.md"
fi

section "kernel log (Xid = GPU faults; one Xid 31 from the read-only write test is expected)"
(dmesg 2>/dev/null | grep -i xid | tail -5) || echo "dmesg not readable"
section "result: $([[ $fail == 0 ]] && echo PASS || echo FAIL)"
exit $fail
