#include "pkg/client/internal/rpc.h"

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

namespace weightcache::client::internal {

absl::Status FromGrpc(const grpc::ClientContext& ctx, const grpc::Status& s,
                      const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  const bool from_daemon = ctx.GetServerTrailingMetadata().count(kDaemonAnswerKey) > 0;
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_code() == grpc::StatusCode::UNAVAILABLE && !from_daemon
                          ? absl::StrCat(what, ": daemon unreachable: ", s.error_message())
                          : s.error_message());
}

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

}  // namespace weightcache::client::internal
