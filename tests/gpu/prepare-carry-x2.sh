#!/usr/bin/env bash
# Here (the build machine): build the 2-GPU test, its engine, the daemon, the CLI and the P2P
# benchmark, and fill .device-carry-x2/ with them and the shared libraries the GPU machine's
# image lacks (as tests/gpu/prepare-carry.sh does for the one-GPU run), for
# tests/gpu/run-on-device-x2.sh. .device-carry-x2/ must be git-ignored (.git/info/exclude).
#
#   tests/gpu/prepare-carry-x2.sh [build-dir]     (default: build-mgpu)
# then, through the device tool (kind nvidia-h200-x2):
#   run  kind=nvidia-h200-x2  carry=[".device-carry-x2"]  command="bash tests/gpu/run-on-device-x2.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-mgpu}
carry=$root/.device-carry-x2
targets=(multi_gpu_test wc_mgpu_engine weightcached weightcachectl gpu_p2p_bench memory_test)

if [[ ! -f $build/build.ninja ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DWEIGHTCACHE_BENCH=ON -DWEIGHTCACHE_CUDA=ON
fi
ninja -C "$build" "${targets[@]}"

rm -rf "$carry"
mkdir -p "$carry/bin" "$carry/lib" "$carry/lib-fallback"
for t in "${targets[@]}"; do
  f=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
  [[ -n $f ]] || { echo "missing $t" >&2; exit 1; }
  strip --strip-debug -o "$carry/bin/$t" "$f"
done
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
du -sh "$carry"
ls "$carry/lib" | wc -l | xargs echo "libraries carried:"
