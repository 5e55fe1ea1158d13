#!/usr/bin/env bash
# On the GPU machine, in one call: issue 58's pinned-load benchmarks (bench/pinned_load_bench)
# for this tree ($carry/bin) and, before it, a baseline build ($carry/base-bin, e.g. a710f38,
# whose pinned loads hashed beside the load: two passes), on the same card and disk.
#
# Here:    WC_CARRY_DIR=$PWD/.device-carry-pin WC_CARRY_TARGETS=pinned_load_bench \
#            tests/gpu/prepare-carry.sh build
#          and the baseline's binary, built from its commit in another tree (the bench's source
#          compiles there with its pin counters set to 0):
#            mkdir .device-carry-pin/base-bin && strip --strip-debug \
#              -o .device-carry-pin/base-bin/pinned_load_bench BASE/build/bench/pinned_load_bench
#            git -C BASE rev-parse --short HEAD >.device-carry-pin/base-commit
# Device:  run(carry=[".device-carry-pin"], command="bash tests/gpu/run-pinned-bench-on-device.sh")
# Environment: OUT (logs), BASE_ARGS (default --gib=8 --tp=1,8 --reps=1 --first_sight_gib=0
# --hot=0), NEW_ARGS (default --gib=8 --tp=1,8 --reps=2 --first_sight_gib=8), TOTAL (570 s).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=${WC_CARRY_DIR:-$root/.device-carry-pin}
OUT=${OUT:-/tmp/wc-pinned-out}
TOTAL=${TOTAL:-570}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$carry/lib
exec > >(tee "$OUT/pinned-bench.log") 2>&1
section() { printf '\n===== %s [%s s] =====\n' "$*" "$SECONDS"; }

section machine
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
grep -m1 'model name' /proc/cpuinfo; nproc; free -g | sed -n 2p
echo "new: $(cat "$carry/commit"), base: $(cat "$carry/base-commit" 2>/dev/null || echo none)"
if ldd "$carry/bin/pinned_load_bench" | grep -q "not found"; then
  echo "using the carried C++ runtime (lib-fallback)"
  export LD_LIBRARY_PATH=$carry/lib:$carry/lib-fallback
fi
command -v openssl >/dev/null && openssl speed -seconds 2 -evp sha256 2>/dev/null | tail -n 2
dir=/var/tmp/wc-pinned
[[ $(stat -f -c %T /var/tmp 2>/dev/null) == tmpfs ]] && dir=/root/wc-pinned
mkdir -p "$dir"
echo "checkpoint dir: $dir ($(stat -f -c %T "$dir")), $(df -h "$dir" | tail -1)"
rc=0
# shellcheck disable=SC2086
if [[ -x $carry/base-bin/pinned_load_bench ]]; then
  section "baseline $(cat "$carry/base-commit" 2>/dev/null)"
  timeout $((TOTAL / 3)) "$carry/base-bin/pinned_load_bench" --dir="$dir/base" \
    ${BASE_ARGS:---gib=8 --tp=1,8 --reps=1 --first_sight_gib=0 --hot=0} || rc=$?
  rm -rf "$dir/base"
fi
section "this tree $(cat "$carry/commit")"
# shellcheck disable=SC2086
timeout $((TOTAL - SECONDS - 10)) "$carry/bin/pinned_load_bench" --dir="$dir/new" \
  ${NEW_ARGS:---gib=8 --tp=1,8 --reps=2 --first_sight_gib=8} || rc=$?
rm -rf "$dir"
section "done (rc $rc)"
exit $rc
