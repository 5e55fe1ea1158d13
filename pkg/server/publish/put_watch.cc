#include "pkg/server/publish/put_watch.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace weightcache::server {

PutWatch::PutWatch(Options options) : options_(options), thread_([this] { Run(); }) {}

PutWatch::~PutWatch() {
  {
    MutexLock l(mu_);
    stop_ = true;
    cv_.NotifyAll();
  }
  thread_.join();
}

absl::StatusOr<uint64_t> PutWatch::Begin(const tenant::Unit& unit, std::function<void()> cancel) {
  const std::string key = unit.Key();
  MutexLock l(mu_);
  if (puts_.size() >= options_.max_total) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options_.max_total,
                     " artifact puts are in progress, the most at once "
                     "(--artifact_max_puts); try again shortly"));
  }
  size_t& mine = per_unit_[key];
  if (mine >= options_.max_per_unit) {
    return absl::ResourceExhaustedError(
        absl::StrCat(unit.Describe(), " has ", mine, " artifact puts in progress, the most per ",
                     "pod (--artifact_max_puts_per_unit); let one finish first"));
  }
  ++mine;
  const auto now = std::chrono::steady_clock::now();
  const uint64_t ticket = next_++;
  puts_[ticket] = Put{key, std::move(cancel), now, now, 0, false, ""};
  cv_.NotifyAll();
  return ticket;
}

void PutWatch::Progress(uint64_t ticket, uint64_t bytes) {
  MutexLock l(mu_);
  auto it = puts_.find(ticket);
  if (it == puts_.end()) return;
  it->second.since_last += bytes;
  if (it->second.since_last >= options_.progress_bytes) {
    it->second.since_last = 0;
    it->second.last = std::chrono::steady_clock::now();
  }
}

void PutWatch::Finished(uint64_t ticket) {
  MutexLock l(mu_);
  if (auto it = puts_.find(ticket); it != puts_.end()) it->second.finished = true;
}

std::string PutWatch::End(uint64_t ticket) {
  MutexLock l(mu_);
  auto it = puts_.find(ticket);
  if (it == puts_.end()) return "";
  std::string why = std::move(it->second.why);
  if (auto u = per_unit_.find(it->second.unit); u != per_unit_.end() && --u->second == 0) {
    per_unit_.erase(u);
  }
  puts_.erase(it);
  return why;
}

size_t PutWatch::in_flight() const {
  MutexLock l(mu_);
  return puts_.size();
}

void PutWatch::Run() {
  MutexLock l(mu_);
  while (!stop_) {
    const auto now = std::chrono::steady_clock::now();
    auto wake = now + std::chrono::seconds(1);
    for (auto& [ticket, p] : puts_) {
      if (!p.why.empty() || p.finished) continue;
      if (now - p.last >= options_.idle) {
        p.why = absl::StrCat("the put sent fewer than ", options_.progress_bytes, " bytes in ",
                             options_.idle.count(), " ms: stalled, ended");
      } else if (now - p.began >= options_.total) {
        p.why = absl::StrCat("the put ran past ", options_.total.count(),
                             " ms (--artifact_put_total): ended");
      } else {
        wake = std::min({wake, p.last + options_.idle, p.began + options_.total});
        continue;
      }
      p.cancel();  // its pending read returns false; the put gives its reservation back
    }
    cv_.WaitUntil(mu_, wake);
  }
}

}  // namespace weightcache::server
