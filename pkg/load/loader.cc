#include "pkg/load/loader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "pkg/load/fp8_quant.h"
#include "pkg/load/internal/cuda_load.h"
#include "pkg/load/pieces.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/util/log.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/status_macros.h"

namespace weightcache::load {

uint64_t LoadedModel::resident_bytes() const {
  uint64_t n = 0;
  for (const auto& s : segments) n += s->size();
  return n;
}

namespace {

struct ProgressCtx {
  LoadProgress* progress;
  uint64_t base;
};

void OnRead(void* ctx, uint64_t done) {
  auto* c = static_cast<ProgressCtx*>(ctx);
  if (c->progress != nullptr) c->progress->SetDone(c->base + done);
}

// Tensors read from files (not the scales that online quantization writes), grouped by
// source file, in file-offset order (sequential on disk).
std::map<size_t, std::vector<const PlannedTensor*>> ByFile(const Plan& plan) {
  std::map<size_t, std::vector<const PlannedTensor*>> out;
  for (const auto& t : plan.tensors) {
    if (t.scale_of.empty()) out[t.file_index].push_back(&t);
  }
  for (auto& [f, v] : out) {
    std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->file_offset < b->file_offset; });
  }
  return out;
}

// Zeroes the bytes of every planned tensor that no piece covers (vocabulary padding), for
// segments whose memory does not start zeroed.
absl::Status ZeroPadding(const Plan& plan,
                         const std::vector<std::unique_ptr<memory::Segment>>& segments) {
  std::vector<uint8_t> zeros;
  for (const auto& t : plan.tensors) {
    if (t.quant.has_value()) continue;  // quantized whole from a scratch copy: no padding
    for (const auto& [begin, end] : PaddingRanges(t)) {
      if (zeros.size() < end - begin) zeros.assign(end - begin, 0);
      WC_RETURN_IF_ERROR(segments[t.segment]->CopyIn(t.offset + begin, zeros.data(), end - begin));
    }
  }
  return absl::OkStatus();
}

const PlannedTensor* FindPlanned(const Plan& plan, const std::string& name) {
  auto it =
      std::lower_bound(plan.tensors.begin(), plan.tensors.end(), name,
                       [](const PlannedTensor& t, const std::string& n) { return t.name < n; });
  if (it != plan.tensors.end() && it->name == name) return &*it;
  for (const auto& t : plan.tensors) {  // not sorted after all: linear search
    if (t.name == name) return &t;
  }
  return nullptr;
}

// The scale tensor an online-quantized tensor writes; INTERNAL if the plan lacks it.
absl::StatusOr<const PlannedTensor*> ScaleOf(const Plan& plan, const PlannedTensor& t) {
  const PlannedTensor* s = FindPlanned(plan, t.quant->scale);
  if (s == nullptr || s->dtype != safetensors::DType::kF32 || s->shape.size() != 2 ||
      t.shape.size() != 2 ||
      s->shape[0] != (t.shape[0] + t.quant->block_rows - 1) / t.quant->block_rows ||
      s->shape[1] != (t.shape[1] + t.quant->block_cols - 1) / t.quant->block_cols) {
    return absl::InternalError(absl::StrCat("plan: tensor '", t.name, "' has no scale tensor '",
                                            t.quant->scale, "' of its block grid"));
  }
  return s;
}

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

// Online fp8_block on the CPU (host and staging paths): reads the BF16/F16 shard of `t`
// into `scratch`, quantizes it, and writes the fp8 codes and the scales into the segments
// (straight into host-addressable ones, else through CopyIn).
absl::Status QuantizeOnHost(const Plan& plan, const PlannedTensor& t, int fd,
                            const std::string& what,
                            const std::vector<std::unique_ptr<memory::Segment>>& segments,
                            const safetensors::ReadOptions& ropts, std::vector<uint8_t>& scratch) {
  WC_ASSIGN_OR_RETURN(const PlannedTensor* s, ScaleOf(plan, t));
  scratch.resize(SourceBytes(t));
  WC_RETURN_IF_ERROR(ReadPlannedTensor(t, fd, scratch.data(), what, ropts));
  memory::Segment& wseg = *segments[t.segment];
  memory::Segment& sseg = *segments[s->segment];
  std::vector<uint8_t> fp8_tmp;
  std::vector<float> scale_tmp;
  uint8_t* fp8 = wseg.host_data() != nullptr
                     ? reinterpret_cast<uint8_t*>(wseg.host_data() + t.offset)
                     : nullptr;
  float* scale = nullptr;
  if (sseg.host_data() != nullptr && (s->offset % alignof(float)) == 0) {
    scale = reinterpret_cast<float*>(sseg.host_data() + s->offset);
  }
  if (fp8 == nullptr) fp8 = (fp8_tmp.resize(t.nbytes), fp8_tmp.data());
  if (scale == nullptr) scale = (scale_tmp.resize(s->nbytes / sizeof(float)), scale_tmp.data());
  absl::Status st =
      QuantizeParallel(*t.quant, scratch.data(), t.shape[0], t.shape[1], ropts.threads, fp8, scale);
  if (!st.ok()) return Annotate(st, what);
  if (!fp8_tmp.empty()) WC_RETURN_IF_ERROR(wseg.CopyIn(t.offset, fp8_tmp.data(), t.nbytes));
  if (!scale_tmp.empty()) WC_RETURN_IF_ERROR(sseg.CopyIn(s->offset, scale_tmp.data(), s->nbytes));
  return absl::OkStatus();
}

// Fraction of the file's pages in the page cache, from mincore() on up to 256 windows of 16
// pages spread over it; 0 where it cannot tell (the caller then reads around the cache).
double ResidentFraction(int fd, uint64_t size) {
  if (size == 0) return 0;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return 0;
  const uint64_t pages = (size + page - 1) / page;
  const uint64_t windows = std::min<uint64_t>(256, pages), per = std::min<uint64_t>(16, pages);
  std::vector<unsigned char> vec(per);
  uint64_t seen = 0, resident = 0;
  for (uint64_t w = 0; w < windows; ++w) {
    const uint64_t first = std::min(pages - per, pages * w / windows);
    if (::mincore(static_cast<uint8_t*>(map) + first * page, per * page, vec.data()) != 0) break;
    for (unsigned char v : vec) resident += v & 1;
    seen += per;
  }
  ::munmap(map, size);
  return seen == 0 ? 0 : static_cast<double>(resident) / static_cast<double>(seen);
}

// The file opened again with O_DIRECT when `mode` asks for it (kAuto: when less than half
// of it is in the page cache); empty for the page cache, or where O_DIRECT is refused.
ScopedFd OpenDirect(const safetensors::File& file, DirectIo mode) {
  if (mode == DirectIo::kOff) return {};
  if (mode == DirectIo::kAuto && ResidentFraction(file.fd(), file.info().size) >= 0.5) return {};
  // Opened by path again: O_NONBLOCK so that a FIFO swapped in since File::Open cannot block,
  // and only used when it is still the same file.
  ScopedFd fd(::open(file.info().path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    WC_LOG_INFO("%s: O_DIRECT refused (%s): reading through the page cache",
                file.info().name.c_str(), std::strerror(errno));
    return fd;
  }
  struct stat opened {};
  struct stat original {};
  if (::fstat(fd.get(), &opened) != 0 || ::fstat(file.fd(), &original) != 0 ||
      opened.st_dev != original.st_dev || opened.st_ino != original.st_ino) {
    WC_LOG_WARN("%s: the path names another file since it was opened: reading the opened one",
                file.info().name.c_str());
    return {};
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadRank(
    const OpenedModel& model, Plan plan, memory::Backend& backend, const std::string& device_uuid,
    const std::string& label, const LoadOptions& options, LoadProgress* progress) {
  const auto started = std::chrono::steady_clock::now();
  auto out = std::make_unique<LoadedModel>();
  out->device_uuid = device_uuid;
  out->model_dir = model.spec.model_dir;
  for (size_t i = 0; i < plan.segment_bytes.size(); ++i) {
    WC_ASSIGN_OR_RETURN(auto seg,
                        backend.Allocate(device_uuid, std::max<uint64_t>(plan.segment_bytes[i], 1),
                                         absl::StrCat(label, "/", i)));
    out->segments.push_back(std::move(seg));
  }
  out->stats.alloc_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // Progress counts source bytes read (a quantized weight's BF16/F16 shard, not its fp8).
  uint64_t read_total = 0;
  for (const auto& t : plan.tensors) read_total += SourceBytes(t);
  if (progress != nullptr) progress->SetTotal(read_total);
  if (out->device_uuid.empty() && !out->segments.empty()) {
    out->device_uuid = out->segments[0]->device_uuid();
  }

  const auto& files = model.checkpoint.files();
  safetensors::ReadOptions ropts{options.read_threads, options.chunk_bytes,
                                 progress != nullptr ? progress->cancel_flag() : nullptr};
  bool direct = std::all_of(out->segments.begin(), out->segments.end(),
                            [](const auto& s) { return s->host_data() != nullptr; });
  bool cuda = !out->segments.empty() &&
              std::all_of(out->segments.begin(), out->segments.end(), [](const auto& s) {
                return memory::internal::AsCudaSegment(s.get()) != nullptr;
              });

  if (cuda) {
    // GPU: pinned staging ring, preads overlapping asynchronous copies (cuda_load.cc).
    std::vector<internal::CopyRange> ranges;
    std::vector<internal::QuantJob> jobs;
    std::vector<ScopedFd> direct_fds;  // outlive the copies
    ranges.reserve(plan.tensors.size());
    for (const auto& [fi, tensors] : ByFile(plan)) {
      const auto& file = files.at(fi);
      direct_fds.push_back(OpenDirect(file, options.direct_io));
      const int direct_fd = direct_fds.back().get();
      ++out->stats.files;
      if (direct_fd >= 0) ++out->stats.direct_files;
      for (const auto* t : tensors) {
        std::string what = absl::StrCat(file.info().name, ": tensor '", t->name, "'");
        int32_t job = -1;
        if (t->quant.has_value()) {
          // Online fp8_block: the source shard lands in device scratch; the kernel then
          // writes the fp8 codes and the scales into the segments (cuda_load.cc).
          WC_ASSIGN_OR_RETURN(const PlannedTensor* sc, ScaleOf(plan, *t));
          job = static_cast<int32_t>(jobs.size());
          jobs.push_back({t->segment, t->offset, sc->segment, sc->offset, t->quant->src_dtype,
                          t->shape[0], t->shape[1], t->quant->block_rows, t->quant->block_cols,
                          SourceBytes(*t), what});
        }
        // Row-parallel shards are strided: one range per contiguous run.
        ForEachRun(*t, [&](const Run& r) {
          ranges.push_back({file.fd(), r.file_offset, r.length, t->segment,
                            job >= 0 ? r.dst_offset : t->offset + r.dst_offset, what,
                            file.info().name, job, direct_fd, file.info().size});
        });
      }
    }
    std::vector<memory::Segment*> segs;
    for (auto& s : out->segments) segs.push_back(s.get());
    WC_RETURN_IF_ERROR(
        internal::CopyThroughPinnedStaging(ranges, jobs, segs, options, progress, &out->stats));
    // GPU memory is not zeroed: write the vocabulary padding that no run covers.
    WC_RETURN_IF_ERROR(ZeroPadding(plan, out->segments));
  } else {
    // Host-addressable segments: straight from the file; others: staging + CopyIn.
    std::vector<uint8_t> staging;
    // Never larger than the model: the default is sized for the GPU ring (256 MiB).
    if (!direct) {
      staging.resize(std::max<uint64_t>(1, std::min(options.staging_bytes, plan.total_bytes)));
    }
    uint64_t done = 0;

    for (const auto& [fi, tensors] : ByFile(plan)) {
      const auto& file = files.at(fi);
      if (progress != nullptr) progress->SetFile(file.info().name);
      std::vector<std::string> what;
      what.reserve(tensors.size());
      for (const auto* t : tensors)
        what.push_back(absl::StrCat(file.info().name, ": tensor '", t->name, "'"));
      if (direct) {
        // Straight from the file into the segments: no intermediate copy.
        std::vector<safetensors::ReadRequest> reqs;
        reqs.reserve(tensors.size());
        for (size_t i = 0; i < tensors.size(); ++i) {
          const auto* t = tensors[i];
          if (t->quant.has_value()) continue;  // below: read into scratch, quantize
          // memfd segments start zeroed, so padding needs no write.
          AppendReadRequests(*t, file.fd(), out->segments[t->segment]->host_data() + t->offset,
                             what[i], &reqs);
        }
        ProgressCtx ctx{progress, done};
        WC_RETURN_IF_ERROR(safetensors::ReadRanges(reqs, ropts, &OnRead, &ctx));
        std::vector<uint8_t> scratch;
        for (size_t i = 0; i < tensors.size(); ++i) {
          const auto* t = tensors[i];
          if (!t->quant.has_value()) continue;
          WC_RETURN_IF_ERROR(
              QuantizeOnHost(plan, *t, file.fd(), what[i], out->segments, ropts, scratch));
        }
      } else {
        // Strided shards: each gathered whole (padding zeroed), then CopyIn.
        std::vector<uint8_t> gathered;
        for (size_t k = 0; k < tensors.size(); ++k) {
          const auto* t = tensors[k];
          if (t->quant.has_value()) {  // online fp8_block: scratch, quantize, CopyIn
            WC_RETURN_IF_ERROR(
                QuantizeOnHost(plan, *t, file.fd(), what[k], out->segments, ropts, gathered));
            done += SourceBytes(*t);
            continue;
          }
          if (t->pieces.empty()) continue;
          gathered.resize(t->nbytes);
          WC_RETURN_IF_ERROR(ReadPlannedTensor(*t, file.fd(), gathered.data(), what[k], ropts));
          WC_RETURN_IF_ERROR(
              out->segments[t->segment]->CopyIn(t->offset, gathered.data(), t->nbytes));
          done += t->nbytes;
        }
        // Contiguous tensors: batches through the staging buffer, then CopyIn.
        struct Piece {
          const PlannedTensor* t;
          uint64_t skip;
          uint64_t n;
          uint64_t at;
        };
        size_t i = 0;
        uint64_t skip = 0;
        const auto& file_tensors = tensors;  // a structured binding: lambdas capture a name
        auto skip_strided = [&] {
          while (i < file_tensors.size() &&
                 (!file_tensors[i]->pieces.empty() || file_tensors[i]->quant.has_value())) {
            ++i;
          }
        };
        skip_strided();
        while (i < tensors.size()) {
          std::vector<Piece> batch;
          std::vector<safetensors::ReadRequest> reqs;
          uint64_t used = 0;
          while (i < tensors.size() && used < staging.size()) {
            const auto* t = tensors[i];
            uint64_t n = std::min<uint64_t>(t->nbytes - skip, staging.size() - used);
            batch.push_back({t, skip, n, used});
            reqs.push_back({file.fd(), t->file_offset + skip, n, staging.data() + used, what[i]});
            used += n;
            skip += n;
            if (skip == t->nbytes) {
              ++i;
              skip = 0;
              skip_strided();
            }
          }
          ProgressCtx ctx{nullptr, 0};
          WC_RETURN_IF_ERROR(safetensors::ReadRanges(reqs, ropts, &OnRead, &ctx));
          for (const auto& p : batch) {
            WC_RETURN_IF_ERROR(out->segments[p.t->segment]->CopyIn(p.t->offset + p.skip,
                                                                   staging.data() + p.at, p.n));
          }
          if (progress != nullptr) progress->SetDone(done + used);
          done += used;
        }
        continue;
      }
      for (const auto* t : tensors) done += SourceBytes(*t);
      if (progress != nullptr) progress->SetDone(done);
    }
  }
  for (auto& s : out->segments) WC_RETURN_IF_ERROR(s->Seal());
  if (!cuda) out->stats.bytes_read = read_total;
  out->stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  out->plan = std::move(plan);
  return out;
}

}  // namespace weightcache::load
