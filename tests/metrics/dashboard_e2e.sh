#!/usr/bin/env bash
# The chart's Grafana dashboard (helm/weightcache/files/dashboard.json) against a real
# Prometheus scraping a real daemon: weightcached on the host backend beside a real
# weightcache-keeper, with a memory budget, serves a small model; engines load it (a miss),
# map it (hits), ask for a model it does not know (a miss), an admin evicts it and an engine
# loads it again, and the daemon checks its resident copy. Prometheus scrapes every second.
# Then every query of every panel (Grafana's variables replaced: all daemons, a 1-minute
# rate window) must return at least one series: a metric or label renamed on either side, or
# a query that no longer parses, fails here. Processes are stopped by PID.
# Exit 77 (skip) only when the prometheus package is not installed.
#   dashboard_e2e.sh WEIGHTCACHED WEIGHTCACHECTL WEIGHTCACHE_KEEPER DASHBOARD_JSON
set -euo pipefail
daemon_bin="$1" ctl_bin="$2" keeper_bin="$3" dashboard="$4"
python=/usr/bin/python3
for tool in prometheus curl "$python"; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (apt-get install prometheus curl python3)"; exit 77; }
done

source "$(dirname "$0")/prom-lib.sh"

"$ctl_bin" demo-checkpoint "$work/model" >/dev/null
mkdir -m 0700 "$work/k"
"$keeper_bin" --socket="$work/k/keeper.sock" 2>"$work/keeper.log" &
pids+=($!)
wait_for 100 test -S "$work/k/keeper.sock" || fail "keeper did not start"

# Nothing preloaded: the loads happen while Prometheus scrapes.
"$daemon_bin" --socket_dir="$work/s" --backend=host --preload=false \
  --model="name=demo,model_dir=$work/model" --memory_budget=1GiB \
  --keeper_socket="$work/k/keeper.sock" --admin_uids="$(id -u)" \
  --metrics_address=127.0.0.1:0 2>"$work/daemon.log" &
pids+=($!)
wait_metrics_port "$work/daemon.log"
ctl=("$ctl_bin" --socket="$work/s")
wait_for 100 "${ctl[@]}" status >/dev/null 2>&1 || fail "daemon does not answer"

start_prometheus "127.0.0.1:$mport"

"${ctl[@]}" verify demo --load_on_miss >/dev/null || fail "first load"   # a miss, a load
for _ in 1 2; do "${ctl[@]}" verify demo >/dev/null || fail "verify"; done  # 2 hits
if "${ctl[@]}" verify nope >/dev/null 2>&1; then fail "unknown model acquired"; fi  # a miss
"${ctl[@]}" evict demo >/dev/null || fail "evict"
"${ctl[@]}" verify demo --load_on_miss >/dev/null || fail "second load"  # loaded again
"${ctl[@]}" verify --resident demo >/dev/null || fail "verify --resident"

# Prometheus has scraped what happened: both loads, and the keeper holding the reloaded copy.
scraped() {
  [[ "$(value 'sum(weightcache_load_duration_seconds_count)')" == "2" ]] &&
    [[ "$(value 'weightcache_integrity_checks_total')" != "0" ]] &&
    [[ "$(value 'weightcache_keeper_descriptors')" =~ ^[1-9] ]]
}
wait_for 300 scraped || fail "Prometheus did not see the loads, the check and the keeper's descriptors"
# Series born in the last scrape (the eviction's, the loads' bytes) have one sample, and rate()
# needs two: wait for two more scrapes.
scrapes() { value 'count_over_time(up{job="weightcache"}[10m])'; }
seen="$(scrapes)"
two_more() { [[ "$(scrapes)" -ge $((seen + 2)) ]]; }
wait_for 300 two_more || fail "Prometheus stopped scraping"

# Every panel's every query, as Grafana sends it with "All" daemons and a 1-minute window.
"$python" - "$dashboard" >"$work/queries.tsv" <<'PY'
import json, sys
dash = json.load(open(sys.argv[1]))
for p in dash["panels"]:
    for t in p.get("targets", []):
        expr = t["expr"].replace("$instance", ".*").replace("$__rate_interval", "1m")
        print(f'{p["title"]}\t{t["refId"]}\t{expr}')
PY
[[ -s "$work/queries.tsv" ]] || fail "no panel queries in $dashboard"
panels=0 bad=0
while IFS=$'\t' read -r title ref expr; do
  panels=$((panels + 1))
  answer="$(query "$expr" 2>&1)" || { echo "  $title [$ref]: query failed: $answer"; bad=$((bad + 1)); continue; }
  n="$(printf '%s' "$answer" | "$python" -c 'import json,sys; print(len(json.load(sys.stdin)["data"]["result"]))')"
  printf '  %-48s %s  %2d series\n' "$title" "$ref" "$n"
  [[ "$n" -gt 0 ]] || { echo "    no series: $expr"; bad=$((bad + 1)); }
done <"$work/queries.tsv"
[[ $bad -eq 0 ]] || fail "$bad of $panels panel queries returned no series"
echo "dashboard e2e: $panels panel queries, each returned series"
