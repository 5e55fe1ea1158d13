#include "pkg/server/integrity/scrubber.h"

#include <algorithm>
#include <random>

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

// Passes at unpredictable times (issue 48): time is cut into windows of one interval, and
// each window has one pass, started at a random point of the window such that it should end
// inside it (the last pass's length is the guess), over the entries in a random order. An
// engine that writes then restores its write cannot time it between passes, and a change
// is still found within two intervals (one pass per window).
void Scrubber::Loop() {
  std::mt19937_64 rng(std::random_device{}());
  auto window = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration last_pass{0};
  while (!stopping()) {
    const auto room = std::max(std::chrono::steady_clock::duration{0},
                               std::chrono::steady_clock::duration(options_.interval) - last_pass);
    const auto start =
        window + std::chrono::steady_clock::duration(std::uniform_int_distribution<int64_t>(
                     0, std::max<int64_t>(room.count(), 0))(rng));
    {
      MutexLock l(mu_);
      while (!stop_ && std::chrono::steady_clock::now() < start) cv_.WaitUntil(mu_, start);
      if (stop_) return;
    }
    uint64_t bytes = 0;
    size_t entries = 0, corrupt = 0;
    // Draining entries too: evicted, but engines still compute with them (issue 48).
    auto watched = registry_.WatchedEntries();
    std::shuffle(watched.begin(), watched.end(), rng);
    for (const auto& e : watched) {
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
    // Not held while waiting for the next window: an entry evicted meanwhile must go (its
    // memory freed, the keeper told) now, not at the next pass.
    watched.clear();
    const auto end = std::chrono::steady_clock::now();
    last_pass = end - start;
    WC_LOG_DEBUG("integrity: scrub pass over %d entries, %d bytes in %.3f s, %d corrupt", entries,
                 bytes, std::chrono::duration<double>(last_pass).count(), corrupt);
    {
      MutexLock l(mu_);
      ++passes_;
    }
    // The next window; a pass that overran its window starts the next one now.
    window = std::max(window + options_.interval, end);
    // Not before the end of this window: one pass per window.
    MutexLock l(mu_);
    while (!stop_ && std::chrono::steady_clock::now() < window) cv_.WaitUntil(mu_, window);
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
