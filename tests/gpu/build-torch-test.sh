#!/usr/bin/env bash
# On the GPU machine: build the libtorch adapter and its GPU test (wc_torch_gpu_test) against
# THAT machine's libtorch (torch 2.11 in its python3), since a libtorch binary must match the
# libtorch it runs with. The machine has g++, CUDA headers and torch but no abseil/gRPC:
# prepare-carry.sh brings the abseil headers (include/), the weightcache static libraries
# (lib-static/), the shared libraries they need (lib/) and a snapshot of the sources (src/).
#   tests/gpu/build-torch-test.sh OUTPUT_BINARY
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=$root/.device-carry
out=${1:?output binary}
torch_dir=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
cuda_inc=/usr/local/cuda/include
echo "libtorch: $torch_dir ($(python3 -c 'import torch; print(torch.__version__)'))"
src=$carry/src
# The adapter and the test compile in parallel; then one link.
g++ -std=c++20 -O1 -c -I"$src" -I"$carry/include" -isystem "$torch_dir/include" \
  -isystem "$torch_dir/include/torch/csrc/api/include" -isystem "$cuda_inc" \
  "$src/pkg/client/torch/torch_adapter.cc" -o /tmp/wc_torch_adapter.o &
g++ -std=c++20 -O1 -c -I"$src" -I"$carry/include" -isystem "$torch_dir/include" \
  -isystem "$torch_dir/include/torch/csrc/api/include" -isystem "$cuda_inc" \
  "$src/tests/gpu/torch_gpu_test.cc" -o /tmp/wc_torch_gpu_test.o &
wait -n && wait -n
shared=$(ls "$carry"/lib/*.so*)
g++ -o "$out" /tmp/wc_torch_gpu_test.o /tmp/wc_torch_adapter.o \
  -Wl,--start-group "$carry"/lib-static/*.a -Wl,--end-group $shared \
  -Wl,-rpath-link,"$carry/lib" -L"$torch_dir/lib" -Wl,-rpath,"$torch_dir/lib" \
  -Wl,--no-as-needed -ltorch_cuda -lc10_cuda -Wl,--as-needed -ltorch -ltorch_cpu -lc10 \
  -ldl -lpthread
echo "built $out"
