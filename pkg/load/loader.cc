#include "pkg/load/loader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "pkg/load/fp8_quant.h"
#include "pkg/load/internal/cuda_load.h"
#include "pkg/load/internal/host_quant.h"
#include "pkg/load/internal/pinned.h"
#include "pkg/load/pieces.h"
#include "pkg/load/scatter.h"
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

// LoadOptions::files_side_by_side, its default resolved: a pinned load hashes what it reads,
// one file per hasher, so its files are read side by side.
size_t FilesSideBySide(const LoadOptions& options) {
  if (options.files_side_by_side != 0) return options.files_side_by_side;
  return options.read_tap != nullptr ? LoadOptions::kPinnedFilesSideBySide : 1;
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

// Online fp8_block on the CPU (host and staging paths): reads the BF16/F16 shard of `t`
// into `scratch`, quantizes it, and writes the fp8 codes and the scales into the segments.
absl::Status QuantizeOnHost(const Plan& plan, const PlannedTensor& t, int fd,
                            const std::string& what,
                            const std::vector<std::unique_ptr<memory::Segment>>& segments,
                            const safetensors::ReadOptions& ropts, std::vector<uint8_t>& scratch) {
  WC_ASSIGN_OR_RETURN(const PlannedTensor* s, ScaleTensorOf(plan, t));
  scratch.resize(SourceBytes(t));
  WC_RETURN_IF_ERROR(ReadPlannedTensor(t, fd, scratch.data(), what, ropts));
  return internal::QuantizeIntoSegments(t, *s, scratch.data(), *segments[t.segment],
                                        *segments[s->segment], ropts.threads, what);
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

// Staging buffer size for a load of `total` source bytes: staging_bytes split into
// staging_buffers, but no larger than the model needs (a whole aligned buffer each).
uint64_t StagingBufferBytes(const LoadOptions& o, uint64_t total) {
  constexpr uint64_t kAlign = 4096;
  const uint64_t nbuf = std::max<uint64_t>(2, o.staging_buffers);
  uint64_t per = std::max<uint64_t>(1 << 20, o.staging_bytes / nbuf);
  const uint64_t need = (total + nbuf - 1) / nbuf;
  per = std::min<uint64_t>(per, (need + 2 * kAlign - 1) / kAlign * kAlign);
  return (per + kAlign - 1) / kAlign * kAlign;
}

// Reads what the ranks' plans need from the files once and copies it to every rank
// (scatter.h): through the pinned ring into cuda-vmm segments (`gpu`), or through host
// buffers. The ranks' segments are allocated and not sealed.
absl::Status ScatterInto(const OpenedModel& model, const std::vector<LoadedModel*>& ranks, bool gpu,
                         const LoadOptions& options, LoadProgress* progress, LoadStats* stats) {
  std::vector<const Plan*> plans;
  uint64_t total = 0;
  for (auto* r : ranks) {
    plans.push_back(&r->plan);
    for (const auto& t : r->plan.tensors) total += SourceBytes(t);
  }
  ScatterOptions sopts;
  sopts.buffer_bytes = StagingBufferBytes(options, total);
  sopts.interleave_files = FilesSideBySide(options);
  WC_ASSIGN_OR_RETURN(ScatterPlan sp, PlanScatter(plans, sopts));
  const auto& files = model.checkpoint.files();
  std::vector<bool> read(files.size(), false);
  for (const auto& b : sp.buffers) {
    for (const auto& s : b.spans) read.at(s.file) = true;
  }
  std::vector<ScatterFile> sfiles(files.size());
  std::vector<ScopedFd> direct_fds;  // outlive the reads
  for (size_t f = 0; f < files.size(); ++f) {
    sfiles[f] = {files[f].fd(), -1, files[f].info().size, files[f].info().name};
    if (!read[f]) continue;
    ++stats->files;
    if (gpu) {
      direct_fds.push_back(OpenDirect(files[f], options.direct_io));
      sfiles[f].direct_fd = direct_fds.back().get();
      if (sfiles[f].direct_fd >= 0) ++stats->direct_files;
    }
  }
  std::vector<std::vector<memory::Segment*>> segs;
  for (auto* r : ranks) {
    segs.emplace_back();
    for (auto& s : r->segments) segs.back().push_back(s.get());
  }
  if (gpu) {
    WC_RETURN_IF_ERROR(
        internal::ScatterThroughPinnedStaging(sp, sfiles, segs, options, progress, stats));
    // The vocabulary padding no copy covers is part of the tensor: written here rather than
    // left to the segment's zeroing at allocation.
    for (auto* r : ranks) WC_RETURN_IF_ERROR(ZeroPadding(r->plan, r->segments));
  } else {
    WC_RETURN_IF_ERROR(ScatterOnHost(sp, sfiles, segs, options, progress, stats));
  }
  return absl::OkStatus();
}

// Zeroes the bytes of the host-addressable segments that no tensor of `plan` covers (the
// alignment gaps and the tail up to the granule), so every byte a digest hashes and an engine
// may read is one the daemon wrote. A memfd is zero-filled when created, so this is cheap
// (only the gaps and the tail are touched) and makes the layout's zeros explicit rather than
// a property of where the memory came from. cuda-vmm segments come zeroed from Allocate
// (one memset each).
void ZeroUncovered(const Plan& plan, std::vector<std::unique_ptr<memory::Segment>>& segments) {
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> covered(segments.size());
  for (const auto& t : plan.tensors) {
    if (t.segment < covered.size()) covered[t.segment].emplace_back(t.offset, t.offset + t.nbytes);
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    std::byte* data = segments[i]->host_data();
    if (data == nullptr) continue;
    auto& ranges = covered[i];
    std::sort(ranges.begin(), ranges.end());
    const uint64_t size = segments[i]->size();
    uint64_t at = 0;
    for (const auto& [begin, end] : ranges) {
      if (begin > at) std::memset(data + at, 0, std::min(begin, size) - at);
      at = std::max(at, std::min(end, size));
    }
    if (at < size) std::memset(data + at, 0, size - at);
  }
}

// A LoadedModel for `plan` with its segments allocated on `device_uuid`.
absl::StatusOr<std::unique_ptr<LoadedModel>> AllocateRank(const OpenedModel& model, Plan plan,
                                                          memory::Backend& backend,
                                                          const std::string& device_uuid,
                                                          const std::string& label) {
  auto out = std::make_unique<LoadedModel>();
  out->device_uuid = device_uuid;
  out->model_dir = model.spec.model_dir;
  for (size_t i = 0; i < plan.segment_bytes.size(); ++i) {
    WC_ASSIGN_OR_RETURN(auto seg,
                        backend.Allocate(device_uuid, std::max<uint64_t>(plan.segment_bytes[i], 1),
                                         absl::StrCat(label, "/", i)));
    out->segments.push_back(std::move(seg));
  }
  ZeroUncovered(plan, out->segments);
  if (out->device_uuid.empty() && !out->segments.empty()) {
    out->device_uuid = out->segments[0]->device_uuid();
  }
  out->plan = std::move(plan);
  return out;
}

bool AllCuda(const LoadedModel& m) {
  return !m.segments.empty() && std::all_of(m.segments.begin(), m.segments.end(), [](auto& s) {
    return memory::internal::AsCudaSegment(s.get()) != nullptr;
  });
}

}  // namespace

// The reads and copies of LoadRank and LoadRanks; the public functions add the check of
// pinned digests beside them (WithPinsChecked).
static absl::StatusOr<std::unique_ptr<LoadedModel>> LoadRankReading(
    const OpenedModel& model, Plan planned, memory::Backend& backend,
    const std::string& device_uuid, const std::string& label, const LoadOptions& options,
    LoadProgress* progress);

static absl::StatusOr<std::vector<std::unique_ptr<LoadedModel>>> LoadRanksReading(
    const OpenedModel& model, std::vector<Plan> plans, memory::Backend& backend,
    const std::vector<std::string>& device_uuids, const std::vector<std::string>& labels,
    const LoadOptions& options, LoadProgress* progress) {
  if (device_uuids.size() != plans.size() || labels.size() != plans.size()) {
    return absl::InvalidArgumentError(absl::StrCat("LoadRanks: ", plans.size(), " plans, ",
                                                   device_uuids.size(), " devices and ",
                                                   labels.size(), " labels"));
  }
  if (plans.size() == 1) {
    WC_ASSIGN_OR_RETURN(auto one, LoadRankReading(model, std::move(plans[0]), backend,
                                                  device_uuids[0], labels[0], options, progress));
    std::vector<std::unique_ptr<LoadedModel>> out;
    out.push_back(std::move(one));
    return out;
  }
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<LoadedModel>> out;
  std::vector<LoadedModel*> ranks;
  bool gpu = true;
  for (size_t r = 0; r < plans.size(); ++r) {
    WC_ASSIGN_OR_RETURN(
        auto m, AllocateRank(model, std::move(plans[r]), backend, device_uuids[r], labels[r]));
    gpu = gpu && AllCuda(*m);
    ranks.push_back(m.get());
    out.push_back(std::move(m));
  }
  LoadStats stats;
  stats.alloc_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  WC_RETURN_IF_ERROR(ScatterInto(model, ranks, gpu, options, progress, &stats));
  for (auto& m : out) {
    for (auto& s : m->segments) WC_RETURN_IF_ERROR(s->Seal());
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  for (auto& m : out) m->stats = stats;
  return out;
}

static absl::StatusOr<std::unique_ptr<LoadedModel>> LoadRankReading(
    const OpenedModel& model, Plan planned, memory::Backend& backend,
    const std::string& device_uuid, const std::string& label, const LoadOptions& options,
    LoadProgress* progress) {
  const auto started = std::chrono::steady_clock::now();
  WC_ASSIGN_OR_RETURN(auto out,
                      AllocateRank(model, std::move(planned), backend, device_uuid, label));
  const Plan& plan = out->plan;
  out->stats.alloc_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // Progress counts source bytes read (a quantized weight's BF16/F16 shard, not its fp8).
  uint64_t read_total = 0;
  for (const auto& t : plan.tensors) read_total += SourceBytes(t);
  if (progress != nullptr) progress->SetTotal(read_total);

  const auto& files = model.checkpoint.files();
  safetensors::ReadOptions ropts{options.read_threads, options.chunk_bytes,
                                 progress != nullptr ? progress->cancel_flag() : nullptr};
  ropts.tap = options.read_tap;
  bool direct = std::all_of(out->segments.begin(), out->segments.end(),
                            [](const auto& s) { return s->host_data() != nullptr; });
  const bool cuda = AllCuda(*out);

  if (cuda) {
    // GPU: the scatter plan through the pinned staging ring (cuda_load.cc).
    WC_RETURN_IF_ERROR(
        ScatterInto(model, {out.get()}, /*gpu=*/true, options, progress, &out->stats));
  } else {
    // Host-addressable segments: straight from the file; others: staging + CopyIn.
    std::vector<uint8_t> staging;
    // Never larger than the model: the default is sized for the GPU ring (256 MiB).
    if (!direct) {
      staging.resize(std::max<uint64_t>(1, std::min(options.staging_bytes, plan.total_bytes)));
    }
    uint64_t done = 0;
    // Files side by side (pinned): every file's plain tensors in one pass, the files taking
    // turns chunk by chunk; the quantized ones after, file by file, below.
    const auto by_file = ByFile(plan);
    const size_t side_by_side = direct ? FilesSideBySide(options) : 1;
    // Each tensor's name in errors, by file; the read requests view these strings.
    std::map<size_t, std::vector<std::string>> what_of;
    for (const auto& [fi, tensors] : by_file) {
      for (const auto* t : tensors) {
        what_of[fi].push_back(absl::StrCat(files.at(fi).info().name, ": tensor '", t->name, "'"));
      }
    }
    if (side_by_side > 1) {
      std::vector<std::vector<safetensors::ReadRequest>> reqs;
      for (const auto& [fi, tensors] : by_file) {
        reqs.emplace_back();
        for (size_t i = 0; i < tensors.size(); ++i) {
          const auto* t = tensors[i];
          if (t->quant.has_value()) continue;
          AppendReadRequests(*t, files.at(fi).fd(),
                             out->segments[t->segment]->host_data() + t->offset, what_of[fi][i],
                             &reqs.back());
          done += SourceBytes(*t);
        }
      }
      if (progress != nullptr) progress->SetFile(absl::StrCat(by_file.size(), " files"));
      ProgressCtx ctx{progress, 0};
      WC_RETURN_IF_ERROR(safetensors::ReadRanges(FilesInTurn(reqs, side_by_side, ropts.chunk_bytes),
                                                 ropts, &OnRead, &ctx));
    }

    for (const auto& [fi, tensors] : by_file) {
      const auto& file = files.at(fi);
      if (progress != nullptr) progress->SetFile(file.info().name);
      const std::vector<std::string>& what = what_of[fi];
      if (direct && side_by_side > 1) {
        // Read above; what is quantized online: from scratch, file by file.
        std::vector<uint8_t> scratch;
        for (size_t i = 0; i < tensors.size(); ++i) {
          if (!tensors[i]->quant.has_value()) continue;
          WC_RETURN_IF_ERROR(
              QuantizeOnHost(plan, *tensors[i], file.fd(), what[i], out->segments, ropts, scratch));
          done += SourceBytes(*tensors[i]);
          if (progress != nullptr) progress->SetDone(done);
        }
        continue;
      } else if (direct) {
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
  return out;
}

namespace {

// What the pin check read, in the stats of what was loaded.
void NotePinCheck(const internal::PinCheck& check, double finish_seconds,
                  std::unique_ptr<LoadedModel>& m) {
  m->stats.pin_followed_bytes = check.followed_bytes();
  m->stats.pin_reread_bytes = check.reread_bytes();
  m->stats.pin_holes_filled = check.holes_filled();
  m->stats.pin_room_wait_seconds = check.room_wait_seconds();
  m->stats.pin_hash_seconds = check.hash_seconds();
  m->stats.pin_finish_seconds = finish_seconds;
}
void NotePinCheck(const internal::PinCheck& check, double finish_seconds,
                  std::vector<std::unique_ptr<LoadedModel>>& ms) {
  for (auto& m : ms) NotePinCheck(check, finish_seconds, m);
}

// Runs `load` (which reads the checkpoint) with the spec's pinned digests checked against the
// bytes it reads, in the same pass (internal::PinCheck as its read tap: each pinned file's
// SHA-256 follows the load's reads; issue 58). The result is given back only when both
// succeed: a file that hashes otherwise than pinned fails the load with DATA_LOSS naming it,
// and the segments loaded from it are released here, before any entry could serve them. A
// file whose last byte the load reads is compared then: a mismatch stops the load (through
// the progress's cancellation, the entry's own when the caller gave one: the entry fails with
// the mismatch either way), not when every byte is read. A cancellation stops both.
template <typename Loaded>
absl::StatusOr<Loaded> WithPinsChecked(
    const OpenedModel& model, const LoadOptions& options, LoadProgress* progress,
    const std::function<absl::StatusOr<Loaded>(const LoadOptions&, LoadProgress*)>& load) {
  if (!model.pinned()) return load(options, progress);
  LoadProgress own;  // a caller without one still has its load stopped at a mismatch
  LoadProgress* p = progress != nullptr ? progress : &own;
  WC_ASSIGN_OR_RETURN(std::unique_ptr<internal::PinCheck> check,
                      internal::PinCheck::Start(model, options.pin_hold_bytes,
                                                [p](const absl::Status&) { p->Cancel(); }));
  LoadOptions followed = options;
  followed.read_tap = check->tap();
  absl::StatusOr<Loaded> loaded = load(followed, p);
  std::atomic<bool> stopped{true};  // a failed load: only what was found matters, no reads
  const auto reads_ended = std::chrono::steady_clock::now();
  const absl::Status verified =
      check->Finish(loaded.ok() ? p->cancel_flag() : &stopped, options.read_threads);
  const double finish_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - reads_ended).count();
  // What the check found (a mismatch; a file changed since it was opened) says more than the
  // load's own failure, which is then most often the CANCELLED the check caused; the check's
  // own CANCELLED (the load failed first, or the caller stopped both) says less.
  if (!verified.ok() && (loaded.ok() || verified.code() != absl::StatusCode::kCancelled)) {
    return verified;
  }
  if (loaded.ok()) NotePinCheck(*check, finish_seconds, *loaded);
  return loaded;
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<LoadedModel>>> LoadRanks(
    const OpenedModel& model, std::vector<Plan> plans, memory::Backend& backend,
    const std::vector<std::string>& device_uuids, const std::vector<std::string>& labels,
    const LoadOptions& options, LoadProgress* progress) {
  using Loaded = std::vector<std::unique_ptr<LoadedModel>>;
  return WithPinsChecked<Loaded>(
      model, options, progress,
      [&](const LoadOptions& o, LoadProgress* p) -> absl::StatusOr<Loaded> {
        return LoadRanksReading(model, std::move(plans), backend, device_uuids, labels, o, p);
      });
}

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadRank(const OpenedModel& model, Plan planned,
                                                      memory::Backend& backend,
                                                      const std::string& device_uuid,
                                                      const std::string& label,
                                                      const LoadOptions& options,
                                                      LoadProgress* progress) {
  using Loaded = std::unique_ptr<LoadedModel>;
  return WithPinsChecked<Loaded>(
      model, options, progress,
      [&](const LoadOptions& o, LoadProgress* p) -> absl::StatusOr<Loaded> {
        return LoadRankReading(model, std::move(planned), backend, device_uuid, label, o, p);
      });
}

}  // namespace weightcache::load
