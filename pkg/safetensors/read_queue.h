// ReadQueue: parallel preads for a stream of batches, with workers that outlive a batch.
// ReadRanges (safetensors.h) is one batch on a queue of its own.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/safetensors/safetensors.h"

namespace weightcache::safetensors {

// Parallel preads for a stream of batches (a loader's staging buffers): `threads` workers
// live as long as the queue and take the chunks of submitted batches in submission order,
// so the reads of the next batch start while the last chunks of the one before finish --
// no barrier and no thread start-up per batch, as ReadRanges has.
// Submit and Wait are called from one thread (the owner); the workers are internal.
class ReadQueue {
 public:
  explicit ReadQueue(const ReadOptions& options);
  // Drops the chunks not yet started and waits for the ones being read: no worker touches
  // a destination after the destructor returns.
  ~ReadQueue();
  ReadQueue(const ReadQueue&) = delete;
  ReadQueue& operator=(const ReadQueue&) = delete;

  // Validates and queues a batch; answers its ticket. Its descriptors and destinations (and
  // the strings `what` views) must stay valid until Wait(ticket) returns. `on_progress`
  // (may be null) is called after each chunk of the batch with the batch's bytes read so
  // far, from a worker, under the queue's lock (serialized, growing; it must not call the
  // queue).
  absl::StatusOr<uint64_t> Submit(std::vector<ReadRequest> requests,
                                  ProgressFn on_progress = nullptr, void* progress_ctx = nullptr);
  // Whether every chunk of the batch has been read (or failed); does not block.
  bool Done(uint64_t ticket) const;
  // Blocks until the batch is done; its first error, naming the request's `what`. A
  // failed batch skips its chunks not yet started. Each ticket is waited for once.
  absl::Status Wait(uint64_t ticket);

 private:
  struct Batch;
  void Work();

  const uint64_t chunk_bytes_;
  const std::atomic<bool>* const cancel_;  // ReadOptions::cancel
  const ReadTap* const tap_;               // ReadOptions::tap
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::map<uint64_t, std::unique_ptr<Batch>> batches_;  // submitted, not yet waited for
  std::deque<Batch*> open_;  // batches with chunks not yet started, oldest first
  uint64_t next_ticket_ = 1;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace weightcache::safetensors
