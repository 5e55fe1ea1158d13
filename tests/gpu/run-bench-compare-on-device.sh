#!/usr/bin/env bash
# On the GPU machine, in one call: the benchmarks a restructure must leave unchanged (issue
# 46: gpu_acquire_bench at 120 GiB, load_bench's tensor-parallel sweep), for two builds side
# by side on the same card: $carry/bin (this commit) and $carry/base-bin (the baseline).
# Runs are interleaved (base, new, base, new) so that drift of the host shows as spread
# within each build, not as a difference between them.
#
# Here:    WC_CARRY_TARGETS="gpu_acquire_bench load_bench" tests/gpu/prepare-carry.sh build
#          and the baseline's two, built from its commit in another tree:
#            mkdir .device-carry/base-bin && for t in gpu_acquire_bench load_bench; do
#              strip --strip-debug -o .device-carry/base-bin/$t BASE/build/bench/$t; done
#            git -C BASE rev-parse --short HEAD >.device-carry/base-commit
# Device:  run(kind="nvidia-h200", needs_h200=true (120 GiB), carry=[".device-carry"],
#              command="OUT=$OUT bash tests/gpu/run-bench-compare-on-device.sh")
# Environment: OUT (logs and tables), ACQUIRE_ARGS (default --sizes_gib=1,120
# --tensors=1000,2000 --reps=5), LOAD_ARGS (default --sizes_gib=8 --tp=1,2,4,8
# --configs=16:256:4:auto), ROUNDS (1: base then new; 2 fits a call only with smaller sizes),
# SECTIONS (acquire,load).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=${WC_CARRY_DIR:-$root/.device-carry}
OUT=${OUT:-/tmp/wc-compare-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$carry/lib
exec > >(tee "$OUT/compare.log") 2>&1
section() { printf '\n===== %s =====\n' "$*"; }

section machine
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,memory.used --format=csv
uname -r; nproc; free -g
echo "new: $(cat "$carry/commit"), base: $(cat "$carry/base-commit" 2>/dev/null || echo unknown)"
if ldd "$carry/bin/load_bench" | grep -q "not found"; then
  echo "using the carried C++ runtime (lib-fallback)"
  export LD_LIBRARY_PATH=$carry/lib:$carry/lib-fallback
fi
if sync && echo 3 >/proc/sys/vm/drop_caches; then echo "drop_caches: works"; else echo "drop_caches: refused"; fi
dir=/var/tmp/wc-compare
[[ $(stat -f -c %T /var/tmp 2>/dev/null) == tmpfs ]] && dir=/root/wc-compare
mkdir -p "$dir"

rc=0
for round in $(seq 1 "${ROUNDS:-1}"); do
  for build in base new; do
    bin=$carry/bin
    [[ $build == base ]] && bin=$carry/base-bin
    if [[ ${SECTIONS:-acquire,load} == *acquire* ]]; then
      section "round $round, $build: gpu_acquire_bench"
      timeout 240 "$bin/gpu_acquire_bench" ${ACQUIRE_ARGS:---sizes_gib=1,120 --tensors=1000,2000 --reps=5} \
        >"$OUT/acquire-$build-$round.md" || rc=1
      cat "$OUT/acquire-$build-$round.md"
    fi
    [[ ${SECTIONS:-acquire,load} == *load* ]] || continue
    section "round $round, $build: load_bench"
    timeout 240 "$bin/load_bench" --dir="$dir" \
      ${LOAD_ARGS:---sizes_gib=8 --tp=1,2,4,8 --configs=16:256:4:auto} --deadline_s=200 \
      >"$OUT/load-$build-$round.md" || rc=1
    cat "$OUT/load-$build-$round.md"
  done
done
rm -rf "$dir"
section "result: exit $rc"
exit $rc
