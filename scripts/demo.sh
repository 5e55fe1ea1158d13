#!/usr/bin/env bash
# The main job on an embedded default: installs, builds, writes a small Llama-shaped bf16
# checkpoint, starts weightcached on it (host backend when no GPU is usable), maps it from a
# client with `weightcachectl verify` (every byte compared with the files), shows the
# daemon's status, and stops the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
bin=build/cmd
work="$(mktemp -d /tmp/weightcache-demo.XXXXXX)"
trap 'kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; rm -rf "$work"' EXIT

"$bin/weightcachectl/weightcachectl" demo-checkpoint "$work/model"
"$bin/weightcached/weightcached" --socket_dir="$work/sock" --backend=auto \
  --model="name=demo,model_dir=$work/model" --metrics_address=127.0.0.1:0 \
  2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 200); do
  [[ -S "$work/sock/control.sock" ]] && break
  kill -0 "$daemon" 2>/dev/null || { cat "$work/daemon.log"; exit 1; }
  sleep 0.05
done
ctl=("$bin/weightcachectl/weightcachectl" --socket="$work/sock")
"${ctl[@]}" verify demo --load_on_miss
"${ctl[@]}" status
echo "--- daemon log"
cat "$work/daemon.log"
