#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan, and runs each from its
# checked-in corpus (tests/fuzz/corpus/<target>: seeds, and what long runs found, merged).
# Fails on the first crash, leak, sanitizer report or timeout; the input that caused it is
# left in $FUZZ_OUT (default build-asan/fuzz-artifacts) and the corpus grown by the run in
# $FUZZ_OUT/corpus/<target>.
#   bash scripts/fuzz.sh [seconds] [target...]
# Without seconds, each target runs for its own (below): where, from the checked-in corpus,
# its coverage stopped growing (docs/fuzzing.md, "How long CI fuzzes"). A long run
# (`WC_JOBS=fuzz-long bash scripts/test.sh`, 600 s each) is opt-in; fold what it finds into
# the corpus with `bash scripts/fuzz.sh --merge`.
# The build (${BUILD_DIR:-build-asan}) is the sanitizer build scripts/test.sh also uses for
# the test suite: configured here if it is not already. docs/fuzzing.md: long runs.
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A default_seconds=(
  [fuzz_safetensors_header]=20 [fuzz_safetensors_index]=20 [fuzz_spec]=20
  [fuzz_model_config]=20 [fuzz_handle_message]=10)
merge=""
if [[ ${1:-} == --merge ]]; then
  merge=1
  shift
fi
seconds=""
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
  seconds=$1
  shift
fi
build=${BUILD_DIR:-build-asan}
out=${FUZZ_OUT:-$build/fuzz-artifacts}
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(fuzz_safetensors_header fuzz_safetensors_index fuzz_spec fuzz_model_config
           fuzz_handle_message)
fi

if [[ ! -f $build/CMakeCache.txt ]] || ! grep -q "^WEIGHTCACHE_FUZZ:BOOL=ON" "$build/CMakeCache.txt"; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DWEIGHTCACHE_SANITIZE=ON \
    -DWEIGHTCACHE_FUZZ=ON -DWEIGHTCACHE_BENCH=OFF -DWEIGHTCACHE_CUDA=OFF -DWEIGHTCACHE_TORCH=OFF \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
    >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
fi
ninja -C "$build" -j "$(nproc)" "${targets[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fuzz_one() {
  local t=$1 secs=${seconds:-${default_seconds[$1]:-60}}
  mkdir -p "$out/corpus/$t" "$out/$t"
  # Inputs up to 64 KiB (headers, specs and configs are small; the limits are tested by
  # unit tests), 10 s per input at most; the checked-in corpus first, new finds into the work
  # corpus. INITED's and DONE's coverage say what the run added.
  if "$build/tests/fuzz/$t" -max_total_time="$secs" -max_len=65536 -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$out/$t/" \
      "$out/corpus/$t" "tests/fuzz/corpus/$t" >"$out/$t.log" 2>&1; then
    local cov0 cov1
    cov0=$(grep -m1 -oE "INITED cov: [0-9]+" "$out/$t.log" | awk '{print $3}')
    cov1=$(grep -m1 -oE "DONE +cov: [0-9]+" "$out/$t.log" | awk '{print $3}')
    echo "fuzz: $t: $(grep -E "^stat::number_of_executed_units" "$out/$t.log" | awk '{print $2}') runs in ${secs}s, coverage ${cov0:-?} -> ${cov1:-?}, no finding"
  else
    {
      echo "fuzz: $t: FAILED (log: $out/$t.log, input: $(find "$out/$t/" -type f -print -quit))"
      grep -E "ERROR|runtime error|invariant failed|SUMMARY" "$out/$t.log" | head -5 || true
    } >&2
    return 1
  fi
}

if [[ -n $merge ]]; then
  # Adds to the checked-in corpus the inputs of the work corpus that reach edges it lacks
  # (libFuzzer's -merge=1 keeps a minimal set; -use_counters=0: edges, not hit counts, or the
  # corpus grows five-fold), named by content: review and commit them.
  for t in "${targets[@]}"; do
    [[ -d $out/corpus/$t ]] || { echo "fuzz: no work corpus $out/corpus/$t to merge" >&2; exit 1; }
    before=$(find "tests/fuzz/corpus/$t" -type f | wc -l)
    "$build/tests/fuzz/$t" -merge=1 -use_counters=0 -max_len=65536 "tests/fuzz/corpus/$t" "$out/corpus/$t" \
      >"$out/$t.merge.log" 2>&1 || { cat "$out/$t.merge.log" >&2; exit 1; }
    echo "fuzz: $t: corpus $before -> $(find "tests/fuzz/corpus/$t" -type f | wc -l) inputs"
  done
  exit 0
fi

# One target per core at a time (each fuzzer is one process), in the order given.
parallel=${FUZZ_PARALLEL:-$(nproc)}
declare -A pids=()
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  fuzz_one "$t" &
  pids[$t]=$!
done
failed=()
for t in "${targets[@]}"; do
  wait "${pids[$t]}" || failed+=("$t")
done
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]}" >&2
  exit 1
fi
