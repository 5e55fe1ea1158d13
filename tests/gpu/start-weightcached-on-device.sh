# shellcheck shell=bash
# Sourced by the device scripts that serve models to Python engines (serve-llama-on-device.sh,
# run-publish-on-device.sh, run-python-on-device.sh): defines start_weightcached SPEC_FILE
# [FLAG...], which starts weightcached from the carry on $work/s (cuda-vmm, no preload, no
# metrics; log $OUT/weightcached.log), sets $daemon and an EXIT trap that stops it, and waits
# until it answers (30 s); on a daemon that exits first, or never answers, it prints the log
# and exits the script.
# Needs carry, work, OUT, PY set.
start_weightcached() {
  local spec=$1
  shift
  LD_LIBRARY_PATH=$carry/lib "$carry/bin/weightcached" --socket_dir="$work/s" --backend=cuda \
    --metrics_address=off --preload=false --spec_file="$spec" "$@" >"$OUT/weightcached.log" 2>&1 &
  daemon=$!
  trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT
  for _ in $(seq 300); do
    "$PY" -m weightcache status >/dev/null 2>&1 && return 0
    kill -0 "$daemon" 2>/dev/null || { cat "$OUT/weightcached.log"; exit 1; }
    sleep 0.1
  done
  echo "weightcached did not answer on $work/s within 30 s"
  cat "$OUT/weightcached.log"
  exit 1
}
