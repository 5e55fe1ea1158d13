#include "pkg/server/internal/model_service.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/server/messages/layout_proto.h"
#include "pkg/server/options.h"
#include "pkg/spec/spec.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {

ModelService::ModelService(Options options, memory::Backend* backend, cache::Registry& registry,
                           ModelCatalog& models, Admission& admission, const Access& access)
    : options_(options),
      backend_(backend),
      registry_(registry),
      models_(models),
      admission_(admission),
      access_(access) {}

absl::Status ModelService::Load(const Caller& caller, const v1::LoadRequest& req,
                                const Publish& publish) {
  if (req.spec_yaml().empty()) return LoadDefined(caller, req.model(), req, publish);
  WC_RETURN_IF_ERROR(access_.Authorize(caller, Verb::kDefine, {}));
  WC_ASSIGN_OR_RETURN(auto specs, spec::ParseSpecs(req.spec_yaml(), "LoadRequest.spec_yaml"));
  if (specs.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadRequest.spec_yaml: holds ", specs.size(), " specs; send exactly one"));
  }
  WC_RETURN_IF_ERROR(CheckIsolation(specs[0], options_.namespace_rules));
  // An inline spec is defined by a Load that succeeds: a refused or failed one leaves the
  // name as it was (undefined, or the spec file's or an earlier inline spec).
  const ModelCatalog::Previous previous = models_.Define(specs[0]);
  absl::Status s = LoadDefined(caller, specs[0].name, req, publish);
  if (!s.ok()) models_.Restore(previous);
  return s;
}

absl::Status ModelService::LoadDefined(const Caller& caller, const std::string& name,
                                       const v1::LoadRequest& req, const Publish& publish) {
  if (name.empty()) return absl::InvalidArgumentError("Load: set model or spec_yaml");
  Object object = access_.ModelObject(name);
  WC_RETURN_IF_ERROR(access_.Authorize(caller, Verb::kLoad, object));
  // Load re-reads the files (and hashes what changed): an admin's always, an engine's at most
  // once per --refresh_interval per model; in between it loads the identity read last, whose
  // open files are the versions it describes (issue 25: every Load re-stat'ed and could
  // re-hash).
  const bool refresh =
      access_.IsAdmin(caller) || models_.TakeRefresh(name, options_.refresh_interval);
  WC_ASSIGN_OR_RETURN(auto opened, models_.Open(name, refresh));
  WC_ASSIGN_OR_RETURN(const std::vector<Admission::GroupRank> group,
                      Placements(caller, req, *opened));
  std::vector<std::string> undeclared;
  for (const auto& g : group) {
    std::string why = admission_.UndeclaredPlacement(opened->spec, g.layout, g.env, g.device_uuid);
    if (!why.empty()) undeclared.push_back(std::move(why));
  }
  if (!undeclared.empty()) {
    object.undeclared_placement = absl::StrJoin(undeclared, "; ");
    WC_RETURN_IF_ERROR(access_.Authorize(caller, Verb::kLoad, object));
  }
  // Several ranks load together: one pass over the files for all of them.
  std::vector<std::shared_ptr<cache::Entry>> entries;
  for (auto& e : admission_.StartGroupLoad(opened, group)) {
    WC_RETURN_IF_ERROR(e.status());
    entries.push_back(std::move(*e));
  }
  return Report(name, entries, publish);
}

absl::StatusOr<std::vector<Admission::GroupRank>> ModelService::Placements(
    const Caller& caller, const v1::LoadRequest& req, const load::OpenedModel& opened) const {
  // One rank when the request names it; else every rank of the spec.
  std::vector<spec::Layout> layouts;
  if (req.has_layout()) {
    WC_ASSIGN_OR_RETURN(auto layout, admission_.LayoutFrom(req.layout()));
    layouts.push_back(layout);
  } else {
    const auto& s = opened.spec;
    std::vector<int> ranks = s.tp_ranks;
    if (ranks.empty()) {
      for (int r = 0; r < s.tp_size; ++r) ranks.push_back(r);
    }
    for (int r : ranks) layouts.push_back({s.tp_size, r, s.pp_size, s.pp_rank});
  }
  WC_ASSIGN_OR_RETURN(auto asked, admission_.EnvFrom(req.env()));
  WC_ASSIGN_OR_RETURN(const std::vector<std::string> tenants,
                      access_.TenantsToLoad(&caller, opened.spec));
  std::vector<Admission::GroupRank> group;
  for (const std::string& tenant : tenants) {
    for (const auto& layout : layouts) {
      spec::Environment env = asked.env;
      env.tenant = tenant;
      // No device named: the placement rule (rank r on the r-th device), at its capability.
      const std::string device = asked.device_uuid.empty()
                                     ? DefaultDeviceForRank(backend_->Devices(), layout.tp_rank)
                                     : asked.device_uuid;
      if (asked.device_uuid.empty() && req.env().compute_capability().empty()) {
        for (const auto& d : backend_->Devices()) {
          if (d.uuid == device) env.compute_capability = d.compute_capability;
        }
      }
      group.push_back({layout, env, device});
    }
  }
  return group;
}

namespace {

// One progress report of `entries`; `failed` gets the first rank's error.
v1::LoadProgress Progress(const std::string& name,
                          const std::vector<std::shared_ptr<cache::Entry>>& entries,
                          cache::Registry& registry, std::chrono::steady_clock::time_point t0,
                          absl::Status* failed) {
  v1::LoadProgress p;
  p.set_model(name);
  bool loading = false;
  for (const auto& e : entries) {
    absl::Status s = registry.WaitReady(e, std::chrono::steady_clock::now());
    const bool rank_loading = s.code() == absl::StatusCode::kDeadlineExceeded;
    auto* r = p.add_ranks();
    LayoutToProto(e->inputs.layout, r->mutable_layout());
    r->set_fingerprint(e->fingerprint);
    r->set_device_uuid(e->device_uuid);
    r->set_state(rank_loading ? "loading" : s.ok() ? "ready" : "failed");
    r->set_bytes_done(e->progress.done());
    r->set_bytes_total(e->progress.total());
    if (!rank_loading && !s.ok()) {
      r->set_error(std::string(s.message()));
      if (failed->ok()) {
        *failed = absl::Status(
            s.code(), entries.size() == 1
                          ? std::string(s.message())
                          : absl::StrCat("tp rank ", e->inputs.layout.tp_rank, ": ", s.message()));
      }
    }
    if (rank_loading && !loading) p.set_current_file(e->progress.file());
    loading = loading || rank_loading;
    p.set_bytes_done(p.bytes_done() + e->progress.done());
    p.set_bytes_total(p.bytes_total() + e->progress.total());
  }
  p.set_fingerprint(entries.front()->fingerprint);
  p.set_elapsed_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  p.set_state(loading ? "loading" : failed->ok() ? "ready" : "failed");
  if (!loading && !failed->ok()) p.set_error(std::string(failed->message()));
  return p;
}

}  // namespace

absl::Status ModelService::Report(const std::string& name,
                                  const std::vector<std::shared_ptr<cache::Entry>>& entries,
                                  const Publish& publish) {
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    absl::Status failed;
    const v1::LoadProgress p = Progress(name, entries, registry_, t0, &failed);
    if (!publish(p)) return absl::CancelledError("Load: client went away");
    if (p.state() != "loading") return failed;
    // Until the first unfinished rank ends, or the next progress report is due.
    for (const auto& e : entries) {
      auto s =
          registry_.WaitReady(e, std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
      if (s.code() == absl::StatusCode::kDeadlineExceeded) break;
    }
  }
}

absl::Status ModelService::Evict(const Caller& caller, const v1::EvictRequest& req,
                                 v1::EvictResponse* resp) {
  WC_RETURN_IF_ERROR(access_.Authorize(caller, Verb::kEvict, {}));
  std::set<std::string> other_names;
  WC_ASSIGN_OR_RETURN(const std::vector<cache::Key> keys, EvictKeys(req, &other_names));
  uint32_t n = 0, draining = 0;
  for (const auto& key : keys) {
    const auto r = registry_.Evict(key, "api");
    n += r != cache::Registry::Evicted::kNone ? 1 : 0;
    draining += r == cache::Registry::Evicted::kDraining ? 1 : 0;
  }
  if (n == 0) {
    return absl::NotFoundError(absl::StrCat("nothing to evict for ",
                                            req.target_case() == v1::EvictRequest::kModel
                                                ? "model '" + req.model() + "'"
                                                : "fingerprint " + req.fingerprint(),
                                            " (not cached, or still loading)"));
  }
  resp->set_evicted(n);
  resp->set_draining(draining);
  for (const auto& name : other_names) resp->add_other_names(name);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<cache::Key>> ModelService::EvictKeys(
    const v1::EvictRequest& req, std::set<std::string>* other_names) {
  // The entries to evict: every device's entry of the fingerprint, or of the spec.
  std::vector<cache::Key> keys;
  if (req.target_case() == v1::EvictRequest::kFingerprint) {
    for (const auto& e : registry_.FindAll(req.fingerprint())) keys.push_back(e->key);
    return keys;
  }
  if (req.target_case() != v1::EvictRequest::kModel) {
    return absl::InvalidArgumentError("Evict: set either model or fingerprint");
  }
  // A spec's entries: those it loaded, and those of other names that this spec reproduces
  // in its own layout (same content, same tp/pp sizes). Those other names lose them too.
  auto opened = models_.Open(req.model(), /*refresh=*/false);
  for (const auto& s : registry_.Snapshot()) {
    if (s.state == cache::State::kDraining) continue;
    bool mine = s.model == req.model();
    if (!mine && opened.ok()) mine = (*opened)->Reproduces(s.inputs, s.fingerprint);
    if (!mine) continue;
    keys.push_back({s.fingerprint, s.device_uuid});
    for (const auto& n : models_.NamesOf(s)) {
      if (n != req.model()) other_names->insert(n);
    }
  }
  if (!opened.ok() && keys.empty()) return opened.status();  // an unknown name says so
  return keys;
}

}  // namespace weightcache::server
