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

}  // namespace weightcache::gputest
