# weightcache image: weightcached (the node daemon, with the kubelet device plugin),
# weightcachectl, weightcache-keeper and weightcache-webhook, on Debian bookworm.
#
#   scripts/build-image.sh                  # compiles here, CUDA on (Debian's CUDA 11.8, sm_90)
#   scripts/build-image.sh --prebuilt build # takes build/'s binaries (built on bookworm)
#   docker build -t weightcache/weightcache:$(cat VERSION) .   # the same as the first
#
# Everything comes from Debian packages: the bases are plain bookworm images (a build argument,
# so CI imports one made with mmdebstrap under the default name and needs no registry), the
# CUDA toolchain is Debian non-free's nvidia-cuda-toolkit, and the runtime libraries are the
# Debian packages of the -dev packages the build uses (never copied .so files). CI
# (scripts/test.sh, job image) builds the runtime-from-prebuilt variant and runs it.

# The bookworm base of both stages; any bookworm image (slim, or an mmdebstrap import).
ARG BASE=debian:bookworm-slim
ARG BUILD_BASE=${BASE}
# Two final targets on one runtime stage: `runtime` (the default) compiles the binaries in the
# build stage; `runtime-prebuilt` (--target runtime-prebuilt) copies them from PREBUILT_DIR in
# the build context (four files, flat) and skips the build stage, e.g. CI's build job's, which
# compiles on bookworm with the same packages (scripts/build-image.sh --prebuilt stages them).

# ---- build -------------------------------------------------------------------------------
FROM ${BUILD_BASE} AS build
ARG DEBIAN_MIRROR=http://deb.debian.org/debian
# ON: the cuda-vmm backend, compiled with Debian's nvidia-cuda-toolkit (CUDA 11.8; its nvcc
# uses g++-11 for .cu files by itself). OFF: the host backend only (a much smaller build stage).
# The toolkit is in non-free; its hard dependency libcuda1 (never linked: the driver's libcuda
# is loaded at run time) needs contrib (glx-alternative-nvidia) too.
ARG WITH_CUDA=ON
# H100/H200 by default; CUDA 11.8 knows nothing newer than sm_90.
ARG CUDA_ARCHS=90
RUN set -eux; \
    cuda=""; \
    if [ "$WITH_CUDA" = ON ]; then \
      echo "deb $DEBIAN_MIRROR bookworm contrib non-free non-free-firmware" \
        >/etc/apt/sources.list.d/non-free.list; \
      cuda=nvidia-cuda-toolkit; \
    fi; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      g++ cmake ninja-build pkg-config \
      libabsl-dev libxxhash-dev libprotobuf-dev protobuf-compiler libgrpc++-dev \
      protobuf-compiler-grpc nlohmann-json3-dev libyaml-cpp-dev libssl-dev prometheus-cpp-dev \
      libcpp-httplib-dev libucx-dev $cuda; \
    rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# No tests or benchmarks in the image; the CUDA runtime is linked statically and libcuda is
# loaded at run time from the driver that the NVIDIA container runtime mounts.
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DWEIGHTCACHE_TESTS=OFF -DWEIGHTCACHE_BENCH=OFF -DWEIGHTCACHE_TORCH=OFF \
      -DWEIGHTCACHE_CUDA="${WITH_CUDA}" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS}" \
    && cmake --build /build --target weightcached weightcachectl weightcache-webhook \
       weightcache-keeper \
    && mkdir -p /out \
    && cp /build/cmd/weightcached/weightcached /build/cmd/weightcachectl/weightcachectl \
       /build/cmd/weightcache-webhook/weightcache-webhook \
       /build/cmd/weightcache-keeper/weightcache-keeper /out/

# ---- run ---------------------------------------------------------------------------------
FROM ${BASE} AS runtime-base
# The version, from the repository's VERSION file (scripts/build-image.sh passes it; the
# default here is checked against that file by tests/version-test.sh).
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="weightcache" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.description="Node daemon that keeps LLM weights in GPU memory"
# The runtime packages of the build's -dev packages; their dependencies bring the rest. No
# civetweb: the metrics port is served by our own HTTP server (pkg/metrics/http_server.h) and
# only prometheus-cpp's core is linked (not -pull).
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libabsl20220623 libcpp-httplib0.11 libgrpc++1.51 libprometheus-cpp-core1.0 \
      libprotobuf32 libssl3 libucx0 libyaml-cpp0.7 ca-certificates; \
    rm -rf /var/lib/apt/lists/*; \
    useradd --system --uid 65532 --no-create-home --shell /usr/sbin/nologin weightcache
# Every GPU of the node, for the daemon (it has no nvidia.com/gpu request).
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
# Non-root by default: enough for the host backend and for a socket directory the user owns.
# The Helm chart runs the container as uid 0 instead (with every capability dropped and no
# privilege escalation) because the device plugin must create its socket in the kubelet's
# root-owned /var/lib/kubelet/device-plugins and connect to the root-owned kubelet.sock, and
# the daemon creates /run/weightcache on the host. A cluster that pre-creates those paths with
# group access for this uid could run it non-root.
USER 65532
EXPOSE 9464
ENTRYPOINT ["weightcached"]
CMD ["--socket_dir=/run/weightcache", "--backend=auto", "--metrics_address=0.0.0.0:9464"]

# ---- runtime-prebuilt: binaries from the build context ----------------------------------
FROM runtime-base AS runtime-prebuilt
ARG PREBUILT_DIR=prebuilt
COPY ${PREBUILT_DIR}/weightcached ${PREBUILT_DIR}/weightcachectl \
     ${PREBUILT_DIR}/weightcache-webhook ${PREBUILT_DIR}/weightcache-keeper /usr/local/bin/
# Fail the build if a library is missing (libcuda is dlopen()ed at run time, never linked).
RUN ! ldd /usr/local/bin/weightcache* | grep 'not found' \
    && /usr/local/bin/weightcached --version

# ---- runtime (default): binaries compiled in the build stage ----------------------------
FROM runtime-base AS runtime
COPY --from=build /out/ /usr/local/bin/
# Fail the build if a library is missing (libcuda is dlopen()ed at run time, never linked).
RUN ! ldd /usr/local/bin/weightcache* | grep 'not found' \
    && /usr/local/bin/weightcached --version
