// The daemon's composition (docs/architecture.md): Daemon::Impl owns the units and sequences
// them. daemon.cc: construction, Start in its steps, Teardown in order, Release and the
// publish rule. The units, each in its own file with its own suite: Access (every RPC's
// door), Preloads, ModelService (Load, Evict), AcquireService, ArtifactService,
// IntegrityService, StatusView; with ModelCatalog, Admission, LeaseManager, the registry and
// the parts in the subfolders (wire/, policy/, messages/, keeper/, peer/, integrity/,
// publish/), and PeerApi (peer_api.cc: what other nodes' daemons ask). grpc_service.cc: the
// gRPC adapter over the accessors below.
// Not a public header.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/service_type.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/load/model.h"
#include "pkg/load/staging_pool.h"
#include "pkg/metrics/metrics.h"
#include "pkg/server/daemon.h"
#include "pkg/server/hooks.h"
#include "pkg/server/integrity/scrubber.h"
#include "pkg/server/internal/access.h"
#include "pkg/server/internal/acquire_service.h"
#include "pkg/server/internal/admission.h"
#include "pkg/server/internal/integrity_service.h"
#include "pkg/server/internal/lease_manager.h"
#include "pkg/server/internal/model_catalog.h"
#include "pkg/server/internal/model_service.h"
#include "pkg/server/internal/peer_api.h"
#include "pkg/server/internal/preloads.h"
#include "pkg/server/internal/publish_base.h"
#include "pkg/server/internal/status_view.h"
#include "pkg/server/keeper/keeper_link.h"
#include "pkg/server/messages/manifest.h"
#include "pkg/server/peer/peer_fill.h"
#include "pkg/server/policy/namespace_rules.h"
#include "pkg/server/policy/policy.h"
#include "pkg/server/publish/artifact_service.h"
#include "pkg/server/publish/publish_manager.h"
#include "pkg/server/wire/control_listener.h"
#include "pkg/server/wire/handle_channel.h"
#include "pkg/server/wire/pod_volumes.h"
#include "pkg/util/mutex.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

namespace v1 = ::weightcache::v1;

class Daemon::Impl final {
 public:
  // `hooks`: null in production (hooks.h).
  Impl(DaemonOptions options, memory::Backend* backend, DaemonHooks* hooks);
  ~Impl();

  absl::Status Start();
  // Requests the shutdown (any thread); Wait() then runs the teardown and returns after it.
  void Shutdown();
  void Wait();

  // The serving logic, one method per RPC. `result` is the metrics classification.
  // Every RPC's door (access.h): who calls, whether the policy lets it, which tenant's copy.
  // Made in Start(), before anything serves.
  const Access& access() const { return *access_; }

  // Acquire (acquire_service.h): made in Start(), after Access and the preloads.
  AcquireService& acquire() { return *acquire_; }
  // Release (lease_manager.h): asks Access's release rule, closes the lease's connection.
  LeaseManager& leases() { return leases_; }
  // Starts (or joins) a load; `publish` is called with progress until it ends.
  // Load and Evict (model_service.h): made in Start(), after Access.
  ModelService& model_verbs() { return *model_verbs_; }
  // Status, readiness and the metrics' snapshots (status_view.h): made in Start(), before
  // anything serves.
  const StatusView& status() const { return *status_; }
  // Integrity (integrity_service.h): made in Start(), before anything is filled.
  IntegrityService& integrity() { return *integrity_; }
  // The publish RPCs (publish_manager.h): each asks Access's publish rule first.
  PublishManager& publishes() { return publishes_; }

  // Compile artifacts (publish/artifact_service.h): made in Start() (it reads --artifact_dir).
  ArtifactService& artifacts() { return *artifacts_; }

  // The peer API (peer_api.h): made in Start(), serving once the control server does.
  int peer_port() const { return peer_api_->port(); }
  PodVolumes& pod_volumes() { return *pod_volumes_; }

  const DaemonOptions& options() const { return options_; }
  std::string control_path() const { return ControlSocketPath(options_); }
  std::string admin_path() const { return AdminSocketPath(options_); }  // "" without one
  std::string handle_path() const { return HandleSocketPath(options_); }

 private:
  const DaemonOptions options_;
  memory::Backend* const backend_;
  DaemonHooks* const hooks_;  // null: none (production)
  // The lease manager's hook (hooks_->BeforeLease), empty without hooks.
  std::function<void(const std::string&)> BeforeLeaseHook() const {
    if (hooks_ == nullptr) return nullptr;
    return [h = hooks_](const std::string& model) { h->BeforeLease(model); };
  }
  // Pinned staging buffers kept between GPU loads (cuda-vmm backend only; null otherwise).
  // Declared before registry_: the registry joins its load threads first.
  std::unique_ptr<load::StagingPool> staging_pool_;
  // The registry's observer (null without a keeper): declared before registry_, so it
  // outlives the load threads the registry joins; its watcher stops in Teardown.
  std::unique_ptr<KeeperLink> keeper_;
  // Peer fill (options().peer.peers; null: off): used by load threads, so declared before
  // registry_, which joins them first. Made in Start() (it needs the peer port).
  std::unique_ptr<PeerFill> peer_fill_;
  cache::Registry registry_;
  ModelCatalog models_;
  Admission admission_;
  LeaseManager leases_;
  // After the registry: destroyed first, so publishes in flight end before it joins them.
  CorePublishBase publish_base_;
  PublishManager publishes_;
  // Compile artifacts and their tokens, with the rules they ask: made in Start() (it reads
  // --artifact_dir).
  std::unique_ptr<CoreArtifactRules> artifact_rules_;
  std::unique_ptr<ArtifactService> artifacts_;

  // Preloads and the names pending until their entries are registered (preloads.h); made in
  // Start(), after Access.
  std::unique_ptr<Preloads> preloads_;
  std::unique_ptr<ModelService> model_verbs_;
  std::unique_ptr<AcquireService> acquire_;
  std::unique_ptr<StatusView> status_;

  // --namespace_rules: the slots' sockets, served by handles_ and control_.
  std::vector<SlotSockets> slots_;
  // Who may do what (access.h); made in Start(), once the namespace rules exist.
  std::unique_ptr<Access> access_;

  // Started once the sockets serve, stopped first in Teardown (its findings reach handles_).
  std::unique_ptr<IntegrityService> integrity_;
  std::unique_ptr<HandleChannel> handles_;
  std::unique_ptr<ControlListener> control_;  // stops accepting before grpc_ drains (Teardown)
  std::unique_ptr<PodVolumes> pod_volumes_;   // the pods' own sockets, served by the two above
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<grpc::Service> service_;
  // Start()'s steps, in its order (daemon.cc).
  void MakeIntegrity();
  void MakeStatusView();
  absl::Status ShareSocketsWithGroup();
  void AdoptFromKeeper();
  absl::Status PrepareSockets();
  absl::Status StartHandleChannel();
  absl::Status StartControlServer();
  // The peer API (options().peer.listen; peer_api.h): made before the status view (which
  // reads its port's counters), started after the control server, stopped before it.
  std::unique_ptr<PeerApi> peer_api_;
  // Cancels loads and waits, drains RPCs (bounded), closes the channels; once.
  void Teardown();
  std::once_flag teardown_once_;
  Mutex wait_mu_;
  CondVar wait_cv_;
  bool shutdown_ ABSL_GUARDED_BY(wait_mu_) = false;
};

// The one place where absl::Status becomes grpc::Status lives in grpc_service.cc.
std::unique_ptr<grpc::Service> MakeGrpcService(Daemon::Impl* impl);
// The control server: `service` with no listening port (the control listener hands it each
// connection), its memory and threads bounded, HTTP/2 limits set (grpc_service.cc). Null
// when it did not start.
std::unique_ptr<grpc::Server> BuildControlServer(grpc::Service* service, uint64_t memory_bytes,
                                                 int max_threads);

}  // namespace weightcache::server
