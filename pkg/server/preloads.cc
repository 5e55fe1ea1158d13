#include "pkg/server/internal/preloads.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pkg/util/log.h"

namespace weightcache::server {

Preloads::Preloads(std::vector<spec::ModelSpec> specs, ModelCatalog& models, Admission& admission,
                   const Access& access, std::function<void(const std::string&)> before_open)
    : specs_(std::move(specs)),
      models_(models),
      admission_(admission),
      access_(access),
      before_open_(std::move(before_open)) {}

Preloads::~Preloads() { Stop(); }

void Preloads::MarkPending() {
  MutexLock l(mu_);
  for (const auto& s : specs_) pending_.insert(s.name);
}

void Preloads::Start() {
  if (!specs_.empty()) thread_ = std::thread([this] { Run(); });
}

void Preloads::Run() {
  for (const auto& s : specs_) {
    if (before_open_) before_open_(s.name);
    PreloadOne(s);
    Release(s.name);
  }
}

void Preloads::PreloadOne(const spec::ModelSpec& s) {
  auto opened = models_.Open(s.name, /*refresh=*/false);
  std::vector<int> ranks = s.tp_ranks;
  if (ranks.empty()) {
    for (int r = 0; r < s.tp_size; ++r) ranks.push_back(r);
  }
  // A private model (isolation: namespace): a copy per listed namespace; none listed, each
  // namespace's copy is loaded when a pod of it first asks.
  auto tenants = access_.TenantsToLoad(nullptr, s);
  if (!opened.ok()) {
    WC_LOG_ERROR("preload %s: %s", s.name, std::string(opened.status().message()));
    return;
  }
  if (!tenants.ok()) {
    WC_LOG_INFO("preload %s: none (%s)", s.name, std::string(tenants.status().message()));
    return;
  }
  // The ranks of the spec load together: one pass over the files for all of them.
  std::vector<Admission::GroupRank> group;
  for (const std::string& tenant : *tenants) {
    for (int r : ranks) {
      Admission::AskedEnv placed = admission_.Placed(r);
      placed.env.tenant = tenant;
      group.push_back({{s.tp_size, r, s.pp_size, s.pp_rank}, placed.env, placed.device_uuid});
    }
  }
  auto started = admission_.StartGroupLoad(*opened, group);
  for (size_t i = 0; i < group.size(); ++i) {
    const int r = group[i].layout.tp_rank;
    const std::string& device = group[i].device_uuid;
    const std::string& tenant = group[i].env.tenant;
    if (!started[i].ok()) {
      WC_LOG_ERROR("preload %s rank %d on %s%s: %s", s.name, r, device,
                   tenant.empty() ? "" : " for namespace " + tenant,
                   std::string(started[i].status().message()));
      continue;
    }
    WC_LOG_INFO("preload %s rank %d/%d on %s%s", s.name, r, s.tp_size, device,
                tenant.empty() ? "" : " (namespace " + tenant + "'s private copy)");
    MutexLock l(mu_);
    started_.push_back((*started[i])->key);
  }
}

bool Preloads::Hold(const std::string& name) {
  MutexLock l(mu_);
  return pending_.insert(name).second;
}

void Preloads::Release(const std::string& name) {
  {
    MutexLock l(mu_);
    pending_.erase(name);
  }
  cv_.NotifyAll();
}

absl::Status Preloads::Await(const std::string& name, bool wait,
                             std::chrono::steady_clock::time_point deadline,
                             const std::function<bool()>& gone) const {
  MutexLock l(mu_);
  if (pending_.count(name) == 0) return absl::OkStatus();
  if (wait) {
    while (!stopping_ && pending_.count(name) != 0) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      cv_.WaitUntil(mu_, std::min(deadline, now + cache::Registry::kGoneCheck));
      if (gone && gone()) return absl::CancelledError("the caller went away");
    }
    if (pending_.count(name) == 0) return absl::OkStatus();
  }
  if (stopping_) {
    return absl::UnavailableError(
        absl::StrCat("model '", name,
                     "' was still being opened for its preload when the daemon began "
                     "shutting down; ask again once it is back"));
  }
  return absl::UnavailableError(absl::StrCat(
      "model '", name,
      "' is being opened for its preload (its files are read and identified); ask with "
      "wait_ready to wait"));
}

void Preloads::Stop() {
  {
    MutexLock l(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

std::set<std::string> Preloads::pending() const {
  MutexLock l(mu_);
  return pending_;
}

std::vector<cache::Key> Preloads::started() const {
  MutexLock l(mu_);
  return started_;
}

}  // namespace weightcache::server
