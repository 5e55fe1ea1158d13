#!/usr/bin/env bash
# On the GPU machine, in one call: every GPU test (what `ctest -L gpu` runs here), the
# libtorch adapter test built there against its own libtorch, and the GPU benchmarks, from
# what tests/gpu/prepare-carry.sh put in .device-carry/; logs under $OUT.
#
#   run(carry=[".device-carry"], command="bash tests/gpu/run-on-device.sh")
# Environment: OUT (log folder, default /tmp/wc-gpu-out); BENCH_ARGS (gpu_acquire_bench
# flags, e.g. --max_gib=8); MAP_BENCH_ARGS (gpu_map_bench flags); PEER_FILL_ARGS
# (peer_fill_bench flags, default --gib=8); SKIP_BENCH=1: tests only.
# (ctest itself is not used there: its files carry the build machine's paths.)
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=$root/.device-carry
OUT=${OUT:-/tmp/wc-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$carry/lib
export WEIGHTCACHED=$carry/bin/weightcached WC_GPU_CLIENT=$carry/bin/wc_gpu_client
export WC_GPU_HELPER=$carry/bin/wc_gpu_helper
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
fail=0
failed=()

section() { printf '\n===== %s =====\n' "$*"; }
step() {  # step NAME TIMEOUT CMD...: runs, records a failure by name
  local name=$1 t=$2
  shift 2
  local s0=$SECONDS
  timeout "$t" "$@"
  local rc=$?
  echo "[$name: exit $rc, $((SECONDS - s0)) s]" >&2
  if [[ $rc != 0 ]]; then fail=1; failed+=("$name"); fi
  return $rc
}
exec > >(tee "$OUT/gpu.log") 2>&1
section machine
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
uname -r; grep PRETTY_NAME /etc/os-release; ldd --version | head -1; nproc; g++ --version | head -1
echo "ulimit -n: $(ulimit -n)"
if ldd "$carry/bin/cuda_vmm_test" | grep -q 'not found' ||
   ! "$carry/bin/memory_test" --gtest_list_tests >/dev/null 2>&1; then
  echo "using the carried C++ runtime (lib-fallback)"
  export LD_LIBRARY_PATH=$carry/lib:$carry/lib-fallback
fi
ldd "$carry/bin/weightcached" | grep -E 'not found|libcuda' || true
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
ls -l /dev/nvidia* 2>&1 | head -8
# Can an engine initialise CUDA in other namespaces / as another uid? (cuInit's answer)
for w in "" "unshare --pid --ipc --mount --fork" "unshare --pid --ipc --mount --fork --mount-proc" "setpriv --reuid=65534 --regid=65534 --clear-groups" \
         "unshare --pid --ipc --mount --fork setpriv --reuid=65534 --regid=65534 --clear-groups"; do
  echo "[$w]: $($w "$carry/bin/wc_gpu_client" /nonexistent m "$uuid" 2>&1 | head -3 | tr '\n' ' ')"
done

section "cuda_vmm_test (label gpu)"
step cuda_vmm_test 300 "$carry/bin/cuda_vmm_test" --gtest_output="xml:$OUT/cuda_vmm_test.xml"
section "stack_gpu_test (label gpu): daemon + engine processes"
step stack_gpu_test 300 "$carry/bin/stack_gpu_test" --gtest_output="xml:$OUT/stack_gpu_test.xml"
section "tails_zero_gpu_test (label gpu): every byte of a segment written: digests after another model's eviction"
step tails_zero_gpu_test 300 "$carry/bin/tails_zero_gpu_test" --gtest_output="xml:$OUT/tails_zero_gpu_test.xml"
section "sleep_wake_gpu_test (label gpu): detach, evict, load another, re-attach at the same addresses"
step sleep_wake_gpu_test 300 "$carry/bin/sleep_wake_gpu_test" --gtest_output="xml:$OUT/sleep_wake_gpu_test.xml"
section "gpu_load_test (label gpu): the loader's staging ring, cancellation-aware reads"
step gpu_load_test 300 "$carry/bin/gpu_load_test" --gtest_output="xml:$OUT/gpu_load_test.xml"
section "integrity_gpu_test (label gpu): the digest kernel equals the CPU's, finds a changed byte"
step integrity_gpu_test 120 "$carry/bin/integrity_gpu_test" --gtest_output="xml:$OUT/integrity_gpu_test.xml"
section "fp8_quant_gpu_test (label gpu): the quantization kernel equals the CPU bit for bit"
step fp8_quant_gpu_test 300 "$carry/bin/fp8_quant_gpu_test"
section "scrub_bench (integrity: digest GB/s, a co-located kernel's slowdown per budget)"
step scrub_bench 300 "$carry/bin/scrub_bench" --gib=32
section "memory_test (host backend and auto selection, which finds the GPU here)"
step memory_test 120 "$carry/bin/memory_test"

section "libtorch adapter on cuda (built here against this machine's torch)"
tdir=$(mktemp -d /tmp/wc-torch.XXXXXX)
if step build_torch_test 300 bash "$root/tests/gpu/build-torch-test.sh" "$tdir/wc_torch_gpu_test"; then
  "$carry/bin/weightcachectl" demo-checkpoint "$tdir/demo" >/dev/null
  "$carry/bin/weightcached" --socket_dir="$tdir/s" --backend=cuda --metrics_address=off \
    --admin_uids="$(id -u)" \
    --model="name=demo,model_dir=$tdir/demo" >"$tdir/daemon.log" 2>&1 &
  dpid=$!
  for _ in $(seq 200); do [[ -S $tdir/s/control.sock ]] && break; sleep 0.1; done
  step torch_gpu_test 120 "$tdir/wc_torch_gpu_test" "$tdir/s" demo "$uuid"
  kill "$dpid"; wait "$dpid"
fi


if [[ ${SKIP_BENCH:-0} != 1 ]]; then
  section "digest_bench (content identity: hashing vs plain reads, the stale check)"
  step digest_bench 300 "$carry/bin/digest_bench" --gib=8 --dir=/var/tmp

  section "peer_fill_bench (issue 30: B fills GPU memory from A over UCX; A's cold disk load)"
  # Also a check: it exits 1 unless B was filled from A with A's bytes, every segment.
  # shellcheck disable=SC2086
  step peer_fill_bench 300 "$carry/bin/peer_fill_bench" --backend=cuda-vmm \
    ${PEER_FILL_ARGS:---gib=8} --dir=/var/tmp/wc-peer-fill >"$OUT/peer_fill_bench.md"
  cat "$OUT/peer_fill_bench.md"
  section "gpu_acquire_bench ${BENCH_ARGS:-}"
  # shellcheck disable=SC2086
  step gpu_acquire_bench 300 "$carry/bin/gpu_acquire_bench" ${BENCH_ARGS:-} \
    >"$OUT/gpu_acquire_bench.md"
  cat "$OUT/gpu_acquire_bench.md"
  section "gpu_map_bench ${MAP_BENCH_ARGS:-}"
  # shellcheck disable=SC2086
  step gpu_map_bench 200 "$carry/bin/gpu_map_bench" ${MAP_BENCH_ARGS:-} >"$OUT/gpu_map_bench.md"
  cat "$OUT/gpu_map_bench.md"
fi

section "kernel log (Xid = GPU faults; Xid 31 from the read-only write tests is expected)"
(dmesg 2>/dev/null | grep -i xid | tail -5) || echo "dmesg not readable"
section "result: $([[ $fail == 0 ]] && echo PASS || echo "FAIL (${failed[*]})")"
exit $fail
