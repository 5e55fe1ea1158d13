// The daemon's view of itself: the Status RPC (entries, leases, known models, devices,
// what each peer may see under the namespace rules), readiness, and the snapshots the
// scrape-time metrics read. Part of Daemon::Impl (daemon_impl.h).
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
#include "pkg/util/version.h"

namespace weightcache::server {
namespace {

// The state an operator sees and its explanation: "corrupt" (out of service: its memory
// changed after sealing) and "stale" (ready, its files changed on disk) refine the registry's.
std::pair<std::string, std::string> ShownState(const cache::EntrySnapshot& s) {
  if (!s.corrupt.empty()) return {"corrupt", s.corrupt};
  if (s.state == cache::State::kReady && !s.stale.empty()) return {"stale", s.stale};
  return {cache::StateName(s.state), s.error};
}

}  // namespace

void Daemon::Impl::Status(const Caller& caller, v1::StatusResponse* resp) {
  // With --namespace_rules a peer sees the models it may map, the entries that serve them
  // (under those names only) and, of their leases, those of its own socket; an admin sees
  // everything. Counters and device rows stay whole (free memory shows the rest anyway).
  const bool filtered = access_->rules_on() && !access_->IsAdmin(caller);
  std::map<std::string, bool> may_map;  // one rule decision per name and Status
  auto visible = [&](const std::string& name) {
    if (!filtered) return true;
    auto [it, fresh] = may_map.try_emplace(name, false);
    if (fresh) it->second = access_->Allows(caller, Verb::kStatus, access_->ModelObject(name));
    return it->second;
  };
  resp->set_version(Version());
  resp->set_backend(memory::BackendName(backend_->kind()));
  auto now = std::chrono::steady_clock::now();
  std::map<std::string, std::pair<uint32_t, uint64_t>> per_device;  // entries, bytes
  auto snapshot = registry_.Snapshot();
  // Sorted by model, rank, device: a stable order for people and scripts.
  std::sort(snapshot.begin(), snapshot.end(), [](const auto& a, const auto& b) {
    return std::tie(a.model, a.inputs.layout.pp_rank, a.inputs.layout.tp_rank, a.device_uuid,
                    a.fingerprint) < std::tie(b.model, b.inputs.layout.pp_rank,
                                              b.inputs.layout.tp_rank, b.device_uuid,
                                              b.fingerprint);
  });
  std::map<std::string, std::set<uint32_t>> ready_ranks;  // spec name -> tp ranks
  for (const auto& s : snapshot) {
    auto& [count, bytes] = per_device[s.device_uuid];
    count++;
    bytes += s.bytes;
    std::vector<std::string> names;
    for (auto& n : models_.NamesOf(s)) {
      if (visible(n)) names.push_back(std::move(n));
    }
    const bool model_visible = visible(s.model);
    if (!model_visible && names.empty()) continue;
    if (filtered && !s.inputs.env.tenant.empty()) {
      // Another namespace's private copy: not shown (nor counted per name).
      Object object = access_->ModelObject(s.model);
      object.tenant = s.inputs.env.tenant;
      if (!access_->Allows(caller, Verb::kStatus, object)) continue;
    }
    auto* e = resp->add_entries();
    e->set_model(model_visible ? s.model : names.front());
    e->set_fingerprint(s.fingerprint);
    const auto [state, error] = ShownState(s);
    e->set_state(state);
    e->set_error(error);
    e->set_verified_seconds_ago(s.verified_seconds_ago);
    e->set_bytes(s.bytes);
    e->set_tensor_bytes(s.tensor_bytes);
    e->set_tensors(static_cast<uint32_t>(s.tensors));
    e->set_segments(static_cast<uint32_t>(s.segments));
    LayoutToProto(s.inputs.layout, e->mutable_layout());
    e->set_backend(memory::BackendName(backend_->kind()));
    e->set_device_uuid(s.device_uuid);
    e->set_load_seconds(s.load_seconds);
    e->set_bytes_read(s.bytes_read);
    e->set_bytes_done(s.bytes_done);
    e->set_source(s.source);
    e->set_tenant(s.inputs.env.tenant);
    // A published entry, or one adopted from the keeper whose record says who published it.
    if (auto p = publishes_.PublisherOf({s.fingerprint, s.device_uuid});
        p && (s.source == "publish" || s.source == "keeper")) {
      *e->mutable_publisher() = *p;
    }
    for (const auto& n : names) {
      e->add_names(n);
      if (s.state == cache::State::kReady && state != "stale") {
        ready_ranks[n].insert(static_cast<uint32_t>(s.inputs.layout.tp_rank));
      }
    }
    for (const auto& l : s.leases) {
      if (filtered && l.slot != caller.slot) continue;
      auto* li = e->add_leases();
      li->set_lease_id(l.id);
      li->set_pid(l.pid);
      li->set_uid(l.uid);
      li->set_age_seconds(std::chrono::duration<double>(now - l.since).count());
    }
  }
  for (const auto& [sp, refused] : models_.List()) {
    const std::string& name = sp.name;
    if (visible(name)) {
      resp->add_known_models(name);
      auto* m = resp->add_models();
      m->set_name(name);
      m->set_model_dir(sp.model_dir);
      m->set_tp_size(static_cast<uint32_t>(sp.tp_size));
      m->set_pp_size(static_cast<uint32_t>(sp.pp_size));
      m->set_quantization(sp.quantization);
      m->set_layout(sp.layout.empty() ? "hf" : sp.layout);
      for (uint32_t r : ready_ranks[name]) m->add_cached_ranks(r);
      m->set_refused(refused);
      for (const auto& ns : sp.allowed_namespaces) m->add_allowed_namespaces(ns);
      m->set_isolation(sp.isolation);
    }
  }
  if (artifacts_ != nullptr) artifacts_->AppendStatus(caller, filtered, visible, resp);
  const AcquireService::Counts counts = acquire_->counts();
  resp->set_acquire_hits(counts.hits);
  resp->set_acquire_misses(counts.misses);
  resp->set_acquire_mismatches(counts.mismatches);
  resp->set_acquire_rejected(counts.rejected);
  resp->set_acquire_errors(counts.errors);
  resp->set_acquire_peer_copies(counts.peer_copies);
  resp->set_acquire_stale(counts.stale);
  resp->set_acquire_denied(counts.denied);
  resp->set_hashed_bytes(models_.hashed_bytes());
  if (keeper_) keeper_->Fill(resp->mutable_keeper());
  if (const metrics::StagingSnapshot s = Staging(); s.present) {
    resp->mutable_staging()->set_idle_bytes(s.idle_bytes);
    resp->mutable_staging()->set_in_use_bytes(s.in_use_bytes);
  }
  for (const auto& d : backend_->Devices()) {
    auto* u = resp->add_devices();
    u->set_device_uuid(d.uuid);
    u->set_name(d.name);
    u->set_total_bytes(d.total_bytes);
    u->set_free_bytes(d.free_bytes);
    u->set_entries(per_device[d.uuid].first);
    u->set_cache_bytes(per_device[d.uuid].second);
  }
}

std::pair<bool, std::string> Daemon::Impl::Readiness() const {
  if (control_ && !control_->healthy()) {
    return {false, "the control socket cannot accept connections (out of descriptors?)"};
  }
  if (const std::set<std::string> pending = preloads_->pending(); !pending.empty()) {
    return {false, absl::StrCat("opening ", absl::StrJoin(pending, ", "),
                                " for preload (reading and identifying files)")};
  }
  for (const auto& key : preloads_->started()) {
    auto e = registry_.Find(key);
    if (e && registry_.StateOf(e) == cache::State::kLoading) {
      return {false, absl::StrCat("loading ", e->model, " (", e->progress.done(), " of ",
                                  e->progress.total(), " bytes)")};
    }
  }
  return {true, "ready"};
}

std::vector<metrics::EntrySnapshot> Daemon::Impl::Entries() const {
  std::vector<metrics::EntrySnapshot> out;
  for (const auto& s : registry_.Snapshot()) {
    metrics::EntrySnapshot m;
    m.model = s.model;
    m.state = ShownState(s).first;
    m.device = s.device_uuid.empty() ? "host" : s.device_uuid;
    m.bytes = s.bytes;
    m.leases = s.leases.size();
    m.tp_rank = s.inputs.layout.tp_rank;
    m.verified_seconds_ago = s.state == cache::State::kReady ? s.verified_seconds_ago : -1;
    out.push_back(std::move(m));
  }
  return out;
}

metrics::StagingSnapshot Daemon::Impl::Staging() const {
  if (staging_pool_ == nullptr) return {};
  const auto c = staging_pool_->counters();
  return {true, c.idle_bytes, c.taken_bytes};
}

metrics::ControlSnapshot Daemon::Impl::Control() const {
  if (control_ == nullptr) return {};
  const ControlListener::Counters c = control_->counters();
  metrics::ControlSnapshot s;
  s.present = true;
  s.open = c.open;
  s.accepted = c.accepted;
  s.closed_allowlist = c.refused_uid;
  s.closed_total = c.refused_total;
  s.closed_uid_cap = c.refused_uid_cap;
  s.accept_errors = c.accept_errors;
  return s;
}

std::vector<metrics::DeviceSnapshot> Daemon::Impl::Devices() const {
  std::map<std::string, uint64_t> used;
  for (const auto& s : registry_.Snapshot())
    used[s.device_uuid.empty() ? "host" : s.device_uuid] += s.bytes;
  std::vector<metrics::DeviceSnapshot> out;
  for (const auto& d : backend_->Devices()) {
    out.push_back({d.uuid, d.total_bytes, d.free_bytes, used[d.uuid]});
  }
  return out;
}

}  // namespace weightcache::server
