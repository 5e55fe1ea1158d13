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
#include "pkg/load/plan.h"
#include "pkg/server/hooks.h"
#include "pkg/server/internal/access.h"
#include "pkg/server/internal/daemon_impl.h"
#include "pkg/server/internal/preloads.h"
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
      leases_(&registry_, options_.token_ttl),
      publishes_(options_, backend_, registry_, admission_, models_, handle_path()) {
  registry_.SetLoadDoneCallback(
      [this](const cache::Entry& e, const absl::Status& st, double seconds) {
        if (options_.metrics != nullptr && st.ok()) {
          options_.metrics->OnLoad(e.model, e.source, seconds, e.progress.total());
        }
      });
  registry_.SetLingeringSource(
      [this](const std::string& device) { return backend_->LingeringBytes(device); });
  registry_.SetEvictCallback([this](const std::string& model, const std::string& reason) {
    if (options_.metrics != nullptr) options_.metrics->OnEviction(model, reason);
  });
  if (!options_.keeper_socket.empty()) {
    keeper_ = std::make_unique<KeeperLink>(
        KeeperLink::Options{.socket_path = options_.keeper_socket,
                            .io_timeout = options_.keeper_timeout,
                            .claim_wait = options_.keeper_claim_wait},
        backend_, &registry_, options_.metrics,
        [this](const std::string& model) {
          return RecordedSpec{models_.SpecYaml(model), models_.DefinedInline(model)};
        },
        [this](const cache::Key& key) { return publishes_.PublisherOf(key); });
    registry_.SetObserver(keeper_.get());
  }
}

Daemon::Impl::~Impl() {
  Shutdown();
  Teardown();
}

std::string Daemon::Impl::control_path() const {
  return options_.socket_dir + "/" + kControlSocketName;
}
std::string Daemon::Impl::admin_path() const {
  return options_.admin_socket_dir.empty() ? std::string()
                                           : options_.admin_socket_dir + "/" + kControlSocketName;
}
std::string Daemon::Impl::handle_path() const {
  return options_.socket_dir + "/" + kHandleSocketName;
}

absl::Status Daemon::Impl::AdmitAdopted(const v1::KeeperRecord& r) {
  const std::string& name = r.model();
  if (auto current = models_.Spec(name)) {
    // Still configured: its current spec, with its current access rules, serves it. Only
    // if it still reads the directory the bytes came from.
    if (current->model_dir != r.model_dir()) {
      return absl::FailedPreconditionError(
          absl::StrCat("model '", name, "' is now configured with model_dir ", current->model_dir,
                       ", not ", r.model_dir(), " its cached copy came from"));
    }
    return absl::OkStatus();
  }
  if (r.defined_inline() && !r.spec_yaml().empty()) {
    // An admin's inline spec stays defined across a restart, as the admin wrote it.
    auto specs = spec::ParseSpecs(r.spec_yaml(), "keeper record of " + name);
    if (!specs.ok()) return specs.status();
    if (specs->size() != 1 || specs->front().name != name) {
      return absl::InvalidArgumentError(
          absl::StrCat("keeper record of '", name, "': its spec_yaml is not that model's spec"));
    }
    models_.Define(specs->front());
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "model '", name,
      "' is no longer configured (not in the spec file, and not an admin's inline spec): "
      "revoked, its cached copy is not served again"));
}

// Start sequences the parts: the door and the stores first, what the keeper holds, the
// sockets, then serving (handles, control, peers), and the background work last.
absl::Status Daemon::Impl::Start() {
  for (const auto& s : options_.specs) {
    WC_RETURN_IF_ERROR(CheckIsolation(s, options_.namespace_rules.enabled));
  }
  WC_RETURN_IF_ERROR(PrepareSocketDir(options_.socket_dir, 0750));
  WC_RETURN_IF_ERROR(models_.OpenDigestStore(options_.digest_store));
  WC_RETURN_IF_ERROR(MakeAccess());
  preloads_ = std::make_unique<Preloads>(
      options_.preload ? options_.specs : std::vector<spec::ModelSpec>{}, models_, admission_,
      *access_, [h = hooks_](const std::string& model) {
        if (h != nullptr) h->BeforePreload(model);
      });
  MakeIntegrity();
  WC_ASSIGN_OR_RETURN(auto store,
                      artifact::Store::Open({options_.artifact_budget_bytes,
                                             options_.artifact_max_bytes, options_.artifact_dir}));
  artifacts_ = std::make_unique<ArtifactService>(
      ArtifactService::Options{.handle_socket = handle_path(),
                               .slot_handle_socket = SlotHandleSocketInContainer(
                                   options_.socket_dir, options_.namespace_rules),
                               .dir = options_.artifact_dir,
                               .token_ttl = options_.token_ttl},
      std::move(store), *access_, models_, options_.metrics);
  if (keeper_) AdoptFromKeeper();
  artifacts_->ReportResident();
  WC_RETURN_IF_ERROR(PrepareSockets());
  WC_RETURN_IF_ERROR(StartHandleChannel());
  // Preloads are opened (maybe hashed) on their own thread while the daemon serves; their
  // names are pending until their entries are registered, so a client never sees a daemon
  // that knows a model but has no entry for it yet as a miss (it waits or hears why).
  preloads_->MarkPending();
  WC_RETURN_IF_ERROR(StartControlServer());
  WC_RETURN_IF_ERROR(StartPeerServer());
  WC_RETURN_IF_ERROR(StartPeerFill());
  if (options_.socket_gid >= 0) {
    // Engines running as other uids reach the sockets through this group (dir 0750,
    // sockets 0660); the handle channel's uid allowlist still applies.
    for (const std::string& p : {options_.socket_dir, control_path(), handle_path()}) {
      WC_RETURN_IF_ERROR(ChangeGroup(p, options_.socket_gid));
    }
    WC_RETURN_IF_ERROR(GroupSlotSockets(slots_, options_.socket_gid));
  }
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

absl::Status Daemon::Impl::MakeAccess() {
  std::unique_ptr<NamespaceRules> rules;
  if (options_.namespace_rules.enabled) {
    WC_ASSIGN_OR_RETURN(rules, NamespaceRules::Create(options_.namespace_rules));
  }
  PolicyOptions po;
  po.admin_uids = options_.admin_uids;
  po.admin_gids = options_.admin_gids;
  po.publish_uids = options_.publish_uids;
  po.publish_gids = options_.publish_gids;
  po.publish_namespaces = options_.publish_namespaces;
  po.admin_socket = admin_path();
  access_ = std::make_unique<Access>(
      std::move(po), std::move(rules), models_,
      [this](const std::string& grpc_peer) {
        return control_ ? control_->PeerOf(grpc_peer) : std::nullopt;
      },
      options_.max_connections_per_uid, options_.metrics);
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
      Scrubber::Options{options_.scrub_interval, options_.scrub_bytes_per_second}, backend_->kind(),
      registry_, models_, admission_, *access_, std::move(links), options_.metrics,
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
  keeper_->AdoptAll([this](const v1::KeeperRecord& r) { return AdmitAdopted(r); },
                    [this](const cache::Key& key, const v1::PublisherInfo& who) {
                      publishes_.RecordPublisher(key, who);
                    });
  keeper_->StartWatch();
}

absl::Status Daemon::Impl::PrepareSockets() {
  WC_RETURN_IF_ERROR(RemoveStaleSocket(control_path()));
  WC_RETURN_IF_ERROR(RemoveStaleSocket(handle_path()));
  if (const auto& nr = options_.namespace_rules; nr.enabled) {
    WC_ASSIGN_OR_RETURN(slots_,
                        PrepareSlotDirs(options_.socket_dir, nr.slots, options_.socket_gid));
  }
  if (!options_.admin_socket_dir.empty()) {
    // The daemon's alone: 0700, never given the engines' group.
    WC_RETURN_IF_ERROR(PrepareSocketDir(options_.admin_socket_dir, 0700));
    WC_RETURN_IF_ERROR(RemoveStaleSocket(admin_path()));
  }
  return absl::OkStatus();
}

// A token names what it claims: a publish's writable segments, an artifact, or a lease.
absl::Status Daemon::Impl::StartHandleChannel() {
  HandleChannel::Options hopts;
  hopts.path = handle_path();
  for (const auto& s : slots_) hopts.slot_sockets.push_back({s.slot, s.handle});
  hopts.allowed_uids = options_.allowed_uids;
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
  grpc::ServerBuilder builder;
  // No listening port: ControlListener accepts (peer credentials, caps, EMFILE back-off)
  // and hands each connection over.
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(1 << 20);  // requests are small; bound them
  builder.SetMaxSendMessageSize(256 << 20);   // manifests of very large models
  // Memory and threads bounded: a flood of streams or connections costs at most this.
  grpc::ResourceQuota quota("weightcache-control");
  quota.Resize(options_.grpc_memory_bytes);
  quota.SetMaxThreads(options_.grpc_max_threads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 16);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 << 10);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 30 * 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10 * 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 3);
  grpc_ = builder.BuildAndStart();
  if (!grpc_) return absl::UnavailableError("gRPC: the control server did not start");
  ControlListener::Options lo;
  lo.path = control_path();
  for (const auto& s : slots_) lo.slot_sockets.push_back({s.slot, s.control});
  lo.admin_path = admin_path();
  lo.allowed_uids = options_.allowed_uids;
  lo.max_connections = options_.max_connections;
  lo.max_connections_per_uid = options_.max_connections_per_uid;
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
    // Each step is timed: a teardown longer than a second logs which steps it waited on
    // (and which loads were still running), so a slow shutdown explains itself.
    const auto t0 = std::chrono::steady_clock::now();
    auto mark = t0;
    std::vector<std::pair<std::string, double>> steps;
    auto step = [&](std::string what) {
      const auto now = std::chrono::steady_clock::now();
      steps.emplace_back(std::move(what), std::chrono::duration<double>(now - mark).count());
      mark = now;
    };
    // 1. Cancel: no new load starts, loads stop at their next chunk, waits in Acquire and
    //    Load return CANCELLED now (an Acquire waiting for a load would hold gRPC for up to
    //    --acquire_wait otherwise).
    // The listener stops accepting and removes control.sock; the connections it accepted
    // stay relayed until gRPC has drained, so the calls in flight get their answers.
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
    if (peer_grpc_) {
      peer_grpc_->Shutdown(std::chrono::system_clock::now() + options_.shutdown_grace);
      peer_grpc_->Wait();
      peer_exposures_.reset();  // no Describe runs now; pulls in flight fail at the peers
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
    // 3. Close the handle channel (it removes handle.sock); leases end, and engines keep
    //    what they mapped.
    handles_.reset();
    step("handle channel");
    // 4. The load threads (cancelled in 1, each ends at its next chunk), joined while
    //    everything they call into is alive. Entries are released when the registry goes.
    const std::vector<std::string> loads = registry_.JoinLoads();
    step(loads.empty() ? "load threads"
                       : absl::StrCat("load threads (", absl::StrJoin(loads, "; "), ")"));
    const double total = std::chrono::duration<double>(mark - t0).count();
    const double joined = steps.back().second;  // how long cancelled loads took to stop
    if (total > 1.0) {
      std::vector<std::string> waited;
      for (const auto& [what, secs] : steps) {
        if (secs >= 0.1) waited.push_back(absl::StrFormat("%s %.3f s", what, secs));
      }
      WC_LOG_WARN(
          "shut down in %.3f s (load threads joined in %.3f s), longer than a second; it waited "
          "on: %s",
          total, joined,
          waited.empty() ? "no single step over 0.1 s" : absl::StrJoin(waited, ", "));
    } else {
      WC_LOG_INFO("shut down in %.3f s (load threads joined in %.3f s)", total, joined);
    }
  });
}

absl::Status Daemon::Impl::Release(const Caller& caller, const v1::ReleaseRequest& req) {
  const std::optional<cache::LeaseRecord> lease = registry_.FindLease(req.lease_id());
  if (lease) {
    Object o;
    o.lease = req.lease_id();
    o.owner_uid = static_cast<uid_t>(lease->owner_uid);
    o.owner_slot = lease->slot;
    WC_RETURN_IF_ERROR(access_->Authorize(caller, Verb::kRelease, o));
  }
  if (!leases_.End(req.lease_id())) {
    return absl::NotFoundError(absl::StrCat("lease ", req.lease_id(), " is not active"));
  }
  handles_->CloseLease(req.lease_id());
  return absl::OkStatus();
}

absl::Status Daemon::Impl::Load(const Caller& caller, const v1::LoadRequest& req,
                                const std::function<bool(const v1::LoadProgress&)>& publish) {
  if (req.spec_yaml().empty()) return LoadDefined(caller, req.model(), req, publish);
  WC_RETURN_IF_ERROR(access_->Authorize(caller, Verb::kDefine, {}));
  WC_ASSIGN_OR_RETURN(auto specs, spec::ParseSpecs(req.spec_yaml(), "LoadRequest.spec_yaml"));
  if (specs.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadRequest.spec_yaml: holds ", specs.size(), " specs; send exactly one"));
  }
  WC_RETURN_IF_ERROR(CheckIsolation(specs[0], options_.namespace_rules.enabled));
  // An inline spec is defined by a Load that succeeds: a refused or failed one leaves the
  // name as it was (undefined, or the spec file's or an earlier inline spec).
  const ModelCatalog::Previous previous = models_.Define(specs[0]);
  absl::Status s = LoadDefined(caller, specs[0].name, req, publish);
  if (!s.ok()) models_.Restore(previous);
  return s;
}

absl::Status Daemon::Impl::LoadDefined(
    const Caller& caller, const std::string& name, const v1::LoadRequest& req,
    const std::function<bool(const v1::LoadProgress&)>& publish) {
  if (name.empty()) return absl::InvalidArgumentError("Load: set model or spec_yaml");
  Object object = access_->ModelObject(name);
  WC_RETURN_IF_ERROR(access_->Authorize(caller, Verb::kLoad, object));
  // Load re-reads the files (and hashes what changed): an admin's always, an engine's at most
  // once per --refresh_interval per model; in between it loads the identity read last, whose
  // open files are the versions it describes (issue 25: every Load re-stat'ed and could
  // re-hash).
  const bool refresh =
      access_->IsAdmin(caller) || models_.TakeRefresh(name, options_.refresh_interval);
  WC_ASSIGN_OR_RETURN(auto opened, models_.Open(name, refresh));
  // One rank when the request names it; else every rank of the spec.
  std::vector<spec::Layout> layouts;
  if (req.has_layout()) {
    WC_ASSIGN_OR_RETURN(auto layout, admission_.LayoutFrom(req.layout()));
    layouts.push_back(layout);
  } else {
    const auto& s = opened->spec;
    std::vector<int> ranks = s.tp_ranks;
    if (ranks.empty()) {
      for (int r = 0; r < s.tp_size; ++r) ranks.push_back(r);
    }
    for (int r : ranks) layouts.push_back({s.tp_size, r, s.pp_size, s.pp_rank});
  }
  WC_ASSIGN_OR_RETURN(auto asked, admission_.EnvFrom(req.env()));
  WC_ASSIGN_OR_RETURN(const std::vector<std::string> tenants,
                      access_->TenantsToLoad(&caller, opened->spec));
  std::vector<Admission::GroupRank> group;
  for (const std::string& tenant : tenants) {
    for (const auto& layout : layouts) {
      spec::Environment env = asked.env;
      env.tenant = tenant;
      // No device named: the placement rule (rank r on the r-th device), at its capability.
      const std::string device = asked.device_uuid.empty()
                                     ? DefaultDeviceForRank(backend_->Devices(), layout.tp_rank)
                                     : asked.device_uuid;
      if (asked.device_uuid.empty() && req.env().compute_capability().empty()) {
        for (const auto& d : backend_->Devices()) {
          if (d.uuid == device) env.compute_capability = d.compute_capability;
        }
      }
      group.push_back({layout, env, device});
    }
  }
  std::vector<std::string> undeclared;
  for (const auto& g : group) {
    std::string why = admission_.UndeclaredPlacement(opened->spec, g.layout, g.env, g.device_uuid);
    if (!why.empty()) undeclared.push_back(std::move(why));
  }
  if (!undeclared.empty()) {
    object.undeclared_placement = absl::StrJoin(undeclared, "; ");
    WC_RETURN_IF_ERROR(access_->Authorize(caller, Verb::kLoad, object));
  }
  // Several ranks load together: one pass over the files for all of them.
  std::vector<std::shared_ptr<cache::Entry>> entries;
  for (auto& e : admission_.StartGroupLoad(opened, group)) {
    WC_RETURN_IF_ERROR(e.status());
    entries.push_back(std::move(*e));
  }
  auto t0 = std::chrono::steady_clock::now();
  while (true) {
    v1::LoadProgress p;
    p.set_model(name);
    bool loading = false;
    absl::Status failed;
    for (const auto& e : entries) {
      absl::Status s = registry_.WaitReady(e, std::chrono::steady_clock::now());
      const bool rank_loading = s.code() == absl::StatusCode::kDeadlineExceeded;
      auto* r = p.add_ranks();
      LayoutToProto(e->inputs.layout, r->mutable_layout());
      r->set_fingerprint(e->fingerprint);
      r->set_device_uuid(e->device_uuid);
      r->set_state(rank_loading ? "loading" : s.ok() ? "ready" : "failed");
      r->set_bytes_done(e->progress.done());
      r->set_bytes_total(e->progress.total());
      if (!rank_loading && !s.ok()) {
        r->set_error(std::string(s.message()));
        if (failed.ok()) {
          failed = absl::Status(s.code(), entries.size() == 1
                                              ? std::string(s.message())
                                              : absl::StrCat("tp rank ", e->inputs.layout.tp_rank,
                                                             ": ", s.message()));
        }
      }
      if (rank_loading && !loading) p.set_current_file(e->progress.file());
      loading = loading || rank_loading;
      p.set_bytes_done(p.bytes_done() + e->progress.done());
      p.set_bytes_total(p.bytes_total() + e->progress.total());
    }
    p.set_fingerprint(entries.front()->fingerprint);
    p.set_elapsed_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    p.set_state(loading ? "loading" : failed.ok() ? "ready" : "failed");
    if (!loading && !failed.ok()) p.set_error(std::string(failed.message()));
    if (!publish(p)) return absl::CancelledError("Load: client went away");
    if (!loading) return failed;
    // Until the first unfinished rank ends, or the next progress report is due.
    for (const auto& e : entries) {
      auto s =
          registry_.WaitReady(e, std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
      if (s.code() == absl::StatusCode::kDeadlineExceeded) break;
    }
  }
}

absl::Status Daemon::Impl::Evict(const Caller& caller, const v1::EvictRequest& req,
                                 v1::EvictResponse* resp) {
  WC_RETURN_IF_ERROR(access_->Authorize(caller, Verb::kEvict, {}));
  // The entries to evict: every device's entry of the fingerprint, or of the spec.
  std::vector<cache::Key> keys;
  std::set<std::string> other_names;
  if (req.target_case() == v1::EvictRequest::kFingerprint) {
    for (const auto& e : registry_.FindAll(req.fingerprint())) keys.push_back(e->key);
  } else if (req.target_case() == v1::EvictRequest::kModel) {
    // A spec's entries: those it loaded, and those of other names that this spec reproduces
    // in its own layout (same content, same tp/pp sizes). Those other names lose them too.
    auto opened = models_.Open(req.model(), /*refresh=*/false);
    for (const auto& s : registry_.Snapshot()) {
      if (s.state == cache::State::kDraining) continue;
      bool mine = s.model == req.model();
      if (!mine && opened.ok()) mine = (*opened)->Reproduces(s.inputs, s.fingerprint);
      if (!mine) continue;
      keys.push_back({s.fingerprint, s.device_uuid});
      for (const auto& n : models_.NamesOf(s)) {
        if (n != req.model()) other_names.insert(n);
      }
    }
    if (!opened.ok() && keys.empty()) return opened.status();  // an unknown name says so
  } else {
    return absl::InvalidArgumentError("Evict: set either model or fingerprint");
  }
  uint32_t n = 0, draining = 0;
  for (const auto& key : keys) {
    const auto r = registry_.Evict(key, "api");
    n += r != cache::Registry::Evicted::kNone ? 1 : 0;
    draining += r == cache::Registry::Evicted::kDraining ? 1 : 0;
  }
  if (n == 0) {
    return absl::NotFoundError(absl::StrCat("nothing to evict for ",
                                            req.target_case() == v1::EvictRequest::kModel
                                                ? "model '" + req.model() + "'"
                                                : "fingerprint " + req.fingerprint(),
                                            " (not cached, or still loading)"));
  }
  resp->set_evicted(n);
  resp->set_draining(draining);
  for (const auto& name : other_names) resp->add_other_names(name);
  return absl::OkStatus();
}

absl::StatusOr<PublishManager*> Daemon::Impl::Publisher(const Caller& caller,
                                                        const std::string& model) {
  WC_RETURN_IF_ERROR(access_->AuthorizePublish(caller, model));
  return &publishes_;
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

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Daemon::~Daemon() = default;
std::string Daemon::control_socket() const { return impl_->control_path(); }
std::string Daemon::admin_socket() const { return impl_->admin_path(); }
std::string Daemon::handle_socket() const { return impl_->handle_path(); }
int Daemon::peer_port() const { return impl_->peer_port(); }
std::pair<bool, std::string> Daemon::Readiness() const { return impl_->Readiness(); }
const metrics::StateSource* Daemon::state_source() const { return impl_.get(); }
void Daemon::Wait() { impl_->Wait(); }
void Daemon::Shutdown() { impl_->Shutdown(); }

}  // namespace weightcache::server
