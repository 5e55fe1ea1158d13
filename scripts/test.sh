#!/usr/bin/env bash
# Installs, builds and runs the whole test suite (ctest prints its summary). GPU tests skip
# with their reason on a machine without a GPU; tests/gpu/run-on-device.sh runs them on one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
bash scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)"
