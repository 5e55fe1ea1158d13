#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan, and runs each for N
# seconds (default 60) from its checked-in seed corpus. Fails on the first crash, leak,
# sanitizer report or timeout; the input that caused it is left in $FUZZ_OUT (default
# build-asan/fuzz-artifacts) and the corpus grown by the run in $FUZZ_OUT/corpus/<target>.
#   bash scripts/fuzz.sh [seconds] [target...]
# The build (${BUILD_DIR:-build-asan}) is the sanitizer build scripts/test.sh also uses for
# the test suite: configured here if it is not already. docs/fuzzing.md: long runs.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
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
# One target per core at a time (each fuzzer is one process): CI's two cores take the five
# targets in three rounds instead of five.
parallel=${FUZZ_PARALLEL:-$(nproc)}
fuzz_one() {
  local t=$1
  mkdir -p "$out/corpus/$t" "$out/$t"
  # Inputs up to 64 KiB (headers, specs and configs are small; the limits are tested by
  # unit tests), 10 s per input at most; the seeds first, new finds into the work corpus.
  if "$build/tests/fuzz/$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$out/$t/" \
      "$out/corpus/$t" "tests/fuzz/corpus/$t" >"$out/$t.log" 2>&1; then
    echo "fuzz: $t: $(grep -E "^stat::number_of_executed_units" "$out/$t.log" | awk '{print $2}') runs in ${seconds}s, no finding"
  else
    {
      echo "fuzz: $t: FAILED (log: $out/$t.log, input: $(find "$out/$t/" -type f -print -quit))"
      grep -E "ERROR|runtime error|invariant failed|SUMMARY" "$out/$t.log" | head -5 || true
    } >&2
    return 1
  fi
}
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
