#!/usr/bin/env bash
# End to end with a real Prometheus: the daemon serves a model with its metrics on an
# ephemeral loopback port; a few Acquires happen (3 hits, 1 miss); Prometheus scrapes it every
# second; the HTTP API must return the hit counter and the hit ratio; promtool must find no
# problem in the scrape. Both processes are stopped by PID. Exit 77 (skip) only when the
# prometheus package is not installed.
#   prometheus_e2e.sh WEIGHTCACHED WEIGHTCACHECTL
set -euo pipefail
daemon_bin="$1" ctl_bin="$2"
for tool in prometheus promtool curl; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (apt-get install prometheus curl)"; exit 77; }
done

source "$(dirname "$0")/prom-lib.sh"

"$ctl_bin" demo-checkpoint "$work/model" >/dev/null
"$daemon_bin" --socket_dir="$work/s" --backend=host --model="name=demo,model_dir=$work/model" \
  --metrics_address=127.0.0.1:0 2>"$work/daemon.log" &
pids+=($!)
wait_metrics_port "$work/daemon.log"
ctl=("$ctl_bin" --socket="$work/s")
ready() { "${ctl[@]}" status 2>/dev/null | grep -q '^demo .*ready'; }
wait_for 100 ready || fail "model did not become ready"

for _ in 1 2 3; do "${ctl[@]}" verify demo >/dev/null || fail "verify failed"; done   # 3 hits
if "${ctl[@]}" verify nope >/dev/null 2>&1; then fail "unknown model acquired"; fi  # 1 miss

curl -fsS "http://127.0.0.1:$mport/metrics" >"$work/scrape.txt" || fail "scrape failed"
problems="$(promtool check metrics <"$work/scrape.txt" 2>&1)" || fail "promtool: $problems"
[[ -z "$problems" ]] || fail "promtool reported: $problems"
curl -fsS "http://127.0.0.1:$mport/healthz" | grep -q ok || fail "/healthz"
curl -fsS "http://127.0.0.1:$mport/readyz" >/dev/null || fail "/readyz not ready"

start_prometheus "127.0.0.1:$mport"

hits="$(value 'sum(weightcache_acquire_total{result="hit"})')"
[[ "$hits" == "3" ]] || fail "hit counter: want 3, got '$hits'"
ratio="$(value 'sum(weightcache_acquire_total{result="hit"}) / sum(weightcache_acquire_total)')"
[[ "$ratio" == "0.75" ]] || fail "hit ratio: want 0.75, got '$ratio'"
resident="$(value 'sum(weightcache_resident_bytes{model="demo"})')"
[[ "${resident:-0}" != "0" ]] || fail "resident bytes missing"
echo "prometheus e2e: target up, hits=$hits, hit ratio=$ratio, resident=$resident bytes"
