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
#include "pkg/client/internal/rpc.h"
#include "pkg/util/daemon_answer.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/unix_socket.h"
#include "weightcache/v1/weightcache.grpc.pb.h"

namespace weightcache::client {
namespace {

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

using internal::ClaimDescriptors;
using internal::FillAcquireRequest;
using internal::FromGrpc;
using internal::HandleSocketFor;
using internal::Manifest;
using internal::Views;

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
