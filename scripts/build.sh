#!/usr/bin/env bash
# Configures and builds weightcache into ${BUILD_DIR:-build} (CUDA when nvcc is found).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
ninja -C "$build" -j "$(nproc)"
