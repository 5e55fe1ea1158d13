// Compile artifacts in the daemon (issue 29): the service, the rules and the tokens
// (artifact_service.h).
#include "pkg/server/publish/artifact_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pkg/metrics/metrics.h"
#include "pkg/util/bytes.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {
namespace {

constexpr char kGrantPrefix[] = "artifact-grant-";

}  // namespace

std::string ArtifactGrants::Issue(std::shared_ptr<const artifact::Artifact> a,
                                  const std::string& slot) {
  std::string token = RandomHex(32);
  MutexLock l(mu_);
  tokens_[token] = {std::move(a), slot, std::chrono::steady_clock::now() + token_ttl_};
  return token;
}

bool ArtifactGrants::IsToken(const std::string& token) const {
  MutexLock l(mu_);
  return tokens_.count(token) != 0;
}

absl::StatusOr<HandleChannel::Grant> ArtifactGrants::Claim(const std::string& token,
                                                           const std::string& slot) {
  MutexLock l(mu_);
  auto it = tokens_.find(token);
  if (it == tokens_.end()) return absl::PermissionDeniedError("unknown or expired token");
  if (it->second.slot != slot) {
    return absl::PermissionDeniedError(
        "this artifact token was issued on another socket and is claimable only on the "
        "handle socket beside it");
  }
  HandleChannel::Grant g;
  g.lease_id = kGrantPrefix + RandomHex(8);
  g.fds.push_back(it->second.artifact->fd());
  g.keepalive = it->second.artifact;
  tokens_.erase(it);
  return g;
}

bool ArtifactGrants::IsGrant(const std::string& lease_id) {
  return lease_id.rfind(kGrantPrefix, 0) == 0;
}

void ArtifactGrants::ExpireTokens() {
  const auto now = std::chrono::steady_clock::now();
  MutexLock l(mu_);
  std::erase_if(tokens_, [&](const auto& t) { return t.second.expires <= now; });
}

artifact::Key KeyFromWire(const v1::ArtifactKey& k, const std::string& tenant) {
  artifact::Key out;
  out.kind = k.kind();
  out.model = k.model();
  out.fingerprint = k.fingerprint();
  out.engine = k.engine();
  out.engine_version = k.engine_version();
  out.torch_version = k.torch_version();
  out.triton_version = k.triton_version();
  out.cuda_version = k.cuda_version();
  out.compute_capability = k.compute_capability();
  out.settings_hash = k.settings_hash();
  out.tenant = tenant;
  return out;
}

void InfoToWire(const artifact::ArtifactInfo& i, v1::ArtifactInfo* out) {
  out->set_id(i.id);
  auto* k = out->mutable_key();
  k->set_kind(i.key.kind);
  k->set_model(i.key.model);
  k->set_fingerprint(i.key.fingerprint);
  k->set_engine(i.key.engine);
  k->set_engine_version(i.key.engine_version);
  k->set_torch_version(i.key.torch_version);
  k->set_triton_version(i.key.triton_version);
  k->set_cuda_version(i.key.cuda_version);
  k->set_compute_capability(i.key.compute_capability);
  k->set_settings_hash(i.key.settings_hash);
  out->set_bytes(i.bytes);
  out->set_sha256(i.sha256);
  out->mutable_publisher()->set_pid(static_cast<int32_t>(i.publisher.pid));
  out->mutable_publisher()->set_uid(static_cast<int32_t>(i.publisher.uid));
  out->mutable_publisher()->set_published_unix_seconds(i.publisher.unix_seconds);
  out->set_tenant(i.key.tenant);
  out->set_resident(i.resident);
  out->set_on_disk(i.on_disk);
  out->set_idle_seconds(i.idle_seconds);
}

// ---- ArtifactService -----------------------------------------------------------------------

ArtifactService::ArtifactService(Options options, std::unique_ptr<artifact::Store> store,
                                 const ArtifactRules& rules, metrics::Metrics* metrics)
    : options_(std::move(options)),
      store_(std::move(store)),
      rules_(rules),
      metrics_(metrics),
      grants_(options_.token_ttl),
      shares_({.total = options_.reserve_tenants,
               .per_key = options_.reserve_per_unit,
               .over_cap = 0,
               .own_caps = {}}),
      puts_(options_.puts) {}

void ArtifactService::ReportResident() {
  if (metrics_ != nullptr) metrics_->SetArtifactResidentBytes(store_->usage().resident_bytes);
}

absl::StatusOr<artifact::Key> ArtifactService::KeyFor(const Caller& caller,
                                                      const v1::ArtifactKey& key, Verb verb) const {
  if (key.model().empty()) {
    return absl::InvalidArgumentError("artifact key field 'model' is required");
  }
  if (!rules_.Known(key.model())) {
    return absl::NotFoundError(absl::StrCat(
        "artifact key names model '", key.model(),
        "', which this daemon does not know: artifacts belong to a known model (its rules apply)"));
  }
  WC_RETURN_IF_ERROR(verb == Verb::kPublish
                         ? rules_.MayPut(caller, key.model(), artifact::IsNativeCode(key.kind()))
                         : rules_.MayGet(caller, key.model()));
  WC_ASSIGN_OR_RETURN(std::string pool, rules_.Pool(caller, key.model()));
  return KeyFromWire(key, pool);
}

void ArtifactService::Count(const std::string& model, const char* op, const absl::Status& s,
                            uint64_t bytes) {
  if (metrics_ == nullptr) return;
  const bool get = std::string_view(op) == "get";
  const char* result = "error";
  switch (s.code()) {
    case absl::StatusCode::kOk:
      result = get ? "hit" : "stored";
      break;
    case absl::StatusCode::kNotFound:
      result = get ? "miss" : "refused";  // a put's: the model is unknown
      break;
    case absl::StatusCode::kAlreadyExists:
      result = "exists";
      break;
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kResourceExhausted:
      result = "busy";
      break;
    case absl::StatusCode::kPermissionDenied:
      result = "refused";
      break;
    default:
      break;
  }
  metrics_->OnArtifact(model, op, result, s.ok() ? bytes : 0);
  ReportResident();
}

absl::Status ArtifactService::Put(const Caller& caller,
                                  const std::function<bool(v1::PutArtifactRequest*)>& read,
                                  v1::PutArtifactResponse* resp,
                                  const std::function<void()>& cancel) {
  // The role first: a peer that may not publish at all takes no put slot (before, its puts
  // waited for their first message holding one: a pod without the role held all of them
  // and the admin's put was refused). The model's own rules are checked once the key is read.
  if (absl::Status role = rules_.MayPublish(caller); !role.ok()) {
    Count("", "put", role, 0);
    return role;
  }
  // Counted before the first message: a client that never sends one holds a thread too.
  // Per tenant unit (the pod, slot or process resolved at accept).
  auto ticket = puts_.Begin(caller.unit, cancel);
  if (!ticket.ok()) {
    Count("", "put", ticket.status(), 0);
    return ticket.status();
  }
  const auto watched = [&](v1::PutArtifactRequest* m) {
    const bool more = read(m);
    if (more) {
      puts_.Progress(*ticket, m->data().size());
    } else {
      puts_.Finished(*ticket);
    }
    return more;
  };
  v1::PutArtifactRequest msg;
  const bool first = watched(&msg);
  const std::string model = rules_.MetricModel(msg.key().model());
  absl::Status s = first ? Store(caller, &msg, watched, resp)
                         : absl::InvalidArgumentError("PutArtifact: no message");
  if (std::string why = puts_.End(*ticket); !why.empty() && !s.ok()) {
    s = absl::DeadlineExceededError(why);
  }
  Count(model, "put", s, resp->bytes());
  return s;
}

absl::Status ArtifactService::Store(const Caller& caller, v1::PutArtifactRequest* first,
                                    const std::function<bool(v1::PutArtifactRequest*)>& read,
                                    v1::PutArtifactResponse* resp) {
  v1::PutArtifactRequest& msg = *first;
  WC_ASSIGN_OR_RETURN(artifact::Key key, KeyFor(caller, msg.key(), Verb::kPublish));
  // The unit's share first (given back when this put ends, whichever way), then the store's
  // budget: msg.size() reserved, or RESOURCE_EXHAUSTED at once.
  WC_ASSIGN_OR_RETURN(net::KeyedLimiter::Slot share, TakeShare(caller, msg.size()));
  WC_ASSIGN_OR_RETURN(auto slot, store_->BeginPut(key, msg.size()));
  do {
    WC_RETURN_IF_ERROR(slot->Append(msg.data()));
    msg.Clear();
  } while (read(&msg));
  if (caller.gone && caller.gone()) return absl::CancelledError("the putter went away");
  artifact::Publisher who;
  who.pid = caller.cred.pid;
  who.uid = caller.cred.uid;
  who.slot = caller.slot;
  who.admin = rules_.IsAdmin(caller);
  WC_ASSIGN_OR_RETURN(auto a, slot->Commit(who));
  WC_LOG_INFO("artifact %s put: %s of model '%s'%s, %llu bytes, by uid %d pid %d (%s)",
              a->id().c_str(), key.kind.c_str(), key.model.c_str(),
              key.tenant.empty() ? "" : (" (pool " + key.tenant + ")").c_str(),
              static_cast<unsigned long long>(a->bytes()), static_cast<int>(who.uid),
              static_cast<int>(who.pid), caller.unit.Describe().c_str());
  resp->set_id(a->id());
  resp->set_bytes(a->bytes());
  resp->set_sha256(a->sha256());
  return absl::OkStatus();
}

absl::StatusOr<net::KeyedLimiter::Slot> ArtifactService::TakeShare(const Caller& caller,
                                                                   uint64_t size) {
  if (rules_.IsAdmin(caller)) return net::KeyedLimiter::Slot();
  const std::string unit = caller.unit.Key();
  net::KeyedLimiter::Claim c = shares_.Take(unit, size);
  switch (c.verdict) {
    case net::KeyedLimiter::Verdict::kWithin:
    case net::KeyedLimiter::Verdict::kOverCap:  // no band past the cap is configured
      return std::move(c.slot);
    case net::KeyedLimiter::Verdict::kRefusedKey:
      return absl::ResourceExhaustedError(absl::StrCat(
          "this put declares ", size, " bytes; ", caller.unit.Describe(), "'s puts in flight ",
          "reserve ", c.key_held, " of the ", shares_.CapOf(unit),
          " bytes of --artifact_budget one pod's puts may reserve at once ",
          "(--artifact_reserve_per_unit); let one finish first, or put a smaller artifact"));
    case net::KeyedLimiter::Verdict::kRefusedTotal:
      break;
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "this put declares ", size, " bytes; the pods' puts in flight reserve ", c.total_held,
      " of the ", options_.reserve_tenants,
      " bytes they may share (--artifact_budget less one --artifact_reserve_per_unit, kept for "
      "the admin's puts); try again shortly"));
}

absl::Status ArtifactService::Get(const Caller& caller, const v1::GetArtifactRequest& req,
                                  v1::GetArtifactResponse* resp) {
  absl::Status s = Serve(caller, req, resp);
  Count(req.key().model(), "get", s, resp->bytes());
  return s;
}

absl::Status ArtifactService::Serve(const Caller& caller, const v1::GetArtifactRequest& req,
                                    v1::GetArtifactResponse* resp) {
  WC_ASSIGN_OR_RETURN(artifact::Key key, KeyFor(caller, req.key(), Verb::kAcquire));
  WC_ASSIGN_OR_RETURN(auto a, Lookup(caller, std::move(key), req));
  resp->set_id(a->id());
  resp->set_bytes(a->bytes());
  resp->set_sha256(a->sha256());
  resp->set_handle_socket(caller.slot.empty() ? options_.handle_socket
                                              : options_.slot_handle_socket);
  artifact::ArtifactInfo info;
  info.id = a->id();
  info.key = a->key();
  info.bytes = a->bytes();
  info.sha256 = a->sha256();
  info.publisher = a->publisher();
  info.resident = true;
  InfoToWire(info, resp->mutable_info());
  resp->set_token(grants_.Issue(std::move(a), caller.slot));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const artifact::Artifact>> ArtifactService::Lookup(
    const Caller& caller, artifact::Key key, const v1::GetArtifactRequest& req) {
  const auto deadline = caller.DeadlineOr(std::chrono::milliseconds(req.wait_ms()));
  auto own = Vouched(store_->Get(key, req.wait_ms() > 0, deadline, caller.gone), caller);
  if (key.tenant.empty() || own.status().code() != absl::StatusCode::kNotFound) return own;
  // Not in the caller's pool: an admin's, the one pool every pod trusts besides its own.
  key.tenant.clear();
  auto admins = store_->Get(key, req.wait_ms() > 0, deadline, caller.gone);
  if (!admins.ok()) return admins.status().code() == absl::StatusCode::kNotFound ? own : admins;
  if (!(*admins)->publisher().admin) {
    // Put outside any pool by a non-admin, before pools existed: nobody vouches for it.
    WC_LOG_WARN("artifact %s not served to %s: put before namespace pools, not by an admin",
                (*admins)->id().c_str(), caller.unit.Describe().c_str());
    return own;
  }
  return admins;
}

absl::StatusOr<std::shared_ptr<const artifact::Artifact>> ArtifactService::Vouched(
    absl::StatusOr<std::shared_ptr<const artifact::Artifact>> got, const Caller& caller) const {
  if (!got.ok() || !artifact::IsNativeCode((*got)->key().kind)) return got;
  const artifact::Key& k = (*got)->key();
  if (absl::Status v = rules_.VouchesForNative(k.model, (*got)->publisher(), k.tenant); !v.ok()) {
    WC_LOG_WARN("artifact %s not served to %s: %s", (*got)->id().c_str(),
                caller.unit.Describe().c_str(), std::string(v.message()).c_str());
    return absl::NotFoundError(
        absl::StrCat("artifact ", (*got)->id(), " not served: ", v.message()));
  }
  return got;
}

absl::Status ArtifactService::Evict(const Caller& caller, const v1::EvictArtifactsRequest& req,
                                    v1::EvictArtifactsResponse* resp) {
  WC_RETURN_IF_ERROR(rules_.MayEvict(caller, req.model()));
  if (req.id().empty() == req.model().empty()) {
    return absl::InvalidArgumentError("EvictArtifacts: give exactly one of id and model");
  }
  uint32_t n = 0;
  for (const auto& i : store_->List()) {
    if ((!req.id().empty() && i.id == req.id()) ||
        (!req.model().empty() && i.key.model == req.model())) {
      if (store_->Evict(i.id)) {
        ++n;
        WC_LOG_INFO("artifact %s evicted by uid %d", i.id.c_str(),
                    static_cast<int>(caller.cred.uid));
      }
    }
  }
  resp->set_evicted(n);
  ReportResident();
  return absl::OkStatus();
}

void ArtifactService::AppendStatus(const Caller& caller, bool filtered,
                                   const std::function<bool(const std::string&)>& visible,
                                   v1::StatusResponse* resp) const {
  for (const auto& i : store_->List()) {
    if (filtered) {
      if (!visible(i.key.model)) continue;
      // Another pool's artifacts are not this caller's to see (its own and the admin's are).
      if (!i.key.tenant.empty()) {
        auto mine = rules_.Pool(caller, i.key.model);
        if (!mine.ok() || *mine != i.key.tenant) continue;
      }
    }
    InfoToWire(i, resp->add_artifacts());
  }
  const auto u = store_->usage();
  auto* usage = resp->mutable_artifact_usage();
  usage->set_resident_bytes(u.resident_bytes);
  usage->set_budget_bytes(u.budget_bytes);
  usage->set_evictions(u.evictions);
  usage->set_dir(options_.dir);
  usage->set_puts_in_flight(u.puts_in_flight);
  usage->set_reserved_bytes(u.reserved_bytes);
  usage->set_disk_bytes(u.disk_bytes);
  usage->set_dir_budget_bytes(u.dir_budget_bytes);
}

}  // namespace weightcache::server
