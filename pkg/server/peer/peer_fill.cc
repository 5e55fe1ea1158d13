#include "pkg/server/peer/peer_fill.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/integrity/digest.h"
#include "pkg/integrity/segment_digest.h"
#include "pkg/util/log.h"
#include "pkg/util/mutex.h"

namespace weightcache::server {

const char* FillFallbackName(FillFallback r) {
  switch (r) {
    case FillFallback::kNotHeld:
      return "not_held";
    case FillFallback::kRecord:
      return "record";
    case FillFallback::kTransfer:
      return "transfer";
    case FillFallback::kTimeout:
      return "timeout";
    case FillFallback::kDigest:
      return "digest";
    case FillFallback::kMemory:
      return "memory";
  }
  return "unknown";
}

namespace {

std::string DescribeTensorPlacement(const load::PlannedTensor& t) {
  std::string out(safetensors::DTypeName(t.dtype));
  absl::StrAppend(&out, "[", absl::StrJoin(t.shape, ","), "] at segment ", t.segment);
  absl::StrAppend(&out, " offset ", t.offset, ", ", t.nbytes, " bytes");
  return out;
}

std::string TensorsDifference(const char* what, const std::vector<load::PlannedTensor>& mine,
                              const std::vector<load::PlannedTensor>& theirs) {
  if (mine.size() != theirs.size()) {
    return absl::StrCat(mine.size(), " ", what, " here, ", theirs.size(), " at the source");
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto& a = mine[i];
    const auto& b = theirs[i];
    if (a.name != b.name) {
      return absl::StrCat(what, " ", i, " is '", a.name, "' here, '", b.name, "' at the source");
    }
    if (a.dtype != b.dtype || a.shape != b.shape || a.segment != b.segment ||
        a.offset != b.offset || a.nbytes != b.nbytes || a.strides != b.strides) {
      return absl::StrCat("'", a.name, "' is ", DescribeTensorPlacement(a), " here, ",
                          DescribeTensorPlacement(b), " at the source");
    }
  }
  return "";
}

// The one status a set of dropped sources leaves: the reason of the last one dropped
// (every source was tried), with every source's story.
struct Drop {
  std::string address;
  FillFallback reason;
  absl::Status status;
};

}  // namespace

std::string PlanDifference(const load::Plan& mine, const load::Plan& theirs) {
  if (mine.segment_bytes != theirs.segment_bytes) {
    return absl::StrCat("segments of [", absl::StrJoin(mine.segment_bytes, ", "), "] bytes here, [",
                        absl::StrJoin(theirs.segment_bytes, ", "), "] at the source");
  }
  if (mine.total_bytes != theirs.total_bytes) {
    return absl::StrCat(mine.total_bytes, " tensor bytes here, ", theirs.total_bytes,
                        " at the source");
  }
  if (auto d = TensorsDifference("tensors", mine.tensors, theirs.tensors); !d.empty()) return d;
  return TensorsDifference("views", mine.views, theirs.views);
}

PeerFill::PeerFill(PeerFillOptions options, memory::Backend* backend, metrics::Metrics* metrics,
                   load::StagingPool* staging)
    : options_(std::move(options)),
      backend_(backend),
      metrics_(metrics),
      staging_(staging),
      peers_(options_.peers) {}

void PeerFill::CountFallback(const std::string& model, FillFallback reason) const {
  if (metrics_ != nullptr) metrics_->OnPeerFillFallback(model, FillFallbackName(reason));
}

std::vector<FillSource> PeerFill::Find(const std::string& fingerprint, const load::Plan& plan,
                                       FillFailure* failure) {
  peer::PeerSurvey survey = peers_.Survey(fingerprint, /*transfer=*/true);
  for (const auto& f : survey.failures) {
    WC_LOG_INFO("peer fill: %s not asked about %s: %s", f.address, fingerprint.substr(0, 12),
                std::string(f.status.message()));
  }
  std::vector<FillSource> out;
  std::vector<std::string> refused;
  const std::string backend = memory::BackendName(backend_->kind());
  for (auto& h : survey.holders) {
    auto refuse = [&](const std::string& why) {
      refused.push_back(absl::StrCat(h.address, ": ", why));
      WC_LOG_WARN("peer fill: the record of %s from %s refused: %s", fingerprint.substr(0, 12),
                  h.address, why);
    };
    auto a = DecodeKeeperRecord(h.response.record());
    if (!a.ok()) {
      refuse(std::string(a.status().message()));
      continue;
    }
    const v1::KeeperRecord& r = a->record;
    if (r.fingerprint() != fingerprint) {
      refuse(absl::StrCat("it is the record of fingerprint ", r.fingerprint().substr(0, 12)));
      continue;
    }
    if (r.backend() != backend) {
      refuse(absl::StrCat("its copy is in ", r.backend(), " memory; this daemon runs ", backend));
      continue;
    }
    if (auto d = PlanDifference(plan, a->plan); !d.empty()) {
      refuse(absl::StrCat("its tensors are placed otherwise: ", d));
      continue;
    }
    const int segments = static_cast<int>(plan.segment_bytes.size());
    if (r.segment_digest_folds_size() != segments) {
      refuse(absl::StrCat("its record has ", r.segment_digest_folds_size(), " digests for ",
                          segments, " segments: the bytes could not be checked"));
      continue;
    }
    const v1::PeerTransfer& t = h.response.transfer();
    if (t.worker_address().empty() || t.regions_size() != segments) {
      refuse(absl::StrCat("its answer offers ", t.regions_size(), " regions for ", segments,
                          " segments"));
      continue;
    }
    FillSource s;
    s.address = h.address;
    s.node = h.response.node();
    s.record = *std::move(a);
    s.transfer = t;
    out.push_back(std::move(s));
  }
  if (out.empty() && failure != nullptr) {
    if (!refused.empty()) {
      *failure = {FillFallback::kRecord,
                  absl::FailedPreconditionError(absl::StrCat("every holder's record was refused: ",
                                                             absl::StrJoin(refused, "; ")))};
    } else {
      *failure = {FillFallback::kNotHeld,
                  absl::NotFoundError(absl::StrCat("no peer holds ", fingerprint.substr(0, 12),
                                                   " (", survey.asked(), " asked, ",
                                                   survey.failures.size(), " did not answer)"))};
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<load::LoadedModel>> PeerFill::Fill(
    const std::vector<FillSource>& sources, const load::Plan& plan, const std::string& model,
    const std::string& model_dir, const std::string& device, const std::string& label,
    load::LoadProgress* progress, FillFailure* failure, FillReport* report) {
  const auto t0 = std::chrono::steady_clock::now();
  auto fail = [&](FillFallback reason, absl::Status s) {
    if (failure != nullptr) *failure = {reason, s};
    return s;
  };
  if (sources.empty()) return fail(FillFallback::kNotHeld, absl::NotFoundError("no source"));
  const size_t n = plan.segment_bytes.size();
  auto out = std::make_unique<load::LoadedModel>();
  out->plan = plan;
  out->device_uuid = device;
  out->model_dir = model_dir;
  uint64_t total = 0;
  const v1::KeeperRecord& first = sources[0].record.record;
  for (size_t i = 0; i < n; ++i) {
    auto seg = backend_->Allocate(device, std::max<uint64_t>(plan.segment_bytes[i], 1),
                                  absl::StrCat(label, "/", i));
    if (!seg.ok()) return fail(FillFallback::kMemory, seg.status());
    const uint64_t want = first.segment_sizes(static_cast<int>(i));
    if ((*seg)->size() != want) {
      return fail(FillFallback::kRecord,
                  absl::FailedPreconditionError(absl::StrCat(
                      "segment ", i, " is ", (*seg)->size(), " bytes here and ", want, " bytes at ",
                      sources[0].address, " (another granule): not comparable")));
    }
    total += (*seg)->size();
    out->segments.push_back(*std::move(seg));
  }
  if (progress != nullptr) {
    progress->SetTotal(total);
    progress->SetDone(0);
    progress->SetFile(absl::StrCat("peer fill from ", sources.size(), " node(s)"));
  }
  {
    std::vector<std::string> from;
    for (const auto& s : sources) from.push_back(s.address);
    WC_LOG_INFO("peer fill of %s: pulling %d bytes in %d segments from %s", model, total,
                static_cast<int>(n), absl::StrJoin(from, ", "));
  }
  // The device's CUDA ordinal: the staging pool allocates in its context.
  int ordinal = 0;
  if (staging_ != nullptr) {
    for (const auto& d : backend_->Devices()) {
      if (d.uuid == device && d.ordinal >= 0) ordinal = d.ordinal;
    }
  }
  // Bytes moved so far, over every source (progress moves with each chunk; a failed pull
  // takes its bytes back).
  std::atomic<uint64_t> moved{0};

  Mutex mu;
  std::deque<size_t> todo;
  for (size_t i = 0; i < n; ++i) todo.push_back(i);
  size_t filled = 0;
  std::vector<size_t> by_source(sources.size(), 0);
  std::vector<uint64_t> folds(n, 0);
  std::vector<bool> done(n, false);  // filled and checked
  std::vector<Drop> drops;
  absl::Status fatal;  // this daemon's own failure (allocation, sealing): no source helps
  CondVar renew_cv;
  bool finished = false;
  auto take = [&](size_t* i) {
    MutexLock l(mu);
    if (!fatal.ok() || todo.empty() || (progress != nullptr && progress->cancelled())) return false;
    *i = todo.front();
    todo.pop_front();
    return true;
  };

  auto work = [&](size_t source_index) {
    const FillSource& src = sources[source_index];
    auto drop = [&](size_t i, FillFallback reason, absl::Status s) {
      WC_LOG_WARN("peer fill of %s: source %s (%s) dropped at segment %d: %s", model, src.address,
                  src.node, static_cast<int>(i), std::string(s.message()));
      MutexLock l(mu);
      todo.push_back(i);
      drops.push_back({src.address, reason, std::move(s)});
    };
    auto puller = peer::UcxPuller::Create();
    if (!puller.ok()) {
      MutexLock l(mu);
      drops.push_back({src.address, FillFallback::kTransfer, puller.status()});
      return;
    }
    // GPU segments: pulled piece by piece into a host buffer, each piece copied in. Pinned
    // (the daemon's staging pool) when there is a pool and it can lend one, else pageable.
    const uint64_t piece = std::max<uint64_t>(options_.bounce_bytes, 1);
    load::StagingPool::Lease pinned;
    std::vector<std::byte> pageable;
    std::byte* bounce = nullptr;
    auto bounce_for = [&]() -> std::byte* {
      if (bounce != nullptr) return bounce;
      if (staging_ != nullptr) {
        auto lease = staging_->Take(ordinal, 1, piece);
        if (lease.ok()) {
          pinned = std::move(lease).value();
          return bounce = reinterpret_cast<std::byte*>(pinned.buffers().front().data);
        }
        WC_LOG_WARN(
            "peer fill of %s: no pinned staging buffer (%s); pulling through pageable "
            "memory",
            model, std::string(lease.status().message()));
      }
      pageable.resize(piece);
      return bounce = pageable.data();
    };
    const std::string& worker = src.transfer.worker_address();
    size_t i = 0;
    while (take(&i)) {
      memory::Segment* seg = out->segments[i].get();
      const auto& region = src.transfer.regions(static_cast<int>(i));
      if (region.length() != seg->size() ||
          src.record.record.segment_sizes(static_cast<int>(i)) != seg->size()) {
        drop(i, FillFallback::kRecord,
             absl::FailedPreconditionError(absl::StrCat("offers ", region.length(),
                                                        " bytes for a segment of ", seg->size())));
        return;
      }
      absl::Status st;
      uint64_t counted = 0;  // this segment's bytes in `moved`
      peer::PullOptions po = options_.pull;
      uint64_t base = 0;  // of the piece being pulled
      po.after_chunk = [&](uint64_t done) {
        const uint64_t now = base + done;
        if (now > counted) {
          const uint64_t all = moved.fetch_add(now - counted) + (now - counted);
          counted = now;
          if (progress != nullptr) progress->SetDone(all);
        }
      };
      if (std::byte* dst = seg->host_data(); dst != nullptr) {
        st = (*puller)->Pull(worker, region.token(), 0, dst, seg->size(), po);
      } else {
        std::byte* buf = bounce_for();
        for (uint64_t off = 0; st.ok() && off < seg->size(); off += piece) {
          const uint64_t len = std::min<uint64_t>(piece, seg->size() - off);
          base = off;
          st = (*puller)->Pull(worker, region.token(), off, buf, len, po);
          if (st.ok()) {
            if (auto c = seg->CopyIn(off, buf, len); !c.ok()) {
              MutexLock l(mu);
              fatal = c;
              return;
            }
          }
        }
      }
      if (!st.ok()) {
        moved.fetch_sub(counted);
        drop(i, absl::IsDeadlineExceeded(st) ? FillFallback::kTimeout : FillFallback::kTransfer,
             st);
        return;
      }
      if (auto s = seg->Seal(); !s.ok()) {
        MutexLock l(mu);
        fatal = s;
        return;
      }
      integrity::Pace pace;
      pace.stop = [progress] { return progress != nullptr && progress->cancelled(); };
      auto d = integrity::DigestSegment(backend_->kind(), *seg, pace);
      if (!d.ok()) {
        MutexLock l(mu);
        fatal = d.status();
        return;
      }
      const uint64_t want = src.record.record.segment_digest_folds(static_cast<int>(i));
      if (integrity::Fold(*d) != want) {
        // A sealed segment cannot be written again: a fresh one takes its place.
        auto fresh = backend_->Allocate(device, std::max<uint64_t>(plan.segment_bytes[i], 1),
                                        absl::StrCat(label, "/", i));
        if (!fresh.ok()) {
          MutexLock l(mu);
          fatal = fresh.status();
          return;
        }
        out->segments[i] = *std::move(fresh);
        moved.fetch_sub(counted);
        drop(i, FillFallback::kDigest,
             absl::DataLossError(
                 absl::StrCat("segment ", i, " differs from the digest in its own record")));
        return;
      }
      if (seg->size() > counted) {
        const uint64_t all = moved.fetch_add(seg->size() - counted) + (seg->size() - counted);
        if (progress != nullptr) progress->SetDone(all);
      }
      MutexLock l(mu);
      ++filled;
      ++by_source[source_index];
      folds[i] = want;
      done[i] = true;
    }
  };

  // Renews the sources' exposures while the pulls run (each Describe with transfer renews
  // the hold and keeps the tokens).
  uint64_t hold_ms = UINT64_MAX;
  for (const auto& s : sources) hold_ms = std::min<uint64_t>(hold_ms, s.transfer.hold_ms());
  std::thread renewer([&] {
    const auto every = std::chrono::milliseconds(std::max<uint64_t>(hold_ms / 3, 50));
    MutexLock l(mu);
    while (!finished) {
      renew_cv.WaitUntil(mu, std::chrono::steady_clock::now() + every);
      if (finished) break;
      mu.Unlock();
      peers_.Survey(first.fingerprint(), /*transfer=*/true);
      mu.Lock();
    }
  });
  std::vector<std::thread> workers;
  workers.reserve(sources.size());
  for (size_t s = 0; s < sources.size(); ++s) workers.emplace_back(work, s);
  for (auto& w : workers) w.join();
  {
    MutexLock l(mu);
    finished = true;
    renew_cv.NotifyAll();
  }
  renewer.join();

  MutexLock l(mu);
  if (report != nullptr) {
    report->segments_by_source = by_source;
    report->folds = folds;
  }
  if (!fatal.ok()) return fail(FillFallback::kMemory, fatal);
  if (progress != nullptr && progress->cancelled()) {
    return fail(FillFallback::kTransfer, absl::CancelledError("peer fill cancelled"));
  }
  if (filled != n) {
    std::vector<std::string> what;
    for (const auto& d : drops) {
      what.push_back(absl::StrCat(d.address, ": ", d.status.message()));
    }
    const FillFallback reason = drops.empty() ? FillFallback::kTransfer : drops.back().reason;
    if (filled > 0 && report != nullptr) {
      // What was filled stays, sealed and checked; the rest is freed for the disk to load.
      uint64_t kept = 0;
      for (size_t i = 0; i < n; ++i) {
        if (!done[i]) {
          out->segments[i].reset();
        } else {
          kept += out->segments[i]->size();
        }
      }
      if (metrics_ != nullptr) metrics_->OnPeerFillBytes(model, kept);
      report->partial = std::move(out);
    }
    return fail(reason, absl::UnavailableError(absl::StrCat(
                            filled, " of ", n, " segments filled from peers, then every source ",
                            "was dropped: ", absl::StrJoin(what, "; "))));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out->stats.seconds = secs;
  std::vector<std::string> from;
  for (size_t k = 0; k < sources.size(); ++k) {
    from.push_back(
        absl::StrCat(sources[k].address, " (", sources[k].node, "): ", by_source[k], " segments"));
  }
  WC_LOG_INFO("peer fill of %s: %d bytes in %d segments from %s in %.3f s (%.2f GB/s)", model,
              total, static_cast<int>(n), absl::StrJoin(from, ", "), secs,
              secs > 0 ? static_cast<double>(total) / secs / 1e9 : 0.0);
  if (metrics_ != nullptr) metrics_->OnPeerFill(model, secs, total);
  return out;
}

}  // namespace weightcache::server
