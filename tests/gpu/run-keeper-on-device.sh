#!/usr/bin/env bash
# The keeper on an H200, in one device call (issue 16): a multi-GiB model loaded on the GPU
# by weightcached with weightcache-keeper beside it; an engine maps it; weightcached is
# SIGKILLed and restarted; the restarted daemon must serve it from the keeper: no checkpoint
# reads (rchar of the new daemon), GPU memory used unchanged (no second copy), an engine
# that mapped before the kill still reads correct bytes, a new engine maps and reads correct
# bytes. Prints restart -> first Acquire, and PASS or FAIL.
#
# Here:   WC_CARRY_TARGETS="weightcached weightcache-keeper wc_gpu_client" \
#           bash tests/gpu/prepare-carry.sh
# Device: run(carry=[".device-carry"], command="bash tests/gpu/run-keeper-on-device.sh")
# Environment: GIB (model size, default 6), OUT (log folder, default /tmp/wc-keeper-out).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=$root/.device-carry
OUT=${OUT:-/tmp/wc-keeper-out}
GIB=${GIB:-6}
mkdir -p "$OUT"
exec > >(tee "$OUT/keeper.log") 2>&1
export LD_LIBRARY_PATH=$carry/lib
if ! "$carry/bin/weightcached" --helpfull >/dev/null 2>&1; then
  export LD_LIBRARY_PATH=$carry/lib:$carry/lib-fallback
fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
work=$(mktemp -d /tmp/wck.XXXXXX)
fails=()
check() {  # check NAME CONDITION-COMMAND...
  local name=$1
  shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails+=("$name"); fi
}
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$work"; }
trap cleanup EXIT
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
used_mib() { nvidia-smi --id="$uuid" --query-gpu=memory.used --format=csv,noheader,nounits; }
wait_line() {  # wait_line FILE REGEX TIMEOUT_S
  local i
  for ((i = 0; i < $3 * 20; i++)); do grep -qE "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  return 1
}

echo "== a ${GIB} GiB checkpoint of random bf16 values"
python3 - "$work/m" "$GIB" <<'PY'
import json, os, sys
d, gib = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
json.dump({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"},
          open(os.path.join(d, "config.json"), "w"))
n, per = 64, (gib << 30) // 64 // 2 * 2
hdr = {f"model.layers.{i // 8}.mlp.w{i % 8}.weight":
       {"dtype": "BF16", "shape": [per // 2], "data_offsets": [i * per, (i + 1) * per]}
       for i in range(n)}
h = json.dumps(hdr).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(d, "model.safetensors"), "wb") as f:
    f.write(len(h).to_bytes(8, "little") + h)
    for i in range(n):
        left = per
        while left:
            k = min(left, 64 << 20)
            f.write(os.urandom(k))
            left -= k
PY
model_bytes=$(stat -c %s "$work/m/model.safetensors")
sync
echo "checkpoint: $model_bytes bytes"

k_sock=$work/k/keeper.sock
"$carry/bin/weightcache-keeper" --socket="$k_sock" 2>"$OUT/keeper-process.log" &
kpid=$!
pids+=("$kpid")
wait_line "$OUT/keeper-process.log" "keeper: serving" 10
check "keeper maps no CUDA library" bash -c "! grep -Eq 'libcuda|libnvidia' /proc/$kpid/maps"
check "keeper links no CUDA library" bash -c \
  "! readelf -d '$carry/bin/weightcache-keeper' | grep -Eq 'libcuda|libcudart'"

daemon() {
  "$carry/bin/weightcached" --socket_dir="$work/s" --backend=cuda --metrics_address=off \
    --keeper_socket="$k_sock" --model="name=m,model_dir=$work/m" 2>>"$OUT/daemon.log" &
  dpid=$!
  pids+=("$dpid")
}
engine() {  # engine NAME: an engine process, stdin from a fifo we hold open
  mkfifo "$work/$1.in"
  env ${GO:+WC_ACQUIRE_ON_GO=1} WC_ACQUIRE_RETRY_S="${RETRY:-0}" \
    "$carry/bin/wc_gpu_client" "$work/s/control.sock" m "$uuid" \
    <"$work/$1.in" >"$OUT/$1.out" 2>&1 &
  pids+=("$!")
  eval "exec {fd_$1}>$work/$1.in"
}

echo "== cold load"
base=$(used_mib)
t0=$(date +%s.%N)
daemon
RETRY=600 engine before
check "engine before the kill: correct bytes" wait_line "$OUT/before.out" "^BYTES OK" 600
echo "cold load + first engine (with its CPU reference checksums): $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.3f", b - a}') s"
loaded=$(used_mib)
echo "GPU memory used: $base MiB before, $loaded MiB loaded"
# Deposits follow readiness (the link's worker): the keeper says when it holds the entry.
check "keeper holds the entry" wait_line "$OUT/keeper-process.log" "keeper: holds " 30

echo "== SIGKILL weightcached, restart"
RETRY=60 GO=1 engine after  # its CUDA context made, it acquires on "GO": from the new daemon
wait_line "$OUT/after.out" "^CONTEXT_FREE" 60
kill -9 "$dpid"
wait "$dpid" 2>/dev/null
t_kill=$(date +%s%N)
daemon
echo GO >&"$fd_after"
check "new engine after the restart: correct bytes" wait_line "$OUT/after.out" "^BYTES OK" 120
acq=$(awk '/^ACQUIRED_AT/{print $2}' "$OUT/after.out")
restart_s=$(awk -v a="${acq:-0}" -v k="$t_kill" 'BEGIN{printf "%.3f", (a - k) / 1e9}')  # no bc there
rchar=$(awk '/^rchar/{print $2}' "/proc/$dpid/io")
after=$(used_mib)
check "restarted daemon adopted the entry" grep -q "keeper: adopted 1 of 1 entries" "$OUT/daemon.log"
check "restarted daemon read < 1% of the checkpoint (rchar $rchar)" \
  test "$rchar" -lt $((model_bytes / 100))
# No second copy: within 1 GiB of the loaded figure (the new daemon's CUDA context differs).
check "GPU memory used unchanged ($loaded -> $after MiB, model $((model_bytes >> 20)) MiB)" \
  test $(( after > loaded ? after - loaded : loaded - after )) -lt 1024
echo check >&"$fd_before"
twice() {  # a second "BYTES OK" from the engine that mapped before the kill
  local i
  for ((i = 0; i < 2400; i++)); do
    [[ $(grep -c '^BYTES OK' "$OUT/before.out") -ge 2 ]] && return 0
    sleep 0.05
  done
  return 1
}
check "engine that mapped before the kill: still correct bytes" twice

echo
echo "| model | restart (SIGKILL -> exec) -> first successful Acquire | daemon rchar | GPU used loaded -> after |"
echo "|---|---|---|---|"
echo "| $((model_bytes >> 20)) MiB bf16, 64 tensors, $(nvidia-smi --id="$uuid" --query-gpu=name --format=csv,noheader) | ${restart_s} s | $rchar B | $loaded -> $after MiB |"
echo
if [[ ${#fails[@]} -eq 0 ]]; then echo "PASS"; exit 0; fi
echo "FAIL: ${fails[*]}"
exit 1
