#include "pkg/server/daemon.h"

#include <fcntl.h>
#include <grpcpp/server_posix.h>
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
#include "pkg/load/model.h"
#include "pkg/load/plan.h"
#include "pkg/probes/node_probes.h"
#include "pkg/server/hooks.h"
#include "pkg/server/internal/access.h"
#include "pkg/server/internal/daemon_impl.h"
#include "pkg/server/internal/preloads.h"
#include "pkg/server/internal/step_clock.h"
#include "pkg/server/messages/layout_proto.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::server {

Daemon::Impl::Impl(DaemonOptions options, memory::Backend* backend, DaemonHooks* hooks)
    : options_(std::move(options)),
      backend_(backend),
      hooks_(hooks),
      staging_pool_(backend->kind() == memory::BackendKind::kCudaVmm
                        ? load::MakePinnedStagingPool(options_.staging_keep_bytes)
                        : nullptr),
      registry_(options_.memory_budget_bytes),
      models_(options_.specs, options_.read_threads, options_.model_roots, options_.metrics),
      admission_(options_, backend_, registry_, staging_pool_.get()),
      leases_(&registry_, options_.token_ttl,
              {.authorize = [this](const Caller& c, Verb v,
                                   const Object& o) { return access_->Authorize(c, v, o); },
               .close = [this](const std::string& lease) { handles_->CloseLease(lease); }}),
      publish_base_(backend_, admission_, models_),
      publishes_(
          {.token_ttl = options_.token_ttl,
           .commit_wait = options_.acquire_wait,
           .metrics = options_.metrics,
           .authorize = [this](const Caller& c,
                               const std::string& m) { return access_->AuthorizePublish(c, m); },
           .tenant_of = [this](const Caller& c,
                               const std::string& m) { return access_->TenantFor(c, m); }},
          backend_, registry_, publish_base_, handle_path()) {
  registry_.SetLoadDoneCallback(
      [this](const cache::Entry& e, const absl::Status& st, double seconds) {
        if (options_.metrics != nullptr && st.ok()) {
          options_.metrics->OnLoad(e.model, e.source, seconds, e.progress.total());
        }
        if (options_.metrics != nullptr && load::IsPinnedDigestMismatch(st)) {
          options_.metrics->OnPinnedDigestMismatch(e.model);
        }
      });
  registry_.SetLingeringSource(
      [this](const std::string& device) { return backend_->LingeringBytes(device); });
  registry_.SetEvictCallback([this](const std::string& model, const std::string& reason) {
    if (options_.metrics != nullptr) options_.metrics->OnEviction(model, reason);
  });
  registry_.SetBudgetRefusedCallback([this](const std::string& model, const std::string&) {
    if (options_.metrics != nullptr) options_.metrics->OnBudgetRefusal(model);
  });
  if (!options_.keeper_socket.empty()) {
    keeper_ = std::make_unique<KeeperLink>(
        KeeperLink::Options{.socket_path = options_.keeper_socket,
                            .io_timeout = options_.keeper_timeout,
                            .claim_wait = options_.keeper_claim_wait,
                            .keeper_uid = options_.keeper_uid},
        backend_, &registry_, options_.metrics,
        [this](const std::string& model) { return models_.Recorded(model); },
        [this](const cache::Key& key) { return publishes_.PublisherOf(key); });
    registry_.SetObserver(keeper_.get());
  }
}

Daemon::Impl::~Impl() {
  Shutdown();
  Teardown();
}

// Start sequences the parts: the door and the stores first, what the keeper holds, the
// sockets, then serving (handles, control, peers), and the background work last.
absl::Status Daemon::Impl::Start() {
  for (const auto& s : options_.specs) {
    WC_RETURN_IF_ERROR(CheckIsolation(s, options_.namespace_rules.enabled));
  }
  // Created 0750 (group --socket_gid) when missing; an existing one (the chart's hostPath) is
  // used as it is when safe, never chmod'ed or chown'ed (unix_socket.h).
  WC_RETURN_IF_ERROR(Annotate(PrepareSocketDir(options_.socket_dir, 0750, options_.socket_gid),
                              "--socket_dir=" + options_.socket_dir));
  WC_RETURN_IF_ERROR(models_.OpenDigestStore(options_.digest_store));
  WC_ASSIGN_OR_RETURN(access_, Access::FromOptions(options_, models_, [this](const std::string& p) {
                        return control_ ? control_->PeerOf(p) : std::nullopt;
                      }));
  preloads_ = std::make_unique<Preloads>(
      options_.preload ? options_.specs : std::vector<spec::ModelSpec>{}, models_, admission_,
      *access_, [h = hooks_](const std::string& model) {
        if (h != nullptr) h->BeforePreload(model);
      });
  model_verbs_ = std::make_unique<ModelService>(
      ModelService::Options{.refresh_interval = options_.refresh_interval,
                            .namespace_rules = options_.namespace_rules.enabled},
      backend_, registry_, models_, admission_, *access_);
  acquire_ = std::make_unique<AcquireService>(
      AcquireService::Options{.acquire_wait = options_.acquire_wait,
                              .peer_policy = options_.peer_policy,
                              .backend = backend_->kind(),
                              .handle_socket = handle_path(),
                              .slot_handle_socket = SlotHandleSocketInContainer(
                                  options_.socket_dir, options_.namespace_rules),
                              .before_lease = BeforeLeaseHook()},
      registry_, models_, admission_, *access_, leases_, *preloads_);
  MakeIntegrity();
  artifact_rules_ = std::make_unique<CoreArtifactRules>(*access_, models_);
  WC_ASSIGN_OR_RETURN(artifacts_, MakeArtifactService(options_, *artifact_rules_));
  if (keeper_) AdoptFromKeeper();
  artifacts_->ReportResident();
  WC_RETURN_IF_ERROR(PrepareSockets());
  peer_api_ = std::make_unique<PeerApi>(
      options_.peer, options_.shutdown_grace,
      PeerApi::Sources{.registry = &registry_,
                       .backend = backend_->kind(),
                       .spec_of = [this](const std::string& m) { return models_.Recorded(m); }});
  // The node's probe decision beside every engine socket (node_probes.h).
  std::vector<std::string> probe_dirs = {options_.socket_dir};
  for (const auto& s : slots_) probe_dirs.push_back(s.dir);
  probes::WriteNodeProbesInto(probe_dirs);
  MakeStatusView();
  WC_RETURN_IF_ERROR(StartHandleChannel());
  // Preloads open (maybe hash) on their own thread while the daemon serves; their names are
  // pending until registered: a client never sees a known model as a miss (it waits, or hears).
  preloads_->MarkPending();
  WC_RETURN_IF_ERROR(StartControlServer());
  pod_volumes_ =
      std::make_unique<PodVolumes>(options_.pod_volumes_file, control_.get(), handles_.get());
  WC_RETURN_IF_ERROR(pod_volumes_->Restore());
  WC_RETURN_IF_ERROR(peer_api_->Start());
  WC_ASSIGN_OR_RETURN(peer_fill_, MakePeerFill(options_.peer, peer_api_->port(), backend_,
                                               options_.metrics, staging_pool_.get()));
  admission_.SetPeerFill(peer_fill_.get());
  WC_RETURN_IF_ERROR(ShareSocketsWithGroup());
  integrity_->Start();
  preloads_->Start();
  WC_LOG_INFO(
      "serving on %s (handles on %s%s), backend %s, peer policy %s%s", control_path(),
      handle_path(), admin_path().empty() ? "; no admin socket" : "; admin socket " + admin_path(),
      memory::BackendName(backend_->kind()), PeerPolicyName(options_.peer_policy),
      access_->rules_on() ? absl::StrCat("; namespace rules on, ", slots_.size(),
                                         " slot sockets under ", options_.socket_dir, "/slots")
                          : "");
  return absl::OkStatus();
}

void Daemon::Impl::MakeStatusView() {
  StatusView::Sources s{.backend = backend_,
                        .registry = &registry_,
                        .models = &models_,
                        .access = access_.get(),
                        .preloads = preloads_.get()};
  s.publisher_of = [this](const cache::Key& key) { return publishes_.PublisherOf(key); };
  s.acquire_counts = [this] { return acquire_->counts(); };
  s.sections.emplace_back([this](const StatusView::Asker& a, v1::StatusResponse* resp) {
    artifacts_->AppendStatus(a.caller, a.filtered, a.visible, resp);
  });
  if (keeper_) {
    s.sections.emplace_back([this](const StatusView::Asker&, v1::StatusResponse* resp) {
      keeper_->Fill(resp->mutable_keeper());
    });
  }
  s.sections.emplace_back([this](const StatusView::Asker& a, v1::StatusResponse* resp) {
    if (a.admin) integrity_->AppendFindings(resp);
  });
  if (staging_pool_) s.staging = [this] { return staging_pool_->counters(); };
  s.control = [this]() -> const ControlListener* { return control_.get(); };
  s.handles = [this]() -> const HandleChannel* { return handles_.get(); };
  s.peer_port = [this] { return peer_api_->listener(); };
  s.scrub_interval = options_.scrub_interval;
  status_ = std::make_unique<StatusView>(std::move(s));
}

// Engines running as other uids reach the sockets through --socket_gid (sockets 0660; the
// directory got it when it was created); the handle channel's uid allowlist still applies.
absl::Status Daemon::Impl::ShareSocketsWithGroup() {
  if (options_.socket_gid < 0) return absl::OkStatus();
  for (const std::string& p : {control_path(), handle_path()}) {
    WC_RETURN_IF_ERROR(ChangeGroup(p, options_.socket_gid));
  }
  WC_RETURN_IF_ERROR(GroupSlotSockets(slots_, options_.socket_gid));
  return absl::OkStatus();
}

void Daemon::Impl::MakeIntegrity() {
  IntegrityService::Links links;
  links.notify = [this](const std::string& lease_id, const std::string& line) {
    if (handles_) handles_->Notify(lease_id, line);
  };
  links.hold = [this](const std::string& model) { return preloads_->Hold(model); };
  links.release = [this](const std::string& model) { preloads_->Release(model); };
  integrity_ = std::make_unique<IntegrityService>(
      IntegrityService::Options{.scrub = {options_.scrub_interval, options_.scrub_bytes_per_second},
                                .reload_interval = options_.corrupt_reload_interval},
      backend_->kind(), registry_, models_, admission_, *access_, std::move(links),
      options_.metrics,
      hooks_ == nullptr
          ? Scrubber::DigestHook()
          : [h = hooks_](const std::string& model, size_t segment, std::vector<uint64_t>* chunks) {
              h->BeforeDigestCompare(model, segment, chunks);
            });
}

void Daemon::Impl::AdoptFromKeeper() {
  // Artifacts in memory are deposited too, and those the keeper held come back first.
  keeper_->SetArtifacts(&artifacts_->store());
  // Before serving and before the preloads: what the keeper holds is ready at once, and
  // the preloads join it (only entries that were loading at the crash load again).
  keeper_->AdoptAll(
      [this](const v1::KeeperRecord& r) {
        return models_.AdmitKept(r.model(), r.model_dir(), r.defined_inline(), r.spec_yaml());
      },
      [this](const cache::Key& key, const v1::PublisherInfo& who) {
        publishes_.RecordPublisher(key, who);
      });
  keeper_->StartWatch();
}

absl::Status Daemon::Impl::PrepareSockets() {
  WC_RETURN_IF_ERROR(RemoveStaleSocket(control_path(), {.label = "", .server = "daemon"}));
  WC_RETURN_IF_ERROR(RemoveStaleSocket(handle_path(), {.label = "", .server = "daemon"}));
  if (const auto& nr = options_.namespace_rules; nr.enabled) {
    WC_ASSIGN_OR_RETURN(slots_,
                        PrepareSlotDirs(options_.socket_dir, nr.slots, options_.socket_gid));
  }
  if (!options_.admin_socket_dir.empty()) {
    // The daemon's alone: created 0700, never given the engines' group (the socket is 0600).
    WC_RETURN_IF_ERROR(Annotate(PrepareSocketDir(options_.admin_socket_dir, 0700),
                                "--admin_socket_dir=" + options_.admin_socket_dir));
    WC_RETURN_IF_ERROR(RemoveStaleSocket(admin_path(), {.label = "", .server = "daemon"}));
  }
  return absl::OkStatus();
}

// A token names what it claims: a publish's writable segments, an artifact, or a lease.
absl::Status Daemon::Impl::StartHandleChannel() {
  HandleChannel::Options hopts;
  hopts.path = handle_path();
  for (const auto& s : slots_) hopts.slot_sockets.push_back({s.slot, s.handle});
  hopts.allowed_uids = options_.allowed_uids;
  hopts.max_connections = options_.max_handle_connections;
  hopts.max_connections_unresolved = options_.max_connections_unresolved;
  WC_ASSIGN_OR_RETURN(handles_,
                      HandleChannel::Start(
                          hopts,
                          [this](const std::string& t, const PeerCred& p, const std::string& slot) {
                            if (publishes_.IsToken(t)) return publishes_.Claim(t, p, slot);
                            if (artifacts_->grants().IsToken(t)) {
                              return artifacts_->grants().Claim(t, slot);
                            }
                            return leases_.Claim(t, p, slot);
                          },
                          [this](const std::string& id) {
                            if (ArtifactGrants::IsGrant(id)) return;  // nothing held
                            if (!publishes_.OnClose(id)) registry_.RemoveLease(id);
                          },
                          [this] {
                            leases_.ExpireTokens();
                            publishes_.ExpireTokens();
                            artifacts_->grants().ExpireTokens();
                          }));
  return absl::OkStatus();
}

absl::Status Daemon::Impl::StartControlServer() {
  service_ = MakeGrpcService(this);
  grpc_ = BuildControlServer(service_.get(), options_.grpc_memory_bytes, options_.grpc_max_threads);
  if (!grpc_) return absl::UnavailableError("gRPC: the control server did not start");
  ControlListener::Options lo;
  lo.path = control_path();
  for (const auto& s : slots_) lo.slot_sockets.push_back({s.slot, s.control});
  lo.admin_path = admin_path();
  lo.allowed_uids = options_.allowed_uids;
  lo.max_connections = options_.max_connections;
  lo.max_connections_per_pod = options_.max_connections_per_pod;
  lo.max_connections_unresolved = options_.max_connections_unresolved;
  if (options_.metrics != nullptr) {
    lo.on_relay_closed = [m = options_.metrics](const std::string& limit) {
      m->OnRefused("http2_" + limit);
    };
  }
  WC_ASSIGN_OR_RETURN(control_, ControlListener::Start(lo, [server = grpc_.get()](int fd) {
                        grpc::AddInsecureChannelFromFd(server, fd);
                      }));
  return absl::OkStatus();
}

void Daemon::Impl::Shutdown() {
  // Only the request: any thread (the signal thread) may call it; the teardown itself runs
  // in Wait() (or the destructor), so whoever destroys the daemon has seen it finish.
  MutexLock l(wait_mu_);
  shutdown_ = true;
  wait_cv_.NotifyAll();  // under the lock: the caller touches nothing after it returns
}

void Daemon::Impl::Wait() {
  {
    MutexLock l(wait_mu_);
    while (!shutdown_) wait_cv_.Wait(wait_mu_);
  }
  Teardown();
}

void Daemon::Impl::Teardown() {
  std::call_once(teardown_once_, [this] {
    // Each step is timed (loads still running named): a slow shutdown explains itself.
    StepClock clock;
    auto step = [&clock](std::string what) { clock.Step(std::move(what)); };
    // 1. Cancel: no new load starts, loads stop at their next chunk, waits in Acquire and
    //    Load return CANCELLED now (an Acquire waiting for a load would hold gRPC for up to
    //    the acquire wait otherwise).
    // The listener stops accepting and removes control.sock; the connections it accepted
    // stay relayed until gRPC has drained, so the calls in flight get their answers.
    if (pod_volumes_) pod_volumes_->Stop();  // the CSI plugin's calls: UNAVAILABLE from now
    if (control_) control_->StopAccepting();
    step("control listener");
    if (integrity_) integrity_->Stop();  // a digest in progress ends at its next piece
    step("scrubber");
    registry_.Stop();
    models_.Stop();  // hashing stops
    // The keeper keeps what it holds: a daemon stopped for an upgrade re-adopts it.
    if (keeper_) keeper_->Stop();
    step("keeper link");
    if (preloads_) preloads_->Stop();
    step("preload thread");
    WC_LOG_DEBUG("teardown: loads and waits cancelled");
    // 2. Stop accepting and drain the RPCs in flight, bounded; the server before the service
    //    it calls into (gRPC requires the service to outlive the server).
    if (peer_api_ && !options_.peer.listen.empty()) {
      peer_api_->Stop();
      step("peer API");
    }
    if (grpc_) {
      grpc_->Shutdown(std::chrono::system_clock::now() + options_.shutdown_grace);
      WC_LOG_DEBUG("teardown: gRPC stopped accepting, calls drained");
      grpc_->Wait();
    }
    // No handler runs now: the connections close (the listener object stays until the
    // daemon goes, for the readiness and metrics readers that may still ask it).
    if (control_) control_->CloseConnections();
    grpc_.reset();
    service_.reset();
    step("gRPC drain");
    // 3. Close the handle channel (it removes handle.sock): leases end, engines keep their maps.
    handles_.reset();
    step("handle channel");
    // 4. The load threads (cancelled in 1, each ends at its next chunk), joined while
    //    everything they call into is alive. Entries are released when the registry goes.
    const std::vector<std::string> loads = registry_.JoinLoads();
    step(loads.empty() ? "load threads"
                       : absl::StrCat("load threads (", absl::StrJoin(loads, "; "), ")"));
    clock.Report("load threads joined");
  });
}

// ---- Daemon ----

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options,
                                                      memory::Backend* backend) {
  return StartWithHooks(std::move(options), backend, /*hooks=*/nullptr);
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::StartWithHooks(DaemonOptions options,
                                                               memory::Backend* backend,
                                                               DaemonHooks* hooks) {
  auto impl = std::make_unique<Impl>(std::move(options), backend, hooks);
  WC_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

Daemon::Daemon(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)), pod_volumes_(&impl_->pod_volumes()) {}
Daemon::~Daemon() = default;
std::string Daemon::control_socket() const { return impl_->control_path(); }
std::string Daemon::admin_socket() const { return impl_->admin_path(); }
std::string Daemon::handle_socket() const { return impl_->handle_path(); }
int Daemon::peer_port() const { return impl_->peer_port(); }
std::pair<bool, std::string> Daemon::Readiness() const { return impl_->status().Readiness(); }
const metrics::StateSource* Daemon::state_source() const { return &impl_->status(); }
void Daemon::Wait() { impl_->Wait(); }
void Daemon::Shutdown() { impl_->Shutdown(); }

}  // namespace weightcache::server
