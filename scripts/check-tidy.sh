#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy: the curated list) over every tracked C++ source of the build's
# compile database; fails listing the findings. Needs a configured build (compile_commands.json):
#   bash scripts/check-tidy.sh [build-dir]      (default: build)
# CUDA sources (.cu) are left to nvcc; headers are checked through the sources including them.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[[ -f $build/compile_commands.json ]] || { echo "clang-tidy: no $build/compile_commands.json (configure first)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.cc' | while read -r f; do
  grep -q "\"file\": \"$PWD/$f\"" "$build/compile_commands.json" && echo "$PWD/$f"; done)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if run-clang-tidy -p "$build" -j "$(nproc)" -quiet "${files[@]}" >"$out" 2>&1; then
  echo "clang-tidy: ${#files[@]} files clean"
else
  sed 's/\x1b\[[0-9;]*m//g' "$out" | grep -E "(warning|error): " | sed "s|$PWD/||" | sort -u >&2 ||
    cat "$out" >&2
  echo "clang-tidy: findings above (${#files[@]} files checked)" >&2
  exit 1
fi
