#!/usr/bin/env bash
# On the GPU machine, in ONE call of at most 600 s: issue 49's engine start measured. Writes
# the ~0.84 B Llama (bench/compile_cache_bench.py make), serves it with weightcached
# (cuda-vmm, this uid a publisher, artifacts in memory; it writes the node's probe decision,
# node-probes.json, into its socket dir), then bench/engine_start_bench.py:
# fresh processes, cold / compile_cache hit / AOTInductor package from the daemon, 5 runs each
# as the budget allows (what it skipped is printed), logits compared, every subprocess each
# run starts recorded. Then, if time is left and strace exists, one package load through
# torch's own loader with weightcache's probe decision off, under strace -f (every execve:
# the probes torch runs, confirmed outside Python too).
#
#   here:  bash tests/gpu/prepare-python-carry.sh [CUDA build dir of this tree]
#   then:  run(carry=[".device-carry-py"], command="bash tests/gpu/run-engine-start-on-device.sh")
# Results under $OUT (default /tmp/wc-es-out): engine-start.md (the table), engine-start-gpu.log
# (everything), weightcached.log, node-probes.json, strace-execve.txt.
# Environment: PYTHON (default python3), RUNS (default 5), MODES (default
# cold,cc,aoti,aoti-torch), TOTAL (seconds this script may use, default 570).
set -u
export PS4='+ [${SECONDS}s] '
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=$root/.device-carry-py
OUT=${OUT:-/tmp/wc-es-out}
PY=${PYTHON:-python3}
RUNS=${RUNS:-5}
MODES=${MODES:-cold,cc,aoti,aoti-torch}
TOTAL=${TOTAL:-570}
mkdir -p "$OUT"
exec > >(tee "$OUT/engine-start-gpu.log") 2>&1
set -x
[[ -x $carry/bin/weightcached && -f $carry/python/weightcache/libweightcache.so ]] || {
  echo "no $carry: run tests/gpu/prepare-python-carry.sh on the build machine first"; exit 1; }
[[ -f $carry/python/weightcache/aoti.py ]] || {
  echo "$carry predates weightcache.aoti: run tests/gpu/prepare-python-carry.sh again"; exit 1; }
nvidia-smi -L
grep -m1 'model name' /proc/cpuinfo; nproc
"$PY" -c 'import torch, triton, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "transformers", transformers.__version__)'
work=$(mktemp -d /tmp/wc-es.XXXXXX)
export PYTHONPATH=$carry/python WEIGHTCACHE_SOCKET=$work/s
unset WEIGHTCACHE_LIB WEIGHTCACHE_MODE WEIGHTCACHE_MODEL TORCHINDUCTOR_VEC_ISA_OK WEIGHTCACHE_NODE_PROBES
echo "+ serving llama-1b (model written, weightcached started, loaded)"; set +x  # (its wait loop would print 300 lines)
MAKE_TIMEOUT=120 LOAD_TIMEOUT=120 source "$root/tests/gpu/serve-llama-on-device.sh"
set -x
# The node's probe decision: weightcached writes it at start into the socket dir (this
# branch's daemon); a carry with an older daemon gets it from the Python node step instead.
if [[ -f $work/s/node-probes.json ]]; then
  echo "node-probes.json written by weightcached"
else
  echo "no node-probes.json from weightcached (an older daemon in the carry?): the Python node step writes it"
  "$PY" -m weightcache node-probes --write "$work/s"
fi
cp "$work/s/node-probes.json" "$OUT/"; cat "$work/s/node-probes.json"
"$PY" -m weightcache node-probes
ls -la "$work/s"
budget=$(( TOTAL - SECONDS - 45 ))
rc=0
timeout $(( budget + 40 )) "$PY" "$root/bench/engine_start_bench.py" --work "$work" \
  --model llama-1b --runs "$RUNS" --modes "$MODES" --budget "$budget" \
  > >(tee "$OUT/engine-start.md") || rc=$?
left=$(( TOTAL - SECONDS ))
if command -v strace >/dev/null && (( left > 50 )) && [[ $MODES == *aoti* ]]; then
  caches=$(mktemp -d "$work/caches-strace-XXXX")
  BENCH_SPAWNED=$("$PY" -c 'import time; print(repr(time.time()))') WEIGHTCACHE_NODE_PROBES=off \
    TORCHINDUCTOR_CACHE_DIR=$caches/inductor TRITON_CACHE_DIR=$caches/triton \
    timeout $(( left - 10 )) strace -f -qq -s 300 -e trace=execve -o "$OUT/strace-execve.txt" \
    "$PY" "$root/bench/engine_start_bench.py" --child aoti-torch --run 9 --work "$work" \
    --model llama-1b | tail -c 3000
  grep -c execve "$OUT/strace-execve.txt"
  grep 'execve(' "$OUT/strace-execve.txt" | grep -v ENOENT | sed -E 's/^([0-9]+) +execve\("([^"]*)", \[(.{0,240}).*/\1 \2 \3/' | head -60
else
  echo "strace run skipped: strace $(command -v strace || echo absent), ${left} s left"
fi
LD_LIBRARY_PATH=$carry/lib "$carry/bin/weightcachectl" --socket="$work/s" status | sed -n '/^artifacts/,/^$/p'
tail -n 15 "$OUT/weightcached.log"
set +x
echo "result: $([[ $rc == 0 ]] && echo PASS || echo FAIL) (script ${SECONDS} s)"
exit $rc
