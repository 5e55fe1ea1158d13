// ReadRanges: large parallel preads, chunked and spread over a few threads.
#include <algorithm>
#include <atomic>
#include <limits>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "pkg/safetensors/internal/io.h"
#include "pkg/safetensors/safetensors.h"

namespace weightcache::safetensors {
namespace {

using Chunk = internal::ReadChunk;

// State shared by the workers of one ReadRanges call.
class ReadJob {
 public:
  ReadJob(const std::vector<ReadRequest>& requests, std::vector<Chunk> chunks,
          ProgressFn on_progress, void* progress_ctx)
      : requests_(requests),
        chunks_(std::move(chunks)),
        on_progress_(on_progress),
        progress_ctx_(progress_ctx) {}

  // Takes chunks until none are left or one has failed.
  void Work() {
    while (!failed_.load(std::memory_order_relaxed)) {
      const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= chunks_.size()) return;
      const Chunk& c = chunks_[i];
      const ReadRequest& r = requests_[c.request];
      absl::Status s = internal::PreadFull(r.fd, static_cast<uint8_t*>(r.dst) + c.offset, c.length,
                                           r.offset + c.offset, r.what);
      absl::MutexLock lock(&mu_);
      if (!s.ok()) {
        if (status_.ok()) status_ = std::move(s);
        failed_.store(true, std::memory_order_relaxed);
        return;
      }
      done_bytes_ += c.length;
      // Called under the lock: serialized, and the counts it sees only grow.
      if (on_progress_ != nullptr) on_progress_(progress_ctx_, done_bytes_);
    }
  }

  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  const std::vector<ReadRequest>& requests_;
  const std::vector<Chunk> chunks_;
  const ProgressFn on_progress_;
  void* const progress_ctx_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> failed_{false};
  absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  uint64_t done_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::Status ReadRanges(const std::vector<ReadRequest>& requests, const ReadOptions& options,
                        ProgressFn on_progress, void* progress_ctx) {
  auto split = internal::SplitReads(requests, options.chunk_bytes);
  if (!split.ok()) return split.status();
  std::vector<Chunk> chunks = std::move(*split);
  if (chunks.empty()) return absl::OkStatus();

  // The caller is one worker; at most one worker per chunk, and a sane upper bound.
  constexpr size_t kMaxThreads = 256;
  const size_t workers =
      std::clamp<size_t>(std::min<size_t>(options.threads, chunks.size()), 1, kMaxThreads);
  ReadJob job(requests, std::move(chunks), on_progress, progress_ctx);
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (size_t t = 0; t + 1 < workers; ++t) {
    try {
      threads.emplace_back([&job] { job.Work(); });
    } catch (const std::system_error&) {
      break;  // fewer threads than asked: the remaining workers take the chunks
    }
  }
  job.Work();  // the calling thread is a worker too
  for (std::thread& t : threads) t.join();
  return job.status();
}

}  // namespace weightcache::safetensors
