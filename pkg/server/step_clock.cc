#include "pkg/server/internal/step_clock.h"

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "pkg/util/log.h"

namespace weightcache::server {

void StepClock::Step(std::string what) {
  const auto now = std::chrono::steady_clock::now();
  steps_.emplace_back(std::move(what), std::chrono::duration<double>(now - mark_).count());
  mark_ = now;
}

void StepClock::Report(const std::string& last) const {
  const double total = std::chrono::duration<double>(mark_ - t0_).count();
  const double last_secs = steps_.empty() ? 0 : steps_.back().second;
  if (total > 1.0) {
    std::vector<std::string> waited;
    for (const auto& [what, secs] : steps_) {
      if (secs >= 0.1) waited.push_back(absl::StrFormat("%s %.3f s", what, secs));
    }
    WC_LOG_WARN("shut down in %.3f s (%s in %.3f s), longer than a second; it waited on: %s", total,
                last, last_secs,
                waited.empty() ? "no single step over 0.1 s" : absl::StrJoin(waited, ", "));
  } else {
    WC_LOG_INFO("shut down in %.3f s (%s in %.3f s)", total, last, last_secs);
  }
}

}  // namespace weightcache::server
