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
#include "pkg/util/bytes.h"
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

// One device of the group: its primary context, a stream for the copies into its ranks'
// segments (and their quantization kernels), an event per staging buffer, and the ranks'
// quantization scratch. The destructor waits for the stream, so no copy still reads a
// staging buffer when the lease goes back, and frees the scratch in the device's context.
class DeviceLane {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceLane>> Create(const DriverApi& api,
                                                            const CudaDevice& dev, size_t buffers) {
    WC_ASSIGN_OR_RETURN(auto ctx, PrimaryContext::Retain(api, dev.device));
    auto lane = std::unique_ptr<DeviceLane>(new DeviceLane(api, std::move(ctx), dev.uuid));
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(api, lane->ctx_.get()));
    WC_RETURN_IF_ERROR(CuStatus(api, api.cuStreamCreate(&lane->stream_, CU_STREAM_NON_BLOCKING),
                                "cuStreamCreate", dev.uuid));
    for (size_t i = 0; i < buffers; ++i) {
      CUevent e = nullptr;
      WC_RETURN_IF_ERROR(
          CuStatus(api, api.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate", dev.uuid));
      lane->events_.push_back(e);
      lane->recorded_.push_back(false);
    }
    return lane;
  }

  ~DeviceLane() {
    auto current = ScopedCurrentContext::Push(*api_, ctx_.get());
    if (stream_ != nullptr) {
      // Copies may still read the buffers (an error path): wait before they go back.
      if (CUresult r = api_->cuStreamSynchronize(stream_); r != CUDA_SUCCESS) {
        WC_LOG_ERROR("staging: cuStreamSynchronize: %s", memory::internal::CuErrorName(*api_, r));
      }
    }
    scratch_.clear();  // cudaFree in this device's context
    for (CUevent e : events_) api_->cuEventDestroy(e);
    if (stream_ != nullptr) api_->cuStreamDestroy(stream_);
  }
  DeviceLane(const DeviceLane&) = delete;
  DeviceLane& operator=(const DeviceLane&) = delete;

  CUcontext ctx() const { return ctx_.get(); }
  CUstream stream() const { return stream_; }
  const std::string& uuid() const { return uuid_; }

  // Device scratch of `bytes` (a rank's quantization source shards), freed with the lane.
  absl::StatusOr<void*> AllocateScratch(uint64_t bytes) {
    WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api_, ctx_.get()));
    WC_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(bytes));
    scratch_.push_back(std::move(b));
    return scratch_.back().get();
  }
  // Blocks until the copies last queued from buffer i have landed.
  absl::Status WaitFree(size_t i) {
    if (!recorded_[i]) return absl::OkStatus();
    recorded_[i] = false;
    return CuStatus(*api_, api_->cuEventSynchronize(events_[i]), "cuEventSynchronize",
                    "staging buffer");
  }
  // Marks the copies queued so far from buffer i (this lane's context must be current).
  absl::Status Record(size_t i) {
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
  DeviceLane(const DriverApi& api, PrimaryContext ctx, std::string uuid)
      : api_(&api), ctx_(std::move(ctx)), uuid_(std::move(uuid)) {}
  const DriverApi* api_;
  PrimaryContext ctx_;
  std::string uuid_;
  CUstream stream_ = nullptr;
  std::vector<CUevent> events_;
  std::vector<bool> recorded_;
  std::vector<DeviceBuffer> scratch_;
};

// O_DIRECT alignment of file offsets, lengths and buffer addresses (the logical block size
// of common devices is 512 or 4096 bytes).
constexpr uint64_t kAlign = 4096;

// `height` rows of `width` bytes from pinned `src` (`src_pitch` apart) to device `dst`,
// packed; one driver call (a plain copy when there is one row).
absl::Status CopyRowsAsync(const DriverApi& api, void* dst, const uint8_t* src, uint64_t width,
                           uint64_t height, uint64_t src_pitch, CUstream stream) {
  const auto d = reinterpret_cast<CUdeviceptr>(dst);
  if (height == 1 || src_pitch == width) {
    return CuStatus(api, api.cuMemcpyHtoDAsync(d, src, width * height, stream),
                    "cuMemcpyHtoDAsync");
  }
  CUDA_MEMCPY2D m{};
  m.srcMemoryType = CU_MEMORYTYPE_HOST;
  m.srcHost = src;
  m.srcPitch = src_pitch;
  m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  m.dstDevice = d;
  m.dstPitch = width;
  m.WidthInBytes = width;
  m.Height = height;
  return CuStatus(api, api.cuMemcpy2DAsync(&m, stream), "cuMemcpy2DAsync");
}

}  // namespace

}  // namespace weightcache::load::internal

namespace weightcache::load {

std::unique_ptr<StagingPool> MakePinnedStagingPool(uint64_t max_idle_bytes) {
  return std::make_unique<StagingPool>(std::make_unique<internal::PinnedAllocator>(),
                                       max_idle_bytes);
}

}  // namespace weightcache::load

namespace weightcache::load::internal {

absl::Status ScatterThroughPinnedStaging(const ScatterPlan& plan,
                                         const std::vector<ScatterFile>& files,
                                         const std::vector<std::vector<memory::Segment*>>& segments,
                                         const LoadOptions& options, LoadProgress* progress,
                                         LoadStats* stats) {
  if (plan.buffers.empty()) return absl::OkStatus();
  if (plan.buffer_bytes % kAlign != 0 || plan.align != kAlign) {
    return absl::InternalError("pinned staging: the scatter plan's buffers are not aligned");
  }
  WC_ASSIGN_OR_RETURN(const DriverApi* api, memory::internal::Driver());
  // The group's segments, by rank; one lane per device.
  std::vector<std::vector<CudaSegment*>> cuda(segments.size());
  std::vector<size_t> lane_of(segments.size(), 0);
  std::vector<std::unique_ptr<DeviceLane>> lanes;
  const size_t nbuf =
      std::max<size_t>(2, std::min<size_t>(options.staging_buffers, plan.buffers.size()));
  int first_ordinal = -1;
  for (size_t r = 0; r < segments.size(); ++r) {
    for (auto* s : segments[r]) {
      auto* c = memory::internal::AsCudaSegment(s);
      if (c == nullptr || s->device_uuid() != segments[r][0]->device_uuid()) {
        return absl::InternalError(
            "pinned staging: every segment of a rank must be cuda-vmm, on one device");
      }
      cuda[r].push_back(c);
    }
    if (segments[r].empty()) continue;
    const std::string& uuid = segments[r][0]->device_uuid();
    auto it = std::find_if(lanes.begin(), lanes.end(), [&](auto& l) { return l->uuid() == uuid; });
    if (it == lanes.end()) {
      WC_ASSIGN_OR_RETURN(CudaDevice dev, memory::internal::FindDevice(*api, uuid));
      if (first_ordinal < 0) first_ordinal = dev.ordinal;
      WC_ASSIGN_OR_RETURN(auto lane, DeviceLane::Create(*api, dev, nbuf));
      lanes.push_back(std::move(lane));
      it = lanes.end() - 1;
    }
    lane_of[r] = static_cast<size_t>(it - lanes.begin());
  }
  if (lanes.empty()) return absl::InternalError("pinned staging: no segments");

  LoadStats local;
  LoadStats& st = stats != nullptr ? *stats : local;
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // The daemon's pool keeps the pinned buffers between loads; without one, a pool for this
  // load only (it frees them at the end). Portable memory: every lane's device copies from
  // it. Declared before the lanes' users below so that it goes back after they drained.
  std::unique_ptr<StagingPool> own_pool;
  StagingPool* pool = options.staging_pool;
  if (pool == nullptr) {
    own_pool = MakePinnedStagingPool(0);
    pool = own_pool.get();
  }
  const auto ring_started = Clock::now();
  WC_ASSIGN_OR_RETURN(StagingPool::Lease lease, pool->Take(first_ordinal, nbuf, plan.buffer_bytes));
  st.staging_seconds += seconds_since(ring_started);
  st.staging_reused += lease.reused();
  st.staging_buffers += static_cast<uint32_t>(nbuf);
  // Destroyed before `lease`: their destructors wait for the copies reading the buffers.
  std::vector<std::unique_ptr<DeviceLane>> lanes_in_use = std::move(lanes);
  auto& L = lanes_in_use;
  // Each rank's quantization scratch, on its device, looked up once.
  std::vector<uint8_t*> scratch_of(segments.size(), nullptr);
  for (size_t r = 0; r < segments.size(); ++r) {
    if (plan.scratch_bytes.size() > r && plan.scratch_bytes[r] > 0) {
      WC_ASSIGN_OR_RETURN(void* p, L[lane_of[r]]->AllocateScratch(plan.scratch_bytes[r]));
      scratch_of[r] = static_cast<uint8_t*>(p);
    }
  }

  auto launch = [&](const ScatterJob& job, DeviceLane& lane) -> absl::Status {
    const PlannedTensor& t = *job.tensor;
    auto* fp8 = static_cast<uint8_t*>(cuda[job.rank].at(t.segment)->device_ptr());
    auto* sc = static_cast<uint8_t*>(cuda[job.rank].at(job.scale->segment)->device_ptr());
    const std::string what = absl::StrCat("tensor '", t.name, "' of rank ", job.rank);
    if (fp8 == nullptr || sc == nullptr) {
      return absl::InternalError(absl::StrCat(what, ": segment has no device mapping"));
    }
    uint8_t* scratch = scratch_of[job.rank];
    Fp8QuantArgs a;
    a.src_dtype = t.quant->src_dtype;
    a.src = scratch;
    a.rows = t.shape[0];
    a.cols = t.shape[1];
    a.block_rows = t.quant->block_rows;
    a.block_cols = t.quant->block_cols;
    a.out_fp8 = fp8 + t.offset;
    a.out_scale_inv = reinterpret_cast<float*>(sc + job.scale->offset);
    absl::Status s = LaunchFp8BlockQuant(a, lane.stream());
    return s.ok() ? s : Annotate(s, what);
  };

  // Chunks of whole MiB keep O_DIRECT chunk offsets aligned.
  const uint64_t chunk =
      std::max<uint64_t>(1, plan.buffer_bytes / std::max(1u, options.read_threads) >> 20) << 20;
  safetensors::ReadOptions ropts{options.read_threads, chunk,
                                 progress != nullptr ? progress->cancel_flag() : nullptr};
  ropts.tap = options.read_tap;
  if (progress != nullptr) progress->SetTotal(plan.read_bytes);
  std::vector<std::string> what(files.size());
  for (size_t f = 0; f < files.size(); ++f) what[f] = absl::StrCat(files[f].name, ": staging");

  // The preads run on long-lived workers, up to a whole ring ahead of the copies. A filled
  // buffer's copies are queued, in buffer order, once its reads are done. Declared after the
  // lanes: the workers stop before the buffers go back to the pool.
  safetensors::ReadQueue reads(ropts);
  struct Filled {
    size_t index;  // in plan.buffers
    uint64_t ticket;
  };
  std::deque<Filled> filled;  // submitted, copies not yet queued; oldest first
  uint64_t done = 0;
  std::vector<std::vector<const ScatterCopy*>> by_lane(L.size());
  auto copy_out = [&]() -> absl::Status {
    const Filled f = filled.front();
    filled.pop_front();
    const auto t0 = Clock::now();
    WC_RETURN_IF_ERROR(reads.Wait(f.ticket));
    st.read_seconds += seconds_since(t0);
    const ScatterBuffer& b = plan.buffers[f.index];
    const size_t k = f.index % nbuf;
    const uint8_t* buf = lease.buffers()[k].data;
    if (progress != nullptr && !b.spans.empty()) progress->SetFile(files[b.spans[0].file].name);
    for (auto& v : by_lane) v.clear();
    for (const ScatterCopy& c : b.copies) {
      if (c.rank >= cuda.size()) return absl::InternalError("pinned staging: rank out of range");
      by_lane[lane_of[c.rank]].push_back(&c);
    }
    for (size_t li = 0; li < L.size(); ++li) {
      if (by_lane[li].empty()) continue;
      DeviceLane& lane = *L[li];
      WC_ASSIGN_OR_RETURN(auto current, ScopedCurrentContext::Push(*api, lane.ctx()));
      for (const ScatterCopy* c : by_lane[li]) {
        uint8_t* dst = nullptr;
        if (c->quant >= 0) {
          if (scratch_of[c->rank] == nullptr || c->dst + c->bytes() > plan.scratch_bytes[c->rank]) {
            return absl::InternalError("pinned staging: copy past the quantization scratch");
          }
          dst = scratch_of[c->rank] + c->dst;
        } else {
          CudaSegment* seg = cuda[c->rank].at(c->segment);
          if (seg->device_ptr() == nullptr || c->dst + c->bytes() > seg->size()) {
            return absl::InternalError(absl::StrCat("pinned staging: copy outside segment ",
                                                    c->segment, " of rank ", c->rank));
          }
          dst = static_cast<uint8_t*>(seg->device_ptr()) + c->dst;
        }
        WC_RETURN_IF_ERROR(CopyRowsAsync(*api, dst, buf + c->src, c->width, c->height, c->src_pitch,
                                         lane.stream()));
        if (c->finishes) {
          WC_RETURN_IF_ERROR(launch(plan.jobs[static_cast<size_t>(c->quant)], lane));
        }
      }
      WC_RETURN_IF_ERROR(lane.Record(k));
    }
    done += b.read_bytes;
    if (progress != nullptr) progress->SetDone(done);
    return absl::OkStatus();
  };
  // The reads of one buffer: each span straight into place (O_DIRECT: the aligned span
  // around it, and the unaligned tail before end of file through the page cache).
  auto submit = [&](size_t i) -> absl::Status {
    const size_t k = i % nbuf;
    uint8_t* buf = lease.buffers()[k].data;
    std::vector<safetensors::ReadRequest> reqs;
    for (const ScatterSpan& s : plan.buffers[i].spans) {
      if (s.file >= files.size()) return absl::InternalError("pinned staging: bad file index");
      const ScatterFile& f = files[s.file];
      const uint64_t end = s.file_offset + s.length;
      if (f.direct_fd >= 0) {
        const uint64_t base = s.file_offset / kAlign * kAlign;
        const uint64_t aligned_end = std::min(RoundUp(end, kAlign), f.size / kAlign * kAlign);
        uint8_t* at_base = buf + s.at - (s.file_offset - base);
        if (aligned_end > base) {
          reqs.push_back({f.direct_fd, base, aligned_end - base, at_base, what[s.file]});
        }
        const uint64_t tail = std::max(aligned_end, base);
        if (end > tail) {
          reqs.push_back({f.fd, tail, end - tail, at_base + (tail - base), what[s.file]});
        }
      } else {
        reqs.push_back({f.fd, s.file_offset, s.length, buf + s.at, what[s.file]});
      }
    }
    for (const auto& q : reqs) st.bytes_read += q.length;
    WC_ASSIGN_OR_RETURN(uint64_t ticket, reads.Submit(std::move(reqs)));
    filled.push_back({i, ticket});
    return absl::OkStatus();
  };

  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    // Buffer slot i % nbuf is next: when the ring is full, finish the oldest reads and queue
    // their copies; then wait until the slot's earlier copies have landed.
    while (filled.size() >= nbuf) WC_RETURN_IF_ERROR(copy_out());
    const auto t1 = Clock::now();
    for (auto& lane : L) WC_RETURN_IF_ERROR(lane->WaitFree(i % nbuf));
    st.wait_seconds += seconds_since(t1);
    WC_RETURN_IF_ERROR(submit(i));
    // Queue the copies of the buffers whose reads are already done, without blocking.
    while (!filled.empty() && reads.Done(filled.front().ticket)) WC_RETURN_IF_ERROR(copy_out());
  }
  while (!filled.empty()) WC_RETURN_IF_ERROR(copy_out());
  const auto t0 = Clock::now();
  for (auto& lane : L) WC_RETURN_IF_ERROR(lane->Drain());
  st.wait_seconds += seconds_since(t0);
  return absl::OkStatus();
}

}  // namespace weightcache::load::internal
