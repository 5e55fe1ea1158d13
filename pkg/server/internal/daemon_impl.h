// Daemon internals shared by daemon.cc (the serving logic) and grpc_service.cc (the gRPC
// adapter). Not a public header.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/service_type.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/identity/identity.h"
#include "pkg/load/model.h"
#include "pkg/load/staging_pool.h"
#include "pkg/metrics/metrics.h"
#include "pkg/server/daemon.h"
#include "pkg/server/handle_channel.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

namespace v1 = ::weightcache::v1;

class Daemon::Impl final : public metrics::StateSource {
 public:
  Impl(DaemonOptions options, memory::Backend* backend);
  ~Impl() override;

  absl::Status Start();
  // Starts the loads of every known spec's ranks (options().preload).
  void StartPreloads();
  // Requests the shutdown (any thread); Wait() then runs the teardown and returns after it.
  void Shutdown();
  void Wait();

  // The serving logic, one method per RPC. `result` is the metrics classification.
  absl::Status Acquire(const v1::AcquireRequest& req, v1::AcquireResponse* resp, std::string* model,
                       metrics::AcquireResult* result);
  absl::Status Release(const v1::ReleaseRequest& req);
  // Starts (or joins) a load; `publish` is called with progress until it ends.
  absl::Status Load(const v1::LoadRequest& req,
                    const std::function<bool(const v1::LoadProgress&)>& publish);
  absl::Status Evict(const v1::EvictRequest& req, v1::EvictResponse* resp);
  void Status(v1::StatusResponse* resp) const;
  std::pair<bool, std::string> Readiness() const;

  // metrics::StateSource
  std::vector<metrics::EntrySnapshot> Entries() const override;
  std::vector<metrics::DeviceSnapshot> Devices() const override;
  metrics::StagingSnapshot Staging() const override;

  const DaemonOptions& options() const { return options_; }
  std::string control_path() const;
  std::string handle_path() const;

 private:
  struct PendingToken {
    std::string lease_id;
    std::shared_ptr<cache::Entry> entry;  // the entry itself: a reload under its key is another
    std::chrono::steady_clock::time_point expires;
  };

  absl::StatusOr<std::shared_ptr<const load::OpenedModel>> Open(const std::string& name,
                                                                bool refresh);
  // The fingerprint environment of a request and the device it names (env.device_uuid,
  // empty: the backend's first device). INVALID_ARGUMENT naming the UUID when the backend
  // has no such device; compute_capability defaults to that device's.
  struct AskedEnv {
    spec::Environment env;
    std::string device_uuid;
  };
  absl::StatusOr<AskedEnv> EnvFrom(const v1::Environment& env) const;
  absl::StatusOr<spec::Layout> LayoutFrom(const v1::Layout& layout) const;
  absl::StatusOr<std::shared_ptr<cache::Entry>> StartLoad(
      const std::shared_ptr<const load::OpenedModel>& model, const spec::Layout& layout,
      const spec::Environment& env, const std::string& device_uuid);
  // A new entry on `device_uuid` filled by copying ready entry `src` (another device) per
  // the peer policy; single-flight like a load, timed, counted with source "peer".
  absl::StatusOr<std::shared_ptr<cache::Entry>> StartPeerCopy(
      const std::shared_ptr<cache::Entry>& src, const std::string& device_uuid);
  // The live entry of `fingerprint` on `device_uuid`; with an empty device, the first
  // ready one on any device (else the first live one).
  std::shared_ptr<cache::Entry> FindOn(const std::string& fingerprint,
                                       const std::string& device_uuid) const;
  // A ready or loading entry of `fingerprint` on a device other than `device_uuid`.
  std::shared_ptr<cache::Entry> PeerSource(const std::string& fingerprint,
                                           const std::string& device_uuid) const;
  absl::StatusOr<HandleChannel::Grant> Claim(const std::string& token, const PeerCred& peer);
  void ExpireTokens();
  // Adds the lease and its token and fills the response, labelled with `name` (the asked
  // spec name; the entry's own for fingerprint requests). UNAVAILABLE when the entry was
  // evicted meanwhile (no lease, no token).
  absl::Status FillLease(const std::shared_ptr<cache::Entry>& e, const std::string& name,
                         v1::AcquireResponse* resp);
  // Stale check of an Acquire by name: the asked spec's files against the versions it was
  // opened with. Marks the entries that were served from the old versions stale. Returns the
  // changes (empty: unchanged).
  std::string CheckStale(const std::shared_ptr<const load::OpenedModel>& opened);
  // Every known spec name whose own layout (tp/pp sizes) and content reproduce `s`.
  std::vector<std::string> NamesOf(const cache::EntrySnapshot& s) const;
  // The opened specs (a copy of the map, taken under mu_).
  std::map<std::string, std::shared_ptr<const load::OpenedModel>> OpenedSpecs() const;
  void Count(metrics::AcquireResult r);

  const DaemonOptions options_;
  memory::Backend* const backend_;
  std::string daemon_cc_;  // compute capability of the default device, or "cpu"
  std::unique_ptr<identity::DigestStore> digests_;  // set by Start()
  // Pinned staging buffers kept between GPU loads (cuda-vmm backend only; null otherwise).
  // Declared before registry_: the registry joins its load threads first.
  std::unique_ptr<load::StagingPool> staging_pool_;
  cache::Registry registry_;

  mutable std::mutex mu_;
  std::map<std::string, spec::ModelSpec> specs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<const load::OpenedModel>> opened_ ABSL_GUARDED_BY(mu_);
  // Why a spec could not be opened (refused quantization, bad files...), for `list`.
  std::map<std::string, std::string> open_errors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, PendingToken> tokens_ ABSL_GUARDED_BY(mu_);
  std::vector<cache::Key> preloads_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> hits_{0}, misses_{0}, mismatches_{0}, rejected_{0}, errors_{0},
      peer_copies_{0}, stale_{0};

  std::unique_ptr<HandleChannel> handles_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<grpc::Service> service_;
  // Cancels loads and waits, drains RPCs (bounded), closes the channels; once.
  void Teardown();
  std::once_flag teardown_once_;
  std::mutex wait_mu_;
  std::condition_variable wait_cv_;
  bool shutdown_ ABSL_GUARDED_BY(wait_mu_) = false;
};

// The one place where absl::Status becomes grpc::Status lives in grpc_service.cc.
std::unique_ptr<grpc::Service> MakeGrpcService(Daemon::Impl* impl);

}  // namespace weightcache::server
