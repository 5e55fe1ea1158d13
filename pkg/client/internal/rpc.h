// What the client's source files share (client.cc: connecting, Acquire and the other RPCs;
// lease.cc: a lease's life after Acquire, watched, re-attached, detached; publish.cc: a
// publish): the gRPC channel and the one conversion from its status, the handle-channel
// claim, the request's placement and the manifest's views. Not a public header.
//
// Thread-safety: free functions over their arguments; Rpc's stub may be called from any thread.
#pragma once

#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pkg/client/client.h"
#include "pkg/util/scoped_fd.h"
#include "weightcache/v1/weightcache.grpc.pb.h"

namespace weightcache::client::internal {

struct Rpc {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::WeightCache::Stub> stub;
};

// The client's one conversion point from gRPC status to absl::Status. UNAVAILABLE that the
// daemon did not answer itself came from the transport: no daemon, or it went away.
absl::Status FromGrpc(const grpc::ClientContext& ctx, const grpc::Status& s,
                      const std::string& what);
// "ERR <CODE>: <message>" from the handle channel as a status with that code.
absl::Status HandleChannelError(const std::string& why);
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
void SetIdentity(const EngineIdentity& id, v1::Environment* env);
// The handle socket that answers for `control_socket` (the daemon's answer names it).
std::string HandleSocketFor(const std::string& control_socket, const std::string& answered);
// Presents `token` on the handle socket and receives `want` descriptors; `conn` keeps the
// connection (the lease) when given.
absl::StatusOr<std::vector<ScopedFd>> ClaimDescriptors(const std::string& socket,
                                                       const std::string& token, size_t want,
                                                       ScopedFd* conn);
// The tensor views of a manifest over a mapping of segments of `sizes`.
absl::StatusOr<std::vector<TensorView>> Views(
    const google::protobuf::RepeatedPtrField<v1::TensorEntry>& tensors,
    const std::vector<uint64_t>& sizes, const memory::SegmentMapping& mapping);
absl::Status FillAcquireRequest(const AcquireOptions& o, v1::AcquireRequest* req);
// The manifest of an Acquire answer (packed or as tensors), parsed into `arena`.
absl::StatusOr<const google::protobuf::RepeatedPtrField<v1::TensorEntry>*> Manifest(
    const v1::AcquireResponse& resp, google::protobuf::Arena* arena);
std::unique_ptr<v1::WeightCache::Stub> StubFor(const std::string& control_socket);

}  // namespace weightcache::client::internal
