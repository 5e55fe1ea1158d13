// Acquire: the whole policy of serving a model-rank to an engine — the stale check against
// the files on disk, a hit, a peer copy from another device of the node, a load on a miss
// (placement checked by the policy), and the diagnosis of a miss or a mismatch field by
// field — and the lease it ends in (FillLease). Part of Daemon::Impl (daemon_impl.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "pkg/load/loader.h"
#include "pkg/load/plan.h"
#include "pkg/server/internal/daemon_impl.h"
#include "pkg/server/messages/layout_proto.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {

std::string Daemon::Impl::CheckStale(const std::shared_ptr<const load::OpenedModel>& opened) {
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

void Daemon::Impl::Count(metrics::AcquireResult r) {
  switch (r) {
    case metrics::AcquireResult::kHit:
      hits_++;
      break;
    case metrics::AcquireResult::kMiss:
      misses_++;
      break;
    case metrics::AcquireResult::kMismatch:
      mismatches_++;
      break;
    case metrics::AcquireResult::kRejected:
      rejected_++;
      break;
    case metrics::AcquireResult::kPeerCopy:
      peer_copies_++;
      break;
    case metrics::AcquireResult::kStale:
      stale_++;
      break;
    case metrics::AcquireResult::kDenied:
      denied_++;
      break;
    default:
      errors_++;
      break;
  }
}

absl::Status Daemon::Impl::Acquire(const Caller& caller, const v1::AcquireRequest& req,
                                   v1::AcquireResponse* resp, std::string* model,
                                   metrics::AcquireResult* result) {
  using metrics::AcquireResult;
  *result = AcquireResult::kError;
  auto finish = [&](AcquireResult r, absl::Status s) {
    *result = r;
    Count(r);
    return s;
  };
  auto layout = admission_.LayoutFrom(req.layout());
  if (!layout.ok()) return finish(AcquireResult::kError, layout.status());
  auto asked_env = admission_.EnvFrom(req.env());
  if (!asked_env.ok()) return finish(AcquireResult::kError, asked_env.status());
  // The client's environment; a private model's copy is also the caller's namespace's (set
  // below from the pod on its slot, never from the request).
  spec::Environment env = asked_env->env;
  // The registry is keyed by (fingerprint, device): an empty asked device takes the entry
  // on any device; a named one takes that device's entry, or a peer copy of another's.
  const std::string& device = asked_env->device_uuid;
  const auto deadline = caller.DeadlineOr(options_.acquire_wait);

  std::string fp;
  std::shared_ptr<const load::OpenedModel> opened;  // model target only
  spec::FingerprintInputs asked;
  auto asked_inputs = [&](const load::OpenedModel& m) {
    spec::FingerprintInputs in = m.Inputs(*layout, env);
    if (!req.dtype().empty()) in.dtype = req.dtype();
    if (!req.quantization().empty()) in.quant_method = req.quantization();
    return in;
  };
  if (req.target_case() == v1::AcquireRequest::kFingerprint) {
    fp = req.fingerprint();
    auto all = registry_.FindAll(fp);
    if (all.empty()) {
      return finish(AcquireResult::kMiss,
                    absl::NotFoundError(absl::StrCat("no cached entry has fingerprint ", fp)));
    }
    *model = all.front()->model;
    for (const auto& e : all) {
      Object object = access_->ModelObject(e->model);
      object.tenant = e->inputs.env.tenant;
      if (auto s = access_->Check(caller, Verb::kAcquire, object); !s.ok()) {
        return finish(AcquireResult::kDenied, s);
      }
    }
  } else if (req.target_case() == v1::AcquireRequest::kModel) {
    *model = req.model();
    if (auto s = access_->Check(caller, Verb::kAcquire, access_->ModelObject(req.model()));
        !s.ok()) {
      return finish(AcquireResult::kDenied, s);
    }
    auto tenant = access_->TenantFor(caller, req.model());
    if (!tenant.ok()) {
      return finish(AcquireResult::kDenied, tenant.status());
    }
    env.tenant = *tenant;
    if (auto s = preloads_->Await(req.model(), req.wait_ready() || req.load_on_miss(), deadline,
                                  caller.gone);
        !s.ok()) {
      return finish(AcquireResult::kMiss, s);
    }
    auto o = models_.Open(req.model(), false);
    if (!o.ok()) {
      auto code = o.status().code();
      return finish(code == absl::StatusCode::kUnimplemented ? AcquireResult::kRejected
                    : code == absl::StatusCode::kNotFound    ? AcquireResult::kMiss
                                                             : AcquireResult::kError,
                    o.status());
    }
    opened = *o;
    // The asked spec's files as they are now (a stat per file): a cached entry loaded from
    // earlier versions is never a hit.
    if (const std::string changed = CheckStale(opened); !changed.empty()) {
      const std::string old_fp = asked_inputs(*opened).Digest();
      const auto old_entries = registry_.FindAll(old_fp);
      if (!old_entries.empty() && !req.load_on_miss()) {
        return finish(AcquireResult::kStale,
                      absl::FailedPreconditionError(absl::StrCat(
                          "stale: model '", req.model(), "': ", changed,
                          "; the cached weights are those of the earlier version. Load it again "
                          "(weightcachectl load ",
                          req.model(), ") or ask with load_on_miss")));
      }
      // Identify the new contents (only the changed files are hashed) and go on with them.
      auto fresh = models_.Open(req.model(), /*refresh=*/true);
      if (!fresh.ok()) {
        return finish(
            old_entries.empty() ? AcquireResult::kError : AcquireResult::kStale,
            absl::Status(fresh.status().code(), absl::StrCat("model '", req.model(), "': ", changed,
                                                             "; ", fresh.status().message())));
      }
      opened = *fresh;
      if (asked_inputs(*opened).Digest() != old_fp) {
        // The earlier version's entries: freed now (or once their clients let go).
        for (const auto& old : old_entries) registry_.Evict(old->key, "stale");
      }
    }
    asked = asked_inputs(*opened);
    fp = asked.Digest();
  } else {
    return finish(AcquireResult::kError,
                  absl::InvalidArgumentError("Acquire: set either model or fingerprint"));
  }

  std::shared_ptr<cache::Entry> e = admission_.FindOn(fp, device);
  if (e && !opened && registry_.StateOf(e) == cache::State::kReady) {
    // By fingerprint: the files this entry was loaded from must still be those versions.
    if (auto changed = load::ChangedFiles(e->files); !changed.empty()) {
      const std::string what = absl::StrJoin(changed, "; ");
      registry_.MarkStale(e, what);
      return finish(AcquireResult::kStale,
                    absl::FailedPreconditionError(absl::StrCat(
                        "stale: fingerprint ", fp.substr(0, 12), " (model '", e->model,
                        "'): ", what, "; the cached weights are those of the earlier version")));
    }
  }
  if (!e || registry_.StateOf(e) == cache::State::kFailed) {
    // Resident on another device of this node: serve it per the peer policy.
    if (auto src = admission_.PeerSource(fp, device)) {
      if (options_.peer_policy == PeerPolicy::kMiss) {
        return finish(AcquireResult::kMiss,
                      absl::NotFoundError(
                          absl::StrCat("model '", *model, "' (fingerprint ", fp.substr(0, 12),
                                       ") is cached on ", src->device_uuid, ", not on the asked ",
                                       device, ", and the daemon's --peer_policy is miss")));
      }
      if (registry_.StateOf(src) == cache::State::kLoading) {
        if (!req.wait_ready() && !req.load_on_miss()) {
          return finish(AcquireResult::kMiss,
                        absl::UnavailableError(absl::StrCat(
                            "model '", *model, "' is still loading on ", src->device_uuid,
                            "; ask with wait_ready to wait for it and a copy to ", device)));
        }
        if (auto s = registry_.WaitReady(src, deadline, caller.gone); !s.ok()) {
          return finish(AcquireResult::kError, s);
        }
      }
      auto copy = admission_.StartPeerCopy(src, device);
      if (!copy.ok()) return finish(AcquireResult::kError, copy.status());
      e = *copy;
      if (auto s = registry_.WaitReady(e, deadline, caller.gone); !s.ok()) {
        return finish(AcquireResult::kError, s);
      }
      if (auto s = FillLease(e, *model, caller, req.packed_manifest(), resp); !s.ok())
        return finish(AcquireResult::kError, s);
      return finish(AcquireResult::kPeerCopy, absl::OkStatus());
    }
  }
  if (e && registry_.StateOf(e) == cache::State::kFailed && !req.load_on_miss()) {
    return finish(AcquireResult::kError, registry_.WaitReady(e, std::chrono::steady_clock::now()));
  }
  if (!e || registry_.StateOf(e) == cache::State::kFailed) {
    if (!opened) {
      return finish(AcquireResult::kMiss,
                    absl::NotFoundError(
                        absl::StrCat("no entry with fingerprint ", fp, " is cached on ", device)));
    }
    // Published weights (a recipe) come only from their engine: never loaded on a miss.
    bool servable = asked.dtype == opened->dtype &&
                    asked.quant_method == opened->quantization.method && env.recipe.empty();
    if (req.load_on_miss() && servable) {
      Object object = access_->ModelObject(*model);
      object.undeclared_placement =
          admission_.UndeclaredPlacement(opened->spec, *layout, env, device);
      if (auto s = access_->Check(caller, Verb::kLoad, object); !s.ok()) {
        return finish(AcquireResult::kDenied, s);
      }
      auto started = admission_.StartLoad(opened, *layout, env, device);
      if (!started.ok()) return finish(AcquireResult::kError, started.status());
      e = *started;
      auto s = registry_.WaitReady(e, deadline, caller.gone);
      if (!s.ok()) return finish(AcquireResult::kError, s);
      if (auto f = FillLease(e, *model, caller, req.packed_manifest(), resp); !f.ok())
        return finish(AcquireResult::kError, f);
      return finish(AcquireResult::kMiss, absl::OkStatus());
    }
    // Another rank of the same model is a miss for this rank (listing the cached ones);
    // anything else that differs is a mismatch, explained field by field.
    std::vector<int> cached_ranks;
    std::vector<spec::FieldDiff> mismatch;
    for (const auto& other : registry_.FindByModel(req.model())) {
      // Another namespace's private copy explains nothing to this caller (and is not its
      // business).
      if (other->inputs.env.tenant != asked.env.tenant) continue;
      auto diffs = spec::Diff(other->inputs, asked);
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
      return finish(AcquireResult::kMismatch,
                    absl::FailedPreconditionError(absl::StrCat(
                        "model '", req.model(),
                        "': cached weights do not fit: ", spec::FormatDiff(mismatch))));
    }
    std::sort(cached_ranks.begin(), cached_ranks.end());
    cached_ranks.erase(std::unique(cached_ranks.begin(), cached_ranks.end()), cached_ranks.end());
    return finish(
        AcquireResult::kMiss,
        absl::NotFoundError(absl::StrCat(
            "model '", req.model(), "' is not cached for tp ", layout->tp_rank, "/",
            layout->tp_size, " on ", env.compute_capability,
            device.empty() ? "" : absl::StrCat(" (", device, ")"), " (fingerprint ",
            fp.substr(0, 12), ")",
            cached_ranks.empty()
                ? ""
                : absl::StrCat("; cached tp ranks: ", absl::StrJoin(cached_ranks, ", ")),
            "; load it first (weightcachectl load ", req.model(), ") or ask with load_on_miss")));
  }

  bool was_ready = registry_.StateOf(e) == cache::State::kReady;
  if (!was_ready) {
    if (registry_.StateOf(e) == cache::State::kLoading && !req.wait_ready() &&
        !req.load_on_miss()) {
      return finish(AcquireResult::kMiss,
                    absl::UnavailableError(absl::StrCat(
                        "model '", *model, "' is still loading (", e->progress.done(), " of ",
                        e->progress.total(), " bytes); ask with wait_ready to wait")));
    }
    auto s = registry_.WaitReady(e, deadline, caller.gone);
    if (!s.ok()) return finish(AcquireResult::kError, s);
  }
  if (auto s = FillLease(e, *model, caller, req.packed_manifest(), resp); !s.ok())
    return finish(AcquireResult::kError, s);
  return finish(was_ready ? AcquireResult::kHit : AcquireResult::kMiss, absl::OkStatus());
}

absl::Status Daemon::Impl::FillLease(const std::shared_ptr<cache::Entry>& e,
                                     const std::string& name, const Caller& caller,
                                     bool packed_manifest, v1::AcquireResponse* resp) {
  WC_ASSIGN_OR_RETURN(LeaseManager::Issued issued,
                      leases_.Issue(e, name, caller.cred, caller.slot, BeforeLeaseHook()));
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
  resp->set_backend(memory::BackendName(backend_->kind()));
  resp->set_device_uuid(content->device_uuid);
  resp->set_handle_socket(caller.slot.empty() ? handle_path()
                                              : SlotHandleSocketInContainer(
                                                    options_.socket_dir, options_.namespace_rules));
  resp->set_total_bytes(content->plan.total_bytes);
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

}  // namespace weightcache::server
