// The daemon's view of itself (status_view.h).
#include "pkg/server/internal/status_view.h"

#include <algorithm>
#include <chrono>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/server/messages/layout_proto.h"
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

class StatusView::Visibility {
 public:
  Visibility(const Access& access, const Caller& caller)
      : access_(access),
        caller_(caller),
        admin_(access.IsAdmin(caller)),
        filtered_(access.rules_on() && !admin_) {}
  bool filtered() const { return filtered_; }
  bool admin() const { return admin_; }
  bool operator()(const std::string& name) {
    if (!filtered_) return true;
    auto [it, fresh] = may_map_.try_emplace(name, false);
    if (fresh) it->second = access_.Allows(caller_, Verb::kStatus, access_.ModelObject(name));
    return it->second;
  }

 private:
  const Access& access_;
  const Caller& caller_;
  const bool admin_;
  const bool filtered_;
  std::map<std::string, bool> may_map_;
};

void StatusView::Status(const Caller& caller, v1::StatusResponse* resp) const {
  Visibility visible(*s_.access, caller);
  resp->set_version(Version());
  resp->set_backend(memory::BackendName(s_.backend->kind()));
  std::map<std::string, std::pair<uint32_t, uint64_t>> per_device;  // entries, bytes
  std::map<std::string, std::set<uint32_t>> ready_ranks;            // spec name -> tp ranks
  AppendEntries(caller, visible, resp, &per_device, &ready_ranks);
  AppendModels(visible, ready_ranks, resp);
  AppendCounters(resp);
  const Asker asker{caller, visible.admin(), visible.filtered(),
                    [&](const std::string& name) { return visible(name); }};
  for (const Section& section : s_.sections) section(asker, resp);
  if (const metrics::StagingSnapshot st = Staging(); st.present) {
    resp->mutable_staging()->set_idle_bytes(st.idle_bytes);
    resp->mutable_staging()->set_in_use_bytes(st.in_use_bytes);
  }
  for (const auto& d : s_.backend->Devices()) {
    auto* u = resp->add_devices();
    u->set_device_uuid(d.uuid);
    u->set_name(d.name);
    u->set_total_bytes(d.total_bytes);
    u->set_free_bytes(d.free_bytes);
    u->set_entries(per_device[d.uuid].first);
    u->set_cache_bytes(per_device[d.uuid].second);
  }
}

void StatusView::AppendEntries(const Caller& caller, Visibility& visible, v1::StatusResponse* resp,
                               std::map<std::string, std::pair<uint32_t, uint64_t>>* per_device,
                               std::map<std::string, std::set<uint32_t>>* ready_ranks) const {
  auto snapshot = s_.registry->Snapshot();
  // Sorted by model, rank, device: a stable order for people and scripts.
  std::sort(snapshot.begin(), snapshot.end(), [](const auto& a, const auto& b) {
    return std::tie(a.model, a.inputs.layout.pp_rank, a.inputs.layout.tp_rank, a.device_uuid,
                    a.fingerprint) < std::tie(b.model, b.inputs.layout.pp_rank,
                                              b.inputs.layout.tp_rank, b.device_uuid,
                                              b.fingerprint);
  });
  for (const auto& s : snapshot) {
    auto& [count, bytes] = (*per_device)[s.device_uuid];
    count++;
    bytes += s.bytes;
    std::vector<std::string> names;
    for (auto& n : s_.models->NamesOf(s)) {
      if (visible(n)) names.push_back(std::move(n));
    }
    const bool model_visible = visible(s.model);
    if (!model_visible && names.empty()) continue;
    if (visible.filtered() && !s.inputs.env.tenant.empty()) {
      // Another namespace's private copy: not shown (nor counted per name).
      Object object = s_.access->ModelObject(s.model);
      object.tenant = s.inputs.env.tenant;
      if (!s_.access->Allows(caller, Verb::kStatus, object)) continue;
    }
    AppendEntry(caller, visible.admin(), s, model_visible ? s.model : names.front(), names, resp,
                ready_ranks);
  }
}

void StatusView::AppendEntry(const Caller& caller, bool admin, const cache::EntrySnapshot& s,
                             const std::string& shown_name, const std::vector<std::string>& names,
                             v1::StatusResponse* resp,
                             std::map<std::string, std::set<uint32_t>>* ready_ranks) const {
  auto* e = resp->add_entries();
  e->set_model(shown_name);
  e->set_fingerprint(s.fingerprint);
  const auto [state, error] = ShownState(s);
  e->set_state(state);
  e->set_error(error);
  // When its last pass ended tells an engine how long a write may stay unseen (issue 48).
  e->set_verified_seconds_ago(admin ? s.verified_seconds_ago : -1);
  if (admin) {
    for (const auto& d : s.segment_sha256) {
      if (!d.empty()) e->add_segment_sha256(absl::BytesToHexString(d));
    }
  }
  e->set_bytes(s.bytes);
  e->set_tensor_bytes(s.tensor_bytes);
  e->set_tensors(static_cast<uint32_t>(s.tensors));
  e->set_segments(static_cast<uint32_t>(s.segments));
  LayoutToProto(s.inputs.layout, e->mutable_layout());
  e->set_backend(memory::BackendName(s_.backend->kind()));
  e->set_device_uuid(s.device_uuid);
  e->set_load_seconds(s.load_seconds);
  e->set_bytes_read(s.bytes_read);
  e->set_bytes_done(s.bytes_done);
  e->set_source(s.source);
  e->set_tenant(s.inputs.env.tenant);
  // A published entry, or one adopted from the keeper whose record says who published it.
  if (auto p = s_.publisher_of ? s_.publisher_of({s.fingerprint, s.device_uuid}) : std::nullopt;
      p && (s.source == "publish" || s.source == "keeper")) {
    *e->mutable_publisher() = *p;
  }
  for (const auto& n : names) {
    e->add_names(n);
    if (s.state == cache::State::kReady && state != "stale") {
      (*ready_ranks)[n].insert(static_cast<uint32_t>(s.inputs.layout.tp_rank));
    }
  }
  // Others' leases only as a count (issue 47: every root pod read every lease id here and
  // released them all). A peer the daemon cannot place owns none it could see.
  const auto now = std::chrono::steady_clock::now();
  e->set_lease_count(static_cast<uint32_t>(s.leases.size()));
  const std::string mine = caller.unit.kind == tenant::UnitKind::kUnknown ? "" : caller.unit.Key();
  for (const auto& l : s.leases) {
    if (!admin && (mine.empty() || l.owner_unit != mine)) continue;
    auto* li = e->add_leases();
    li->set_lease_id(l.id);
    li->set_owner(l.owner_unit);
    li->set_owner_pod(l.owner_pod);
    li->set_pid(l.pid);
    li->set_uid(l.uid);
    li->set_age_seconds(std::chrono::duration<double>(now - l.since).count());
  }
}

void StatusView::AppendModels(Visibility& visible,
                              const std::map<std::string, std::set<uint32_t>>& ready_ranks,
                              v1::StatusResponse* resp) const {
  // Admins see the files' digests (weightcachectl pin).
  std::map<std::string, std::shared_ptr<const load::OpenedModel>> opened;
  if (visible.admin()) opened = s_.models->Opened();
  for (const auto& [sp, refused] : s_.models->List()) {
    const std::string& name = sp.name;
    if (!visible(name)) continue;
    resp->add_known_models(name);
    auto* m = resp->add_models();
    m->set_name(name);
    m->set_model_dir(sp.model_dir);
    m->set_tp_size(static_cast<uint32_t>(sp.tp_size));
    m->set_pp_size(static_cast<uint32_t>(sp.pp_size));
    m->set_quantization(sp.quantization);
    m->set_layout(sp.layout.empty() ? "hf" : sp.layout);
    if (auto it = ready_ranks.find(name); it != ready_ranks.end()) {
      for (uint32_t r : it->second) m->add_cached_ranks(r);
    }
    m->set_refused(refused);
    for (const auto& ns : sp.allowed_namespaces) m->add_allowed_namespaces(ns);
    m->set_isolation(sp.isolation);
    AppendFiles(opened, name, m);
  }
}

// The content digests of `name`'s files as opened (for `weightcachectl pin`).
void StatusView::AppendFiles(
    const std::map<std::string, std::shared_ptr<const load::OpenedModel>>& opened,
    const std::string& name, v1::KnownModel* m) {
  auto it = opened.find(name);
  if (it == opened.end()) return;
  for (const auto& f : it->second->files) {
    auto* cf = m->add_files();
    cf->set_name(f.name);
    cf->set_size(f.stat.size);
    cf->set_digest(f.digest);
    cf->set_source(identity::DigestSourceName(f.digest_source));
  }
}

void StatusView::AppendCounters(v1::StatusResponse* resp) const {
  const AcquireService::Counts counts =
      s_.acquire_counts ? s_.acquire_counts() : AcquireService::Counts{};
  resp->set_acquire_hits(counts.hits);
  resp->set_acquire_misses(counts.misses);
  resp->set_acquire_mismatches(counts.mismatches);
  resp->set_acquire_rejected(counts.rejected);
  resp->set_acquire_errors(counts.errors);
  resp->set_acquire_peer_copies(counts.peer_copies);
  resp->set_acquire_stale(counts.stale);
  resp->set_acquire_denied(counts.denied);
  resp->set_hashed_bytes(s_.models->hashed_bytes());
}

std::pair<bool, std::string> StatusView::Readiness() const {
  const ControlListener* control = s_.control ? s_.control() : nullptr;
  if (control != nullptr && !control->healthy()) {
    return {false, "the control socket cannot accept connections (out of descriptors?)"};
  }
  const std::set<std::string> pending =
      s_.preloads != nullptr ? s_.preloads->pending() : std::set<std::string>{};
  if (!pending.empty()) {
    return {false, absl::StrCat("opening ", absl::StrJoin(pending, ", "),
                                " for preload (reading and identifying files)")};
  }
  for (const auto& key :
       s_.preloads != nullptr ? s_.preloads->started() : std::vector<cache::Key>{}) {
    auto e = s_.registry->Find(key);
    if (e && s_.registry->StateOf(e) == cache::State::kLoading) {
      return {false, absl::StrCat("loading ", e->model, " (", e->progress.done(), " of ",
                                  e->progress.total(), " bytes)")};
    }
  }
  return {true, "ready"};
}

std::vector<metrics::EntrySnapshot> StatusView::Entries() const {
  std::vector<metrics::EntrySnapshot> out;
  for (const auto& s : s_.registry->Snapshot()) {
    metrics::EntrySnapshot m;
    m.model = s.model;
    m.state = ShownState(s).first;
    m.device = s.device_uuid.empty() ? "host" : s.device_uuid;
    m.bytes = s.bytes;
    m.leases = s.leases.size();
    m.tp_rank = s.inputs.layout.tp_rank;
    m.load_done_bytes = s.bytes_done;
    m.load_total_bytes = s.bytes_total;
    if (s.state != cache::State::kLoading && s.state != cache::State::kFailed &&
        s.bytes_total == 0) {
      m.load_done_bytes = m.load_total_bytes = s.bytes;  // filled without the loader (keeper)
    }
    m.verify_overdue =
        s.state == cache::State::kReady && s.verified_seconds_ago >= 0 &&
        s_.scrub_interval.count() > 0 &&
        s.verified_seconds_ago > 2 * std::chrono::duration<double>(s_.scrub_interval).count() + 60;
    out.push_back(std::move(m));
  }
  return out;
}

metrics::StagingSnapshot StatusView::Staging() const {
  if (!s_.staging) return {};
  const auto c = s_.staging();
  return {true, c.idle_bytes, c.taken_bytes};
}

std::vector<metrics::ListenerSnapshot> StatusView::Listeners() const {
  std::vector<metrics::ListenerSnapshot> out;
  auto add = [&out](const char* name, net::Acceptor::Counters c) {
    out.push_back({name, c.open, c.accepted, std::move(c.refused)});
  };
  if (const ControlListener* c = s_.control ? s_.control() : nullptr) add("control", c->counters());
  if (const HandleChannel* h = s_.handles ? s_.handles() : nullptr) add("handle", h->counters());
  if (const PeerPort* port = s_.peer_port ? s_.peer_port() : nullptr) {
    PeerPort::Counters c = port->counters();
    out.push_back({"peer", c.open, c.accepted, std::move(c.refused)});
  }
  return out;
}

metrics::PeerPortSnapshot StatusView::PeerPortState() const {
  const server::PeerPort* port = s_.peer_port ? s_.peer_port() : nullptr;
  if (port == nullptr) return {};
  return {.present = true, .relayed = port->counters().relayed};
}

std::vector<metrics::DeviceSnapshot> StatusView::Devices() const {
  std::map<std::string, uint64_t> used;
  for (const auto& s : s_.registry->Snapshot())
    used[s.device_uuid.empty() ? "host" : s.device_uuid] += s.bytes;
  std::vector<metrics::DeviceSnapshot> out;
  for (const auto& d : s_.backend->Devices()) {
    out.push_back({d.uuid, d.total_bytes, d.free_bytes, used[d.uuid], s_.registry->budget_bytes()});
  }
  return out;
}

}  // namespace weightcache::server
