#!/usr/bin/env bash
# On the GPU machine: build wc_cpp_engine (examples/cpp_engine) against THAT machine's
# libtorch (torch in its python3: a libtorch program must match the libtorch it runs with),
# from the material tests/gpu/prepare-carry.sh puts in .device-carry (abseil and protobuf
# headers, the weightcache static libraries, a snapshot of the sources, the shared libraries).
#   examples/cpp_engine/build-on-device.sh OUTPUT_BINARY
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=$root/.device-carry
out=${1:?output binary}
py=${PYTHON:-python3}
torch_dir=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
echo "libtorch: $torch_dir ($("$py" -c 'import torch; print(torch.__version__)'))"
src=$carry/src
[[ -f $src/examples/cpp_engine/main.cc ]] || {
  echo "$carry predates the C++ engine: run tests/gpu/prepare-carry.sh again"; exit 1; }
flags=(-std=c++20 -O2 -I"$src" -I"$carry/include" -isystem "$torch_dir/include"
       -isystem "$torch_dir/include/torch/csrc/api/include" -isystem /usr/local/cuda/include)
objs=()
for f in pkg/client/torch/aoti_package.cc pkg/client/torch/torch_adapter.cc examples/cpp_engine/main.cc; do
  o=/tmp/wc_cpp_engine_$(basename "$f" .cc).o
  g++ "${flags[@]}" -c "$src/$f" -o "$o" &
  objs+=("$o")
done
for _ in "${objs[@]}"; do wait -n; done
shared=$(ls "$carry"/lib/*.so*)
# The carried libraries are linked as needed or not (Ubuntu's g++ links --as-needed): an
# abseil library needed only by another one is then still found through this binary's
# RUNPATH, which covers its direct dependencies only. A DT_RPATH (--disable-new-dtags) would
# instead put the carried Debian libraries ahead of the system's for libtorch and the
# package too (a SIGSEGV inside the package load on the device; not proven to be the cause).
g++ -o "$out" "${objs[@]}" \
  -Wl,--start-group "$carry"/lib-static/*.a -Wl,--end-group -Wl,--no-as-needed $shared -Wl,--as-needed \
  -Wl,-rpath-link,"$carry/lib" -Wl,-rpath,"$carry/lib" \
  -L"$torch_dir/lib" -Wl,-rpath,"$torch_dir/lib" \
  -Wl,--no-as-needed -ltorch_cuda -lc10_cuda -Wl,--as-needed -ltorch -ltorch_cpu -lc10 \
  -ldl -lpthread
echo "built $out"
