#!/usr/bin/env bash
# Here (the build machine, Debian with abseil/gRPC): build the GPU test and benchmark
# binaries and fill .device-carry/ with them and the shared libraries they need that the GPU
# machine's image lacks, for tests/gpu/run-on-device.sh. The GPU machine has nvcc and cmake
# but no abseil, gRPC or protobuf, and no network.
#
#   tests/gpu/prepare-carry.sh [build-dir]     (default: build-cuda)
# then, through the device tool:  run  carry=[".device-carry"]
#   command="bash tests/gpu/run-on-device.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-cuda}
carry=${WC_CARRY_DIR:-$root/.device-carry}
# WC_CARRY_TARGETS (space-separated) carries only those binaries (and skips the libtorch
# adapter material), e.g. "fp8_quant_gpu_test fp8_quant_bench" for run-fp8-on-device.sh, or
# "gpu_acquire_bench concurrency_bench load_bench" for bench/run-all (whose header says how).
# The carry's `commit` file names the commit built (with -dirty for uncommitted changes):
# bench/run-all records it in machine.json.
default_targets=(cuda_vmm_test wc_gpu_helper memory_test gpu_map_bench stack_gpu_test
                 wc_gpu_client weightcached weightcachectl gpu_acquire_bench fp8_quant_gpu_test
                 fp8_quant_bench gpu_load_test digest_bench weightcache-keeper
                 concurrency_bench integrity_gpu_test wc_gpu_attacker scrub_bench
                 peer_fill_bench sleep_wake_gpu_test tails_zero_gpu_test)
read -r -a targets <<<"${WC_CARRY_TARGETS:-${default_targets[*]}}"

if [[ ! -f $build/build.ninja ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DWEIGHTCACHE_BENCH=ON -DWEIGHTCACHE_CUDA=ON
fi
ninja -C "$build" "${targets[@]}"

rm -rf "$carry"
mkdir -p "$carry/bin" "$carry/lib" "$carry/lib-fallback" "$carry/lib-static" "$carry/include" "$carry/src"
for t in "${targets[@]}"; do
  # The build's own binary, never a copy the Python suite installed into its venv (an older
  # build's daemon was carried so once).
  f=$(find "$build" -path "$build/python-venv" -prune -o -type f -name "$t" -perm -u+x -print |
      head -1)
  [[ -n $f ]] || { echo "missing $t" >&2; exit 1; }
  strip --strip-debug -o "$carry/bin/$t" "$f"
done
{ git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown; } | tr -d '\n' >"$carry/commit"
git -C "$root" diff --quiet HEAD 2>/dev/null || echo -n "-dirty" >>"$carry/commit"
# Every resolved library except glibc's own and the C++ runtime (the GPU machine's are
# newer); those two go to lib-fallback in case its image is older than ours.
for b in "$carry"/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libresolv.so*) ;;
    libstdc++.so*|libgcc_s.so*) cp -L "$lib" "$carry/lib-fallback/" ;;
    libcuda.so*) echo "error: $lib is linked; libcuda must be loaded at run time" >&2; exit 1 ;;
    *) cp -L "$lib" "$carry/lib/" ;;
  esac
done
# For building the libtorch adapter test ON the GPU machine against its own libtorch
# (build-torch-test.sh): abseil headers, the weightcache static libraries the adapter needs,
# and a snapshot of the headers and sources it compiles; the same for the C++ engine example
# (examples/cpp_engine/build-on-device.sh), which also needs protobuf's headers and the
# generated messages (an artifact key).
if [[ -n ${WC_CARRY_TARGETS:-} ]]; then
  du -sh "$carry"
  exit 0
fi
cp -r /usr/include/absl /usr/include/nlohmann "$carry/include/"
mkdir -p "$carry/include/google" "$carry/src/proto/weightcache/v1"
cp -r /usr/include/google/protobuf "$carry/include/google/"
cp "$build"/proto/weightcache/v1/*.pb.h "$carry/src/proto/weightcache/v1/"
for l in client memory safetensors util proto; do
  strip --strip-debug -o "$carry/lib-static/libwc_$l.a" "$(find "$build/pkg" "$build/proto" -name "libwc_$l.a" | head -1)"
done
(cd "$root" && find pkg -name '*.h' -print0 | xargs -0 cp --parents -t "$carry/src" &&
  cp --parents pkg/client/torch/torch_adapter.cc pkg/client/torch/aoti_package.cc \
    examples/cpp_engine/main.cc tests/gpu/torch_gpu_test.cc -t "$carry/src")
du -sh "$carry"
ls "$carry/lib" | wc -l | xargs echo "libraries carried:"
