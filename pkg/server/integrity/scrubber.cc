#include "pkg/server/integrity/scrubber.h"

#include "absl/strings/str_cat.h"
#include "pkg/integrity/digest.h"
#include "pkg/metrics/metrics.h"
#include "pkg/util/log.h"

namespace weightcache::server {

Scrubber::Scrubber(Options options, memory::BackendKind kind, cache::Registry& registry,
                   metrics::Metrics* metrics, CorruptFn on_corrupt, DigestHook hook)
    : options_(options),
      kind_(kind),
      registry_(registry),
      metrics_(metrics),
      on_corrupt_(std::move(on_corrupt)),
      hook_(std::move(hook)) {}

Scrubber::~Scrubber() { Stop(); }

void Scrubber::Start() {
  if (options_.interval.count() <= 0 || thread_.joinable()) return;
  thread_ = std::thread(&Scrubber::Loop, this);
}

void Scrubber::Stop() {
  {
    MutexLock l(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

bool Scrubber::stopping() const {
  MutexLock l(mu_);
  return stop_;
}

uint64_t Scrubber::passes() const {
  MutexLock l(mu_);
  return passes_;
}

void Scrubber::Loop() {
  while (!stopping()) {
    const auto start = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    size_t entries = 0, corrupt = 0;
    // Draining entries too: evicted, but engines still compute with them (issue 48).
    for (const auto& e : registry_.WatchedEntries()) {
      if (stopping()) return;
      const Result r = Verify(e, options_.bytes_per_second);
      bytes += r.bytes;
      ++entries;
      if (r.kind == Result::Kind::kCorrupt) ++corrupt;
      if (r.kind == Result::Kind::kError && !stopping()) {
        // An entry evicted (or drained) during its check is not a finding.
        if (registry_.WatchedContent(e).ok()) {
          WC_LOG_WARN("integrity: model %s (%s) not checked: %s", e->model, e->key.ToString(),
                      r.detail);
        }
      }
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    WC_LOG_DEBUG("integrity: scrub pass over %d entries, %d bytes in %.3f s, %d corrupt", entries,
                 bytes, secs, corrupt);
    MutexLock l(mu_);
    ++passes_;
    const auto next = start + options_.interval;
    while (!stop_ && std::chrono::steady_clock::now() < next) cv_.WaitUntil(mu_, next);
  }
}

Scrubber::Result Scrubber::Verify(const std::shared_ptr<cache::Entry>& e, double bytes_per_second) {
  Result r;
  const auto t0 = std::chrono::steady_clock::now();
  auto finish = [&](Result::Kind kind, std::string detail) {
    r.kind = kind;
    r.detail = std::move(detail);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  };
  auto content = registry_.WatchedContent(e);
  if (!content.ok()) return finish(Result::Kind::kError, std::string(content.status().message()));
  const auto expected = registry_.Digests(e);
  if (expected == nullptr || expected->size() != (*content)->segments.size()) {
    return finish(Result::Kind::kError, "no digests were taken when it was filled");
  }
  integrity::Pace pace;
  pace.bytes_per_second = bytes_per_second;
  pace.stop = [this] { return stopping(); };
  const auto& segments = (*content)->segments;
  std::string what;
  for (size_t i = 0; i < segments.size(); ++i) {
    auto got = integrity::DigestSegment(kind_, *segments[i], pace);
    if (!got.ok()) {
      return finish(Result::Kind::kError,
                    absl::StrCat("segment ", i, ": ", got.status().message()));
    }
    if (hook_) hook_(e->model, i, &got->chunks);
    r.bytes += segments[i]->size();
    ++r.segments;
    const auto ranges = integrity::ChangedRanges((*expected)[i], *got, segments[i]->size());
    if (ranges.empty()) continue;
    absl::StrAppend(&what, what.empty() ? "" : "; ", "segment ", i, " of ", segments.size(), " (",
                    segments[i]->size(), " bytes on ", segments[i]->device_uuid(), "): bytes ",
                    integrity::DescribeRanges(ranges), " changed");
  }
  if (metrics_ != nullptr) metrics_->OnIntegrityCheck();
  if (what.empty()) {
    registry_.MarkVerified(e);
    return finish(Result::Kind::kClean, "");
  }
  on_corrupt_(e, what);
  return finish(Result::Kind::kCorrupt, what);
}

}  // namespace weightcache::server
