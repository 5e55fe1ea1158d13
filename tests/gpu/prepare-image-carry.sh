#!/usr/bin/env bash
# Here (the build machine): fill .device-carry-img/ for tests/gpu/run-image-on-device.sh with
# the daemon, keeper and CLI taken out of a built weightcache image (a docker-archive tarball,
# e.g. from `scripts/build-image.sh` then `podman save`), the shared libraries those binaries
# load inside the image (lib-image/), and this build's GPU test binaries (stack_gpu_test and
# its engine processes) with theirs (lib/). Issue 28: the image's own binaries, not this
# build's, must pass the GPU suite.
#
#   bash tests/gpu/prepare-image-carry.sh IMAGE.tar [build-dir]
#   tar -cJf .device-carry-img.tar.xz .device-carry-img
#   run(carry=[".device-carry-img.tar.xz"],
#       command="tar -xJf .device-carry-img.tar.xz && bash tests/gpu/run-image-on-device.sh")
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
image=${1:?usage: prepare-image-carry.sh IMAGE.tar [build-dir]}
build=${2:-$root/build}
carry=$root/.device-carry-img
[[ -f $image ]] || { echo "prepare-image-carry: no image tarball at $image" >&2; exit 1; }
rm -rf "$carry"
WC_CARRY_DIR=$carry WC_CARRY_TARGETS="stack_gpu_test wc_gpu_client wc_gpu_helper wc_gpu_attacker weightcachectl" \
  bash "$root/tests/gpu/prepare-carry.sh" "$build" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A docker-archive: manifest.json names the layers in order; unpacked over each other they
# are the image's file system (whiteouts do not matter for reading binaries and libraries).
mkdir -p "$work/archive" "$work/rootfs"
tar -xf "$image" -C "$work/archive"
/usr/bin/python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))[0]["Layers"]))' \
  "$work/archive/manifest.json" | while read -r layer; do
  tar -xf "$work/archive/$layer" -C "$work/rootfs" --exclude='dev/*' 2>/dev/null || true
done
mkdir -p "$carry/image" "$carry/lib-image"
for b in weightcached weightcachectl weightcache-keeper weightcache-webhook; do
  cp "$work/rootfs/usr/local/bin/$b" "$carry/image/"
done
# The libraries the image's binaries resolve inside the image, except glibc's own and the C++
# runtime (the GPU machine's are newer, as for every carry).
for b in "$carry"/image/*; do
  chroot "$work/rootfs" ldd "/usr/local/bin/$(basename "$b")"
done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libresolv.so*) ;;
    libstdc++.so*|libgcc_s.so*) ;;
    *) cp -L "$work/rootfs$lib" "$carry/lib-image/" ;;
  esac
done
grep -a -o 'org.opencontainers.image.version[^,]*' "$work/archive/"*.json 2>/dev/null | head -1 || true
echo "image binaries: $(cd "$carry/image" && echo *); libraries: $(find "$carry/lib-image" -type f | wc -l)"
du -sh "$carry"
