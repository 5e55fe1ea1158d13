#!/usr/bin/env bash
# Installs, builds and runs the whole test suite; CI runs exactly this (.ci/run). Every C++
# translation unit is compiled once per compiler that needs it, and every test runs once.
# Jobs, each timed (a table at the end, also when a job fails):
#   format     clang-format over the tree; pkg/server's layering (scripts/check-layering.sh)
#   build      g++ build (CUDA when nvcc is found) of the production code, the benches and
#              what a sanitizer build cannot run: GPU tests (they skip without a GPU, each
#              reason shown), the Python and Helm suites, the benches' smokes
#              (-DWEIGHTCACHE_CPU_TESTS=OFF); a configure with tests off (the Dockerfile's)
#   sanitize   clang build with ASan+UBSan (any UB is fatal), -Wthread-safety as an error and
#              the libFuzzer targets; every CPU suite (labels unit, integration) runs here,
#              and only here; then each fuzz target from its seed corpus for the seconds
#              scripts/fuzz.sh gives it (where its coverage stopped growing)
#   tidy       clang-tidy over every production source (scripts/check-tidy.sh), each once
#   image      the image from the Dockerfile with build/'s binaries (no compile), on a Debian
#              rootfs made by mmdebstrap, with podman, storage in a temp dir; in containers from
#              it: weightcached --help, the demo's flow with a keeper, the webhook over TLS
#              (tests/image/image-test.sh). Needs the build job's build/.
#   tsan       ThreadSanitizer build of the tests whose threads sync through std primitives
#              only (registry, handle channel, read queue, staging pool, peer port, webhook
#              front), run
# WC_JOBS="format build" runs a subset; WC_JOBS=fuzz-long (not in the default set) fuzzes each
# target FUZZ_SECONDS (default 600) s. Sanitizer builds leave out CUDA, torch and benches.
#   bash scripts/test.sh --quick   the developer's inner loop: the g++ build with every test
#                                  (build/), then ctest; no install, no other job
# docs/benchmarks.md, "CI time": where the minutes go.
set -euo pipefail
cd "$(dirname "$0")/.."

# -O1 and line tables only: what the sanitizers' reports need, and much less compile time
# on CI's two cores than -O2 -g.
sanitizer_cmake=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang
                 -DCMAKE_CXX_COMPILER=clang++ -DWEIGHTCACHE_BENCH=OFF -DWEIGHTCACHE_CUDA=OFF
                 -DWEIGHTCACHE_TORCH=OFF "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only"
                 "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only")
# Tests that involve only std threading (Debian's abseil and gRPC are not built with TSan:
# state handed over through them looks racy to it). The daemon, the client and the device
# plugin tests are left out for that reason.
tsan_tests=(cache_test handle_channel_test safetensors_test staging_pool_test peer_port_test
            webhook_front_test net_test pod_volumes_test following_hash_test identity_test
            pinned_test)
# Asserts how many finished load threads are still exiting: a timing bound that TSan's
# slowdown breaks (no race report); it runs in the sanitize job.
tsan_skip="Registry.FinishedLoadThreadsAreJoinedNotKept"

if [[ ${1:-} == --quick ]]; then
  # Every test in one g++ build; the same objects as the build job's (only the test set
  # differs), so switching between the two recompiles nothing.
  start=$SECONDS
  bash scripts/build.sh -DWEIGHTCACHE_CPU_TESTS=ON
  (cd build && ctest --output-on-failure -j "$(nproc)")
  bash scripts/ctest-skips.sh build quick
  echo "test.sh --quick: $((SECONDS - start)) s"
  exit 0
fi
jobs=${WC_JOBS:-format build sanitize tidy image tsan}

timings=()
current=""
report() {
  [[ -n $current ]] &&
    timings+=("$(printf '%-9s %5d  FAILED' "$current" $((SECONDS - current_start)))")
  ((${#timings[@]})) || return 0
  echo "job times (s):"
  printf '  %s\n' "${timings[@]}"
}
trap report EXIT
# A job is its function run under `set -e`: the first failing command ends the script, and the
# table (report) names the job that failed.
run_job() {
  local name=$1
  shift
  [[ " $jobs " == *" $name "* ]] || return 0
  current=$name
  current_start=$SECONDS
  echo "=== job $name"
  "$@"
  current=""
  timings+=("$(printf '%-9s %5d' "$name" $((SECONDS - current_start)))")
  echo "=== job $name: $((SECONDS - current_start)) s"
}

job_install() { bash scripts/install-deps.sh --test; }

job_format() { bash scripts/check-format.sh && bash scripts/check-layering.sh; }

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
  bash scripts/build.sh -DWEIGHTCACHE_CPU_TESTS=OFF
  check_configure_without_tests
  # Runs what this build has (GPU, Python, Helm, the benches' smokes); every test that skipped
  # (GPU tests without a GPU) is then listed with its reason.
  (cd build && ctest --output-on-failure -j "$(nproc)")
  bash scripts/ctest-skips.sh build build
}

job_sanitize() {
  cmake -S . -B build-asan "${sanitizer_cmake[@]}" -DWEIGHTCACHE_SANITIZE=ON -DWEIGHTCACHE_FUZZ=ON \
    >build-asan.configure.log 2>&1 || { cat build-asan.configure.log; exit 1; }
  ninja -C build-asan -j "$(nproc)"
  (cd build-asan &&
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ctest --output-on-failure -j "$(nproc)" -LE "gpu|helm|python")
  bash scripts/ctest-skips.sh build-asan sanitize
  BUILD_DIR=build-asan bash scripts/fuzz.sh
}

job_fuzz_long() { BUILD_DIR=build-asan bash scripts/fuzz.sh "${FUZZ_SECONDS:-600}"; }

# Production sources with build/'s compile commands (CUDA), the CUDA-less stand-ins with
# build-asan's.
# Each file's seconds, slowest first, stay in build/tidy-times.txt.
job_tidy() { WC_TIDY_TIMES=build/tidy-times.txt bash scripts/check-tidy.sh build build-asan; }

job_image() { bash tests/image/image-test.sh build; }

job_tsan() {
  cmake -S . -B build-tsan "${sanitizer_cmake[@]}" -DWEIGHTCACHE_TSAN=ON \
    >build-tsan.configure.log 2>&1 || { cat build-tsan.configure.log; exit 1; }
  ninja -C build-tsan -j "$(nproc)" "${tsan_tests[@]}"
  local pattern
  pattern="^($(IFS='|'; echo "${tsan_tests[*]}"))\\."
  (cd build-tsan &&
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
      ctest --output-on-failure -j "$(nproc)" -R "$pattern" -E "$tsan_skip")
  bash scripts/ctest-skips.sh build-tsan tsan
}

total_start=$SECONDS
jobs="install $jobs"
run_job install job_install
run_job format job_format
run_job build job_build
run_job sanitize job_sanitize
run_job fuzz-long job_fuzz_long
run_job tidy job_tidy
run_job image job_image
run_job tsan job_tsan
timings+=("$(printf '%-9s %5d' total $((SECONDS - total_start)))")
