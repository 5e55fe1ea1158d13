// The scatter plan's host executor (scatter.h) and the CPU fp8_block quantization the host
// paths share (internal/host_quant.h).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "pkg/load/fp8_quant.h"
#include "pkg/load/internal/host_quant.h"
#include "pkg/load/pieces.h"
#include "pkg/load/scatter.h"
#include "pkg/safetensors/read_queue.h"
#include "pkg/util/status_macros.h"

namespace weightcache::load {
namespace internal {
namespace {

// Quantizes a row-major [rows, cols] BF16/F16 matrix on the CPU with up to `threads` threads,
// each taking whole block rows (the result is the same as one QuantizeFp8Block call).
absl::Status QuantizeParallel(const OnlineQuant& q, const uint8_t* src, int64_t rows, int64_t cols,
                              unsigned threads, uint8_t* fp8, float* scale) {
  const int64_t brows = (rows + q.block_rows - 1) / q.block_rows;
  const int64_t bcols = (cols + q.block_cols - 1) / q.block_cols;
  const int64_t n =
      std::max<int64_t>(1, std::min<int64_t>({static_cast<int64_t>(std::max(1u, threads)), brows,
                                              rows * cols / (1 << 20) + 1}));
  std::vector<absl::Status> st(static_cast<size_t>(n));
  std::vector<std::thread> pool;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t b0 = brows * k / n, b1 = brows * (k + 1) / n;
    const int64_t r0 = b0 * q.block_rows, r1 = std::min(rows, b1 * q.block_rows);
    auto work = [&, k, b0, r0, r1] {
      st[static_cast<size_t>(k)] =
          QuantizeFp8Block(q.src_dtype, src + static_cast<uint64_t>(r0 * cols) * 2, r1 - r0, cols,
                           q.block_rows, q.block_cols, fp8 + r0 * cols, scale + b0 * bcols);
    };
    if (k + 1 == n) {
      work();
    } else {
      pool.emplace_back(work);
    }
  }
  for (auto& t : pool) t.join();
  for (auto& s : st) WC_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

}  // namespace

absl::Status QuantizeIntoSegments(const PlannedTensor& t, const PlannedTensor& scale,
                                  const uint8_t* src, memory::Segment& wseg, memory::Segment& sseg,
                                  unsigned threads, std::string_view what) {
  std::vector<uint8_t> fp8_tmp;
  std::vector<float> scale_tmp;
  uint8_t* fp8 = wseg.host_data() != nullptr
                     ? reinterpret_cast<uint8_t*>(wseg.host_data() + t.offset)
                     : nullptr;
  float* sc = nullptr;
  if (sseg.host_data() != nullptr && (scale.offset % alignof(float)) == 0) {
    sc = reinterpret_cast<float*>(sseg.host_data() + scale.offset);
  }
  if (fp8 == nullptr) fp8 = (fp8_tmp.resize(t.nbytes), fp8_tmp.data());
  if (sc == nullptr) sc = (scale_tmp.resize(scale.nbytes / sizeof(float)), scale_tmp.data());
  absl::Status st = QuantizeParallel(*t.quant, src, t.shape[0], t.shape[1], threads, fp8, sc);
  if (!st.ok()) return Annotate(st, std::string(what));
  if (!fp8_tmp.empty()) WC_RETURN_IF_ERROR(wseg.CopyIn(t.offset, fp8_tmp.data(), t.nbytes));
  if (!scale_tmp.empty()) {
    WC_RETURN_IF_ERROR(sseg.CopyIn(scale.offset, scale_tmp.data(), scale.nbytes));
  }
  return absl::OkStatus();
}

}  // namespace internal

namespace {

// Rows of `width` bytes, `src_pitch` apart, packed at `dst`.
void Copy2D(uint8_t* dst, const uint8_t* src, uint64_t width, uint64_t height, uint64_t src_pitch) {
  if (height == 1 || src_pitch == width) {
    std::memcpy(dst, src, width * height);
    return;
  }
  for (uint64_t r = 0; r < height; ++r) std::memcpy(dst + r * width, src + r * src_pitch, width);
}

}  // namespace

absl::Status ScatterOnHost(const ScatterPlan& plan, const std::vector<ScatterFile>& files,
                           const std::vector<std::vector<memory::Segment*>>& segments,
                           const LoadOptions& options, LoadProgress* progress, LoadStats* stats) {
  if (plan.buffers.empty()) return absl::OkStatus();
  using Clock = std::chrono::steady_clock;
  LoadStats local;
  LoadStats& st = stats != nullptr ? *stats : local;
  if (progress != nullptr) progress->SetTotal(plan.read_bytes);
  std::vector<std::vector<uint8_t>> scratch(plan.scratch_bytes.size());
  for (size_t r = 0; r < scratch.size(); ++r) scratch[r].resize(plan.scratch_bytes[r]);
  // Two buffers: the reads of the next fill while this one is copied out.
  const size_t nbuf = std::min<size_t>(2, plan.buffers.size());
  // No larger than the fullest buffer needs (a small model does not take a whole buffer).
  uint64_t fullest = 0;
  for (const auto& b : plan.buffers) {
    for (const auto& s : b.spans) fullest = std::max(fullest, s.at + s.length);
  }
  std::vector<std::vector<uint8_t>> bufs(nbuf);
  for (auto& b : bufs) b.resize(fullest);
  safetensors::ReadOptions ropts{options.read_threads, options.chunk_bytes,
                                 progress != nullptr ? progress->cancel_flag() : nullptr};
  ropts.tap = options.read_tap;
  // Declared before the queue, so they outlive it: a failed Wait returns early while the next
  // buffer's reads are still queued, and the queue's workers (joined by its destructor) read
  // `what` when they cancel them (ASan: a heap-use-after-free once a pinned-digest mismatch
  // stopped a tensor-parallel group's load).
  std::vector<std::string> what(files.size());
  for (size_t f = 0; f < files.size(); ++f) what[f] = absl::StrCat(files[f].name, ": scatter");
  safetensors::ReadQueue reads(ropts);
  std::vector<uint64_t> tickets(plan.buffers.size(), 0);
  auto submit = [&](size_t i) -> absl::Status {
    std::vector<safetensors::ReadRequest> reqs;
    for (const ScatterSpan& s : plan.buffers[i].spans) {
      if (s.file >= files.size()) return absl::InternalError("scatter: file index out of range");
      reqs.push_back(
          {files[s.file].fd, s.file_offset, s.length, bufs[i % nbuf].data() + s.at, what[s.file]});
      st.bytes_read += s.length;
    }
    WC_ASSIGN_OR_RETURN(tickets[i], reads.Submit(std::move(reqs)));
    return absl::OkStatus();
  };
  for (size_t i = 0; i < nbuf; ++i) WC_RETURN_IF_ERROR(submit(i));
  uint64_t done = 0;
  std::vector<uint8_t> gathered;
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const ScatterBuffer& b = plan.buffers[i];
    const auto t0 = Clock::now();
    WC_RETURN_IF_ERROR(reads.Wait(tickets[i]));
    st.read_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    if (progress != nullptr && !b.spans.empty()) progress->SetFile(files[b.spans[0].file].name);
    const uint8_t* buf = bufs[i % nbuf].data();
    for (const ScatterCopy& c : b.copies) {
      if (c.rank >= segments.size()) return absl::InternalError("scatter: rank out of range");
      const uint8_t* src = buf + c.src;
      if (c.quant >= 0) {
        const ScatterJob& job = plan.jobs[static_cast<size_t>(c.quant)];
        Copy2D(scratch[c.rank].data() + c.dst, src, c.width, c.height, c.src_pitch);
        if (c.finishes) {
          const auto& segs = segments[c.rank];
          WC_RETURN_IF_ERROR(internal::QuantizeIntoSegments(
              *job.tensor, *job.scale, scratch[c.rank].data(), *segs.at(job.tensor->segment),
              *segs.at(job.scale->segment), options.read_threads,
              absl::StrCat("tensor '", job.tensor->name, "' of rank ", c.rank)));
        }
        continue;
      }
      memory::Segment& seg = *segments[c.rank].at(c.segment);
      if (seg.host_data() != nullptr) {
        if (c.dst + c.bytes() > seg.size()) {
          return absl::InternalError(absl::StrCat("scatter: copy past the end of segment ",
                                                  c.segment, " of rank ", c.rank));
        }
        Copy2D(reinterpret_cast<uint8_t*>(seg.host_data()) + c.dst, src, c.width, c.height,
               c.src_pitch);
      } else if (c.height == 1) {
        WC_RETURN_IF_ERROR(seg.CopyIn(c.dst, src, c.width));
      } else {
        gathered.resize(c.bytes());
        Copy2D(gathered.data(), src, c.width, c.height, c.src_pitch);
        WC_RETURN_IF_ERROR(seg.CopyIn(c.dst, gathered.data(), gathered.size()));
      }
    }
    done += b.read_bytes;
    if (progress != nullptr) progress->SetDone(done);
    if (i + nbuf < plan.buffers.size()) WC_RETURN_IF_ERROR(submit(i + nbuf));
  }
  return absl::OkStatus();
}

}  // namespace weightcache::load
