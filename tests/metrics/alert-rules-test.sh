#!/usr/bin/env bash
# The alerting rules the chart ships (helm/weightcache/files/alerts.yaml, rendered into its
# PrometheusRule): promtool checks them, runs tests/metrics/alerts_test.yaml (each alert fires
# where it should and stays silent on healthy series), and every alert has a test where it
# fires, a runbook section in docs/metrics.md and a runbook_url naming that section.
# Exit 77 (skip) only when promtool (Debian's prometheus package) is not installed.
#   alert-rules-test.sh REPO_ROOT
set -uo pipefail
root="$1"
rules="$root/helm/weightcache/files/alerts.yaml"
tests="$root/tests/metrics/alerts_test.yaml"
doc="$root/docs/metrics.md"
command -v promtool >/dev/null || { echo "SKIP: promtool not installed (apt-get install prometheus)"; exit 77; }

failed=0
bad() { echo "FAIL: $*"; failed=1; }
promtool check rules "$rules" || bad "promtool check rules $rules"
promtool test rules "$tests" || bad "promtool test rules $tests"

mapfile -t alerts < <(sed -n 's/^ *- alert: *\([A-Za-z0-9_]*\) *$/\1/p' "$rules")
[[ ${#alerts[@]} -gt 0 ]] || bad "no alerts found in $rules"
for a in "${alerts[@]}"; do
  anchor="${a,,}"
  # A test that expects it to fire: its alertname followed by a non-empty exp_alerts.
  grep -A2 -E "^ *alertname: $a\$" "$tests" | grep -qE '^ *- exp_labels:' ||
    bad "$a: no test in $tests where it fires"
  grep -qE "^### $a\$" "$doc" || bad "$a: no runbook section '### $a' in docs/metrics.md"
  grep -qE "^ *runbook_url: docs/metrics\.md#$anchor\$" "$rules" ||
    bad "$a: runbook_url is not docs/metrics.md#$anchor"
done
[[ $failed -eq 0 ]] && echo "alert rules: ${#alerts[@]} alerts tested, each with its runbook"
exit $failed
