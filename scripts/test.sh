#!/usr/bin/env bash
# Installs, builds and runs the whole test suite (ctest prints its summary). GPU tests skip
# with their reason on a machine without a GPU; tests/gpu/run-on-device.sh runs them on one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
bash scripts/check-format.sh
bash scripts/build.sh
bash scripts/check-tidy.sh build
cd build
# GPU tests skip without a GPU: show each one's reason, then run the whole suite, whose
# summary closes the output.
ctest -L gpu -V 2>&1 | grep -A1 -E "^[0-9]+: .*: Skipped$" | grep -vE "Skipped$|^--$" \
  | sed 's/^[0-9]*: /gpu tests skipped: /' | sort -u || true
ctest --output-on-failure -j "$(nproc)"
