#include "pkg/server/internal/integrity_service.h"

#include "absl/strings/str_cat.h"
#include "pkg/integrity/digest.h"
#include "pkg/integrity/segment_digest.h"
#include "pkg/metrics/metrics.h"
#include "pkg/server/messages/layout_proto.h"
#include "pkg/server/wire/handle_message.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {

IntegrityService::IntegrityService(Options options, memory::BackendKind kind,
                                   cache::Registry& registry, ModelCatalog& models,
                                   Admission& admission, const Access& access, Links links,
                                   metrics::Metrics* metrics, Scrubber::DigestHook digest_hook)
    : registry_(registry),
      models_(models),
      admission_(admission),
      access_(access),
      links_(std::move(links)),
      metrics_(metrics),
      reload_interval_(options.reload_interval) {
  // The scrub key is drawn now, at the daemon's start (getrandom may block until the kernel's
  // pool is ready, which is better met here than in the first fill).
  (void)integrity::ProcessKey();
  // Every fill (disk, peer copy, publish commit, keeper adoption) is digested before the entry
  // is ready: the scrub digest (this process's key), which later passes compare, and the
  // cryptographic one, which records carry (keeper, peers) and adoption checks. A GPU
  // computes both; the host backend hashes on the CPU.
  registry_.SetDigester([kind](const cache::Entry& e, const load::LoadedModel& m)
                            -> absl::StatusOr<std::vector<integrity::SegmentDigest>> {
    std::vector<integrity::SegmentDigest> out;
    out.reserve(m.segments.size());
    // Part of the fill: a shutdown that cancels the load stops the digest at its next 64 MiB
    // piece, as it stops the read or copy at its next chunk (on the host backend, 3.5 GB/s a
    // core, a 120 GiB entry's digest would hold the teardown for half a minute).
    integrity::Pace pace;
    pace.stop = [&e] { return e.progress.cancelled(); };
    pace.threads = integrity::FillDigestThreads();  // the entry waits for it
    for (const auto& seg : m.segments) {
      auto d = integrity::DigestSegment(kind, *seg, pace, integrity::Want::kScrubAndCrypto);
      if (!d.ok()) {
        return absl::Status(
            d.status().code(),
            absl::StrCat("model ", e.model, " segment ", out.size(), ": ", d.status().message()));
      }
      out.push_back(std::move(d).value());
    }
    return out;
  });
  scrubber_ = std::make_unique<Scrubber>(
      options.scrub, kind, registry_, metrics_,
      [this](const std::shared_ptr<cache::Entry>& e, const std::string& what) {
        OnCorrupt(e, what);
      },
      std::move(digest_hook));
}

void IntegrityService::OnCorrupt(const std::shared_ptr<cache::Entry>& e, const std::string& what) {
  const std::vector<std::string> leases = registry_.LeaseIds(e);
  // Until the clean copy's load is registered, Acquires by the model's name wait for it
  // (as during a preload) instead of answering a miss between the eviction and the reload.
  // A draining entry serves nobody new: nothing to wait for.
  const bool serving = registry_.StateOf(e) == cache::State::kReady;
  const bool held = serving && links_.hold(e->model);
  auto end_pending = [&] {
    if (held) links_.release(e->model);
  };
  // Out of service first: from here no Acquire is handed this entry.
  cache::State was = cache::State::kGone;
  if (registry_.MarkCorrupt(e, what, &was) == cache::Registry::Evicted::kNone) {
    end_pending();
    return;  // already out of service (found twice at once)
  }
  const bool draining = was == cache::State::kDraining;
  WC_LOG_ERROR(
      "integrity: model %s rank %d (%s, from %s%s) is corrupt, its memory changed after it was "
      "sealed: %s; out of service, %d lease holder(s) told, freed when their leases end",
      e->model, e->inputs.layout.tp_rank, e->key.ToString(), e->source,
      draining ? ", evicted and draining" : "", what, leases.size());
  if (metrics_ != nullptr) metrics_->OnIntegrityFailure(e->model);
  // Issue 48: a finding with no lease on it used to leave no trace once its entry was gone.
  // Recorded before the holders are told (a holder that hears of it finds it in Status), and
  // they are told before the reload is decided (opening the model may read its files).
  const uint64_t seq =
      Record(e, what, was, leases.size(),
             draining ? "none: it was evicted before it was found (draining), nothing serves it"
                      : "deciding");
  const std::string line = FormatEventLine(kEventCorrupt, absl::StrCat(e->model, ": ", what));
  for (const auto& id : leases) links_.notify(id, line);
  if (!draining) SetReload(seq, ReloadCorrupt(e));
  end_pending();
}

std::string IntegrityService::ReloadCorrupt(const std::shared_ptr<cache::Entry>& e) {
  // The keeper holds the same memory: it is no clean source. The checkpoint is; weights an
  // engine published come back when it publishes them again.
  if (e->source == "publish") {
    WC_LOG_WARN(
        "integrity: model %s was published by an engine: no clean copy is loaded until it "
        "is published again",
        e->model);
    return "none: published by an engine, it comes back when published again";
  }
  // Issue 48: a model corrupted over and over reloaded each time, and each reload may evict
  // other tenants' unleased entries for the budget. At most one reload per key and interval.
  const auto now = std::chrono::steady_clock::now();
  {
    MutexLock l(mu_);
    auto last = reloaded_.find(e->key);
    if (last != reloaded_.end() && now - last->second < reload_interval_) {
      std::string why = absl::StrCat(
          "none: found corrupt again ",
          std::chrono::duration_cast<std::chrono::seconds>(now - last->second).count(),
          " s after its last clean copy was loaded; at most one reload per ",
          std::chrono::duration_cast<std::chrono::seconds>(reload_interval_).count(), " s",
          " (--corrupt_reload_interval), so that it cannot evict other tenants' entries each "
          "time; an Acquire that may load, or weightcachectl load, loads it");
      WC_LOG_ERROR("integrity: clean copy of model %s rank %d on %s not loaded: %s", e->model,
                   e->inputs.layout.tp_rank, e->device_uuid, why);
      return why;
    }
  }
  auto opened = models_.Open(e->model, /*refresh=*/false);
  if (!opened.ok()) {
    WC_LOG_ERROR("integrity: clean copy of model %s not loaded: %s", e->model,
                 std::string(opened.status().message()));
    return absl::StrCat("none: ", opened.status().message());
  }
  auto started = admission_.StartLoad(*opened, e->inputs.layout, e->inputs.env, e->device_uuid);
  if (!started.ok()) {
    WC_LOG_ERROR("integrity: clean copy of model %s rank %d on %s not loaded: %s", e->model,
                 e->inputs.layout.tp_rank, e->device_uuid, std::string(started.status().message()));
    return absl::StrCat("none: ", started.status().message());
  }
  {
    MutexLock l(mu_);
    reloaded_[e->key] = now;
  }
  WC_LOG_INFO("integrity: loading a clean copy of model %s rank %d on %s (fingerprint %s)",
              e->model, e->inputs.layout.tp_rank, e->device_uuid,
              (*started)->fingerprint.substr(0, 12));
  return absl::StrCat("loading a clean copy (fingerprint ", (*started)->fingerprint.substr(0, 12),
                      ")");
}

uint64_t IntegrityService::Record(const std::shared_ptr<cache::Entry>& e, const std::string& what,
                                  cache::State was, size_t told, const std::string& reload) {
  Finding f;
  f.at = std::chrono::steady_clock::now();
  f.info.set_model(e->model);
  f.info.set_fingerprint(e->fingerprint);
  f.info.set_device_uuid(e->device_uuid);
  LayoutToProto(e->inputs.layout, f.info.mutable_layout());
  f.info.set_detail(what);
  f.info.set_was(cache::StateName(was));
  f.info.set_leases_told(static_cast<uint32_t>(told));
  f.info.set_reload(reload);
  MutexLock l(mu_);
  f.seq = ++next_seq_;
  findings_.push_back(std::move(f));
  while (findings_.size() > kMaxFindings) findings_.pop_front();
  return next_seq_;
}

void IntegrityService::SetReload(uint64_t seq, const std::string& reload) {
  MutexLock l(mu_);
  for (auto& f : findings_) {
    if (f.seq == seq) f.info.set_reload(reload);
  }
}

void IntegrityService::AppendFindings(v1::StatusResponse* resp) const {
  const auto now = std::chrono::steady_clock::now();
  MutexLock l(mu_);
  for (const auto& f : findings_) {
    auto* out = resp->add_integrity_findings();
    *out = f.info;
    out->set_seconds_ago(std::chrono::duration<double>(now - f.at).count());
  }
}

absl::Status IntegrityService::VerifyResident(const Caller& caller,
                                              const v1::VerifyResidentRequest& req,
                                              v1::VerifyResidentResponse* resp) {
  WC_RETURN_IF_ERROR(access_.Authorize(caller, Verb::kVerify, {}));
  if (req.model().empty()) return absl::InvalidArgumentError("VerifyResident: model is required");
  // The model's entries: those it loaded and those of other names that it reproduces.
  auto opened = models_.Open(req.model(), /*refresh=*/false);
  std::vector<std::shared_ptr<cache::Entry>> entries;
  for (const auto& e : registry_.ReadyEntries()) {
    bool mine = e->model == req.model();
    if (!mine && opened.ok()) mine = (*opened)->Reproduces(e->inputs, e->fingerprint);
    if (mine) entries.push_back(e);
  }
  if (entries.empty()) {
    return absl::NotFoundError(
        absl::StrCat("VerifyResident: model '", req.model(), "' has no ready entry"));
  }
  for (const auto& e : entries) {
    const Scrubber::Result r = scrubber_->Verify(e, /*bytes_per_second=*/0);
    auto* c = resp->add_entries();
    c->set_fingerprint(e->fingerprint);
    c->set_device_uuid(e->device_uuid);
    LayoutToProto(e->inputs.layout, c->mutable_layout());
    c->set_segments(static_cast<uint32_t>(r.segments));
    c->set_bytes(r.bytes);
    c->set_seconds(r.seconds);
    c->set_result(r.kind == Scrubber::Result::Kind::kClean     ? "clean"
                  : r.kind == Scrubber::Result::Kind::kCorrupt ? "corrupt"
                                                               : "error");
    c->set_detail(r.detail);
  }
  return absl::OkStatus();
}

}  // namespace weightcache::server
