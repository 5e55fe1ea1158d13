#!/usr/bin/env bash
# Prints every test the last ctest run in BUILD_DIR skipped (GTEST_SKIP), each with the reason
# it gave, and how many: a test that never runs is seen in CI's log, not only counted.
#   bash scripts/ctest-skips.sh BUILD_DIR LABEL    (LABEL names the job in each line)
set -euo pipefail
log=$1/Testing/Temporary/LastTest.log
[[ -f $log ]] || { echo "$2: no ctest log in $1"; exit 0; }
awk -v job="$2" '
  / Skipped$/ { reason = ""; want = 1; next }
  want && !/^\[/ { reason = reason (reason == "" ? "" : " ") $0; next }
  /^\[  SKIPPED \] .* \([0-9]+ ms\)$/ { name = $4; printf "%s: skipped %s: %s\n", job, name, (reason == "" ? "(no reason given)" : reason); want = 0; reason = ""; next }
  { want = 0 }
' "$log" | sort -u >"$log.skips"
cat "$log.skips"
echo "$2: $(wc -l <"$log.skips") test(s) skipped"
