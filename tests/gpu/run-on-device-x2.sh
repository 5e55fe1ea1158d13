#!/usr/bin/env bash
# On the 2-GPU machine (kind nvidia-h200-x2), in one call, from what
# tests/gpu/prepare-carry-x2.sh put in .device-carry-x2/: the machine and its GPU topology,
# multi_gpu_test (label gpu: rank placement, engines under different CUDA_VISIBLE_DEVICES,
# peer / host-staged / miss policies), a CLI `status` of a daemon holding a tp_size 2 model
# (per-GPU residency) and gpu_p2p_bench (GPU-to-GPU GB/s). Logs under $OUT.
#
#   run(kind="nvidia-h200-x2", carry=[".device-carry-x2"], command="bash tests/gpu/run-on-device-x2.sh")
# Environment: OUT (default /tmp/wc-gpu-x2-out); P2P_ARGS (gpu_p2p_bench flags).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=${WC_CARRY_DIR:-$root/.device-carry-x2}
OUT=${OUT:-/tmp/wc-gpu-x2-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$carry/lib
export WEIGHTCACHED=$carry/bin/weightcached WC_MGPU_ENGINE=$carry/bin/wc_mgpu_engine
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ulimit -n 65536 2>/dev/null || true
failed=()
section() { printf '\n===== %s =====\n' "$*"; }
step() {  # step NAME TIMEOUT CMD...
  local name=$1 t=$2
  shift 2
  local s0=$SECONDS
  timeout "$t" "$@"
  local rc=$?
  echo "[$name: exit $rc, $((SECONDS - s0)) s]"
  [[ $rc == 0 ]] || failed+=("$name")
  return $rc
}
exec > >(tee "$OUT/gpu-x2.log") 2>&1
section machine
nvidia-smi -L
nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.total --format=csv
nvidia-smi topo -m 2>&1 | head -12
nproc
if ! "$carry/bin/memory_test" --gtest_list_tests >/dev/null 2>&1; then
  echo "using the carried C++ runtime (lib-fallback)"
  export LD_LIBRARY_PATH=$carry/lib:$carry/lib-fallback
fi

section "multi_gpu_test (label gpu)"
step multi_gpu_test 240 "$carry/bin/multi_gpu_test" --gtest_output="xml:$OUT/multi_gpu_test.xml"

section "weightcachectl status: tp_size 2 model, one rank per GPU, plus a peer copy"
d=$(mktemp -d /tmp/wc-x2.XXXXXX)
"$carry/bin/weightcachectl" demo-checkpoint "$d/m"
"$WEIGHTCACHED" --socket_dir="$d/s" --backend=cuda --metrics_address=127.0.0.1:9477 \
  --model="name=demo,model_dir=$d/m,tp_size=2" >"$d/daemon.log" 2>&1 &
dpid=$!
for _ in $(seq 200); do
  "$carry/bin/weightcachectl" --socket="$d/s/control.sock" status 2>/dev/null | grep -c ' ready ' | grep -q 2 && break
  sleep 0.1
done
gpu1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | sed -n 2p)
# An engine on GPU 1 asks for rank 0 (resident on GPU 0): a peer copy.
CUDA_VISIBLE_DEVICES=1 "$WC_MGPU_ENGINE" "$d/s" demo 2 0 | grep -v '^TENSOR' | tee "$d/engine.out"
step cli_status 30 "$carry/bin/weightcachectl" --socket="$d/s/control.sock" status
python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9477/metrics').read().decode())" 2>&1 | grep -E '^weightcache_(acquire|load).*(peer|result)|^weightcache_staging' | head -14 || true
grep -E 'preload|peer copy' "$d/daemon.log"
kill "$dpid"; wait "$dpid" 2>/dev/null

section "gpu_p2p_bench"
step gpu_p2p_bench 240 "$carry/bin/gpu_p2p_bench" ${P2P_ARGS:-}

section summary
if [[ ${#failed[@]} == 0 ]]; then echo "ALL PASSED"; else echo "FAILED: ${failed[*]}"; fi
[[ ${#failed[@]} == 0 ]]
