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

work="$(mktemp -d /tmp/wc-prom.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$work/daemon.log" || true;
         echo "--- prometheus log"; tail -20 "$work/prom.log" || true; exit 1; }

# Poll `cmd` until it succeeds, at most `n` times 0.1 s apart (a bounded wait on a condition).
wait_for() { local n="$1"; shift; for _ in $(seq "$n"); do "$@" && return 0; sleep 0.1; done; return 1; }

"$ctl_bin" demo-checkpoint "$work/model" >/dev/null
"$daemon_bin" --socket_dir="$work/s" --backend=host --model="name=demo,model_dir=$work/model" \
  --metrics_address=127.0.0.1:0 2>"$work/daemon.log" &
pids+=($!)
port_of_daemon() { grep -o '(port [0-9]*)' "$work/daemon.log" | head -1 | tr -dc '0-9'; }
has_port() { [[ -n "$(port_of_daemon)" ]]; }
wait_for 100 has_port || fail "daemon did not report its metrics port"
mport="$(port_of_daemon)"
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

cat >"$work/prom.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: weightcache
    static_configs:
      - targets: ["127.0.0.1:$mport"]
YAML
# Prometheus cannot report an ephemeral port back: try a few random loopback ports.
pport=""
for _ in 1 2 3 4 5; do
  try=$((20000 + RANDOM % 40000))
  prometheus --config.file="$work/prom.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$try" >"$work/prom.log" 2>&1 &
  ppid=$!
  if wait_for 100 curl -fs "http://127.0.0.1:$try/-/ready" -o /dev/null; then
    pids+=("$ppid"); pport="$try"; break
  fi
  kill "$ppid" 2>/dev/null || true; wait "$ppid" 2>/dev/null || true
done
[[ -n "$pport" ]] || fail "prometheus did not start"

query() { curl -fsS --get "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=$1"; }
value() { query "$1" | grep -o '"value":\[[^]]*\]' | head -1 | sed 's/.*,"\(.*\)"\]/\1/'; }
up() { [[ "$(value 'up{job="weightcache"}')" == "1" ]]; }
wait_for 300 up || fail "target never up"

hits="$(value 'sum(weightcache_acquire_total{result="hit"})')"
[[ "$hits" == "3" ]] || fail "hit counter: want 3, got '$hits'"
ratio="$(value 'sum(weightcache_acquire_total{result="hit"}) / sum(weightcache_acquire_total)')"
[[ "$ratio" == "0.75" ]] || fail "hit ratio: want 0.75, got '$ratio'"
resident="$(value 'sum(weightcache_resident_bytes{model="demo"})')"
[[ "${resident:-0}" != "0" ]] || fail "resident bytes missing"
echo "prometheus e2e: target up, hits=$hits, hit ratio=$ratio, resident=$resident bytes"
