#include "pkg/server/daemon.h"

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
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::server {
Daemon::Impl::Impl(DaemonOptions options, memory::Backend* backend)
    : options_(std::move(options)),
      backend_(backend),
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
        KeeperLink::Options{options_.keeper_socket}, backend_, &registry_, options_.metrics,
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

void Daemon::Impl::StartPreloads() {
  for (const auto& s : options_.specs) {
    if (options_.before_preload_hook) options_.before_preload_hook(s.name);
    auto opened = models_.Open(s.name, /*refresh=*/false);
    std::vector<int> ranks = s.tp_ranks;
    if (ranks.empty()) {
      for (int r = 0; r < s.tp_size; ++r) ranks.push_back(r);
    }
    if (!opened.ok()) {
      WC_LOG_ERROR("preload %s: %s", s.name, std::string(opened.status().message()));
    } else {
      // The ranks of the spec load together: one pass over the files for all of them.
      std::vector<Admission::GroupRank> group;
      for (int r : ranks) {
        const Admission::AskedEnv placed = admission_.Placed(r);
        group.push_back({{s.tp_size, r, s.pp_size, s.pp_rank}, placed.env, placed.device_uuid});
      }
      auto started = admission_.StartGroupLoad(*opened, group);
      for (size_t i = 0; i < group.size(); ++i) {
        const int r = group[i].layout.tp_rank;
        const std::string& device = group[i].device_uuid;
        if (!started[i].ok()) {
          WC_LOG_ERROR("preload %s rank %d on %s: %s", s.name, r, device,
                       std::string(started[i].status().message()));
          continue;
        }
        WC_LOG_INFO("preload %s rank %d/%d on %s", s.name, r, s.tp_size, device);
        MutexLock l(mu_);
        preloads_.push_back((*started[i])->key);
      }
    }
    {
      MutexLock l(mu_);
      pending_preloads_.erase(s.name);
    }
    preload_cv_.NotifyAll();
  }
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

absl::Status Daemon::Impl::AwaitPreload(const std::string& name, bool wait,
                                        std::chrono::steady_clock::time_point deadline) {
  MutexLock l(mu_);
  if (pending_preloads_.count(name) == 0) return absl::OkStatus();
  if (wait) {
    while (!stopping_ && pending_preloads_.count(name) != 0) {
      if (!preload_cv_.WaitUntil(mu_, deadline)) break;
    }
    if (pending_preloads_.count(name) == 0) return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat(
      "model '", name,
      "' is being opened for its preload (its files are read and identified); ask with "
      "wait_ready to wait"));
}

absl::Status Daemon::Impl::Start() {
  WC_RETURN_IF_ERROR(PrepareSocketDir(options_.socket_dir, 0750));
  WC_RETURN_IF_ERROR(models_.OpenDigestStore(options_.digest_store));
  if (keeper_) {
    // Before serving and before the preloads: what the keeper holds is ready at once, and
    // the preloads join it (only entries that were loading at the crash load again).
    keeper_->AdoptAll([this](const v1::KeeperRecord& r) { return AdmitAdopted(r); },
                      [this](const cache::Key& key, const v1::PublisherInfo& who) {
                        publishes_.RecordPublisher(key, who);
                      });
    keeper_->StartWatch();
  }
  WC_RETURN_IF_ERROR(RemoveStaleSocket(control_path()));
  WC_RETURN_IF_ERROR(RemoveStaleSocket(handle_path()));
  if (const auto& nr = options_.namespace_rules; nr.enabled) {
    WC_ASSIGN_OR_RETURN(rules_, NamespaceRules::Create(nr));
    WC_ASSIGN_OR_RETURN(slots_,
                        PrepareSlotDirs(options_.socket_dir, nr.slots, options_.socket_gid));
  }
  if (!options_.admin_socket_dir.empty()) {
    // The daemon's alone: 0700, never given the engines' group.
    WC_RETURN_IF_ERROR(PrepareSocketDir(options_.admin_socket_dir, 0700));
    WC_RETURN_IF_ERROR(RemoveStaleSocket(admin_path()));
  }
  PolicyOptions po;
  po.admin_uids = options_.admin_uids;
  po.admin_gids = options_.admin_gids;
  po.publish_uids = options_.publish_uids;
  po.publish_gids = options_.publish_gids;
  po.publish_namespaces = options_.publish_namespaces;
  po.admin_socket = admin_path();
  policy_ = std::make_unique<Policy>(std::move(po), rules_.get());
  HandleChannel::Options hopts;
  hopts.path = handle_path();
  for (const auto& s : slots_) hopts.slot_sockets.push_back({s.slot, s.handle});
  hopts.allowed_uids = options_.allowed_uids;
  WC_ASSIGN_OR_RETURN(handles_,
                      HandleChannel::Start(
                          hopts,
                          [this](const std::string& t, const PeerCred& p, const std::string& slot) {
                            return publishes_.IsToken(t) ? publishes_.Claim(t, p, slot)
                                                         : leases_.Claim(t, p, slot);
                          },
                          [this](const std::string& id) {
                            if (!publishes_.OnClose(id)) registry_.RemoveLease(id);
                          },
                          [this] {
                            leases_.ExpireTokens();
                            publishes_.ExpireTokens();
                          }));

  // Preloads are opened (maybe hashed) on their own thread while the daemon serves; their
  // names are pending until their entries are registered, so a client never sees a daemon
  // that knows a model but has no entry for it yet as a miss (it waits or hears why).
  if (options_.preload) {
    MutexLock l(mu_);
    for (const auto& s : options_.specs) pending_preloads_.insert(s.name);
  }

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
  WC_ASSIGN_OR_RETURN(control_, ControlListener::Start(lo, grpc_.get()));
  if (options_.socket_gid >= 0) {
    // Engines running as other uids reach the sockets through this group (dir 0750,
    // sockets 0660); the handle channel's uid allowlist still applies.
    for (const std::string& p : {options_.socket_dir, control_path(), handle_path()}) {
      WC_RETURN_IF_ERROR(ChangeGroup(p, options_.socket_gid));
    }
    WC_RETURN_IF_ERROR(GroupSlotSockets(slots_, options_.socket_gid));
  }
  if (options_.preload) preload_thread_ = std::thread([this] { StartPreloads(); });
  WC_LOG_INFO("serving on %s (handles on %s%s), backend %s, peer policy %s%s", control_path(),
              handle_path(),
              admin_path().empty() ? "; no admin socket" : "; admin socket " + admin_path(),
              memory::BackendName(backend_->kind()), PeerPolicyName(options_.peer_policy),
              rules_ ? absl::StrCat("; namespace rules on, ", slots_.size(), " slot sockets under ",
                                    options_.socket_dir, "/slots")
                     : "");

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
    control_.reset();  // stops accepting and removes control.sock
    step("control listener");
    registry_.Stop();
    models_.Stop();  // hashing stops
    // The keeper keeps what it holds: a daemon stopped for an upgrade re-adopts it.
    if (keeper_) keeper_->Stop();
    step("keeper link");
    {
      MutexLock l(mu_);
      stopping_ = true;
    }
    preload_cv_.NotifyAll();
    if (preload_thread_.joinable()) preload_thread_.join();
    step("preload thread");
    WC_LOG_DEBUG("teardown: loads and waits cancelled");
    // 2. Stop accepting and drain the RPCs in flight, bounded; the server before the service
    //    it calls into (gRPC requires the service to outlive the server).
    if (grpc_) {
      grpc_->Shutdown(std::chrono::system_clock::now() + options_.shutdown_grace);
      WC_LOG_DEBUG("teardown: gRPC stopped accepting, calls drained");
      grpc_->Wait();
      grpc_.reset();
    }
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

std::string Daemon::Impl::CheckStale(const std::shared_ptr<const load::OpenedModel>& opened) {
  const std::vector<std::string> changed = opened->ChangedFiles();
  if (changed.empty()) return "";
  std::string what = absl::StrJoin(changed, "; ");
  // The entries loaded from the earlier versions: this spec's content in any layout.
  for (const auto& s : registry_.Snapshot()) {
    if (s.state != cache::State::kReady) continue;
    if (opened->Inputs(s.inputs.layout, s.inputs.env).Digest() != s.fingerprint) continue;
    if (auto e = registry_.Find({s.fingerprint, s.device_uuid})) registry_.MarkStale(e, what);
  }
  return what;
}

void Daemon::Impl::Count(metrics::AcquireResult r) {
  switch (r) {
    case metrics::AcquireResult::kHit:
      hits_++;
      break;
    case metrics::AcquireResult::kMiss:
      misses_++;
      break;
    case metrics::AcquireResult::kMismatch:
      mismatches_++;
      break;
    case metrics::AcquireResult::kRejected:
      rejected_++;
      break;
    case metrics::AcquireResult::kPeerCopy:
      peer_copies_++;
      break;
    case metrics::AcquireResult::kStale:
      stale_++;
      break;
    case metrics::AcquireResult::kDenied:
      denied_++;
      break;
    default:
      errors_++;
      break;
  }
}

absl::Status Daemon::Impl::Acquire(const Caller& caller, const v1::AcquireRequest& req,
                                   v1::AcquireResponse* resp, std::string* model,
                                   metrics::AcquireResult* result) {
  using metrics::AcquireResult;
  *result = AcquireResult::kError;
  auto finish = [&](AcquireResult r, absl::Status s) {
    *result = r;
    Count(r);
    return s;
  };
  auto layout = admission_.LayoutFrom(req.layout());
  if (!layout.ok()) return finish(AcquireResult::kError, layout.status());
  auto asked_env = admission_.EnvFrom(req.env());
  if (!asked_env.ok()) return finish(AcquireResult::kError, asked_env.status());
  const spec::Environment& env = asked_env->env;
  // The registry is keyed by (fingerprint, device): an empty asked device takes the entry
  // on any device; a named one takes that device's entry, or a peer copy of another's.
  const std::string& device = asked_env->device_uuid;
  auto deadline = std::chrono::steady_clock::now() + options_.acquire_wait;

  std::string fp;
  std::shared_ptr<const load::OpenedModel> opened;  // model target only
  spec::FingerprintInputs asked;
  auto asked_inputs = [&](const load::OpenedModel& m) {
    spec::FingerprintInputs in = m.Inputs(*layout, env);
    if (!req.dtype().empty()) in.dtype = req.dtype();
    if (!req.quantization().empty()) in.quant_method = req.quantization();
    return in;
  };
  if (req.target_case() == v1::AcquireRequest::kFingerprint) {
    fp = req.fingerprint();
    auto all = registry_.FindAll(fp);
    if (all.empty()) {
      return finish(AcquireResult::kMiss,
                    absl::NotFoundError(absl::StrCat("no cached entry has fingerprint ", fp)));
    }
    *model = all.front()->model;
    for (const auto& e : all) {
      if (auto s = Check(caller, Verb::kAcquire, ModelObject(e->model)); !s.ok()) {
        return finish(AcquireResult::kDenied, s);
      }
    }
  } else if (req.target_case() == v1::AcquireRequest::kModel) {
    *model = req.model();
    if (auto s = Check(caller, Verb::kAcquire, ModelObject(req.model())); !s.ok()) {
      return finish(AcquireResult::kDenied, s);
    }
    if (auto s = AwaitPreload(req.model(), req.wait_ready() || req.load_on_miss(), deadline);
        !s.ok()) {
      return finish(AcquireResult::kMiss, s);
    }
    auto o = models_.Open(req.model(), false);
    if (!o.ok()) {
      auto code = o.status().code();
      return finish(code == absl::StatusCode::kUnimplemented ? AcquireResult::kRejected
                    : code == absl::StatusCode::kNotFound    ? AcquireResult::kMiss
                                                             : AcquireResult::kError,
                    o.status());
    }
    opened = *o;
    // The asked spec's files as they are now (a stat per file): a cached entry loaded from
    // earlier versions is never a hit.
    if (const std::string changed = CheckStale(opened); !changed.empty()) {
      const std::string old_fp = asked_inputs(*opened).Digest();
      const auto old_entries = registry_.FindAll(old_fp);
      if (!old_entries.empty() && !req.load_on_miss()) {
        return finish(AcquireResult::kStale,
                      absl::FailedPreconditionError(absl::StrCat(
                          "stale: model '", req.model(), "': ", changed,
                          "; the cached weights are those of the earlier version. Load it again "
                          "(weightcachectl load ",
                          req.model(), ") or ask with load_on_miss")));
      }
      // Identify the new contents (only the changed files are hashed) and go on with them.
      auto fresh = models_.Open(req.model(), /*refresh=*/true);
      if (!fresh.ok()) {
        return finish(
            old_entries.empty() ? AcquireResult::kError : AcquireResult::kStale,
            absl::Status(fresh.status().code(), absl::StrCat("model '", req.model(), "': ", changed,
                                                             "; ", fresh.status().message())));
      }
      opened = *fresh;
      if (asked_inputs(*opened).Digest() != old_fp) {
        // The earlier version's entries: freed now (or once their clients let go).
        for (const auto& old : old_entries) registry_.Evict(old->key, "stale");
      }
    }
    asked = asked_inputs(*opened);
    fp = asked.Digest();
  } else {
    return finish(AcquireResult::kError,
                  absl::InvalidArgumentError("Acquire: set either model or fingerprint"));
  }

  std::shared_ptr<cache::Entry> e = admission_.FindOn(fp, device);
  if (e && !opened && registry_.StateOf(e) == cache::State::kReady) {
    // By fingerprint: the files this entry was loaded from must still be those versions.
    if (auto changed = load::ChangedFiles(e->files); !changed.empty()) {
      const std::string what = absl::StrJoin(changed, "; ");
      registry_.MarkStale(e, what);
      return finish(AcquireResult::kStale,
                    absl::FailedPreconditionError(absl::StrCat(
                        "stale: fingerprint ", fp.substr(0, 12), " (model '", e->model,
                        "'): ", what, "; the cached weights are those of the earlier version")));
    }
  }
  if (!e || registry_.StateOf(e) == cache::State::kFailed) {
    // Resident on another device of this node: serve it per the peer policy.
    if (auto src = admission_.PeerSource(fp, device)) {
      if (options_.peer_policy == PeerPolicy::kMiss) {
        return finish(AcquireResult::kMiss,
                      absl::NotFoundError(
                          absl::StrCat("model '", *model, "' (fingerprint ", fp.substr(0, 12),
                                       ") is cached on ", src->device_uuid, ", not on the asked ",
                                       device, ", and the daemon's --peer_policy is miss")));
      }
      if (registry_.StateOf(src) == cache::State::kLoading) {
        if (!req.wait_ready() && !req.load_on_miss()) {
          return finish(AcquireResult::kMiss,
                        absl::UnavailableError(absl::StrCat(
                            "model '", *model, "' is still loading on ", src->device_uuid,
                            "; ask with wait_ready to wait for it and a copy to ", device)));
        }
        if (auto s = registry_.WaitReady(src, deadline); !s.ok()) {
          return finish(AcquireResult::kError, s);
        }
      }
      auto copy = admission_.StartPeerCopy(src, device);
      if (!copy.ok()) return finish(AcquireResult::kError, copy.status());
      e = *copy;
      if (auto s = registry_.WaitReady(e, deadline); !s.ok()) {
        return finish(AcquireResult::kError, s);
      }
      if (auto s = FillLease(e, *model, caller, req.packed_manifest(), resp); !s.ok())
        return finish(AcquireResult::kError, s);
      return finish(AcquireResult::kPeerCopy, absl::OkStatus());
    }
  }
  if (e && registry_.StateOf(e) == cache::State::kFailed && !req.load_on_miss()) {
    return finish(AcquireResult::kError, registry_.WaitReady(e, std::chrono::steady_clock::now()));
  }
  if (!e || registry_.StateOf(e) == cache::State::kFailed) {
    if (!opened) {
      return finish(AcquireResult::kMiss,
                    absl::NotFoundError(
                        absl::StrCat("no entry with fingerprint ", fp, " is cached on ", device)));
    }
    // Published weights (a recipe) come only from their engine: never loaded on a miss.
    bool servable = asked.dtype == opened->dtype &&
                    asked.quant_method == opened->quantization.method && env.recipe.empty();
    if (req.load_on_miss() && servable) {
      Object object = ModelObject(*model);
      object.undeclared_placement =
          admission_.UndeclaredPlacement(opened->spec, *layout, env, device);
      if (auto s = Check(caller, Verb::kLoad, object); !s.ok()) {
        return finish(AcquireResult::kDenied, s);
      }
      auto started = admission_.StartLoad(opened, *layout, env, device);
      if (!started.ok()) return finish(AcquireResult::kError, started.status());
      e = *started;
      auto s = registry_.WaitReady(e, deadline);
      if (!s.ok()) return finish(AcquireResult::kError, s);
      if (auto f = FillLease(e, *model, caller, req.packed_manifest(), resp); !f.ok())
        return finish(AcquireResult::kError, f);
      return finish(AcquireResult::kMiss, absl::OkStatus());
    }
    // Another rank of the same model is a miss for this rank (listing the cached ones);
    // anything else that differs is a mismatch, explained field by field.
    std::vector<int> cached_ranks;
    std::vector<spec::FieldDiff> mismatch;
    for (const auto& other : registry_.FindByModel(req.model())) {
      auto diffs = spec::Diff(other->inputs, asked);
      if (diffs.empty()) continue;
      const bool rank_only = std::all_of(diffs.begin(), diffs.end(), [](const auto& d) {
        return d.field == "tp_rank" || d.field == "pp_rank";
      });
      if (rank_only) {
        cached_ranks.push_back(other->inputs.layout.tp_rank);
      } else if (mismatch.empty() || diffs.size() < mismatch.size()) {
        mismatch = std::move(diffs);  // the closest cached entry explains the mismatch
      }
    }
    if (cached_ranks.empty() && !mismatch.empty()) {
      return finish(AcquireResult::kMismatch,
                    absl::FailedPreconditionError(absl::StrCat(
                        "model '", req.model(),
                        "': cached weights do not fit: ", spec::FormatDiff(mismatch))));
    }
    std::sort(cached_ranks.begin(), cached_ranks.end());
    cached_ranks.erase(std::unique(cached_ranks.begin(), cached_ranks.end()), cached_ranks.end());
    return finish(
        AcquireResult::kMiss,
        absl::NotFoundError(absl::StrCat(
            "model '", req.model(), "' is not cached for tp ", layout->tp_rank, "/",
            layout->tp_size, " on ", env.compute_capability,
            device.empty() ? "" : absl::StrCat(" (", device, ")"), " (fingerprint ",
            fp.substr(0, 12), ")",
            cached_ranks.empty()
                ? ""
                : absl::StrCat("; cached tp ranks: ", absl::StrJoin(cached_ranks, ", ")),
            "; load it first (weightcachectl load ", req.model(), ") or ask with load_on_miss")));
  }

  bool was_ready = registry_.StateOf(e) == cache::State::kReady;
  if (!was_ready) {
    if (registry_.StateOf(e) == cache::State::kLoading && !req.wait_ready() &&
        !req.load_on_miss()) {
      return finish(AcquireResult::kMiss,
                    absl::UnavailableError(absl::StrCat(
                        "model '", *model, "' is still loading (", e->progress.done(), " of ",
                        e->progress.total(), " bytes); ask with wait_ready to wait")));
    }
    auto s = registry_.WaitReady(e, deadline);
    if (!s.ok()) return finish(AcquireResult::kError, s);
  }
  if (auto s = FillLease(e, *model, caller, req.packed_manifest(), resp); !s.ok())
    return finish(AcquireResult::kError, s);
  return finish(was_ready ? AcquireResult::kHit : AcquireResult::kMiss, absl::OkStatus());
}

absl::Status Daemon::Impl::FillLease(const std::shared_ptr<cache::Entry>& e,
                                     const std::string& name, const Caller& caller,
                                     bool packed_manifest, v1::AcquireResponse* resp) {
  WC_ASSIGN_OR_RETURN(LeaseManager::Issued issued,
                      leases_.Issue(e, name, caller.cred, caller.slot, options_.before_lease_hook));
  const std::shared_ptr<const load::LoadedModel>& content = issued.content;
  std::string model_dir = content->model_dir;
  // The asked spec: same content as the entry's (that is what the fingerprint says), and the
  // files a verify tool should compare with.
  if (auto spec = models_.Spec(name)) {
    resp->set_spec_yaml(models_.SpecYaml(name));
    model_dir = spec->model_dir;
  }
  resp->set_lease_id(issued.lease_id);
  resp->set_token(issued.token);
  resp->mutable_layout()->set_tp_size(e->inputs.layout.tp_size);
  resp->mutable_layout()->set_tp_rank(e->inputs.layout.tp_rank);
  resp->mutable_layout()->set_pp_size(e->inputs.layout.pp_size);
  resp->mutable_layout()->set_pp_rank(e->inputs.layout.pp_rank);
  resp->set_fingerprint(e->fingerprint);
  resp->set_model(name);
  resp->set_backend(memory::BackendName(backend_->kind()));
  resp->set_device_uuid(content->device_uuid);
  resp->set_handle_socket(caller.slot.empty() ? handle_path()
                                              : SlotHandleSocketInContainer(options_));
  resp->set_total_bytes(content->plan.total_bytes);
  resp->set_model_dir(model_dir);
  for (size_t i = 0; i < content->segments.size(); ++i) {
    auto* s = resp->add_segments();
    s->set_index(static_cast<uint32_t>(i));
    s->set_size(content->segments[i]->size());
  }
  // Tensors, then the fused views that alias them (engine layouts); the client sorts.
  if (packed_manifest) {
    resp->set_tensor_manifest(*manifests_.Get(content));
    return absl::OkStatus();
  }
  AddTensorEntries(*content, resp->mutable_tensors());
  return absl::OkStatus();
}

absl::Status Daemon::Impl::Release(const Caller& caller, const v1::ReleaseRequest& req) {
  const std::optional<cache::LeaseRecord> lease = registry_.FindLease(req.lease_id());
  if (lease) {
    Object o;
    o.lease = req.lease_id();
    o.owner_uid = static_cast<uid_t>(lease->owner_uid);
    o.owner_slot = lease->slot;
    WC_RETURN_IF_ERROR(Authorize(caller, Verb::kRelease, o));
  }
  if (!leases_.End(req.lease_id())) {
    return absl::NotFoundError(absl::StrCat("lease ", req.lease_id(), " is not active"));
  }
  handles_->CloseLease(req.lease_id());
  return absl::OkStatus();
}

absl::Status Daemon::Impl::Load(const Caller& caller, const v1::LoadRequest& req,
                                const std::function<bool(const v1::LoadProgress&)>& publish) {
  std::string name = req.model();
  if (!req.spec_yaml().empty()) {
    WC_RETURN_IF_ERROR(Authorize(caller, Verb::kDefine, {}));
    WC_ASSIGN_OR_RETURN(auto specs, spec::ParseSpecs(req.spec_yaml(), "LoadRequest.spec_yaml"));
    if (specs.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoadRequest.spec_yaml: holds ", specs.size(), " specs; send exactly one"));
    }
    name = specs[0].name;
    models_.Define(specs[0]);
  }
  if (name.empty()) return absl::InvalidArgumentError("Load: set model or spec_yaml");
  Object object = ModelObject(name);
  WC_RETURN_IF_ERROR(Authorize(caller, Verb::kLoad, object));
  // Load re-reads the files (and hashes what changed): an admin's always, an engine's at most
  // once per --refresh_interval per model; in between it loads the identity read last, whose
  // open files are the versions it describes (issue 25: every Load re-stat'ed and could
  // re-hash).
  const bool refresh =
      policy_->IsAdmin(caller) || models_.TakeRefresh(name, options_.refresh_interval);
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
  std::vector<Admission::GroupRank> group;
  for (const auto& layout : layouts) {
    spec::Environment env = asked.env;
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
  std::vector<std::string> undeclared;
  for (const auto& g : group) {
    std::string why = admission_.UndeclaredPlacement(opened->spec, g.layout, g.env, g.device_uuid);
    if (!why.empty()) undeclared.push_back(std::move(why));
  }
  if (!undeclared.empty()) {
    object.undeclared_placement = absl::StrJoin(undeclared, "; ");
    WC_RETURN_IF_ERROR(Authorize(caller, Verb::kLoad, object));
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
      r->mutable_layout()->set_tp_size(e->inputs.layout.tp_size);
      r->mutable_layout()->set_tp_rank(e->inputs.layout.tp_rank);
      r->mutable_layout()->set_pp_size(e->inputs.layout.pp_size);
      r->mutable_layout()->set_pp_rank(e->inputs.layout.pp_rank);
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
  WC_RETURN_IF_ERROR(Authorize(caller, Verb::kEvict, {}));
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
      if (!mine && opened.ok()) {
        const auto& sp = (*opened)->spec;
        mine = sp.tp_size == s.inputs.layout.tp_size && sp.pp_size == s.inputs.layout.pp_size &&
               (*opened)->Inputs(s.inputs.layout, s.inputs.env).Digest() == s.fingerprint;
      }
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

void Daemon::Impl::Status(const Caller& caller, v1::StatusResponse* resp) {
  // With --namespace_rules a peer sees the models it may map, the entries that serve them
  // (under those names only) and, of their leases, those of its own socket; an admin sees
  // everything. Counters and device rows stay whole (free memory shows the rest anyway).
  const bool filtered = rules_ != nullptr && !IsAdmin(caller);
  std::map<std::string, bool> may_map;  // one rule decision per name and Status
  auto visible = [&](const std::string& name) {
    if (!filtered) return true;
    auto [it, fresh] = may_map.try_emplace(name, false);
    if (fresh) it->second = policy_->Decide(caller, Verb::kStatus, ModelObject(name)).allowed;
    return it->second;
  };
  resp->set_version(kVersion);
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
    auto* e = resp->add_entries();
    e->set_model(model_visible ? s.model : names.front());
    e->set_fingerprint(s.fingerprint);
    const bool stale = s.state == cache::State::kReady && !s.stale.empty();
    e->set_state(stale ? "stale" : cache::StateName(s.state));
    e->set_error(stale ? s.stale : s.error);
    e->set_bytes(s.bytes);
    e->set_tensor_bytes(s.tensor_bytes);
    e->set_tensors(static_cast<uint32_t>(s.tensors));
    e->set_segments(static_cast<uint32_t>(s.segments));
    e->mutable_layout()->set_tp_size(s.inputs.layout.tp_size);
    e->mutable_layout()->set_tp_rank(s.inputs.layout.tp_rank);
    e->mutable_layout()->set_pp_size(s.inputs.layout.pp_size);
    e->mutable_layout()->set_pp_rank(s.inputs.layout.pp_rank);
    e->set_backend(memory::BackendName(backend_->kind()));
    e->set_device_uuid(s.device_uuid);
    e->set_load_seconds(s.load_seconds);
    e->set_bytes_read(s.bytes_read);
    e->set_bytes_done(s.bytes_done);
    e->set_source(s.source);
    // A published entry, or one adopted from the keeper whose record says who published it.
    if (auto p = publishes_.PublisherOf({s.fingerprint, s.device_uuid});
        p && (s.source == "publish" || s.source == "keeper")) {
      *e->mutable_publisher() = *p;
    }
    for (const auto& n : names) {
      e->add_names(n);
      if (s.state == cache::State::kReady && !stale) {
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
    }
  }
  resp->set_acquire_hits(hits_);
  resp->set_acquire_misses(misses_);
  resp->set_acquire_mismatches(mismatches_);
  resp->set_acquire_rejected(rejected_);
  resp->set_acquire_errors(errors_);
  resp->set_acquire_peer_copies(peer_copies_);
  resp->set_acquire_stale(stale_);
  resp->set_acquire_denied(denied_);
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

absl::StatusOr<Caller> Daemon::Impl::CallerOf(const std::string& grpc_peer) {
  std::optional<Caller> c = control_ ? control_->PeerOf(grpc_peer) : std::nullopt;
  if (!c) {
    return absl::PermissionDeniedError("control connection of an unknown peer (" + grpc_peer + ")");
  }
  if (c->over_cap) {
    if (options_.metrics != nullptr) options_.metrics->OnRefused("connection_cap");
    return absl::ResourceExhaustedError(
        absl::StrCat("control socket: uid ", c->cred.uid, " holds ", c->uid_connections,
                     " connections, over the cap of ", options_.max_connections_per_uid,
                     " per uid (--max_connections_per_uid); close some and reconnect"));
  }
  return *c;
}

absl::StatusOr<PublishManager*> Daemon::Impl::Publisher(const Caller& caller,
                                                        const std::string& model) {
  Object o = model.empty() ? Object{} : ModelObject(model);
  o.model = model;
  WC_RETURN_IF_ERROR(Authorize(caller, Verb::kPublish, o));
  return &publishes_;
}

Object Daemon::Impl::ModelObject(const std::string& name) const {
  Object o;
  o.model = name;
  if (const std::optional<spec::ModelSpec> spec = models_.Spec(name)) {
    o.allowed_namespaces = spec->allowed_namespaces;
  }
  return o;
}

absl::Status Daemon::Impl::Check(const Caller& caller, Verb verb, const Object& object) const {
  const Decision d = policy_->Decide(caller, verb, object);
  return d.allowed ? absl::OkStatus() : absl::PermissionDeniedError(d.reason);
}

absl::Status Daemon::Impl::Authorize(const Caller& caller, Verb verb, const Object& object) {
  const Decision d = policy_->Decide(caller, verb, object);
  if (d.allowed) return absl::OkStatus();
  return Refuse(d.rule, d.reason);
}

absl::Status Daemon::Impl::Refuse(const std::string& rule, const std::string& message) {
  if (options_.metrics != nullptr) options_.metrics->OnRefused(rule);
  WC_LOG_WARN("refused (%s): %s", rule, message);
  return absl::PermissionDeniedError(message);
}

std::pair<bool, std::string> Daemon::Impl::Readiness() const {
  if (control_ && !control_->healthy()) {
    return {false, "the control socket cannot accept connections (out of descriptors?)"};
  }
  {
    MutexLock l(mu_);
    if (!pending_preloads_.empty()) {
      return {false, absl::StrCat("opening ", absl::StrJoin(pending_preloads_, ", "),
                                  " for preload (reading and identifying files)")};
    }
  }
  std::vector<cache::Key> preloads;
  {
    MutexLock l(mu_);
    preloads = preloads_;
  }
  for (const auto& key : preloads) {
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
    const bool stale = s.state == cache::State::kReady && !s.stale.empty();
    out.push_back({s.model, stale ? "stale" : cache::StateName(s.state),
                   s.device_uuid.empty() ? "host" : s.device_uuid, s.bytes, s.leases.size()});
  }
  return out;
}

metrics::StagingSnapshot Daemon::Impl::Staging() const {
  if (staging_pool_ == nullptr) return {};
  const auto c = staging_pool_->counters();
  return {true, c.idle_bytes, c.taken_bytes};
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

// ---- Daemon ----

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options,
                                                      memory::Backend* backend) {
  auto impl = std::make_unique<Impl>(std::move(options), backend);
  WC_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Daemon::~Daemon() = default;
std::string Daemon::control_socket() const { return impl_->control_path(); }
std::string Daemon::admin_socket() const { return impl_->admin_path(); }
std::string Daemon::handle_socket() const { return impl_->handle_path(); }
std::pair<bool, std::string> Daemon::Readiness() const { return impl_->Readiness(); }
const metrics::StateSource* Daemon::state_source() const { return impl_.get(); }
void Daemon::Wait() { impl_->Wait(); }
void Daemon::Shutdown() { impl_->Shutdown(); }

}  // namespace weightcache::server
