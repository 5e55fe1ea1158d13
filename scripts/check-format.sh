#!/usr/bin/env bash
# Fails (listing the files) when a tracked C++/CUDA file differs from clang-format's output
# (.clang-format: Google base, 100 columns). Fix with: clang-format -i <files>.
# One clang-format per core, 16 files each.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t bad < <(git ls-files -z '*.cc' '*.h' '*.cu' '*.cuh' |
  xargs -0 -n 16 -P "$(nproc)" sh -c 'for f; do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || echo "$f"; done' sh | sort)
if ((${#bad[@]})); then
  echo "clang-format: ${#bad[@]} file(s) not formatted: ${bad[*]}" >&2
  exit 1
fi
echo "clang-format: all files formatted"
