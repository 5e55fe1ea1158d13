// Paces a digest to Pace::bytes_per_second and asks Pace::stop between pieces. Private to
// pkg/integrity. One owner thread.
#pragma once

#include <chrono>
#include <thread>

#include "absl/status/status.h"
#include "pkg/integrity/segment_digest.h"

namespace weightcache::integrity::internal {

class Pacer {
 public:
  explicit Pacer(const Pace& pace) : pace_(pace), start_(std::chrono::steady_clock::now()) {}
  // Before reading the piece that follows `done` bytes: sleeps until the average rate is
  // within the budget, then CANCELLED if the digest should stop.
  // Whether a budget applies (else pieces need not wait for each other).
  bool throttled() const { return pace_.bytes_per_second > 0; }
  absl::Status Before(uint64_t done) const {
    if (pace_.bytes_per_second > 0 && done > 0) {
      const auto due = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(done / pace_.bytes_per_second));
      std::this_thread::sleep_until(due);
    }
    if (pace_.stop && pace_.stop()) return absl::CancelledError("digest stopped");
    return absl::OkStatus();
  }

 private:
  const Pace& pace_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace weightcache::integrity::internal
