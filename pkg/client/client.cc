#include "pkg/client/client.h"

#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pkg/util/daemon_answer.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/unix_socket.h"
#include "weightcache/v1/weightcache.grpc.pb.h"

namespace weightcache::client {
namespace {

// The client's one conversion point from gRPC status to absl::Status. UNAVAILABLE that the
// daemon did not answer itself (no kDaemonAnswerKey) came from the transport: no daemon, or
// it went away during the call.
absl::Status FromGrpc(const grpc::ClientContext& ctx, const grpc::Status& s,
                      const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  const bool from_daemon = ctx.GetServerTrailingMetadata().count(kDaemonAnswerKey) > 0;
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_code() == grpc::StatusCode::UNAVAILABLE && !from_daemon
                          ? absl::StrCat(what, ": daemon unreachable: ", s.error_message())
                          : s.error_message());
}

std::string ResolveSocket(const std::string& socket) {
  std::string s = socket;
  if (s.empty()) {
    const char* env = std::getenv(kSocketEnv);
    s = env != nullptr && *env != '\0' ? env : kDefaultControlSocket;
  }
  struct stat st;
  if (::stat(s.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) s += "/control.sock";
  return s;
}

}  // namespace

struct internal::Rpc {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::WeightCache::Stub> stub;
};

absl::StatusOr<AcquireOptions> AcquireOptions::FromEnvironment() {
  AcquireOptions o;
  if (const char* fp = std::getenv(kFingerprintEnv); fp != nullptr && *fp != '\0') {
    o.fingerprint = fp;
    return o;
  }
  const char* model = std::getenv(kModelEnv);
  if (model == nullptr || *model == '\0') {
    return absl::InvalidArgumentError(absl::StrCat(
        kModelEnv, " is not set (nor ", kFingerprintEnv,
        "): annotate the engine pod with weightcache.io/model: <name> and expose it with the "
        "Downward API (env ",
        kModelEnv,
        " from metadata.annotations['weightcache.io/model']), or let the "
        "weightcache admission webhook add it"));
  }
  o.model = model;
  return o;
}

Lease::~Lease() {
  // Unmap first (cuda-vmm: unmap, release the imported handles, free the VA range, release
  // the context), then end the lease in the daemon by closing the handle connection: the
  // daemon never counts memory as unleased while this process still maps it.
  mapping_.reset();
  handle_conn_.reset();
}

const TensorView* Lease::Find(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

Client::Client(std::string socket, std::shared_ptr<internal::Rpc> rpc)
    : socket_(std::move(socket)), rpc_(std::move(rpc)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& socket) {
  std::string path = ResolveSocket(socket);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat("weightcache daemon socket ", path,
                                               " does not exist (is weightcached running? set ",
                                               kSocketEnv, " to its control.sock)"));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  auto rpc = std::make_shared<internal::Rpc>();
  rpc->channel =
      grpc::CreateCustomChannel("unix:" + path, grpc::InsecureChannelCredentials(), args);
  rpc->stub = v1::WeightCache::NewStub(rpc->channel);
  return std::unique_ptr<Client>(new Client(path, std::move(rpc)));
}

namespace {

// "ERR <CODE>: <message>" from the handle channel as a status with that code (a daemon that
// sends no code: PERMISSION_DENIED, as before).
absl::Status HandleChannelError(const std::string& why) {
  static constexpr std::pair<const char*, absl::StatusCode> kCodes[] = {
      {"PERMISSION_DENIED: ", absl::StatusCode::kPermissionDenied},
      {"UNAVAILABLE: ", absl::StatusCode::kUnavailable},
      {"RESOURCE_EXHAUSTED: ", absl::StatusCode::kResourceExhausted},
      {"DEADLINE_EXCEEDED: ", absl::StatusCode::kDeadlineExceeded},
      {"INVALID_ARGUMENT: ", absl::StatusCode::kInvalidArgument},
      {"FAILED_PRECONDITION: ", absl::StatusCode::kFailedPrecondition},
      {"INTERNAL: ", absl::StatusCode::kInternal},
  };
  for (const auto& [prefix, code] : kCodes) {
    if (why.rfind(prefix, 0) == 0) {
      return absl::Status(code, absl::StrCat("handle channel: ", why.substr(strlen(prefix))));
    }
  }
  return absl::PermissionDeniedError(absl::StrCat("handle channel: ", why));
}

// The rank and device of an Acquire or a publish (AcquireOptions, PublishOptions).
template <typename Options>
void SetPlacement(const Options& o, v1::Layout* layout, v1::Environment* env) {
  layout->set_tp_size(o.tp_size);
  layout->set_tp_rank(o.tp_rank);
  layout->set_pp_size(o.pp_size);
  layout->set_pp_rank(o.pp_rank);
  env->set_compute_capability(o.compute_capability);
  env->set_device_uuid(o.device_uuid);
}

void SetIdentity(const EngineIdentity& id, v1::Environment* env) {
  env->set_engine(id.engine);
  env->set_engine_version(id.engine_version);
  env->set_framework_version(id.framework_version);
  env->set_recipe(id.recipe);
}

// The handle socket to use: the daemon names it as the daemon sees it, which is not where
// this process sees it when the socket directory is mounted elsewhere (a container's socket
// dir, a device-plugin slot's own directory with --namespace_rules). The socket of that name
// beside the control socket we connected to is the same daemon's; it wins when it exists.
std::string HandleSocketFor(const std::string& control_socket, const std::string& answered) {
  const size_t dir_end = control_socket.rfind('/');
  const size_t name_at = answered.rfind('/');
  if (dir_end == std::string::npos || name_at == std::string::npos) return answered;
  std::string beside =
      control_socket.substr(0, dir_end) + answered.substr(name_at);  // "<dir>/handle.sock"
  struct stat st {};
  if (beside != answered && ::stat(beside.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    return beside;
  }
  return answered;
}

// The handle channel: connects, presents `token`, receives `want` descriptors; the
// connection (the lease, or the publish) is left open in *conn.
absl::StatusOr<std::vector<ScopedFd>> ClaimDescriptors(const std::string& socket,
                                                       const std::string& token, size_t want,
                                                       ScopedFd* conn) {
  WC_ASSIGN_OR_RETURN(*conn, ConnectUnix(socket));
  // Bounded: a daemon that stops answering must not hang the engine's start.
  constexpr int kHandleReplySeconds = 30;
  struct timeval tv {};
  tv.tv_sec = kHandleReplySeconds;
  ::setsockopt(conn->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  WC_RETURN_IF_ERROR(WriteAll(conn->get(), "WCH1 " + token + "\n"));
  std::vector<ScopedFd> fds;
  while (fds.size() < want) {
    auto received = RecvWithFds(conn->get(), 4096);
    if (!received.ok()) {
      return absl::Status(
          received.status().code(),
          absl::StrCat("handle channel: no descriptors within ", kHandleReplySeconds,
                       " s or the read failed: ", received.status().message()));
    }
    auto& msg = *received;
    if (msg.data.rfind("ERR ", 0) == 0) {
      std::string why = msg.data.substr(4);
      while (!why.empty() && why.back() == '\n') why.pop_back();
      return HandleChannelError(why);
    }
    if (msg.data.rfind("FDS ", 0) != 0 || msg.fds.empty()) {
      return absl::InternalError(
          absl::StrCat("handle channel: unexpected message '", msg.data.substr(0, 40), "'"));
    }
    for (auto& fd : msg.fds) fds.push_back(std::move(fd));
  }
  if (fds.size() != want) {
    return absl::InternalError(
        absl::StrCat("handle channel: got ", fds.size(), " descriptors for ", want, " segments"));
  }
  return fds;
}

// A manifest's tensors as views over `mapping`, in name order; INTERNAL naming a tensor that
// lies outside its segment.
absl::StatusOr<std::vector<TensorView>> Views(
    const google::protobuf::RepeatedPtrField<v1::TensorEntry>& tensors,
    const std::vector<uint64_t>& sizes, const memory::SegmentMapping& mapping) {
  std::vector<TensorView> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.segment() >= sizes.size() || t.offset() > sizes[t.segment()] ||
        t.nbytes() > sizes[t.segment()] - t.offset()) {
      return absl::InternalError(
          absl::StrCat("manifest: tensor '", t.name(), "' lies outside segment ", t.segment()));
    }
    TensorView v;
    v.name = t.name();
    WC_ASSIGN_OR_RETURN(v.dtype, safetensors::ParseDType(t.dtype()));
    v.shape.assign(t.shape().begin(), t.shape().end());
    v.strides.assign(t.strides().begin(), t.strides().end());
    v.segment = t.segment();
    v.offset = t.offset();
    v.nbytes = t.nbytes();
    v.data = mapping.base(t.segment()) + t.offset();
    out.push_back(std::move(v));
  }
  auto by_name = [](const TensorView& a, const TensorView& b) { return a.name < b.name; };
  // The daemon sends tensors in name order (fused views may follow): sort only if needed.
  if (!std::is_sorted(out.begin(), out.end(), by_name)) {
    std::sort(out.begin(), out.end(), by_name);
  }
  return out;
}

// The request of an Acquire for `o` (by fingerprint when it names one).
absl::Status FillAcquireRequest(const AcquireOptions& o, v1::AcquireRequest* req) {
  if (!o.fingerprint.empty()) {
    req->set_fingerprint(o.fingerprint);
  } else if (!o.model.empty()) {
    req->set_model(o.model);
  } else {
    return absl::InvalidArgumentError("Acquire: set a model name or a fingerprint");
  }
  SetPlacement(o, req->mutable_layout(), req->mutable_env());
  req->set_dtype(o.dtype);
  req->set_quantization(o.quantization);
  req->set_wait_ready(o.wait_ready);
  req->set_load_on_miss(o.load_on_miss);
  req->set_packed_manifest(true);
  SetIdentity(o.published, req->mutable_env());
  return absl::OkStatus();
}

// The tensor table of an Acquire's answer: the packed manifest (what this client asks for),
// or `tensors` from a daemon that predates it.
absl::StatusOr<const google::protobuf::RepeatedPtrField<v1::TensorEntry>*> Manifest(
    const v1::AcquireResponse& resp, google::protobuf::Arena* arena) {
  if (resp.tensor_manifest().empty()) return &resp.tensors();
  auto* packed = google::protobuf::Arena::CreateMessage<v1::TensorManifest>(arena);
  if (!packed->ParseFromString(resp.tensor_manifest())) {
    return absl::InternalError(absl::StrCat("Acquire of '", resp.model(), "': the daemon's ",
                                            resp.tensor_manifest().size(),
                                            "-byte tensor manifest does not decode"));
  }
  return &packed->tensors();
}

std::unique_ptr<v1::WeightCache::Stub> StubFor(const std::string& control_socket) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  return v1::WeightCache::NewStub(grpc::CreateCustomChannel(
      "unix:" + control_socket, grpc::InsecureChannelCredentials(), args));
}

}  // namespace

const char* LeaseStateName(LeaseState s) {
  switch (s) {
    case LeaseState::kClean:
      return "clean";
    case LeaseState::kCorrupt:
      return "corrupt";
    case LeaseState::kUnknown:
      return "unknown";
  }
  return "unknown";
}

void Lease::PollLocked(std::chrono::milliseconds timeout) const {
  if (!corrupt_.empty() || daemon_closed_ || !handle_conn_) return;
  pollfd p{handle_conn_.get(), POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return;
  char buf[512];
  const ssize_t n = ::recv(handle_conn_.get(), buf, sizeof buf, MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    daemon_closed_ = true;  // the daemon ended (or restarted): no more news comes here
    unknown_why_ = "the daemon connection is gone (the daemon ended or restarted)";
  } else if (n > 0) {
    events_.append(buf, static_cast<size_t>(n));
  }
  for (size_t nl; corrupt_.empty() && (nl = events_.find('\n')) != std::string::npos;) {
    const std::string line = events_.substr(0, nl);
    events_.erase(0, nl + 1);
    constexpr std::string_view kCorrupt = "EVENT corrupt ";
    if (line.rfind(kCorrupt, 0) == 0) corrupt_ = line.substr(kCorrupt.size());
  }
  if (events_.size() > 4096) events_.clear();  // not a line the protocol sends
}

bool Lease::ReattachLocked() const {
  const auto now = std::chrono::steady_clock::now();
  if (another_copy_ || now < next_reattach_) return false;
  next_reattach_ = now + std::chrono::seconds(1);
  struct stat st {};
  if (::stat(control_socket_.c_str(), &st) != 0) return false;  // not back yet
  // A channel of its own: the client's may be in its reconnect back-off for seconds.
  auto stub = StubFor(control_socket_);
  v1::AcquireRequest req;
  req.set_fingerprint(fingerprint_);
  req.mutable_layout()->set_tp_size(static_cast<uint32_t>(tp_size_));
  req.mutable_layout()->set_tp_rank(static_cast<uint32_t>(tp_rank_));
  req.mutable_layout()->set_pp_size(static_cast<uint32_t>(pp_size_));
  req.mutable_layout()->set_pp_rank(static_cast<uint32_t>(pp_rank_));
  req.mutable_env()->set_device_uuid(device_uuid_);
  req.set_packed_manifest(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::AcquireResponse resp;
  if (absl::Status s = FromGrpc(ctx, stub->Acquire(&ctx, req, &resp), "Acquire"); !s.ok()) {
    unknown_why_ = absl::StrCat("the daemon connection is gone and no daemon serves it again yet (",
                                s.message(), ")");
    return false;
  }
  if (resp.content_id().empty() || resp.content_id() != content_id_) {
    // Another copy of these weights (no keeper kept ours): watching it says nothing of ours.
    grpc::ClientContext rctx;
    rctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::ReleaseRequest rel;
    rel.set_lease_id(resp.lease_id());
    v1::ReleaseResponse rel_resp;
    (void)stub->Release(&rctx, rel, &rel_resp);
    another_copy_ = true;
    unknown_why_ = absl::StrCat(
        "the daemon that is back serves another copy of fingerprint ", fingerprint_, " (memory ",
        resp.content_id().empty() ? "unnamed" : resp.content_id(), ", this lease maps ",
        content_id_, "), so nobody watches the memory this process maps; acquire again");
    return false;
  }
  ScopedFd conn;
  auto fds = ClaimDescriptors(HandleSocketFor(control_socket_, resp.handle_socket()), resp.token(),
                              static_cast<size_t>(resp.segments_size()), &conn);
  if (!fds.ok()) {
    unknown_why_ = absl::StrCat("the daemon connection is gone; re-attaching failed: ",
                                fds.status().message());
    return false;
  }
  // The descriptors are of the memory mapped already: closed here, the connection kept.
  handle_conn_ = std::move(conn);
  daemon_closed_ = false;
  events_.clear();
  unknown_why_.clear();
  return true;
}

LeaseWatch Lease::Watch(std::chrono::milliseconds timeout) const {
  MutexLock l(check_mu_);
  if (detached_) {
    return {LeaseState::kUnknown,
            "the lease is detached (Detach): nothing is mapped and no daemon holds a lease for "
            "it; Reattach maps it again"};
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const bool was_attached = !daemon_closed_ && handle_conn_;
  PollLocked(timeout);
  if (corrupt_.empty() && (daemon_closed_ || !handle_conn_)) {
    // News is an event, the close, or the lease back: a call that saw the close returns with
    // it (after one try, when due); one that began unattached waits for a re-attach, trying
    // when each is due.
    bool back = ReattachLocked();
    while (!back && !was_attached && !another_copy_ &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_until(std::min(deadline, next_reattach_));
      back = ReattachLocked();
    }
    if (back) PollLocked(std::chrono::milliseconds(0));
  }
  // A corrupt verdict read before the connection closed stays the answer: it is the worse news.
  if (!corrupt_.empty()) return {LeaseState::kCorrupt, corrupt_};
  if (daemon_closed_ || !handle_conn_) {
    // Issue 48: this used to be clean forever, so an engine whose daemon restarted polled
    // "clean" on memory nobody scrubbed for it any more (and was never told of a corruption).
    return {LeaseState::kUnknown,
            unknown_why_.empty() ? std::string("the daemon connection is gone") : unknown_why_};
  }
  return {LeaseState::kClean, ""};
}

absl::Status Lease::Check(std::chrono::milliseconds timeout) const {
  const LeaseWatch w = Watch(timeout);
  switch (w.state) {
    case LeaseState::kClean:
      return absl::OkStatus();
    case LeaseState::kCorrupt:
      return absl::DataLossError(
          absl::StrCat("lease ", id_, " of model ", model_,
                       ": the daemon found its memory corrupt: ", w.message));
    case LeaseState::kUnknown:
      break;
  }
  return absl::UnavailableError(absl::StrCat(
      "lease ", id_, " of model ", model_, ": unknown: ", w.message,
      "; nobody tells this process about corruption of these weights until a daemon serving "
      "this memory is back; they stay mapped and readable"));
}

bool Lease::detached() const {
  MutexLock l(check_mu_);
  return detached_;
}

void Lease::ReleaseNow(const std::string& lease_id) const {
  auto stub = StubFor(control_socket_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ReleaseRequest req;
  req.set_lease_id(lease_id);
  v1::ReleaseResponse resp;
  // Best effort: a daemon that is gone or ended the lease already needs nothing more, and the
  // closed handle connection ends it anyway.
  (void)stub->Release(&ctx, req, &resp);
}

absl::Status Lease::Detach() {
  MutexLock l(check_mu_);
  if (detached_) return absl::OkStatus();
  // Unmapped first: the daemon never counts memory as unleased while this process maps it.
  if (absl::Status s = mapping_->Detach(); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("Detach of lease ", id_, " (model ", model_, "): ", s.message()));
  }
  // Ended now, not when the daemon notices the closed connection: an Evict or a load under
  // the budget that follows finds the entry unleased.
  if (handle_conn_ && !daemon_closed_) ReleaseNow(id_);
  handle_conn_.reset();
  detached_ = true;
  events_.clear();
  return absl::OkStatus();
}

absl::Status Lease::Reattach(const ReattachOptions& o) {
  MutexLock l(check_mu_);
  if (!detached_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Reattach: lease ", id_, " of model ", model_, " is attached (Detach first)"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto stub = StubFor(control_socket_);
  google::protobuf::Arena arena;
  auto call = [&](const AcquireOptions& ask, v1::AcquireResponse* resp) {
    v1::AcquireRequest req;
    if (absl::Status s = FillAcquireRequest(ask, &req); !s.ok()) return s;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + o.timeout);
    return FromGrpc(ctx, stub->Acquire(&ctx, req, resp), "Acquire");
  };
  const std::string what =
      absl::StrCat("re-attach of model '", model_, "' (fingerprint ", fingerprint_, ")");
  // By fingerprint: the very weights, if the daemon still (or again) holds them.
  AcquireOptions ask = asked_;
  ask.model.clear();
  ask.fingerprint = fingerprint_;
  ask.wait_ready = true;
  ask.load_on_miss = false;
  auto* resp = google::protobuf::Arena::CreateMessage<v1::AcquireResponse>(&arena);
  absl::Status s = call(ask, resp);
  if ((s.code() == absl::StatusCode::kNotFound ||
       s.code() == absl::StatusCode::kFailedPrecondition) &&
      !model_.empty()) {
    // Gone (evicted) or stale: by model name, as an Acquire would, loading when allowed.
    ask.fingerprint.clear();
    ask.model = model_;
    ask.load_on_miss = o.load_on_miss;
    resp = google::protobuf::Arena::CreateMessage<v1::AcquireResponse>(&arena);
    const absl::Status by_fp = s;
    s = call(ask, resp);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(what, ": by fingerprint: ", by_fp.message(),
                                                 "; by model name: ", s.message()));
    }
  } else if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  if (resp->fingerprint() != fingerprint_) {
    ReleaseNow(resp->lease_id());
    // The tail is a field diff as the daemon writes mismatches ("do not fit: field: cached X,
    // asked Y"), so every client reads it the same way.
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the daemon now serves fingerprint ", resp->fingerprint(), " for model '", model_,
        "', not ", fingerprint_,
        " that this lease mapped, so the lease stays detached (its tensors' addresses hold the "
        "old weights' layout; acquire the new weights as a new lease): the weights do not fit: "
        "fingerprint: cached ",
        resp->fingerprint(), ", asked ", fingerprint_));
  }
  // The same fingerprint is the same layout; checked all the same, cheaply.
  std::vector<uint64_t> sizes;
  for (const auto& seg : resp->segments()) sizes.push_back(seg.size());
  absl::Status same = sizes == segment_sizes_
                          ? absl::OkStatus()
                          : absl::InternalError(absl::StrCat(what,
                                                             ": the daemon's segments differ from "
                                                             "the detached ones"));
  if (same.ok()) {
    auto manifest = Manifest(*resp, &arena);
    same = manifest.status();
    if (same.ok() && static_cast<size_t>((*manifest)->size()) != tensors_.size()) {
      same = absl::InternalError(
          absl::StrCat(what, ": ", (*manifest)->size(), " tensors, not ", tensors_.size()));
    }
    for (int i = 0; same.ok() && i < (*manifest)->size(); ++i) {
      const v1::TensorEntry& t = (*manifest)->Get(i);
      const TensorView* v = Find(t.name());
      if (v == nullptr || v->segment != t.segment() || v->offset != t.offset() ||
          v->nbytes != t.nbytes()) {
        same = absl::InternalError(
            absl::StrCat(what, ": tensor '", t.name(), "' lies elsewhere than before"));
      }
    }
  }
  if (!same.ok()) {
    ReleaseNow(resp->lease_id());
    return same;
  }
  const auto t1 = std::chrono::steady_clock::now();
  ScopedFd conn;
  auto fds = ClaimDescriptors(HandleSocketFor(control_socket_, resp->handle_socket()),
                              resp->token(), sizes.size(), &conn);
  if (!fds.ok()) {
    ReleaseNow(resp->lease_id());
    return absl::Status(fds.status().code(), absl::StrCat(what, ": ", fds.status().message()));
  }
  const auto t2 = std::chrono::steady_clock::now();
  if (absl::Status m = mapping_->Reattach(std::move(fds).value(), sizes); !m.ok()) {
    ReleaseNow(resp->lease_id());
    return absl::Status(m.code(), absl::StrCat(what, ": ", m.message()));
  }
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  const auto t3 = std::chrono::steady_clock::now();
  timings_ = {};
  timings_.rpc_ms = ms(t0, t1);
  timings_.claim_ms = ms(t1, t2);
  timings_.map.map_ms = ms(t2, t3);
  map_seconds_ = ms(t0, t3) / 1000.0;
  id_ = resp->lease_id();
  content_id_ = resp->content_id();
  handle_conn_ = std::move(conn);
  detached_ = false;
  daemon_closed_ = false;
  another_copy_ = false;
  events_.clear();
  corrupt_.clear();
  unknown_why_.clear();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Lease>> Client::Acquire(const AcquireOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  v1::AcquireRequest req;
  WC_RETURN_IF_ERROR(FillAcquireRequest(o, &req));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + o.timeout);
  // The manifest has one message per tensor: an arena makes parsing and freeing it cheap.
  google::protobuf::Arena arena;
  auto& resp = *google::protobuf::Arena::CreateMessage<v1::AcquireResponse>(&arena);
  WC_RETURN_IF_ERROR(FromGrpc(ctx, rpc_->stub->Acquire(&ctx, req, &resp), "Acquire"));
  WC_ASSIGN_OR_RETURN(const auto* manifest, Manifest(resp, &arena));

  auto lease = std::unique_ptr<Lease>(new Lease());
  auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  lease->timings_.rpc_ms = ms_since(t0);
  lease->id_ = resp.lease_id();
  lease->model_ = resp.model();
  lease->fingerprint_ = resp.fingerprint();
  lease->backend_ = resp.backend();
  lease->device_uuid_ = resp.device_uuid();
  lease->total_bytes_ = resp.total_bytes();
  lease->model_dir_ = resp.model_dir();
  lease->spec_yaml_ = resp.spec_yaml();
  lease->content_id_ = resp.content_id();
  lease->control_socket_ = socket_;
  lease->asked_ = o;
  lease->tp_size_ = static_cast<int>(std::max(1u, resp.layout().tp_size()));
  lease->tp_rank_ = static_cast<int>(resp.layout().tp_rank());
  lease->pp_size_ = static_cast<int>(std::max(1u, resp.layout().pp_size()));
  lease->pp_rank_ = static_cast<int>(resp.layout().pp_rank());

  auto t1 = std::chrono::steady_clock::now();
  WC_ASSIGN_OR_RETURN(
      std::vector<ScopedFd> fds,
      ClaimDescriptors(HandleSocketFor(socket_, resp.handle_socket()), resp.token(),
                       static_cast<size_t>(resp.segments_size()), &lease->handle_conn_));
  lease->timings_.claim_ms = ms_since(t1);
  std::vector<uint64_t> sizes;
  for (const auto& s : resp.segments()) sizes.push_back(s.size());
  memory::BackendKind kind =
      resp.backend() == "cuda-vmm" ? memory::BackendKind::kCudaVmm : memory::BackendKind::kHost;
  WC_ASSIGN_OR_RETURN(
      lease->mapping_,
      memory::MapReadOnly(kind, std::move(fds), sizes, resp.device_uuid(), &lease->timings_.map));
  lease->segment_sizes_ = sizes;

  t1 = std::chrono::steady_clock::now();
  WC_ASSIGN_OR_RETURN(lease->tensors_, Views(*manifest, sizes, *lease->mapping_));
  lease->timings_.views_ms = ms_since(t1);
  lease->map_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return lease;
}

namespace {

void SetPublishTensors(const std::vector<PublishTensor>& tensors,
                       google::protobuf::RepeatedPtrField<v1::PublishTensor>* out) {
  out->Reserve(static_cast<int>(tensors.size()));
  for (const auto& t : tensors) {
    auto* m = out->Add();
    m->set_name(t.name);
    m->set_dtype(std::string(safetensors::DTypeName(t.dtype)));
    m->mutable_shape()->Add(t.shape.begin(), t.shape.end());
    m->set_nbytes(t.nbytes);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Publish>> Client::BeginPublish(const PublishOptions& o) {
  v1::BeginPublishRequest req;
  req.set_model(o.model);
  SetPlacement(o, req.mutable_layout(), req.mutable_env());
  SetIdentity(o.identity, req.mutable_env());
  SetPublishTensors(o.tensors, req.mutable_tensors());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + o.timeout);
  v1::BeginPublishResponse resp;
  WC_RETURN_IF_ERROR(FromGrpc(ctx, rpc_->stub->BeginPublish(&ctx, req, &resp), "BeginPublish"));
  auto p = std::unique_ptr<Publish>(new Publish());
  p->rpc_ = rpc_;
  p->begun_ = o.tensors;
  p->fingerprint_ = resp.fingerprint();
  p->backend_ = resp.backend();
  p->device_uuid_ = resp.device_uuid();
  p->joined_ = resp.joined();
  if (p->joined_) {
    p->ended_ = true;
    return p;
  }
  p->id_ = resp.publish_id();
  // From here on, an error destroys `p`: its destructor aborts the publish in the daemon.
  WC_ASSIGN_OR_RETURN(
      std::vector<ScopedFd> fds,
      ClaimDescriptors(HandleSocketFor(socket_, resp.handle_socket()), resp.token(),
                       static_cast<size_t>(resp.segments_size()), &p->handle_conn_));
  std::vector<uint64_t> sizes;
  for (const auto& s : resp.segments()) sizes.push_back(s.size());
  const memory::BackendKind kind =
      resp.backend() == "cuda-vmm" ? memory::BackendKind::kCudaVmm : memory::BackendKind::kHost;
  WC_ASSIGN_OR_RETURN(p->mapping_,
                      memory::MapWritable(kind, std::move(fds), sizes, resp.device_uuid()));
  WC_ASSIGN_OR_RETURN(p->tensors_, Views(resp.tensors(), sizes, *p->mapping_));
  return p;
}

Publish::~Publish() { Abort(); }

const TensorView* Publish::Find(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

void* Publish::Data(const TensorView& view) const {
  if (!mapping_ || view.segment >= mapping_->count()) return nullptr;
  std::byte* base = mapping_->writable_base(view.segment);
  return base == nullptr ? nullptr : base + view.offset;
}

absl::Status Publish::Commit() {
  if (ended_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Publish::Commit: publish ", id_,
                     joined_ ? " was joined (another publisher's)" : " ended"));
  }
  // Writes land, then the writable mapping goes: the daemon can seal only once none remains.
  mapping_.reset();
  v1::CommitPublishRequest req;
  req.set_publish_id(id_);
  SetPublishTensors(begun_, req.mutable_tensors());
  v1::CommitPublishResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  absl::Status s = FromGrpc(ctx, rpc_->stub->CommitPublish(&ctx, req, &resp), "CommitPublish");
  if (!s.ok()) {
    // A commit that may succeed when asked again leaves the publish open (issue 26: it was
    // always aborted here, so the documented "unmap and commit again" could not be done):
    // a writable mapping that remains elsewhere (FAILED_PRECONDITION), or a daemon that did
    // not answer in time. Anything else has ended the publish in the daemon, or will.
    const absl::StatusCode c = s.code();
    if (c != absl::StatusCode::kFailedPrecondition && c != absl::StatusCode::kUnavailable &&
        c != absl::StatusCode::kDeadlineExceeded) {
      Abort();
    }
    return s;
  }
  committed_ = true;
  ended_ = true;
  tensors_.clear();
  handle_conn_.reset();
  return absl::OkStatus();
}

void Publish::Abort() {
  if (ended_) return;
  ended_ = true;
  tensors_.clear();
  mapping_.reset();
  // Closing the handle connection aborts in the daemon; the RPC says so at once.
  handle_conn_.reset();
  v1::AbortPublishRequest req;
  req.set_publish_id(id_);
  v1::AbortPublishResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  (void)rpc_->stub->AbortPublish(&ctx, req, &resp);
}

absl::Status Client::Release(const std::string& lease_id) {
  v1::ReleaseRequest req;
  req.set_lease_id(lease_id);
  v1::ReleaseResponse resp;
  grpc::ClientContext ctx;
  return FromGrpc(ctx, rpc_->stub->Release(&ctx, req, &resp), "Release");
}

absl::StatusOr<v1::StatusResponse> Client::Status() {
  v1::StatusRequest req;
  v1::StatusResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  WC_RETURN_IF_ERROR(FromGrpc(ctx, rpc_->stub->Status(&ctx, req, &resp), "Status"));
  return resp;
}

absl::Status Client::Load(const std::string& model, const std::string& spec_yaml,
                          const std::function<void(const v1::LoadProgress&)>& on_progress,
                          const v1::Layout* layout) {
  v1::LoadRequest req;
  req.set_model(model);
  req.set_spec_yaml(spec_yaml);
  if (layout != nullptr) *req.mutable_layout() = *layout;
  grpc::ClientContext ctx;
  auto reader = rpc_->stub->Load(&ctx, req);
  v1::LoadProgress p;
  while (reader->Read(&p)) {
    if (on_progress) on_progress(p);
  }
  return FromGrpc(ctx, reader->Finish(), "Load");
}

Artifact::~Artifact() {
  if (data_ != nullptr) ::munmap(const_cast<void*>(data_), size_);
}

absl::StatusOr<v1::PutArtifactResponse> Client::PutArtifact(const v1::ArtifactKey& key,
                                                            std::string_view bytes) {
  constexpr size_t kChunk = 256 << 10;  // the daemon takes messages of up to 1 MiB
  grpc::ClientContext ctx;
  v1::PutArtifactResponse resp;
  auto writer = rpc_->stub->PutArtifact(&ctx, &resp);
  v1::PutArtifactRequest msg;
  *msg.mutable_key() = key;
  msg.set_size(bytes.size());
  size_t off = 0;
  do {
    const size_t n = std::min(kChunk, bytes.size() - off);
    msg.set_data(bytes.data() + off, n);
    off += n;
    // A refusal ends the stream early: Finish says why.
    if (!writer->Write(msg)) break;
    msg.Clear();
  } while (off < bytes.size());
  writer->WritesDone();
  WC_RETURN_IF_ERROR(FromGrpc(ctx, writer->Finish(), "PutArtifact"));
  return resp;
}

absl::StatusOr<std::unique_ptr<Artifact>> Client::GetArtifact(const v1::ArtifactKey& key,
                                                              std::chrono::milliseconds wait) {
  v1::GetArtifactRequest req;
  *req.mutable_key() = key;
  req.set_wait_ms(static_cast<uint32_t>(wait.count()));
  v1::GetArtifactResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + wait + std::chrono::seconds(30));
  WC_RETURN_IF_ERROR(FromGrpc(ctx, rpc_->stub->GetArtifact(&ctx, req, &resp), "GetArtifact"));
  ScopedFd conn;
  WC_ASSIGN_OR_RETURN(auto fds, ClaimDescriptors(resp.handle_socket(), resp.token(), 1, &conn));
  conn.reset();  // the descriptor is all there is to it: no lease
  struct stat st {};
  if (::fstat(fds[0].get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != resp.bytes()) {
    return absl::InternalError(absl::StrCat("artifact ", resp.id(), ": descriptor holds ",
                                            st.st_size, " bytes, the daemon said ", resp.bytes()));
  }
  std::unique_ptr<Artifact> a(new Artifact());
  void* p = ::mmap(nullptr, resp.bytes(), PROT_READ, MAP_SHARED, fds[0].get(), 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap artifact", resp.id());
  a->data_ = p;
  a->size_ = resp.bytes();
  a->fd_ = std::move(fds[0]);
  a->id_ = resp.id();
  a->sha256_ = resp.sha256();
  return a;
}

absl::StatusOr<uint32_t> Client::EvictArtifacts(const std::string& id, const std::string& model) {
  v1::EvictArtifactsRequest req;
  req.set_id(id);
  if (id.empty()) req.set_model(model);
  v1::EvictArtifactsResponse resp;
  grpc::ClientContext ctx;
  WC_RETURN_IF_ERROR(FromGrpc(ctx, rpc_->stub->EvictArtifacts(&ctx, req, &resp), "EvictArtifacts"));
  return resp.evicted();
}

absl::StatusOr<uint32_t> Client::Evict(const std::string& model, const std::string& fingerprint) {
  WC_ASSIGN_OR_RETURN(v1::EvictResponse resp, EvictDetailed(model, fingerprint));
  return resp.evicted();
}

absl::StatusOr<v1::VerifyResidentResponse> Client::VerifyResident(const std::string& model) {
  v1::VerifyResidentRequest req;
  req.set_model(model);
  v1::VerifyResidentResponse resp;
  grpc::ClientContext ctx;
  WC_RETURN_IF_ERROR(FromGrpc(ctx, rpc_->stub->VerifyResident(&ctx, req, &resp), "VerifyResident"));
  return resp;
}

absl::StatusOr<v1::EvictResponse> Client::EvictDetailed(const std::string& model,
                                                        const std::string& fingerprint) {
  v1::EvictRequest req;
  if (!fingerprint.empty()) {
    req.set_fingerprint(fingerprint);
  } else {
    req.set_model(model);
  }
  v1::EvictResponse resp;
  grpc::ClientContext ctx;
  WC_RETURN_IF_ERROR(FromGrpc(ctx, rpc_->stub->Evict(&ctx, req, &resp), "Evict"));
  return resp;
}

}  // namespace weightcache::client
