#!/usr/bin/env bash
# On the GPU machine, in one call: the binaries of the built image (issue 28) pass the GPU
# stack test and verify a real Hugging Face checkpoint. From .device-carry-img/
# (tests/gpu/prepare-image-carry.sh): image/ the image's daemon, keeper and CLI, run with the
# image's libraries (lib-image/); bin/ this build's stack_gpu_test and engine processes.
#   run(carry=[".device-carry-img.tar.xz"],
#       command="tar -xJf .device-carry-img.tar.xz && bash tests/gpu/run-image-on-device.sh")
# Environment: OUT (log folder, default /tmp/wc-img-out), PYTHON (default python3).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=$root/.device-carry-img
OUT=${OUT:-/tmp/wc-img-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/image-gpu.log") 2>&1
fail=0
failed=()
step() {  # step NAME TIMEOUT CMD...
  local name=$1 t=$2
  shift 2
  local s0=$SECONDS
  timeout "$t" "$@"
  local rc=$?
  echo "[$name: exit $rc, $((SECONDS - s0)) s]"
  if [[ $rc != 0 ]]; then fail=1; failed+=("$name"); fi
  return $rc
}
nvidia-smi -L
work=$(mktemp -d /tmp/wc-img.XXXXXX)
# The image's binaries, each with the image's libraries only.
for b in weightcached weightcachectl weightcache-keeper; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$carry/lib-image" "$carry/image/$b" \
    >"$work/$b"
  chmod +x "$work/$b"
done
echo "== the image's binaries and what they load"
LD_LIBRARY_PATH=$carry/lib-image ldd "$carry/image/weightcached" | grep -E 'not found|libcuda' && fail=1
"$work/weightcached" --version
"$work/weightcachectl" --version

echo "== stack_gpu_test against the image's weightcached"
export LD_LIBRARY_PATH=$carry/lib WEIGHTCACHED=$work/weightcached
export WC_GPU_CLIENT=$carry/bin/wc_gpu_client WC_GPU_HELPER=$carry/bin/wc_gpu_helper
export WC_GPU_ATTACKER=$carry/bin/wc_gpu_attacker
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
step stack_gpu_test 300 "$carry/bin/stack_gpu_test" --gtest_output="xml:$OUT/stack_gpu_test.xml"
unset LD_LIBRARY_PATH

echo "== a Hugging Face checkpoint (transformers save_pretrained), served and verified"
step make_model 600 "$PY" "$root/bench/compile_cache_bench.py" make "$work" >/dev/null
"$work/weightcached" --socket_dir="$work/s" --backend=cuda --metrics_address=off --preload=false \
  --spec_file="$work/specs.json" --admin_uids="$(id -u)" >"$OUT/weightcached.log" 2>&1 &
daemon=$!
for _ in $(seq 200); do [[ -S $work/s/control.sock ]] && break; sleep 0.1; done
step load 300 "$work/weightcachectl" --socket="$work/s" load llama-1b
step verify 300 "$work/weightcachectl" --socket="$work/s" verify llama-1b
"$work/weightcachectl" --socket="$work/s" status
kill "$daemon"; wait "$daemon"
tail -n 5 "$OUT/weightcached.log"
echo "result: $([[ $fail == 0 ]] && echo PASS || echo "FAIL (${failed[*]})")"
exit $fail
