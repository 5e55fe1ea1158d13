#!/usr/bin/env bash
# On the GPU machine, in one call: two builds of bench/pinned_load_bench side by side (A: this
# tree, $carry/bin; B: a candidate change, $carry/ab/pinned_load_bench, built from another
# tree), cold tp 1 loads of one checkpoint size, runs alternating A B A B so that drift
# shows as spread; before them, what one core's SHA-256 does beside other work on this host
# (openssl speed, 2 s each): alone; two at once; two on one core's SMT siblings; two beside
# 14 spinning shells; two beside 8 memory-writing loops (dd from /dev/zero). Together they
# say whether the in-load hash (pinned_load_bench's "while hashing" rate) is slowed by the
# machine (frequency, siblings, memory) or by the change. Where $carry/old/pinned_load_bench
# is carried too (a build without a change to the first sight's hash), after round 1 the
# first sight of one file (FIRST_SIGHT_ARGS: (c) alone) by it and by A.
#
# Here:    tests/gpu/prepare-carry.sh build   (or WC_CARRY_TARGETS=pinned_load_bench ...)
#          mkdir -p .device-carry/ab && strip --strip-debug \
#            -o .device-carry/ab/pinned_load_bench OTHER/build/bench/pinned_load_bench
#          echo "what B is" >.device-carry/ab/what
# Device:  bash tests/gpu/run-pinned-ab-on-device.sh   (after tests/gpu/run-on-device.sh in the
#          same call, if wanted). Environment: OUT (logs), ARGS (each run's flags, default
#          --gib=8 --tp=1 --reps=2 --first_sight_gib=0 --hot=0), FIRST_SIGHT_ARGS (--gib=0
#          --first_sight_gib=8 --reps=2 --hot=0), ROUNDS (2), TOTAL (seconds this script may
#          take, 300).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=${WC_CARRY_DIR:-$root/.device-carry}
OUT=${OUT:-/tmp/wc-ab-out}
ROUNDS=${ROUNDS:-2}
TOTAL=${TOTAL:-300}
ARGS=${ARGS:---gib=8 --tp=1 --reps=2 --first_sight_gib=0 --hot=0}
FIRST_SIGHT_ARGS=${FIRST_SIGHT_ARGS:---gib=0 --first_sight_gib=8 --reps=2 --hot=0}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$carry/lib
if ldd "$carry/bin/pinned_load_bench" | grep -q "not found"; then
  export LD_LIBRARY_PATH=$carry/lib:$carry/lib-fallback
fi
exec > >(tee "$OUT/pinned-ab.log") 2>&1
section() { printf '\n===== %s [%s s] =====\n' "$*" "$SECONDS"; }

section "SHA-256 on this host's cores (openssl speed -evp sha256, 16 KiB blocks, kB/s each)"
lscpu | grep -E '^(Model name|Thread|Core|Socket|CPU\(s\)|CPU max MHz|NUMA node0)' || true
sha() { taskset -c "$1" openssl speed -seconds 2 -evp sha256 2>/dev/null | awk '/^sha256/ {print $NF}'; }
cpus=$(nproc)
((cpus >= 12)) || echo "(fewer than 12 CPUs: the rows beside other work have less beside them)"
sib=$(cut -d, -f2 /sys/devices/system/cpu/cpu2/topology/thread_siblings_list 2>/dev/null | cut -d- -f2)
echo "cpu2's SMT siblings: $(cat /sys/devices/system/cpu/cpu2/topology/thread_siblings_list 2>/dev/null)"
two() {  # LABEL CPU CPU
  local f1 f2
  f1=$(mktemp) f2=$(mktemp)
  sha "$2" >"$f1" &
  local p1=$!
  sha "$3" >"$f2" &
  # Their pids: a bare `wait` also waits for the log's tee (a process substitution), forever.
  wait "$p1" "$!"
  echo "$1: $(cat "$f1") $(cat "$f2")"
  rm -f "$f1" "$f2"
}
a=2 b=3
((cpus >= 4)) || a=0 b=$((cpus > 1 ? 1 : 0))  # a smoke run on a small machine
echo "alone (cpu $a): $(sha "$a")"
two "two, cpus $a and $b" "$a" "$b"
[[ -n $sib && $sib != 2 ]] && two "two on one core's siblings, cpus 2 and $sib" 2 "$sib"
busy=()
for ((i = 4; i < cpus; ++i)); do taskset -c "$i" sh -c 'while :; do :; done' & busy+=($!); done
two "two, cpus $a and $b, beside ${#busy[@]} spinning shells on cpus 4-$((cpus - 1))" "$a" "$b"
stop_busy() {  # never a bare `wait`: it would wait for the log's tee too
  ((${#busy[@]} == 0)) && return
  kill "${busy[@]}" 2>/dev/null
  wait "${busy[@]}" 2>/dev/null
}
stop_busy
busy=()
for ((i = 4; i < 12 && i < cpus; ++i)); do
  taskset -c "$i" sh -c 'while :; do dd if=/dev/zero of=/dev/null bs=16M count=400 2>/dev/null; done' &
  busy+=($!)
done
two "two, cpus $a and $b, beside ${#busy[@]} dd loops writing memory on cpus 4-11" "$a" "$b"
stop_busy
pkill -f 'dd if=/dev/zero of=/dev/null' 2>/dev/null

dir=/var/tmp/wc-ab
[[ $(stat -f -c %T /var/tmp 2>/dev/null) == tmpfs ]] && dir=/root/wc-ab
mkdir -p "$dir"
echo
echo "A: this tree $(cat "$carry/commit"); B: $(cat "$carry/ab/what" 2>/dev/null || echo '?')"
rc=0
run() {  # run NAME BINARY ARGS...: one bench run, when time is left
  local name=$1 bin=$2 left=$((TOTAL - SECONDS))
  shift 2
  ((left > 40)) || { echo "no time left for $name"; return; }
  section "$name"
  timeout "$left" "$bin" --dir="$dir/$name" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  rm -rf "${dir:?}/$name"
  grep -E '^\||^\(a\)|^  (cold|hot) ' "$OUT/$name.log"
}
# shellcheck disable=SC2086
for ((r = 1; r <= ROUNDS; ++r)); do
  run "A-$r" "$carry/bin/pinned_load_bench" $ARGS
  run "B-$r" "$carry/ab/pinned_load_bench" $ARGS
  # The first sight of one file, (c) alone, this tree against $carry/old (once, after round 1).
  if ((r == 1)) && [[ -x $carry/old/pinned_load_bench ]]; then
    echo "old: $(cat "$carry/old/what" 2>/dev/null || echo '?')"
    run first-sight-old "$carry/old/pinned_load_bench" $FIRST_SIGHT_ARGS
    run first-sight-A "$carry/bin/pinned_load_bench" $FIRST_SIGHT_ARGS
  fi
done
rm -rf "$dir"
section "done (rc $rc)"
exit $rc
