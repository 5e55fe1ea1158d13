// EngineGpu on a CUDA build: the driver API fetched at run time (pkg/memory/internal).
#include <chrono>

#include "bench/engine.h"
#include "pkg/memory/internal/cuda_driver.h"

namespace weightcache::bench {

struct EngineGpu::Context {
  memory::internal::PrimaryContext primary;
};

EngineGpu::~EngineGpu() = default;

absl::StatusOr<std::unique_ptr<EngineGpu>> EngineGpu::Open() {
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  auto t0 = Clock::now();
  auto api = memory::internal::Driver();
  auto t1 = Clock::now();
  if (!api.ok()) return api.status();
  auto devices = memory::internal::ListDevices(**api);
  if (!devices.ok()) return devices.status();
  if (devices->empty()) return absl::FailedPreconditionError("no CUDA device is visible");
  const auto& dev = devices->front();
  auto t2 = Clock::now();
  auto ctx = memory::internal::PrimaryContext::Retain(**api, dev.device);
  auto t3 = Clock::now();
  if (!ctx.ok()) return ctx.status();
  std::unique_ptr<EngineGpu> e(new EngineGpu());
  e->uuid_ = dev.uuid;
  e->name_ = dev.name;
  e->driver_ms_ = ms(t0, t1);
  e->enumerate_ms_ = ms(t1, t2);
  e->context_ms_ = ms(t2, t3);
  e->context_ = std::make_unique<Context>(Context{std::move(*ctx)});
  return e;
}

}  // namespace weightcache::bench
