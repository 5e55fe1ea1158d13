// The loader's GPU path: a ring of pinned staging buffers between parallel preads and
// asynchronous host->device copies (see internal/cuda_load.h).
//
//   buffer k:  wait event[k] (its previous copies landed) -> submit its preads to the read
//              queue (long-lived workers) -> k+1 ...; oldest buffer whose reads are done ->
//              queue cuMemcpyHtoDAsync of every piece on the stream -> record its event
//
// so the reads into the next buffers overlap each other's tails and the copies out of the
// earlier ones. The buffers come from a StagingPool (pinned once, kept by the daemon). The
// driver API is used directly (entry points fetched at run time, like the rest of the
// cuda-vmm backend).
#include "pkg/load/internal/cuda_load.h"

#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/load/internal/fp8_quant_cuda.h"
#include "pkg/load/staging_pool.h"
#include "pkg/memory/internal/cuda_driver.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/safetensors/read_queue.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::load::internal {
namespace {

using memory::internal::CudaDevice;
using memory::internal::CudaSegment;
using memory::internal::CuStatus;
using memory::internal::DriverApi;
using memory::internal::PrimaryContext;
using memory::internal::ScopedCurrentContext;

// Portable page-locked memory for a StagingPool, allocated in the asking device's primary
// context (retained until the allocator ends, so frees have a context too).
class PinnedAllocator : public StagingPool::Allocator {
 public:
  absl::StatusOr<void*> Allocate(int ordinal, uint64_t bytes) override {
    WC_ASSIGN_OR_RETURN(const DriverApi* api, memory::internal::Driver());
    CUcontext ctx = nullptr;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = contexts_.find(ordinal);
      if (it == contexts_.end()) {
        CUdevice dev = 0;
        WC_RETURN_IF_ERROR(CuStatus(*api, api->cuDeviceGet(&dev, ordinal), "cuDeviceGet",
                                    absl::StrCat("device ", ordinal)));
        WC_ASSIGN_OR_RETURN(auto pc, PrimaryContext::Retain(*api, dev));
        it = contexts_.emplace(ordinal, std::move(pc)).first;
      }
      ctx = it->second.get();
      if (free_ctx_ == nullptr) free_ctx_ = ctx;
    }
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api, ctx));
    void* p = nullptr;
    WC_RETURN_IF_ERROR(CuStatus(*api, api->cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE),
                                "cuMemHostAlloc", absl::StrCat(bytes, " bytes of staging")));
    return p;
  }
  void Free(void* p, uint64_t) override {
    auto api = memory::internal::Driver();
    if (!api.ok()) return;
    CUcontext ctx = nullptr;
    {
      std::lock_guard<std::mutex> l(mu_);
      ctx = free_ctx_;
    }
    auto current = ScopedCurrentContext::Push(**api, ctx);
    if (CUresult r = (*api)->cuMemFreeHost(p); r != CUDA_SUCCESS) {
      WC_LOG_ERROR("staging: cuMemFreeHost: %s", memory::internal::CuErrorName(**api, r));
    }
  }

 private:
  std::mutex mu_;
  std::map<int, PrimaryContext> contexts_;
  CUcontext free_ctx_ = nullptr;  // any retained context (the memory is portable); mu_
};

// Pinned buffers (leased from a StagingPool), their events and one stream, in one device's
// primary context. The destructor waits for every queued copy before the buffers go back.
class StagingRing {
 public:
  static absl::StatusOr<std::unique_ptr<StagingRing>> Create(const DriverApi& api,
                                                             const CudaDevice& dev,
                                                             StagingPool& pool, size_t buffers,
                                                             uint64_t bytes) {
    WC_ASSIGN_OR_RETURN(auto ctx, PrimaryContext::Retain(api, dev.device));
    auto ring = std::unique_ptr<StagingRing>(new StagingRing(api, std::move(ctx), bytes));
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(api, ring->ctx_.get()));
    WC_RETURN_IF_ERROR(CuStatus(api, api.cuStreamCreate(&ring->stream_, CU_STREAM_NON_BLOCKING),
                                "cuStreamCreate", dev.uuid));
    WC_ASSIGN_OR_RETURN(ring->lease_, pool.Take(dev.ordinal, buffers, bytes));
    for (size_t i = 0; i < buffers; ++i) {
      CUevent e = nullptr;
      WC_RETURN_IF_ERROR(
          CuStatus(api, api.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate", dev.uuid));
      ring->events_.push_back(e);
      ring->recorded_.push_back(false);
    }
    return ring;
  }

  ~StagingRing() {
    auto current = ScopedCurrentContext::Push(*api_, ctx_.get());
    if (stream_ != nullptr) {
      // Copies may still read the buffers (an error path): wait before giving them back.
      if (CUresult r = api_->cuStreamSynchronize(stream_); r != CUDA_SUCCESS) {
        WC_LOG_ERROR("staging: cuStreamSynchronize: %s", memory::internal::CuErrorName(*api_, r));
      }
    }
    for (CUevent e : events_) api_->cuEventDestroy(e);
    if (stream_ != nullptr) api_->cuStreamDestroy(stream_);
  }
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  size_t count() const { return lease_.buffers().size(); }
  uint64_t bytes() const { return bytes_; }
  uint8_t* buffer(size_t i) const { return lease_.buffers()[i].data; }
  uint32_t reused() const { return lease_.reused(); }
  CUstream stream() const { return stream_; }

  // Blocks until the copies last queued from buffer i have landed.
  absl::Status WaitFree(size_t i) {
    if (!recorded_[i]) return absl::OkStatus();
    recorded_[i] = false;
    return CuStatus(*api_, api_->cuEventSynchronize(events_[i]), "cuEventSynchronize",
                    "staging buffer");
  }
  // Marks the copies queued so far from buffer i.
  absl::Status Record(size_t i) {
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api_, ctx_.get()));
    WC_RETURN_IF_ERROR(
        CuStatus(*api_, api_->cuEventRecord(events_[i], stream_), "cuEventRecord", "staging"));
    recorded_[i] = true;
    return absl::OkStatus();
  }
  absl::Status Drain() {
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api_, ctx_.get()));
    return CuStatus(*api_, api_->cuStreamSynchronize(stream_), "cuStreamSynchronize",
                    "staging copies");
  }

 private:
  StagingRing(const DriverApi& api, PrimaryContext ctx, uint64_t bytes)
      : api_(&api), ctx_(std::move(ctx)), bytes_(bytes) {}
  const DriverApi* api_;
  PrimaryContext ctx_;
  uint64_t bytes_;
  CUstream stream_ = nullptr;
  StagingPool::Lease lease_;  // goes back after the destructor has waited for the copies
  std::vector<CUevent> events_;
  std::vector<bool> recorded_;
};

// O_DIRECT alignment of file offsets, lengths and buffer addresses (the logical block size
// of common devices is 512 or 4096 bytes).
constexpr uint64_t kAlign = 4096;

// A piece of one range that fits in the current buffer.
struct Piece {
  CudaSegment* segment;  // null: into the quantization scratch
  uint64_t segment_offset;
  uint64_t n;
  uint64_t at;            // in the buffer
  int32_t finishes = -1;  // the quantization job whose last source byte this piece copies
};

}  // namespace

}  // namespace weightcache::load::internal

namespace weightcache::load {

std::unique_ptr<StagingPool> MakePinnedStagingPool(uint64_t max_idle_bytes) {
  return std::make_unique<StagingPool>(std::make_unique<internal::PinnedAllocator>(),
                                       max_idle_bytes);
}

}  // namespace weightcache::load

namespace weightcache::load::internal {

absl::Status CopyThroughPinnedStaging(const std::vector<CopyRange>& ranges,
                                      const std::vector<QuantJob>& jobs,
                                      const std::vector<memory::Segment*>& segments,
                                      const LoadOptions& options, LoadProgress* progress,
                                      LoadStats* stats) {
  if (segments.empty()) return absl::OkStatus();
  std::vector<CudaSegment*> cuda;
  for (auto* s : segments) {
    auto* c = memory::internal::AsCudaSegment(s);
    if (c == nullptr || s->device_uuid() != segments[0]->device_uuid()) {
      return absl::InternalError("pinned staging: every segment must be cuda-vmm, on one device");
    }
    cuda.push_back(c);
  }
  uint64_t total = 0;
  for (const auto& r : ranges) total += r.n;
  if (total == 0) return absl::OkStatus();  // (a job always has source bytes)

  WC_ASSIGN_OR_RETURN(const DriverApi* api, memory::internal::Driver());
  WC_ASSIGN_OR_RETURN(CudaDevice dev,
                      memory::internal::FindDevice(*api, segments[0]->device_uuid()));
  // Buffers of staging_bytes / staging_buffers, but no larger than the model needs.
  size_t nbuf = std::max<size_t>(2, options.staging_buffers);
  uint64_t per = std::max<uint64_t>(1 << 20, options.staging_bytes / nbuf);
  uint64_t need = (total + nbuf - 1) / nbuf;
  per = std::min<uint64_t>(per, (need + 2 * kAlign - 1) / kAlign * kAlign);
  per = (per + kAlign - 1) / kAlign * kAlign;  // spans start aligned: an aligned end fits
  // The daemon's pool keeps the pinned buffers between loads; without one, a pool for this
  // load only (it frees them at the end).
  std::unique_ptr<StagingPool> own_pool;
  StagingPool* pool = options.staging_pool;
  if (pool == nullptr) {
    own_pool = MakePinnedStagingPool(0);
    pool = own_pool.get();
  }
  LoadStats local;
  LoadStats& st = stats != nullptr ? *stats : local;
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  const auto ring_started = Clock::now();
  WC_ASSIGN_OR_RETURN(auto ring, StagingRing::Create(*api, dev, *pool, nbuf, per));
  st.staging_seconds += seconds_since(ring_started);
  st.staging_reused += ring->reused();
  st.staging_buffers += static_cast<uint32_t>(ring->count());

  // Online fp8_block: one device scratch for the source shard of the job in flight. Copies
  // into it and the kernels reading it are ordered on the ring's one stream, so the next
  // job's copies cannot overwrite a shard before its kernel has read it.
  WC_ASSIGN_OR_RETURN(PrimaryContext qctx, PrimaryContext::Retain(*api, dev.device));
  WC_ASSIGN_OR_RETURN(auto qcurrent, ScopedCurrentContext::Push(*api, qctx.get()));
  std::vector<size_t> last_range(jobs.size(), ranges.size());
  uint64_t scratch_bytes = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].quant < 0) continue;
    const auto j = static_cast<size_t>(ranges[i].quant);
    if (j >= jobs.size() || ranges[i].segment_offset + ranges[i].n > jobs[j].src_nbytes) {
      return absl::InternalError(absl::StrCat(ranges[i].what, ": bad quantization range"));
    }
    last_range[j] = i;
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    const auto& q = jobs[j];
    if (q.fp8_segment >= cuda.size() || q.scale_segment >= cuda.size()) {
      return absl::InternalError(absl::StrCat(q.what, ": quantization segment out of range"));
    }
    scratch_bytes = std::max(scratch_bytes, q.src_nbytes);
  }
  DeviceBuffer scratch;
  if (scratch_bytes > 0) {
    WC_ASSIGN_OR_RETURN(scratch, DeviceBuffer::Allocate(scratch_bytes));
  }
  auto launch = [&](size_t j) -> absl::Status {
    const QuantJob& q = jobs[j];
    auto* fp8 = static_cast<uint8_t*>(cuda[q.fp8_segment]->device_ptr());
    auto* sc = static_cast<uint8_t*>(cuda[q.scale_segment]->device_ptr());
    if (fp8 == nullptr || sc == nullptr) {
      return absl::InternalError(absl::StrCat(q.what, ": segment has no device mapping"));
    }
    Fp8QuantArgs a;
    a.src_dtype = q.src_dtype;
    a.src = scratch.get();
    a.rows = q.rows;
    a.cols = q.cols;
    a.block_rows = q.block_rows;
    a.block_cols = q.block_cols;
    a.out_fp8 = fp8 + q.fp8_offset;
    a.out_scale_inv = reinterpret_cast<float*>(sc + q.scale_offset);
    absl::Status st = LaunchFp8BlockQuant(a, ring->stream());
    return st.ok() ? st : Annotate(st, q.what);
  };
  // Chunks of whole MiB keep O_DIRECT chunk offsets aligned.
  const uint64_t chunk = std::max<uint64_t>(1, per / std::max(1u, options.read_threads) >> 20)
                         << 20;
  safetensors::ReadOptions ropts{options.read_threads, chunk,
                                 progress != nullptr ? progress->cancel_flag() : nullptr};

  size_t k = 0;       // current buffer
  uint64_t done = 0;  // source bytes read and queued
  std::vector<Piece> pieces;
  std::vector<safetensors::ReadRequest> reqs;
  uint64_t used = 0;     // bytes of the current buffer taken (pieces and alignment lead)
  uint64_t payload = 0;  // of which source bytes
  std::string file;
  // The open span: consecutive bytes [span_first, span_end) of one file, landing at
  // buffer offset span_at + (span_first - span_base); span_base is span_first aligned down
  // and span_at is aligned, so an O_DIRECT read of [span_base, aligned end) lands right.
  const CopyRange* span = nullptr;
  uint64_t span_base = 0, span_first = 0, span_end = 0, span_at = 0;
  auto close_span = [&] {
    if (span == nullptr) return;
    if (span->direct_fd >= 0) {
      const uint64_t end =
          std::min((span_end + kAlign - 1) / kAlign * kAlign, span->file_size / kAlign * kAlign);
      if (end > span_base) {
        reqs.push_back(
            {span->direct_fd, span_base, end - span_base, ring->buffer(k) + span_at, span->what});
      }
      const uint64_t tail = std::max(end, span_base);
      if (span_end > tail) {  // the unaligned bytes before end of file
        reqs.push_back({span->fd, tail, span_end - tail,
                        ring->buffer(k) + span_at + (tail - span_base), span->what});
      }
    } else {
      reqs.push_back({span->fd, span_first, span_end - span_first,
                      ring->buffer(k) + span_at + (span_first - span_base), span->what});
    }
    span = nullptr;
  };
  // The preads run on long-lived workers, up to a whole ring ahead of the copies: the
  // reads of the next buffers go on while the last chunks of one finish (no barrier per
  // buffer). A filled buffer's copies are queued, in buffer order, once its reads are done.
  // Declared after `ring`: the workers stop before the buffers go back to the pool.
  safetensors::ReadQueue reads(ropts);
  struct Filled {
    std::vector<Piece> pieces;
    uint64_t payload;
    uint64_t ticket;
    size_t buffer;
  };
  std::deque<Filled> filled;  // submitted, copies not yet queued; oldest first
  auto copy_out = [&]() -> absl::Status {
    Filled f = std::move(filled.front());
    filled.pop_front();
    const auto t0 = Clock::now();
    WC_RETURN_IF_ERROR(reads.Wait(f.ticket));
    st.read_seconds += seconds_since(t0);
    uint8_t* buf = ring->buffer(f.buffer);
    for (const auto& p : f.pieces) {
      if (p.segment == nullptr) {
        WC_RETURN_IF_ERROR(
            CopyToDeviceAsync(static_cast<uint8_t*>(scratch.get()) + p.segment_offset, buf + p.at,
                              p.n, ring->stream()));
      } else {
        WC_RETURN_IF_ERROR(
            p.segment->CopyInAsync(p.segment_offset, buf + p.at, p.n, ring->stream()));
      }
      if (p.finishes >= 0) WC_RETURN_IF_ERROR(launch(static_cast<size_t>(p.finishes)));
    }
    WC_RETURN_IF_ERROR(ring->Record(f.buffer));
    done += f.payload;
    if (progress != nullptr) progress->SetDone(done);
    return absl::OkStatus();
  };
  auto flush = [&]() -> absl::Status {
    close_span();
    if (used == 0) return absl::OkStatus();
    if (progress != nullptr && !file.empty()) progress->SetFile(file);
    for (const auto& q : reqs) st.bytes_read += q.length;
    WC_ASSIGN_OR_RETURN(uint64_t ticket, reads.Submit(std::move(reqs)));
    filled.push_back({std::move(pieces), payload, ticket, k});
    pieces.clear();
    reqs.clear();
    used = 0;
    payload = 0;
    // Queue the copies of the buffers whose reads are already done, without blocking.
    while (!filled.empty() && reads.Done(filled.front().ticket)) WC_RETURN_IF_ERROR(copy_out());
    k = (k + 1) % ring->count();
    // Buffer k is next: when its reads are still in flight (the ring is full), finish them
    // and queue its copies; then wait until those copies have landed.
    while (filled.size() >= ring->count()) WC_RETURN_IF_ERROR(copy_out());
    const auto t1 = Clock::now();
    absl::Status free = ring->WaitFree(k);
    st.wait_seconds += seconds_since(t1);
    return free;
  };

  for (size_t ri = 0; ri < ranges.size(); ++ri) {
    const auto& r = ranges[ri];
    if (r.segment >= cuda.size()) {
      return absl::InternalError(
          absl::StrCat(r.what, ": segment ", r.segment, " of ", cuda.size()));
    }
    uint64_t skip = 0;
    while (skip < r.n) {
      const uint64_t at_file = r.file_offset + skip;
      uint64_t at;  // where these bytes land in the buffer
      if (span != nullptr && span->fd == r.fd && span_end == at_file && used < ring->bytes()) {
        at = used;  // continues the open span
      } else {
        close_span();
        const uint64_t lead = at_file % kAlign;
        uint64_t start = (used + kAlign - 1) / kAlign * kAlign;
        if (start + lead >= ring->bytes()) {
          WC_RETURN_IF_ERROR(flush());
          start = 0;
        }
        if (used == 0) file = r.file;
        span_base = at_file - lead;
        span_first = at_file;
        span_end = at_file;
        span_at = start;
        at = start + lead;
      }
      span = &r;  // same file: later ranges continue it (fds, what)
      uint64_t n = std::min<uint64_t>(r.n - skip, ring->bytes() - at);
      const bool to_scratch = r.quant >= 0;
      const bool finishes =
          to_scratch && last_range[static_cast<size_t>(r.quant)] == ri && skip + n == r.n;
      pieces.push_back({to_scratch ? nullptr : cuda[r.segment], r.segment_offset + skip, n, at,
                        finishes ? r.quant : -1});
      used = at + n;
      payload += n;
      span_end += n;
      skip += n;
      if (used == ring->bytes()) WC_RETURN_IF_ERROR(flush());
    }
  }
  WC_RETURN_IF_ERROR(flush());
  while (!filled.empty()) WC_RETURN_IF_ERROR(copy_out());
  const auto t0 = Clock::now();
  absl::Status drained = ring->Drain();
  st.wait_seconds += seconds_since(t0);
  return drained;
}

}  // namespace weightcache::load::internal
