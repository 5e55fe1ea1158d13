# Sourced by the device scripts that bench the ~0.84 B Llama of bench/compile_cache_bench.py
# (run-compile-cache-on-device.sh, run-engine-start-on-device.sh): writes it into $work,
# starts weightcached from the carry on $work/s (cuda-vmm, this uid a publisher, artifacts in
# memory; log $OUT/weightcached.log), waits until it answers and loads llama-1b. Sets
# $daemon and an EXIT trap that stops it. Needs root, carry, work, OUT, PY set; exits the
# script on a failure.
timeout "${MAKE_TIMEOUT:-600}" "$PY" "$root/bench/compile_cache_bench.py" make "$work" || exit 1
source "$root/tests/gpu/start-weightcached-on-device.sh"
start_weightcached "$work/specs.json" --publish_uids="$(id -u)"
timeout "${LOAD_TIMEOUT:-300}" "$PY" -m weightcache load llama-1b || exit 1
