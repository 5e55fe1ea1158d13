#!/usr/bin/env bash
# Here: the carry for tests/gpu/run-onepass-on-device.sh (issue 58's device benchmarks, this
# tree beside a baseline build, in one call): one xz tarball, about 22 MB, holding
#   new/{bin,lib,commit}     this tree's weightcached, weightcache-keeper, weightcachectl,
#                          peer_fill_bench, pinned_load_bench and the libraries they need;
#   base/{bin,lib,commit}  the same programs of BASE_BUILD (e.g. a710f38 built in its own
#                          worktree) and the libraries they need beyond new/lib.
#
#   tests/gpu/prepare-onepass-carry.sh BUILD BASE_BUILD
# then, through the device tool:  run  carry=[".device-carry-onepass/onepass.tar.xz"]
#   command="bash tests/gpu/run-onepass-on-device.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
(($# == 2)) || { echo "usage: $0 BUILD BASE_BUILD" >&2; exit 2; }
build=$1
base=$2
out=$root/.device-carry-onepass
programs=(weightcached weightcache-keeper weightcachectl peer_fill_bench pinned_load_bench)
rm -rf "$out"
WC_CARRY_DIR=$out/new WC_CARRY_TARGETS="${programs[*]}" bash "$root/tests/gpu/prepare-carry.sh" "$build"
rm -rf "$out/new/include" "$out/new/lib-static" "$out/new/src"
mkdir -p "$out/base/bin" "$out/base/lib"
for p in "${programs[@]}"; do
  f=$(find "$base" -path "$base/python-venv" -prune -o -type f -name "$p" -perm -u+x -print | head -1)
  [[ -n $f ]] || { echo "$base: no $p built (build it there first)" >&2; exit 1; }
  strip --strip-debug -o "$out/base/bin/$p" "$f"
  # What the baseline links that this tree does not (the device image has glibc and
  # libstdc++; it lacks abseil, gRPC, protobuf and the rest).
  ldd "$f" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    n=$(basename "$lib")
    case $n in libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|ld-linux*) continue ;; esac
    [[ -e $out/new/lib/$n || -e $out/base/lib/$n ]] || cp -L "$lib" "$out/base/lib/$n"
  done
done
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$base/CMakeCache.txt")
git -C "$src" rev-parse --short HEAD >"$out/base/commit"
# bench/keeper_adoption_bench.sh names each build by its BINDIR/commit.
cp "$out/new/commit" "$out/new/bin/commit"
cp "$out/base/commit" "$out/base/bin/commit"
XZ_OPT="-1 -T0" tar -C "$out" -cJf "$out/onepass.tar.xz" new base
rm -rf "$out/new" "$out/base"
echo "$out/onepass.tar.xz: $(du -h "$out/onepass.tar.xz" | cut -f1) (new $(git -C "$root" rev-parse --short HEAD), base $(tar -xJOf "$out/onepass.tar.xz" base/commit))"
