#!/usr/bin/env bash
# Installs, builds and runs the whole test suite; CI runs exactly this (.ci/run). Jobs, each
# timed (a table at the end, also when a job fails):
#   format     clang-format over the tree
#   build      g++ build (CUDA when nvcc is found), a configure with tests off (the
#              Dockerfile's), clang-tidy, the test suite
#   sanitize   clang build with ASan+UBSan (any UB is fatal), -Wthread-safety as an error and
#              the libFuzzer targets; the CPU test suite under it (not the helm and python
#              suites: no C++ of ours runs in helm, and an uninstrumented python3 cannot load
#              an ASan libweightcache.so); each fuzz target
#              FUZZ_SECONDS (default 60) s from its seed corpus (scripts/fuzz.sh)
#   image      the image from the Dockerfile with build/'s binaries (no compile), on a Debian
#              rootfs made by mmdebstrap, with podman, storage in a temp dir; in containers from
#              it: weightcached --help, the demo's flow with a keeper, the webhook over TLS
#              (tests/image/image-test.sh). Needs the build job's build/.
#   tsan       ThreadSanitizer build of the tests whose threads sync through std primitives
#              only (registry, handle channel, read queue, staging pool), run
# WC_JOBS="format build" runs a subset. Sanitizer builds leave out CUDA, torch and benches.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${WC_JOBS:-format build image sanitize tsan}
fuzz_seconds=${FUZZ_SECONDS:-60}
# -O1 and line tables only: what the sanitizers' reports need, and much less compile time
# on CI's two cores than -O2 -g.
sanitizer_cmake=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang
                 -DCMAKE_CXX_COMPILER=clang++ -DWEIGHTCACHE_BENCH=OFF -DWEIGHTCACHE_CUDA=OFF
                 -DWEIGHTCACHE_TORCH=OFF "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only"
                 "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only")
# Tests that involve only std threading (Debian's abseil and gRPC are not built with TSan:
# state handed over through them looks racy to it). The daemon, the client and the device
# plugin tests are left out for that reason.
tsan_tests=(cache_test handle_channel_test safetensors_test staging_pool_test)
# Asserts how many finished load threads are still exiting: a timing bound that TSan's
# slowdown breaks (no race report); it runs in the other jobs.
tsan_skip="Registry.FinishedLoadThreadsAreJoinedNotKept"

timings=()
report() {
  ((${#timings[@]})) || return 0
  echo "job times (s):"
  printf '  %s\n' "${timings[@]}"
}
trap report EXIT
run_job() {
  local name=$1
  shift
  [[ " $jobs " == *" $name "* ]] || return 0
  local start=$SECONDS
  echo "=== job $name"
  "$@"
  timings+=("$(printf '%-9s %5d' "$name" $((SECONDS - start)))")
  echo "=== job $name: $((SECONDS - start)) s"
}

job_format() { bash scripts/check-format.sh; }

# The Dockerfile builds with -DWEIGHTCACHE_TESTS=OFF: that configuration must at least
# configure (a test's property set outside weightcache_test broke it unnoticed).
check_configure_without_tests() {
  local dir
  dir=$(mktemp -d)
  if ! cmake -S . -B "$dir" -G Ninja -DWEIGHTCACHE_TESTS=OFF >"$dir.log" 2>&1; then
    cat "$dir.log"
    rm -rf "$dir" "$dir.log"
    echo "cmake -DWEIGHTCACHE_TESTS=OFF (the Dockerfile's configuration) failed" >&2
    return 1
  fi
  rm -rf "$dir" "$dir.log"
  echo "configure with WEIGHTCACHE_TESTS=OFF: ok"
}

job_build() {
  # Line tables only (-g1), not full debug info: symbolized backtraces are all CI needs, and
  # full -g costs 20-30% more compile time per file (daemon.cc 11.8 s -> 9.0 s with g++ 12)
  # and objects five times the size for every link. docs/benchmarks.md, "CI time".
  bash scripts/build.sh "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
  check_configure_without_tests
  bash scripts/check-tidy.sh build
  # GPU tests skip without a GPU: show each one's reason, then run the whole suite, whose
  # summary closes the output.
  (cd build &&
    { ctest -L gpu -V 2>&1 | grep -A1 -E "^[0-9]+: .*: Skipped$" | grep -vE "Skipped$|^--$" \
        | sed 's/^[0-9]*: /gpu tests skipped: /' | sort -u || true; } &&
    ctest --output-on-failure -j "$(nproc)")
}

job_image() { bash tests/image/image-test.sh build; }

job_sanitize() {
  cmake -S . -B build-asan "${sanitizer_cmake[@]}" -DWEIGHTCACHE_SANITIZE=ON -DWEIGHTCACHE_FUZZ=ON \
    >build-asan.configure.log 2>&1 || { cat build-asan.configure.log; exit 1; }
  ninja -C build-asan -j "$(nproc)"
  (cd build-asan &&
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ctest --output-on-failure -j "$(nproc)" -LE "gpu|helm|python")
  BUILD_DIR=build-asan bash scripts/fuzz.sh "$fuzz_seconds"
}

job_tsan() {
  cmake -S . -B build-tsan "${sanitizer_cmake[@]}" -DWEIGHTCACHE_TSAN=ON \
    >build-tsan.configure.log 2>&1 || { cat build-tsan.configure.log; exit 1; }
  ninja -C build-tsan -j "$(nproc)" "${tsan_tests[@]}"
  local pattern
  pattern="^($(IFS='|'; echo "${tsan_tests[*]}"))\\."
  (cd build-tsan &&
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
      ctest --output-on-failure -j "$(nproc)" -R "$pattern" -E "$tsan_skip")
}

bash scripts/install-deps.sh --test
run_job format job_format
run_job build job_build
run_job image job_image
run_job sanitize job_sanitize
run_job tsan job_tsan
