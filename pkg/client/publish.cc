// A publish (client.h): writable segments from the daemon, filled by the engine, committed.
#include "absl/strings/str_cat.h"
#include "pkg/client/client.h"
#include "pkg/client/internal/rpc.h"
#include "pkg/util/status_macros.h"

namespace weightcache::client {

using internal::ClaimDescriptors;
using internal::FromGrpc;
using internal::HandleSocketFor;
using internal::SetIdentity;
using internal::SetPlacement;
using internal::Views;

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

}  // namespace weightcache::client
