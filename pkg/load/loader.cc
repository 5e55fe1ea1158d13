#include "pkg/load/loader.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "pkg/load/internal/cuda_load.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/load/pieces.h"
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

// Tensors grouped by source file, in file-offset order (sequential on disk).
std::map<size_t, std::vector<const PlannedTensor*>> ByFile(const Plan& plan) {
  std::map<size_t, std::vector<const PlannedTensor*>> out;
  for (const auto& t : plan.tensors) out[t.file_index].push_back(&t);
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
    for (const auto& [begin, end] : PaddingRanges(t)) {
      if (zeros.size() < end - begin) zeros.assign(end - begin, 0);
      WC_RETURN_IF_ERROR(segments[t.segment]->CopyIn(t.offset + begin, zeros.data(), end - begin));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadRank(const OpenedModel& model, Plan plan,
                                                      memory::Backend& backend,
                                                      const std::string& device_uuid,
                                                      const std::string& label,
                                                      const LoadOptions& options,
                                                      LoadProgress* progress) {
  auto out = std::make_unique<LoadedModel>();
  out->device_uuid = device_uuid;
  out->model_dir = model.spec.model_dir;
  for (size_t i = 0; i < plan.segment_bytes.size(); ++i) {
    WC_ASSIGN_OR_RETURN(auto seg, backend.Allocate(device_uuid,
                                                   std::max<uint64_t>(plan.segment_bytes[i], 1),
                                                   absl::StrCat(label, "/", i)));
    out->segments.push_back(std::move(seg));
  }
  if (progress != nullptr) progress->SetTotal(plan.total_bytes);
  if (out->device_uuid.empty() && !out->segments.empty()) {
    out->device_uuid = out->segments[0]->device_uuid();
  }

  const auto& files = model.checkpoint.files();
  safetensors::ReadOptions ropts{options.read_threads, options.chunk_bytes};
  bool direct = std::all_of(out->segments.begin(), out->segments.end(),
                            [](const auto& s) { return s->host_data() != nullptr; });
  bool cuda = !out->segments.empty() &&
              std::all_of(out->segments.begin(), out->segments.end(), [](const auto& s) {
                return memory::internal::AsCudaSegment(s.get()) != nullptr;
              });

  if (cuda) {
    // GPU: pinned staging ring, preads overlapping asynchronous copies (cuda_load.cc).
    std::vector<internal::CopyRange> ranges;
    ranges.reserve(plan.tensors.size());
    for (const auto& [fi, tensors] : ByFile(plan)) {
      const auto& file = files.at(fi);
      for (const auto* t : tensors) {
        std::string what = absl::StrCat(file.info().name, ": tensor '", t->name, "'");
        // Row-parallel shards are strided: one range per contiguous run.
        ForEachRun(*t, [&](const Run& r) {
          ranges.push_back({file.fd(), r.file_offset, r.length, t->segment,
                            t->offset + r.dst_offset, what, file.info().name});
        });
      }
    }
    std::vector<memory::Segment*> segs;
    for (auto& s : out->segments) segs.push_back(s.get());
    WC_RETURN_IF_ERROR(internal::CopyThroughPinnedStaging(ranges, segs, options, progress));
    // GPU memory is not zeroed: write the vocabulary padding that no run covers.
    WC_RETURN_IF_ERROR(ZeroPadding(plan, out->segments));
  } else {
    // Host-addressable segments: straight from the file; others: staging + CopyIn.
    std::vector<uint8_t> staging;
    if (!direct) staging.resize(options.staging_bytes);
    uint64_t done = 0;

    for (const auto& [fi, tensors] : ByFile(plan)) {
      const auto& file = files.at(fi);
      if (progress != nullptr) progress->SetFile(file.info().name);
      std::vector<std::string> what;
      what.reserve(tensors.size());
      for (const auto* t : tensors) what.push_back(absl::StrCat(file.info().name, ": tensor '", t->name, "'"));
      if (direct) {
        // Straight from the file into the segments: no intermediate copy.
        std::vector<safetensors::ReadRequest> reqs;
        reqs.reserve(tensors.size());
        for (size_t i = 0; i < tensors.size(); ++i) {
          const auto* t = tensors[i];
          // memfd segments start zeroed, so padding needs no write.
          AppendReadRequests(*t, file.fd(), out->segments[t->segment]->host_data() + t->offset,
                             what[i], &reqs);
        }
        ProgressCtx ctx{progress, done};
        WC_RETURN_IF_ERROR(safetensors::ReadRanges(reqs, ropts, &OnRead, &ctx));
      } else {
        // Strided shards: each gathered whole (padding zeroed), then CopyIn.
        std::vector<uint8_t> gathered;
        for (size_t k = 0; k < tensors.size(); ++k) {
          const auto* t = tensors[k];
          if (t->pieces.empty()) continue;
          gathered.resize(t->nbytes);
          WC_RETURN_IF_ERROR(ReadPlannedTensor(*t, file.fd(), gathered.data(), what[k], ropts));
          WC_RETURN_IF_ERROR(
              out->segments[t->segment]->CopyIn(t->offset, gathered.data(), t->nbytes));
          done += t->nbytes;
        }
        // Contiguous tensors: batches through the staging buffer, then CopyIn.
        struct Piece { const PlannedTensor* t; uint64_t skip; uint64_t n; uint64_t at; };
        size_t i = 0;
        uint64_t skip = 0;
        auto skip_strided = [&] {
          while (i < tensors.size() && !tensors[i]->pieces.empty()) ++i;
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
      for (const auto* t : tensors) done += t->nbytes;
      if (progress != nullptr) progress->SetDone(done);
    }
  }
  for (auto& s : out->segments) WC_RETURN_IF_ERROR(s->Seal());
  out->plan = std::move(plan);
  return out;
}

}  // namespace weightcache::load
