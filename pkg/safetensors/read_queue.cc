// ReadQueue and ReadRanges: chunked parallel preads.
#include "pkg/safetensors/read_queue.h"

#include <algorithm>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pkg/safetensors/internal/io.h"
#include "pkg/util/log.h"

namespace weightcache::safetensors {

struct ReadQueue::Batch {
  std::vector<ReadRequest> requests;
  std::vector<internal::ReadChunk> chunks;
  size_t next = 0;     // first chunk not yet started
  size_t pending = 0;  // chunks not yet finished (started or not)
  absl::Status status;
  ProgressFn on_progress = nullptr;
  void* progress_ctx = nullptr;
  uint64_t done_bytes = 0;
};

ReadQueue::ReadQueue(const ReadOptions& options)
    : chunk_bytes_(options.chunk_bytes == 0 ? (16ull << 20) : options.chunk_bytes),
      cancel_(options.cancel),
      tap_(options.tap) {
  constexpr unsigned kMaxThreads = 256;
  const unsigned n = std::clamp(options.threads, 1u, kMaxThreads);
  for (unsigned i = 0; i < n; ++i) {
    try {
      workers_.emplace_back([this] { Work(); });
    } catch (const std::system_error& e) {
      if (workers_.empty()) throw;  // not even one reader
      WC_LOG_INFO("read queue: %zu of %u threads (%s)", workers_.size(), n, e.what());
      break;
    }
  }
}

ReadQueue::~ReadQueue() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    for (Batch* b : open_) {
      b->pending -= b->chunks.size() - b->next;
      b->next = b->chunks.size();
    }
    open_.clear();
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

absl::StatusOr<uint64_t> ReadQueue::Submit(std::vector<ReadRequest> requests,
                                           ProgressFn on_progress, void* progress_ctx) {
  auto batch = std::make_unique<Batch>();
  auto chunks = internal::SplitReads(requests, chunk_bytes_);
  if (!chunks.ok()) return chunks.status();
  batch->requests = std::move(requests);
  batch->chunks = std::move(*chunks);
  batch->pending = batch->chunks.size();
  batch->on_progress = on_progress;
  batch->progress_ctx = progress_ctx;
  std::lock_guard<std::mutex> l(mu_);
  const uint64_t ticket = next_ticket_++;
  if (!batch->chunks.empty()) open_.push_back(batch.get());
  batches_.emplace(ticket, std::move(batch));
  work_cv_.notify_all();
  return ticket;
}

bool ReadQueue::Done(uint64_t ticket) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = batches_.find(ticket);
  return it == batches_.end() || it->second->pending == 0;
}

absl::Status ReadQueue::Wait(uint64_t ticket) {
  std::unique_lock<std::mutex> l(mu_);
  auto it = batches_.find(ticket);
  if (it == batches_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("read queue: no batch ", ticket));
  }
  Batch* b = it->second.get();
  done_cv_.wait(l, [b] { return b->pending == 0; });
  absl::Status status = std::move(b->status);
  batches_.erase(it);
  return status;
}

void ReadQueue::Work() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    work_cv_.wait(l, [this] { return stop_ || !open_.empty(); });
    if (stop_) return;
    Batch* b = open_.front();
    const internal::ReadChunk c = b->chunks[b->next++];
    if (b->next == b->chunks.size()) open_.pop_front();
    absl::Status s;
    if (b->status.ok() && cancel_ != nullptr && cancel_->load()) {
      s = absl::CancelledError(absl::StrCat(std::string(b->requests[c.request].what),
                                            ": read cancelled (the load was stopped)"));
    } else if (b->status.ok()) {  // a failed batch skips the rest of its chunks
      const ReadRequest& r = b->requests[c.request];
      l.unlock();
      s = internal::PreadFull(r.fd, static_cast<uint8_t*>(r.dst) + c.offset, c.length,
                              r.offset + c.offset, r.what);
      if (s.ok() && tap_ != nullptr && *tap_) {
        (*tap_)(r.fd, r.offset + c.offset, static_cast<uint8_t*>(r.dst) + c.offset, c.length);
      }
      l.lock();
    }
    if (!s.ok()) {
      if (b->status.ok()) b->status = std::move(s);  // the batch's first error
    } else if (b->status.ok()) {                     // read (not skipped), batch still good
      b->done_bytes += c.length;
      if (b->on_progress != nullptr) b->on_progress(b->progress_ctx, b->done_bytes);
    }
    if (--b->pending == 0) done_cv_.notify_all();
  }
}

absl::Status ReadRanges(const std::vector<ReadRequest>& requests, const ReadOptions& options,
                        ProgressFn on_progress, void* progress_ctx) {
  // No more workers than chunks: a small read starts no idle threads.
  const uint64_t chunk = options.chunk_bytes == 0 ? (16ull << 20) : options.chunk_bytes;
  uint64_t chunks = 0;
  for (const auto& r : requests) chunks += r.length / chunk + (r.length % chunk != 0 ? 1 : 0);
  if (chunks == 0) return absl::OkStatus();
  ReadOptions o = options;
  o.threads = static_cast<unsigned>(std::min<uint64_t>(std::max(1u, options.threads), chunks));
  ReadQueue queue(o);
  auto ticket = queue.Submit(requests, on_progress, progress_ctx);
  if (!ticket.ok()) return ticket.status();
  return queue.Wait(*ticket);
}

}  // namespace weightcache::safetensors
