#!/usr/bin/env bash
# On the GPU machine, in one call: publish (issue 15) on the cuda-vmm backend. A publisher
# process loads a Llama, transforms its weights in place on cuda:0, publishes them and is
# SIGKILLed; a new process maps the published tensors and must compute the same logits;
# then an 8 GiB publish is timed (tests/gpu/publish_gpu.py). Prints a table and PASS/FAIL.
#
#   here:  bash tests/gpu/prepare-python-carry.sh
#   then:  run(carry=[".device-carry-py"], command="bash tests/gpu/run-publish-on-device.sh")
# Environment: OUT (log folder, default /tmp/wc-publish-out), PYTHON (default python3),
# GIB (bench size, default 8).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=$root/.device-carry-py
OUT=${OUT:-/tmp/wc-publish-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/publish-gpu.log") 2>&1
fail=0
section() { printf '\n===== %s =====\n' "$*"; }
nvidia-smi -L
[[ -x $carry/bin/weightcached && -f $carry/python/weightcache/libweightcache.so ]] || {
  echo "no $carry: run tests/gpu/prepare-python-carry.sh on the build machine first"; exit 1; }
work=$(mktemp -d /tmp/wc-publish.XXXXXX)
export PYTHONPATH=$carry/python WEIGHTCACHE_SOCKET=$work/s
unset WEIGHTCACHE_LIB WEIGHTCACHE_MODE WEIGHTCACHE_MODEL

section "models"
timeout 600 "$PY" "$root/tests/gpu/python_parity.py" make "$work/models" || exit 1

section "weightcached (cuda)"
source "$root/tests/gpu/start-weightcached-on-device.sh"
start_weightcached "$work/models/specs.json" --publish_uids="$(id -u)"

section "publisher: transform in place, publish, then SIGKILL"
"$PY" "$root/tests/gpu/publish_gpu.py" publisher "$work/models" >"$OUT/publisher.log" 2>&1 &
pub=$!
for _ in $(seq 1200); do
  grep -q PUBLISHED "$OUT/publisher.log" && break
  kill -0 $pub 2>/dev/null || break
  sleep 0.25
done
cat "$OUT/publisher.log"
grep -q PUBLISHED "$OUT/publisher.log" || fail=1
kill -KILL $pub 2>/dev/null; wait $pub 2>/dev/null
"$PY" -m weightcache status | grep -E '"source"|"recipe"|"state"' | sort | uniq -c

section "reader: a new process maps the published weights"
timeout 600 "$PY" "$root/tests/gpu/publish_gpu.py" reader "$work/models" || fail=1

section "bench: publish ${GIB:-8} GiB"
timeout 600 "$PY" "$root/tests/gpu/publish_gpu.py" bench "$work/models" "${GIB:-8}" || fail=1

section result
if [[ $fail == 0 ]]; then echo "PASS"; else echo "FAIL"; fi
exit $fail
