#include "pkg/server/internal/keeper_link.h"

#include <poll.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/server/internal/manifest.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {
namespace {

// KeeperRecord.format: bump when a field's meaning changes; an older record is then dropped
// (and reloaded from disk) instead of being misread.
constexpr uint32_t kRecordFormat = 1;

std::string KeyOf(const std::string& fingerprint, const std::string& device) {
  return fingerprint + "@" + device;
}

absl::StatusOr<load::PlannedTensor> GetTensor(const v1::TensorEntry& m, const v1::KeeperRecord& r) {
  load::PlannedTensor t;
  t.name = m.name();
  auto dtype = safetensors::ParseDType(m.dtype());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", m.name(), ": dtype '", m.dtype(), "' is unknown"));
  }
  t.dtype = *dtype;
  t.shape.assign(m.shape().begin(), m.shape().end());
  t.strides.assign(m.strides().begin(), m.strides().end());
  t.segment = m.segment();
  t.offset = m.offset();
  t.nbytes = m.nbytes();
  if (t.segment >= static_cast<uint32_t>(r.segment_sizes_size()) ||
      t.offset > r.segment_sizes(static_cast<int>(t.segment)) ||
      t.nbytes > r.segment_sizes(static_cast<int>(t.segment)) - t.offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", m.name(), ": [", t.offset, ", +", t.nbytes, ") of segment ", t.segment,
        " lies outside the record's ", r.segment_sizes_size(), " segments"));
  }
  return t;
}

}  // namespace

std::string EncodeKeeperRecord(const cache::Entry& e, const load::LoadedModel& content,
                               const std::string& backend, const RecordedSpec& spec,
                               const v1::PublisherInfo* publisher) {
  v1::KeeperRecord r;
  if (publisher != nullptr) *r.mutable_publisher() = *publisher;
  r.set_format(kRecordFormat);
  r.set_model(e.model);
  r.set_fingerprint(e.fingerprint);
  r.set_device_uuid(e.device_uuid);
  r.set_backend(backend);
  r.set_source(e.source);
  r.set_spec_yaml(spec.yaml);
  r.set_defined_inline(spec.defined_inline);
  r.set_model_dir(content.model_dir);
  const spec::FingerprintInputs& in = e.inputs;
  r.set_architecture(in.architecture);
  r.set_revision(in.revision);
  for (const auto& f : in.files) {
    auto* d = r.add_digests();
    d->set_name(f.name);
    d->set_size(f.size);
    d->set_content(f.content);
  }
  r.mutable_layout()->set_tp_size(in.layout.tp_size);
  r.mutable_layout()->set_tp_rank(in.layout.tp_rank);
  r.mutable_layout()->set_pp_size(in.layout.pp_size);
  r.mutable_layout()->set_pp_rank(in.layout.pp_rank);
  r.set_tensor_layout(in.tensor_layout);
  r.set_quant_method(in.quant_method);
  r.set_quant_config_sha256(in.quant_config_sha256);
  r.set_dtype(in.dtype);
  r.set_compute_capability(in.env.compute_capability);
  r.set_loader_format_version(in.env.loader_format_version);
  r.set_engine(in.env.engine);
  r.set_engine_version(in.env.engine_version);
  r.set_framework_version(in.env.framework_version);
  r.set_recipe(in.env.recipe);
  for (const auto& f : e.files) {
    auto* s = r.add_files();
    s->set_name(f.name);
    s->set_path(f.path);
    s->set_dev(f.stat.dev);
    s->set_ino(f.stat.ino);
    s->set_size(f.stat.size);
    s->set_mtime_ns(f.stat.mtime_ns);
    s->set_ctime_ns(f.stat.ctime_ns);
    s->set_digest(f.digest);
    s->set_digest_source(static_cast<uint32_t>(f.digest_source));
  }
  for (const auto& s : content.segments) r.add_segment_sizes(s->size());
  for (auto b : content.plan.segment_bytes) r.add_segment_used(b);
  r.set_total_bytes(content.plan.total_bytes);
  for (const auto& t : content.plan.tensors) ToTensorEntry(t, r.add_tensors());
  for (const auto& t : content.plan.views) ToTensorEntry(t, r.add_views());
  return r.SerializeAsString();
}

absl::StatusOr<AdoptableRecord> DecodeKeeperRecord(const std::string& body) {
  AdoptableRecord out;
  v1::KeeperRecord& r = out.record;
  if (!r.ParseFromString(body)) {
    return absl::InvalidArgumentError(
        absl::StrCat("keeper record of ", body.size(), " bytes does not parse"));
  }
  if (r.format() != kRecordFormat) {
    return absl::InvalidArgumentError(absl::StrCat("keeper record format ", r.format(),
                                                   "; this daemon reads format ", kRecordFormat));
  }
  spec::FingerprintInputs& in = out.inputs;
  in.architecture = r.architecture();
  in.revision = r.revision();
  for (const auto& d : r.digests()) in.files.push_back({d.name(), d.size(), d.content()});
  in.layout = {static_cast<int>(r.layout().tp_size()), static_cast<int>(r.layout().tp_rank()),
               static_cast<int>(r.layout().pp_size()), static_cast<int>(r.layout().pp_rank())};
  in.tensor_layout = r.tensor_layout();
  in.quant_method = r.quant_method();
  in.quant_config_sha256 = r.quant_config_sha256();
  in.dtype = r.dtype();
  in.env.compute_capability = r.compute_capability();
  in.env.loader_format_version = r.loader_format_version();
  in.env.engine = r.engine();
  in.env.engine_version = r.engine_version();
  in.env.framework_version = r.framework_version();
  in.env.recipe = r.recipe();
  if (const std::string fp = in.Digest(); fp != r.fingerprint()) {
    return absl::InvalidArgumentError(
        absl::StrCat("keeper record of model '", r.model(), "': its fingerprint inputs give ",
                     fp.substr(0, 12), ", not the recorded ", r.fingerprint().substr(0, 12)));
  }
  for (const auto& f : r.files()) {
    load::SourceFile s;
    s.name = f.name();
    s.path = f.path();
    s.stat = {f.dev(), f.ino(), f.size(), f.mtime_ns(), f.ctime_ns()};
    s.digest = f.digest();
    s.digest_source = static_cast<identity::DigestSource>(std::min<uint32_t>(
        f.digest_source(), static_cast<uint32_t>(identity::DigestSource::kHashed)));
    out.files.push_back(std::move(s));
  }
  if (r.segment_sizes().empty() || r.segment_used_size() != r.segment_sizes_size()) {
    return absl::InvalidArgumentError(absl::StrCat("keeper record of model '", r.model(),
                                                   "': ", r.segment_sizes_size(), " segments and ",
                                                   r.segment_used_size(), " used sizes"));
  }
  out.plan.segment_bytes.assign(r.segment_used().begin(), r.segment_used().end());
  out.plan.total_bytes = r.total_bytes();
  for (const auto& t : r.tensors()) {
    WC_ASSIGN_OR_RETURN(auto pt, GetTensor(t, r));
    out.plan.tensors.push_back(std::move(pt));
  }
  for (const auto& t : r.views()) {
    WC_ASSIGN_OR_RETURN(auto pt, GetTensor(t, r));
    out.plan.views.push_back(std::move(pt));
  }
  return out;
}

KeeperLink::KeeperLink(Options options, memory::Backend* backend, cache::Registry* registry,
                       metrics::Metrics* metrics,
                       std::function<RecordedSpec(const std::string&)> spec_of,
                       PublisherOfFn publisher_of)
    : options_(std::move(options)),
      backend_(backend),
      registry_(registry),
      metrics_(metrics),
      spec_of_(std::move(spec_of)),
      publisher_of_(std::move(publisher_of)) {
  if (metrics_ != nullptr) metrics_->SetKeeperUp(false);
}

KeeperLink::~KeeperLink() { Stop(); }

void KeeperLink::Stop() {
  {
    MutexLock l(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (watcher_.joinable()) watcher_.join();
}

absl::Status KeeperLink::EnsureConnectedLocked() {
  if (conn_) return absl::OkStatus();
  auto c = keeper::KeeperClient::Connect(options_.socket_path);
  if (!c.ok()) return c.status();
  conn_ = std::move(c).value();
  WC_LOG_INFO("keeper: connected on %s%s", options_.socket_path,
              ever_connected_ ? " again; depositing every ready entry" : "");
  redeposit_ = true;  // whatever is ready and not held yet
  ever_connected_ = true;
  Publish();
  return absl::OkStatus();
}

void KeeperLink::LostLocked(const absl::Status& why) {
  if (!conn_) return;
  conn_.reset();
  deposited_.clear();  // a keeper that went away took its descriptors with it
  last_error_ = std::string(why.message());
  WC_LOG_ERROR(
      "keeper: lost (%s); the cache no longer outlives a daemon restart until a keeper is back "
      "(engines keep what they mapped; serving goes on)",
      last_error_);
  Publish();
}

void KeeperLink::Publish() {
  if (metrics_ == nullptr) return;
  uint64_t fds = 0;
  for (const auto& [k, n] : deposited_) fds += n;
  metrics_->SetKeeperUp(conn_ != nullptr);
  metrics_->SetKeeperDescriptors(fds);
}

absl::Status KeeperLink::DepositLocked(const cache::Entry& e, const load::LoadedModel& content) {
  WC_RETURN_IF_ERROR(EnsureConnectedLocked());
  std::vector<int> fds;
  fds.reserve(content.segments.size());
  for (const auto& s : content.segments) fds.push_back(s->fd());
  const std::string key = KeyOf(e.fingerprint, e.device_uuid);
  // Only a published entry has a publisher (and only while its publish is known: asked for
  // source "publish" alone, so never after the publish unit is gone at teardown).
  std::optional<v1::PublisherInfo> publisher;
  if (publisher_of_ && e.source == "publish") publisher = publisher_of_(e.key);
  absl::Status s =
      conn_->Deposit(key,
                     EncodeKeeperRecord(e, content, memory::BackendName(backend_->kind()),
                                        spec_of_ ? spec_of_(e.model) : RecordedSpec{},
                                        publisher ? &*publisher : nullptr),
                     fds);
  if (s.ok()) {
    deposited_[key] = fds.size();
    deposits_++;
    Publish();
    return s;
  }
  failures_++;
  last_error_ = std::string(s.message());
  // A refusal (the keeper's descriptor limit) keeps the connection; anything else lost it.
  if (s.code() != absl::StatusCode::kResourceExhausted) LostLocked(s);
  return s;
}

void KeeperLink::BeforeReady(const cache::Entry& e, const load::LoadedModel& content) {
  MutexLock l(mu_);
  if (e.source == "keeper") {  // adopted: the keeper holds it already
    deposited_[KeyOf(e.fingerprint, e.device_uuid)] = content.segments.size();
    Publish();
    return;
  }
  const bool had_keeper = conn_ != nullptr;
  if (const absl::Status s = DepositLocked(e, content); !s.ok()) {
    // Without a keeper (none deployed, e.g. outside Kubernetes) this is how it runs: said
    // once at start; a keeper that refuses or goes away is worth a warning.
    if (had_keeper) {
      WC_LOG_WARN("keeper: %s (%s) not deposited, served anyway: %s", e.model, e.key.ToString(),
                  std::string(s.message()));
    } else {
      WC_LOG_INFO(
          "keeper: %s (%s) not deposited (no keeper connected): it will not outlive "
          "this daemon",
          e.model, e.key.ToString());
    }
  }
}

void KeeperLink::Evicted(const cache::Entry& e) {
  MutexLock l(mu_);
  const std::string key = KeyOf(e.fingerprint, e.device_uuid);
  if (deposited_.erase(key) == 0 || !conn_) return;
  Publish();
  if (const absl::Status s = conn_->Drop(key); !s.ok() && s.code() != absl::StatusCode::kNotFound) {
    LostLocked(s);
  }
}

absl::Status KeeperLink::AdoptOne(keeper::KeeperClient::Entry held, const AdmitFn& admit,
                                  const PublishedFn& published) {
  WC_ASSIGN_OR_RETURN(AdoptableRecord a, DecodeKeeperRecord(held.body));
  const v1::KeeperRecord& r = a.record;
  if (KeyOf(r.fingerprint(), r.device_uuid()) != held.key) {
    return absl::InvalidArgumentError(
        absl::StrCat("its record is of ", KeyOf(r.fingerprint(), r.device_uuid())));
  }
  if (r.backend() != memory::BackendName(backend_->kind())) {
    return absl::FailedPreconditionError(absl::StrCat("exported by the ", r.backend(),
                                                      " backend; this daemon runs ",
                                                      memory::BackendName(backend_->kind())));
  }
  if (held.fds.size() != static_cast<size_t>(r.segment_sizes_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(held.fds.size(), " descriptors for ", r.segment_sizes_size(), " segments"));
  }
  if (admit) WC_RETURN_IF_ERROR(admit(r));
  // The stale check: the files the bytes came from must be those versions still.
  if (auto changed = load::ChangedFiles(a.files); !changed.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("stale: ", absl::StrJoin(changed, "; ")));
  }
  auto content = std::make_shared<load::LoadedModel>();
  for (size_t i = 0; i < held.fds.size(); ++i) {
    WC_ASSIGN_OR_RETURN(auto seg, backend_->Adopt(r.device_uuid(), std::move(held.fds[i]),
                                                  r.segment_sizes(static_cast<int>(i)),
                                                  absl::StrCat(r.model(), " segment ", i)));
    content->segments.push_back(std::move(seg));
  }
  content->plan = std::move(a.plan);
  content->device_uuid = r.device_uuid();
  content->model_dir = r.model_dir();
  if (published && r.has_publisher()) published({r.fingerprint(), r.device_uuid()}, r.publisher());
  cache::LoadRequest req;
  req.key = {r.fingerprint(), r.device_uuid()};
  req.model = r.model();
  req.inputs = a.inputs;
  req.bytes = content->resident_bytes();
  req.source = "keeper";
  req.files = std::move(a.files);
  req.load = [content](cache::Entry& e) -> absl::StatusOr<std::unique_ptr<load::LoadedModel>> {
    e.progress.SetTotal(content->plan.total_bytes);
    e.progress.SetDone(content->plan.total_bytes);
    auto out = std::make_unique<load::LoadedModel>();
    out->plan = content->plan;
    out->device_uuid = content->device_uuid;
    out->model_dir = content->model_dir;
    out->segments = std::move(content->segments);
    return out;
  };
  bool started = false;
  WC_ASSIGN_OR_RETURN(auto e, registry_->StartOrJoin(std::move(req), &started));
  if (!started) return absl::AlreadyExistsError("the registry already has this entry");
  WC_RETURN_IF_ERROR(
      registry_->WaitReady(e, std::chrono::steady_clock::now() + std::chrono::seconds(30)));
  if (metrics_ != nullptr) metrics_->OnAdopted(r.model());
  return absl::OkStatus();
}

size_t KeeperLink::AdoptAll(const AdmitFn& admit, const PublishedFn& published) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<keeper::KeeperClient::Entry>> held;
  {
    MutexLock l(mu_);
    if (auto s = EnsureConnectedLocked(); !s.ok()) {
      last_error_ = std::string(s.message());
      WC_LOG_WARN(
          "keeper: %s; nothing to adopt, every model loads from disk (will deposit once "
          "a keeper answers)",
          last_error_);
      return 0;
    }
    held = conn_->Adopt();
    if (!held.ok()) {
      WC_LOG_ERROR("keeper: adopt failed: %s; loading from disk",
                   std::string(held.status().message()));
      LostLocked(held.status());
      return 0;
    }
  }
  size_t adopted = 0;
  std::vector<std::string> drop;
  for (auto& h : *held) {
    const std::string key = h.key;
    const absl::Status s = AdoptOne(std::move(h), admit, published);
    MutexLock l(mu_);
    if (s.ok()) {
      adopted++;
      adopted_++;
      continue;
    }
    dropped_++;
    last_error_ = absl::StrCat("adopt ", key.substr(0, 12), ": ", s.message());
    WC_LOG_WARN("keeper: entry %s not adopted, dropped: %s", key, std::string(s.message()));
    drop.push_back(key);
  }
  MutexLock l(mu_);
  for (const auto& key : drop) {
    if (!conn_) break;
    if (auto s = conn_->Drop(key); !s.ok() && s.code() != absl::StatusCode::kNotFound) {
      LostLocked(s);
    }
  }
  WC_LOG_INFO("keeper: adopted %d of %d entries in %.3f s (no disk reads)",
              static_cast<int>(adopted), static_cast<int>(held->size()),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return adopted;
}

void KeeperLink::StartWatch() {
  watcher_ = std::thread([this] { Watch(); });
}

void KeeperLink::Watch() {
  mu_.Lock();
  while (!stopping_) {
    if (!conn_) {
      if (!EnsureConnectedLocked().ok()) {
        cv_.WaitUntil(mu_, std::chrono::steady_clock::now() + options_.retry);
        continue;
      }
    }
    if (redeposit_) {
      redeposit_ = false;
      mu_.Unlock();
      RedepositAll();
      mu_.Lock();
      continue;
    }
    // Idle: wait for the keeper's hang-up (requests on other threads may use the socket
    // meanwhile; POLLRDHUP alone does not consume anything).
    const int fd = conn_->fd();
    mu_.Unlock();
    pollfd p{fd, POLLRDHUP, 0};
    const int n = ::poll(&p, 1, static_cast<int>(options_.retry.count()));
    mu_.Lock();
    if (n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0 && conn_ && conn_->fd() == fd) {
      LostLocked(absl::UnavailableError("the keeper closed its connection (it exited?)"));
    }
  }
  mu_.Unlock();
}

void KeeperLink::RedepositAll() {
  size_t n = 0;
  for (const auto& s : registry_->Snapshot()) {
    if (s.state != cache::State::kReady) continue;
    auto e = registry_->Find({s.fingerprint, s.device_uuid});
    if (!e) continue;
    auto content = registry_->Content(e);
    if (!content.ok()) continue;
    MutexLock l(mu_);
    if (stopping_ || !conn_) return;
    if (deposited_.count(KeyOf(e->fingerprint, e->device_uuid)) != 0) continue;
    if (DepositLocked(*e, **content).ok()) n++;
  }
  if (n > 0) WC_LOG_INFO("keeper: deposited %d ready entries again", static_cast<int>(n));
}

void KeeperLink::Fill(v1::KeeperStatus* out) const {
  MutexLock l(mu_);
  out->set_socket(options_.socket_path);
  out->set_up(conn_ != nullptr);
  out->set_adopted_entries(adopted_);
  out->set_dropped_entries(dropped_);
  uint64_t fds = 0;
  for (const auto& [k, n] : deposited_) fds += n;
  out->set_descriptors(fds);
  out->set_deposits(deposits_);
  out->set_deposit_failures(failures_);
  out->set_last_error(last_error_);
}

}  // namespace weightcache::server
