// The daemon's view of itself: the Status RPC (entries, leases, known models, devices, what
// each peer may see under the namespace rules), readiness, and the snapshots the scrape-time
// metrics read. Reads the parts; owns nothing. Not a public header.
//
// Thread-safety: every method may be called from any thread. Lifetimes: the sources outlive
// the view.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "pkg/cache/registry.h"
#include "pkg/load/staging_pool.h"
#include "pkg/memory/backend.h"
#include "pkg/metrics/metrics.h"
#include "pkg/server/internal/access.h"
#include "pkg/server/internal/acquire_service.h"
#include "pkg/server/internal/artifacts.h"
#include "pkg/server/internal/model_catalog.h"
#include "pkg/server/internal/preloads.h"
#include "pkg/server/keeper/keeper_link.h"
#include "pkg/server/peer/peer_port.h"
#include "pkg/server/publish/publish_manager.h"
#include "pkg/server/wire/control_listener.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

class StatusView final : public metrics::StateSource {
 public:
  // What the view reads. keeper, staging and artifacts may be null (the daemon runs without
  // them); `control` answers null until the control listener exists.
  struct Sources {
    memory::Backend* backend = nullptr;
    const cache::Registry* registry = nullptr;
    const ModelCatalog* models = nullptr;
    const Access* access = nullptr;
    const PublishManager* publishes = nullptr;
    const ArtifactService* artifacts = nullptr;
    const AcquireService* acquire = nullptr;
    const Preloads* preloads = nullptr;
    const KeeperLink* keeper = nullptr;
    const load::StagingPool* staging = nullptr;
    std::function<const ControlListener*()> control;
    // Every listener's connections and refusals at the door (metrics); may be empty.
    std::function<std::vector<metrics::ListenerSnapshot>()> listeners;
    // Appends the integrity findings (admins only); may be empty.
    std::function<void(v1::StatusResponse*)> integrity_findings;
    // The peer API's port (issue 47); answers null without one.
    std::function<const PeerPort*()> peer_port;
    // The scrubber's interval (0: off): an entry not verified for two of them plus a minute
    // is overdue (metrics).
    std::chrono::milliseconds scrub_interval{0};
  };
  explicit StatusView(Sources sources) : s_(std::move(sources)) {}

  // What `caller` may see: with the namespace rules, the models it may map and the entries
  // that serve them (under those names only); of every entry's leases, those of its own
  // tenant unit (pod, slot or process) and the count of all; an admin sees everything. Counters and
  // device rows stay whole.
  void Status(const Caller& caller, v1::StatusResponse* resp) const;
  // Ready when the control socket accepts and every preload is opened and loaded (or failed
  // for good); the reason otherwise.
  std::pair<bool, std::string> Readiness() const;

  // metrics::StateSource
  std::vector<metrics::EntrySnapshot> Entries() const override;
  std::vector<metrics::DeviceSnapshot> Devices() const override;
  metrics::StagingSnapshot Staging() const override;
  std::vector<metrics::ListenerSnapshot> Listeners() const override;
  metrics::PeerPortSnapshot PeerPortState() const override;

 private:
  // Whether `caller` may see model `name` (one rule decision per name and Status).
  class Visibility;
  // The entries `caller` may see, sorted by model, rank, device; per device the entries and
  // bytes of all of them, and per visible name the ready tp ranks.
  void AppendEntries(const Caller& caller, Visibility& visible, v1::StatusResponse* resp,
                     std::map<std::string, std::pair<uint32_t, uint64_t>>* per_device,
                     std::map<std::string, std::set<uint32_t>>* ready_ranks) const;
  void AppendEntry(const Caller& caller, bool admin, const cache::EntrySnapshot& s,
                   const std::string& shown_name, const std::vector<std::string>& names,
                   v1::StatusResponse* resp,
                   std::map<std::string, std::set<uint32_t>>* ready_ranks) const;
  void AppendModels(Visibility& visible,
                    const std::map<std::string, std::set<uint32_t>>& ready_ranks,
                    v1::StatusResponse* resp) const;
  static void AppendFiles(
      const std::map<std::string, std::shared_ptr<const load::OpenedModel>>& opened,
      const std::string& name, v1::KnownModel* m);
  void AppendCounters(v1::StatusResponse* resp) const;

  const Sources s_;
};

}  // namespace weightcache::server
