#!/usr/bin/env bash
# Installs what weightcache needs to build and test on Debian bookworm, as root.
# Idempotent: packages already present are kept. CUDA (nvcc at /usr/local/cuda) is optional:
# the build detects it; without it the host backend is the only one.
#   --test   also what the test suite needs: Helm 3 and 4 (from npm), promtool/prometheus,
#            clang-format and clang-tidy, and clang with its sanitizer and libFuzzer runtimes
#            (the ASan/UBSan/TSan, thread-safety and fuzzing jobs; llvm: the symbolizer),
#            mmdebstrap, podman and runc (the image job), UCX (the peer-fill transport bench)
set -euo pipefail

packages=(cmake ninja-build g++ pkg-config
          libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
          libabsl-dev libxxhash-dev libgtest-dev libgmock-dev nlohmann-json3-dev libyaml-cpp-dev libssl-dev
          prometheus-cpp-dev libcpp-httplib-dev libucx-dev)
if [[ "${1:-}" == "--test" ]]; then
  # openssl, curl, python3-jsonpatch: tests/kube/webhook-test.sh (certificates, HTTPS, an
  # independent RFC 6902 implementation to apply the webhook's patches).
  packages+=(prometheus unzip curl openssl python3-jsonpatch clang-format clang-tidy clang libclang-rt-14-dev llvm)
  # The Python package's tests, for /usr/bin/python3 (python/run-tests.sh): a venv with
  # --system-site-packages sees Debian's torch 1.13, numpy, pytest and grpcio (the last
  # proves libweightcache.so lives beside grpcio's own gRPC in one process).
  packages+=(python3-venv python3-pip python3-setuptools python3-wheel python3-torch
             python3-numpy python3-pytest python3-grpcio)
  # bench/plot_benchmarks.py (the plots of docs/benchmarks.md) and its test.
  packages+=(python3-matplotlib)
  # ucx-utils: ucx_info and ucx_perftest, to compare with bench/ucx_transfer_bench (issue 30's
  # peer-fill transport; libucx-dev itself is a build dependency above).
  packages+=(ucx-utils)
  # iproute2: peer fill's test across network namespaces joined by veth pairs (ip, tc).
  packages+=(iproute2)
  # The image job (tests/image/image-test.sh): a bookworm rootfs from the Debian mirror, podman
  # to build and run the image (runc: crun cannot run on hybrid cgroup v1/v2 hosts).
  packages+=(mmdebstrap podman runc)
  command -v npm >/dev/null || packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null
fi

if [[ "${1:-}" == "--test" ]]; then
  bash "$(dirname "$0")/install-helm.sh"
fi
