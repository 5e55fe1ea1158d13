#!/usr/bin/env bash
# On the GPU machine, in one call (about 10 minutes): issue 58's benchmarks for this tree and a
# baseline build side by side (carry: tests/gpu/prepare-onepass-carry.sh), on one card and disk:
#   1. pinned loads (bench/pinned_load_bench): the baseline's tp 1 row; this tree's tp 1 and 8,
#      two cold runs each, with (c), the first sight of one 8 GiB file; then this tree's tp 1
#      with every load reading two files side by side (--side_by_side=2: does interleaving
#      itself cost the disk?), and with a hold of 2 GiB (--hold_mib=2048);
#   2. peer fill into GPU memory (bench/peer_fill_bench --backend=cuda-vmm), this tree, then
#      the baseline;
#   3. keeper adoption of a 64 GiB host-backend entry (bench/keeper_adoption_bench.sh), this
#      tree first (its row is the one wanted), then the baseline with what time is left.
# Each step's log comes back as one tarball in $OUT (a call returns at most 8 files); the
# tables are printed as they come. Environment: OUT, TOTAL (seconds, 585), GIB (8) and
# ADOPT_GIB (64): a smoke run on a machine without a GPU takes GIB=1 ADOPT_GIB=1 (host backend).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-/tmp/wc-onepass-out}
TOTAL=${TOTAL:-585}
GIB=${GIB:-8}
ADOPT_GIB=${ADOPT_GIB:-64}
L=/tmp/wc-onepass-logs
mkdir -p "$OUT" "$L/pin" "$L/pf" "$L/adopt"
c=$root/.device-carry-onepass
tar -C "$c" -xJf "$c/onepass.tar.xz" || exit 9
export LD_LIBRARY_PATH=$c/new/lib:$c/base/lib
if ldd "$c/new/bin/pinned_load_bench" | grep -q "not found"; then
  echo "using the carried C++ runtime (lib-fallback)"
  LD_LIBRARY_PATH+=:$c/new/lib-fallback
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
grep -m1 'model name' /proc/cpuinfo; nproc; free -g | sed -n 2p
openssl speed -seconds 1 -evp sha256 2>/dev/null | tail -n 1
echo "new $(cat "$c/new/commit"), base $(cat "$c/base/commit"); ready at ${SECONDS} s"
d=/var/tmp/wc-onepass
[[ $(stat -f -c %T /var/tmp 2>/dev/null) == tmpfs ]] && d=/root/wc-onepass
mkdir -p "$d"
pin() {  # pin NAME SECONDS BINARY ARGS...
  local n=$1 t=$2
  shift 2
  timeout "$t" "$@" --dir="$d/$n" >"$L/pin/$n.log" 2>&1
  echo "pinned_load_bench $n: rc $? at ${SECONDS} s"
  rm -rf "${d:?}/$n"
  grep -E '^\||^\(a\)|^## |^  (cold|hot) ' "$L/pin/$n.log"
}
pin base 50 "$c/base/bin/pinned_load_bench" --gib="$GIB" --tp=1 --reps=1 --first_sight_gib=0 --hot=0
pin new 170 "$c/new/bin/pinned_load_bench" --gib="$GIB" --tp=1,8 --reps=2 --first_sight_gib="$GIB" --hot=0
# Where a pinned load's time goes: every load reading two files side by side; a hold four
# times the default (each run's line says how long readers waited for room, and the seconds
# from the reads' end to the check's verdict).
pin sbs2 45 "$c/new/bin/pinned_load_bench" --gib="$GIB" --tp=1 --reps=1 --first_sight_gib=0 --hot=0 \
  --side_by_side=2
pin hold2g 45 "$c/new/bin/pinned_load_bench" --gib="$GIB" --tp=1 --reps=1 --first_sight_gib=0 \
  --hot=0 --hold_mib=2048
tar -czf "$OUT/pin.tgz" -C "$L" pin
for b in new base; do
  UCX_TLS=tcp timeout 45 "$c/$b/bin/peer_fill_bench" --backend=cuda-vmm --gib="$GIB" \
    --dir="$d/pf-$b" --runs=1 >"$L/pf/$b.log" 2>&1
  echo "peer_fill_bench $b: rc $? at ${SECONDS} s"
  rm -rf "${d:?}/pf-$b"
  grep -E '^\|' "$L/pf/$b.log"
done
tar -czf "$OUT/pf.tgz" -C "$L" pf
rm -rf "$d"
OUT=$L/adopt timeout $((TOTAL - SECONDS)) bash bench/keeper_adoption_bench.sh --gib="$ADOPT_GIB" --files=16 \
  "$c/new/bin" "$c/base/bin" >"$L/adopt.log" 2>&1
echo "keeper_adoption_bench: rc $? at ${SECONDS} s"
cat "$L/adopt.log"
tar -czf "$OUT/adopt.tgz" -C "$L" adopt adopt.log
