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
# The carried libraries this program needs and, transitively, theirs: the ones its objects
# reference (an --as-needed link keeps exactly those) and their dependencies found in the
# carry. All are listed as this binary's own NEEDED entries, so its RUNPATH finds them (RUNPATH
# covers direct dependencies only: an abseil library needed by gRPC alone was not found, exit
# 127). Linking every carried library instead would load cpp-httplib, prometheus-cpp and UCX
# too, and httplib exports std::regex template instances built by Debian's g++ 12 that come
# before libtorch's in the global scope (torch's package loader parses device strings with
# std::regex).
# The C++ runtime comes first of all (its NEEDED entry before libtorch's): the global lookup
# order follows these entries, and pip's libtorch.so exports std:: symbols of its own
# (std::ctype<char>::do_widen among them). With libtorch ahead, libstdc++'s own references and
# the AOTInductor package's bound to libtorch's copies and torch's package loader died in
# std::regex (SIGSEGV, H100, torch 2.11); with libstdc++ ahead (here, or preloaded) the same
# binary loaded the package and ran (the device log of 2026-12-07, docs/gpu.md).
# shellcheck disable=SC2054  # the commas are the linker's
torch_libs=(-Wl,--no-as-needed -lstdc++ -L"$torch_dir/lib" -Wl,-rpath,"$torch_dir/lib"
            -ltorch_cuda -lc10_cuda -ltorch -ltorch_cpu -lc10 -Wl,--as-needed)
link() {  # link OUTPUT CARRIED_LIBS...
  local o=$1; shift
  g++ -o "$o" "${objs[@]}" "${torch_libs[@]}" \
    -Wl,--start-group "$carry"/lib-static/*.a -Wl,--end-group "$@" \
    -Wl,-rpath-link,"$carry/lib" -Wl,-rpath,"$carry/lib" -ldl -lpthread
}
link "$out.direct" -Wl,--as-needed "$carry"/lib/*.so*
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
declare -A closure=()
mapfile -t queue < <(needed "$out.direct")
while ((${#queue[@]})); do
  n=${queue[0]}; queue=("${queue[@]:1}")
  [[ -f $carry/lib/$n && -z ${closure[$n]:-} ]] || continue
  closure[$n]=1
  mapfile -t more < <(needed "$carry/lib/$n")
  queue+=("${more[@]}")
done
rm -f "$out.direct"
echo "carried libraries linked (${#closure[@]}): ${!closure[*]}"
libs=()
for n in "${!closure[@]}"; do libs+=("$carry/lib/$n"); done
link "$out" -Wl,--no-as-needed "${libs[@]}" -Wl,--as-needed
readelf -d "$out" | grep -c NEEDED | xargs echo "NEEDED entries:"
readelf -d "$out" | grep -m1 NEEDED | grep -q 'libstdc++' || { echo "libstdc++ is not the first NEEDED"; exit 1; }
echo "built $out"
