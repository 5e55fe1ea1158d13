#!/usr/bin/env bash
# Runs inside the weightcache image (tests/image/image-test.sh mounts it), as the image's
# default user: the demo's flow on the host backend with a keeper. A generated checkpoint,
# weightcache-keeper, weightcached (--backend=host) mapped and byte-compared by
# `weightcachectl verify`; then the daemon is killed and a new one adopts the entry from the
# keeper, and a verify without --load_on_miss passes (served from the kept copy).
set -euo pipefail
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log; do [[ -f $f ]] && sed "s|^|  $(basename "$f"): |" "$f"; done
  exit 1
}
wait_socket() {  # wait_socket PATH PID
  for _ in $(seq 200); do
    [[ -S $1 ]] && return 0
    kill -0 "$2" 2>/dev/null || fail "process $2 exited before creating $1"
    sleep 0.05
  done
  fail "no $1 after 10 s"
}
start_daemon() {  # start_daemon LOG
  weightcached --socket_dir="$work/sock" --backend=host --keeper_socket="$work/keeper/keeper.sock" \
    --model="name=demo,model_dir=$work/model" --metrics_address=127.0.0.1:0 2>"$work/$1" &
  daemon=$!
  pids+=("$daemon")
  wait_socket "$work/sock/control.sock" "$daemon"
}

echo "running as uid $(id -u)"
weightcachectl demo-checkpoint "$work/model"
weightcache-keeper --socket="$work/keeper/keeper.sock" 2>"$work/keeper.log" &
pids+=("$!")
wait_socket "$work/keeper/keeper.sock" "$!"
start_daemon daemon.log
ctl=(weightcachectl --socket="$work/sock")
"${ctl[@]}" verify demo --load_on_miss || fail "verify"
kill -KILL "$daemon"
wait "$daemon" 2>/dev/null || true
rm -f "$work/sock/control.sock"
start_daemon daemon2.log
"${ctl[@]}" verify demo || fail "verify after a daemon restart (not adopted from the keeper?)"
"${ctl[@]}" status
grep -i adopt "$work/daemon2.log" || fail "the restarted daemon logged no adoption"
echo "demo-in-container: passed"
