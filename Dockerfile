# weightcache image: weightcached (the node daemon, with the kubelet device plugin),
# weightcachectl, weightcache-keeper and weightcache-webhook. Multi-stage: build in the CUDA
# devel image, run in the CUDA base image with only the binaries and the libraries they load.
#
#   docker build -t weightcache/weightcache:0.1.0 .
#
# Not built in this project's CI (its machines have no container engine); keep it in step with
# the build steps in docs/ (same Debian/Ubuntu -dev packages, same CMake options).

ARG CUDA_VERSION=13.0.1
ARG UBUNTU=ubuntu24.04

# ---- build -------------------------------------------------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
# H100/H200 by default; e.g. --build-arg CUDA_ARCHS="80;90" for A100 too.
ARG CUDA_ARCHS=90
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config \
      libabsl-dev libxxhash-dev libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc \
      nlohmann-json3-dev libyaml-cpp-dev libssl-dev prometheus-cpp-dev libcpp-httplib-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# No tests or benchmarks in the image; the CUDA runtime is linked statically and libcuda is
# loaded at run time from the driver that the NVIDIA container runtime mounts.
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DWEIGHTCACHE_TESTS=OFF -DWEIGHTCACHE_BENCH=OFF -DWEIGHTCACHE_TORCH=OFF \
      -DWEIGHTCACHE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS}" \
    && cmake --build /build --target weightcached weightcachectl weightcache-webhook \
       weightcache-keeper
# Gather the binaries and every shared library they need except glibc's own (the base image
# has the same glibc) and libcuda (the driver's, never shipped in an image).
RUN mkdir -p /out/bin /out/lib \
    && cp /build/cmd/weightcached/weightcached /build/cmd/weightcachectl/weightcachectl \
       /build/cmd/weightcache-webhook/weightcache-webhook \
       /build/cmd/weightcache-keeper/weightcache-keeper /out/bin/ \
    && ldd /out/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u \
       | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda)\.so' \
       | xargs -r cp -L -t /out/lib/

# ---- run ---------------------------------------------------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-base-${UBUNTU}
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/lib/ /opt/weightcache/lib/
# Fail the build if any library is still missing.
RUN echo /opt/weightcache/lib > /etc/ld.so.conf.d/weightcache.conf && ldconfig \
    && ! ldd /usr/local/bin/* | grep 'not found' \
    && useradd --system --uid 65532 --no-create-home --shell /usr/sbin/nologin weightcache
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
