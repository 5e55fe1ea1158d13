#!/usr/bin/env bash
# On the GPU machine, in one call: compile artifacts (issue 29) measured for real. Writes a
# ~1.1 B Llama (bench/compile_cache_bench.py make), serves it with weightcached (cuda-vmm,
# this uid a publisher, artifacts in memory), and runs bench/compile_cache_bench.py: fresh
# processes from start to the first compiled forward, cold / warm from the daemon's artifact /
# Inductor's disk cache, logits compared.
#
#   here:  bash tests/gpu/prepare-python-carry.sh      (the same carry as the Python runs)
#   then:  run(carry=[".device-carry-py"], command="bash tests/gpu/run-compile-cache-on-device.sh")
# Then, with AOTI=1, bench/aoti_bench.py: the model as a code-only AOTInductor package served
# as an artifact, weights mapped, no tracing at start.
# Environment: OUT (log folder, default /tmp/wc-cc-out), PYTHON (default python3), CC_MODES
# (compile_cache_bench's modes, default all four; empty: skip it), AOTI (1: run aoti_bench),
# AOTI_MODES (its modes), AOTI_PROFILE, AOTI_LOG_CMDS, AOTI_GLOBAL_LIBSTDCXX (aoti_bench.py says).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=$root/.device-carry-py
OUT=${OUT:-/tmp/wc-cc-out}
PY=${PYTHON:-python3}
CC_MODES=${CC_MODES-eager,cold,weightcache,inductor}
AOTI=${AOTI:-0}
mkdir -p "$OUT"
exec > >(tee "$OUT/compile-cache-gpu.log") 2>&1
[[ -x $carry/bin/weightcached && -f $carry/python/weightcache/libweightcache.so ]] || {
  echo "no $carry: run tests/gpu/prepare-python-carry.sh on the build machine first"; exit 1; }
nvidia-smi -L
"$PY" -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
work=$(mktemp -d /tmp/wc-cc.XXXXXX)
export PYTHONPATH=$carry/python WEIGHTCACHE_SOCKET=$work/s
unset WEIGHTCACHE_LIB WEIGHTCACHE_MODE WEIGHTCACHE_MODEL
source "$root/tests/gpu/serve-llama-on-device.sh"
rc=0
if [[ -n $CC_MODES ]]; then
  timeout 900 "$PY" "$root/bench/compile_cache_bench.py" --work "$work" --model llama-1b \
    --modes "$CC_MODES" || rc=$?
fi
if [[ $AOTI == 1 ]]; then
  timeout 900 "$PY" "$root/bench/aoti_bench.py" --work "$work" --model llama-1b \
    --modes "${AOTI_MODES:-tiny,tiny,build,load}" || rc=$?
fi
LD_LIBRARY_PATH=$carry/lib "$carry/bin/weightcachectl" --socket="$work/s" status | sed -n '/^artifacts/,/^$/p'
tail -n 15 "$OUT/weightcached.log"
echo "result: $([[ $rc == 0 ]] && echo PASS || echo FAIL)"
exit $rc
