// Loads a planned model-rank into segments of a memory backend: parallel preads straight
// into host-addressable segments (host backend); for cuda-vmm segments, through a ring of
// pinned staging buffers whose asynchronous host->device copies overlap the next reads;
// for any other backend, through a bounded staging buffer and CopyIn.
// Segments are sealed before Load returns. Progress is published through LoadProgress,
// which other threads may read at any time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/load/plan.h"
#include "pkg/memory/backend.h"

namespace weightcache::load {

class LoadProgress {
 public:
  void SetTotal(uint64_t total) { total_.store(total); }
  void Add(uint64_t bytes) { done_.fetch_add(bytes); }
  void SetDone(uint64_t bytes) { done_.store(bytes); }
  void SetFile(const std::string& f) {
    std::lock_guard<std::mutex> l(mu_);
    file_ = f;
  }
  uint64_t done() const { return done_.load(); }
  uint64_t total() const { return total_.load(); }
  std::string file() const {
    std::lock_guard<std::mutex> l(mu_);
    return file_;
  }

 private:
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> total_{0};
  mutable std::mutex mu_;
  std::string file_ ABSL_GUARDED_BY(mu_);
};

struct LoadedModel {
  Plan plan;
  std::vector<std::unique_ptr<memory::Segment>> segments;  // sealed
  std::string device_uuid;
  std::string model_dir;  // the checkpoint it came from
  uint64_t resident_bytes() const;
};

struct LoadOptions {
  unsigned read_threads = 8;
  uint64_t chunk_bytes = 16ull << 20;
  // For backends without host_data(): bytes of staging in all, split into staging_buffers
  // pinned buffers on the GPU path (each no larger than the model needs).
  uint64_t staging_bytes = 256ull << 20;
  unsigned staging_buffers = 4;
};

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadRank(const OpenedModel& model, Plan plan,
                                                      memory::Backend& backend,
                                                      const std::string& device_uuid,
                                                      const std::string& label,
                                                      const LoadOptions& options,
                                                      LoadProgress* progress);

}  // namespace weightcache::load
