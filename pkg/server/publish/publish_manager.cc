#include "pkg/server/publish/publish_manager.h"

#include <unistd.h>

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/load/loader.h"
#include "pkg/metrics/metrics.h"
#include "pkg/server/messages/manifest.h"
#include "pkg/server/policy/namespace_rules.h"
#include "pkg/util/bytes.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {
namespace {

constexpr size_t kMaxTensors = 1 << 20;
constexpr size_t kMaxNameBytes = 1024;
constexpr size_t kMaxDims = 16;
constexpr const char* kIdPrefix = "pub-";  // lease ids are bare hex: the two never collide

std::string Describe(const v1::PublishTensor& t) {
  return absl::StrCat(t.dtype(), " [", absl::StrJoin(t.shape(), ", "), "] ", t.nbytes(), " bytes");
}

// The first difference between the tensors of a begin and of its commit; empty when equal.
std::string CompareTensors(const google::protobuf::RepeatedPtrField<v1::PublishTensor>& begun,
                           const google::protobuf::RepeatedPtrField<v1::PublishTensor>& committed) {
  std::map<std::string, const v1::PublishTensor*> want;
  for (const auto& t : begun) want[t.name()] = &t;
  std::set<std::string> seen;
  for (const auto& t : committed) {
    auto it = want.find(t.name());
    if (it == want.end()) return absl::StrCat("tensor '", t.name(), "' was not in the begin");
    if (!seen.insert(t.name()).second) return absl::StrCat("tensor '", t.name(), "' is repeated");
    const v1::PublishTensor& b = *it->second;
    if (b.dtype() != t.dtype() || b.nbytes() != t.nbytes() ||
        !std::equal(b.shape().begin(), b.shape().end(), t.shape().begin(), t.shape().end())) {
      return absl::StrCat("tensor '", t.name(), "': begun as ", Describe(b), ", committed as ",
                          Describe(t));
    }
  }
  for (const auto& [name, t] : want) {
    if (seen.count(name) == 0)
      return absl::StrCat("tensor '", name, "' is missing from the commit");
  }
  return "";
}

}  // namespace

absl::StatusOr<load::Plan> PlanPublished(
    const google::protobuf::RepeatedPtrField<v1::PublishTensor>& tensors, uint64_t alignment,
    uint64_t max_segment_bytes) {
  if (tensors.empty()) return absl::InvalidArgumentError("BeginPublish: no tensors");
  if (static_cast<size_t>(tensors.size()) > kMaxTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("BeginPublish: ", tensors.size(), " tensors, more than ", kMaxTensors));
  }
  std::vector<const v1::PublishTensor*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->name() < b->name(); });
  load::Plan plan;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const v1::PublishTensor& t = *sorted[i];
    const std::string what = absl::StrCat("BeginPublish: tensor '", t.name().substr(0, 200), "'");
    if (t.name().empty() || t.name().size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a name must have 1 to ", kMaxNameBytes, " bytes"));
    }
    if (i > 0 && sorted[i - 1]->name() == t.name()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is listed twice"));
    }
    auto dtype = safetensors::ParseDType(t.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", dtype.status().message()));
    }
    if (static_cast<size_t>(t.shape_size()) > kMaxDims) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", t.shape_size(), " dimensions, more than ", kMaxDims));
    }
    uint64_t elements = 1;
    for (int64_t d : t.shape()) {
      if (d < 0 || (d > 0 && elements > (uint64_t{1} << 50) / static_cast<uint64_t>(d))) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": dimension ", d, " is negative or too large"));
      }
      elements *= static_cast<uint64_t>(d);
    }
    const uint64_t want = elements * safetensors::DTypeSize(*dtype);
    if (t.nbytes() != want || want == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": nbytes ", t.nbytes(), " but ", Describe(t), " holds ", want,
                       want == 0 ? " (empty tensors are refused)" : ""));
    }
    load::PlannedTensor p;
    p.name = t.name();
    p.dtype = *dtype;
    p.shape.assign(t.shape().begin(), t.shape().end());
    p.strides.assign(p.shape.size(), 1);
    for (size_t d = p.shape.size(); d-- > 1;) p.strides[d - 1] = p.strides[d] * p.shape[d];
    p.nbytes = want;
    // Next segment when this tensor does not fit the current one (a lone tensor may exceed
    // the bound: it gets a segment of its own).
    uint64_t at = plan.segment_bytes.empty() ? 0 : RoundUp(plan.segment_bytes.back(), alignment);
    if (plan.segment_bytes.empty() || (at > 0 && at + want > max_segment_bytes)) {
      plan.segment_bytes.push_back(0);
      at = 0;
    }
    p.segment = static_cast<uint32_t>(plan.segment_bytes.size() - 1);
    p.offset = at;
    plan.segment_bytes.back() = at + want;
    plan.total_bytes += want;
    plan.tensors.push_back(std::move(p));
  }
  return plan;
}

// One publish in progress. The fields from `segments` down are guarded by the manager's
// mutex (an annotation cannot name another object's mutex); the registry's load function
// waits on `m`/`cv` for the outcome.
struct PublishManager::Session {
  std::string id, token, model, device_uuid, model_dir;
  PeerCred owner;
  std::string slot;  // the socket it was begun on (empty: the shared one)
  google::protobuf::RepeatedPtrField<v1::PublishTensor> begun;
  load::Plan plan;
  v1::PublisherInfo info;
  std::shared_ptr<cache::Entry> entry;
  std::chrono::steady_clock::time_point token_expires;
  std::vector<std::unique_ptr<memory::Segment>> segments;
  bool claimed = false;     // the writable descriptors went to the publisher
  bool committing = false;  // a commit is sealing
  bool closed = false;      // the handle connection closed while committing

  Mutex m;
  CondVar cv;
  bool decided ABSL_GUARDED_BY(m) = false;
  absl::StatusOr<std::unique_ptr<load::LoadedModel>> outcome ABSL_GUARDED_BY(m) =
      absl::UnknownError("undecided");

  void Decide(absl::StatusOr<std::unique_ptr<load::LoadedModel>> r) {
    {
      MutexLock l(m);
      if (decided) return;
      decided = true;
      outcome = std::move(r);
    }
    cv.NotifyAll();
  }

  // The registry's load function: the entry stays `loading` until the commit or the abort.
  cache::LoadFn WaitForOutcome() {
    return [this](cache::Entry& e) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
      MutexLock l(m);
      while (!decided) {
        if (e.progress.cancelled()) {
          return absl::CancelledError(
              absl::StrCat("publish of '", model, "': the daemon is shutting down"));
        }
        cv.WaitUntil(m, std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
      }
      return std::move(outcome);
    };
  }
};

PublishManager::PublishManager(Options options, memory::Backend* backend, cache::Registry& registry,
                               PublishBase& base, std::string handle_socket)
    : options_(std::move(options)),
      backend_(backend),
      registry_(registry),
      base_(base),
      handle_socket_(std::move(handle_socket)) {}

PublishManager::~PublishManager() {
  std::map<std::string, std::shared_ptr<Session>> sessions;
  {
    MutexLock l(mu_);
    sessions.swap(sessions_);
  }
  for (auto& [id, s] : sessions) s->Decide(absl::CancelledError("the daemon is shutting down"));
}

void PublishManager::Count(const std::string& model, const std::string& result) {
  if (options_.metrics != nullptr) options_.metrics->OnPublish(model, result);
}

// What a begin publishes, resolved: the base model as it is now, the plan of the tensors,
// the device and the fingerprint's inputs.
struct PublishManager::Target {
  std::shared_ptr<const load::OpenedModel> opened;
  load::Plan plan;
  std::string device;
  spec::FingerprintInputs inputs;
  uint64_t bytes = 0;  // the segments, rounded up to the backend's granularity
};

// Decides what a begin publishes (INVALID_ARGUMENT for a request that cannot be one).
absl::StatusOr<PublishManager::Target> PublishManager::Resolve(const std::string& tenant,
                                                               const v1::BeginPublishRequest& req) {
  if (req.model().empty()) {
    return absl::InvalidArgumentError("BeginPublish: model (the base checkpoint's spec) is empty");
  }
  if (req.env().engine().empty() || req.env().recipe().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("BeginPublish of '", req.model(),
                     "': env.engine and env.recipe are required (they name the processing in "
                     "the fingerprint)"));
  }
  Target t;
  WC_ASSIGN_OR_RETURN(PublishBase::Placement placed, base_.Place(req.layout(), req.env()));
  WC_ASSIGN_OR_RETURN(t.opened, base_.Open(req.model(), /*refresh=*/false));
  if (!t.opened->ChangedFiles().empty()) {  // identify the base as it is now
    WC_ASSIGN_OR_RETURN(t.opened, base_.Open(req.model(), /*refresh=*/true));
  }
  WC_ASSIGN_OR_RETURN(t.plan, PlanPublished(req.tensors(), backend_->tensor_alignment(),
                                            backend_->max_segment_bytes()));
  t.device = placed.device_uuid;
  spec::Environment env = placed.env;
  env.tenant = tenant;
  t.inputs = t.opened->Inputs(placed.layout, env);
  for (uint64_t b : t.plan.segment_bytes) t.bytes += RoundUp(b, backend_->granularity());
  return t;
}

absl::Status PublishManager::Begin(const PeerCred& caller, const std::string& slot,
                                   const std::string& tenant, const v1::BeginPublishRequest& req,
                                   v1::BeginPublishResponse* resp) {
  WC_ASSIGN_OR_RETURN(Target t, Resolve(tenant, req));
  auto s = std::make_shared<Session>();
  s->model = req.model();
  s->owner = caller;
  s->slot = slot;
  s->begun = req.tensors();
  s->device_uuid = t.device;
  s->model_dir = t.opened->spec.model_dir;
  s->info.set_engine(req.env().engine());
  s->info.set_engine_version(req.env().engine_version());
  s->info.set_framework_version(req.env().framework_version());
  s->info.set_recipe(req.env().recipe());
  s->info.set_pid(static_cast<int32_t>(caller.pid));
  s->info.set_uid(static_cast<int32_t>(caller.uid));

  cache::LoadRequest lr;
  lr.key = {t.inputs.Digest(), t.device};
  lr.model = req.model();
  lr.inputs = t.inputs;
  lr.bytes = t.bytes;
  lr.source = "publish";
  lr.files = t.opened->files;
  // The load function holds the session: it outlives the manager's map entry.
  lr.load = [s, wait = s->WaitForOutcome()](cache::Entry& e) { return wait(e); };
  bool started = false;
  auto e = registry_.StartOrJoin(std::move(lr), &started);
  resp->set_fingerprint(t.inputs.Digest());
  resp->set_device_uuid(t.device);
  resp->set_backend(memory::BackendName(backend_->kind()));
  if (!e.ok()) {
    Count(req.model(), "error");
    return e.status();
  }
  if (!started) {
    // Single flight: another publisher has (or had) this key. Nothing is allocated.
    resp->set_joined(true);
    resp->set_state(cache::StateName(registry_.StateOf(*e)));
    Count(req.model(), "joined");
    return absl::OkStatus();
  }
  s->entry = *e;
  s->entry->progress.SetTotal(t.plan.total_bytes);
  WC_ASSIGN_OR_RETURN(auto segments, AllocateSegments(*s, t.plan));
  Issue(s, std::move(segments), std::move(t.plan), req, resp);
  return absl::OkStatus();
}

// Allocates the publish's segments; when one cannot be, decides the begin failed: the entry
// it started is discarded and the error names the segment.
absl::StatusOr<std::vector<std::unique_ptr<memory::Segment>>> PublishManager::AllocateSegments(
    Session& s, const load::Plan& plan) {
  std::vector<std::unique_ptr<memory::Segment>> segments;
  for (size_t i = 0; i < plan.segment_bytes.size(); ++i) {
    auto seg = backend_->Allocate(s.device_uuid, plan.segment_bytes[i],
                                  absl::StrCat("wc-publish-", s.model, "-", i));
    if (!seg.ok()) {
      s.Decide(seg.status());
      registry_.WaitReady(s.entry, std::chrono::steady_clock::now() + std::chrono::seconds(10))
          .IgnoreError();
      registry_.Discard(s.entry);
      Count(s.model, "error");
      return absl::Status(
          seg.status().code(),
          absl::StrCat("BeginPublish of '", s.model, "': segment ", i, " (", plan.segment_bytes[i],
                       " bytes on ", s.device_uuid, "): ", seg.status().message()));
    }
    segments.push_back(std::move(seg).value());
  }
  return segments;
}

// Issues the publish's id and token, answers with its segments and tensors, and registers it
// for the handle channel's claim.
void PublishManager::Issue(const std::shared_ptr<Session>& s,
                           std::vector<std::unique_ptr<memory::Segment>> segments, load::Plan plan,
                           const v1::BeginPublishRequest& req, v1::BeginPublishResponse* resp) {
  s->id = absl::StrCat(kIdPrefix, RandomHex(16));
  s->token = RandomHex(32);
  s->token_expires = std::chrono::steady_clock::now() + options_.token_ttl;
  resp->set_publish_id(s->id);
  resp->set_token(s->token);
  resp->set_handle_socket(handle_socket_);
  for (size_t i = 0; i < segments.size(); ++i) {
    auto* seg = resp->add_segments();
    seg->set_index(static_cast<uint32_t>(i));
    seg->set_size(segments[i]->size());
  }
  for (const auto& t : plan.tensors) ToTensorEntry(t, resp->add_tensors());
  s->plan = std::move(plan);
  {
    MutexLock l(mu_);
    s->segments = std::move(segments);
    sessions_[s->id] = s;
    tokens_[s->token] = s->id;
  }
  WC_LOG_INFO("publish %s of %s (%s, recipe %s) begun by pid %d: %d segment(s) on %s", s->id,
              req.model(), req.env().engine(), req.env().recipe(), static_cast<int>(s->owner.pid),
              resp->segments_size(), s->device_uuid);
}

bool PublishManager::IsToken(const std::string& token) const {
  MutexLock l(mu_);
  return tokens_.count(token) != 0;
}

absl::StatusOr<HandleChannel::Grant> PublishManager::Claim(const std::string& token,
                                                           const PeerCred& peer,
                                                           const std::string& slot) {
  std::shared_ptr<Session> s;
  {
    MutexLock l(mu_);
    auto t = tokens_.find(token);
    if (t == tokens_.end()) return absl::PermissionDeniedError("unknown or expired token");
    auto it = sessions_.find(t->second);
    if (it != sessions_.end() && it->second->slot != slot) {
      if (options_.metrics != nullptr) options_.metrics->OnRefused("namespace");
      return absl::PermissionDeniedError(absl::StrCat(
          "this publish token was issued on ", SocketOfSlot(it->second->slot),
          " and is claimable only on the handle socket beside it, not on ", SocketOfSlot(slot)));
    }
    tokens_.erase(t);
    if (it == sessions_.end()) return absl::UnavailableError("the publish ended");
    s = it->second;
    if (peer.uid == s->owner.uid) {
      s->claimed = true;
      s->info.set_pid(static_cast<int32_t>(peer.pid));
      HandleChannel::Grant g;
      g.lease_id = s->id;
      for (const auto& seg : s->segments) g.fds.push_back(seg->fd());
      g.keepalive = s;
      return g;
    }
  }
  const std::string why = absl::StrCat("publish ", s->id, " was begun by uid ", s->owner.uid,
                                       "; its token was presented by uid ", peer.uid);
  AbortSession(s, why, "aborted");
  if (options_.metrics != nullptr) options_.metrics->OnRefused("publish");
  return absl::PermissionDeniedError(why);
}

bool PublishManager::OnClose(const std::string& id) {
  if (id.rfind(kIdPrefix, 0) != 0) return false;
  std::shared_ptr<Session> s;
  {
    MutexLock l(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return true;  // committed or aborted already
    s = it->second;
    if (s->committing) {
      s->closed = true;  // the commit decides
      return true;
    }
  }
  AbortSession(s,
               absl::StrCat("the publisher's handle connection closed before its commit (pid ",
                            s->info.pid(), " exited?)"),
               "aborted");
  return true;
}

void PublishManager::ExpireTokens() {
  std::vector<std::shared_ptr<Session>> expired;
  {
    MutexLock l(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (const auto& [token, id] : tokens_) {
      auto it = sessions_.find(id);
      if (it != sessions_.end() && it->second->token_expires <= now) expired.push_back(it->second);
    }
  }
  for (const auto& s : expired) {
    AbortSession(s,
                 absl::StrCat("its token was not presented on the handle channel within ",
                              options_.token_ttl.count(), " s"),
                 "aborted");
  }
}

void PublishManager::AbortSession(const std::shared_ptr<Session>& s, const std::string& why,
                                  const std::string& result) {
  std::vector<std::unique_ptr<memory::Segment>> segments;
  {
    MutexLock l(mu_);
    if (sessions_.erase(s->id) == 0) return;  // ended already
    tokens_.erase(s->token);
    segments = std::move(s->segments);
  }
  segments.clear();  // the daemon's reference: freed here (a live publisher may still map it)
  s->Decide(absl::AbortedError(absl::StrCat("publish of '", s->model, "' aborted: ", why)));
  // The entry fails as soon as its load function returns; then it is removed.
  registry_.WaitReady(s->entry, std::chrono::steady_clock::now() + std::chrono::seconds(10))
      .IgnoreError();
  registry_.Discard(s->entry);
  WC_LOG_WARN("publish %s of %s aborted: %s", s->id, s->model, why);
  Count(s->model, result);
}

absl::StatusOr<std::shared_ptr<PublishManager::Session>> PublishManager::Owned(
    const PeerCred& caller, const std::string& slot, const std::string& id) {
  std::shared_ptr<Session> s;
  {
    MutexLock l(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "publish '", id.substr(0, 64), "' is not in progress (unknown, committed or aborted)"));
    }
    s = it->second;
  }
  if (s->owner.uid != caller.uid) {
    if (options_.metrics != nullptr) options_.metrics->OnRefused("publish");
    return absl::PermissionDeniedError(absl::StrCat("publish ", id, " was begun by uid ",
                                                    s->owner.uid, "; uid ", caller.uid,
                                                    " may not commit or abort it"));
  }
  if (s->slot != slot) {
    if (options_.metrics != nullptr) options_.metrics->OnRefused("namespace");
    return absl::PermissionDeniedError(
        absl::StrCat("publish ", id, " was begun on ", SocketOfSlot(s->slot),
                     "; it may be committed or aborted there only, not on ", SocketOfSlot(slot)));
  }
  return s;
}

absl::Status PublishManager::Begin(const Caller& caller, const v1::BeginPublishRequest& req,
                                   v1::BeginPublishResponse* resp) {
  // The publish rule, and the base model's map rule (published weights are served under its
  // name); a private model's published weights are the publisher's namespace's copy.
  if (options_.authorize) WC_RETURN_IF_ERROR(options_.authorize(caller, req.model()));
  std::string tenant;
  if (options_.tenant_of) {
    WC_ASSIGN_OR_RETURN(tenant, options_.tenant_of(caller, req.model()));
  }
  return Begin(caller.cred, caller.slot, tenant, req, resp);
}

absl::Status PublishManager::Abort(const Caller& caller, const v1::AbortPublishRequest& req) {
  if (options_.authorize) WC_RETURN_IF_ERROR(options_.authorize(caller, ""));
  return Abort(caller.cred, caller.slot, req);
}

absl::Status PublishManager::Commit(const Caller& caller, const v1::CommitPublishRequest& req,
                                    v1::CommitPublishResponse* resp) {
  if (options_.authorize) WC_RETURN_IF_ERROR(options_.authorize(caller, ""));
  WC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s,
                      Owned(caller.cred, caller.slot, req.publish_id()));
  {
    MutexLock l(mu_);
    if (!s->claimed) {
      return absl::FailedPreconditionError(
          absl::StrCat("CommitPublish ", s->id,
                       ": its writable descriptors were never claimed on the handle channel"));
    }
    if (s->committing) {
      return absl::FailedPreconditionError(
          absl::StrCat("CommitPublish ", s->id, ": a commit is already in progress"));
    }
    s->committing = true;
  }
  if (const std::string diff = CompareTensors(s->begun, req.tensors()); !diff.empty()) {
    AbortSession(s, absl::StrCat("its commit differs from its begin: ", diff), "mismatch");
    return absl::InvalidArgumentError(absl::StrCat("CommitPublish ", s->id, " of '", s->model,
                                                   "': ", diff, "; the publish is aborted"));
  }
  // While committing, nothing else touches the segments (abort and close wait for it).
  absl::Status sealed = absl::OkStatus();
  for (size_t i = 0; i < s->segments.size() && sealed.ok(); ++i) {
    if (absl::Status st = s->segments[i]->Seal(); !st.ok()) {
      sealed = absl::FailedPreconditionError(absl::StrCat(
          "CommitPublish ", s->id, " of '", s->model, "': segment ", i, ": ", st.message(),
          backend_->kind() == memory::BackendKind::kHost
              ? " (a writable mapping of it remains: unmap every writable mapping, then commit "
                "again)"
              : ""));
    }
  }
  if (!sealed.ok()) {
    bool closed = false;
    {
      MutexLock l(mu_);
      s->committing = false;
      closed = s->closed;
    }
    if (closed) AbortSession(s, "its handle connection closed during a failed commit", "aborted");
    return sealed;
  }
  auto loaded = std::make_unique<load::LoadedModel>();
  {
    MutexLock l(mu_);
    sessions_.erase(s->id);
    loaded->segments = std::move(s->segments);
  }
  loaded->plan = s->plan;
  loaded->device_uuid = s->device_uuid;
  loaded->model_dir = s->model_dir;
  const uint64_t resident = loaded->resident_bytes();
  s->entry->progress.SetDone(s->plan.total_bytes);
  // Known before the entry turns ready: the keeper deposit (on the way to ready) records it.
  s->info.set_published_unix_seconds(
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  RecordPublisher(s->entry->key, s->info);
  s->Decide(std::move(loaded));
  if (absl::Status st =
          registry_.WaitReady(s->entry, caller.DeadlineOr(options_.commit_wait), caller.gone);
      !st.ok()) {
    {
      MutexLock l(mu_);
      published_.erase(s->entry->key);
    }
    Count(s->model, "error");
    return st;
  }
  resp->set_fingerprint(s->entry->fingerprint);
  resp->set_bytes(resident);
  WC_LOG_INFO("publish %s of %s committed: %d bytes ready as %s", s->id, s->model,
              static_cast<int64_t>(resident), s->entry->key.ToString());
  Count(s->model, "published");
  return absl::OkStatus();
}

absl::Status PublishManager::Abort(const PeerCred& caller, const std::string& slot,
                                   const v1::AbortPublishRequest& req) {
  WC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, Owned(caller, slot, req.publish_id()));
  {
    MutexLock l(mu_);
    if (s->committing) {
      return absl::FailedPreconditionError(
          absl::StrCat("AbortPublish ", s->id, ": a commit is in progress"));
    }
  }
  AbortSession(s, "aborted by its publisher", "aborted");
  return absl::OkStatus();
}

void PublishManager::RecordPublisher(const cache::Key& key, const v1::PublisherInfo& who) {
  MutexLock l(mu_);
  for (auto it = published_.begin(); it != published_.end();) {
    it = registry_.Find(it->first) == nullptr ? published_.erase(it) : std::next(it);
  }
  published_[key] = who;
}

std::optional<v1::PublisherInfo> PublishManager::PublisherOf(const cache::Key& key) const {
  MutexLock l(mu_);
  auto it = published_.find(key);
  if (it == published_.end()) return std::nullopt;
  return it->second;
}

}  // namespace weightcache::server
