# Shared by the tests that run a real Prometheus against a real daemon (prometheus_e2e.sh,
# dashboard_e2e.sh); sourced once the tools are known to be there. Makes the test's directory
# $work and the array pids: every process started by the test or here goes into it, and each
# is stopped by its PID on exit. fail MESSAGE prints the daemon's ($work/daemon.log) and
# Prometheus' logs and exits 1.

work="$(mktemp -d /tmp/wc-prom.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; tail -60 "$work/daemon.log" || true;
         echo "--- prometheus log"; tail -20 "$work/prom.log" || true; exit 1; }

# Poll `cmd` until it succeeds, at most `n` times 0.1 s apart (a bounded wait on a condition).
wait_for() { local n="$1"; shift; for _ in $(seq "$n"); do "$@" && return 0; sleep 0.1; done; return 1; }

# The metrics port weightcached logged into LOG (--metrics_address=127.0.0.1:0).
port_of_daemon() { grep -o '(port [0-9]*)' "$1" | head -1 | tr -dc '0-9'; }
# wait_metrics_port LOG: waits for it and sets $mport.
wait_metrics_port() {
  local log="$1"
  has_port() { [[ -n "$(port_of_daemon "$log")" ]]; }
  wait_for 100 has_port || fail "daemon did not report its metrics port"
  mport="$(port_of_daemon "$log")"
}

# start_prometheus TARGET: Prometheus scraping TARGET (host:port) every second as job
# "weightcache", its data under $work; sets $pport and waits until the target is up.
# Prometheus cannot report an ephemeral port back: a few random loopback ports are tried.
start_prometheus() {
  cat >"$work/prom.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: weightcache
    static_configs:
      - targets: ["$1"]
YAML
  pport=""
  local try ppid
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
  target_up() { [[ "$(value 'up{job="weightcache"}')" == "1" ]]; }
  wait_for 300 target_up || fail "target never up"
}

# query EXPR: Prometheus' JSON answer; value EXPR: the first sample's value.
query() { curl -fsS --get "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=$1"; }
value() { query "$1" | grep -o '"value":\[[^]]*\]' | head -1 | sed 's/.*,"\(.*\)"\]/\1/'; }
