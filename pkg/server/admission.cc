#include "pkg/server/internal/admission.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/integrity/digest.h"
#include "pkg/load/loader.h"
#include "pkg/load/plan.h"
#include "pkg/server/internal/group_load.h"
#include "pkg/util/bytes.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {
namespace {

constexpr uint32_t kMaxLayoutSize = 4096;

std::string Join(const std::vector<std::string>& v) {
  return v.empty() ? "none" : absl::StrJoin(v, ", ");
}

}  // namespace

const char* PeerPolicyName(PeerPolicy p) {
  switch (p) {
    case PeerPolicy::kCopy:
      return "copy";
    case PeerPolicy::kHost:
      return "host";
    case PeerPolicy::kMiss:
      return "miss";
  }
  return "unknown";
}

absl::StatusOr<PeerPolicy> ParsePeerPolicy(const std::string& name) {
  for (PeerPolicy p : {PeerPolicy::kCopy, PeerPolicy::kHost, PeerPolicy::kMiss}) {
    if (name == PeerPolicyName(p)) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--peer_policy '", name, "' is unknown (expected copy, host or miss)"));
}

std::string DefaultDeviceForRank(const std::vector<memory::DeviceInfo>& devices, int rank) {
  if (devices.empty()) return "";
  std::vector<memory::DeviceInfo> sorted = devices;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.ordinal < b.ordinal; });
  return sorted[static_cast<size_t>(std::max(rank, 0)) % sorted.size()].uuid;
}

Admission::Admission(const DaemonOptions& options, memory::Backend* backend,
                     cache::Registry& registry, load::StagingPool* staging_pool)
    : options_(options), backend_(backend), registry_(registry), staging_pool_(staging_pool) {
  auto devices = backend_->Devices();
  daemon_cc_ = devices.empty() ? "cpu" : devices[0].compute_capability;
}

Admission::AskedEnv Admission::Placed(int rank) const {
  AskedEnv out;
  out.env.compute_capability = daemon_cc_;
  // Placement: rank r on the r-th device (by ordinal), so one daemon spreads a
  // tensor-parallel model's ranks over the node's GPUs.
  out.device_uuid = DefaultDeviceForRank(backend_->Devices(), rank);
  for (const auto& d : backend_->Devices()) {
    if (d.uuid == out.device_uuid) out.env.compute_capability = d.compute_capability;
  }
  return out;
}

absl::StatusOr<Admission::AskedEnv> Admission::EnvFrom(const v1::Environment& env) const {
  AskedEnv asked;
  spec::Environment& out = asked.env;
  out.compute_capability = daemon_cc_;
  if (!env.device_uuid().empty()) {
    std::vector<std::string> known;
    bool found = false;
    for (const auto& d : backend_->Devices()) {
      known.push_back(d.uuid);
      if (d.uuid == env.device_uuid()) {
        found = true;
        out.compute_capability = d.compute_capability;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device ", env.device_uuid(), " is not a device of this daemon's ",
          memory::BackendName(backend_->kind()), " backend (devices: ", Join(known), ")"));
    }
    asked.device_uuid = env.device_uuid();
  }
  if (!env.compute_capability().empty()) out.compute_capability = env.compute_capability();
  if (env.loader_format_version() != 0) {
    out.loader_format_version = static_cast<int>(env.loader_format_version());
  }
  out.engine = env.engine();
  out.engine_version = env.engine_version();
  out.framework_version = env.framework_version();
  out.recipe = env.recipe();
  return asked;
}

std::string Admission::UndeclaredPlacement(const spec::ModelSpec& s, const spec::Layout& l,
                                           const spec::Environment& env,
                                           const std::string& device_uuid) const {
  std::vector<std::string> why;
  if (l.tp_size != s.tp_size || l.pp_size != s.pp_size || l.pp_rank != s.pp_rank) {
    why.push_back(absl::StrCat("layout tp ", l.tp_rank, "/", l.tp_size, " pp ", l.pp_rank, "/",
                               l.pp_size, " is not its spec's (tp_size ", s.tp_size, ", pp ",
                               s.pp_rank, "/", s.pp_size, ")"));
  } else if (!s.tp_ranks.empty() &&
             std::find(s.tp_ranks.begin(), s.tp_ranks.end(), l.tp_rank) == s.tp_ranks.end()) {
    std::vector<std::string> ranks;
    for (int r : s.tp_ranks) ranks.push_back(std::to_string(r));
    why.push_back(absl::StrCat("tp rank ", l.tp_rank, " is not among its spec's tp_ranks (",
                               Join(ranks), ")"));
  }
  const std::string device =
      device_uuid.empty() ? DefaultDeviceForRank(backend_->Devices(), l.tp_rank) : device_uuid;
  for (const auto& d : backend_->Devices()) {
    if (d.uuid == device && d.compute_capability != env.compute_capability) {
      why.push_back(absl::StrCat("compute_capability ", env.compute_capability,
                                 " is not that of device ", device, " (", d.compute_capability,
                                 ")"));
    }
  }
  if (env.loader_format_version != spec::kLoaderFormatVersion) {
    why.push_back(absl::StrCat("loader_format_version ", env.loader_format_version,
                               " is not this loader's (", spec::kLoaderFormatVersion, ")"));
  }
  if (!env.engine.empty() || !env.engine_version.empty() || !env.framework_version.empty() ||
      !env.recipe.empty()) {
    why.emplace_back(
        "engine, engine_version, framework_version and recipe name published "
        "weights, not a load");
  }
  return absl::StrJoin(why, "; ");
}

absl::StatusOr<spec::Layout> Admission::LayoutFrom(const v1::Layout& l) const {
  uint32_t tp = l.tp_size() == 0 ? 1 : l.tp_size();
  uint32_t pp = l.pp_size() == 0 ? 1 : l.pp_size();
  if (tp > kMaxLayoutSize || pp > kMaxLayoutSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout: tp_size ", tp, " / pp_size ", pp, " exceeds ", kMaxLayoutSize));
  }
  if (l.tp_rank() >= tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout: tp_rank ", l.tp_rank(), " is not below tp_size ", tp));
  }
  if (l.pp_rank() >= pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout: pp_rank ", l.pp_rank(), " is not below pp_size ", pp));
  }
  return spec::Layout{static_cast<int>(tp), static_cast<int>(l.tp_rank()), static_cast<int>(pp),
                      static_cast<int>(l.pp_rank())};
}

absl::StatusOr<Admission::Prepared> Admission::Prepare(
    const std::shared_ptr<const load::OpenedModel>& model, const spec::Layout& layout,
    const spec::Environment& env, const std::string& device_uuid) {
  Prepared p;
  auto inputs = model->Inputs(layout, env);
  p.fingerprint = inputs.Digest();
  p.device =
      device_uuid.empty() ? DefaultDeviceForRank(backend_->Devices(), layout.tp_rank) : device_uuid;
  if (auto live = registry_.Find({p.fingerprint, p.device});
      live && registry_.StateOf(live) != cache::State::kFailed) {
    p.live = live;  // joined: loading or ready already
    return p;
  }
  // Admission from the plan (cheap: metadata only): the budget reserves this rank's bytes as
  // they will be allocated (each segment rounded up to the backend's granule), not the whole
  // checkpoint's; a plan that cannot be made fails here, before any entry exists.
  load::PlanOptions popts;
  popts.alignment = backend_->tensor_alignment();
  popts.max_segment_bytes = backend_->max_segment_bytes();
  popts.loader_reads_pieces = true;  // the loader reads strided shards and zeroes padding
  WC_ASSIGN_OR_RETURN(p.plan, load::PlanRank(*model, layout, popts));
  const uint64_t granule = std::max<uint64_t>(1, backend_->granularity());
  uint64_t reserve = 0;
  for (uint64_t b : p.plan.segment_bytes) reserve += RoundUp(b, granule);
  p.label = absl::StrCat("weightcache/", model->spec.name, "/", p.fingerprint.substr(0, 12));
  p.request.key = {p.fingerprint, p.device};
  p.request.model = model->spec.name;
  p.request.inputs = inputs;
  p.request.files = model->files;
  p.request.bytes = reserve;
  return p;
}

load::LoadOptions Admission::LoadOptionsFor() const {
  load::LoadOptions lopts;
  lopts.read_threads = options_.read_threads;
  lopts.staging_pool = staging_pool_;
  return lopts;
}

// The bytes must be those of the versions the fingerprint names.
static absl::Status FilesUnchanged(const load::OpenedModel& model) {
  if (auto changed = model.ChangedFiles(); !changed.empty()) {
    return absl::UnavailableError(absl::StrCat("model '", model.spec.name,
                                               "': files changed while loading (",
                                               absl::StrJoin(changed, "; "), "); load it again"));
  }
  return absl::OkStatus();
}

cache::LoadFn Admission::DiskLoad(const std::shared_ptr<const load::OpenedModel>& model,
                                  const Prepared& p) const {
  auto plan = std::make_shared<load::Plan>(p.plan);
  return [model, plan, backend = backend_, lopts = LoadOptionsFor(), device = p.device,
          label = p.label](cache::Entry& e) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
    WC_ASSIGN_OR_RETURN(auto loaded, load::LoadRank(*model, std::move(*plan), *backend, device,
                                                    label, lopts, &e.progress));
    WC_RETURN_IF_ERROR(FilesUnchanged(*model));
    return loaded;
  };
}

std::shared_ptr<RankFill> Admission::SurveyPeers(
    const std::shared_ptr<const load::OpenedModel>& model, const Prepared& p) const {
  PeerFill* fill = peer_fill_.load();
  // Private copies are this node's (peers never describe them).
  if (fill == nullptr || !p.request.inputs.env.tenant.empty()) return nullptr;
  RankFill::Rank rank{.model = model->spec.name,
                      .model_dir = model->spec.model_dir,
                      .fingerprint = p.fingerprint,
                      .tp_rank = p.request.inputs.layout.tp_rank,
                      .device = p.device,
                      .label = p.label,
                      .plan = p.plan,
                      .pinned = {}};
  // The spec's pinned segment digests of this fingerprint (hex, validated), as raw bytes.
  if (auto it = model->spec.segment_digests.find(p.fingerprint);
      it != model->spec.segment_digests.end()) {
    for (const auto& hex : it->second) rank.pinned.push_back(absl::HexStringToBytes(hex));
  }
  return RankFill::Survey(
      *fill, std::move(rank),
      [model, backend = backend_, device = p.device, label = p.label, lopts = LoadOptionsFor()](
          load::Plan plan, load::LoadProgress* progress) {
        return load::LoadRank(*model, std::move(plan), *backend, device, label, lopts, progress);
      });
}

absl::StatusOr<std::shared_ptr<cache::Entry>> Admission::StartFill(
    const std::shared_ptr<const load::OpenedModel>& model, Prepared p,
    const std::shared_ptr<RankFill>& fill) {
  // The registry digests what the load returns: a filled entry's digests must be those each
  // segment matched during the fill (RankFill::CheckDigests).
  p.request.source = "peer_fill";
  p.request.check_digests = [fill](const std::vector<integrity::SegmentDigest>& got) {
    return fill->CheckDigests(got);
  };
  // Those it checked, taken as the registry's digester takes them, are the entry's.
  p.request.taken_digests = [fill] { return fill->TakenDigests(); };
  p.request.load = [fill,
                    model](cache::Entry& e) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
    WC_ASSIGN_OR_RETURN(auto loaded, fill->Run(e.progress));
    WC_RETURN_IF_ERROR(FilesUnchanged(*model));
    return loaded;
  };
  return registry_.StartOrJoin(std::move(p.request));
}

absl::StatusOr<std::shared_ptr<cache::Entry>> Admission::StartLoad(
    const std::shared_ptr<const load::OpenedModel>& model, const spec::Layout& layout,
    const spec::Environment& env, const std::string& device_uuid) {
  WC_ASSIGN_OR_RETURN(Prepared p, Prepare(model, layout, env, device_uuid));
  if (p.live) return p.live;
  if (auto fill = SurveyPeers(model, p)) return StartFill(model, std::move(p), fill);
  p.request.load = DiskLoad(model, p);
  return registry_.StartOrJoin(std::move(p.request));
}

std::vector<absl::StatusOr<std::shared_ptr<cache::Entry>>> Admission::StartGroupLoad(
    const std::shared_ptr<const load::OpenedModel>& model, const std::vector<GroupRank>& ranks) {
  std::vector<absl::StatusOr<std::shared_ptr<cache::Entry>>> out;
  if (ranks.size() == 1) {
    out.push_back(StartLoad(model, ranks[0].layout, ranks[0].env, ranks[0].device_uuid));
    return out;
  }
  // Plan every rank first; the group loads the ranks that have no live entry.
  std::vector<Prepared> prepared;
  for (const auto& r : ranks) {
    auto p = Prepare(model, r.layout, r.env, r.device_uuid);
    if (!p.ok()) {
      out.emplace_back(p.status());
      prepared.emplace_back();
      continue;
    }
    out.emplace_back(p->live);  // null when it is to be loaded
    prepared.push_back(std::move(*p));
  }
  // Ranks that peers hold are filled from them, each on its own (falling back to its own
  // disk load); the group reads the rest in one pass.
  std::vector<bool> by_fill(prepared.size(), false);
  for (size_t i = 0; i < prepared.size(); ++i) {
    if (!out[i].ok() || *out[i] != nullptr) continue;
    auto fill = SurveyPeers(model, prepared[i]);
    if (fill == nullptr) continue;
    by_fill[i] = true;
    out[i] = StartFill(model, prepared[i], fill);
  }
  auto plans = std::make_shared<std::vector<load::Plan>>(prepared.size());
  std::vector<std::string> devices, labels;
  for (size_t i = 0; i < prepared.size(); ++i) {
    (*plans)[i] = std::move(prepared[i].plan);
    devices.push_back(prepared[i].device);
    labels.push_back(prepared[i].label);
  }
  memory::Backend* backend = backend_;
  auto group = std::make_shared<GroupLoad>(
      prepared.size(),
      [model, plans, backend, devices, labels, lopts = LoadOptionsFor()](
          const std::vector<size_t>& members, load::LoadProgress* progress)
          -> absl::StatusOr<std::vector<std::unique_ptr<load::LoadedModel>>> {
        std::vector<load::Plan> mine;
        std::vector<std::string> dev, lab;
        for (size_t i : members) {
          mine.push_back(std::move((*plans)[i]));
          dev.push_back(devices[i]);
          lab.push_back(labels[i]);
        }
        return load::LoadRanks(*model, std::move(mine), *backend, dev, lab, lopts, progress);
      });
  std::vector<bool> members(prepared.size(), false);
  for (size_t i = 0; i < prepared.size(); ++i) {
    if (by_fill[i] || !out[i].ok() || *out[i] != nullptr) continue;
    prepared[i].request.load =
        [group, i, model](cache::Entry& e) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
      WC_ASSIGN_OR_RETURN(auto loaded, group->Take(i, &e.progress));
      WC_RETURN_IF_ERROR(FilesUnchanged(*model));
      return loaded;
    };
    bool started = false;
    out[i] = registry_.StartOrJoin(std::move(prepared[i].request), &started);
    members[i] = started;
  }
  group->Settle(std::move(members));
  return out;
}

absl::StatusOr<std::shared_ptr<cache::Entry>> Admission::StartPeerCopy(
    const std::shared_ptr<cache::Entry>& src, const std::string& device_uuid) {
  WC_ASSIGN_OR_RETURN(std::shared_ptr<const load::LoadedModel> content, registry_.Content(src));
  const memory::CopyRoute route = options_.peer_policy == PeerPolicy::kCopy &&
                                          backend_->CanAccessPeer(src->device_uuid, device_uuid)
                                      ? memory::CopyRoute::kPeer
                                      : memory::CopyRoute::kHostStaged;
  memory::Backend* backend = backend_;
  auto load = [content, backend, route, device_uuid, src_device = src->device_uuid,
               label =
                   absl::StrCat("weightcache/", src->model, "/", src->fingerprint.substr(0, 12))](
                  cache::Entry& e) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
    auto out = std::make_unique<load::LoadedModel>();
    out->plan = content->plan;
    out->device_uuid = device_uuid;
    out->model_dir = content->model_dir;
    const uint64_t total = content->resident_bytes();
    e.progress.SetTotal(total);
    e.progress.SetFile(absl::StrCat("peer copy from ", src_device));
    auto t0 = std::chrono::steady_clock::now();
    memory::CopyRoute used = route;
    uint64_t done = 0;
    for (size_t i = 0; i < content->segments.size(); ++i) {
      if (e.progress.cancelled()) {
        return absl::CancelledError(absl::StrCat("peer copy to ", device_uuid, " stopped"));
      }
      memory::Segment& from = *content->segments[i];
      WC_ASSIGN_OR_RETURN(auto to,
                          backend->Allocate(device_uuid, from.size(), absl::StrCat(label, "/", i)));
      // Progress and cancellation per chunk, not per segment (a segment is up to 1 GiB).
      const memory::CopyTick tick = [&e, done](uint64_t copied) {
        e.progress.SetDone(done + copied);
        return !e.progress.cancelled();
      };
      absl::Status s = backend->CopySegment(from, to.get(), used, tick);
      if (s.code() == absl::StatusCode::kCancelled) {
        return absl::CancelledError(
            absl::StrCat("peer copy to ", device_uuid, " stopped: ", s.message()));
      }
      if (!s.ok() && used == memory::CopyRoute::kPeer) {
        WC_LOG_WARN("peer copy %s -> %s failed (%s); staging through host memory instead",
                    src_device, device_uuid, std::string(s.message()));
        used = memory::CopyRoute::kHostStaged;
        s = backend->CopySegment(from, to.get(), used, tick);
      }
      WC_RETURN_IF_ERROR(s);
      WC_RETURN_IF_ERROR(to->Seal());
      done += from.size();
      e.progress.SetDone(done);
      out->segments.push_back(std::move(to));
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    WC_LOG_INFO("peer copy of %s: %s -> %s, %d bytes in %d segments, %.3f s (%.2f GB/s, route %s)",
                e.key.ToString(), src_device, device_uuid, total, content->segments.size(), secs,
                secs > 0 ? static_cast<double>(total) / secs / 1e9 : 0.0,
                memory::CopyRouteName(used));
    return out;
  };
  cache::LoadRequest req;
  req.key = {src->fingerprint, device_uuid};
  req.model = src->model;
  req.inputs = src->inputs;
  req.bytes = content->resident_bytes();
  req.source = "peer";
  req.files = src->files;
  req.load = std::move(load);
  // The copy must have the bytes the source had when it was filled: a source changed since
  // (not yet found by the scrubber) is no clean source (issue 27).
  req.check_digests = [expected = registry_.Digests(src), from = src->device_uuid](
                          const std::vector<integrity::SegmentDigest>& got) -> absl::Status {
    if (expected == nullptr) return absl::OkStatus();
    const std::string what = integrity::DescribeChanges(*expected, got);
    if (what.empty()) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat("peer copy from ", from, " differs from its source's digests: ", what));
  };
  return registry_.StartOrJoin(std::move(req));
}

std::shared_ptr<cache::Entry> Admission::FindOn(const std::string& fingerprint,
                                                const std::string& device_uuid) const {
  if (!device_uuid.empty()) return registry_.Find({fingerprint, device_uuid});
  auto all = registry_.FindAll(fingerprint);
  for (const auto& e : all) {
    if (registry_.StateOf(e) == cache::State::kReady) return e;
  }
  return all.empty() ? nullptr : all.front();
}

std::shared_ptr<cache::Entry> Admission::PeerSource(const std::string& fingerprint,
                                                    const std::string& device_uuid) const {
  if (device_uuid.empty()) return nullptr;
  std::shared_ptr<cache::Entry> loading;
  for (const auto& e : registry_.FindAll(fingerprint)) {
    if (e->device_uuid == device_uuid) continue;
    if (registry_.StateOf(e) == cache::State::kReady) return e;
    if (registry_.StateOf(e) == cache::State::kLoading && !loading) loading = e;
  }
  return loading;
}

}  // namespace weightcache::server
