// The libtorch adapter on a GPU, against a running weightcached (cuda-vmm backend). Built on
// the GPU machine against its own libtorch (tests/gpu/build-torch-test.sh); a plain program
// (no gtest there): prints "PASS <check>" / "FAIL <check>: <why>", exits 0 only when all pass.
//   wc_torch_gpu_test SOCKET MODEL DEVICE_UUID
#include <ATen/ATen.h>
#include <cuda.h>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "pkg/client/client.h"
#include "pkg/client/torch/torch_adapter.h"
#include "pkg/memory/internal/cuda_driver.h"
#include "pkg/safetensors/safetensors.h"

using namespace weightcache;
namespace mi = memory::internal;

namespace {

int failures = 0;
void Check(bool ok, const std::string& what, const std::string& why = "") {
  std::printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what.c_str(), ok || why.empty() ? "" : ": ",
              ok ? "" : why.c_str());
  if (!ok) failures++;
}

uint64_t FreeBytes(const mi::DriverApi& api, const mi::CudaDevice& dev) {
  auto ctx = mi::PrimaryContext::Retain(api, dev.device);
  auto cur = mi::ScopedCurrentContext::Push(api, ctx->get());
  size_t f = 0, t = 0;
  api.cuMemGetInfo(&f, &t);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 4) {
    std::printf("usage: wc_torch_gpu_test SOCKET MODEL DEVICE_UUID\n");
    return 2;
  }
  auto api = mi::Driver();
  if (!api.ok()) {
    std::printf("FAIL driver: %s\n", api.status().ToString().c_str());
    return 1;
  }
  auto dev = mi::FindDevice(**api, argv[3]);
  if (!dev.ok()) return 1;
  auto c = client::Client::Connect(argv[1]);
  if (!c.ok()) return 1;
  client::AcquireOptions o;
  o.model = argv[2];
  o.device_uuid = argv[3];
  o.wait_ready = true;
  auto acquired = (*c)->Acquire(o);
  if (!acquired.ok()) {
    std::printf("FAIL acquire: %s\n", acquired.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<client::Lease> lease = std::move(acquired).value();
  uint64_t model_bytes = 0;
  for (const auto& v : lease->tensors()) model_bytes += v.nbytes;

  auto t0 = std::chrono::steady_clock::now();
  auto weights = client::ToTorch(lease);
  double to_torch_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!weights.ok()) {
    std::printf("FAIL ToTorch: %s\n", weights.status().ToString().c_str());
    return 1;
  }
  std::printf("ToTorch: %zu tensors, %.1f MiB, %.3f ms (torch %s)\n", weights->size(),
              model_bytes / 1048576.0, to_torch_ms, TORCH_VERSION);

  // Right device, dtype and bytes; sum() on the GPU equals the CPU reference.
  auto ckpt = safetensors::Checkpoint::Open(lease->model_dir());
  if (!ckpt.ok()) return 1;
  bool device_ok = true, bytes_ok = true, sum_ok = true;
  std::string why;
  std::vector<char> buf;
  for (const auto& t : ckpt->tensors()) {
    auto it = weights->find(t.name);
    if (it == weights->end()) {
      bytes_ok = false;
      why = "missing " + t.name;
      continue;
    }
    const at::Tensor& g = it->second;
    if (!g.is_cuda() || g.device().index() != dev->ordinal) {
      device_ok = false;
      why = t.name + " on " + g.device().str();
    }
    buf.resize(t.nbytes);
    const auto& f = ckpt->files()[t.file_index];
    std::vector<safetensors::ReadRequest> req{
        {f.fd(), t.file_offset, t.nbytes, buf.data(), t.name}};
    if (!safetensors::ReadRanges(req, {}).ok()) return 1;
    at::Tensor cpu = at::from_blob(buf.data(), g.sizes(), g.strides(),
                                   at::TensorOptions().dtype(g.scalar_type()));
    if (!at::equal(g.cpu(), cpu)) {
      bytes_ok = false;
      why = t.name + " bytes differ";
    }
    double gs = g.to(at::kDouble).sum().item<double>();
    double cs = cpu.to(at::kDouble).sum().item<double>();
    if (std::abs(gs - cs) > 1e-9 * std::max(1.0, std::abs(cs))) {
      sum_ok = false;
      why = t.name + " sum " + std::to_string(gs) + " vs " + std::to_string(cs);
    }
  }
  Check(device_ok, "every tensor on cuda:" + std::to_string(dev->ordinal), why);
  Check(bytes_ok && weights->size() == ckpt->tensors().size(), "bytes equal the checkpoint", why);
  Check(sum_ok, "sum() on the GPU equals the CPU reference", why);

  // Lifetime: the tensors keep the mapping after the Lease handle and the daemon's entry go.
  std::string probe_name = ckpt->tensors().front().name;
  at::Tensor probe = weights->at(probe_name);
  double probe_sum = probe.to(at::kDouble).sum().item<double>();
  lease.reset();
  auto evicted = (*c)->Evict(argv[2], "");
  Check(evicted.ok() && *evicted == 1, "daemon evicts while tensors are alive",
        evicted.ok() ? "" : evicted.status().ToString());
  double after = probe.to(at::kDouble).sum().item<double>();
  Check(after == probe_sum, "tensors still read the weights after Lease and eviction are gone");
  uint64_t held = FreeBytes(**api, *dev);
  weights->clear();
  probe = at::Tensor();
  // The last tensor's death closes the lease's handle connection; the daemon then drops the
  // reference it keeps on a draining entry to go on scrubbing it (issue 48), so the memory
  // returns once the daemon has seen the close: a few ms, polled here up to 10 s.
  uint64_t released = FreeBytes(**api, *dev);
  for (int i = 0; i < 1000 && released < held + model_bytes * 9 / 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    released = FreeBytes(**api, *dev);
  }
  Check(released >= held + model_bytes * 9 / 10, "GPU memory returns when the last tensor dies",
        "free " + std::to_string(held >> 20) + " -> " + std::to_string(released >> 20) +
            " MiB, model " + std::to_string(model_bytes >> 20) + " MiB");
  std::printf("free MiB with tensors %llu, after the last tensor %llu\n",
              static_cast<unsigned long long>(held >> 20),
              static_cast<unsigned long long>(released >> 20));
  std::printf("%s\n", failures == 0 ? "torch gpu test: PASS" : "torch gpu test: FAIL");
  return failures == 0 ? 0 : 1;
}
