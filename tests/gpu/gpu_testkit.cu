#include <cuda_runtime.h>

#include "tests/gpu/gpu_testkit.h"

namespace weightcache::gputest {
namespace {

__global__ void WriteBytes(unsigned char* p, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = 0xFF;
  }
}

// sum over bytes of byte * (i % 251 + 1), i the byte's index; integer atomics: deterministic.
__global__ void WeightedSum(const unsigned char* p, size_t n, unsigned long long* out) {
  unsigned long long acc = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    acc += static_cast<unsigned long long>(p[i]) * (i % 251 + 1);
  }
  atomicAdd(out, acc);
}

// WeightedSum after spinning `cycles` SM clocks: its reads come well after the launch.
__global__ void DelayedWeightedSum(const unsigned char* p, size_t n, long long cycles,
                                   unsigned long long* out) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  unsigned long long acc = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    acc += static_cast<unsigned long long>(p[i]) * (i % 251 + 1);
  }
  atomicAdd(out, acc);
}

std::string Name(cudaError_t e) { return e == cudaSuccess ? "" : cudaGetErrorName(e); }

}  // namespace

std::string KernelWrite(void* p, size_t n, int ordinal) {
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) return Name(e);
  WriteBytes<<<64, 256>>>(static_cast<unsigned char*>(p), n);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return Name(e);
  return Name(cudaDeviceSynchronize());
}

std::string CopyToHost(void* dst, const void* src, size_t n, int ordinal) {
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) return Name(e);
  return Name(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
}

std::string PinnedAlloc(void** p, size_t n) {
  return Name(cudaHostAlloc(p, n, cudaHostAllocDefault));
}

void PinnedFree(void* p) { cudaFreeHost(p); }

std::string DeviceChecksum(const void* p, size_t n, int ordinal, uint64_t* sum) {
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) return Name(e);
  unsigned long long* d = nullptr;
  if (cudaError_t e = cudaMalloc(&d, sizeof *d); e != cudaSuccess) return Name(e);
  cudaMemset(d, 0, sizeof *d);
  WeightedSum<<<264, 256>>>(static_cast<const unsigned char*>(p), n, d);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  unsigned long long h = 0;
  if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
  cudaFree(d);
  *sum = h;
  return Name(e);
}

std::string StartDelayedChecksum(const void* p, size_t n, int ordinal, double delay_ms,
                                 unsigned long long** result) {
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) return Name(e);
  int khz = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, ordinal);
      e != cudaSuccess) {
    return Name(e);
  }
  if (cudaError_t e = cudaMalloc(result, sizeof **result); e != cudaSuccess) return Name(e);
  if (cudaError_t e = cudaMemset(*result, 0, sizeof **result); e != cudaSuccess) return Name(e);
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return Name(e);
  DelayedWeightedSum<<<264, 256>>>(static_cast<const unsigned char*>(p), n,
                                   static_cast<long long>(delay_ms * khz), *result);
  return Name(cudaGetLastError());
}

std::string FinishChecksum(int ordinal, unsigned long long* result, uint64_t* sum) {
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) return Name(e);
  cudaError_t e = cudaDeviceSynchronize();
  unsigned long long h = 0;
  if (e == cudaSuccess) e = cudaMemcpy(&h, result, sizeof h, cudaMemcpyDeviceToHost);
  cudaFree(result);
  *sum = h;
  return Name(e);
}

std::string MemInfo(int ordinal, uint64_t* free_bytes, uint64_t* total_bytes) {
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) return Name(e);
  size_t f = 0, t = 0;
  cudaError_t e = cudaMemGetInfo(&f, &t);
  *free_bytes = f;
  *total_bytes = t;
  return Name(e);
}

}  // namespace weightcache::gputest
