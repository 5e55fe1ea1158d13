// Acquire (acquire_service.h): resolve the target, then serve it from the entry, a peer
// device, or a load on a miss; each step ends the Acquire with an outcome or passes on.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/load/loader.h"
#include "pkg/server/internal/acquire_service.h"
#include "pkg/server/messages/layout_proto.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {

using metrics::AcquireResult;

// One Acquire's question, resolved step by step.
struct AcquireService::Ask {
  const Caller& caller;
  const v1::AcquireRequest& req;
  std::string& model;  // the answer's label, set as soon as it is known
  spec::Layout layout;
  // The client's environment; a private model's copy is also the caller's namespace's (set
  // from the pod on its slot, never from the request).
  spec::Environment env;
  // The registry is keyed by (fingerprint, device): an empty asked device takes the entry
  // on any device; a named one takes that device's entry, or a peer copy of another's.
  std::string device;
  std::chrono::steady_clock::time_point deadline;
  std::string fp;
  std::shared_ptr<const load::OpenedModel> opened;  // model target only
  spec::FingerprintInputs asked;                    // model target only

  bool waits() const { return req.wait_ready() || req.load_on_miss(); }
  spec::FingerprintInputs AskedInputs(const load::OpenedModel& m) const {
    spec::FingerprintInputs in = m.Inputs(layout, env);
    if (!req.dtype().empty()) in.dtype = req.dtype();
    if (!req.quantization().empty()) in.quant_method = req.quantization();
    return in;
  }
};

AcquireService::AcquireService(Options options, cache::Registry& registry, ModelCatalog& models,
                               Admission& admission, const Access& access, LeaseIssuer& leases,
                               const PreloadGate& preloads)
    : options_(std::move(options)),
      registry_(registry),
      models_(models),
      admission_(admission),
      access_(access),
      leases_(leases),
      preloads_(preloads) {}

absl::Status AcquireService::Acquire(const Caller& caller, const v1::AcquireRequest& req,
                                     v1::AcquireResponse* resp, std::string* model,
                                     metrics::AcquireResult* result) {
  const Outcome o = Serve(caller, req, resp, model);
  *result = o.result;
  Count(o.result);
  return o.status;
}

AcquireService::Outcome AcquireService::Serve(const Caller& caller, const v1::AcquireRequest& req,
                                              v1::AcquireResponse* resp, std::string* model) {
  auto layout = admission_.LayoutFrom(req.layout());
  if (!layout.ok()) return {AcquireResult::kError, layout.status()};
  auto asked_env = admission_.EnvFrom(req.env());
  if (!asked_env.ok()) return {AcquireResult::kError, asked_env.status()};
  Ask ask{caller,
          req,
          *model,
          *layout,
          asked_env->env,
          asked_env->device_uuid,
          caller.DeadlineOr(options_.acquire_wait)};
  std::optional<Outcome> resolved;
  if (req.target_case() == v1::AcquireRequest::kFingerprint) {
    resolved = ResolveFingerprint(ask);
  } else if (req.target_case() == v1::AcquireRequest::kModel) {
    resolved = ResolveModel(ask);
  } else {
    resolved = {AcquireResult::kError,
                absl::InvalidArgumentError("Acquire: set either model or fingerprint")};
  }
  if (resolved) return *resolved;

  std::shared_ptr<cache::Entry> e = admission_.FindOn(ask.fp, ask.device);
  if (e && !ask.opened && registry_.StateOf(e) == cache::State::kReady) {
    // By fingerprint: the files this entry was loaded from must still be those versions.
    if (auto changed = load::ChangedFiles(e->files); !changed.empty()) {
      const std::string what = absl::StrJoin(changed, "; ");
      registry_.MarkStale(e, what);
      return {AcquireResult::kStale,
              absl::FailedPreconditionError(absl::StrCat(
                  "stale: fingerprint ", ask.fp.substr(0, 12), " (model '", e->model, "'): ", what,
                  "; the cached weights are those of the earlier version"))};
    }
  }
  const bool absent = !e || registry_.StateOf(e) == cache::State::kFailed;
  if (absent) {
    if (auto src = admission_.PeerSource(ask.fp, ask.device)) return FromPeer(ask, src, resp);
  }
  if (e && registry_.StateOf(e) == cache::State::kFailed && !req.load_on_miss()) {
    return {AcquireResult::kError, registry_.WaitReady(e, std::chrono::steady_clock::now())};
  }
  if (absent) return OnMiss(ask, resp);
  return FromEntry(ask, e, resp);
}

std::optional<AcquireService::Outcome> AcquireService::ResolveFingerprint(Ask& ask) {
  ask.fp = ask.req.fingerprint();
  auto all = registry_.FindAll(ask.fp);
  if (all.empty()) {
    return Outcome{AcquireResult::kMiss,
                   absl::NotFoundError(absl::StrCat("no cached entry has fingerprint ", ask.fp))};
  }
  ask.model = all.front()->model;
  for (const auto& e : all) {
    Object object = access_.ModelObject(e->model);
    object.tenant = e->inputs.env.tenant;
    if (auto s = access_.Check(ask.caller, Verb::kAcquire, object); !s.ok()) {
      return Outcome{AcquireResult::kDenied, s};
    }
  }
  return std::nullopt;
}

std::optional<AcquireService::Outcome> AcquireService::ResolveModel(Ask& ask) {
  const std::string& name = ask.req.model();
  ask.model = name;
  if (auto s = access_.Check(ask.caller, Verb::kAcquire, access_.ModelObject(name)); !s.ok()) {
    return Outcome{AcquireResult::kDenied, s};
  }
  auto tenant = access_.TenantFor(ask.caller, name);
  if (!tenant.ok()) return Outcome{AcquireResult::kDenied, tenant.status()};
  ask.env.tenant = *tenant;
  if (auto s = preloads_.Await(name, ask.waits(), ask.deadline, ask.caller.gone); !s.ok()) {
    return Outcome{AcquireResult::kMiss, s};
  }
  auto o = models_.Open(name, false);
  if (!o.ok()) {
    auto code = o.status().code();
    return Outcome{code == absl::StatusCode::kUnimplemented ? AcquireResult::kRejected
                   : code == absl::StatusCode::kNotFound    ? AcquireResult::kMiss
                                                            : AcquireResult::kError,
                   o.status()};
  }
  ask.opened = *o;
  // The asked spec's files as they are now (a stat per file): a cached entry loaded from
  // earlier versions is never a hit.
  if (const std::string changed = CheckStale(ask.opened); !changed.empty()) {
    if (auto refused = Refresh(ask, changed)) return refused;
  }
  ask.asked = ask.AskedInputs(*ask.opened);
  ask.fp = ask.asked.Digest();
  return std::nullopt;
}

std::optional<AcquireService::Outcome> AcquireService::Refresh(Ask& ask,
                                                               const std::string& changed) {
  const std::string& name = ask.req.model();
  const std::string old_fp = ask.AskedInputs(*ask.opened).Digest();
  const auto old_entries = registry_.FindAll(old_fp);
  if (!old_entries.empty() && !ask.req.load_on_miss()) {
    return Outcome{AcquireResult::kStale,
                   absl::FailedPreconditionError(absl::StrCat(
                       "stale: model '", name, "': ", changed,
                       "; the cached weights are those of the earlier version. Load it again "
                       "(weightcachectl load ",
                       name, ") or ask with load_on_miss"))};
  }
  // Identify the new contents (only the changed files are hashed) and go on with them.
  auto fresh = models_.Open(name, /*refresh=*/true);
  if (!fresh.ok()) {
    return Outcome{
        old_entries.empty() ? AcquireResult::kError : AcquireResult::kStale,
        absl::Status(fresh.status().code(), absl::StrCat("model '", name, "': ", changed, "; ",
                                                         fresh.status().message()))};
  }
  ask.opened = *fresh;
  if (ask.AskedInputs(*ask.opened).Digest() != old_fp) {
    // The earlier version's entries: freed now (or once their clients let go).
    for (const auto& old : old_entries) registry_.Evict(old->key, "stale");
  }
  return std::nullopt;
}

std::string AcquireService::CheckStale(const std::shared_ptr<const load::OpenedModel>& opened) {
  const std::vector<std::string> changed = opened->ChangedFiles();
  if (changed.empty()) return "";
  std::string what = absl::StrJoin(changed, "; ");
  // The entries loaded from the earlier versions: this spec's content in any layout.
  for (const auto& s : registry_.Snapshot()) {
    if (s.state != cache::State::kReady) continue;
    if (opened->Inputs(s.inputs.layout, s.inputs.env).Digest() != s.fingerprint) continue;
    if (auto e = registry_.Find({s.fingerprint, s.device_uuid})) registry_.MarkStale(e, what);
  }
  return what;
}

AcquireService::Outcome AcquireService::FromPeer(Ask& ask, const std::shared_ptr<cache::Entry>& src,
                                                 v1::AcquireResponse* resp) {
  if (options_.peer_policy == PeerPolicy::kMiss) {
    return {AcquireResult::kMiss, absl::NotFoundError(absl::StrCat(
                                      "model '", ask.model, "' (fingerprint ", ask.fp.substr(0, 12),
                                      ") is cached on ", src->device_uuid, ", not on the asked ",
                                      ask.device, ", and the daemon's --peer_policy is miss"))};
  }
  if (registry_.StateOf(src) == cache::State::kLoading) {
    if (!ask.waits()) {
      return {AcquireResult::kMiss,
              absl::UnavailableError(
                  absl::StrCat("model '", ask.model, "' is still loading on ", src->device_uuid,
                               "; ask with wait_ready to wait for it and a copy to ", ask.device))};
    }
    if (auto s = registry_.WaitReady(src, ask.deadline, ask.caller.gone); !s.ok()) {
      return {AcquireResult::kError, s};
    }
  }
  auto copy = admission_.StartPeerCopy(src, ask.device);
  if (!copy.ok()) return {AcquireResult::kError, copy.status()};
  if (auto s = registry_.WaitReady(*copy, ask.deadline, ask.caller.gone); !s.ok()) {
    return {AcquireResult::kError, s};
  }
  if (auto s = FillLease(*copy, ask.model, ask.caller, ask.req.packed_manifest(), resp); !s.ok()) {
    return {AcquireResult::kError, s};
  }
  return {AcquireResult::kPeerCopy, absl::OkStatus()};
}

AcquireService::Outcome AcquireService::OnMiss(Ask& ask, v1::AcquireResponse* resp) {
  if (!ask.opened) {
    return {AcquireResult::kMiss,
            absl::NotFoundError(
                absl::StrCat("no entry with fingerprint ", ask.fp, " is cached on ", ask.device))};
  }
  // Published weights (a recipe) come only from their engine: never loaded on a miss.
  const bool servable = ask.asked.dtype == ask.opened->dtype &&
                        ask.asked.quant_method == ask.opened->quantization.method &&
                        ask.env.recipe.empty();
  if (!ask.req.load_on_miss() || !servable) return Diagnose(ask);
  Object object = access_.ModelObject(ask.model);
  object.undeclared_placement =
      admission_.UndeclaredPlacement(ask.opened->spec, ask.layout, ask.env, ask.device);
  if (auto s = access_.Check(ask.caller, Verb::kLoad, object); !s.ok()) {
    return {AcquireResult::kDenied, s};
  }
  auto started = admission_.StartLoad(ask.opened, ask.layout, ask.env, ask.device);
  if (!started.ok()) return {AcquireResult::kError, started.status()};
  if (auto s = registry_.WaitReady(*started, ask.deadline, ask.caller.gone); !s.ok()) {
    return {AcquireResult::kError, s};
  }
  if (auto f = FillLease(*started, ask.model, ask.caller, ask.req.packed_manifest(), resp);
      !f.ok()) {
    return {AcquireResult::kError, f};
  }
  return {AcquireResult::kMiss, absl::OkStatus()};
}

// Another rank of the same model is a miss for this rank (listing the cached ones); anything
// else that differs is a mismatch, explained field by field.
AcquireService::Outcome AcquireService::Diagnose(const Ask& ask) {
  const std::string& name = ask.req.model();
  std::vector<int> cached_ranks;
  std::vector<spec::FieldDiff> mismatch;
  for (const auto& other : registry_.FindByModel(name)) {
    // Another namespace's private copy explains nothing to this caller (and is not its
    // business).
    if (other->inputs.env.tenant != ask.asked.env.tenant) continue;
    auto diffs = spec::Diff(other->inputs, ask.asked);
    if (diffs.empty()) continue;
    const bool rank_only = std::all_of(diffs.begin(), diffs.end(), [](const auto& d) {
      return d.field == "tp_rank" || d.field == "pp_rank";
    });
    if (rank_only) {
      cached_ranks.push_back(other->inputs.layout.tp_rank);
    } else if (mismatch.empty() || diffs.size() < mismatch.size()) {
      mismatch = std::move(diffs);  // the closest cached entry explains the mismatch
    }
  }
  if (cached_ranks.empty() && !mismatch.empty()) {
    return {AcquireResult::kMismatch,
            absl::FailedPreconditionError(absl::StrCat(
                "model '", name, "': cached weights do not fit: ", spec::FormatDiff(mismatch)))};
  }
  std::sort(cached_ranks.begin(), cached_ranks.end());
  cached_ranks.erase(std::unique(cached_ranks.begin(), cached_ranks.end()), cached_ranks.end());
  return {AcquireResult::kMiss,
          absl::NotFoundError(absl::StrCat(
              "model '", name, "' is not cached for tp ", ask.layout.tp_rank, "/",
              ask.layout.tp_size, " on ", ask.env.compute_capability,
              ask.device.empty() ? "" : absl::StrCat(" (", ask.device, ")"), " (fingerprint ",
              ask.fp.substr(0, 12), ")",
              cached_ranks.empty()
                  ? ""
                  : absl::StrCat("; cached tp ranks: ", absl::StrJoin(cached_ranks, ", ")),
              "; load it first (weightcachectl load ", name, ") or ask with load_on_miss"))};
}

AcquireService::Outcome AcquireService::FromEntry(Ask& ask, const std::shared_ptr<cache::Entry>& e,
                                                  v1::AcquireResponse* resp) {
  const bool was_ready = registry_.StateOf(e) == cache::State::kReady;
  if (!was_ready) {
    if (registry_.StateOf(e) == cache::State::kLoading && !ask.waits()) {
      return {AcquireResult::kMiss,
              absl::UnavailableError(absl::StrCat("model '", ask.model, "' is still loading (",
                                                  e->progress.done(), " of ", e->progress.total(),
                                                  " bytes); ask with wait_ready to wait"))};
    }
    if (auto s = registry_.WaitReady(e, ask.deadline, ask.caller.gone); !s.ok()) {
      return {AcquireResult::kError, s};
    }
  }
  if (auto s = FillLease(e, ask.model, ask.caller, ask.req.packed_manifest(), resp); !s.ok()) {
    return {AcquireResult::kError, s};
  }
  return {was_ready ? AcquireResult::kHit : AcquireResult::kMiss, absl::OkStatus()};
}

absl::Status AcquireService::FillLease(const std::shared_ptr<cache::Entry>& e,
                                       const std::string& name, const Caller& caller,
                                       bool packed_manifest, v1::AcquireResponse* resp) {
  WC_ASSIGN_OR_RETURN(LeaseIssuer::Issued issued,
                      leases_.Issue(e, name, caller, options_.before_lease));
  const std::shared_ptr<const load::LoadedModel>& content = issued.content;
  std::string model_dir = content->model_dir;
  // The asked spec: same content as the entry's (that is what the fingerprint says), and the
  // files a verify tool should compare with.
  if (auto spec = models_.Spec(name)) {
    resp->set_spec_yaml(models_.SpecYaml(name));
    model_dir = spec->model_dir;
  }
  resp->set_lease_id(issued.lease_id);
  resp->set_token(issued.token);
  LayoutToProto(e->inputs.layout, resp->mutable_layout());
  resp->set_fingerprint(e->fingerprint);
  resp->set_model(name);
  resp->set_backend(memory::BackendName(options_.backend));
  resp->set_device_uuid(content->device_uuid);
  resp->set_handle_socket(caller.slot.empty() ? options_.handle_socket
                                              : options_.slot_handle_socket);
  resp->set_total_bytes(content->plan.total_bytes);
  resp->set_content_id(content->content_id);
  resp->set_model_dir(model_dir);
  for (size_t i = 0; i < content->segments.size(); ++i) {
    auto* s = resp->add_segments();
    s->set_index(static_cast<uint32_t>(i));
    s->set_size(content->segments[i]->size());
  }
  // Tensors, then the fused views that alias them (engine layouts); the client sorts.
  if (packed_manifest) {
    resp->set_tensor_manifest(*manifests_.Get(content));
    return absl::OkStatus();
  }
  AddTensorEntries(*content, resp->mutable_tensors());
  return absl::OkStatus();
}

void AcquireService::Count(AcquireResult r) {
  switch (r) {
    case AcquireResult::kHit:
      hits_++;
      break;
    case AcquireResult::kMiss:
      misses_++;
      break;
    case AcquireResult::kMismatch:
      mismatches_++;
      break;
    case AcquireResult::kRejected:
      rejected_++;
      break;
    case AcquireResult::kPeerCopy:
      peer_copies_++;
      break;
    case AcquireResult::kStale:
      stale_++;
      break;
    case AcquireResult::kDenied:
      denied_++;
      break;
    default:
      errors_++;
      break;
  }
}

AcquireService::Counts AcquireService::counts() const {
  return {hits_, misses_, mismatches_, rejected_, errors_, peer_copies_, stale_, denied_};
}

}  // namespace weightcache::server
