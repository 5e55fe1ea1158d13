#!/usr/bin/env bash
# Fails (listing the files) when a tracked C++/CUDA file differs from clang-format's output
# (.clang-format: Google base, 100 columns). Fix with: clang-format -i <files>.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=()
while IFS= read -r f; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if ((${#bad[@]})); then
  echo "clang-format: ${#bad[@]} file(s) not formatted: ${bad[*]}" >&2
  exit 1
fi
echo "clang-format: all files formatted"
