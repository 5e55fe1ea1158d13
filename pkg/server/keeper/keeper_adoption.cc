// KeeperLink's adoption at start (keeper_link.h): every entry and artifact the keeper holds
// is checked, then registered ready or given back to the artifact store; what cannot be is
// dropped from the keeper with the reason. The worker that keeps the keeper in step
// afterwards is in keeper_link.cc.
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/server/keeper/keeper_link.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {
namespace {

bool IsArtifactKey(const std::string& key) {
  return absl::StartsWith(key, KeeperLink::ArtifactKey(""));
}

}  // namespace

absl::Status KeeperLink::AdoptArtifact(keeper::KeeperClient::Entry held) {
  if (artifacts_ == nullptr) return absl::FailedPreconditionError("no artifact store");
  WC_ASSIGN_OR_RETURN(artifact::Record r, artifact::DecodeRecord(held.body));
  if (ArtifactKey(r.id) != held.key) {
    return absl::InvalidArgumentError(absl::StrCat("its record is of ", ArtifactKey(r.id)));
  }
  if (held.fds.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(held.fds.size(), " descriptors, not 1"));
  }
  WC_ASSIGN_OR_RETURN(auto a, artifacts_->Adopt(std::move(held.fds[0]), r));
  MutexLock l(mu_);
  deposited_artifacts_[held.key] = a;  // the keeper holds it already
  adopted_artifacts_++;
  Publish();
  return absl::OkStatus();
}

absl::Status KeeperLink::AdoptOne(keeper::KeeperClient::Entry held, const AdmitFn& admit,
                                  const PublishedFn& published, std::optional<cache::Key>* key,
                                  std::shared_ptr<cache::Entry>* filling) {
  WC_ASSIGN_OR_RETURN(AdoptableRecord a, DecodeKeeperRecord(held.body));
  const v1::KeeperRecord& r = a.record;
  if (KeeperKey(r.fingerprint(), r.device_uuid()) != held.key) {
    return absl::InvalidArgumentError(
        absl::StrCat("its record is of ", KeeperKey(r.fingerprint(), r.device_uuid())));
  }
  *key = cache::Key{r.fingerprint(), r.device_uuid()};
  if (r.backend() != memory::BackendName(backend_->kind())) {
    return absl::FailedPreconditionError(absl::StrCat("exported by the ", r.backend(),
                                                      " backend; this daemon runs ",
                                                      memory::BackendName(backend_->kind())));
  }
  if (held.fds.size() != static_cast<size_t>(r.segment_sizes_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(held.fds.size(), " descriptors for ", r.segment_sizes_size(), " segments"));
  }
  if (admit) WC_RETURN_IF_ERROR(admit(r));
  // The stale check: the files the bytes came from must be those versions still.
  if (auto changed = load::ChangedFiles(a.files); !changed.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("stale: ", absl::StrJoin(changed, "; ")));
  }
  auto content = std::make_shared<load::LoadedModel>();
  for (size_t i = 0; i < held.fds.size(); ++i) {
    WC_ASSIGN_OR_RETURN(auto seg, backend_->Adopt(r.device_uuid(), std::move(held.fds[i]),
                                                  r.segment_sizes(static_cast<int>(i)),
                                                  absl::StrCat(r.model(), " segment ", i)));
    content->segments.push_back(std::move(seg));
  }
  content->plan = std::move(a.plan);
  content->device_uuid = r.device_uuid();
  content->model_dir = r.model_dir();
  content->content_id = r.content_id();
  content->origin = r.source();
  if (published && r.has_publisher()) published({r.fingerprint(), r.device_uuid()}, r.publisher());
  cache::LoadRequest req;
  req.key = {r.fingerprint(), r.device_uuid()};
  req.model = r.model();
  req.inputs = a.inputs;
  req.bytes = content->resident_bytes();
  req.source = "keeper";
  req.files = std::move(a.files);
  req.check_digests = AdoptionDigestCheck(r);
  req.load = [content](cache::Entry& e) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
    e.progress.SetTotal(content->plan.total_bytes);
    e.progress.SetDone(content->plan.total_bytes);
    auto out = std::make_unique<load::LoadedModel>();
    out->plan = content->plan;
    out->device_uuid = content->device_uuid;
    out->model_dir = content->model_dir;
    out->content_id = content->content_id;
    out->origin = content->origin;
    out->segments = std::move(content->segments);
    return out;
  };
  bool started = false;
  const uint64_t bytes = req.bytes;
  WC_ASSIGN_OR_RETURN(auto e, registry_->StartOrJoin(std::move(req), &started));
  if (!started) return absl::AlreadyExistsError("the registry already has this entry");
  *filling = e;
  // The fill digests every byte: the wait grows with them (a fixed bound dropped the
  // keeper's copy of every entry too large to digest within it, while the registry went on
  // to fill it and record it as the keeper's). Stop ends it at once.
  const auto bound =
      options_.adoption_wait +
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(
          static_cast<double>(bytes) / options_.adoption_digest_rate));
  WC_RETURN_IF_ERROR(registry_->WaitReady(e, std::chrono::steady_clock::now() + bound,
                                          [this] { return stopping(); }));
  if (metrics_ != nullptr) metrics_->OnAdopted(r.model());
  return absl::OkStatus();
}

bool KeeperLink::KeepsKeeperCopy(const std::string& k, const std::optional<cache::Key>& key,
                                 const std::shared_ptr<cache::Entry>& filling) {
  if (filling && registry_->StateOf(filling) == cache::State::kLoading) {
    if (stopping()) return true;
    WC_LOG_INFO(
        "keeper: entry %s (%s) still being digested; serving without it until it is "
        "ready (the keeper keeps it)",
        k, filling->model);
    MutexLock l(mu_);
    adopting_[k] = filling;
    return true;
  }
  if (stopping()) return true;
  if (!key) return false;
  auto live = registry_->Find(*key);
  if (!live) return false;
  const cache::State st = registry_->StateOf(live);
  return st == cache::State::kLoading || st == cache::State::kReady;
}

void KeeperLink::SettleAdopting() {
  std::map<std::string, std::shared_ptr<cache::Entry>> adopting;
  {
    MutexLock l(mu_);
    adopting.swap(adopting_);
  }
  for (auto& [k, e] : adopting) {
    const cache::State st = registry_->StateOf(e);
    if (st == cache::State::kLoading) {
      MutexLock l(mu_);
      adopting_.emplace(k, std::move(e));
      continue;
    }
    if (st == cache::State::kReady) {
      if (metrics_ != nullptr) metrics_->OnAdopted(e->model);
      MutexLock l(mu_);
      adopted_++;
      continue;  // BeforeReady recorded it as held
    }
    if (KeepsKeeperCopy(k, e->key, nullptr) || !conn_) continue;
    WC_LOG_WARN("keeper: entry %s not adopted, dropped: its fill failed", k);
    if (DropKey(k).ok()) {
      MutexLock l(mu_);
      dropped_++;
    }
  }
}

size_t KeeperLink::AdoptAll(const AdmitFn& admit, const PublishedFn& published) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + options_.claim_wait;
  absl::StatusOr<std::vector<keeper::KeeperClient::Entry>> held;
  while (true) {
    if (absl::Status s = Connect(); !s.ok()) {
      MutexLock l(mu_);
      last_error_ = std::string(s.message());
      WC_LOG_WARN(
          "keeper: %s; nothing to adopt, every model loads from disk (will deposit once "
          "a keeper answers)",
          last_error_);
      return 0;
    }
    held = conn_->Adopt();
    if (held.ok()) break;
    // Another daemon owns it: one that is exiting lets go within its shutdown timeout.
    const bool owned = held.status().code() == absl::StatusCode::kFailedPrecondition;
    if (owned && std::chrono::steady_clock::now() < deadline && !stopping()) {
      if (!refused_logged_) {
        WC_LOG_WARN("keeper: %s; waiting up to %.1f s for it to let go",
                    std::string(held.status().message()),
                    std::chrono::duration<double>(options_.claim_wait).count());
        refused_logged_ = true;
      }
      Lost(held.status());
      Idle(options_.retry);
      continue;
    }
    if (!owned) {
      WC_LOG_ERROR("keeper: adopt failed: %s; loading from disk",
                   std::string(held.status().message()));
    }
    refused_logged_ = false;
    Lost(held.status());
    return 0;
  }
  {
    MutexLock l(mu_);
    up_ = true;
    ever_connected_ = true;
    Publish();
  }
  size_t adopted = 0, artifacts = 0;
  std::vector<std::string> drop;
  for (auto& h : *held) {
    const std::string key = h.key;
    const bool is_artifact = IsArtifactKey(key);
    std::optional<cache::Key> ckey;
    std::shared_ptr<cache::Entry> filling;
    const absl::Status s = is_artifact ? AdoptArtifact(std::move(h))
                                       : AdoptOne(std::move(h), admit, published, &ckey, &filling);
    if (!s.ok() && !is_artifact && KeepsKeeperCopy(key, ckey, filling)) continue;
    MutexLock l(mu_);
    if (s.ok()) {
      (is_artifact ? artifacts : adopted)++;
      if (!is_artifact) adopted_++;
      continue;
    }
    dropped_++;
    last_error_ = absl::StrCat("adopt ", key.substr(0, 12), ": ", s.message());
    WC_LOG_WARN("keeper: entry %s not adopted, dropped: %s", key, std::string(s.message()));
    drop.push_back(key);
  }
  for (const auto& key : drop) {
    if (auto s = conn_->Drop(key); !s.ok() && s.code() != absl::StatusCode::kNotFound) {
      Lost(s);
      break;
    }
  }
  // In step: the keeper holds the adopted entries (recorded by BeforeReady) and nothing else.
  reconciled_ = conn_ != nullptr;
  WC_LOG_INFO("keeper: adopted %d entries and %d artifacts of %d held in %.3f s (no disk reads)",
              static_cast<int>(adopted), static_cast<int>(artifacts),
              static_cast<int>(held->size()),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return adopted;
}

}  // namespace weightcache::server
