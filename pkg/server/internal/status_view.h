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
#include "pkg/server/internal/model_catalog.h"
#include "pkg/server/internal/preloads.h"
#include "pkg/server/wire/control_listener.h"
#include "pkg/server/wire/handle_channel.h"
#include "pkg/server/wire/peer_port.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

class StatusView final : public metrics::StateSource {
 public:
  // Who asks a Status, as a section another unit appends sees it: the caller, whether it is
  // an admin, and (`filtered`: namespace rules on, not an admin) the models it may see.
  struct Asker {
    const Caller& caller;
    bool admin;
    bool filtered;
    std::function<bool(const std::string& model)> visible;
  };
  // What another unit adds to a Status answer (the artifacts, the keeper, integrity findings).
  using Section = std::function<void(const Asker& asker, v1::StatusResponse* resp)>;

  // What the view reads, each part narrowed to what is read of it; an empty function or null
  // pointer is a part the daemon runs without.
  struct Sources {
    // The entries, devices and known models (Status, readiness, the metrics) and the door.
    memory::Backend* backend = nullptr;
    const cache::Registry* registry = nullptr;
    const ModelCatalog* models = nullptr;
    const Access* access = nullptr;
    // Who published an entry (publish_manager.h).
    std::function<std::optional<v1::PublisherInfo>(const cache::Key&)> publisher_of;
    // The Acquire answers so far, by result (acquire_service.h).
    std::function<AcquireService::Counts()> acquire_counts;
    // Appended after the view's own parts, in order.
    std::vector<Section> sections;
    // Readiness: the names the preloads are opening, the entries they started.
    const PreloadProgress* preloads = nullptr;
    // The metrics' snapshots: the staging pool's counters, the control listener (answers null
    // until it exists), the peer API's port (null without one).
    std::function<load::StagingPool::Counters()> staging;
    std::function<const ControlListener*()> control;
    // The handle channel (answers null until it exists): its connections (metrics).
    std::function<const HandleChannel*()> handles;
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
