// The one place where absl::Status becomes grpc::Status, for every gRPC service of the
// daemon (the control API, grpc_service.cc; the peer API, peer_api.cc). Not a public
// header.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "pkg/util/daemon_answer.h"

namespace weightcache::server {

inline grpc::Status ToGrpc(grpc::ServerContext* ctx, const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  ctx->AddTrailingMetadata(kDaemonAnswerKey, "error");  // see pkg/util/daemon_answer.h
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace weightcache::server
