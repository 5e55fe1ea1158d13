#!/usr/bin/env bash
# On the GPU machine, in one call: the Python package against real models. Builds a Qwen2
# and a Llama from configs with seeded random weights (save_pretrained), serves them with
# weightcached (cuda-vmm), then in another process compares the logits of
# weightcache.transformers.from_pretrained with plain from_pretrained (max abs diff 0) and
# the tp 1 / tp 2 ranks' tensors with the disk slices (tests/gpu/python_parity.py).
#
#   here:  bash tests/gpu/prepare-python-carry.sh
#   then:  run(carry=[".device-carry-py"], command="bash tests/gpu/run-python-on-device.sh")
# The package runs from .device-carry-py/python (PYTHONPATH; pure Python, the same files that
# scripts/install-python.sh installs), with the machine's python3 (torch, transformers).
# Environment: OUT (log folder, default /tmp/wc-py-out), PYTHON (default python3).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=$root/.device-carry-py
OUT=${OUT:-/tmp/wc-py-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/python-gpu.log") 2>&1
section() { printf '\n===== %s =====\n' "$*"; }
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

section machine
nvidia-smi -L
grep PRETTY_NAME /etc/os-release
"$PY" -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
[[ -x $carry/bin/weightcached && -f $carry/python/weightcache/libweightcache.so ]] || {
  echo "no $carry: run tests/gpu/prepare-python-carry.sh on the build machine first"; exit 1; }
work=$(mktemp -d /tmp/wc-py.XXXXXX)
export PYTHONPATH=$carry/python WEIGHTCACHE_SOCKET=$work/s
unset WEIGHTCACHE_LIB WEIGHTCACHE_MODE WEIGHTCACHE_MODEL
ldd "$carry/python/weightcache/libweightcache.so" | grep -E 'not found' && fail=1

section "models: Qwen2 and Llama from configs, seeded, save_pretrained"
step make_models 600 "$PY" "$root/tests/gpu/python_parity.py" make "$work/models" || exit 1

section "weightcached (cuda) serving them"
source "$root/tests/gpu/start-weightcached-on-device.sh"
start_weightcached "$work/models/specs.json"
step load_qwen2 300 "$PY" -m weightcache load qwen2
step load_llama 300 "$PY" -m weightcache load llama
"$PY" -m weightcache status

section "parity: weightcache.transformers.from_pretrained vs from_pretrained; tp1/tp2 slices"
step parity 900 "$PY" "$root/tests/gpu/python_parity.py" check "$work/models"
step verify_cli 300 "$PY" -m weightcache verify qwen2
"$PY" -m weightcache status

section "benchmark: Python acquire + bind overhead over C++, 1,000 tensors (host backend)"
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$carry/lib" "$carry/bin/weightcached" \
  >"$work/weightcached-host"
chmod +x "$work/weightcached-host"
step python_bench 300 "$PY" "$root/bench/python_acquire_bench.py" --daemon "$work/weightcached-host" \
  --reps 100

section "benchmark: process start -> first forward, ~8 GB model: transformers vs weightcache"
big=${BIG_DIR:-/var/tmp/wc-start8g}
step make_8g 900 "$PY" "$root/bench/python_start_bench.py" make "$big"
LD_LIBRARY_PATH=$carry/lib "$carry/bin/weightcached" --socket_dir="$work/s8" --backend=cuda \
  --metrics_address=off --preload=false --spec_file="$big/spec.json" \
  >"$OUT/weightcached-8g.log" 2>&1 &
daemon8=$!
for _ in $(seq 300); do
  WEIGHTCACHE_SOCKET=$work/s8 "$PY" -m weightcache status >/dev/null 2>&1 && break
  sleep 0.1
done
WEIGHTCACHE_SOCKET=$work/s8 step load_8g 600 "$PY" -m weightcache load start8g
WEIGHTCACHE_SOCKET=$work/s8 REPS=${REPS:-2} step start_bench 1200 "$PY" \
  "$root/bench/python_start_bench.py" run "$big"
kill $daemon8; wait $daemon8

section "daemon log (tail)"
tail -n 30 "$OUT/weightcached.log"
section "result: $([[ $fail == 0 ]] && echo PASS || echo "FAIL (${failed[*]})")"
exit $fail
