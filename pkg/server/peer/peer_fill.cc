#include "pkg/server/peer/peer_fill.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/integrity/crypto_digest.h"
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
    case FillFallback::kAnchor:
      return "anchor";
  }
  return "unknown";
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

namespace {

// The one status a set of dropped sources leaves: the reason of the last one dropped
// (every source was tried), with every source's story.
struct Drop {
  std::string address;
  FillFallback reason;
  absl::Status status;
};

// Records why a fill failed, for the caller, and returns the status.
absl::Status Fail(FillFailure* failure, FillFallback reason, absl::Status s) {
  if (failure != nullptr) *failure = {reason, s};
  return s;
}

// What one Fill works from: its arguments, unchanged while it runs.
struct FillJob {
  const std::vector<FillSource>& sources;
  const load::Plan& plan;
  const std::string& model;
  const std::string& device;
  const std::string& label;
  load::LoadProgress* progress;
};

// The host buffer one source pulls GPU segments through, piece by piece: pinned (the daemon's
// staging pool) when there is a pool and it can lend one, else pageable; taken at first use.
class Bounce {
 public:
  Bounce(load::StagingPool* staging, int ordinal, uint64_t piece, const std::string& model)
      : staging_(staging), ordinal_(ordinal), piece_(piece), model_(model) {}

  uint64_t piece() const { return piece_; }

  std::byte* Get() {
    if (bounce_ != nullptr) return bounce_;
    if (staging_ != nullptr) {
      auto lease = staging_->Take(ordinal_, 1, piece_);
      if (lease.ok()) {
        pinned_ = std::move(lease).value();
        return bounce_ = reinterpret_cast<std::byte*>(pinned_.buffers().front().data);
      }
      WC_LOG_WARN(
          "peer fill of %s: no pinned staging buffer (%s); pulling through pageable "
          "memory",
          model_, std::string(lease.status().message()));
    }
    pageable_.resize(piece_);
    return bounce_ = pageable_.data();
  }

 private:
  load::StagingPool* const staging_;
  const int ordinal_;
  const uint64_t piece_;
  const std::string& model_;
  load::StagingPool::Lease pinned_;
  std::vector<std::byte> pageable_;
  std::byte* bounce_ = nullptr;
};

// One Fill under way: the rank's segments and the pullers' shared account of them (one
// puller thread per source takes segments from one queue).
class FillRun {
 public:
  FillRun(const FillJob& job, const PeerFillOptions& options, memory::Backend* backend,
          load::StagingPool* staging, const std::string& model_dir)
      : job_(job),
        options_(options),
        backend_(backend),
        staging_(staging),
        n_(job.plan.segment_bytes.size()),
        out_(std::make_unique<load::LoadedModel>()),
        by_source_(job.sources.size(), 0),
        sha256_(n_),
        digests_(n_),
        done_(n_, false) {
    out_->plan = job.plan;
    out_->device_uuid = job.device;
    out_->model_dir = model_dir;
    for (size_t i = 0; i < n_; ++i) todo_.push_back(i);
  }

  absl::Status Allocate(FillFallback* reason);
  void Announce() const;
  void PullAll(peer::PeerSet& peers);
  absl::StatusOr<std::unique_ptr<load::LoadedModel>> Conclude(
      std::chrono::steady_clock::time_point t0, metrics::Metrics* metrics, FillFailure* failure,
      FillReport* report);

 private:
  absl::StatusOr<std::unique_ptr<memory::Segment>> NewSegment(size_t i) const;
  bool Take(size_t* i);
  void Pull(size_t source_index);
  bool PullSegment(peer::UcxPuller& puller, const FillSource& src, size_t i, Bounce& bounce,
                   uint64_t* counted);
  bool CheckSegment(const FillSource& src, size_t i, uint64_t counted);
  void DropSource(const FillSource& src, size_t i, FillFallback reason, absl::Status s);
  void Renew(peer::PeerSet& peers);
  absl::Status FallBack(metrics::Metrics* metrics, FillReport* report, FillFailure* failure)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FillJob& job_;
  const PeerFillOptions& options_;
  memory::Backend* const backend_;
  load::StagingPool* const staging_;
  const size_t n_;
  std::unique_ptr<load::LoadedModel> out_;
  uint64_t total_ = 0;
  // The device's CUDA ordinal: the staging pool allocates in its context.
  int ordinal_ = 0;
  // Bytes moved so far, over every source (progress moves with each chunk; a failed pull
  // takes its bytes back).
  std::atomic<uint64_t> moved_{0};

  Mutex mu_;
  std::deque<size_t> todo_ ABSL_GUARDED_BY(mu_);
  size_t filled_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<size_t> by_source_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> sha256_ ABSL_GUARDED_BY(mu_);
  std::vector<integrity::SegmentDigest> digests_ ABSL_GUARDED_BY(mu_);  // taken by CheckSegment
  std::vector<bool> done_ ABSL_GUARDED_BY(mu_);                         // filled and checked
  std::vector<Drop> drops_ ABSL_GUARDED_BY(mu_);
  // This daemon's own failure (allocation, sealing): no source helps.
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  CondVar renew_cv_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// Allocates segment i of the rank (labelled "<label>/<i>").
absl::StatusOr<std::unique_ptr<memory::Segment>> FillRun::NewSegment(size_t i) const {
  return backend_->Allocate(job_.device, std::max<uint64_t>(job_.plan.segment_bytes[i], 1),
                            absl::StrCat(job_.label, "/", i));
}

// Plan: allocates the rank's segments; decides whether they can take the sources' bytes (the
// same sizes as the first source's record).
absl::Status FillRun::Allocate(FillFallback* reason) {
  const FillSource& first = job_.sources[0];
  for (size_t i = 0; i < n_; ++i) {
    auto seg = NewSegment(i);
    if (!seg.ok()) {
      *reason = FillFallback::kMemory;
      return seg.status();
    }
    const uint64_t want = first.record.record.segment_sizes(static_cast<int>(i));
    if ((*seg)->size() != want) {
      *reason = FillFallback::kRecord;
      return absl::FailedPreconditionError(
          absl::StrCat("segment ", i, " is ", (*seg)->size(), " bytes here and ", want,
                       " bytes at ", first.address, " (another granule): not comparable"));
    }
    total_ += (*seg)->size();
    out_->segments.push_back(*std::move(seg));
  }
  return absl::OkStatus();
}

// Sets the progress and logs what the fill is about to pull, from whom.
void FillRun::Announce() const {
  if (job_.progress != nullptr) {
    job_.progress->SetTotal(total_);
    job_.progress->SetDone(0);
    job_.progress->SetFile(absl::StrCat("peer fill from ", job_.sources.size(), " node(s)"));
  }
  std::vector<std::string> from;
  for (const auto& s : job_.sources) from.push_back(s.address);
  WC_LOG_INFO("peer fill of %s: pulling %d bytes in %d segments from %s", job_.model, total_,
              static_cast<int>(n_), absl::StrJoin(from, ", "));
}

// Runs one puller per source, and the renewer of their exposures, until every puller stops.
void FillRun::PullAll(peer::PeerSet& peers) {
  if (staging_ != nullptr) {
    for (const auto& d : backend_->Devices()) {
      if (d.uuid == job_.device && d.ordinal >= 0) ordinal_ = d.ordinal;
    }
  }
  std::thread renewer([this, &peers] { Renew(peers); });
  std::vector<std::thread> workers;
  workers.reserve(job_.sources.size());
  for (size_t s = 0; s < job_.sources.size(); ++s) workers.emplace_back([this, s] { Pull(s); });
  for (auto& w : workers) w.join();
  {
    MutexLock l(mu_);
    finished_ = true;
    renew_cv_.NotifyAll();
  }
  renewer.join();
}

// Renews the sources' exposures while the pulls run (each Describe with transfer renews the
// hold and keeps the tokens).
void FillRun::Renew(peer::PeerSet& peers) {
  uint64_t hold_ms = UINT64_MAX;
  for (const auto& s : job_.sources) hold_ms = std::min<uint64_t>(hold_ms, s.transfer.hold_ms());
  const auto every = std::chrono::milliseconds(std::max<uint64_t>(hold_ms / 3, 50));
  MutexLock l(mu_);
  while (!finished_) {
    renew_cv_.WaitUntil(mu_, std::chrono::steady_clock::now() + every);
    if (finished_) break;
    mu_.Unlock();
    peers.Survey(job_.sources[0].record.record.fingerprint(), /*transfer=*/true);
    mu_.Lock();
  }
}

// The next segment to pull; false when none is left, this daemon failed or the load was
// cancelled.
bool FillRun::Take(size_t* i) {
  MutexLock l(mu_);
  if (!fatal_.ok() || todo_.empty() || (job_.progress != nullptr && job_.progress->cancelled())) {
    return false;
  }
  *i = todo_.front();
  todo_.pop_front();
  return true;
}

// Gives segment i back to the other sources and drops `src` (it pulls no more).
void FillRun::DropSource(const FillSource& src, size_t i, FillFallback reason, absl::Status s) {
  WC_LOG_WARN("peer fill of %s: source %s (%s) dropped at segment %d: %s", job_.model, src.address,
              src.node, static_cast<int>(i), std::string(s.message()));
  MutexLock l(mu_);
  todo_.push_back(i);
  drops_.push_back({src.address, reason, std::move(s)});
}

// One source's puller: takes segments until none is left or the source is dropped.
void FillRun::Pull(size_t source_index) {
  const FillSource& src = job_.sources[source_index];
  auto puller = peer::UcxPuller::Create();
  if (!puller.ok()) {
    MutexLock l(mu_);
    drops_.push_back({src.address, FillFallback::kTransfer, puller.status()});
    return;
  }
  Bounce bounce(staging_, ordinal_, std::max<uint64_t>(options_.bounce_bytes, 1), job_.model);
  size_t i = 0;
  while (Take(&i)) {
    uint64_t counted = 0;  // this segment's bytes in `moved_`
    if (!PullSegment(**puller, src, i, bounce, &counted)) return;
    if (!CheckSegment(src, i, counted)) return;
    MutexLock l(mu_);
    ++filled_;
    ++by_source_[source_index];
    sha256_[i] = src.record.record.segment_sha256(static_cast<int>(i));
    done_[i] = true;
  }
}

// Pull: moves segment i's bytes from `src`; false when the source was dropped (its offer or
// the transfer failed) or this daemon failed to copy them in.
bool FillRun::PullSegment(peer::UcxPuller& puller, const FillSource& src, size_t i, Bounce& bounce,
                          uint64_t* counted) {
  memory::Segment* seg = out_->segments[i].get();
  const auto& region = src.transfer.regions(static_cast<int>(i));
  if (region.length() != seg->size() ||
      src.record.record.segment_sizes(static_cast<int>(i)) != seg->size()) {
    DropSource(src, i, FillFallback::kRecord,
               absl::FailedPreconditionError(absl::StrCat(
                   "offers ", region.length(), " bytes for a segment of ", seg->size())));
    return false;
  }
  const std::string& worker = src.transfer.worker_address();
  absl::Status st;
  peer::PullOptions po = options_.pull;
  uint64_t base = 0;  // of the piece being pulled
  po.after_chunk = [&](uint64_t done) {
    const uint64_t now = base + done;
    if (now > *counted) {
      const uint64_t all = moved_.fetch_add(now - *counted) + (now - *counted);
      *counted = now;
      if (job_.progress != nullptr) job_.progress->SetDone(all);
    }
  };
  if (std::byte* dst = seg->host_data(); dst != nullptr) {
    st = puller.Pull(worker, region.token(), 0, dst, seg->size(), po);
  } else {
    std::byte* buf = bounce.Get();
    for (uint64_t off = 0; st.ok() && off < seg->size(); off += bounce.piece()) {
      const uint64_t len = std::min<uint64_t>(bounce.piece(), seg->size() - off);
      base = off;
      st = puller.Pull(worker, region.token(), off, buf, len, po);
      if (st.ok()) {
        if (auto c = seg->CopyIn(off, buf, len); !c.ok()) {
          MutexLock l(mu_);
          fatal_ = c;
          return false;
        }
      }
    }
  }
  if (!st.ok()) {
    moved_.fetch_sub(*counted);
    DropSource(src, i,
               absl::IsDeadlineExceeded(st) ? FillFallback::kTimeout : FillFallback::kTransfer, st);
    return false;
  }
  return true;
}

// Check: seals segment i and decides whether its digest is the one in `src`'s record; false
// when it is not (the source is dropped) or this daemon failed to seal or digest it.
bool FillRun::CheckSegment(const FillSource& src, size_t i, uint64_t counted) {
  memory::Segment* seg = out_->segments[i].get();
  auto fatal = [&](absl::Status s) {
    MutexLock l(mu_);
    fatal_ = std::move(s);
    return false;
  };
  if (auto s = seg->Seal(); !s.ok()) return fatal(s);
  integrity::Pace pace;
  load::LoadProgress* progress = job_.progress;
  pace.stop = [progress] { return progress != nullptr && progress->cancelled(); };
  pace.threads = integrity::FillDigestThreads();  // the entry waits for it
  auto d = integrity::DigestSegment(backend_->kind(), *seg, pace, integrity::Want::kScrubAndCrypto);
  if (!d.ok()) return fatal(d.status());
  const std::string& want = src.record.record.segment_sha256(static_cast<int>(i));
  if (d->sha256 != want) {
    // A sealed segment cannot be written again: a fresh one takes its place.
    auto fresh = NewSegment(i);
    if (!fresh.ok()) return fatal(fresh.status());
    out_->segments[i] = *std::move(fresh);
    moved_.fetch_sub(counted);
    DropSource(src, i, FillFallback::kDigest,
               absl::DataLossError(
                   absl::StrCat("segment ", i, " differs from the digest in its own record (",
                                integrity::CryptoDigestText(d->sha256), " where the record has ",
                                integrity::CryptoDigestText(want), ")")));
    return false;
  }
  {
    MutexLock l(mu_);  // the entry's digests: the registry does not take them again
    digests_[i] = *std::move(d);
  }
  if (seg->size() > counted) {
    const uint64_t all = moved_.fetch_add(seg->size() - counted) + (seg->size() - counted);
    if (job_.progress != nullptr) job_.progress->SetDone(all);
  }
  return true;
}

// Fall back: every source was dropped before every segment was filled; decides the reason
// (the last drop's) and keeps what was filled as `report->partial`.
absl::Status FillRun::FallBack(metrics::Metrics* metrics, FillReport* report,
                               FillFailure* failure) {
  std::vector<std::string> what;
  for (const auto& d : drops_) {
    what.push_back(absl::StrCat(d.address, ": ", d.status.message()));
  }
  const FillFallback reason = drops_.empty() ? FillFallback::kTransfer : drops_.back().reason;
  if (filled_ > 0 && report != nullptr) {
    // What was filled stays, sealed and checked; the rest is freed for the disk to load.
    uint64_t kept = 0;
    for (size_t i = 0; i < n_; ++i) {
      if (!done_[i]) {
        out_->segments[i].reset();
      } else {
        kept += out_->segments[i]->size();
      }
    }
    if (metrics != nullptr) {
      metrics->OnPeerFillBytes(job_.model, kept);
      metrics->OnPeerFillAnchor(job_.model, job_.sources.front().anchor);
    }
    report->partial = std::move(out_);
  }
  return Fail(failure, reason,
              absl::UnavailableError(absl::StrCat(filled_, " of ", n_,
                                                  " segments filled from peers, then every source ",
                                                  "was dropped: ", absl::StrJoin(what, "; "))));
}

// Decides how the pulls ended: the filled rank, or why the disk must load it (all or part).
absl::StatusOr<std::unique_ptr<load::LoadedModel>> FillRun::Conclude(
    std::chrono::steady_clock::time_point t0, metrics::Metrics* metrics, FillFailure* failure,
    FillReport* report) {
  MutexLock l(mu_);
  if (report != nullptr) {
    report->segments_by_source = by_source_;
    report->sha256 = sha256_;
    report->digests = digests_;
  }
  if (!fatal_.ok()) return Fail(failure, FillFallback::kMemory, fatal_);
  if (job_.progress != nullptr && job_.progress->cancelled()) {
    return Fail(failure, FillFallback::kTransfer, absl::CancelledError("peer fill cancelled"));
  }
  if (filled_ != n_) return FallBack(metrics, report, failure);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out_->stats.seconds = secs;
  std::vector<std::string> from;
  for (size_t k = 0; k < job_.sources.size(); ++k) {
    from.push_back(absl::StrCat(job_.sources[k].address, " (", job_.sources[k].node,
                                "): ", by_source_[k], " segments"));
  }
  WC_LOG_INFO("peer fill of %s: %d bytes in %d segments from %s in %.3f s (%.2f GB/s)", job_.model,
              total_, static_cast<int>(n_), absl::StrJoin(from, ", "), secs,
              secs > 0 ? static_cast<double>(total_) / secs / 1e9 : 0.0);
  if (metrics != nullptr) {
    metrics->OnPeerFill(job_.model, secs, total_);
    metrics->OnPeerFillAnchor(job_.model, job_.sources.front().anchor);
  }
  return std::move(out_);
}

}  // namespace

absl::StatusOr<std::unique_ptr<load::LoadedModel>> PeerFill::Fill(
    const std::vector<FillSource>& sources, const load::Plan& plan, const std::string& model,
    const std::string& model_dir, const std::string& device, const std::string& label,
    load::LoadProgress* progress, FillFailure* failure, FillReport* report) {
  const auto t0 = std::chrono::steady_clock::now();
  if (sources.empty()) {
    return Fail(failure, FillFallback::kNotHeld, absl::NotFoundError("no source"));
  }
  const FillJob job{sources, plan, model, device, label, progress};
  FillRun run(job, options_, backend_, staging_, model_dir);
  FillFallback reason = FillFallback::kMemory;
  if (auto s = run.Allocate(&reason); !s.ok()) return Fail(failure, reason, s);
  run.Announce();
  run.PullAll(peers_);
  return run.Conclude(t0, metrics_, failure, report);
}

}  // namespace weightcache::server
