#!/usr/bin/env bash
# Here (the build machine): fill .device-carry-py/ for tests/gpu/run-python-on-device.sh with
# weightcached and weightcachectl (CUDA build) and their shared libraries (lib/), and the
# Python package (python/weightcache/) with libweightcache.so and every shared library it
# needs beside it: its RPATH is $ORIGIN (DT_RPATH, searched for indirect dependencies too),
# so the GPU machine, which has no gRPC, protobuf or abseil, loads it without LD_LIBRARY_PATH.
#
#   bash tests/gpu/prepare-python-carry.sh [build-dir]     (default: build; needs CUDA)
# then, through the device tool:
#   run  carry=[".device-carry-py"]  command="bash tests/gpu/run-python-on-device.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
carry=$root/.device-carry-py
if [[ -f $build/compile_commands.json ]] && ! grep -q cuda_backend.cc "$build/compile_commands.json"; then
  echo "prepare-python-carry: $build is configured without CUDA (the daemon needs cuda-vmm)" >&2
  exit 1
fi
WC_CARRY_DIR=$carry WC_CARRY_TARGETS="weightcached weightcachectl" \
  bash "$root/tests/gpu/prepare-carry.sh" "$build"
ninja -C "$build" weightcache
pkg=$carry/python/weightcache
mkdir -p "$pkg"
cp "$root"/python/weightcache/*.py "$root"/python/weightcache/*.json "$root/python/weightcache/py.typed" "$pkg/"
strip --strip-debug -o "$pkg/libweightcache.so" "$build/pkg/client/capi/libweightcache.so"
ldd "$pkg/libweightcache.so" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libresolv.so*) ;;
    libstdc++.so*|libgcc_s.so*) ;;  # the GPU machine's (Ubuntu 24.04) are newer
    *) cp -L "$lib" "$pkg/" ;;
  esac
done
du -sh "$carry"
echo "libraries beside libweightcache.so: $(find "$pkg" -name 'lib*.so*' | wc -l)"
