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
};

ReadQueue::ReadQueue(const ReadOptions& options)
    : chunk_bytes_(options.chunk_bytes == 0 ? (16ull << 20) : options.chunk_bytes) {
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

absl::StatusOr<uint64_t> ReadQueue::Submit(std::vector<ReadRequest> requests) {
  auto batch = std::make_unique<Batch>();
  auto chunks = internal::SplitReads(requests, chunk_bytes_);
  if (!chunks.ok()) return chunks.status();
  batch->requests = std::move(requests);
  batch->chunks = std::move(*chunks);
  batch->pending = batch->chunks.size();
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
    if (b->status.ok()) {  // a failed batch skips the rest of its chunks
      const ReadRequest& r = b->requests[c.request];
      l.unlock();
      s = internal::PreadFull(r.fd, static_cast<uint8_t*>(r.dst) + c.offset, c.length,
                              r.offset + c.offset, r.what);
      l.lock();
    }
    if (!s.ok() && b->status.ok()) b->status = std::move(s);
    if (--b->pending == 0) done_cv_.notify_all();
  }
}

}  // namespace weightcache::safetensors
