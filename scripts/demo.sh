#!/usr/bin/env bash
# The main job on an embedded default: what weightcache is for, in four timed steps.
#   1. a small Llama-shaped bf16 checkpoint is loaded once from disk by weightcached, beside a
#      weightcache-keeper; a client maps it and compares every byte with the files
#   2. a second client maps it: the daemon reads 0 bytes of the checkpoint
#   3. the daemon is SIGKILLed and started again; it adopts the copy the keeper held, reading
#      0 bytes of the checkpoint
#   4. a client maps it again and finds every byte equal to the files
# Installs the build's packages and builds only the three programs it runs (build/, the
# objects scripts/test.sh's build job uses too). The GPU backend where a GPU is usable, else
# host memory (sealed memfds).
set -euo pipefail
cd "$(dirname "$0")/.."
start_all=$SECONDS
bash scripts/install-deps.sh
bash scripts/build.sh -- weightcached weightcachectl weightcache-keeper
bin=build/cmd
work="$(mktemp -d /tmp/weightcache-demo.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "demo FAILED: $*" >&2
  for f in "$work"/*.log; do [[ -f $f ]] && sed "s|^|  $(basename "$f"): |" "$f" >&2; done
  exit 1
}
wait_socket() {  # wait_socket PATH PID
  for _ in $(seq 400); do
    [[ -S $1 ]] && return 0
    kill -0 "$2" 2>/dev/null || fail "process $2 exited before creating $1"
    sleep 0.025
  done
  fail "no $1 after 10 s"
}
now() { date +%s.%N; }
ms() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f ms", (b - a) * 1000 }'; }
mib() { awk -v b="$1" 'BEGIN { if (b == 0) print "0 B"; else printf "%.2f MiB\n", b / 1048576 }'; }
rows=()
row() { rows+=("$(printf '| %-58s | %8s | %s |' "$1" "$2" "$3")"); }

# weightcache_load_bytes_total{source="disk"}: what the daemon read of checkpoint files.
metrics_port=""
disk_bytes() {  # plain HTTP through bash's /dev/tcp: a fresh machine may have no curl
  local body
  exec 3<>"/dev/tcp/127.0.0.1/$metrics_port"
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  body=$(cat <&3)
  exec 3<&-
  awk '/^weightcache_load_bytes_total\{.*source="disk"/ { s += $NF } END { printf "%d", s }' <<<"$body"
}
if [[ -e /dev/nvidiactl ]] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  backend=auto
  echo "demo: a GPU is here: the cuda-vmm backend"
else
  backend=host
  echo "demo: no GPU here: the host backend (sealed memfds)"
fi
start_daemon() {  # start_daemon LOG
  "$bin/weightcached/weightcached" --socket_dir="$work/sock" --backend="$backend" \
    --keeper_socket="$work/keeper/keeper.sock" --model="name=demo,model_dir=$work/model" \
    --metrics_address=127.0.0.1:0 2>"$work/$1" &
  daemon=$!
  pids+=("$daemon")
  wait_socket "$work/sock/control.sock" "$daemon"
  for _ in $(seq 400); do
    metrics_port=$(grep -oE "metrics http: .* \(port [0-9]+\)" "$work/$1" | grep -oE "[0-9]+\)$" | tr -d ')') || true
    [[ -n $metrics_port ]] && break
    sleep 0.025
  done
  [[ -n $metrics_port ]] || fail "weightcached logged no metrics port"
}
ctl=("$bin/weightcachectl/weightcachectl" --socket="$work/sock")

"$bin/weightcachectl/weightcachectl" demo-checkpoint "$work/model" >/dev/null
model_bytes=$(cat "$work/model"/*.safetensors | wc -c)
"$bin/weightcache-keeper/weightcache-keeper" --socket="$work/keeper/keeper.sock" \
  2>"$work/keeper.log" &
pids+=("$!")
wait_socket "$work/keeper/keeper.sock" "$!"

echo "--- 1. first engine: the model is loaded from disk once, mapped and compared"
t0=$(now)
start_daemon daemon.log
"${ctl[@]}" verify demo --load_on_miss || fail "verify"
t1=$(now)
read1=$(disk_bytes)
row "1. daemon start, load from disk, map and compare" "$(ms "$t0" "$t1")" "$(mib "$read1") (the tensors)"

echo "--- 2. second engine: maps the resident copy"
t0=$(now)
"${ctl[@]}" verify demo || fail "verify by a second client"
t1=$(now)
read2=$(disk_bytes)
row "2. second client maps it, compares every byte" "$(ms "$t0" "$t1")" "$(mib $((read2 - read1)))"
[[ $read2 == "$read1" ]] || fail "the daemon read $((read2 - read1)) checkpoint bytes for a mapped model"

echo "--- 3. the daemon is SIGKILLed and started again beside its keeper"
t0=$(now)
kill -KILL "$daemon"
wait "$daemon" 2>/dev/null || true
rm -f "$work/sock/control.sock"
start_daemon daemon2.log
grep -m1 "keeper: adopted" "$work/daemon2.log" | sed 's/^[IWE] [^ ]* /daemon: /' ||
  fail "the restarted daemon logged no adoption"
t1=$(now)
read3=$(disk_bytes)
row "3. SIGKILL, restart, adopt the keeper's copy" "$(ms "$t0" "$t1")" "$(mib "$read3")"
[[ $read3 == 0 ]] || fail "the restarted daemon read $read3 checkpoint bytes (not adopted?)"

echo "--- 4. an engine maps the adopted copy"
t0=$(now)
"${ctl[@]}" verify demo || fail "verify after the restart (not served from the kept copy?)"
t1=$(now)
row "4. a client maps the adopted copy, compares every byte" "$(ms "$t0" "$t1")" "$(mib "$(disk_bytes)")"

echo "--- the daemon's status"
"${ctl[@]}" status
echo
echo "weightcache demo ($backend backend, a $(mib "$model_bytes") checkpoint):"
printf '| %-58s | %8s | %s |\n' "step" "time" "checkpoint bytes the daemon read"
printf '|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..60})" "$(printf -- '-%.0s' {1..10})" "---"
printf '%s\n' "${rows[@]}"
echo "demo: $((SECONDS - start_all)) s in all, install and build included"
