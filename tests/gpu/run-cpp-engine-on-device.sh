#!/usr/bin/env bash
# On the GPU machine, in ONE call of at most 600 s: issue 59's engine start without Python.
# Builds examples/cpp_engine against the machine's libtorch (in the background, while the
# models are written), writes the ~0.84 B Llama and an ~8 GB one (bench/compile_cache_bench.py
# make), serves both with weightcached (cuda-vmm), then for each model runs
# bench/engine_start_bench.py: cold (COLD_RUNS fresh Python processes, torch.compile),
# the Python AOTInductor start (weightcache.aoti) and the C++ engine (wc_cpp_engine), RUNS
# fresh processes each, logits compared with the process that built the package.
#
#   here:  bash tests/gpu/prepare-carry.sh build && bash tests/gpu/prepare-python-carry.sh build
#          (both carries; compress them: see tests/gpu/README or docs/gpu.md)
#   then:  run(carry=[...], command="bash tests/gpu/run-cpp-engine-on-device.sh")
# Results under $OUT: cpp-engine-<model>.md (each table), cpp-engine-gpu.log (everything),
# cpp-build.log, weightcached.log; where the C++ engine died, probe-*.out and
# bindings-not-to-libstdcxx.txt (see the probe below).
# Environment: PYTHON (python3), RUNS (5), COLD_RUNS (1), MODELS ("llama-1b llama-8g"),
# TOTAL (seconds this script may use, 570).
set -u
export PS4='+ [${SECONDS}s] '
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=$root/.device-carry-py
OUT=${OUT:-/tmp/wc-cpp-out}
PY=${PYTHON:-python3}
RUNS=${RUNS:-5}
COLD_RUNS=${COLD_RUNS:-1}
MODELS=${MODELS:-llama-1b llama-8g}
TOTAL=${TOTAL:-570}
mkdir -p "$OUT"
exec > >(tee "$OUT/cpp-engine-gpu.log") 2>&1
set -x
[[ -x $carry/bin/weightcached && -f $carry/python/weightcache/aoti.py ]] || {
  echo "no $carry: run tests/gpu/prepare-python-carry.sh on the build machine first"; exit 1; }
nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
grep -m1 'model name' /proc/cpuinfo; nproc
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
engine=/tmp/wc_cpp_engine
# A crash of the C++ engine prints its native stack (the machine has no gdb).
gcc -shared -fPIC -O1 -o /tmp/segv_backtrace.so "$root/tests/gpu/segv_backtrace.c" &&
  export CPP_ENGINE_PRELOAD=/tmp/segv_backtrace.so
bash "$root/examples/cpp_engine/build-on-device.sh" "$engine" >"$OUT/cpp-build.log" 2>&1 &
builder=$!
# Symbols that both libtorch and a carried (Debian-built) library export: where one process
# holds both, a call from either may land in the other's copy (a SIGSEGV suspect).
torch_lib=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')/lib
( comm -12 <(nm -D --defined-only "$torch_lib"/*.so 2>/dev/null | awk '{print $3}' | sort -u) \
    <(nm -D --defined-only "$carry"/lib/*.so* 2>/dev/null | awk '{print $3}' | sort -u) \
    >"$OUT/interposition.txt"
  echo "symbols exported by both libtorch and the carried libraries: $(wc -l <"$OUT/interposition.txt")"
  sed 's/^/  /' "$OUT/interposition.txt" | c++filt | head -n 15 ) &
work=$(mktemp -d /tmp/wc-cpp.XXXXXX)
export PYTHONPATH=$carry/python WEIGHTCACHE_SOCKET=$work/s WEIGHTCACHE_STATE_DIR=$work/state
unset WEIGHTCACHE_LIB WEIGHTCACHE_MODE WEIGHTCACHE_MODEL TORCHINDUCTOR_VEC_ISA_OK WEIGHTCACHE_NODE_PROBES
# shellcheck disable=SC2086
# Pinned digests: the daemon checks each file's SHA-256 in its load's own pass (issue 58),
# here on the cuda-vmm path; the logits below then also say the loaded bytes are right.
PIN_DIGESTS=1 timeout 240 "$PY" "$root/bench/compile_cache_bench.py" make "$work" $MODELS || exit 1
set +x
source "$root/tests/gpu/start-weightcached-on-device.sh"
start_weightcached "$work/specs.json" --publish_uids="$(id -u)"
set -x
for m in $MODELS; do timeout 180 "$PY" -m weightcache load "$m" || exit 1; done
modes=${MODES:-cold,aoti,cpp}
if ! wait "$builder"; then
  tail -n 60 "$OUT/cpp-build.log"
  echo "the C++ engine did not build: the Python modes only"
  modes=cold,aoti
fi
tail -n 3 "$OUT/cpp-build.log"
rc=0
n=$(wc -w <<<"$MODELS")
for m in $MODELS; do
  budget=$(( (TOTAL - SECONDS - 30) / n ))
  n=$(( n - 1 ))
  timeout $(( budget + 30 )) "$PY" "$root/bench/engine_start_bench.py" --work "$work" \
    --model "$m" --runs "$RUNS" --cold-runs "$COLD_RUNS" --modes "$modes" --budget "$budget" \
    --cpp-engine "$engine" > >(tee "$OUT/cpp-engine-$m.md") || rc=$?
  rm -rf "$work"/caches-*  # each run's private Inductor and Triton caches
done
# Where the C++ engine died in the bench, one more run each way, to say why (a diagnosis, not a
# figure): the system C++ runtime preloaded (first in the global scope, ahead of any carried
# library's std:: template instances), and the dynamic linker's bindings of std::regex and
# locale symbols. The package's load marker is cleared before each.
m1=${MODELS%% *}
if [[ $modes == *cpp* ]] && grep -q "cpp run [0-9]*: exit" "$OUT/cpp-engine-gpu.log"; then
  stdcxx=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/{print $NF; exit}')
  probe() {  # probe NAME ENV...
    local name=$1; shift
    rm -rf "$WEIGHTCACHE_STATE_DIR/aoti-loads"
    env "$@" "$engine" --model "$m1" --key "$work/aoti-key-$m1.json" --ids "$work/ids.bin" \
      >"$OUT/probe-$name.out" 2>&1
    echo "probe $name: exit $? ($(grep -m1 BENCH "$OUT/probe-$name.out" | cut -c1-200))"
    tail -n 25 "$OUT/probe-$name.out"
  }
  probe libstdcxx-first LD_PRELOAD="${CPP_ENGINE_PRELOAD:-} $stdcxx"
  probe bindings LD_PRELOAD="${CPP_ENGINE_PRELOAD:-}" LD_DEBUG=bindings LD_DEBUG_OUTPUT=/tmp/ld-bind
  cat /tmp/ld-bind.* 2>/dev/null | grep -E "regex|locale|codecvt|collate|ctype" |
    grep -v "to /.*libstdc++" | head -n 300 >"$OUT/bindings-not-to-libstdcxx.txt"
  wc -l <"$OUT/bindings-not-to-libstdcxx.txt" | xargs echo "std::regex/locale bindings not to libstdc++:"
  rm -rf "$WEIGHTCACHE_STATE_DIR/aoti-loads" /tmp/ld-bind.*
fi
# The crash marker, across languages: the C++ engine left none behind after its runs, and a
# marker planted under the name Python gives the key (weightcache.aoti.marker_path) stops it
# (a package whose load killed an engine, Python or C++, is not loaded again).
if [[ $modes == *cpp* ]]; then
  ls -la "$WEIGHTCACHE_STATE_DIR/aoti-loads" 2>&1
  marker=$("$PY" -c 'import json, sys; from weightcache.aoti import marker_path; print(marker_path(json.load(open(sys.argv[1]))))' "$work/aoti-key-$m1.json")
  mkdir -p "$(dirname "$marker")"
  echo '{"sha256": "", "source": "planted by run-cpp-engine-on-device.sh"}' >"$marker"
  if LD_PRELOAD=${CPP_ENGINE_PRELOAD:-} "$engine" --model "$m1" --key "$work/aoti-key-$m1.json" --ids "$work/ids.bin" 2>"$OUT/cpp-marker.txt"; then
    echo "FAIL marker: the package was loaded although a marker said a load of it died"; rc=1
  elif grep -q "killed a previous load" "$OUT/cpp-marker.txt"; then
    echo "PASS marker: $(cat "$OUT/cpp-marker.txt")"
  else
    echo "FAIL marker: $(cat "$OUT/cpp-marker.txt")"; rc=1
  fi
  rm -f "$marker"
fi
LD_LIBRARY_PATH=$carry/lib "$carry/bin/weightcachectl" --socket="$work/s" status | sed -n '1,/^$/p'
grep -E "ready|pinned|mismatch" "$OUT/weightcached.log" | head
tail -n 15 "$OUT/weightcached.log"
set +x
echo "result: $([[ $rc == 0 && $modes == *cpp* ]] && echo PASS || echo FAIL) (script ${SECONDS} s)"
exit $rc
