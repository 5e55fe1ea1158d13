#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy: the curated list) over every production source: the .cc files
# of pkg/ and cmd/, not tests (*_test.cc), test-only libraries (testing/ folders) or benches.
# Each file is checked once, with the compile command of the first build that compiles it:
# build (g++, CUDA when nvcc is found), then the others named (build-asan: no CUDA, so the
# *_absent.cc stand-ins of the CUDA parts). Headers are checked through the sources including
# them (.clang-tidy's HeaderFilterRegex); CUDA sources (.cu) are left to nvcc. Fails listing
# the findings.
#   bash scripts/check-tidy.sh [build-dir...]     (default: build build-asan, those that exist)
#   WC_TIDY_ALL=1 bash scripts/check-tidy.sh      every .cc of the compile databases, tests too
#   WC_TIDY_TIMES=FILE                              each file's seconds, slowest first
set -euo pipefail
cd "$(dirname "$0")/.."
builds=("$@")
((${#builds[@]})) || builds=(build build-asan)
dbs=()
for b in "${builds[@]}"; do
  [[ -f $b/compile_commands.json ]] && dbs+=("$b")
done
((${#dbs[@]})) || { echo "clang-tidy: no compile_commands.json in ${builds[*]} (configure first)" >&2; exit 1; }

if [[ ${WC_TIDY_ALL:-0} == 1 ]]; then
  mapfile -t wanted < <(git ls-files '*.cc')
else
  mapfile -t wanted < <(git ls-files 'pkg/*.cc' 'cmd/*.cc' | grep -vE '_test\.cc$|/testing/')
fi
# Which database compiles each file (the first that lists it); largest files first, so the
# longest runs do not start last.
declare -A by_db=()
unchecked=()
while read -r f; do
  placed=""
  for b in "${dbs[@]}"; do
    if grep -q "\"file\": \"$PWD/$f\"" "$b/compile_commands.json"; then
      by_db[$b]+="$PWD/$f"$'\n'
      placed=1
      break
    fi
  done
  [[ -n $placed ]] || unchecked+=("$f")
done < <(for f in "${wanted[@]}"; do echo "$(stat -c %s "$f") $f"; done | sort -rn | cut -d' ' -f2)

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# One clang-tidy per core; each file's seconds into times.txt (WC_TIDY_TIMES keeps them).
tidy_one() {  # tidy_one BUILD FILE: findings into $out/<n>.log, "seconds file" into times.txt
  local t0 t1 log
  log=$(mktemp "$out/XXXXXX.log")
  t0=$(date +%s.%N)
  clang-tidy -p "$1" --quiet "$2" >"$log" 2>&1 || echo "$2" >>"$out/failed"
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" -v f="$2" 'BEGIN { printf "%.1f %s\n", b - a, f }' >>"$out/times.txt"
}
export -f tidy_one
export out
total=0
for b in "${dbs[@]}"; do
  [[ -n ${by_db[$b]:-} ]] || continue
  total=$((total + $(printf '%s' "${by_db[$b]}" | grep -c .)))
  printf '%s' "${by_db[$b]}" | xargs -d '\n' -P "$(nproc)" -I{} bash -c 'tidy_one "$0" "$1"' "$b" {}
done
if ((${#unchecked[@]})); then
  echo "clang-tidy: not compiled by ${dbs[*]}, so not checked: ${unchecked[*]}"
fi
sort -rn "$out/times.txt" | sed "s|$PWD/||" >"${WC_TIDY_TIMES:-$out/sorted.txt}"
echo "clang-tidy: slowest files (s): $(head -5 "${WC_TIDY_TIMES:-$out/sorted.txt}" | awk '{printf "%s %s; ", $2, $1}')"
if [[ ! -f $out/failed ]]; then
  echo "clang-tidy: $total files clean"
else
  cat "$out"/*.log | sed 's/\x1b\[[0-9;]*m//g' | grep -E "(warning|error): " | sed "s|$PWD/||" |
    sort -u >&2 || cat "$out"/*.log >&2
  echo "clang-tidy: findings above in $(wc -l <"$out/failed") of $total files" >&2
  exit 1
fi
